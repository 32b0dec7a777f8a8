"""Sparse training's pure-TF layer by hand: prune-and-grow, schedule, server
union average / direction map / re-prune, wire encodings."""

import math

import attrs
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.aggregators import MaskedSums
from tff_hetero.algorithms.sparse import computations
from tff_hetero.algorithms.sparse import prune_grow
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel

# -- readjustment of one kernel ----------------------------------------------
#
# Active weights 0..3, inactive 4..7. Local pseudo-gradient sign(now - recv)
# is (-, -, +, +) on 0..3; the global direction map is (+, +, +, +) there, so
# 0 and 1 move against it. On 4..7 the loss gradients are (.5, -.9, .2, -.1):
# learning directions (-, +, -, +); with the map (+, -, -, +), 6 and 7 agree.
_MASK = np.array([1, 1, 1, 1, 0, 0, 0, 0], np.float32)
_NOW = np.array([0.3, -0.4, 0.1, -0.2, 0, 0, 0, 0], np.float32)
_RECEIVED = np.array([0.4, -0.3, 0.0, -0.3, 0, 0, 0, 0], np.float32)
_GRADIENT = np.array([0, 0, 0, 0, 0.5, -0.9, 0.2, -0.1], np.float32)
_DIRECTION = np.array([1, 1, 1, 1, 1, -1, -1, 1], np.int8)


@pytest.mark.parametrize(
  "congruity_lambda, expected, guided",
  [
    # k = floor(0.5 x 4) = 2. Magnitude only (FedDST): prune 2 and 3 (|w| .1,
    # .2), grow 5 and 4 (|g| .9, .5; 2 and 3 have gradient 0).
    (0.0, [1, 1, 0, 0, 1, 1, 0, 0], (0, 0)),
    # lambda = 0.5: one of each guided. Prune 0 (smallest |w| against the
    # map) then 2 (smallest left); grow 6 (largest |g| along the map) then 5.
    (0.5, [0, 1, 0, 1, 0, 1, 1, 0], (1, 1)),
    # lambda = 1: both from the guided sets: prune 0, 1; grow 6, 7.
    (1.0, [0, 0, 1, 1, 0, 0, 1, 1], (2, 2)),
  ],
)
def test_readjust_mask_by_hand(congruity_lambda, expected, guided, tff_context):
  del tff_context
  mask, newly, counts = prune_grow.readjust_mask(
    _MASK, _NOW, _RECEIVED, _GRADIENT, _DIRECTION, 0.5, congruity_lambda
  )
  np.testing.assert_array_equal(mask, expected)
  np.testing.assert_array_equal(newly, np.array(expected) * (1 - _MASK))
  assert (
    float(counts.pruned_incongruent),
    float(counts.grown_congruent),
  ) == guided
  assert float(counts.pruned) == float(counts.grown) == 2.0
  # After pruning, candidates are the 4 inactive plus the 2 just pruned; the
  # map is non-zero on all of them.
  assert float(counts.grow_candidates) == 6.0
  assert float(counts.candidates_with_direction) == 6.0
  # The same inside a TFF computation (a graph, where Python operators on
  # tensors may mean something else than in eager code).
  vector = tff.TensorType(np.float32, [8])

  @tff.tensorflow.computation(
    vector, vector, vector, vector, tff.TensorType(np.int8, [8])
  )
  def readjust(mask, now, received, gradient, direction):
    return prune_grow.readjust_mask(
      mask, now, received, gradient, direction, 0.5, congruity_lambda
    )[0]

  np.testing.assert_array_equal(
    readjust(_MASK, _NOW, _RECEIVED, _GRADIENT, _DIRECTION), expected
  )


def test_a_dense_kernel_stays_dense():
  # k = floor(0.5 x 6) = 3 pruned (|w| .05, .1, .2 at 3, 1, 5), and the only
  # growth candidates are those 3: all come back, keeping their values.
  weights = np.array([0.5, -0.1, 0.3, 0.05, -0.4, 0.2], np.float32)
  mask, newly, counts = prune_grow.readjust_mask(
    np.ones(6, np.float32),
    weights,
    weights * 0.5,
    np.array([1, 2, 3, 4, 5, 6], np.float32),
    np.zeros(6, np.int8),
    0.5,
    0.5,
  )
  np.testing.assert_array_equal(mask, np.ones(6))
  np.testing.assert_array_equal(newly, np.zeros(6))
  assert float(counts.pruned) == float(counts.grown) == 3.0
  assert float(counts.grown_new) == 0.0


