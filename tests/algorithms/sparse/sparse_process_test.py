"""The sparse processes. `build_fedsgc_process`: its computations and state,
then known answers: each server-memory reading against TFF's own FedAvg of
single clients on the masked model (two rounds, different clients), the
clients' cumulative epochs and readjustments by hand, bytes by hand, and
refused arguments. `build_prunefl_process` and `build_grasp_process`: the
initial pruning on the first client of round 1 (kept counts, its traffic)
and PruneFL's importance upload by hand."""

import functools
import math

from conftest import sparse_toy_dataset
from conftest import sparse_toy_model
from conftest import sparse_toy_spec
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.aggregators import MaskedSumFactory
from tff_hetero.algorithms.sparse import fedsgc
from tff_hetero.algorithms.sparse import grasp
from tff_hetero.algorithms.sparse import prunefl
from tff_hetero.errors import UsageError
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel

_SPEC = sparse_toy_spec()
_IDS = ("a", "b", "c")
_LR = 0.1


_model = sparse_toy_model
_dataset = sparse_toy_dataset


# ERK at sparsity 0.5 over the kernels 4x8 and 8x2 (by hand, as in
# feddst_process_test): 13 of 32 and 11 of 16 kept.
_KEEP = (13, 11)


def _process(**kwargs):
  kwargs = dict(
    dict(
      input_spec=_SPEC,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
      client_ids=_IDS,
      local_epochs=1,
      readjust_end_epoch=10,
      sparsity=0.5,
    ),
    **kwargs,
  )
  return fedsgc.build_fedsgc_process(_model, **kwargs)


@functools.lru_cache(maxsize=None)
def _shared(**kwargs):
  """`_process(**kwargs)`, built once for the tests that run the same one
  (a process is a stateless builder: its state is explicit)."""
  return _process(**kwargs)


def test_computations_and_state(tff_context):
  del tff_context
  process = _shared()
  assert list(process.computations) == ["round", "readjust_round"]
  for computation in process.computations.values():
    assert isinstance(computation, tff.Computation)
    parameter = computation.type_signature.parameter
    # model, directions, running sums without the cohort's rows, epochs,
    # data, positions: the memory rows stay with the driver.
    assert [p.placement for p in parameter] == [tff.SERVER] * 3 + [
      tff.CLIENTS
    ] * 3
    assert parameter[4].member == tff.SequenceType(
      tff.types.tensorflow_to_type(_SPEC)
    )
  state = process.initialize()
  assert state.round_num == 0
  np.testing.assert_array_equal(state.client_epochs, [0, 0, 0])
  # One memory row per client id, server state.
  memory = state.server.memory
  assert [np.shape(v)[0] for v in memory.values] == [3] * 4
  assert np.shape(memory.weight) == (3,)
  masks = process.masks(state)
  assert [int(m.sum()) for m in masks] == list(_KEEP)
  # Without server memory: no sums or rows in the round.
  none = _shared(sgc_memory="none", readjust_every=0)
  assert list(none.computations) == ["round"]
  assert len(none.computations["round"].type_signature.parameter) == 5
  assert np.shape(none.initialize().server.memory.weight) == (0,)


