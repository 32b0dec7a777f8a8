r"""Benchmarks of the training pipeline (not part of the test suite).

  python tools/bench.py                 # --suite=base
  python tools/bench.py --suite=base --rounds=5 --rss_rounds=100

Suite `base` measures, in one run on the same model, data and cohort:
  * `ours_fedavg_round_s`: a round of our pipeline's FedAvg (the program's
    round: sampling, client datasets, the measured TFF process, ledger,
    metrics release), evaluation excluded;
  * `tff_fedavg_round_s`: TFF's `build_weighted_fed_avg` driven directly on
    the same client datasets, on the same runtime (our local worker);
  * `keras_floor_round_s`: the same client work (each cohort client's local
    epochs of SGD) as plain compiled TF/Keras training in one process;
  * `rss_growth_pct`: growth of resident memory (driver plus its TFF worker)
    of our pipeline from rounds 10-14 to the last 5 rounds of `--rss_rounds`
    (medians of the 5 per-round readings at each end: a round's transient
    buffers move a single reading by tens of MiB).
Suite `hetero` (`--model` defaults to vgg16_eighth there) times
`FederatedAlgorithm.next` on the same cohort and client datasets:
  * `fedavg_round_s`: FedAvg (TFF's builder with our measured parts);
  * `adaptivefl_full_pool_round_s`: AdaptiveFL whose pool holds only the full
    model, every client able to train it (one group per round);
  * `adaptivefl_mixed_round_s`: AdaptiveFL with the paper's pool (r = 0.66 /
    0.40, the model's start indices), RL selection and the default
    weak/medium/strong tiers 4:3:3, timed after warm-up rounds that build
    the group computations; `adaptivefl_mixed_groups` is the mean number of
    (sent, trained) groups per timed round.
Suite `sparse` (default model mnist_cnn) times, on the same cohort and data
(100 clients, so FedSGC's server remembers 100 uploads):
  * `fedavg_round_s`: FedAvg;
  * `fedsgc_round_s`: a FedSGC round without readjustment (sparsity 0.8);
  * `fedsgc_readjust_round_s`: a FedSGC round in which every client
    readjusts once (mid-round) with the direction map;
  * `feddst_round_s`: a FedDST round without readjustment (no memory);
  * `fedsgc_server_step_s`: FedSGC's server step alone (the TFF computation:
    replace the cohort's rows in the running sums, union average, direction
    map, re-prune) with 100 remembered clients, and
    `fedsgc_memory_update_s` the driver's copy of the 100 rows with the
    cohort's replaced.
Suite `gkt` (edge `fedgkt_edge_resnet8`, server `fedgkt_server_resnet19`
unless --model / --gkt_server_model say otherwise; mnist5k, 20 clients,
cohort 4 by default):
  * `fedgkt_round_s`: a FedGKT round of the program (clients train and
    extract, the server trains one epoch on their features and answers);
  * `fedgkt_server_step_s`: the server's part of it (training + answers);
  * `fedgkt_rss_growth_pct`: resident memory of driver + TFF worker from
    rounds 10-14 to the last 5 of `--gkt_rounds` (default 50; medians, as
    `rss_growth_pct`): features must not pile up;
  * the same for `--gkt_mode=async` (`fedgkt_async_*`: the event simulation
    of the devices decides each round's arrivals, the server trains on each;
    `fedgkt_async_clients_per_round` is the mean number of arrivals).
The last line printed is one JSON object with these figures.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Before absl parses flags (see pipelines/_cli.py).
import tensorflow  # noqa: E402,F401  pylint: disable=unused-import
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

_SUITE = flags.DEFINE_enum("suite", "base", ["base", "hetero", "sparse", "gkt"],
                           "Benchmark suite.")
_GKT_ROUNDS = flags.DEFINE_integer("gkt_rounds", 50,
                                   "Rounds of the FedGKT memory run.")
_GKT_SERVER = flags.DEFINE_string("gkt_server_model", "fedgkt_server_resnet19",
                                  "FedGKT server model (suite gkt).")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds (after 1 warm-up).")
_RSS_ROUNDS = flags.DEFINE_integer("rss_rounds", 100,
                                   "Rounds of the memory-growth run.")
_DATASET = flags.DEFINE_string("dataset", "mnist5k", "Data set.")
_MODEL = flags.DEFINE_string(
    "model", None, "Model (default mnist_cnn; vgg16_eighth for --suite=hetero).")
_CLIENTS = flags.DEFINE_integer("num_clients", 20, "Clients in all.")
_COHORT = flags.DEFINE_integer("clients_per_round", 10, "Cohort size.")


def _config(**overrides):
  from tff_hetero.program import ExperimentConfig  # pylint: disable=g-import-not-at-top
  settings = dict(
      algorithm="fedavg", dataset=_DATASET.value, model=_model(),
      partition="iid", num_clients=_CLIENTS.value,
      clients_per_round=_COHORT.value, local_epochs=1, batch_size=20,
      client_lr=0.05, seed=0, checkpoint_every=10**6, progress=False)
  settings.update(overrides)
  return ExperimentConfig(**settings)


_DEFAULT_MODELS = {"hetero": "vgg16_eighth", "gkt": "fedgkt_edge_resnet8"}


def _model() -> str:
  if _MODEL.value:
    return _MODEL.value
  return _DEFAULT_MODELS.get(_SUITE.value, "mnist_cnn")


def _rss_bytes() -> int:
  import psutil  # pylint: disable=g-import-not-at-top
  me = psutil.Process()
  total = me.memory_info().rss
  for child in me.children(recursive=True):
    try:
      total += child.memory_info().rss
    except psutil.NoSuchProcess:
      pass
  return total


def _rss_growth(rss: dict[int, int], prefix: str) -> collections.OrderedDict:
  """Resident memory at rounds 10-14 and at the last 5 rounds (medians of
  the per-round readings, MiB) and the growth between them (%)."""
  last = max(rss)
  start = statistics.median(rss[r] for r in range(10, 15))
  end = statistics.median(rss[r] for r in range(last - 4, last + 1))
  return collections.OrderedDict([
      (f"{prefix}_rounds10to14_mib", round(start / 2**20, 1)),
      (f"{prefix}_rounds{last - 4}to{last}_mib", round(end / 2**20, 1)),
      (f"{prefix}_growth_pct", round(100.0 * (end - start) / start, 2)),
  ])


def bench_base() -> collections.OrderedDict:
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  timed = _ROUNDS.value
  results = collections.OrderedDict()
  with tempfile.TemporaryDirectory() as root:
    # Ours: the whole program, rounds timed from its own history.
    config = _config(rounds=timed + 1, eval_every=10**6, root_output_dir=root,
                     experiment_name="ours")
    result = loop.run_experiment(config)
    times = np.diff([0.0] + [r["wall_time_s"] for r in result.report["history"]])
    # Round 1 is warm-up; the last round also evaluates.
    results["ours_fedavg_round_s"] = float(statistics.median(times[1:-1]))

    experiment = loop.build_experiment(_config(rounds=1))
    fed = experiment.federated_data
    cohort = list(fed.client_ids)[:_COHORT.value]
    datasets = [data_lib.make_client_dataset(
        fed.client_train(cid), batch_size=20, local_epochs=1, shuffle_seed=i)
                for i, cid in enumerate(cohort)]
    task = experiment.task

    # TFF's builder, driven directly.
    process = tff.learning.algorithms.build_weighted_fed_avg(
        task.tff_model_fn(),
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.05))
    with runtime.local_execution():
      state = process.initialize()
      state = process.next(state, datasets).state  # Warm-up.
      times = []
      for _ in range(timed):
        start = time.perf_counter()
        state = process.next(state, datasets).state
        times.append(time.perf_counter() - start)
    results["tff_fedavg_round_s"] = float(statistics.median(times))

    # Plain Keras/TF: the same client work in one process.
    model = task.model_fn()
    initial = [w.copy() for w in model.get_weights()]
    optimizer = tf.keras.optimizers.SGD(0.05)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train(dataset):
      for batch in dataset:
        with tf.GradientTape() as tape:
          loss = loss_fn(batch["y"], model(batch["x"], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    def keras_round():
      for dataset in datasets:
        model.set_weights(initial)
        train(dataset)

    keras_round()  # Warm-up (tracing).
    times = []
    for _ in range(timed):
      start = time.perf_counter()
      keras_round()
      times.append(time.perf_counter() - start)
    results["keras_floor_round_s"] = float(statistics.median(times))

    # Memory growth over a long run of our pipeline.
    rss = {}

    def record(round_num, row):
      del row
      rss[round_num] = _rss_bytes()

    rss_rounds = max(_RSS_ROUNDS.value, 20)
    loop.run_experiment(
        _config(rounds=rss_rounds, eval_every=10, root_output_dir=root,
                experiment_name="rss"), on_round=record)
    results.update(_rss_growth(rss, "rss"))
  results["overhead_vs_tff"] = round(
      results["ours_fedavg_round_s"] / results["tff_fedavg_round_s"], 3)
  results["setup"] = (f"{_DATASET.value}/{_model()}, {_CLIENTS.value} iid"
                      f" clients, cohort {_COHORT.value}, batch 20, 1 epoch,"
                      f" median of {timed} rounds")
  return results


def _median_next_s(algorithm, clients_for_round, warmup: int,
                   timed: int) -> tuple[float, list]:
  """Median seconds of `algorithm.next` over `timed` rounds after `warmup`.

  `clients_for_round(state, round_num, client_states)` gives the cohort;
  `client_states` holds what earlier rounds left (FedSGC's uploads).
  """
  state = algorithm.initialize()
  times, cohorts, client_states = [], [], {}
  for round_num in range(1, warmup + timed + 1):
    clients = clients_for_round(state, round_num, client_states)
    start = time.perf_counter()
    output = algorithm.next(state, round_num, clients)
    state = output.state
    client_states.update(output.client_states)
    if round_num > warmup:
      times.append(time.perf_counter() - start)
      cohorts.append(clients)
  return float(statistics.median(times)), cohorts


def bench_hetero() -> collections.OrderedDict:
  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import adaptivefl  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import api  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top
  from tff_hetero.program.sampling import CohortSampler  # pylint: disable=g-import-not-at-top
  from tff_hetero.submodels import pools  # pylint: disable=g-import-not-at-top

  timed = _ROUNDS.value
  config = _config(rounds=1, client_momentum=0.5)
  experiment = loop.build_experiment(config)
  fed, population, task = (experiment.federated_data, experiment.population,
                           experiment.task)
  datasets = {cid: data_lib.make_client_dataset(
      fed.client_train(cid), batch_size=20, local_epochs=1, shuffle_seed=i)
              for i, cid in enumerate(fed.client_ids)}

  def client(cid, assignment=None, capacity=True):
    return api.ClientRound(
        client_id=cid, dataset=datasets[cid],
        num_examples=len(fed.client_train(cid)),
        capacity=population.capacity_at_round(cid, 1) if capacity else None,
        tier=population.tier_of(cid), assignment=assignment)

  cohort = list(fed.client_ids)[:_COHORT.value]
  results = collections.OrderedDict()
  with runtime.local_execution():
    fedavg = experiment.algorithm  # config.algorithm == "fedavg"
    results["fedavg_round_s"], _ = _median_next_s(
        fedavg, lambda s, r, _: [client(c) for c in cohort], 1, timed)

    full_pool = pools.SubModelPool(task.width_units, (pools.PoolMember(
        0, "L1", "L", 1.0, len(task.width_units),
        tuple(u.full_width for u in task.width_units)),))
    full_only = adaptivefl.AdaptiveFL(
        task, full_pool, fed.client_ids, client_lr=config.client_lr,
        client_momentum=config.client_momentum)
    results["adaptivefl_full_pool_round_s"], _ = _median_next_s(
        full_only,
        lambda s, r, _: [client(c, 0, capacity=False) for c in cohort],
        1, timed)

    mixed = adaptivefl.AdaptiveFL(
        task, adaptivefl.pool_from_config(config, task), fed.client_ids,
        client_lr=config.client_lr, client_momentum=config.client_momentum)
    sampler = CohortSampler(0)

    def planned(state, round_num, unused_client_states):
      plan = mixed.plan_round(state, round_num, fed.client_ids,
                              _COHORT.value, sampler)
      return [client(a.client_id, a.payload) for a in plan]

    results["adaptivefl_mixed_round_s"], cohorts = _median_next_s(
        mixed, planned, 6, timed)
    groups = []
    for clients in cohorts:
      kinds = set()
      for c in clients:
        trained = adaptivefl.choose_trained_member(
            mixed.pool, mixed.params, c.assignment, c.capacity.params)
        kinds.add((c.assignment, trained))
      groups.append(len(kinds))
    results["adaptivefl_mixed_groups"] = round(statistics.mean(groups), 2)
  results["full_pool_vs_fedavg"] = round(
      results["adaptivefl_full_pool_round_s"] / results["fedavg_round_s"], 3)
  results["setup"] = (f"{_DATASET.value}/{_model()}, {_CLIENTS.value} iid"
                      f" clients, cohort {_COHORT.value}, batch 20, 1 epoch,"
                      f" SGD momentum 0.5, median of {timed} rounds")
  return results


def bench_sparse() -> collections.OrderedDict:
  import attrs  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import api  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.sparse import feddst  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.sparse import fedsgc  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  timed = _ROUNDS.value
  clients_total = max(_CLIENTS.value, 100)
  config = _config(rounds=1, num_clients=clients_total, sparsity=0.8,
                   min_samples_per_client=1)
  experiment = loop.build_experiment(config)
  fed, task = experiment.federated_data, experiment.task
  ids = list(fed.client_ids)
  cohort = ids[:_COHORT.value]
  results = collections.OrderedDict()

  def round_inputs(algorithm):
    datasets = {c: algorithm.client_dataset(
        fed.client_train(c), batch_size=20, local_epochs=1, shuffle_seed=i)
                for i, c in enumerate(cohort)}

    def clients(state, round_num, stored):
      del state, round_num
      return [api.ClientRound(
          client_id=c, dataset=datasets[c],
          num_examples=len(fed.client_train(c)),
          state=stored.get(c, algorithm.initial_client_state()))
              for c in cohort]
    return clients

  def timed_rounds(algorithm):
    """Median seconds of `next` after one warm-up round, and the state."""
    state, stored, times = algorithm.initialize(), {}, []
    clients = round_inputs(algorithm)
    for round_num in range(1, timed + 2):
      cohort_now = clients(state, round_num, stored)
      start = time.perf_counter()
      output = algorithm.next(state, round_num, cohort_now)
      if round_num > 1:
        times.append(time.perf_counter() - start)
      state = output.state
      stored.update(output.client_states)
    return float(statistics.median(times)), state

  with runtime.local_execution():
    results["fedavg_round_s"], _ = timed_rounds(experiment.algorithm)
    runs = (("fedsgc_round_s", fedsgc.build_fedsgc, 0),
            ("fedsgc_readjust_round_s", fedsgc.build_fedsgc, 1),
            ("feddst_round_s", feddst.build_feddst, 0))
    for key, build, every in runs:
      algorithm = build(attrs.evolve(
          config, readjust_every=every, readjust_begin_epoch=1,
          readjust_end_epoch=10**6), task, ids)
      results[key], state = timed_rounds(algorithm)
      if key == "fedsgc_round_s":
        sgc, sgc_state = algorithm, state
    # The server step with 100 remembered clients (rows filled as uploads).
    rng = np.random.default_rng(0)
    memory = sgc_state.memory
    memory = memory._replace(
        values=[rng.normal(size=v.shape).astype(np.float32)
                for v in memory.values],
        masks=[(rng.random(m.shape) < 0.2).astype(np.uint8)
               for m in memory.masks],
        weight=np.full(memory.weight.shape, 20.0, np.float32))
    step = sgc.rounds.server_steps[(False, False)]
    rows = list(range(len(cohort)))
    forgotten = tf.nest.map_structure(lambda a: a[rows], memory)
    new = sgc_state.sums
    durations = []
    for _ in range(timed + 1):
      start = time.perf_counter()
      step(sgc_state.model, sgc_state.sums, forgotten, new)
      durations.append(time.perf_counter() - start)
    results["fedsgc_server_step_s"] = float(statistics.median(durations[1:]))
    received = [tf.nest.map_structure(lambda a, i=i: a[i], memory)
                for i in rows]
    durations = []
    for _ in range(timed):
      start = time.perf_counter()
      sgc._remember(memory, rows, received)  # pylint: disable=protected-access
      durations.append(time.perf_counter() - start)
    results["fedsgc_memory_update_s"] = float(statistics.median(durations))
  results["fedsgc_vs_fedavg"] = round(
      results["fedsgc_round_s"] / results["fedavg_round_s"], 3)
  results["setup"] = (f"{_DATASET.value}/{_model()}, {clients_total} iid"
                      f" clients, cohort {_COHORT.value}, batch 20, 1 epoch,"
                      f" sparsity 0.8, median of {timed} rounds")
  return results


def _gkt_run(mode: str, rounds: int, cohort: int) -> collections.OrderedDict:
  """One FedGKT run in `mode`: round and server-step times, memory growth."""
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top
  rss, rows = {}, {}

  def record(round_num, row):
    rss[round_num] = _rss_bytes()
    rows[round_num] = row

  with tempfile.TemporaryDirectory() as root:
    loop.run_experiment(_config(
        algorithm="fedgkt", gkt_server_model=_GKT_SERVER.value,
        clients_per_round=cohort, rounds=rounds, eval_every=10**6,
        gkt_mode=mode, root_output_dir=root, experiment_name="gkt"),
                        on_round=record)
  # Round 1 traces the computations; the last round also evaluates.
  timed = range(2, rounds)
  walls = {r: rows[r]["wall_time_s"] - rows[r - 1]["wall_time_s"]
           for r in timed}
  prefix = "fedgkt" if mode == "sync" else "fedgkt_async"
  results = collections.OrderedDict()
  results[f"{prefix}_round_s"] = float(statistics.median(walls.values()))
  results[f"{prefix}_server_step_s"] = float(statistics.median(
      rows[r]["server_step_s"] for r in timed))
  results[f"{prefix}_clients_per_round"] = round(statistics.mean(
      rows[r]["clients"] for r in timed), 2)
  results.update(_rss_growth(rss, f"{prefix}_rss"))
  results[f"{prefix}_feature_mib_per_round"] = round(
      statistics.mean(rows[r]["feature_bytes"] for r in timed) / 2**20, 2)
  return results


def bench_gkt() -> collections.OrderedDict:
  rounds = max(_GKT_ROUNDS.value, 20)
  cohort = _COHORT.value if _COHORT.present else 4
  results = collections.OrderedDict()
  for mode in ("sync", "async"):
    results.update(_gkt_run(mode, rounds, cohort))
  results["setup"] = (f"{_DATASET.value}/{_model()} + {_GKT_SERVER.value},"
                      f" {_CLIENTS.value} iid clients, cohort {cohort} (async:"
                      f" {cohort} devices at work, tiers 4:3:3 at 0.25/0.5/1"
                      f" of the MAC capacity), batch 20, 1 client and 1"
                      f" server epoch, median of rounds 2..{rounds - 1}")
  return results


SUITES = collections.OrderedDict(base=bench_base, hetero=bench_hetero,
                                 sparse=bench_sparse, gkt=bench_gkt)


def main(argv):
  del argv
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  results = SUITES[_SUITE.value]()
  for key, value in results.items():
    print(f"{key}: {value}")
  print(json.dumps(results), flush=True)


if __name__ == "__main__":
  app.run(main)
