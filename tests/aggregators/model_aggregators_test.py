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


def _delta(build, kind, lr, datasets, **settings):
  aggregator, weighting = model_aggregators.build_model_aggregator(
    kind, clients_per_round=len(datasets), **settings
  )
  process = build(
    _model,
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(lr),
    model_aggregator=aggregator,
    client_weighting=weighting,
  )
  state = process.initialize()
  before = _flat(process.get_model_weights(state))
  after = _flat(process.get_model_weights(process.next(state, datasets).state))
  return after - before


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
  del tff_context
  if build is fedprox.build_fedprox_process:
    build = _with_prox_mu(build)
  one_client = [_data(0)]
  unclipped = _delta(build, "mean", 0.5, one_client)
  norm = float(np.linalg.norm(unclipped))
  assert norm > 0.2  # Large enough that C = 0.1 clips it.
  clipped = _delta(build, "clip", 0.5, one_client, clip_norm=0.1)
  np.testing.assert_allclose(clipped, unclipped * (0.1 / norm), atol=1e-6)
  # DP without noise is the same clipping (one client, cohort 1).
  dp = _delta(build, "dp", 0.5, one_client, clip_norm=0.1, noise_multiplier=0.0)
  np.testing.assert_allclose(dp, clipped, atol=1e-6)
  # A bound above the norm leaves the update alone.
  loose = _delta(build, "clip", 0.5, one_client, clip_norm=2 * norm)
  np.testing.assert_allclose(loose, unclipped, atol=1e-6)


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
