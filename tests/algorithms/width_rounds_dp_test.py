"""Clipping and DP noise in width-heterogeneous rounds (`masked_dp`).

Oracles: each client's own update u_c, by hand: its level's slice of the
model (the hidden layer's first units, by hand) trained by SGD over its
batches with a gradient tape, zero on the elements it does not hold; then
clipping, uniform weights and the per-element mean are computed here by
hand. The noise's scale is checked against z C / n.
"""

from __future__ import annotations

import collections

from conftest import checkpoint_round_trip
import numpy as np
import pytest
import tensorflow as tf

from tff_hetero.aggregators import masked_dp
from tff_hetero.aggregators.masked import MaskedSums
from tff_hetero.algorithms import api
from tff_hetero.algorithms import width_rounds
from tff_hetero.models.width import WidthUnit

_SHAPE = (4,)
_UNITS = (WidthUnit(1, "hidden", 6, ("hidden",)),)
_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, *_SHAPE], tf.float32),
  y=tf.TensorSpec([None], tf.int32),
)


def _mlp(widths=(6,)):
  return tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer(input_shape=_SHAPE),
      tf.keras.layers.Dense(
        widths[0],
        name="hidden",
        kernel_initializer=tf.keras.initializers.GlorotUniform(1),
        bias_initializer=tf.keras.initializers.RandomNormal(seed=2),
      ),
      tf.keras.layers.Dense(
        3,
        name="logits",
        kernel_initializer=tf.keras.initializers.GlorotUniform(3),
      ),
    ]
  )


_TASK = api.Task(
  "mlp_toy",
  _mlp,
  _SHAPE,
  3,
  _SPEC,
  training_flops_per_example=1,
  width_model_fn=lambda w: _mlp(tuple(w)),
  width_units=_UNITS,
)
# 4x6 + 6 + 6x3 + 3 = 51 parameters; the half-width level holds 4x3 + 3 +
# 3x3 + 3 = 27 of them.
_CATALOG = width_rounds.LevelCatalog(_TASK, [("half", (3,)), ("full", (6,))])
_HALF, _FULL = _CATALOG.levels


_SIZES = {0: 6, 1: 4, 2: 10, 3: 6}


def _client(i):
  n = _SIZES[i]
  rng = np.random.default_rng(i)
  data = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=rng.normal(size=[n, *_SHAPE]).astype(np.float32) * 3,
      y=rng.integers(0, 3, size=[n]).astype(np.int32),
    )
  ).batch(2)
  return api.ClientRound(client_id=f"c{i}", dataset=data, num_examples=n)


def _flat(weights):
  return np.concatenate([np.ravel(w) for w in weights])


def _coverage(level):
  m = _CATALOG.map(_CATALOG.outer, level)
  return _flat(m.scatter([tf.ones(s.inner_shape) for s in m.trainable]))


def _rounds(lr, aggregation=masked_dp.MaskedAggregation()):
  return width_rounds.HeterogeneousRounds(
    _CATALOG, client_lr=lr, aggregation=aggregation, noise_seed=5
  )


_INITIAL = _CATALOG.initial_weights(_FULL)


def _run(rounds, assignment, round_num=1):
  """assignment: [(level, client index), ...], grouped by level."""
  groups = [
    width_rounds.Group(
      level, level, tuple(_client(i) for lv, i in assignment if lv is level)
    )
    for level in (_HALF, _FULL)
    if any(lv is level for lv, _ in assignment)
  ]
  result = rounds.run(_INITIAL, groups, round_num=round_num)
  return _flat(result.model.trainable)


def _held(weights, level):
  """The part of the full model's [kernel, bias, kernel, bias] that
  `level` holds (by hand: its hidden units are the first ones)."""
  k1, b1, k2, b2 = weights
  units = 3 if level is _HALF else 6
  return [k1[:, :units], b1[:units], k2[:units, :], b2]


