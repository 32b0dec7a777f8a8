"""FedSGC and FedDST rounds on TFF: against TFF's FedAvg and FedProx, the
server memory, direction maps and re-prune against hand computations from
the uploads, readjust timing, layer densities, measured bytes, and that
FedSGC learns."""

import collections
import math

import attrs
from conftest import checkpoint_round_trip
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import data as data_lib
from tff_hetero.algorithms import api
from tff_hetero.algorithms import fedprox
from tff_hetero.algorithms.sparse import computations
from tff_hetero.algorithms.sparse import feddst
from tff_hetero.algorithms.sparse import fedsgc
from tff_hetero.algorithms.sparse import prune_grow
from tff_hetero.algorithms.sparse import training
from tff_hetero.program import loop
from tff_hetero.program import make_config
from tff_hetero.program.configs import config_from_values
from tff_hetero.submodels import masks as masks_lib

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 2, 3, 1], tf.float32),
  y=tf.TensorSpec([None], tf.int32),
)


def _mlp():
  inputs = tf.keras.Input((2, 3, 1))
  x = tf.keras.layers.Flatten()(inputs)
  x = tf.keras.layers.Dense(
    8,
    activation="relu",
    name="fc1",
    kernel_initializer=tf.keras.initializers.GlorotUniform(1),
  )(x)
  return tf.keras.Model(
    inputs,
    tf.keras.layers.Dense(
      3,
      name="logits",
      kernel_initializer=tf.keras.initializers.GlorotUniform(2),
    )(x),
  )


_TASK = api.Task(
  "mlp6", _mlp, (2, 3, 1), 3, _SPEC, training_flops_per_example=3 * 72
)
_SIZES = (9, 5, 7)
_IDS = ("c0", "c1", "c2")


def _arrays(client: int, round_num: int) -> data_lib.ArrayDataset:
  rng = np.random.default_rng(round_num * 10 + client)
  n = _SIZES[client]
  return data_lib.ArrayDataset(
    rng.normal(size=[n, 2, 3, 1]).astype(np.float32),
    rng.integers(0, 3, size=[n]).astype(np.int32),
  )


def _config(**changes):
  """Settings of FedSGC (or of `algorithm`, less those it does not read)."""
  settings = dict(
    algorithm="fedsgc",
    sparsity=0.2,
    prune_alpha=0.3,
    congruity_lambda=0.5,
    client_lr=0.1,
    local_epochs=2,
    batch_size=3,
    rounds=4,
    num_clients=3,
    clients_per_round=3,
    seed=3,
    readjust_begin_epoch=1,
    readjust_delta_epochs=1,
  )
  settings.update(changes)
  return config_from_values(settings)


def _clients(algorithm, round_num, ids, states):
  return [
    api.ClientRound(
      client_id=_IDS[i],
      dataset=algorithm.client_dataset(
        _arrays(i, round_num),
        batch_size=3,
        local_epochs=2,
        shuffle_seed=round_num,
      ),
      num_examples=2 * _SIZES[i],
      state=states.get(_IDS[i], algorithm.initial_client_state()),
    )
    for i in ids
  ]


def _run(algorithm, cohorts, states=None):
  """Rounds over `cohorts`; returns [(state before, output)] per round."""
  state = algorithm.initialize()
  states = dict(states or {})
  history = []
  for round_num, ids in enumerate(cohorts, start=1):
    output = algorithm.next(
      state, round_num, _clients(algorithm, round_num, ids, states)
    )
    history.append((state, output))
    state = output.state
    states.update(output.client_states)
  return history


def _union_average(rows, previous, memory):
  """Eq. 5 from the server's memory rows, in NumPy (the oracle)."""
  out = []
  weight = np.asarray(rows.weight)
  for i, values in enumerate(rows.values):
    values = np.asarray(values)
    if i == 0:  # fc1's kernel
      mask = np.asarray(rows.masks[0], np.float32)
    elif i == 2:  # logits' kernel
      mask = np.asarray(rows.masks[1], np.float32)
    else:
      mask = np.ones_like(values)
    n = weight.reshape([-1] + [1] * (values.ndim - 1))
    total = (n * mask * values).sum(0)
    count = (n * mask).sum(0)
    average = np.where(count > 0, total / np.maximum(count, 1e-12), 0)
    if memory == "updates":
      average = np.where(count > 0, np.asarray(previous[i]) + average, 0)
    out.append((average, count > 0))
  return out


