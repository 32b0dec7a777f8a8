"""FedNova: signatures, two rounds against a NumPy computation by hand, and
TFF's own FedAvg when every client runs the same number of steps.

The hand computation is the paper's (Wang et al. 2020, Eq. 7 and its
Appendix on momentum): each client runs heavy-ball SGD over its batches
(softmax cross-entropy gradients of a dense layer, written out below),
a_i = sum_k c_k with c_k = rho c_{k-1} + 1, and the server moves
x <- x - tau_eff * sum_i p_i (x - y_i) / a_i with tau_eff = sum_i p_i a_i.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms import fednova

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 3], tf.float32), y=tf.TensorSpec([None], tf.int32)
)
_LR, _RHO = 0.1, 0.5


def _keras_model():  # Dense 3 -> 4 logits, bias initialised to zero.
  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        4,
        input_shape=(3,),
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
      )
    ]
  )


def _client_arrays(sizes, seed=0):
  rng = np.random.default_rng(seed)
  return [
    (
      rng.normal(size=[n, 3]).astype(np.float32),
      rng.integers(0, 4, size=[n]).astype(np.int32),
    )
    for n in sizes
  ]


def _datasets(arrays, batch_size=2):
  return [
    tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(
      batch_size
    )
    for x, y in arrays
  ]


def _process(momentum=_RHO, **kwargs):
  return fednova.build_fednova_process(
    _keras_model,
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(
      _LR, momentum=momentum
    ),
    **kwargs,
  )


def _gradients(kernel, bias, x, y):
  """Mean softmax cross-entropy gradients of logits x @ kernel + bias."""
  logits = x.astype(np.float64) @ kernel + bias
  p = np.exp(logits - logits.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return x.T @ p / len(y), p.mean(axis=0)


def _by_hand_round(kernel, bias, arrays, rho, batch_size=2):
  """One FedNova round by hand: (new kernel, new bias)."""
  normalized, norms, sizes = [], [], []
  for x, y in arrays:
    w, b = kernel.copy(), bias.copy()
    buf_w, buf_b = np.zeros_like(w), np.zeros_like(b)
    counter = norm = 0.0
    for start in range(0, len(y), batch_size):
      g_w, g_b = _gradients(
        w, b, x[start : start + batch_size], y[start : start + batch_size]
      )
      buf_w, buf_b = rho * buf_w + g_w, rho * buf_b + g_b
      w, b = w - _LR * buf_w, b - _LR * buf_b
      counter = rho * counter + 1.0
      norm += counter
    normalized.append(((kernel - w) / norm, (bias - b) / norm))
    norms.append(norm)
    sizes.append(len(y))
  p = np.asarray(sizes, np.float64) / sum(sizes)
  tau_eff = float(np.dot(p, norms))
  mean_w = sum(pi * d[0] for pi, d in zip(p, normalized))
  mean_b = sum(pi * d[1] for pi, d in zip(p, normalized))
  return kernel - tau_eff * mean_w, bias - tau_eff * mean_b


@pytest.fixture(scope="module")
def process():
  return _process()


def test_type_signatures(process):
  assert isinstance(process, tff.learning.templates.LearningProcess)
  assert str(process.next.type_signature.parameter.client_data) == (
    "{<x=float32[?,3],y=int32[?]>*}@CLIENTS"
  )
  metrics = process.next.type_signature.result.metrics.member
  assert str(metrics.distributor) == "<bytes_down=int64,clients=int64>"
  assert "bytes_up=int64" in str(metrics.aggregator)
  work = fednova.build_fednova_client_work(
    _keras_model_tff(), tff.learning.optimizers.build_sgdm(_LR, momentum=_RHO)
  )
  assert str(work.next.type_signature.result.result) == (
    "{<update=<normalized=<float32[3,4],float32[4]>,steps_norm=float32>,"
    "update_weight=float32>}@CLIENTS"
  )
  assert str(work.initialize.type_signature) == (
    "( -> <learning_rate=float32,momentum=float32>@SERVER)"
  )


def _keras_model_tff():
  def model_fn():
    return tff.learning.models.from_keras_model(
      _keras_model(),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=_SPEC,
    )

  return model_fn


def test_refuses_an_optimizer_it_cannot_normalise():
  with pytest.raises(TypeError, match=r"^FedNova .*build_sgdm.*beta_1"):
    fednova.build_fednova_process(
      _keras_model,
      input_spec=_SPEC,
      client_optimizer_fn=tff.learning.optimizers.build_adam(0.01),
    )


def test_two_rounds_match_the_hand_computation(process, tff_context):
  del tff_context
  # Clients of 5, 3 and 1 examples in batches of 2: 3, 2 and 1 steps.
  arrays = _client_arrays([5, 3, 1])
  state = process.initialize()
  weights = process.get_model_weights(state)
  kernel, bias = (np.asarray(t, np.float64) for t in weights.trainable)
  bytes_up = []
  for _ in range(2):
    output = process.next(state, _datasets(arrays))
    state = output.state
    kernel, bias = _by_hand_round(kernel, bias, arrays, _RHO)
    bytes_up.append(int(output.metrics["aggregator"]["bytes_up"]))
  got = process.get_model_weights(state).trainable
  np.testing.assert_allclose(got[0], kernel, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[1], bias, rtol=1e-5, atol=1e-6)
  # Each client uploads d_i (12 + 4 float32), a_i and its weight.
  assert bytes_up == [3 * (16 + 1 + 1) * 4] * 2


def test_equal_steps_without_momentum_is_tffs_fedavg(tff_context):
  del tff_context
  # Every client runs two steps: FedNova is FedAvg (module docstring).
  arrays = _client_arrays([4, 3], seed=1)
  nova = _process(momentum=None)
  avg = tff.learning.algorithms.build_weighted_fed_avg(
    _keras_model_tff(),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  )
  nova_state, avg_state = nova.initialize(), avg.initialize()
  for _ in range(2):
    nova_state = nova.next(nova_state, _datasets(arrays)).state
    avg_state = avg.next(avg_state, _datasets(arrays)).state
  for a, b in zip(
    nova.get_model_weights(nova_state).trainable,
    avg.get_model_weights(avg_state).trainable,
  ):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
