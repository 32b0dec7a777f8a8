"""`build_feddst_process`: its type signature, then known answers: the
readjust schedule decided in the graph from the round counter (alpha by the
cosine, counts by hand), ERK densities kept, bytes by hand, a round without
readjustment against TFF's own FedAvg on the masked model, and learning."""

import collections
import math

from conftest import sparse_toy_dataset
from conftest import sparse_toy_model
from conftest import sparse_toy_spec
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms.sparse import feddst
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel

_SPEC = sparse_toy_spec()
_TOTAL_ROUNDS = 6
_ALPHA = 0.2


_model = sparse_toy_model
_dataset = sparse_toy_dataset


# ERK at sparsity 0.5 (by hand): raw densities (4 + 8) / 32 = 0.375 and
# (8 + 2) / 16 = 0.625; 24 of 48 kernel weights kept: eps (0.375 x 32 +
# 0.625 x 16) = 24, eps = 24 / 22; densities 0.409 and 0.682, i.e.
# round(13.09) = 13 of 32 and round(10.91) = 11 of 16.
_KEEP = (13, 11)
_SIZES = (32, 16)


def _cohort(round_num: int):
  # 20 and 10 examples, batches of 5: last batches of 5 each.
  return [_dataset(0, round_num, 20), _dataset(1, round_num, 10)]


def _process(**kwargs):
  kwargs = dict(
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    total_rounds=_TOTAL_ROUNDS,
    sparsity=0.5,
    prune_alpha=_ALPHA,
    readjust_every=2,
    **kwargs,
  )
  return feddst.build_feddst_process(_model, **kwargs)


@pytest.fixture(scope="module")
def process():
  return _process()


def test_type_signature(process):
  assert isinstance(process, tff.learning.templates.LearningProcess)
  state_type = process.initialize.type_signature.result
  assert state_type.placement is tff.SERVER
  data_type = process.next.type_signature.parameter[1]
  assert data_type.placement is tff.CLIENTS
  assert data_type.member == tff.SequenceType(
    tff.types.tensorflow_to_type(_SPEC)
  )
  result = process.next.type_signature.result
  assert result.state == state_type
  member = state_type.member
  kernels = [tff.TensorType(np.float32, s) for s in ((4, 8), (8, 2))]
  assert list(member.model.masks) == kernels
  assert member.round_num == tff.TensorType(np.int64)
  sparse = result.metrics.member.sparse
  assert "readjust" in dir(sparse) and "upload_bytes" in dir(sparse)
  assert sparse.non_finite_updates == tff.TensorType(np.int32)
  # The weights are those of the plain Keras model, not the wrapped one.
  plain = _model()
  weights = process.get_model_weights.type_signature.result
  assert [t.shape for t in weights.trainable] == [
    tuple(v.shape) for v in plain.trainable_weights
  ]
  assert len(weights.non_trainable) == len(plain.non_trainable_weights) == 0


def test_wrong_arguments_are_refused():
  with pytest.raises(TypeError, match="client_optimizer_fn"):
    _process_with(client_optimizer_fn="sgd")
  with pytest.raises(ValueError, match="total_rounds"):
    _process_with(total_rounds=0)


def _process_with(**overrides):
  kwargs = dict(
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    total_rounds=_TOTAL_ROUNDS,
  )
  kwargs.update(overrides)
  return feddst.build_feddst_process(_model, **kwargs)


def _alpha(round_num: int) -> float:
  return _ALPHA / 2 * (1 + math.cos(math.pi * round_num / _TOTAL_ROUNDS))


@pytest.fixture(scope="module")
def first_rounds(process, tff_context):
  """The outputs of rounds 1 to 5 from the initial state, `_cohort` each."""
  del tff_context
  state = process.initialize()
  outputs = []
  for round_num in range(1, 6):
    outputs.append(process.next(state, _cohort(round_num)))
    state = outputs[-1].state
  return outputs