# -- one FedSGC run several tests read --------------------------------------
#
# sparsity 0.2 over fc1 (6 x 8) and logits (8 x 3): ERK densities are
# proportional to 14/48 and 11/24, scaled to keep 0.8 x 72 = 57.6 weights;
# logits would get 1.05 > 1, so it is dense (24) and fc1 keeps
# 57.6 - 24 = 33.6 of 48 -> round(33.6) = 34. The server requests
# readjustment on rounds 1 and 3; clients readjust after every epoch.


@pytest.fixture(scope="module")
def sgc_run(tff_context):
  del tff_context
  algorithm = fedsgc.build_fedsgc(
    _config(algorithm="fedsgc", readjust_every=2, congruity_lambda=1.0),
    _TASK,
    _IDS,
  )
  return algorithm, _run(algorithm, [(0, 1, 2), (0,), (0, 1, 2)])


def test_erk_budgets_by_hand(sgc_run):
  algorithm, _ = sgc_run
  assert algorithm.keep == [34, 24]


def test_every_layer_returns_to_its_density_dense_layers_included(sgc_run):
  algorithm, history = sgc_run
  requested = [o.metrics["readjust_requested"] for _, o in history]
  assert requested == [1.0, 0.0, 1.0]
  # Two due epochs per client on requested rounds.
  assert [o.metrics["readjusts"] for _, o in history] == [6.0, 0.0, 6.0]
  for _, output in history:
    memory = output.state.memory
    for mask, keep in zip(memory.masks, algorithm.keep):
      assert [int(m.sum()) for m in np.asarray(mask)] == [keep] * 3
    for mask, keep in zip(output.state.model.masks, algorithm.keep):
      assert int(np.sum(mask)) == keep
    assert output.metrics["sparsity/logits/kernel"] == 0.0
    # Off-mask values are exactly zero in the uploads and the model.
    for index, j in ((0, 0), (2, 1)):
      off = np.asarray(memory.masks[j]) == 0
      assert np.all(np.asarray(memory.values[index])[off] == 0)


def test_server_memory_models_by_hand(sgc_run):
  algorithm, history = sgc_run
  (_, first), (before, second), _ = history
  # Round 2 trained c0 alone: c1 and c2 are remembered from round 1.
  for a, b in zip(first.state.memory.values, second.state.memory.values):
    np.testing.assert_array_equal(np.asarray(a)[1:], np.asarray(b)[1:])
    assert not np.array_equal(np.asarray(a)[0], np.asarray(b)[0])
  expected = _union_average(
    second.state.memory, before.model.trainable, "models"
  )
  model = second.state.model
  for i, (average, held) in enumerate(expected):
    np.testing.assert_allclose(
      model.trainable[i],
      np.where(held, average, 0)
      * (np.asarray(model.masks[0]) if i == 0 else 1),
      atol=1e-5,
    )
  # Re-prune: fc1 keeps the 34 largest |average| among held elements.
  average, held = expected[0]
  threshold = np.sort(np.abs(average[held]))[::-1][33]
  chosen = np.asarray(model.masks[0]) > 0
  assert np.all(np.abs(average[chosen]) >= threshold - 1e-6)
  assert np.all(held[chosen])
  # The running sums are those of the rows.
  sums = second.state.sums
  rows = second.state.memory
  np.testing.assert_allclose(
    sums.weight_sum[0],
    (np.asarray(rows.weight)[:, None, None] * np.asarray(rows.masks[0])).sum(0),
    atol=1e-4,
  )


def test_direction_map_by_hand_informs_inactive_weights(sgc_run):
  _, history = sgc_run
  informed_inactive = 0
  for before, output in history:
    expected = _union_average(
      output.state.memory, before.model.trainable, "models"
    )
    for j, i in enumerate((0, 2)):
      average, held = expected[i]
      previous = np.asarray(before.model.trainable[i])
      change = average - previous
      # Changes within float32 rounding of the running sums are none.
      scale = np.maximum(
        np.maximum(np.abs(average), np.abs(previous)), np.abs(previous).mean()
      )
      moved = held & (np.abs(change) > 1e-5 * scale)
      np.testing.assert_array_equal(
        output.state.directions[j],
        np.where(moved, np.sign(change), 0).astype(np.int8),
      )
      inactive = np.asarray(before.model.masks[j]) == 0
      informed_inactive += int(
        np.sum(np.asarray(output.state.directions[j])[inactive] != 0)
      )
  # Weights the clients grew carry a direction (not 0, as two masked global
  # models would give).
  assert informed_inactive > 0
  assert history[-1][1].metrics["direction_nonzero_inactive"] > 0