def _update_by_hand(level, i, lr):
  """Client i's update (flat, full shapes): its level's slice of
  `_INITIAL` minus that slice after one pass of SGD at `lr` over its
  batches (mean cross-entropy on logits), zero where it holds nothing."""
  start = _held([np.asarray(w) for w in _INITIAL.trainable], level)
  model = level.keras_fn()
  for variable, value in zip(model.trainable_variables, start):
    variable.assign(value)
  for batch in _client(i).dataset:
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(
          batch["y"], model(batch["x"]), from_logits=True
        )
      )
    grads = tape.gradient(loss, model.trainable_variables)
    for variable, grad in zip(model.trainable_variables, grads):
      variable.assign_sub(lr * grad)
  update = [np.zeros(np.shape(w), np.float32) for w in _INITIAL.trainable]
  for part, s, v in zip(_held(update, level), start, model.trainable_variables):
    part[...] = s - v.numpy()
  return _flat(update)


@pytest.mark.slow
def test_clipped_uniform_masked_mean_by_hand(tff_context):
  del tff_context
  assignment = [(_HALF, 0), (_HALF, 1), (_FULL, 2)]
  w0 = _flat(_INITIAL.trainable)
  updates = [_update_by_hand(lv, i, 0.5) for lv, i in assignment]
  coverages = [_coverage(lv) for lv, _ in assignment]
  for u, cov in zip(updates, coverages):
    np.testing.assert_array_equal(u[cov == 0], 0)  # Only its own level.
  norms = [np.linalg.norm(u) for u in updates]
  clip = float(np.median(norms))  # Clips some clients, not all.
  assert min(norms) < clip < max(norms)
  clipped = [u * min(1.0, clip / n) for u, n in zip(updates, norms)]
  counts = np.sum(coverages, axis=0)
  assert set(counts) == {1, 3}  # Full-only elements, and shared ones.
  # DP weighs clients uniformly: per element, the mean of the clipped updates
  # of the clients holding it.
  uniform = w0 - np.sum(clipped, axis=0) / counts
  no_noise = masked_dp.MaskedAggregation(clip_norm=clip, noise_multiplier=0.0)
  np.testing.assert_allclose(
    _run(_rounds(0.5, no_noise), assignment), uniform, atol=1e-5
  )
  # `clip` alone keeps example weights (6, 4 and 10 examples, one epoch).
  n = np.array([_SIZES[i] for _, i in assignment], np.float64)[:, None]
  weighted = w0 - np.sum(n * np.array(clipped), axis=0) / np.sum(
    n * np.array(coverages), axis=0
  )
  assert np.max(np.abs(weighted - uniform)) > 1e-3
  clip_only = masked_dp.MaskedAggregation(clip_norm=clip)
  np.testing.assert_allclose(
    _run(_rounds(0.5, clip_only), assignment), weighted, atol=1e-5
  )


def test_noise_scale_seeding_and_count_noise(tff_context):
  del tff_context
  w0 = _flat(_INITIAL.trainable)
  # Learning rate 0: zero updates, so the model moves by the noise alone.
  assignment = [(_FULL, 0), (_FULL, 1), (_FULL, 2), (_FULL, 3)]
  private = masked_dp.MaskedAggregation(clip_norm=1.0, noise_multiplier=0.01)
  rounds = _rounds(0.0, private)
  moved = _run(rounds, assignment, round_num=1) - w0
  # Count noise (std 0.01 per level) is negligible against 4 clients: each
  # element moves by N(0, (z C)^2) / 4, std 0.0025.
  assert np.all(moved != 0)
  assert np.std(moved) == pytest.approx(0.0025, rel=0.3)
  # Drawn from (noise_seed, round): the same round draws the same noise.
  np.testing.assert_array_equal(
    _run(rounds, assignment, round_num=1) - w0, moved
  )
  assert not np.allclose(_run(rounds, assignment, round_num=2) - w0, moved)
  with pytest.raises(ValueError, match="round number"):
    rounds.run(_INITIAL, [], round_num=None)


