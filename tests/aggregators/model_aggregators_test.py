"""`--aggregator` choices: clipping and DP noise act on a real round.

Oracles: TFF's own mean aggregation of the same round (an unclipped client
update `u`, whose clipped form is `u * min(1, C / ||u||)` by hand), and the
Gaussian mechanism's standard deviation `z * C / clients_per_round` by hand.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.aggregators import model_aggregators
from tff_hetero.algorithms import fedavg
from tff_hetero.algorithms import fedprox
from tff_hetero.errors import UsageError

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 6], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


def _model():
  init = tf.keras.initializers.GlorotUniform(seed=3)
  return tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer(input_shape=(6,)),
      tf.keras.layers.Dense(40, kernel_initializer=init),
      tf.keras.layers.Dense(4, kernel_initializer=init),
    ]
  )


_NUM_PARAMS = 6 * 40 + 40 + 40 * 4 + 4  # 444


def _data(seed):
  rng = np.random.default_rng(seed)
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=rng.normal(size=(12, 6)).astype(np.float32),
      y=rng.integers(0, 4, size=12).astype(np.int32),
    )
  ).batch(4)


def _flat(weights):
  return np.concatenate([np.ravel(w) for w in weights.trainable])


def _process(build, kind, lr, clients_per_round, **settings):
  aggregator, weighting = model_aggregators.build_model_aggregator(
    kind, clients_per_round=clients_per_round, **settings
  )
  return build(
    _model,
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(lr),
    model_aggregator=aggregator,
    client_weighting=weighting,
  )


def _round_delta(process, datasets):
  """The change of the model in one round from the initial state."""
  state = process.initialize()
  before = _flat(process.get_model_weights(state))
  after = _flat(process.get_model_weights(process.next(state, datasets).state))
  return after - before


def _delta(build, kind, lr, datasets, **settings):
  process = _process(build, kind, lr, len(datasets), **settings)
  return _round_delta(process, datasets)


def test_settings_errors_name_the_flag():
  cases = [
    (("median", None, None), "--aggregator: unknown value 'median'"),
    (("clip", None, None), "--clip_norm: --aggregator=clip needs it"),
    (("dp", 1.0, None), "--noise_multiplier: --aggregator=dp needs it"),
    (("clip", 0.0, None), "--clip_norm: must be finite and > 0"),
    (("dp", 1.0, -0.5), "--noise_multiplier: must be finite and >= 0"),
    (
      ("mean", 1.0, None),
      "--clip_norm: is read only by --aggregator=clip or dp",
    ),
    (("clip", 1.0, 1.0), "--noise_multiplier: is read only by --aggregator=dp"),
  ]
  for args, message in cases:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
      model_aggregators.check_settings(*args)


def test_unweighted_factory_needs_uniform_weighting():
  with pytest.raises(TypeError, match="needs client_weighting"):
    fedavg.build_fedavg_process(
      _model,
      input_spec=_SPEC,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      model_aggregator=tff.aggregators.UnweightedMeanFactory(),
    )


@pytest.mark.parametrize(
  "build",
  [
    fedavg.build_fedavg_process,
    pytest.param(fedprox.build_fedprox_process, marks=pytest.mark.slow),
  ],
)
def test_clipping_scales_a_large_update_to_the_norm(tff_context, build):
  # FedProx composes the aggregator itself (FedAvg hands it to TFF's
  # builder): its rounds clip too. DP's clipping is the same factory's, so
  # one builder checks it.
  del tff_context
  is_fedavg = build is fedavg.build_fedavg_process
  if not is_fedavg:
    build = _with_prox_mu(build)
  # One client, cohort 1: 3 SGD steps (large) or 1 (small).
  large, small = [_data(0)], [_data(0).take(1)]
  mean = _process(build, "mean", 0.5, 1)
  unclipped, alone = _round_delta(mean, large), _round_delta(mean, small)
  norm, small_norm = np.linalg.norm(unclipped), np.linalg.norm(alone)
  assert norm > 1.5 * small_norm > 0  # A bound between them clips one.
  bound = float(norm + small_norm) / 2
  clip = _process(build, "clip", 0.5, 1, clip_norm=bound)
  clipped = _round_delta(clip, large)
  np.testing.assert_allclose(clipped, unclipped * (bound / norm), atol=1e-6)
  # A bound above the norm leaves the update alone.
  np.testing.assert_allclose(_round_delta(clip, small), alone, atol=1e-6)
  if is_fedavg:
    # DP without noise is the same clipping.
    dp = _process(build, "dp", 0.5, 1, clip_norm=bound, noise_multiplier=0.0)
    np.testing.assert_allclose(_round_delta(dp, large), clipped, atol=1e-6)


def _with_prox_mu(build):
  return lambda *a, **k: build(*a, prox_mu=0.0, **k)


def test_dp_noise_has_the_gaussian_mechanisms_scale(tff_context):
  del tff_context
  # Clients with learning rate 0 send zero updates: the round moves the
  # model by the noise alone, std z * C / clients_per_round per weight.
  two_clients = [_data(1), _data(2)]
  quiet = _delta(
    fedavg.build_fedavg_process,
    "dp",
    0.0,
    two_clients,
    clip_norm=1.0,
    noise_multiplier=0.0,
  )
  np.testing.assert_array_equal(quiet, np.zeros(_NUM_PARAMS))
  noisy = _delta(
    fedavg.build_fedavg_process,
    "dp",
    0.0,
    two_clients,
    clip_norm=1.0,
    noise_multiplier=1.0,
  )
  assert noisy.shape == (_NUM_PARAMS,)
  # 444 unseeded draws (TFF's DP query draws its own noise): the sample
  # std's relative standard error is 1 / sqrt(2 x 444) = 3.4 %, so 20 % is
  # 5.9 standard errors (failure probability ~1e-8; a 10 % bound, 2.9
  # standard errors, failed once in a run of the unit tier). A wrong scale
  # (no division by the 2 clients: 1.0; by sqrt(2): 0.71) is far outside.
  assert np.std(noisy) == pytest.approx(0.5, rel=0.2)
  assert abs(np.mean(noisy)) < 4 * 0.5 / np.sqrt(_NUM_PARAMS)