def test_guided_readjustment_acts(sgc_run):
  _, history = sgc_run
  metrics = history[2][1].metrics  # The map comes from round 2.
  assert metrics["grow_candidates_with_direction"] > 0
  assert metrics["grown_congruent"] > 0
  assert metrics["pruned_incongruent"] > 0
  # Round 1's map is all zero: nothing is guided.
  first = history[0][1].metrics
  assert first["grown_congruent"] == first["pruned_incongruent"] == 0.0
  assert first["grow_candidates_with_direction"] == 0.0


def test_traffic_by_hand(sgc_run):
  algorithm, history = sgc_run
  kernel_sizes = (48, 24)
  dense = (8 + 3) * 4
  model_bytes = (
    sum(4 * k + math.ceil(s / 8) for k, s in zip(algorithm.keep, kernel_sizes))
    + dense
  )
  packed = sum(math.ceil(s / 4) for s in kernel_sizes)  # 2-bit maps.
  initial_masks = history[0][0].model.masks
  for round_num, (before, output) in enumerate(history, start=1):
    requested = round_num in (1, 3)
    rows = output.state.memory
    for traffic in output.traffic:
      assert traffic.bytes_down == model_bytes + (packed if requested else 0)
      row = _IDS.index(traffic.client_id)
      sent = before.model.masks if round_num > 1 else initial_masks
      changed = [
        not np.array_equal(np.asarray(m)[row], np.asarray(s))
        for m, s in zip(rows.masks, sent)
      ]
      # logits is dense: its mask never changes, so it is never sent.
      assert not changed[1] and changed[0] == requested
      upload = (
        4 * sum(algorithm.keep)
        + dense
        + 4
        + sum(math.ceil(s / 8) for s, c in zip(kernel_sizes, changed) if c)
      )
      metric_bytes = traffic.bytes_up - upload
      assert 0 < metric_bytes < 64  # The metric sums, measured separately.
  # Compute: the examples trained (FedSGC's growth gradient is accumulated
  # during training, nothing is computed again).
  c1 = [t for t in history[0][1].traffic if t.client_id == "c1"][0]
  assert c1.flops == 10 * _TASK.training_flops_per_example


def test_checkpoint_holds_the_server_memory(sgc_run, tmp_path):
  algorithm, history = sgc_run
  state = history[1][1].state
  restored = checkpoint_round_trip(
    tmp_path,
    state,
    algorithm.initialize(),
    {"c0": np.int64(4)},
    algorithm.initial_client_state(),
  )
  for a, b in zip(
    tf.nest.flatten(state), tf.nest.flatten(restored.server_state)
  ):
    np.testing.assert_array_equal(a, b)
  assert int(restored.client_states["c0"]) == 4


# -- other settings ---------------------------------------------------------


def test_readjust_timing_follows_cumulative_epochs(tff_context):
  del tff_context
  # begin 3, every 2 epochs, E_end 9; two local epochs per round. c0 starts
  # at 0 (epochs 1, 2: none due), c1 at 2 (3 due, 4 not), c2 at 6 (7 due;
  # 9 would be, but it is E_end).
  algorithm = fedsgc.build_fedsgc(
    _config(
      algorithm="fedsgc",
      readjust_begin_epoch=3,
      readjust_delta_epochs=2,
      readjust_end_epoch=9,
    ),
    _TASK,
    _IDS,
  )
  ((_, output),) = _run(
    algorithm,
    [(0, 1, 2)],
    {"c0": np.int64(0), "c1": np.int64(2), "c2": np.int64(6)},
  )
  assert output.metrics["readjusts"] == 2.0
  alpha = lambda t: 0.3 / 2 * (1 + math.cos(math.pi * t / 9))
  assert output.metrics["prune_fraction"] == pytest.approx(
    (alpha(3) + alpha(7)) / 2, rel=1e-5
  )
  assert {k: int(v) for k, v in output.client_states.items()} == {
    "c0": 2,
    "c1": 4,
    "c2": 8,
  }
  # c2 starts at 6 > E_end / 2: its first due epoch is 7 (cos < 0) and its
  # round trained 14 examples.
  assert {t.client_id: t.examples for t in output.traffic} == {
    "c0": 18,
    "c1": 10,
    "c2": 14,
  }


