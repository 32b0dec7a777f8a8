"""`build_heterofl_process` (the public HeteroFL `WidthProcess`): its typed
parts, then known answers from TFF and by hand: a mixed-width round equals
each client trained alone by TFF's own FedAvg on its hand-sliced sub-model,
then the element-wise weighted mean of whoever holds each element (by hand,
in NumPy); the bytes by hand; the seeded DP noise; build-time errors."""

import collections
import re

import attrs
from conftest import tff_fedavg_round
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_hetero

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32)
)
_FULL = (6, 4)
_LR = 0.1


def _mlp(widths):
  """4 -> widths[0] -> widths[1] -> 3 logits, seeded."""
  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        widths[0],
        activation="relu",
        input_shape=(4,),
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
        bias_initializer=tf.keras.initializers.RandomNormal(seed=2),
      ),
      tf.keras.layers.Dense(
        widths[1],
        activation="relu",
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3),
        bias_initializer=tf.keras.initializers.RandomNormal(seed=4),
      ),
      tf.keras.layers.Dense(
        3, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=5)
      ),
    ]
  )


def _half_slice(full):
  """Rate 0.5 of (6, 4) is widths (3, 2) (ceil): each kernel's first rows
  and columns, the logits' columns whole (by hand)."""
  k1, b1, k2, b2, k3, b3 = full
  return [k1[:, :3], b1[:3], k2[:3, :2], b2[:2], k3[:2, :], b3]


def _half_coverage():
  shapes = [(4, 6), (6,), (6, 4), (4,), (4, 3), (3,)]
  masks = [np.zeros(s, np.float32) for s in shapes]
  for mask, part in zip(masks, _half_slice(masks)):
    part[...] = 1.0
  return masks


def _scatter_half(values):
  shapes = [(4, 6), (6,), (6, 4), (4,), (4, 3), (3,)]
  full = [np.zeros(s, np.float32) for s in shapes]
  for target, value in zip(_half_slice(full), values):
    target[...] = value
  return full


def _dataset(seed, n):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=[n, 4]).astype(np.float32)
  y = rng.integers(0, 3, size=[n]).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(x=x, y=y)
  ).batch(3)


_SIZES = {0.5: (7, 5), 1.0: (4,)}


def _cohort():
  seed = iter(range(10))
  return collections.OrderedDict(
    (rate, [_dataset(next(seed), n) for n in sizes])
    for rate, sizes in _SIZES.items()
  )


def _process(**kwargs):
  arguments = dict(
    full_widths=_FULL,
    rates=(0.5,),
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
  )
  arguments.update(kwargs)
  return tff_hetero.build_heterofl_process(_mlp, **arguments)


@pytest.fixture(scope="module")
def process():
  """The default process (example weights), built once for the tests that
  read or run it, from widths given as NumPy integers (as a user's array
  gives them): they are accepted."""
  return _process(full_widths=(np.int64(6), np.int64(4)))


def test_type_signatures(process):
  steps = process.computations
  assert list(steps) == ["group_round/0.5", "group_round/1.0", "apply_sums"]
  half = [(4, 3), (3,), (3, 2), (2,), (2, 3), (3,)]
  full = [(4, 6), (6,), (6, 4), (4,), (4, 3), (3,)]
  for name, shapes in (("group_round/0.5", half), ("group_round/1.0", full)):
    signature = steps[name].type_signature
    sent, data = signature.parameter
    assert sent.placement is tff.SERVER
    assert [t.shape for t in sent.member] == shapes
    assert data.placement is tff.CLIENTS
    assert isinstance(data.member, tff.SequenceType)
    sums, measurements = signature.result
    assert sums.placement is measurements.placement is tff.SERVER
    weighted, weight = sums.member
    assert [t.shape for t in weighted] == shapes
    assert weight.dtype == np.float32 and weight.shape == ()
  server_type = tff.types.to_type([tff.TensorType(np.float32, s) for s in full])
  apply_sums = steps["apply_sums"].type_signature
  assert apply_sums.result.is_equivalent_to(server_type)
  assert apply_sums.parameter[0].is_equivalent_to(server_type)
  assert list(process.levels) == [0.5, 1.0]


_START = [np.asarray(w) for w in _mlp(_FULL).get_weights()]
_ALONE = {}  # (rate, client) -> its weights trained alone from _START


def _trained_alone(rate, k):
  """Client k of `_cohort()`'s level `rate` trained alone from `_START` by
  one round of TFF's FedAvg on its hand-sliced sub-model, scattered into
  the full shapes (computed once: several oracles use it)."""
  if (rate, k) not in _ALONE:
    dataset = _cohort()[rate][k]
    if rate == 1.0:
      _ALONE[rate, k] = tff_fedavg_round(
        lambda: _mlp(_FULL), _SPEC, _LR, _START, [dataset]
      )
    else:
      _ALONE[rate, k] = _scatter_half(
        tff_fedavg_round(
          lambda: _mlp((3, 2)), _SPEC, _LR, _half_slice(_START), [dataset]
        )
      )
  return _ALONE[rate, k]


