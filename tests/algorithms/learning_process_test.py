"""FedAvg/FedProx/FedAdam through our measured parts: signatures, then known answers.

The measuring distributor and aggregators must not change what TFF computes:
one round of our FedAvg equals TFF's unmodified `build_weighted_fed_avg` on the
same data and initial weights, and the traffic it reports is the dense size of
what each client received and sent, computed here by hand.
"""

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms import api
from tff_hetero.algorithms import fedadam
from tff_hetero.algorithms import fedavg
from tff_hetero.algorithms import fedprox
from tff_hetero.algorithms import registry
from tff_hetero.program import make_config

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 3], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


def _keras_model():
  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        4,
        input_shape=(3,),
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
      ),
    ]
  )


# Dense 3 -> 4: 12 + 4 = 16 float32 parameters = 64 bytes.
_TASK = api.Task(
  "tiny", _keras_model, (3,), 4, _SPEC, training_flops_per_example=3 * 12
)


def _datasets():
  rng = np.random.default_rng(0)
  out = []
  for n in (5, 3):
    out.append(
      tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(
          x=rng.normal(size=[n, 3]).astype(np.float32),
          y=rng.integers(0, 4, size=[n]).astype(np.int32),
        )
      ).batch(2)
    )
  return out


def _clients():
  return [
    api.ClientRound(client_id=f"c{i}", dataset=d, num_examples=n)
    for i, (d, n) in enumerate(zip(_datasets(), (5, 3)))
  ]


@functools.lru_cache(maxsize=None)
def _fedavg_process():
  """Our measured FedAvg process (client SGD at 0.1), built once for the
  tests that share it (a process is a stateless builder)."""
  return fedavg.build_fedavg_process(
    _TASK.model_fn,
    input_spec=_TASK.element_spec,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
  )


@functools.lru_cache(maxsize=None)
def _algorithm(**settings):
  """`registry.ALGORITHMS[algorithm]` built from `make_config(client_lr=0.1,
  **settings)` (client SGD without momentum, server SGD at 1, the mean by
  examples unless `settings` say otherwise), once per settings."""
  config = make_config(client_lr=0.1, **settings)
  return registry.ALGORITHMS[config.algorithm].builder(config, _TASK)


_DP = dict(
  aggregator="dp", clip_norm=1e6, noise_multiplier=0.0, clients_per_round=2
)


def _assert_one_round_equal(process, reference):
  """One round of each from its initial state on `_datasets()`: the same
  trainable weights (to float32 rounding)."""
  state = process.next(process.initialize(), _datasets()).state
  ref_state = reference.next(reference.initialize(), _datasets()).state
  for a, b in zip(
    process.get_model_weights(state).trainable,
    reference.get_model_weights(ref_state).trainable,
  ):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_fedavg_process_signature():
  process = _fedavg_process()
  assert isinstance(process, tff.learning.templates.LearningProcess)
  metrics = process.next.type_signature.result.metrics.member
  assert str(metrics.distributor) == "<bytes_down=int64,clients=int64>"
  assert "bytes_up=int64" in str(metrics.aggregator)
  assert "uploaded_bytes=int64" in str(metrics.client_work)


def test_measured_fedavg_equals_tff_fedavg(tff_context):
  del tff_context
  ours = _fedavg_process()
  reference = tff.learning.algorithms.build_weighted_fed_avg(
    _TASK.tff_model_fn(plain_graph_methods=False),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
  )
  _assert_one_round_equal(ours, reference)


def test_round_reports_measured_traffic_per_client(tff_context):
  del tff_context
  algorithm = _algorithm()
  output = algorithm.next(algorithm.initialize(), 1, _clients())
  assert [t.client_id for t in output.traffic] == ["c0", "c1"]
  for traffic, examples in zip(output.traffic, (5, 3)):
    assert traffic.bytes_down == 64  # The 16 float32 weights.
    # Delta (64) + weight (4) + unfinalized metrics: loss sum and count, and
    # accuracy total and count (4 x float32), num_examples and num_batches
    # (2 x int64): 16 + 16 = 32.
    assert traffic.bytes_up == 64 + 4 + 32
    assert traffic.examples == examples
    assert traffic.flops == examples * 36
  assert np.isfinite(output.metrics["loss"])