def test_readjusts_on_requested_rounds_by_the_cosine(first_rounds):
  for round_num, output in enumerate(first_rounds, start=1):
    state = output.state
    assert state.round_num == round_num
    metrics = output.metrics
    counts = metrics["sparse"]["readjust"]
    # Requested on rounds 1, 3, 5 (every 2): each of the two clients
    # readjusts once, at the end of its local training (the last batch's
    # gradient recomputed: 5 examples each).
    if round_num % 2 == 1:
      assert counts.readjusts == 2.0
      assert counts.gradient_examples == 10.0
      np.testing.assert_allclose(
        counts.prune_fraction, 2 * _alpha(round_num), rtol=1e-6
      )
      # k = floor(alpha x active) per kernel and client, as many grown.
      pruned = 2 * sum(math.floor(_alpha(round_num) * k) for k in _KEEP)
      assert counts.pruned == counts.grown == pruned
    else:
      assert counts.readjusts == counts.pruned == counts.grown == 0.0
    # Every kernel back at its ERK budget after the server's re-prune.
    np.testing.assert_allclose(
      metrics["sparse"]["density"],
      [k / n for k, n in zip(_KEEP, _SIZES)],
      rtol=1e-6,
    )
    masks = [np.asarray(m) for m in state.model.masks]
    assert [int(m.sum()) for m in masks] == list(_KEEP)
    # Bytes by hand: the round number (8 bytes) and the model (kept kernel
    # values 4 x 24, bit masks 4 + 2, biases 4 x 10) to each client; up: the
    # same values and biases, the float32 weight, and a kernel's bit mask
    # only where it changed (readjust rounds).
    assert metrics["round"]["bytes_down"] == 2 * 8
    assert metrics["sparse"]["distributor"]["bytes_down"] == 2 * (96 + 6 + 40)
    dense_up = 2 * (96 + 40 + 4)
    if round_num % 2 == 1:
      # (A client may regrow exactly what it pruned: then no mask is sent.)
      assert dense_up <= metrics["sparse"]["upload_bytes"] <= dense_up + 12
    else:
      assert metrics["sparse"]["upload_bytes"] == dense_up


def test_a_round_without_data_keeps_the_model(process, tff_context):
  # Nobody uploads anything: the server keeps every weight and mask (a
  # re-prune over no upload would keep nothing, for good).
  del tff_context
  state = process.initialize()
  nothing = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=np.zeros([0, 4], np.float32), y=np.zeros([0], np.int32)
    )
  ).batch(5)
  after = process.next(state, [nothing, nothing]).state
  assert after.round_num == 1
  for a, b in zip(after.model.trainable, state.model.trainable):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(after.model.masks, state.model.masks):
    np.testing.assert_array_equal(a, b)
  # And training goes on from it.
  trained = process.next(after, _cohort(2)).state
  assert [int(np.sum(m)) for m in trained.model.masks] == list(_KEEP)


def _default_loss():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _summed_cross_entropy():
  """Not the default loss: the batch's sum, not its mean."""
  return tf.keras.losses.SparseCategoricalCrossentropy(
    from_logits=True, reduction=tf.keras.losses.Reduction.SUM
  )


