"""FedSGC's pruning baselines: PruneFL's reconfiguration and GraSP's scores
by hand or against an explicit Hessian, and their rounds on TFF (measured
traffic, the first client's pruning, masks)."""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf

from tff_hetero import data as data_lib
from tff_hetero.algorithms import api
from tff_hetero.algorithms.sparse import grasp
from tff_hetero.algorithms.sparse import prunefl
from tff_hetero.program import make_config
from tff_hetero.program.configs import config_from_values
from tff_hetero.submodels import masks as masks_lib

# -- PruneFL's reconfiguration by hand ---------------------------------------
#
# Kernel A: g^2 (4, 1, 9), t = 1; kernel B: g^2 (2, 8), t = 2. By g^2: A2 9,
# B1 8, A0 4, B0 2, A1 1, ratios g^2 / t 9, 4, 4, 1, 1; cumulative gain 9,
# 17, 21, 23, 24; time c + (1, 3, 4, 6, 7).


@pytest.mark.parametrize(
  "constant, floor, expected",
  [
    # c = 0: objective before each weight 0, 9, 5.67, 5.25, 3.83; B1's ratio
    # 4 < 9 but the floor (2) keeps it; A0's 4 < 5.67 stops.
    (0.0, 2, ([0, 0, 1], [0, 1])),
    # c = 10: objectives 0, .82, 1.31, 1.5, 1.44: B1 and A0 (4) raise it, B0
    # (1 < 1.5) stops.
    (10.0, 1, ([1, 0, 1], [0, 1])),
    # Same, floor 4: B0 is kept by the floor; A1 (1 < 23 / 16) stops.
    (10.0, 4, ([1, 0, 1], [1, 1])),
  ],
)
def test_prunefl_reconfiguration_by_hand(constant, floor, expected):
  masks = prunefl.reconfigure_masks(
    [np.array([4.0, 1.0, 9.0], np.float32), np.array([2.0, 8.0], np.float32)],
    [1.0, 2.0],
    constant,
    floor,
  )
  for mask, want in zip(masks, expected):
    np.testing.assert_array_equal(mask, want)


def test_prunefl_costs_are_macs_per_weight():
  inputs = tf.keras.Input((4, 4, 1))
  x = tf.keras.layers.Conv2D(2, 3, name="conv")(inputs)
  model = tf.keras.Model(
    inputs, tf.keras.layers.Dense(3, name="fc")(tf.keras.layers.Flatten()(x))
  )
  layout = masks_lib.MaskLayout.of(masks_lib.prune_wrap(model))
  costs, constant = prunefl.kernel_costs(model, layout)
  # A 3x3 conv weight is used at each of the 2 x 2 output positions; a dense
  # weight once. Nothing else multiplies.
  assert costs == [4.0, 1.0] and constant == 0.0


# -- GraSP's scores against an explicit Hessian -------------------------------

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 2, 3, 1], tf.float32),
  y=tf.TensorSpec([None], tf.int32),
)


def _mlp():
  inputs = tf.keras.Input((2, 3, 1))
  x = tf.keras.layers.Dense(
    8,
    activation="tanh",
    name="fc1",
    kernel_initializer=tf.keras.initializers.GlorotUniform(1),
  )(tf.keras.layers.Flatten()(inputs))
  return tf.keras.Model(
    inputs,
    tf.keras.layers.Dense(
      3,
      name="logits",
      kernel_initializer=tf.keras.initializers.GlorotUniform(2),
    )(x),
  )


_TASK = api.Task(
  "mlp6", _mlp, (2, 3, 1), 3, _SPEC, training_flops_per_example=3 * 72
)
_IDS = ("c0", "c1", "c2")
_SIZES = (9, 5, 7)


def _arrays(client, round_num):
  rng = np.random.default_rng(round_num * 10 + client)
  return data_lib.ArrayDataset(
    rng.normal(size=[_SIZES[client], 2, 3, 1]).astype(np.float32),
    rng.integers(0, 3, size=[_SIZES[client]]).astype(np.int32),
  )