def test_fedadam_state_holds_adam_moments_and_moves_weights(tff_context):
  del tff_context
  process = fedadam.build_fedadam_process(
    _TASK.model_fn,
    input_spec=_TASK.element_spec,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_learning_rate=0.01,
    epsilon=1e-8,
  )
  state = process.initialize()
  before = process.get_model_weights(state).trainable
  state = process.next(state, _datasets()).state
  after = process.get_model_weights(state).trainable
  # Adam's first step is lr * |u| / (|u| + eps / sqrt(1 - beta_2)): with a
  # tiny eps, about the learning rate for every coordinate that moved.
  steps = np.concatenate([np.abs(a - b).ravel() for a, b in zip(after, before)])
  assert np.max(steps) == pytest.approx(0.01, rel=0.05)


def _bn_keras_model():
  inputs = tf.keras.Input((3,))
  x = tf.keras.layers.Dense(
    2,
    use_bias=False,
    name="fc",
    kernel_initializer=tf.keras.initializers.Constant(
      [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    ),
  )(inputs)
  x = tf.keras.layers.BatchNormalization(name="bn")(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(4, name="logits")(x))


def test_fedavg_evaluates_batch_norm_with_the_clients_statistics(tff_context):
  del tff_context
  task = api.Task(
    "tiny_bn", _bn_keras_model, (3,), 4, _SPEC, training_flops_per_example=1
  )
  algorithm = fedavg.build_fedavg(
    make_config(client_lr=0.0, client_momentum=0.0, server_lr=1.0), task
  )
  state = algorithm.initialize()
  # TFF's FedAvg leaves the moving statistics at their initial values.
  raw = algorithm.model_weights(state)
  model = _bn_keras_model()
  positions = {id(v): i for i, v in enumerate(model.non_trainable_weights)}
  mean_at = positions[id(model.get_layer("bn").moving_mean)]
  np.testing.assert_array_equal(raw.non_trainable[mean_at], [0, 0])
  # Client A: one batch, x[:, :2] = (1, 2), (3, 4); client B: (5, 6). The
  # fc layer passes the first two features through (lr 0: unchanged).
  data = api.ClientDatasets(
    [
      tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(
          x=np.asarray(rows, np.float32), y=np.zeros([len(rows)], np.int32)
        )
      ).batch(2)
      for rows in ([[1, 2, 9], [3, 4, 9]], [[5, 6, 9]])
    ]
  )
  (evaluated,) = algorithm.evaluation_models(state, data).values()
  np.testing.assert_allclose(
    evaluated.weights.non_trainable[mean_at], [3, 4], atol=1e-6
  )
  for a, b in zip(evaluated.weights.trainable, raw.trainable):
    np.testing.assert_array_equal(a, b)
  # Without client data (or without BN) the weights are the process's.
  (plain,) = algorithm.evaluation_models(state).values()
  np.testing.assert_array_equal(plain.weights.non_trainable[mean_at], [0, 0])


@pytest.mark.slow
def test_dp_setting_is_tffs_uniform_mean_without_noise(tff_context):
  del tff_context
  # --aggregator=dp with a bound no update reaches and no noise: the sum of
  # the updates over --clients_per_round (2), i.e. TFF's unweighted FedAvg.
  algorithm = _algorithm(**_DP)
  output = algorithm.next(algorithm.initialize(), 1, _clients())
  reference = tff.learning.algorithms.build_unweighted_fed_avg(
    _TASK.tff_model_fn(),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
  )
  ref_state = reference.next(reference.initialize(), _datasets()).state
  for a, b in zip(
    algorithm.model_weights(output.state).trainable,
    reference.get_model_weights(ref_state).trainable,
  ):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
  # The example-weighted mean (clients of 5 and 3 examples) differs.
  weighted = _algorithm()
  weighted_state = weighted.next(weighted.initialize(), 1, _clients()).state
  assert any(
    np.max(np.abs(np.asarray(a) - np.asarray(b))) > 1e-4
    for a, b in zip(
      weighted.model_weights(weighted_state).trainable,
      reference.get_model_weights(ref_state).trainable,
    )
  )