def _masked_mean_by_hand(cohort, weight_of):
  """Each client of `_cohort()` at the rates `cohort` names (its keys)
  trained alone by TFF's FedAvg on its hand-sliced sub-model, then per
  element the mean of the values returned for it, client k weighted by
  `weight_of(n_k)` (every element is covered). Only the keys of `cohort`
  are read: each client's data is `_cohort()`'s."""
  start = _START
  weighted = [np.zeros_like(w) for w in start]
  counts = [np.zeros_like(w) for w in start]
  for rate in cohort:
    for k, n in enumerate(_SIZES[rate]):
      trained = _trained_alone(rate, k)
      if rate == 1.0:
        coverage = [np.ones_like(w) for w in start]
      else:
        coverage = _half_coverage()
      for i in range(len(start)):
        weighted[i] += weight_of(n) * trained[i]
        counts[i] += weight_of(n) * coverage[i]
  return [w / c for w, c in zip(weighted, counts)]


@pytest.mark.slow
def test_uniform_client_weighting_by_hand_and_metrics_without_accuracy(
  tff_context,
):
  """Uniform weights, by hand; the process's metrics without accuracy
  (`metrics_fn=list`, which the weights do not depend on) report the loss
  only."""
  del tff_context
  process = _process(
    client_weighting=tff.learning.ClientWeighting.UNIFORM, metrics_fn=list
  )
  cohort = _cohort()
  output = process.next(process.initialize(), cohort)
  expected = _masked_mean_by_hand(cohort, weight_of=lambda n: 1.0)
  for actual, wanted in zip(output.state.model.trainable, expected):
    np.testing.assert_allclose(actual, wanted, rtol=0, atol=1e-5)
  assert "train_accuracy" not in output.metrics
  assert np.isfinite(output.metrics["loss"])


def test_mixed_round_equals_tff_fedavg_per_client_then_masked_mean(
  tff_context, process
):
  del tff_context
  state = process.initialize()
  np.testing.assert_array_equal(state.model.trainable[0], _START[0])
  cohort = _cohort()
  output = process.next(state, cohort)
  assert "train_accuracy" in output.metrics
  expected = _masked_mean_by_hand(cohort, weight_of=lambda n: n)
  for actual, wanted in zip(output.state.model.trainable, expected):
    np.testing.assert_allclose(actual, wanted, rtol=0, atol=1e-5)
  assert output.state.round_num == 1

  # Bytes: 4 per float32 value sent; up, the update, its weight and the
  # metric sums (the same for every client).
  half_params = 4 * 3 + 3 + 3 * 2 + 2 + 2 * 3 + 3
  full_params = 4 * 6 + 6 + 6 * 4 + 4 + 4 * 3 + 3
  assert [c.client_id for c in output.clients] == ["0.5/0", "0.5/1", "1.0/0"]
  assert [c.bytes_down for c in output.clients] == [
    4 * half_params,
    4 * half_params,
    4 * full_params,
  ]
  # Metric sums: loss and accuracy as float32 pairs, examples and batches
  # as int64 (32 bytes).
  assert [c.bytes_up for c in output.clients] == [
    4 * half_params + 4 + 32,
    4 * half_params + 4 + 32,
    4 * full_params + 4 + 32,
  ]
  assert [c.examples for c in output.clients] == [7, 5, 4]
  assert output.metrics["bytes_down"] == 4 * (2 * half_params + full_params)
  assert output.metrics["bytes_up"] == sum(c.bytes_up for c in output.clients)
  assert output.metrics["examples"] == 16

  # A round of half-width clients only: what no client holds keeps its value.
  half_only = process.next(
    output.state, collections.OrderedDict([(0.5, cohort[0.5])])
  )
  for before, after, covered in zip(
    output.state.model.trainable,
    half_only.state.model.trainable,
    _half_coverage(),
  ):
    np.testing.assert_array_equal(after[covered == 0], before[covered == 0])
    assert np.any(after[covered == 1] != before[covered == 1])

  # The rate-0.5 model is the hand slice of the new server model.
  sub = process.get_model_weights(output.state, 0.5)
  for actual, wanted in zip(
    sub.trainable, _half_slice(list(output.state.model.trainable))
  ):
    np.testing.assert_array_equal(actual, wanted)
  assert process.model_fn(0.5)().layers[0].units == 3