@pytest.mark.slow
def test_feddst_readjusts_at_the_end_of_local_training(tff_context):
  del tff_context
  # FedDST's defaults: first at epoch E = 2, then every 2, i.e. at the end of
  # each round; lambda 0 and no memory.
  algorithm = feddst.build_feddst(
    _config(
      algorithm="feddst", readjust_begin_epoch=0, readjust_delta_epochs=0
    ),
    _TASK,
    _IDS,
  )
  assert (algorithm.schedule.begin_epoch, algorithm.schedule.delta_epochs) == (
    2,
    2,
  )
  assert algorithm.memory == "none"
  ((_, output),) = _run(algorithm, [(0, 1, 2)])
  assert output.metrics["readjust_requested"] == 1.0
  assert output.metrics["readjusts"] == 3.0
  # It recomputes the last batch's gradient (c0: 9 examples in batches of
  # 3; c1: 5 in 3 + 2; c2: 7 in 3 + 3 + 1), and gets no direction map.
  flops = {
    t.client_id: t.flops // _TASK.training_flops_per_example
    for t in output.traffic
  }
  assert flops == {"c0": 18 + 3, "c1": 10 + 2, "c2": 14 + 1}
  model_bytes = (
    sum(4 * k + math.ceil(s / 8) for k, s in zip(algorithm.keep, (48, 24)))
    + (8 + 3) * 4
  )
  assert {t.bytes_down for t in output.traffic} == {model_bytes}
  # Readjusting at the end, the grown weights go up at zero: in the uploads
  # (kept by the server's memory here) the active weights whose value is
  # exactly 0 are the newly grown ones. Readjusting after epoch 1 instead,
  # they train for an epoch first.
  zeros = {}
  for begin in (2, 1):
    algorithm = fedsgc.build_fedsgc(
      _config(
        algorithm="fedsgc",
        congruity_lambda=0.0,
        sparsity=0.5,
        readjust_begin_epoch=begin,
        readjust_delta_epochs=2,
      ),
      _TASK,
      _IDS,
    )
    ((_, output),) = _run(algorithm, [(0, 1, 2)])
    rows = output.state.memory
    zeros[begin] = sum(
      int(
        np.sum(
          (np.asarray(rows.masks[j]) > 0) & (np.asarray(rows.values[i]) == 0)
        )
      )
      for j, i in enumerate((0, 2))
    )
    assert output.metrics["readjusts"] == 3.0
    if begin == 2:
      assert zeros[2] == output.metrics["grown_new"] > 0
  assert zeros[1] < zeros[2]


@pytest.fixture(scope="module")
def dense_feddst(tff_context):
  """FedDST at sparsity 0 without readjustment, two rounds of every client:
  (the algorithm, its trainable weights, TFF's own FedAvg's on the same
  data from the same start)."""
  del tff_context
  algorithm = feddst.build_feddst(
    _config(algorithm="feddst", sparsity=0.0, readjust_every=0), _TASK, _IDS
  )
  assert algorithm.memory == "none"
  history = _run(algorithm, [(0, 1, 2), (0, 1, 2)])
  actual = algorithm.model_weights(history[-1][1].state).trainable
  process = tff.learning.algorithms.build_weighted_fed_avg(
    _TASK.tff_model_fn(plain_graph_methods=False),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
  )
  fed_state = process.initialize()
  for r in (1, 2):
    data = [c.dataset for c in _clients(algorithm, r, (0, 1, 2), {})]
    fed_state = process.next(fed_state, data).state
  return algorithm, actual, process.get_model_weights(fed_state).trainable