@pytest.mark.parametrize(
  "loss_fn",
  [
    pytest.param(None, id="default_loss"),
    pytest.param(
      _summed_cross_entropy, id="given_loss", marks=pytest.mark.slow
    ),
  ],
)
def test_masked_round_equals_tff_fedavg_on_the_masked_model(
  tff_context, loss_fn
):
  """Without readjustment every client keeps the global mask, so the union
  average is the example-weighted mean on that mask and the re-prune keeps
  it: TFF's FedAvg on the prune-wrapped model (masked forward pass) with
  the same loss, started from the same weights, then masked."""
  del tff_context
  process = _process_with(sparsity=0.5, readjust_every=0, loss_fn=loss_fn)
  state = process.initialize()
  wrapped = masks_lib.prune_wrap(_model())
  layout = masks_lib.MaskLayout.of(wrapped)
  reference = tff.learning.algorithms.build_weighted_fed_avg(
    lambda: tff.learning.models.from_keras_model(
      masks_lib.prune_wrap(_model()),
      loss=(loss_fn or _default_loss)(),
      input_spec=_SPEC,
    ),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
  )
  start = layout.to_model_weights(SparseModel(*state.model))
  ref_state = reference.set_model_weights(
    reference.initialize(),
    tf.nest.map_structure(lambda t: np.asarray(t), start),
  )
  for round_num in (1, 2):
    state = process.next(state, _cohort(round_num)).state
    ref_state = reference.next(ref_state, _cohort(round_num)).state
  expected = reference.get_model_weights(ref_state)
  masks = [np.asarray(m) for m in state.model.masks]
  assert [int(m.sum()) for m in masks] == list(_KEEP)
  for i, (actual, want) in enumerate(
    zip(process.get_model_weights(state).trainable, expected.trainable)
  ):
    want = np.asarray(want) * (masks[i // 2] if i % 2 == 0 else 1.0)
    np.testing.assert_allclose(actual, want, rtol=0, atol=1e-6)
  for mask, kept in zip(masks, layout.masks(expected)):
    np.testing.assert_array_equal(mask, np.asarray(kept))


@pytest.mark.slow
def test_learns_and_weights_load_into_the_plain_model(process, first_rounds):
  state = first_rounds[-1].state  # After round 5.
  # Many more rounds than the cosine's end: readjustment stops there.
  for round_num in range(6, 31):
    state = process.next(state, _cohort(round_num)).state
  model = _model()
  process.get_model_weights(state).assign_weights_to(model)
  test = _dataset(9, 0, 400)
  x = np.concatenate([b["x"] for b in test])
  y = np.concatenate([b["y"] for b in test])
  accuracy = np.mean(np.argmax(model(x).numpy(), axis=1) == y)
  assert accuracy > 0.85  # Chance: 0.5.
  kernels = [model.layers[0].kernel.numpy(), model.layers[1].kernel.numpy()]
  assert [int(np.count_nonzero(k)) for k in kernels] == list(_KEEP)

  # set_model_weights re-masks the kernels and keeps the round counter.
  ones = tff.learning.models.ModelWeights(
    trainable=[np.ones(v.shape, np.float32) for v in model.trainable_weights],
    non_trainable=[],
  )
  reset = process.set_model_weights(state, ones)
  assert reset.round_num == state.round_num
  got = process.get_model_weights(reset).trainable
  np.testing.assert_array_equal(got[0], np.asarray(state.model.masks[0]))
  np.testing.assert_array_equal(got[1], np.ones(8, np.float32))


def _bn_model():
  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        8,
        input_shape=(4,),
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
      ),
      tf.keras.layers.BatchNormalization(),
      tf.keras.layers.ReLU(),
      tf.keras.layers.Dense(
        2, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2)
      ),
    ]
  )


def test_batch_norm_statistics_are_the_plain_models_non_trainable(
  tff_context,
):
  del tff_context
  process = feddst.build_feddst_process(
    _bn_model,
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    total_rounds=_TOTAL_ROUNDS,
    sparsity=0.5,
  )
  plain = _bn_model()
  state = process.initialize()
  weights = process.get_model_weights(state)
  # BN's moving mean and variance (8 each): zeros and ones at the start.
  assert [np.shape(w) for w in weights.non_trainable] == [(8,), (8,)]
  np.testing.assert_array_equal(weights.non_trainable[0], np.zeros(8))
  np.testing.assert_array_equal(weights.non_trainable[1], np.ones(8))
  assert [np.shape(w) for w in weights.trainable] == [
    tuple(v.shape) for v in plain.trainable_weights
  ]
  # Set and get again: the statistics are kept as given, kernels re-masked.
  statistics = [np.full(8, 0.5, np.float32), np.full(8, 2.0, np.float32)]
  dense = [np.ones(np.shape(w), np.float32) for w in weights.trainable]
  state = process.set_model_weights(
    state,
    tff.learning.models.ModelWeights(trainable=dense, non_trainable=statistics),
  )
  again = process.get_model_weights(state)
  np.testing.assert_array_equal(again.non_trainable[0], statistics[0])
  np.testing.assert_array_equal(again.non_trainable[1], statistics[1])
  kept = [int(np.sum(np.asarray(w) != 0)) for w in again.trainable]
  # ERK at sparsity 0.5 over the kernels 4x8 and 8x2 (by hand, as _KEEP):
  # 13 and 11 kept; BN's gamma and beta and the biases stay dense.
  assert kept == [13, 8, 8, 8, 11, 2]
  again.assign_weights_to(plain)
  np.testing.assert_array_equal(plain.layers[1].moving_variance, statistics[1])