def test_a_just_pruned_weight_can_come_back():
  # k = floor(0.34 x 3) = 1: weight 1 (|w| .1) is pruned, and its gradient
  # (.9) beats the inactive weight 3's (.2), so it is grown back.
  mask, newly, _ = prune_grow.readjust_mask(
    np.array([1, 1, 1, 0], np.float32),
    np.array([0.5, 0.1, 0.4, 0.0], np.float32),
    np.array([0.5, 0.1, 0.4, 0.0], np.float32),
    np.array([0.0, 0.9, 0.0, 0.2], np.float32),
    np.zeros(4, np.int8),
    0.34,
    0.0,
  )
  np.testing.assert_array_equal(mask, [1, 1, 1, 0])
  np.testing.assert_array_equal(newly, [0, 0, 0, 0])


# -- the schedule -----------------------------------------------------------


def test_readjust_schedule_by_hand():
  schedule = prune_grow.ReadjustSchedule(
    alpha=0.2,
    delta_epochs=5,
    begin_epoch=3,
    end_epoch=20,
    request_every=3,
    request_end_round=7,
  )
  assert [t for t in range(0, 30) if schedule.due(t)] == [3, 8, 13, 18]
  assert [r for r in range(1, 12) if schedule.requested(r)] == [1, 4, 7]
  # alpha / 2 (1 + cos(pi t / E_end)).
  assert schedule.prune_fraction(3) == pytest.approx(
    0.1 * (1 + math.cos(math.pi * 3 / 20))
  )
  assert schedule.prune_fraction(20) == 0.0
  # The TF versions (used inside the client computation) agree.
  for t in (0, 3, 4, 8, 18, 20, 23):
    assert bool(schedule.due(tf.constant(t, tf.int64))) == schedule.due(t)
    assert float(schedule.prune_fraction(tf.constant(t, tf.int64))) == (
      pytest.approx(schedule.prune_fraction(t), abs=1e-6)
    )
  # Requested in the graph (build_feddst_process): rounds 1, 4, 7 again.
  in_graph = [r for r in range(0, 12) if schedule.requested(tf.constant(r))]
  assert in_graph == [1, 4, 7]
  unlimited = attrs.evolve(schedule, request_end_round=0)
  assert [
    r for r in range(1, 12) if unlimited.requested(tf.constant(r, tf.int64))
  ] == [1, 4, 7, 10]
  never = prune_grow.ReadjustSchedule(
    alpha=0.0, delta_epochs=1, begin_epoch=1, end_epoch=9
  )
  assert not never.requested(1)
  assert not bool(never.requested(tf.constant(1, tf.int64)))


# -- the server -------------------------------------------------------------

# One masked kernel of 4 (trainable 0) and a dense bias of 2 (trainable 1).
_LAYOUT = masks_lib.MaskLayout(
  kernels=(masks_lib.MaskedKernel("k:0", (4,), 0, 0),),
  kinds=("mask",),
  non_trainable_specs=(tf.TensorSpec([4], tf.float32),),
  num_trainable=2,
)
_PREVIOUS = SparseModel(
  trainable=[
    np.array([0.5, 0.0, -0.2, 0.0], np.float32),
    np.array([0.1, 0.2], np.float32),
  ],
  masks=[np.array([1, 0, 1, 0], np.float32)],
  statistics=[],
)
# Upload A (2 examples): kernel (.6, .3, 0, 0) on mask (1, 1, 0, 0), bias
# (1, 0); upload B (1 example): kernel (.3, 0, -.5, 0) on (1, 0, 1, 0),
# bias (3, 0).
_ROWS = computations.MemoryRows(
  values=[
    np.array([[0.6, 0.3, 0, 0], [0.3, 0, -0.5, 0]], np.float32),
    np.array([[1, 0], [3, 0]], np.float32),
  ],
  masks=[np.array([[1, 1, 0, 0], [1, 0, 1, 0]], np.uint8)],
  weight=np.array([2, 1], np.float32),
)


