"""`build_adaptivefl_process` (the public AdaptiveFL process): its typed
parts, then a round against an oracle: the member each client was sent and
trained is read from its measured bytes (pool sizes by hand), every device
trained a member within its capacity, and the new server model equals each
client trained alone by TFF's own FedAvg on its hand-sliced member, then the
element-wise example-weighted mean of whoever returned each element."""

import collections

from conftest import tff_fedavg_round
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_hetero

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32)
)
_LR = 0.1
# Width units (8, 6); pool with I = 1: unit 1 whole, unit 2 scaled by
# 0.66 / 0.4 rounded down: L1 (8, 6), M1 (8, 3), S1 (8, 2).
_HIDDEN2 = {"L1": 6, "M1": 3, "S1": 2}
# Trainable parameters by hand: 4x8 + 8 + 8xk + k + kx3 + 3.
_PARAMS = {
  name: 4 * 8 + 8 + 8 * k + k + k * 3 + 3 for name, k in _HIDDEN2.items()
}
_METRIC_BYTES = 32  # loss, accuracy (float32 pairs), examples, batches (int64).


def _mlp(widths):
  init = tf.keras.initializers
  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        widths[0],
        activation="relu",
        input_shape=(4,),
        kernel_initializer=init.GlorotUniform(seed=1),
        bias_initializer=init.RandomNormal(seed=2),
      ),
      tf.keras.layers.Dense(
        widths[1],
        activation="relu",
        kernel_initializer=init.GlorotUniform(seed=3),
        bias_initializer=init.RandomNormal(seed=4),
      ),
      tf.keras.layers.Dense(3, kernel_initializer=init.GlorotUniform(seed=5)),
    ]
  )


def _slice(full, k):
  """The member with k units in layer 2 (by hand)."""
  k1, b1, k2, b2, k3, b3 = full
  return [k1, b1, k2[:, :k], b2[:k], k3[:k, :], b3]


def _coverage(k):
  masks = [np.zeros(w.shape, np.float32) for w in _mlp((8, 6)).weights]
  for part in _slice(masks, k):
    part[...] = 1.0
  return masks


def _scatter(values, k):
  full = [np.zeros(w.shape, np.float32) for w in _mlp((8, 6)).weights]
  for target, value in zip(_slice(full, k), values):
    target[...] = value
  return full


def _dataset(seed, n):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=[n, 4]).astype(np.float32)
  y = rng.integers(0, 3, size=[n]).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(x=x, y=y)
  ).batch(3)


# Client -> (examples, capacity in trainable parameters): one device holds
# only S1, one at most M1, one everything.
_CLIENTS = collections.OrderedDict(
  a=(7, _PARAMS["S1"]), b=(5, _PARAMS["M1"]), c=(6, None), d=(4, None)
)


def _process(**kwargs):
  arguments = dict(
    full_widths=(8, 6),
    start_indices=(1,),
    client_ids=list(_CLIENTS),
    clients_per_round=3,
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
    selection_seed=3,
  )
  arguments.update(kwargs)
  return tff_hetero.build_adaptivefl_process(_mlp, **arguments)


@pytest.fixture(scope="module")
def process():
  """`_process()`, built (traced) once for the tests that read or run it:
  its state is explicit."""
  return _process()


def test_type_signatures(process):
  steps = process.computations
  assert list(steps) == [
    "decide",
    "group_round/S1->S1",
    "delivery/S1",
    "group_round/M1->S1",
    "group_round/M1->M1",
    "delivery/M1",
    "group_round/L1->S1",
    "group_round/L1->M1",
    "group_round/L1->L1",
    "delivery/L1",
    "apply_sums",
  ]
  sent, budget, position = steps["decide"].type_signature.parameter
  assert sent.member.dtype == np.int32 and sent.placement is tff.CLIENTS
  assert budget.member.dtype == np.float64
  assert steps["decide"].type_signature.result.placement is tff.CLIENTS
  received, data = steps["group_round/L1->M1"].type_signature.parameter
  assert [t.shape for t in received.member] == [
    (4, 8),
    (8,),
    (8, 6),
    (6,),
    (6, 3),
    (3,),
  ]
  sums, _ = steps["group_round/L1->M1"].type_signature.result
  assert [t.shape for t in sums.member[0]] == [
    (4, 8),
    (8,),
    (8, 3),
    (3,),
    (3, 3),
    (3,),
  ]


def test_round_equals_tff_fedavg_per_client_within_capacities(
  tff_context, process
):
  del tff_context
  state = process.initialize()
  datasets = {
    c: _dataset(i, n) for i, (c, (n, _)) in enumerate(_CLIENTS.items())
  }
  available = {
    c: tff_hetero.AvailableClient(datasets[c], capacity)
    for c, (_, capacity) in _CLIENTS.items()
  }
  output = process.next(state, available)
  assert output.state.round_num == 1
  assert len(output.clients) == 3

  by_bytes = {4 * p: name for name, p in _PARAMS.items()}
  start = [np.asarray(w) for w in state.server.model.trainable]
  weighted = [np.zeros_like(w) for w in start]
  counts = [np.zeros_like(w) for w in start]
  pruned = 0
  for traffic in output.clients:
    sent = by_bytes[traffic.bytes_down]
    trained = by_bytes[traffic.bytes_up - 4 - _METRIC_BYTES]
    examples, capacity = _CLIENTS[traffic.client_id]
    assert traffic.examples == examples
    # The largest member within the device's capacity and the one it got.
    fitting = [
      m
      for m in ("S1", "M1", "L1")
      if (capacity is None or _PARAMS[m] <= capacity)
      and _HIDDEN2[m] <= _HIDDEN2[sent]
    ]
    assert trained == fitting[-1]
    pruned += trained != sent
    k = _HIDDEN2[trained]
    values = tff_fedavg_round(
      lambda k=k: _mlp((8, k)),
      _SPEC,
      _LR,
      _slice(start, k),
      [datasets[traffic.client_id]],
    )
    for i, (value, mask) in enumerate(zip(_scatter(values, k), _coverage(k))):
      weighted[i] += examples * value
      counts[i] += examples * mask
  expected = [
    np.where(c > 0, w / np.maximum(c, 1e-12), s)
    for w, c, s in zip(weighted, counts, start)
  ]
  for actual, wanted in zip(output.state.server.model.trainable, expected):
    np.testing.assert_allclose(actual, wanted, rtol=0, atol=1e-5)
  assert output.metrics["pruned"] == pruned
  assert output.metrics["bytes_down"] == sum(
    t.bytes_down for t in output.clients
  )
  # The tables moved (Algorithm 1: every chosen client's T_c entries).
  assert (
    output.state.server.tables.curiosity.sum()
    > state.server.tables.curiosity.sum()
  )
  # The same seed and round choose the same clients.
  again = process.next(state, available)
  assert [t.client_id for t in again.clients] == [
    t.client_id for t in output.clients
  ]


def test_unknown_client_and_bad_arguments_are_refused(tff_context, process):
  del tff_context
  with pytest.raises(KeyError, match="'z'"):
    process.next(
      process.initialize(),
      {"z": tff_hetero.AvailableClient(_dataset(0, 3))},
    )
  with pytest.raises(TypeError, match="tff_hetero.AvailableClient"):
    process.next(process.initialize(), {"a": _dataset(0, 3)})
  with pytest.raises(ValueError, match="at least one available client"):
    process.next(process.initialize(), {})
  with pytest.raises(ValueError, match="selection must be one of"):
    _process(selection="best")
  with pytest.raises(ValueError, match="client_ids must be distinct"):
    _process(client_ids=["a", "a"])