def _hessian_scores(kernels, batches, temperature=200.0):
  """theta * (H g) with H the full Hessian of the summed batch losses with
  respect to both kernels (biases fixed), by `tf.GradientTape.jacobian`."""
  model = _mlp()
  flat = tf.Variable(tf.concat([tf.reshape(k, [-1]) for k in kernels], 0))
  shapes = [k.shape for k in kernels]
  biases = [model.get_layer("fc1").bias, model.get_layer("logits").bias]

  def loss(vector):
    fc1, logits = tf.split(vector, [np.prod(s) for s in shapes])
    total = 0.0
    for x, y in batches:
      h = tf.tanh(
        tf.reshape(x, [-1, 6]) @ tf.reshape(fc1, shapes[0]) + biases[0]
      )
      out = (h @ tf.reshape(logits, shapes[1]) + biases[1]) / temperature
      total += tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(
          y, out, from_logits=True
        )
      )
    return total

  with tf.GradientTape() as outer:
    with tf.GradientTape() as inner:
      value = loss(flat)
    gradient = inner.gradient(value, flat)
  hessian = outer.jacobian(gradient, flat)
  scores = flat * tf.linalg.matvec(hessian, gradient)
  return np.split(scores.numpy(), np.cumsum([np.prod(s) for s in shapes])[:-1])


def test_grasp_scores_equal_theta_times_hessian_gradient(tff_context):
  del tff_context
  algorithm = grasp.build_grasp(
    make_config(algorithm="grasp", sparsity=0.5), _TASK, _IDS
  )
  model = algorithm.rounds.model_fn()
  dataset = data_lib.make_client_dataset(
    _arrays(0, 1), batch_size=4, local_epochs=1, shuffle_seed=None
  )
  scores = grasp.grasp_scores(model, algorithm.layout, dataset)
  kernels = [
    model.trainable_variables[k.trainable_index].numpy()
    for k in algorithm.layout.kernels
  ]
  batches = [(b["x"], b["y"]) for b in dataset]
  expected = _hessian_scores(kernels, batches)
  for got, want in zip(scores, expected):
    np.testing.assert_allclose(
      np.reshape(got, [-1]), want, rtol=1e-3, atol=1e-9
    )
  assert max(np.abs(w).max() for w in expected) > 1e-7


# -- rounds -------------------------------------------------------------------


def _config(**changes):
  settings = dict(
    sparsity=0.5,
    client_lr=0.1,
    local_epochs=2,
    batch_size=3,
    rounds=3,
    num_clients=3,
    clients_per_round=3,
    seed=3,
    prunefl_readjust_every=2,
    prunefl_initial_rounds=4,
    prunefl_initial_readjust_every=2,
  )
  settings.update(changes)
  return config_from_values(settings)


def _round(algorithm, state, round_num, states):
  clients = [
    api.ClientRound(
      client_id=_IDS[i],
      dataset=algorithm.client_dataset(
        _arrays(i, round_num),
        batch_size=3,
        local_epochs=2,
        shuffle_seed=round_num,
      ),
      num_examples=2 * _SIZES[i],
      state=states.get(_IDS[i], algorithm.initial_client_state()),
    )
    for i in range(3)
  ]
  return algorithm.next(state, round_num, clients)


_DENSE_MODEL = 4 * (48 + 8 + 24 + 3)  # Every trainable value, float32.
_BIASES = 4 * (8 + 3)


def _sparse_bytes(masks):
  return (
    sum(4 * int(np.sum(m)) + math.ceil(np.size(m) / 8) for m in masks) + _BIASES
  )