@pytest.mark.slow
def test_fedprox_uniform_weighting_is_tffs_unweighted_fedavg(tff_context):
  del tff_context
  # prox_mu = 0 and every client weighted 1 (clients of 5 and 3 examples):
  # TFF's unweighted FedAvg.
  prox = fedprox.build_fedprox_process(
    _TASK.model_fn,
    input_spec=_TASK.element_spec,
    prox_mu=0.0,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    client_weighting=tff.learning.ClientWeighting.UNIFORM,
  )
  reference = tff.learning.algorithms.build_unweighted_fed_avg(
    _TASK.tff_model_fn(),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
  )
  _assert_one_round_equal(prox, reference)


def test_model_weights_read_from_the_state_equal_tffs_get_model_weights(
  tff_context,
):
  del tff_context
  algorithm = _algorithm()
  state = algorithm.next(algorithm.initialize(), 1, _clients()).state
  read = algorithm.model_weights(state)
  assert isinstance(read, tff.learning.models.ModelWeights)
  # TFF's own computation over the same state: the same weights, exactly.
  called = algorithm.process.get_model_weights(state)
  for a, b in zip(tf.nest.flatten(read), tf.nest.flatten(called)):
    np.testing.assert_array_equal(a, b)


def _nan_client(cid="b", n=10):
  """A client whose features are NaN: its update cannot be finite."""
  dataset = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=np.full([n, 3], np.nan, np.float32), y=np.zeros([n], np.int32)
    )
  ).batch(2)
  return api.ClientRound(client_id=cid, dataset=dataset, num_examples=n)


def _empty_client(cid="e"):
  dataset = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=np.zeros([0, 3], np.float32), y=np.zeros([0], np.int32)
    )
  ).batch(2)
  return api.ClientRound(client_id=cid, dataset=dataset, num_examples=0)


@pytest.mark.parametrize(
  "name, aggregator",
  [
    ("fedavg", "mean"),
    # Uniform weights: an empty client weighs 1. (The sum over
    # --clients_per_round = 2 whatever the cohort.)
    ("fedavg", "dp"),
    ("fedprox", "mean"),
    ("fednova", "mean"),
    ("scaffold", "mean"),
  ],
)
def test_a_non_finite_update_is_zeroed_counted_and_left_out(
  name, aggregator, tff_context
):
  del tff_context
  algorithm = _algorithm(
    **(dict(_DP) if aggregator == "dp" else {}),
    **({} if name == "fedavg" else dict(algorithm=name)),
  )
  state = algorithm.initialize()
  a = _clients()[0]
  with_b = algorithm.next(state, 1, [a, _nan_client(), _empty_client()])
  without_b = algorithm.next(state, 1, [a, _empty_client()])
  # Not "2": the empty client's weight 0 (by examples) is no failure.
  assert with_b.metrics["non_finite_updates"] == 1.0
  assert without_b.metrics["non_finite_updates"] == 0.0
  assert np.isfinite(with_b.metrics["loss"])
  assert with_b.metrics["loss"] == pytest.approx(
    without_b.metrics["loss"], rel=1e-6
  )
  for x, y in zip(
    algorithm.model_weights(with_b.state).trainable,
    algorithm.model_weights(without_b.state).trainable,
  ):
    np.testing.assert_allclose(x, y, rtol=0, atol=1e-7)
  # b still counts as a client that took part (it downloaded, trained).
  assert [t.client_id for t in with_b.traffic] == ["c0", "b", "e"]