@pytest.mark.slow
def test_sparsity_zero_without_readjustment_equals_tff_fedavg(dense_feddst):
  # The dense model's rounds (no server memory). The memory readings of
  # FedSGC ("models", "updates", "none") against TFF's FedAvg are
  # sparse_process_test.py's test_each_memory_reading_by_an_oracle.
  _, actual, expected = dense_feddst
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_fedprox_term_equals_fedprox(dense_feddst):
  # The oracle is `fedprox.build_fedprox_process` (checked against a hand
  # computation in fedprox_test.py), not TFF's `build_weighted_fed_prox`,
  # whose proximal gradient has the opposite sign (see fedprox.py).
  _, plain, _ = dense_feddst
  process = fedprox.build_fedprox_process(
    _TASK.model_fn,
    input_spec=_TASK.element_spec,
    prox_mu=0.5,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  )
  algorithm = feddst.build_feddst(
    _config(algorithm="feddst", sparsity=0.0, readjust_every=0, prox_mu=0.5),
    _TASK,
    _IDS,
  )
  fed_state = process.initialize()
  for r in (1, 2):
    data = [c.dataset for c in _clients(algorithm, r, (0, 1, 2), {})]
    fed_state = process.next(fed_state, data).state
  history = _run(algorithm, [(0, 1, 2), (0, 1, 2)])
  actual = algorithm.model_weights(history[-1][1].state).trainable
  for a, e in zip(actual, process.get_model_weights(fed_state).trainable):
    np.testing.assert_allclose(a, e, rtol=0, atol=1e-5)
  # The term acts: the same rounds without it (prox_mu 0) differ.
  assert any(
    np.abs(np.asarray(a) - np.asarray(p)).max() > 1e-4
    for a, p in zip(actual, plain)
  )


def test_a_client_without_data_keeps_its_row_in_memory_and_sums(sgc_run):
  # Round 2 (no readjustment requested) samples c0 with data and c1 with
  # none, after `sgc_run`'s round 1 of every client: c1 sends nothing, so
  # the server keeps its round-1 row, and the running sums stay those of
  # the rows (a row forgotten in the sums but kept in memory would be
  # subtracted twice the next time c1 is sampled).
  algorithm, history = sgc_run
  first = history[0][1]
  nothing = data_lib.ArrayDataset(
    np.zeros([0, 2, 3, 1], np.float32), np.zeros([0], np.int32)
  )
  cohort = _clients(algorithm, 2, (0,), first.client_states) + [
    api.ClientRound(
      client_id="c1",
      dataset=algorithm.client_dataset(
        nothing, batch_size=3, local_epochs=2, shuffle_seed=2
      ),
      num_examples=0,
      state=first.client_states["c1"],
    )
  ]
  second = algorithm.next(first.state, 2, cohort)
  kept, now = first.state.memory, second.state.memory
  for a, b in zip(kept.values, now.values):
    np.testing.assert_array_equal(np.asarray(a)[1], np.asarray(b)[1])
  assert now.weight[1] == kept.weight[1] > 0
  rows, sums = now, second.state.sums
  weight = np.asarray(rows.weight)
  for i, values in enumerate(rows.values):
    mask = (
      np.asarray(rows.masks[{0: 0, 2: 1}[i]], np.float32)
      if i in (0, 2)
      else np.ones_like(np.asarray(values))
    )
    n = weight.reshape([-1] + [1] * (np.ndim(values) - 1))
    np.testing.assert_allclose(
      sums.weight_sum[i], (n * mask).sum(0), rtol=1e-5, atol=1e-4
    )
    np.testing.assert_allclose(
      sums.weighted_sum[i],
      (n * mask * np.asarray(values)).sum(0),
      rtol=1e-5,
      atol=1e-4,
    )


def test_memory_updates_by_hand(tff_context):
  del tff_context
  algorithm = fedsgc.build_fedsgc(
    _config(algorithm="fedsgc", sgc_memory="updates"), _TASK, _IDS
  )
  (_, first), (before, second) = _run(algorithm, [(0, 1, 2), (1,)])
  # Rows hold changes to the model each client was sent: c0, c2 from round
  # 1 (sent the initial model), c1 from round 2.
  expected = _union_average(
    second.state.memory, before.model.trainable, "updates"
  )
  model = second.state.model
  for i, (candidate, held) in enumerate(expected):
    mask = (
      np.asarray(model.masks[0])
      if i == 0
      else np.asarray(model.masks[1])
      if i == 2
      else 1
    )
    previous = np.asarray(before.model.trainable[i])
    value = np.where(held, candidate, previous if i in (1, 3) else 0)
    np.testing.assert_allclose(model.trainable[i], value * mask, atol=1e-5)
  del first