def _masked_fedavg(reference, start: SparseModel, dataset) -> list[np.ndarray]:
  """`reference` (TFF's own `build_weighted_fed_avg` on the prune-wrapped
  model: masked forward pass) of one client from `start`, then masked: what
  a client without readjustment uploads."""
  layout = masks_lib.MaskLayout.of(masks_lib.prune_wrap(_model()))
  weights = tf.nest.map_structure(np.asarray, layout.to_model_weights(start))
  state = reference.set_model_weights(reference.initialize(), weights)
  state = reference.next(state, [dataset]).state
  trained = reference.get_model_weights(state).trainable
  masks = [np.asarray(m) for m in start.masks]
  return [
    np.asarray(w) * (masks[i // 2] if i % 2 == 0 else 1.0)
    for i, w in enumerate(trained)
  ]


@pytest.fixture(scope="module")
def oracle(tff_context):
  """The start W0 (every memory's initial model: the masks come from the
  seed) and TFF's W1 = FedAvg of a from W0, W2 = FedAvg of b from W1, on
  the masked model (`test_each_memory_reading_by_an_oracle`)."""
  del tff_context
  reference = tff.learning.algorithms.build_weighted_fed_avg(
    lambda: tff.learning.models.from_keras_model(
      masks_lib.prune_wrap(_model()),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=_SPEC,
    ),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
  )
  process = _shared(sgc_memory="models", readjust_every=0)
  start = SparseModel(*process.initialize().server.model)
  w1 = _masked_fedavg(reference, start, _dataset(0, 1, 20))
  w2 = _masked_fedavg(
    reference,
    SparseModel(trainable=w1, masks=start.masks, statistics=[]),
    _dataset(1, 2, 10),
  )
  return start, w1, w2


@pytest.mark.parametrize(
  "memory",
  [
    "models",
    pytest.param("updates", marks=pytest.mark.slow),
    pytest.param("none", marks=pytest.mark.slow),
  ],
)
def test_each_memory_reading_by_an_oracle(memory, oracle):
  """Round 1 trains client a (20 examples) alone, round 2 client b (10).
  Without readjustment the masks never change, so the union average is an
  element-wise mean on the global mask and the re-prune keeps that mask.
  With W0 the start, W1 = a's model (TFF FedAvg of a from W0) and W2 = b's
  (from W1), round 2 gives:
    models:  (20 W1 + 10 W2) / 30       (a's remembered upload counts)
    updates: W1 + (20 (W1 - W0) + 10 (W2 - W1)) / 30  (a's change re-added)
    none:    W2                         (this round's upload only)."""
  start, w1, w2 = oracle
  process = _shared(sgc_memory=memory, readjust_every=0)
  state = process.initialize()
  for got, want in zip(
    tf.nest.flatten(state.server.model), tf.nest.flatten(start)
  ):
    np.testing.assert_array_equal(got, want)
  state = process.next(state, {"a": _dataset(0, 1, 20)}).state
  w0 = [np.asarray(w) for w in start.trainable]
  after_one = process.get_model_weights(state).trainable
  for got, want in zip(after_one, w1):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
  state = process.next(state, {"b": _dataset(1, 2, 10)}).state
  if memory == "models":
    expected = [(20 * a + 10 * b) / 30 for a, b in zip(w1, w2)]
  elif memory == "updates":
    expected = [
      a + (20 * (a - z) + 10 * (b - a)) / 30 for z, a, b in zip(w0, w1, w2)
    ]
  else:
    expected = w2
  for got, want in zip(process.get_model_weights(state).trainable, expected):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
  assert [int(m.sum()) for m in process.masks(state)] == list(_KEEP)
  # The memory is server state: a's row and b's, by client id (none: no
  # rows at all).
  weights = np.asarray(state.server.memory.weight)
  np.testing.assert_array_equal(
    weights, [] if memory == "none" else [20, 10, 0]
  )


def test_client_epochs_and_readjustments_by_hand(tff_context):
  """Two local epochs: a client readjusts after its cumulative epochs
  t = 1, 3, 5, ... (begin ceil(E / 2) = 1, delta E = 2), pruning
  floor(alpha_t x 13) and floor(alpha_t x 11) weights, alpha_t = 0.2 / 2
  (1 + cos(pi t / 10))."""
  del tff_context
  process = _process(local_epochs=2, readjust_every=1)
  state = process.initialize()

  def pruned(t):
    alpha = 0.2 / 2 * (1 + math.cos(math.pi * t / 10))
    return sum(math.floor(alpha * k) for k in _KEEP)

  first = process.next(state, {"a": _dataset(0, 1, 10, epochs=2)})
  np.testing.assert_array_equal(first.state.client_epochs, [2, 0, 0])
  assert first.metrics["readjusts"] == 1.0
  assert first.metrics["pruned"] == first.metrics["grown"] == pruned(1) == 4
  second = process.next(
    first.state,
    {"a": _dataset(0, 2, 10, epochs=2), "b": _dataset(1, 2, 15, epochs=2)},
  )
  np.testing.assert_array_equal(second.state.client_epochs, [4, 2, 0])
  assert second.state.round_num == 2
  # a at t = 3, b at t = 1.
  assert second.metrics["readjusts"] == 2.0
  assert second.metrics["pruned"] == pruned(3) + pruned(1) == 3 + 4
  # Every kernel back at its ERK budget after the server's re-prune.
  assert [int(m.sum()) for m in process.masks(second.state)] == list(_KEEP)
  # Bytes by hand, per client: the model (kept kernel values 4 x 24, bit
  # masks 4 + 2 bytes, biases 4 x 10) and the direction maps at 2 bits per
  # element (8 + 4 bytes) on this requested round.
  assert [c.bytes_down for c in second.clients] == [142 + 12] * 2
  assert second.metrics["bytes_down"] == 2 * 154
  assert [c.examples for c in second.clients] == [20, 30]


def test_a_non_finite_update_is_zeroed_counted_and_not_remembered(
  tff_context,
):
  del tff_context
  process = _shared()
  state = process.initialize()
  x = np.full([10, 4], np.nan, np.float32)  # Gradients of NaN are NaN.
  broken = tf.data.Dataset.from_tensor_slices(
    dict(x=x, y=np.zeros([10], np.int32))
  ).batch(5)
  output = process.next(state, {"a": _dataset(0, 1, 10), "b": broken})
  assert output.metrics["non_finite_updates"] == 1.0
  # b sent zeros with weight 0: the model is a's alone, and finite.
  for tensor in process.get_model_weights(output.state).trainable:
    assert np.all(np.isfinite(tensor))
  memory = output.state.server.memory
  np.testing.assert_array_equal(memory.weight, [10.0, 0.0, 0.0])
  # Its metrics were reset (as TFF's client work does): the round's loss
  # is a's alone, and the run goes on.
  clean = process.next(state, {"a": _dataset(0, 1, 10)})
  assert clean.metrics["non_finite_updates"] == 0.0
  assert math.isfinite(clean.metrics["loss"])
  assert output.metrics["loss"] == clean.metrics["loss"]


def test_upload_bytes_by_hand_without_readjustment(tff_context):
  del tff_context
  process = _shared(sgc_memory="none", readjust_every=0)
  output = process.next(process.initialize(), {"c": _dataset(2, 1, 10)})
  (client,) = output.clients
  assert client.client_id == "c"
  # Down: 96 + 6 + 40 bytes, no direction map. Up: kept values and biases,
  # the float32 weight, no mask (unchanged), and 32 bytes of metric sums.
  assert client.bytes_down == 142
  assert client.bytes_up == 96 + 40 + 4 + 32


def test_bad_arguments_and_cohorts_are_refused(tff_context):
  del tff_context
  with pytest.raises(UsageError, match="--sparsity"):
    _process(sparsity=1.5)
  with pytest.raises(UsageError, match="--sgc_memory"):
    _process(sgc_memory="everything")
  with pytest.raises(ValueError, match="readjust_end_epoch"):
    _process(readjust_end_epoch=0)
  with pytest.raises(ValueError, match="client_ids"):
    _process(client_ids=("a", "a"))
  with pytest.raises(TypeError, match="client_optimizer_fn"):
    _process(client_optimizer_fn="sgd")
  with pytest.raises(TypeError, match="client_ids"):
    _process(client_ids="abc")
  with pytest.raises(UsageError, match="--readjust_every"):
    _process(readjust_every=0.5)
  with pytest.raises(ValueError, match="sgc_memory='none'"):
    _process(model_aggregator=tff.aggregators.SumFactory())
  process = _shared(sgc_memory="none", readjust_every=0)
  state = process.initialize()
  with pytest.raises(KeyError, match="'z'"):
    process.next(state, {"z": _dataset(0, 1, 5)})
  with pytest.raises(ValueError, match="at least one client"):
    process.next(state, {})
  with pytest.raises(TypeError, match="map client ids"):
    process.next(state, [_dataset(0, 1, 5)])


def _baseline(build, **kwargs):
  return build(
    _model,
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
    client_ids=_IDS,
    sparsity=0.5,
    **kwargs,
  )


def test_prunefl_prunes_first_then_uploads_importance(tff_context):
  del tff_context
  process = _baseline(prunefl.build_prunefl_process, prunefl_readjust_every=2)
  assert list(process.computations) == [
    "round",
    "reconfigure_round",
    "initial_pruning",
  ]
  state = process.initialize()
  # Dense until the first client prunes.
  assert [int(m.sum()) for m in process.masks(state)] == [32, 16]
  cohort = {"b": _dataset(1, 1, 10), "a": _dataset(0, 1, 20)}
  first = process.next(state, cohort)
  # The first client of the cohort pruned (one local round over its 10
  # examples) and then trained: 20 examples; the other only trained.
  assert [(c.client_id, c.examples) for c in first.clients] == [
    ("b", 20),
    ("a", 20),
  ]
  kept = sum(int(m.sum()) for m in process.masks(first.state))
  assert 24 <= kept < 48  # At least the target, 24 of 48 (density floor).
  # Round 2 trains; round 3 (1 + 2) reconfigures: the same client's upload
  # then also carries its squared gradients, float32 per kernel element
  # (4 x 48 bytes), and nothing else changes size.
  second = process.next(first.state, {"c": _dataset(2, 2, 10)})
  third = process.next(second.state, {"c": _dataset(2, 3, 10)})
  assert third.metrics["reconfigured"] == 1.0
  assert second.metrics["reconfigured"] == 0.0
  assert third.clients[0].bytes_up - second.clients[0].bytes_up == 4 * 48


def test_grasp_prunes_once_on_the_first_client(tff_context):
  del tff_context
  process = _baseline(grasp.build_grasp_process)
  assert list(process.computations) == ["round", "initial_pruning"]
  state = process.initialize()
  with pytest.raises(ValueError, match="grasp: round 1 prunes .* none of its"):
    process.next(state, {"b": _dataset(1, 1, 0)})
  # The first client with data prunes ("b" has none).
  first = process.next(
    state,
    {"b": _dataset(1, 1, 0), "a": _dataset(0, 1, 20), "c": _dataset(2, 1, 10)},
  )
  masks = process.masks(first.state)
  # Exactly the target (ERK budgets' total, 13 + 11), placed by score.
  assert sum(int(m.sum()) for m in masks) == 24
  # The pruning client: two passes over its 20 examples, then training.
  assert [c.examples for c in first.clients] == [0, 60, 10]
  later = process.next(first.state, {"b": _dataset(1, 2, 10)})
  for a, b in zip(masks, process.masks(later.state)):
    np.testing.assert_array_equal(a, b)  # Fixed from then on.


@pytest.mark.slow
def test_baselines_sum_through_the_given_aggregator(tff_context):
  """TFF's zeroing at a norm every upload exceeds, around the masked sum:
  each client's values are zeroed (their weights still count), so every
  weight some upload holds becomes 0. GraSP's rounds: PruneFL's builder
  hands `model_aggregator` to the same `SparseTraining` rounds (its
  plain rounds are checked above)."""
  del tff_context
  process = _baseline(
    grasp.build_grasp_process,
    model_aggregator=tff.aggregators.zeroing_factory(1e-6, MaskedSumFactory()),
  )
  output = process.next(
    process.initialize(), {"a": _dataset(0, 1, 20), "c": _dataset(2, 1, 10)}
  )
  for weights in process.get_model_weights(output.state).trainable:
    np.testing.assert_array_equal(weights, np.zeros_like(weights))


def test_prunefl_hands_the_model_aggregator_to_its_rounds():
  """PruneFL's builder passes `model_aggregator` on (GraSP's rounds above
  show what the rounds do with it): a factory that records its calls is
  asked for the model's aggregation process."""
  asked = []

  class Recording(MaskedSumFactory):
    def create(self, *args, **kwargs):
      asked.append(args)
      return super().create(*args, **kwargs)

  _baseline(prunefl.build_prunefl_process, model_aggregator=Recording())
  assert asked, "build_prunefl_process did not use model_aggregator"