@pytest.mark.slow
def test_grasp_prunes_on_the_first_client_then_keeps_its_masks(tff_context):
  del tff_context
  algorithm = grasp.build_grasp(
    _config(
      algorithm="grasp",
    ),
    _TASK,
    _IDS,
  )
  state = algorithm.initialize()
  assert all(np.all(np.asarray(m) == 1) for m in state.model.masks)
  first = _round(algorithm, state, 1, {})
  masks = [np.asarray(m) for m in first.state.model.masks]
  # The global top 36 (= ERK budgets 20 + 16) of c0's scores of the initial
  # model over its round-1 batches, allotted over both kernels by score.
  assert sum(int(m.sum()) for m in masks) == sum(algorithm.keep) == 36
  kernels = [
    np.asarray(state.model.trainable[k.trainable_index])
    for k in algorithm.layout.kernels
  ]
  batches = [
    (b["x"], b["y"])
    for b in algorithm.client_dataset(
      _arrays(0, 1), batch_size=3, local_epochs=2, shuffle_seed=1
    )
  ]
  scores = np.concatenate(_hessian_scores(kernels, batches))
  threshold = np.sort(scores)[::-1][35]
  chosen = np.concatenate([m.reshape(-1) for m in masks]) > 0
  assert np.all(scores[chosen] >= threshold - 1e-9)
  # c0 downloaded the dense model and sent only the bit masks (48 -> 6
  # bytes, 24 -> 3), then trained the round like the others.
  traffic = {t.client_id: t for t in first.traffic}
  sparse = _sparse_bytes(masks)
  assert traffic["c0"].bytes_down == _DENSE_MODEL + sparse
  assert traffic["c1"].bytes_down == sparse
  assert traffic["c0"].bytes_up - traffic["c1"].bytes_up == 6 + 3
  assert traffic["c0"].flops == (2 * 18 + 18) * 216
  second = _round(algorithm, first.state, 2, {})
  for a, b in zip(masks, second.state.model.masks):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_prunefl_reconfigures_from_uploaded_squared_gradients(tff_context):
  del tff_context
  algorithm = prunefl.build_prunefl(
    _config(
      algorithm="prunefl",
    ),
    _TASK,
    _IDS,
  )
  assert algorithm.costs == [1.0, 1.0] and algorithm.constant_cost == 0.0
  first = _round(algorithm, algorithm.initialize(), 1, {})
  traffic = {t.client_id: t for t in first.traffic}
  masks = [np.asarray(m) for m in first.state.model.masks]
  # c = 0: the rule keeps exactly the floor, 36 weights.
  assert sum(int(m.sum()) for m in masks) == 36
  sparse = _sparse_bytes(masks)
  assert traffic["c0"].bytes_down == _DENSE_MODEL + sparse
  # c0 sent its pruned model (kept values, bit masks, biases) first, and
  # trained 4 local rounds of 18 examples before the round's 18.
  assert traffic["c0"].bytes_up - traffic["c1"].bytes_up == sparse
  assert traffic["c0"].flops == (4 * 18 + 18) * 216
  assert first.metrics["reconfigured"] == 0.0
  second = _round(algorithm, first.state, 2, {})
  assert second.metrics["reconfigured"] == 0.0
  third = _round(algorithm, second.state, 3, {})  # (3 - 1) % 2 == 0
  assert third.metrics["reconfigured"] == 1.0
  # Everyone also sent a float32 squared-gradient sum per kernel weight.
  extra = {t.client_id: t.bytes_up for t in third.traffic}
  plain = {t.client_id: t.bytes_up for t in second.traffic}
  assert {c: extra[c] - plain[c] for c in extra} == {c: 4 * 72 for c in plain}
  new_masks = [np.asarray(m) for m in third.state.model.masks]
  assert sum(int(m.sum()) for m in new_masks) == 36
  # Weights the reconfiguration added start at zero.
  for j, kernel in enumerate(algorithm.layout.kernels):
    added = (new_masks[j] > 0) & (np.asarray(second.state.model.masks[j]) == 0)
    values = np.asarray(third.state.model.trainable[kernel.trainable_index])
    assert np.all(values[added] == 0)