@pytest.mark.slow
def test_fedsgc_learns(tmp_path):
  result = loop.run_experiment(
    make_config(
      algorithm="fedsgc",
      dataset="digits",
      model="mlp",
      partition="iid",
      num_clients=10,
      clients_per_round=5,
      rounds=8,
      local_epochs=2,
      batch_size=20,
      client_lr=0.1,
      sparsity=0.8,
      eval_every=8,
      checkpoint_every=8,
      progress=False,
      root_output_dir=str(tmp_path),
      experiment_name="learns",
    )
  )
  # Ten classes: chance is 0.1 (eight rounds reach about 0.79).
  assert result.report["final_metrics"]["accuracy"] > 0.6
  history = result.report["history"]
  assert history[-1]["sparsity"] == pytest.approx(0.8, abs=0.01)
  assert sum(r["readjusts"] for r in history) > 0


def test_flags_reach_the_algorithm():
  experiment = loop.build_experiment(
    make_config(
      algorithm="fedsgc",
      dataset="synthetic",
      model="mlp",
      num_clients=4,
      clients_per_round=2,
      sparsity=0.9,
      readjust_every=3,
      prune_alpha=0.1,
      congruity_lambda=0.25,
      rounds=10,
      local_epochs=3,
      sgc_memory="updates",
    )
  )
  algorithm = experiment.algorithm
  # E_end = 3 epochs x 10 rounds x 2 / 4 clients = 15; begin E // 2 + 1.
  assert algorithm.schedule == prune_grow.ReadjustSchedule(
    alpha=0.1,
    delta_epochs=3,
    begin_epoch=2,
    end_epoch=15,
    request_every=3,
    request_end_round=0,
  )
  assert algorithm.sparsity == 0.9 and algorithm.memory == "updates"
  assert algorithm.initialize().memory.weight.shape == (4,)


def _bn_mlp():
  inputs = tf.keras.Input((2, 3, 1))
  x = tf.keras.layers.Dense(
    8, name="fc1", kernel_initializer=tf.keras.initializers.GlorotUniform(1)
  )(tf.keras.layers.Flatten()(inputs))
  x = tf.keras.layers.BatchNormalization(name="bn")(x)
  return tf.keras.Model(
    inputs,
    tf.keras.layers.Dense(
      3,
      name="logits",
      kernel_initializer=tf.keras.initializers.GlorotUniform(2),
    )(x),
  )


@pytest.mark.slow
def test_batch_norm_statistics_come_from_the_clients_data(tff_context):
  del tff_context
  task = attrs.evolve(_TASK, model_name="bn_mlp6", model_fn=_bn_mlp)
  # Without readjustment (the statistics are those of whatever model the
  # round ends with: the cheaper round computation).
  algorithm = fedsgc.build_fedsgc(
    _config(algorithm="fedsgc", readjust_every=0), task, _IDS
  )
  state = _run(algorithm, [(0, 1, 2)])[-1][1].state
  weights = algorithm.model_weights(state)
  wrapped = algorithm.keras_fn()
  positions = {id(v): i for i, v in enumerate(wrapped.non_trainable_weights)}
  mean_at = positions[id(wrapped.get_layer("bn").moving_mean)]
  # The server aggregates kernels and biases only.
  np.testing.assert_array_equal(weights.non_trainable[mean_at], np.zeros(8))
  datasets = [
    data_lib.make_client_dataset(
      _arrays(i, 1), batch_size=3, local_epochs=1, shuffle_seed=None
    )
    for i in range(3)
  ]
  (evaluated,) = algorithm.evaluation_models(
    state, api.ClientDatasets(datasets)
  ).values()

  def fc1(name, variables, values):
    (value,) = [
      a
      for v, a in zip(variables, values)
      if "fc1" in v.name and v.name.endswith(f"/{name}:0")
    ]
    return value

  kernel = fc1("kernel", wrapped.trainable_weights, weights.trainable)
  bias = fc1("bias", wrapped.trainable_weights, weights.trainable)
  mask = fc1("mask", wrapped.non_trainable_weights, weights.non_trainable)
  x = np.concatenate(
    [b["x"].numpy().reshape(-1, 6) for d in datasets for b in d]
  )
  np.testing.assert_allclose(
    evaluated.weights.non_trainable[mean_at],
    (x @ (kernel * mask) + bias).mean(axis=0),
    atol=1e-5,
  )
  assert np.abs(evaluated.weights.non_trainable[mean_at]).max() > 1e-2