def test_row_sums_by_hand():
  sums = computations.row_sums(_LAYOUT, _ROWS)
  np.testing.assert_allclose(sums.weighted_sum[0], [1.5, 0.6, -0.5, 0])
  np.testing.assert_allclose(sums.weight_sum[0], [3, 2, 1, 0])
  np.testing.assert_allclose(sums.weighted_sum[1], [5, 0])
  np.testing.assert_allclose(sums.weight_sum[1], [3, 3])


def test_without_rows_by_hand():
  # The running sums (row sums above, plus a third row's 1.0 everywhere at
  # weight 1) less rows A and B: that third row alone.
  running = MaskedSums(
    weighted_sum=[np.array([2.5, 1.6, 0.5, 1.0]), np.array([6.0, 1.0])],
    weight_sum=[np.array([4.0, 3.0, 2.0, 1.0]), np.array([4.0, 4.0])],
  )
  left = computations.without_rows(_LAYOUT, running, _ROWS)
  for part in (left.weighted_sum, left.weight_sum):
    for array in part:
      assert isinstance(array, np.ndarray) and array.dtype == np.float32
      np.testing.assert_allclose(array, np.ones_like(array), atol=1e-6)


@pytest.mark.parametrize(
  "memory, kernel, directions",
  [
    # Union average (.5, .3, -.5, -) held on 0..2; direction against the
    # previous (.5, 0, -.2, 0): (0, +, -) and 0 where nobody held; re-prune
    # to 2 by |value| keeps 0 and 2.
    ("models", [0.5, 0, -0.5, 0], [0, 1, -1, 0]),
    # The rows are changes: candidate = previous + average on held elements
    # = (1, .3, -.7, -); direction = sign of the average change.
    ("updates", [1.0, 0, -0.7, 0], [1, 1, -1, 0]),
  ],
)
def test_server_aggregate_by_hand(memory, kernel, directions):
  sums = computations.row_sums(_LAYOUT, _ROWS)
  model, maps, density, informed = computations.server_aggregate(
    _LAYOUT, [2], memory, _PREVIOUS, MaskedSums(*sums)
  )
  np.testing.assert_allclose(model.trainable[0], kernel, atol=1e-6)
  np.testing.assert_array_equal(model.masks[0], [1, 0, 1, 0])
  np.testing.assert_array_equal(maps[0], directions)
  assert maps[0].dtype == tf.int8
  bias = [5 / 3, 0.0] if memory == "models" else [0.1 + 5 / 3, 0.2]
  np.testing.assert_allclose(model.trainable[1], bias, atol=1e-6)
  assert float(density[0]) == 0.5
  # Inactive after the re-prune: 1 (map +1) and 3 (nobody held it: 0).
  assert float(informed) == 0.5


def test_an_element_nobody_holds_is_dropped_and_has_no_direction():
  rows = _ROWS._replace(weight=np.array([0, 1], np.float32))  # B only.
  model, maps, _, _ = computations.server_aggregate(
    _LAYOUT,
    [2],
    "models",
    _PREVIOUS,
    MaskedSums(*computations.row_sums(_LAYOUT, rows)),
  )
  np.testing.assert_allclose(model.trainable[0], [0.3, 0, -0.5, 0])
  np.testing.assert_array_equal(maps[0], [-1, 0, -1, 0])


# -- wire encodings ---------------------------------------------------------


def test_ternary_packing_by_hand():
  values = np.array([1, -1, 0, 0, 1], np.int8)
  packed = prune_grow.pack_ternary(values)
  # Codes (1, 2, 0, 0 | 1): 1 + 2 x 4 = 9, then 1.
  np.testing.assert_array_equal(packed, [9, 1])
  assert packed.dtype == tf.uint8
  assert prune_grow.packed_ternary_size((5,)) == 2
  grid = np.array([[1, -1, 0], [0, 1, 1], [-1, -1, 0]], np.int8)
  np.testing.assert_array_equal(
    prune_grow.unpack_ternary(prune_grow.pack_ternary(grid), grid.shape), grid
  )