@pytest.mark.slow
def test_private_rounds_are_noised_by_the_seed_in_the_state(tff_context):
  del tff_context
  private = tff_hetero.MaskedAggregation(clip_norm=0.5, noise_multiplier=1.0)
  process = _process(model_aggregator=private, noise_seed=7)
  assert "apply_noised_sums" in process.computations
  state = process.initialize()
  assert state.noise_seed == 7
  cohort = _cohort()
  first = process.next(state, cohort).state.model.trainable
  again = process.next(state, cohort).state.model.trainable
  other = process.next(
    attrs.evolve(state, noise_seed=8), cohort
  ).state.model.trainable
  clipped_only = _process(
    model_aggregator=tff_hetero.MaskedAggregation(
      clip_norm=0.5, noise_multiplier=0.0
    ),
    noise_seed=7,
  )
  no_noise = clipped_only.next(state, cohort).state.model.trainable
  # The noise is seeded by (noise_seed, round): the same pair draws the
  # same, another seed or round another.
  second_round = process.next(
    attrs.evolve(state, round_num=1), cohort
  ).state.model.trainable
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(first, other))
  assert any(not np.array_equal(a, b) for a, b in zip(first, second_round))
  assert "noise_seed" not in repr(state)
  # Noise of std z C = 0.5 on every element's sum (counts 1 to 3 clients)
  # moves some of the 108 weights well away from the clipped mean.
  noise = max(float(np.max(np.abs(a - b))) for a, b in zip(first, no_noise))
  assert noise > 0.1


@pytest.mark.slow
def test_tff_aggregators_wrap_the_masked_sum_zeroing_and_secure_sum(
  tff_context,
):
  """TFF's zeroing around a masked sum whose two inner sums are secure sums
  (simulated: `tff_hetero.runtime.contexts`): the full-width client's
  update, from inputs 1e4 times larger, exceeds the zeroing norm and counts
  as update 0 with its weight (TFF's zeroing keeps the weight); the others
  are averaged by hand. The secure sums quantize to 32 bits within their
  bounds (50 for the weighted updates, 100 for the counts)."""
  del tff_context
  factory = tff.aggregators.zeroing_factory(
    1.0,
    tff_hetero.MaskedSumFactory(
      value_sum_factory=tff.aggregators.SecureSumFactory(50.0),
      weight_sum_factory=tff.aggregators.SecureSumFactory(100.0),
    ),
  )
  process = _process(model_aggregator=factory)
  start = _START
  cohort = _cohort()
  cohort[1.0] = [
    cohort[1.0][0].map(
      lambda b: collections.OrderedDict(x=b["x"] * 1e4, y=b["y"])
    )
  ]
  output = process.next(process.initialize(), cohort)

  weighted = [np.zeros_like(w) for w in start]
  counts = [np.zeros_like(w) for w in start]
  for k, n in enumerate(_SIZES[0.5]):
    trained = _half_slice(_trained_alone(0.5, k))
    update = _scatter_half([s - t for s, t in zip(_half_slice(start), trained)])
    assert max(float(np.max(np.abs(u))) for u in update) < 1.0
    for i, coverage in enumerate(_half_coverage()):
      weighted[i] += n * update[i]
      counts[i] += n * coverage
  trained = tff_fedavg_round(
    lambda: _mlp(_FULL), _SPEC, _LR, start, cohort[1.0]
  )
  big = max(float(np.max(np.abs(s - t))) for s, t in zip(start, trained))
  assert big > 1.0  # Zeroed: its max-norm exceeds 1.
  for i in range(len(start)):
    counts[i] += _SIZES[1.0][0]  # Its weight still counts, everywhere.
  expected = [s - w / c for s, w, c in zip(start, weighted, counts)]
  for actual, wanted in zip(output.state.model.trainable, expected):
    np.testing.assert_allclose(actual, wanted, rtol=0, atol=1e-5)


def test_a_factory_that_does_not_form_masked_sums_is_refused(tff_context):
  del tff_context
  with pytest.raises(TypeError, match="must return MaskedSums") as caught:
    _process(model_aggregator=tff.aggregators.MeanFactory())
  assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
  "kwargs, error, text",
  [
    (dict(rates=(0.0,)), ValueError, "rates must lie in (0, 1]"),
    (dict(full_widths=(6, 0)), ValueError, "full_widths must be positive"),
    (dict(model_aggregator="dp"), TypeError, "MaskedAggregation"),
    (
      dict(client_optimizer_fn=lambda: tf.keras.optimizers.SGD(0.1)),
      TypeError,
      "tff.learning.optimizers.Optimizer",
    ),
    (dict(noise_seed=3), ValueError, "only with a private aggregation"),
    (dict(server_lr=float("nan")), ValueError, "server_lr must be finite"),
    (dict(input_spec=None), TypeError, "input_spec is required"),
    (
      dict(
        model_aggregator=tff_hetero.MaskedAggregation(
          clip_norm=1.0, noise_multiplier=0.5
        ),
        client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
      ),
      ValueError,
      "weighs clients uniformly",
    ),
  ],
)
def test_bad_arguments_fail_at_build_time(kwargs, error, text):
  with pytest.raises(error, match=re.escape(text)):
    _process(**kwargs)


def test_bad_cohorts_are_refused(tff_context, process):
  del tff_context
  state = process.initialize()
  with pytest.raises(KeyError, match="no level 0.3"):
    process.next(state, {0.3: [_dataset(0, 3)]})
  with pytest.raises(ValueError, match="at least one client dataset"):
    process.next(state, {0.5: []})
  with pytest.raises(TypeError, match="must map each level key"):
    process.next(state, [_dataset(0, 3)])
  with pytest.raises(TypeError, match="must be a list of datasets"):
    process.next(state, {0.5: _dataset(0, 3)})