def test_remember_replaces_the_rows_of_clients_that_sent():
  # Rows 0 and 2 of three were in the cohort. Row 0's client sent an upload;
  # row 2's client either had no data (sent nothing: its old row stays, as
  # `next` forgot none of it in the running sums) or had data and TFF
  # zeroed its non-finite update (weight 0: the row is replaced, as the
  # running sums replaced its contribution).
  memory = computations.MemoryRows(
    values=[np.arange(6, dtype=np.float32).reshape(3, 2)],
    masks=[np.ones((3, 2), np.uint8)],
    weight=np.asarray([5.0, 6.0, 7.0], np.float32),
  )
  received = computations.MemoryRows(  # Stacked, in the order of the rows.
    values=[np.asarray([[10.0, 11.0], [0.0, 0.0]], np.float32)],
    masks=[np.asarray([[1, 0], [0, 0]], np.uint8)],
    weight=np.asarray([3.0, 0.0], np.float32),
  )
  replaced = training.SparseTraining._remember(  # pylint: disable=protected-access
    memory, [0, 2], received, [True, True]
  )
  np.testing.assert_array_equal(
    replaced.values[0], [[10.0, 11.0], [2.0, 3.0], [0.0, 0.0]]
  )
  np.testing.assert_array_equal(replaced.masks[0], [[1, 0], [1, 1], [0, 0]])
  np.testing.assert_array_equal(replaced.weight, [3.0, 6.0, 0.0])
  kept = training.SparseTraining._remember(  # pylint: disable=protected-access
    memory, [0, 2], received, [True, False]
  )
  np.testing.assert_array_equal(
    kept.values[0], [[10.0, 11.0], [2.0, 3.0], [4.0, 5.0]]
  )
  np.testing.assert_array_equal(kept.weight, [3.0, 6.0, 7.0])
  np.testing.assert_array_equal(memory.weight, [5.0, 6.0, 7.0])  # A copy.


def test_packed_row_sums_by_hand():
  # Dense(2) then Dense(1) on 2 inputs. Kernel 1 [[a, b], [c, d]] kept at b
  # and c, kernel 2 [[e], [f]] at e; packed row-major per tensor: b, c,
  # bias 1 (2 values), e, bias 2.
  inputs = tf.keras.Input((2,))
  hidden = tf.keras.layers.Dense(2)(inputs)
  layout = masks_lib.MaskLayout.of(
    masks_lib.prune_wrap(
      tf.keras.Model(inputs, tf.keras.layers.Dense(1)(hidden))
    )
  )
  masks = [
    np.array([[0.0, 1.0], [1.0, 0.0]], np.float32),
    np.array([[1.0], [0.0]], np.float32),
  ]
  sent = masks_lib.SparseModel(
    trainable=[
      np.zeros((2, 2), np.float32),
      np.zeros(2, np.float32),
      np.zeros((2, 1), np.float32),
      np.zeros(1, np.float32),
    ],
    masks=masks,
    statistics=[],
  )
  rows = computations.PackedRow(
    values=np.array(
      [
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        [10.0, 20.0, 30.0, 40.0, 50.0, 60.0],
        [7e3, 7e3, 7e3, 7e3, 7e3, 7e3],  # Weight 0: a client that sent nothing.
      ],
      np.float32,
    ),
    weight=np.array([2.0, 0.5, 0.0], np.float32),
  )
  sums = computations.packed_row_sums(
    layout, sent, tf.nest.map_structure(tf.constant, rows)
  )
  # 2 x row 0 + 0.5 x row 1 = (7, 14, 21, 28, 35, 42); weights 2.5 where held.
  expected = [[[0.0, 7.0], [14.0, 0.0]], [21.0, 28.0], [[35.0], [0.0]], [42.0]]
  held = [[[0.0, 2.5], [2.5, 0.0]], [2.5, 2.5], [[2.5], [0.0]], [2.5]]
  for got, want in zip(sums.weighted_sum, expected):
    np.testing.assert_allclose(got, want)
  for got, want in zip(sums.weight_sum, held):
    np.testing.assert_allclose(got, want)