def test_gaussian_noise_of_sums_and_counts():
  # The pure mechanism on zero sums: value noise N(0, (z C)^2) everywhere;
  # each level's count noise N(0, z^2) spread over its coverage.
  shapes = [(200, 50), (200,)]
  zeros = MaskedSums(
    [tf.zeros(s) for s in shapes], [tf.zeros(s) for s in shapes]
  )
  left = [np.zeros(s, np.float32) for s in shapes]
  left[0][:100] = 1
  left[1][:100] = 1
  everything = [np.ones(s, np.float32) for s in shapes]
  aggregation = masked_dp.MaskedAggregation(clip_norm=2.0, noise_multiplier=1.5)
  noised = masked_dp.add_gaussian_noise(
    zeros, [left, everything], aggregation, tf.constant([3, 1], tf.int64)
  )
  values = np.concatenate([np.ravel(v) for v in noised.weighted_sum])
  assert np.std(values) == pytest.approx(3.0, rel=0.05)
  weights = np.concatenate([np.ravel(w) for w in noised.weight_sum])
  cover = np.concatenate([np.ravel(c) for c in left])
  # Two draws, one per level: the elements of both levels share a value,
  # the others another.
  assert len(set(weights[cover == 1])) == 1
  assert len(set(weights[cover == 0])) == 1
  assert weights[cover == 1][0] != weights[cover == 0][0]
  # Count noise std z: 600 levels, each covering one element of its own.
  one_hots = []
  for i in range(600):
    c = np.zeros(600, np.float32)
    c[i] = 1
    one_hots.append([c])
  counts = masked_dp.add_gaussian_noise(
    MaskedSums([tf.zeros(600)], [tf.zeros(600)]),
    one_hots,
    aggregation,
    tf.constant([4, 2], tf.int64),
  ).weight_sum[0]
  assert np.std(counts) == pytest.approx(1.5, rel=0.1)


def test_settings_are_checked():
  with pytest.raises(ValueError, match="needs clip_norm"):
    masked_dp.MaskedAggregation(noise_multiplier=1.0)
  with pytest.raises(ValueError, match="clip_norm must be finite and > 0"):
    masked_dp.MaskedAggregation(clip_norm=0.0)


def test_aggregator_setting_reaches_the_width_algorithms(tmp_path):
  from tff_hetero.aggregators import model_aggregators  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import all_large  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import make_config  # pylint: disable=g-import-not-at-top

  expected = {
    ("mean", None, None): masked_dp.MaskedAggregation(),
    ("clip", 2.0, None): masked_dp.MaskedAggregation(clip_norm=2.0),
    ("dp", 2.0, 0.5): masked_dp.MaskedAggregation(2.0, 0.5),
  }
  for (kind, clip, noise), aggregation in expected.items():
    config = make_config(
      aggregator=kind, clip_norm=clip, noise_multiplier=noise, seed=7
    )
    options = model_aggregators.width_round_options(config)
    # The run's --seed is not the noise seed: unset, it is drawn in secret.
    assert options == dict(aggregation=aggregation, noise_seed=None)
  built = all_large.build_all_large(config, _TASK)
  assert built.rounds.aggregation == masked_dp.MaskedAggregation(2.0, 0.5)
  given = make_config(
    aggregator="dp", clip_norm=2.0, noise_multiplier=0.5, dp_noise_seed=11
  )
  assert model_aggregators.width_round_options(given)["noise_seed"] == 11


def test_noise_seed_is_a_secret_kept_in_the_state(tmp_path):
  from tff_hetero.algorithms import all_large  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import make_config  # pylint: disable=g-import-not-at-top

  dp = dict(aggregator="dp", clip_norm=2.0, noise_multiplier=0.5, seed=7)
  config = make_config(**dp)
  algorithm = all_large.build_all_large(config, _TASK)
  first, second = algorithm.initialize(), algorithm.initialize()
  # 60 random bits per run: two runs of one config draw different noise.
  assert first.noise_seed != second.noise_seed
  assert 0 <= first.noise_seed < 2**60
  # Neither is in what the run reports (its settings).
  assert str(int(first.noise_seed)) not in str(config.to_json_dict())
  # The checkpoint keeps it: a resumed run draws the same noise.
  restored = checkpoint_round_trip(tmp_path, first, second).server_state
  assert int(restored.noise_seed) == int(first.noise_seed)
  # Given, it is the state's seed; without DP the seed is 0 and unused.
  given = all_large.build_all_large(make_config(**dp, dp_noise_seed=11), _TASK)
  assert given.initialize().noise_seed == 11
  plain = all_large.build_all_large(make_config(seed=7), _TASK)
  assert plain.initialize().noise_seed == 0
