"""SCAFFOLD: the round's type signature, and two rounds against a NumPy
computation of the paper's Algorithm 1 (option II) by hand.

By hand: each client runs y <- y - eta_l (g(y) - c_i + c) over its batches
(softmax cross-entropy gradients of a dense layer, written out below), sets
c_i+ = c_i - c + (x - y) / (K eta_l); the server moves x by eta_g times the
example-weighted mean of y - x and c by the sum of c_i+ - c_i over N.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms import scaffold

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 3], tf.float32), y=tf.TensorSpec([None], tf.int32)
)
_LR, _SERVER_LR, _N = 0.1, 0.5, 4


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


def _arrays(n, seed):
  rng = np.random.default_rng(seed)
  return (
    rng.normal(size=[n, 3]).astype(np.float32),
    rng.integers(0, 4, size=[n]).astype(np.int32),
  )


def _dataset(arrays, batch_size=2):
  x, y = arrays
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(x=x, y=y)
  ).batch(batch_size)


def _gradients(params, x, y):
  """Mean softmax cross-entropy gradients of logits x @ kernel + bias."""
  kernel, bias = params
  logits = x.astype(np.float64) @ kernel + bias
  p = np.exp(logits - logits.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return [x.T @ p / len(y), p.mean(axis=0)]


def _by_hand_round(x, c, controls, cohort, batch_size=2):
  """One SCAFFOLD round: (new x, new c, the cohort's new c_i)."""
  deltas, sizes, new_controls = [], [], []
  control_sum = [np.zeros_like(t) for t in c]
  for client_id, (features, labels) in cohort:
    c_i = controls[client_id]
    y = [t.copy() for t in x]
    steps = 0
    for start in range(0, len(labels), batch_size):
      g = _gradients(
        y,
        features[start : start + batch_size],
        labels[start : start + batch_size],
      )
      y = [w - _LR * (gw - ci + cw) for w, gw, ci, cw in zip(y, g, c_i, c)]
      steps += 1
    new_c_i = [
      ci - cw + (xw - yw) / (steps * _LR)
      for ci, cw, xw, yw in zip(c_i, c, x, y)
    ]
    control_sum = [s + n - o for s, n, o in zip(control_sum, new_c_i, c_i)]
    deltas.append([yw - xw for yw, xw in zip(y, x)])
    sizes.append(len(labels))
    new_controls.append(new_c_i)
  p = np.asarray(sizes, np.float64) / sum(sizes)
  mean = [sum(pi * d[k] for pi, d in zip(p, deltas)) for k in range(len(x))]
  new_x = [xw + _SERVER_LR * m for xw, m in zip(x, mean)]
  new_c = [cw + s / _N for cw, s in zip(c, control_sum)]
  return new_x, new_c, new_controls


@pytest.fixture(scope="module")
def process():
  return scaffold.build_scaffold_process(
    _keras_model,
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(_SERVER_LR),
    total_clients=_N,
  )


def test_round_type_signature(process):
  signature = process.round.type_signature
  parameter = signature.parameter
  assert [p.placement for p in parameter] == [tff.SERVER] * 3 + [
    tff.CLIENTS
  ] * 3
  # c@SERVER and each c_i@CLIENTS have the trainable weights' type.
  assert str(parameter[2].member) == "<float32[3,4],float32[4]>"
  assert str(parameter[3].member) == "<float32[3,4],float32[4]>"
  assert str(signature.result[3]) == (
    "<rows=<float32[?,3,4],float32[?,4]>,positions=int32[?]>@SERVER"
  )
  assert str(process.server_update.type_signature.result[2]) == (
    "<float32[3,4],float32[4]>"
  )


def test_refuses_momentum_and_a_bad_client_count():
  with pytest.raises(TypeError, match=r"^SCAFFOLD .*build_sgdm\(learning_rate"):
    scaffold.build_scaffold_process(
      _keras_model,
      input_spec=_SPEC,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1, momentum=0.9),
      total_clients=4,
    )
  with pytest.raises(ValueError, match="total_clients must be a positive"):
    scaffold.build_scaffold_process(
      _keras_model,
      input_spec=_SPEC,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      total_clients=0,
    )


def test_two_rounds_match_the_hand_computation(process, tff_context):
  del tff_context
  data = {"a": _arrays(5, 0), "b": _arrays(3, 1), "c": _arrays(1, 2)}
  state = process.initialize()
  x = [np.asarray(t, np.float64) for t in state.weights.trainable]
  c = [np.zeros_like(t) for t in x]
  controls = {k: [np.zeros_like(t) for t in x] for k in data}
  stored = {k: process.initial_client_control() for k in data}
  # Round 1: a (3 steps) and b (2 steps); round 2: a again and c (1 step).
  for cohort in (["a", "b"], ["a", "c"]):
    output = process.next(
      state,
      [_dataset(data[k]) for k in cohort],
      [stored[k] for k in cohort],
    )
    state = output.state
    stored.update(zip(cohort, output.client_controls))
    x, c, new = _by_hand_round(x, c, controls, [(k, data[k]) for k in cohort])
    controls.update(zip(cohort, new))
    # Down: the model and c (16 + 16 float32); up: y - x, its weight, and
    # c_i+ - c_i (16 + 1 + 16 float32), per client.
    metrics = output.metrics
    assert int(metrics["distributor"]["bytes_down"]) == 2 * 32 * 4
    up = int(metrics["aggregator"]["bytes_up"])
    up += int(metrics["control_aggregator"]["bytes_up"])
    assert up == 2 * 33 * 4
  for got, want in zip(process.get_model_weights(state).trainable, x):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  for got, want in zip(state.control, c):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  for k in data:
    for got, want in zip(stored[k], controls[k]):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  # The variates moved: the test would catch a round that ignored them.
  assert np.abs(state.control[0]).max() > 1e-3
