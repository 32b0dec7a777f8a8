r"""Benchmarks of the training pipeline (not part of the test suite).

  python tools/bench.py                 # --suite=base
  python tools/bench.py --suite=base --rounds=5 --rss_rounds=100
  python tools/bench.py --suite=rss --rss_rounds=500
  python tools/bench.py --suite=coldstart
  python tools/bench.py --suite=scale
  python tools/bench.py --suite=depth
  python tools/bench.py --suite=remote
  python tools/bench.py --smoke --rounds=2 --rss_rounds=20   # tries it out

`--rounds` rounds (at least 5; fewer only with `--smoke`) are timed after
one warm-up round. Suite `base` reports each timed quantity as their median
with the fastest and slowest round beside it (`<key>_min`, `<key>_max`);
suites `hetero` and `sparse` report medians.
Suite `base` runs FedAvg (SGD 0.05, iid partition of `--dataset`,
`--num_clients` clients, cohort `--clients_per_round`) in two
configurations, `compute` (mnist_cnn_feddst, 5 local epochs, batch 50: the
clients' arithmetic dominates) and `overhead` (mnist_cnn, 1 epoch, batch 20:
the framework's per-round cost dominates; `--base_configs` picks), and
reports for each, keys prefixed `<cfg>_`:
  * `ours_round_s`: a round of our program's FedAvg (`loop.run_experiment`:
    sampling, client datasets, the measured TFF process, ledger, metrics
    release), from its history's wall times; the last round, which also
    evaluates and checkpoints, is not timed;
  * `tff_round_s`: TFF's `build_weighted_fed_avg` driven directly on the
    first cohort's client datasets, on the same runtime (our local worker),
    with its default client loop (`LoopImplementation.DATASET_REDUCE`) and
    TFF's own `from_keras_model` model (`plain_graph_methods=False`; every
    TFF row of every suite uses it);
  * `tff_iterator_round_s`: the same with `DATASET_ITERATOR`, the loop our
    clients run (`local_training.fold_batches`);
  * `tff_iterator_files_round_s`: the same on datasets whose samples the
    worker reads from files (`tff_hetero.data.ClientFiles`,
    `--client_data=files`), the same batches; `tff_iterator_rpc_mib_sent`
    and `tff_iterator_files_rpc_mib_sent`: the serialized bytes a round of
    each sent the worker (MiB; the datasets, the model, the computation);
  * `floor_sequential_round_s`, `floor_parallel_round_s`: the same client
    work (each client: from the same initial weights, plain SGD over the very
    batches of its dataset, in their order) in plain TensorFlow: the batches
    held as stacked in-memory tensors, one compiled `tf.function` call per
    client looping over them (`tf.range`, variables updated in place by
    `assign_sub`, gradients by `tf.GradientTape`); clients one after the
    other, or spread over one thread per core, each thread with its own
    model copy and function (TensorFlow runs the functions of the threads at
    once). Every floor round must take as many SGD steps as the datasets
    hold batches (`steps_per_round`). Server aggregation is not part of it.
    The floor is timed in two sittings of `--rounds` rounds (each after a
    warm-up round), one before our program and one after TFF's rows, and
    its figures are over both, so that the machine's speed drifting over
    the minutes of a run moves the floor as it moves the rows it divides;
  * `floor_round_s`: the better of the two (`floor_best` says which);
  * `ours_driver_cpu_s`, `ours_worker_cpu_s`, `floor_cpu_s`: CPU seconds
    (user + system, median over the timed rounds) of a round of ours in
    the driver (this process) and in its children alive at the round's end
    (the TFF worker, the idle compiler process), read at each round's
    `on_round` call (after its metrics release, so nearly the round's
    `wall_time_s` interval), and of a round of the better floor variant
    (this process): what the machine's cores did for the same client work;
  * `ours_over_floor`, `tff_over_floor`, `tff_iterator_over_floor`,
    `ours_over_tff` (against TFF's default loop), `ours_over_tff_iterator`
    (the same loop; ours with our models' `forward_pass` traced into the
    client step, TFF's with its own `tf.function`s): ratios of medians.
Then `rss_*` (FedAvg) and `rss_adaptivefl_*` (AdaptiveFL with its default
tiers, pool and selection): growth of resident memory (driver plus its TFF
worker) of our pipeline on the `overhead` configuration from rounds 10-14
to the last 5 rounds of `--rss_rounds` (medians of the 5 per-round readings
at each end: a round's transient buffers move a single reading by tens of
MiB). Suite `rss` runs only these (memory does not depend on the
machine's load the way times do).
Suite `depth` runs, on the same cohort of `--clients_per_round` clients
(their tiers from the population, proportions 1:1:1, transformer 4/8/12
blocks unless `--model`), a round of InclusiveFL (`inclusivefl_round_s`:
one computation per depth group and the server step), of its AllLarge
baseline (`all_large_round_s`: every client the deepest model, one group)
and of TFF's `build_weighted_fed_avg` of the deepest model with a FedAdam
server, uniform weighting and our client loop (`tff_fedavg_large_round_s`),
medians of `--rounds` rounds of each, interleaved (one of each in turn),
after one warm-up; `server_step_s`: InclusiveFL's server step alone (every
group present); and the ratios of the first two to the third (median of
the per-cycle ratios, with their min and max).
Suite `remote` times a FedAvg round and an AdaptiveFL round (default pool
and selection) of suite hetero's cohort (model mnist_cnn unless `--model`)
in each of
`REMOTE_SETTINGS`: the local runtime, one and three workers on loopback
(plaintext), three on loopback with mutual TLS, and one and three workers
with TLS each on a host of its own (a network namespace joined to this one
by a veth link; skipped with the reason without root or `ip`). Workers are
started as an operator would (`python -m pipelines.worker`). Per setting and
algorithm: `<setting>_<algorithm>_round_s` (median of `--rounds` after one
warm-up), `_over_local` (ratio to the local runtime), `_rpc_mib_sent` and
`_rpc_mib_received` (serialized gRPC payload per round between the driver
and all its workers); `tls_overhead_<algorithm>`: three TLS workers over
three plaintext ones, on loopback.
Suite `coldstart` starts, for each registered algorithm (or
`--coldstart_algorithms`), one at a time, a fresh
`python -m pipelines.train --rounds=1` on `--dataset` (mnist_cnn;
FedGKT and split learning fedgkt_edge_resnet8 + fedgkt_server_resnet19;
other flags at the pipeline's defaults) and reports:
  * `coldstart_<name>_s`: process start to process end, or the error's last
    line if the run failed;
  * `coldstart_<name>_first_round_s`: process start to the release of round
    1's metrics (the last round: evaluation included), the cold start whose
    goal is `coldstart_goal_s` (30 s on two cores); `coldstart_over_goal`
    lists the algorithms that missed it or failed;
  * `coldstart_<name>_round1_wall_s`: round 1's own `wall_time_s` from
    metrics.csv (tracing and evaluation, no start-up).
Suite `hetero` (`--model` defaults to vgg16_eighth there) times
`FederatedAlgorithm.next` on the same cohort and client datasets:
  * `fedavg_round_s`: FedAvg (TFF's builder with our measured parts);
  * `adaptivefl_full_pool_round_s`: AdaptiveFL whose pool holds only the full
    model, every client able to train it (one group per round);
  * `adaptivefl_mixed_round_s`: AdaptiveFL with the paper's pool (r = 0.66 /
    0.40, the model's start indices), RL selection and the default
    weak/medium/strong tiers 4:3:3, timed after warm-up rounds that build
    the group computations; `adaptivefl_mixed_groups` is the mean number of
    (sent, trained) groups per timed round;
  * `<run>_rpc_mib_sent` / `_received`: for each of the three, the mean
    serialized gRPC bytes per timed round between the driver and its local
    TFF worker (`ExecutionHandle.rpc_bytes`: models, sums, client data and
    computations alike), in MiB.
Suite `sparse` (default model mnist_cnn) times, on the same cohort and data
(100 clients, so FedSGC's server remembers 100 uploads), one round of each
of the four runs below in turn (the order rotating from cycle to cycle),
`--rounds` times after one warm-up round of each (medians, `_min` and `_max`; `fedsgc_vs_fedavg` is the median of the
ratios of the FedSGC and FedAvg rounds run side by side, with its `_min` and
`_max`):
  * `fedavg_round_s`: FedAvg;
  * `fedsgc_round_s`: a FedSGC round without readjustment (sparsity 0.8);
  * `fedsgc_readjust_round_s`: a FedSGC round in which every client
    readjusts once (mid-round) with the direction map;
  * `feddst_round_s`: a FedDST round without readjustment (no memory);
  * `<run>_rpc_mib_sent` / `_received` for each of the four: the mean
    serialized gRPC bytes per timed round between the driver and its local
    TFF worker (`ExecutionHandle.rpc_bytes`), in MiB;
  * `fedsgc_server_step_s`: FedSGC's server step alone (the TFF computation:
    replace the cohort's rows in the running sums, union average, direction
    map, re-prune) with 100 remembered clients, and
    `fedsgc_memory_update_s` the driver's copy of the 100 rows with the
    cohort's replaced.
Suite `scale` runs our program's FedAvg (`loop.run_experiment`, as
`ours_round_s` of suite base) on `--dataset` at three (population, cohort)
sizes, `SCALE_CONFIGS`: 100 / 10, 1,000 / 10 and 1,000 / 100 clients, iid,
batch 40 so that every client trains one batch at either population (40
examples each at 100 clients of mnist5k, 4 at 1,000), 1 epoch:
  * `<name>_round_s`: median, `_min`, `_max` over three runs of each size
    (run in turn, each size taking each place in the order once) of
    `--rounds` rounds after a warm-up (the last, evaluating round is not
    timed), and `<name>_rss_mib`, the largest resident memory of driver
    plus TFF worker after a round;
  * `population_ratio`: 1,000 / 10 over 100 / 10 (the program builds
    datasets for the cohort only, so about 1 if nothing else grows with the
    population; the 1,000-client runs' clients hold a tenth of the
    examples, so this bounds the population's cost rather than isolating
    it);
  * `cohort_ratio`: 1,000 / 100 over 1,000 / 10 (about 10 when the round
    grows linearly in the cohort).
Batch 40 is one batch per client with the default mnist5k (4,000 training
examples); other `--dataset`s give other per-client sizes.
Suite `gkt` (edge `fedgkt_edge_resnet8`, server `fedgkt_server_resnet19`
unless --model / --gkt_server_model say otherwise; mnist5k, 20 clients,
cohort 4 by default):
  * `fedgkt_round_s`: a FedGKT round of the program (clients train and
    extract, the server trains one epoch on their features and answers);
  * `fedgkt_server_step_s`: the server's part of it (training + answers;
    timed on the worker, `server_step_s`);
  * `fedgkt_rss_growth_pct`: resident memory of driver + TFF worker from
    rounds 10-14 to the last 5 of `--gkt_rounds` (default 50; medians, as
    `rss_growth_pct`): features must not pile up;
  * the same for `--gkt_mode=async` (`fedgkt_async_*`: the event simulation
    of the devices decides each round's arrivals, the server trains on each;
    `fedgkt_async_clients_per_round` is the mean number of arrivals);
  * `fedgkt_rpc_mib_sent` / `_received`: sync FedGKT's mean serialized
    gRPC bytes per round between the driver and its local TFF worker
    (`ExecutionHandle.rpc_bytes`), rounds 2..`--rounds` + 1 of one cohort.
The last line printed is one JSON object with these figures.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Before TensorFlow starts its threads, as the CLI entry points do (heap.py).
from tff_hetero.runtime import heap  # noqa: E402

heap.configure_process_heap()
# Before absl parses flags (see pipelines/_cli.py).
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import tensorflow  # noqa: E402,F401  pylint: disable=unused-import

_SUITE = flags.DEFINE_enum(
  "suite",
  "base",
  [
    "base",
    "depth",
    "hetero",
    "sparse",
    "scale",
    "gkt",
    "coldstart",
    "spatl",
    "remote",
    "rss",
  ],
  "Benchmark suite.",
)
_GKT_ROUNDS = flags.DEFINE_integer(
  "gkt_rounds", 50, "Rounds of the FedGKT memory run."
)
_GKT_RPC_ONLY = flags.DEFINE_bool(
  "gkt_rpc_only",
  False,
  "Suite gkt: only the gRPC bytes and the two-worker CPU seconds over"
  " rounds 2..--rounds+1 (no 50-round memory runs).",
)
_GKT_SERVER = flags.DEFINE_string(
  "gkt_server_model",
  "fedgkt_server_resnet19",
  "FedGKT server model (suite gkt).",
)
_ROUNDS = flags.DEFINE_integer(
  "rounds", 5, "Timed rounds (after 1 warm-up), at least 5 unless --smoke."
)
_SMOKE = flags.DEFINE_bool(
  "smoke",
  False,
  "Allow --rounds below 5 (to try this script out; such"
  " medians are no result).",
)
flags.register_validator(
  "rounds", lambda n: n >= 1, message="--rounds must be at least 1"
)
flags.register_multi_flags_validator(
  ["rounds", "smoke"],
  lambda f: f["rounds"] >= 5 or f["smoke"],
  message="--rounds below 5 needs --smoke",
)
_COLDSTART_ALGORITHMS = flags.DEFINE_list(
  "coldstart_algorithms",
  [],
  "Algorithms of --suite=coldstart (default: every registered one).",
)
_COLDSTART_TIMEOUT = flags.DEFINE_float(
  "coldstart_timeout_s",
  600.0,
  "--suite=coldstart: seconds before a run is stopped (SIGTERM).",
)
_RSS_ROUNDS = flags.DEFINE_integer(
  "rss_rounds", 100, "Rounds of the memory-growth run."
)
_RSS_ALGORITHMS_FLAG = flags.DEFINE_list(
  "rss_algorithms",
  ["fedavg", "adaptivefl"],
  "Algorithms of the memory-growth runs (fedavg, adaptivefl).",
)
_BASE_CONFIGS_FLAG = flags.DEFINE_list(
  "base_configs",
  ["compute", "overhead"],
  "Configurations of suite base (compute, overhead).",
)
_DATASET = flags.DEFINE_string("dataset", "mnist5k", "Data set.")
_MODEL = flags.DEFINE_string(
  "model",
  None,
  "Model of suites hetero (default vgg16_eighth), sparse"
  " (mnist_cnn) and gkt (fedgkt_edge_resnet8); base and coldstart choose"
  " their own.",
)
_CLIENTS = flags.DEFINE_integer(
  "num_clients",
  20,
  "Clients in all (coldstart: the pipeline's default unless given).",
)
_COHORT = flags.DEFINE_integer(
  "clients_per_round",
  10,
  "Cohort size (gkt: 4 unless given; coldstart:"
  " the pipeline's default unless given).",
)
_CLIENT_DATA = flags.DEFINE_enum(
  "client_data",
  "sent",
  ["sent", "files"],
  "Our program's --client_data (suites that run `loop.run_experiment`):"
  " how the clients' samples reach the worker.",
)


CLIENT_LR = 0.05


def _config(**overrides):
  from tff_hetero.program import make_config  # pylint: disable=g-import-not-at-top

  settings = dict(
    algorithm="fedavg",
    dataset=_DATASET.value,
    model=_model(),
    partition="iid",
    num_clients=_CLIENTS.value,
    clients_per_round=_COHORT.value,
    local_epochs=1,
    batch_size=20,
    client_lr=CLIENT_LR,
    seed=0,
    checkpoint_every=10**6,
    progress=False,
    client_data=_CLIENT_DATA.value,
  )
  settings.update(overrides)
  return make_config(**settings)


_DEFAULT_MODELS = {
  "hetero": "vgg16_eighth",
  "gkt": "fedgkt_edge_resnet8",
}


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
  return collections.OrderedDict(
    [
      (f"{prefix}_rounds10to14_mib", round(start / 2**20, 1)),
      (f"{prefix}_rounds{last - 4}to{last}_mib", round(end / 2**20, 1)),
      (f"{prefix}_growth_pct", round(100.0 * (end - start) / start, 2)),
    ]
  )


def _spread(
  results: collections.OrderedDict, key: str, times
) -> collections.OrderedDict:
  """Sets `key` to the median of `times` (seconds), `key_min`, `key_max`."""
  results[key] = round(float(statistics.median(times)), 4)
  results[f"{key}_min"] = round(float(min(times)), 4)
  results[f"{key}_max"] = round(float(max(times)), 4)
  return results


def _timed_round_seconds(history) -> list[float]:
  """Each round's seconds from a run's history (`wall_time_s` is
  cumulative), less the first (warm-up) and the last (it evaluates)."""
  walls = [0.0] + [r["wall_time_s"] for r in history]
  return [b - a for a, b in zip(walls, walls[1:])][1:-1]


def _count_batches(dataset) -> int:
  return sum(1 for _ in dataset)


class _FloorClient(
  collections.namedtuple("_FloorClient", ["xs", "ys", "tail_x", "tail_y"])
):
  """One client's batches in memory: full batches stacked (xs [n, b, ...],
  ys [n, b]) and the smaller last batch, if any, apart (else None)."""

  @classmethod
  def of(cls, dataset):
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    batches = [(b["x"].numpy(), b["y"].numpy()) for b in dataset]
    tail = None
    if len(batches) > 1 and len(batches[-1][1]) != len(batches[0][1]):
      batches, tail = batches[:-1], batches[-1]
    if any(len(y) != len(batches[0][1]) for _, y in batches):
      raise ValueError("only a client dataset's last batch may be smaller")
    return cls(
      tf.constant(np.stack([x for x, _ in batches])),
      tf.constant(np.stack([y for _, y in batches])),
      None if tail is None else tf.constant(tail[0]),
      None if tail is None else tf.constant(tail[1]),
    )


class _FloorTrainer:
  """A model copy and one compiled function doing a client's local work.

  `trainer(client)` sets the model to `initial` and runs plain SGD
  (`v.assign_sub(lr * g)`, gradients of the mean sparse cross-entropy on
  logits, as the TFF model's loss) over the client's stacked batches in a
  `tf.range` loop (a `tf.while_loop` in the graph), then its last batch;
  `steps` counts the SGD steps taken.
  """

  def __init__(self, model_fn, initial, lr: float):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    model = model_fn()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    initial = [tf.constant(w) for w in initial]
    trainable = model.trainable_variables
    self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)

    def step(x, y):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
      for v, g in zip(trainable, tape.gradient(loss, trainable)):
        v.assign_sub(lr * g)
      self.steps.assign_add(1)

    @tf.function
    def train(xs, ys, tail_x, tail_y):
      for v, w in zip(model.variables, initial):
        v.assign(w)
      for i in tf.range(tf.shape(xs)[0]):
        step(xs[i], ys[i])
      if tail_x is not None:
        step(tail_x, tail_y)
      return self.steps.read_value()

    self._train = train

  def __call__(self, client: _FloorClient):
    return self._train(*client)


class _Floor:
  """The cohort's client work in plain TensorFlow, timed per round.

  Sequential: one `_FloorTrainer` runs the clients one after the other.
  Parallel: one thread per core (at most one per client), each with its own
  trainer (model copy, variables, compiled function) and a fixed share of
  the clients (client i to thread i mod threads), so that a sitting's
  warm-up round traces every function its timed rounds call. Every round
  must take as many SGD steps as the client datasets hold batches.
  """

  VARIANTS = ("sequential", "parallel")

  def __init__(self, task, datasets, lr: float):
    self._clients = [_FloorClient.of(d) for d in datasets]
    self.batches = sum(_count_batches(d) for d in datasets)
    initial = task.model_fn().get_weights()
    self.threads = max(1, min(len(os.sched_getaffinity(0)), len(self._clients)))
    self._trainers = [
      _FloorTrainer(task.model_fn, initial, lr) for _ in range(self.threads)
    ]
    self._shares = [
      self._clients[k :: self.threads] for k in range(self.threads)
    ]
    self.times = {name: [] for name in self.VARIANTS}
    self.cpu = {name: [] for name in self.VARIANTS}

  def _steps(self) -> int:
    return sum(int(t.steps.numpy()) for t in self._trainers)

  def sitting(self, timed: int) -> None:
    """Times each variant over `timed` rounds after one warm-up round,
    adding each round's seconds to `times` and its CPU seconds to `cpu`."""
    import concurrent.futures  # pylint: disable=g-import-not-at-top

    def sequential():
      for client in self._clients:
        self._trainers[0](client)

    def work(k):
      for client in self._shares[k]:
        self._trainers[k](client)

    with concurrent.futures.ThreadPoolExecutor(self.threads) as pool:

      def parallel():
        for future in [pool.submit(work, k) for k in range(self.threads)]:
          future.result()

      for name, round_fn in zip(self.VARIANTS, (sequential, parallel)):
        for round_num in range(timed + 1):
          before = self._steps()
          cpu_before = _cpu_seconds(psutil.Process(), children=False)
          start = time.perf_counter()
          round_fn()
          elapsed = time.perf_counter() - start
          cpu = _cpu_seconds(psutil.Process(), children=False) - cpu_before
          if self._steps() - before != self.batches:
            raise AssertionError(
              f"floor ({name}) took {self._steps() - before} SGD steps in a"
              f" round; the client datasets hold {self.batches} batches"
            )
          if round_num:  # Round 0 is warm-up (tracing).
            self.times[name].append(elapsed)
            self.cpu[name].append(cpu)

  def results(self) -> collections.OrderedDict:
    """Median, fastest and slowest round of each variant over every
    sitting, and the better variant's as `floor_round_s`."""
    results = collections.OrderedDict(
      steps_per_round=self.batches, floor_threads=self.threads
    )
    for name in self.VARIANTS:
      _spread(results, f"floor_{name}_round_s", self.times[name])
    best = min(self.VARIANTS, key=lambda n: results[f"floor_{n}_round_s"])
    for suffix in ("", "_min", "_max"):
      results[f"floor_round_s{suffix}"] = results[
        f"floor_{best}_round_s{suffix}"
      ]
    results["floor_best"] = best
    results["floor_cpu_s"] = round(statistics.median(self.cpu[best]), 3)
    return results


# The `base` suite's configurations: (model, local epochs, batch size).
BASE_CONFIGS = collections.OrderedDict(
  compute=("mnist_cnn_feddst", 5, 50),
  overhead=("mnist_cnn", 1, 20),
)


def _bench_config(
  name: str, model: str, epochs: int, batch: int, root: str
) -> collections.OrderedDict:
  """Ours, TFF and the floor on one `BASE_CONFIGS` entry (see the module
  docstring); keys without the configuration's prefix."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  timed = _ROUNDS.value
  shape = dict(model=model, local_epochs=epochs, batch_size=batch)
  lr = CLIENT_LR
  results = collections.OrderedDict()

  experiment = loop.build_experiment(_config(rounds=1, **shape))
  fed, task = experiment.federated_data, experiment.task
  cohort = list(fed.client_ids)[: _COHORT.value]
  datasets = [
    data_lib.make_client_dataset(
      fed.client_train(cid),
      batch_size=batch,
      local_epochs=epochs,
      shuffle_seed=i,
    )
    for i, cid in enumerate(cohort)
  ]

  # The floor is timed in two sittings, before our program and after TFF's
  # rows, so that a drift of the machine's speed over the minutes between
  # them moves the floor as it moves the others.
  floor = _Floor(task, datasets, lr)
  floor.sitting(timed)

  # Ours: the whole program, rounds timed from its own history. Round 1 is
  # warm-up; the last round also evaluates (and checkpoints) and is dropped.
  cpu = {}

  def record(round_num, row):
    del row
    me = psutil.Process()
    own = _cpu_seconds(me, children=False)
    cpu[round_num] = (own, _cpu_seconds(me) - own)

  result = loop.run_experiment(
    _config(
      rounds=timed + 2,
      eval_every=10**6,
      root_output_dir=root,
      experiment_name=name,
      **shape,
    ),
    on_round=record,
  )
  history = result.report["history"]
  times = _timed_round_seconds(history)
  if len(times) != timed or any(
    r["clients"] != _COHORT.value for r in history[1:-1]
  ):
    raise AssertionError(
      f"{name}: the program's timed rounds did not each"
      f" train {_COHORT.value} clients"
    )
  _spread(results, "ours_round_s", times)
  # CPU seconds of the same rounds (2..timed+1), the driver's and its
  # workers' apart.
  for index, key in enumerate(("ours_driver_cpu_s", "ours_worker_cpu_s")):
    results[key] = round(
      statistics.median(
        cpu[r][index] - cpu[r - 1][index] for r in range(2, timed + 2)
      ),
      3,
    )

  # TFF's builder, driven directly on the same runtime: with its default
  # client loop (`Dataset.reduce`), and with the loop ours uses; that one
  # also on datasets that read the clients' samples from files
  # (`--client_data=files`), with the bytes each round sends the worker.
  with data_lib.ClientFiles() as client_files:
    stored = [
      data_lib.make_client_dataset(
        client_files.store(cid, fed.client_train(cid)),
        batch_size=batch,
        local_epochs=epochs,
        shuffle_seed=i,
      )
      for i, cid in enumerate(cohort)
    ]
    iterator = tff.learning.LoopImplementation.DATASET_ITERATOR
    for key, loop_implementation, round_data in (
      ("tff", tff.learning.LoopImplementation.DATASET_REDUCE, datasets),
      ("tff_iterator", iterator, datasets),
      ("tff_iterator_files", iterator, stored),
    ):
      process = tff.learning.algorithms.build_weighted_fed_avg(
        task.tff_model_fn(plain_graph_methods=False),
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(lr),
        loop_implementation=loop_implementation,
      )
      with runtime.local_execution() as handle:
        state = process.initialize()
        state = process.next(state, round_data).state  # Warm-up.
        times = []
        sent = handle.rpc_bytes()["sent"]
        for _ in range(timed):
          start = time.perf_counter()
          state = process.next(state, round_data).state
          times.append(time.perf_counter() - start)
        sent = handle.rpc_bytes()["sent"] - sent
      _spread(results, f"{key}_round_s", times)
      if key != "tff":
        results[f"{key}_rpc_mib_sent"] = round(sent / timed / 2**20, 3)

  floor.sitting(timed)
  results.update(floor.results())
  floor_s = results["floor_round_s"]
  results["ours_over_floor"] = round(results["ours_round_s"] / floor_s, 3)
  results["tff_over_floor"] = round(results["tff_round_s"] / floor_s, 3)
  results["tff_iterator_over_floor"] = round(
    results["tff_iterator_round_s"] / floor_s, 3
  )
  results["ours_over_tff"] = round(
    results["ours_round_s"] / results["tff_round_s"], 3
  )
  results["ours_over_tff_iterator"] = round(
    results["ours_round_s"] / results["tff_iterator_round_s"], 3
  )
  sizes = sorted({len(fed.client_train(c)) for c in fed.client_ids})
  results["setup"] = (
    f"{_DATASET.value}/{model}, {_CLIENTS.value} iid clients of"
    f" {'/'.join(map(str, sizes))} examples, cohort {_COHORT.value},"
    f" batch {batch}, {epochs} epoch(s), SGD {lr}, median/min/max of"
    f" {timed} rounds after 1 warm-up (the floor's: of 2 x {timed}, in two"
    " sittings)"
  )
  return results


def _base_configs() -> list[str]:
  """`--base_configs`, checked before anything runs, each name once."""
  names = list(dict.fromkeys(_BASE_CONFIGS_FLAG.value))
  for name in names:
    if name not in BASE_CONFIGS:
      raise app.UsageError(
        f"--base_configs: {name!r} is not one of {', '.join(BASE_CONFIGS)}"
      )
  return names


def bench_base() -> collections.OrderedDict:
  results = collections.OrderedDict()
  with tempfile.TemporaryDirectory() as root:
    for name in _base_configs():
      model, epochs, batch = BASE_CONFIGS[name]
      for key, value in _bench_config(name, model, epochs, batch, root).items():
        results[f"{name}_{key}"] = value

    results.update(_memory_growth(root))
  return results


def _memory_growth(root: str) -> collections.OrderedDict:
  """Memory growth over long runs of our pipeline (overhead configuration):
  FedAvg, then AdaptiveFL (default tiers and pool, RL selection)."""
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  results = collections.OrderedDict()
  model, epochs, batch = BASE_CONFIGS["overhead"]
  rss_rounds = max(_RSS_ROUNDS.value, 20)
  for algorithm in _RSS_ALGORITHMS_FLAG.value:
    if algorithm not in RSS_ALGORITHMS:
      raise app.UsageError(
        f"--rss_algorithms: {algorithm!r} is not one of"
        f" {', '.join(RSS_ALGORITHMS)}"
      )
    prefix = RSS_ALGORITHMS[algorithm]
    rss = {}

    def record(round_num, row, rss=rss):
      del row
      rss[round_num] = _rss_bytes()

    loop.run_experiment(
      _config(
        algorithm=algorithm,
        rounds=rss_rounds,
        eval_every=10,
        root_output_dir=root,
        experiment_name=prefix,
        model=model,
        local_epochs=epochs,
        batch_size=batch,
      ),
      on_round=record,
    )
    results.update(_rss_growth(rss, prefix))
  return results


def bench_rss() -> collections.OrderedDict:
  """Suite `rss`: only the memory-growth runs of suite `base`."""
  with tempfile.TemporaryDirectory() as root:
    return _memory_growth(root)


# `rss_*` runs of suite base: algorithm -> key prefix.
RSS_ALGORITHMS = collections.OrderedDict(
  fedavg="rss", adaptivefl="rss_adaptivefl"
)


def _median_next_s(
  algorithm, clients_for_round, warmup: int, timed: int, handle=None
) -> tuple[float, list, dict]:
  """Median seconds of `algorithm.next` over `timed` rounds after `warmup`.

  `clients_for_round(state, round_num, client_states)` gives the cohort;
  `client_states` holds the client states earlier rounds returned. With the
  execution `handle`, also the mean serialized RPC bytes per timed round
  between driver and worker (`sent`, `received`).
  """
  state = algorithm.initialize()
  times, cohorts, client_states = [], [], {}
  rpc = collections.Counter()
  for round_num in range(1, warmup + timed + 1):
    clients = clients_for_round(state, round_num, client_states)
    before = handle.rpc_bytes() if handle else {}
    start = time.perf_counter()
    output = algorithm.next(state, round_num, clients)
    state = output.state
    client_states.update(output.client_states)
    if round_num > warmup:
      times.append(time.perf_counter() - start)
      cohorts.append(clients)
      if handle:
        for direction, total in handle.rpc_bytes().items():
          rpc[direction] += total - before[direction]
  per_round = {d: int(round(n / timed)) for d, n in rpc.items()}
  return float(statistics.median(times)), cohorts, per_round


def _hetero_cohort():
  """Suite hetero's setting: (config, experiment, client(cid, assignment,
  capacity) -> ClientRound, the cohort's client ids)."""
  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import api  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  config = _config(rounds=1, client_momentum=0.5)
  experiment = loop.build_experiment(config)
  fed, population = experiment.federated_data, experiment.population
  datasets = {
    cid: data_lib.make_client_dataset(
      fed.client_train(cid), batch_size=20, local_epochs=1, shuffle_seed=i
    )
    for i, cid in enumerate(fed.client_ids)
  }

  def client(cid, assignment=None, capacity=True):
    return api.ClientRound(
      client_id=cid,
      dataset=datasets[cid],
      num_examples=len(fed.client_train(cid)),
      capacity=population.capacity_at_round(cid, 1) if capacity else None,
      tier=population.tier_of(cid),
      assignment=assignment,
    )

  return config, experiment, client, list(fed.client_ids)[: _COHORT.value]


def _adaptivefl_mixed(config, experiment, client):
  """AdaptiveFL with its default pool and RL selection, and the function
  planning each round's cohort (suite hetero's `adaptivefl_mixed`)."""
  from tff_hetero.algorithms import adaptivefl  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import evolve_config  # pylint: disable=g-import-not-at-top
  from tff_hetero.program.sampling import CohortSampler  # pylint: disable=g-import-not-at-top

  fed, task = experiment.federated_data, experiment.task
  mixed = adaptivefl.AdaptiveFL(
    task,
    adaptivefl.pool_from_config(
      evolve_config(config, algorithm="adaptivefl"), task
    ),
    fed.client_ids,
    client_lr=config.client_lr,
    client_momentum=config.client_momentum,
  )
  sampler = CohortSampler(0)

  def planned(state, round_num, unused_client_states):
    plan = mixed.plan_round(
      state, round_num, fed.client_ids, _COHORT.value, sampler
    )
    return [client(a.client_id, a.payload) for a in plan]

  return mixed, planned


def bench_hetero() -> collections.OrderedDict:
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import adaptivefl  # pylint: disable=g-import-not-at-top
  from tff_hetero.submodels import pools  # pylint: disable=g-import-not-at-top

  timed = _ROUNDS.value
  config, experiment, client, cohort = _hetero_cohort()
  fed, task = experiment.federated_data, experiment.task
  results = collections.OrderedDict()

  def record_bytes(name, per_round):
    for direction in ("sent", "received"):
      results[f"{name}_rpc_mib_{direction}"] = round(
        per_round[direction] / 2**20, 2
      )

  with runtime.local_execution() as handle:
    fedavg = experiment.algorithm  # config.algorithm == "fedavg"
    results["fedavg_round_s"], _, rpc = _median_next_s(
      fedavg, lambda s, r, _: [client(c) for c in cohort], 1, timed, handle
    )
    record_bytes("fedavg", rpc)

    full_pool = pools.SubModelPool(
      task.width_units,
      (
        pools.PoolMember(
          0,
          "L1",
          "L",
          1.0,
          len(task.width_units),
          tuple(u.full_width for u in task.width_units),
        ),
      ),
    )
    full_only = adaptivefl.AdaptiveFL(
      task,
      full_pool,
      fed.client_ids,
      client_lr=config.client_lr,
      client_momentum=config.client_momentum,
    )
    results["adaptivefl_full_pool_round_s"], _, rpc = _median_next_s(
      full_only,
      lambda s, r, _: [client(c, 0, capacity=False) for c in cohort],
      1,
      timed,
      handle,
    )
    record_bytes("adaptivefl_full_pool", rpc)

    mixed, planned = _adaptivefl_mixed(config, experiment, client)
    results["adaptivefl_mixed_round_s"], cohorts, rpc = _median_next_s(
      mixed, planned, 6, timed, handle
    )
    record_bytes("adaptivefl_mixed", rpc)
    groups = []
    for clients in cohorts:
      kinds = set()
      for c in clients:
        trained = adaptivefl.choose_trained_member(
          mixed.pool, mixed.params, c.assignment, c.capacity.params
        )
        kinds.add((c.assignment, trained))
      groups.append(len(kinds))
    results["adaptivefl_mixed_groups"] = round(statistics.mean(groups), 2)
  results["full_pool_vs_fedavg"] = round(
    results["adaptivefl_full_pool_round_s"] / results["fedavg_round_s"], 3
  )
  results["setup"] = (
    f"{_DATASET.value}/{_model()}, {_CLIENTS.value} iid"
    f" clients, cohort {_COHORT.value}, batch 20, 1 epoch,"
    f" SGD momentum 0.5, median of {timed} rounds"
  )
  return results


def _interleaved_seconds(rounds, timed: int, after_warmup=None) -> dict:
  """Seconds of `timed` rounds of each generator in `rounds` (key ->
  generator yielding one round's seconds per `next`), after one warm-up
  round of each (which builds and runs the computations once), interleaved:
  one round of each in turn, each taking each place in the order in turn,
  so that a change in the machine's load reaches all alike."""
  for generator in rounds.values():
    next(generator)
  if after_warmup is not None:
    after_warmup()
  times = {key: [] for key in rounds}
  keys = list(rounds)
  for cycle in range(timed):
    shift = cycle % len(keys)
    for key in keys[shift:] + keys[:shift]:
      times[key].append(next(rounds[key]))
  return times


def bench_sparse() -> collections.OrderedDict:
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import api  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import cohort_positions  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.sparse import client_update  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.sparse import computations  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.sparse import feddst  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.sparse import fedsgc  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import evolve_config  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  timed = _ROUNDS.value
  clients_total = max(_CLIENTS.value, 100)
  config = _config(
    rounds=1, num_clients=clients_total, min_samples_per_client=1
  )
  experiment = loop.build_experiment(config)
  fed, task = experiment.federated_data, experiment.task
  ids = list(fed.client_ids)
  cohort = ids[: _COHORT.value]
  results = collections.OrderedDict()

  def round_inputs(algorithm):
    datasets = {
      c: algorithm.client_dataset(
        fed.client_train(c), batch_size=20, local_epochs=1, shuffle_seed=i
      )
      for i, c in enumerate(cohort)
    }

    def clients(state, round_num, stored):
      del state, round_num
      return [
        api.ClientRound(
          client_id=c,
          dataset=datasets[c],
          num_examples=len(fed.client_train(c)),
          state=stored.get(c, algorithm.initial_client_state()),
        )
        for c in cohort
      ]

    return clients

  rpc = collections.defaultdict(collections.Counter)

  def rounds_of(algorithm, latest, key, handle):
    """Runs one round per `next()` and yields its seconds; `latest[0]` is
    the state after it; `rpc[key]` adds up its driver<->worker bytes."""
    state, stored = algorithm.initialize(), {}
    clients = round_inputs(algorithm)
    round_num = 0
    while True:
      round_num += 1
      cohort_now = clients(state, round_num, stored)
      before = handle.rpc_bytes()
      start = time.perf_counter()
      output = algorithm.next(state, round_num, cohort_now)
      seconds = time.perf_counter() - start
      for direction, total in handle.rpc_bytes().items():
        rpc[key][direction] += total - before[direction]
      state = output.state
      latest[0] = state
      stored.update(output.client_states)
      yield seconds

  with runtime.local_execution() as handle:
    runs = collections.OrderedDict(fedavg_round_s=experiment.algorithm)
    for key, build, every in (
      ("fedsgc_round_s", fedsgc.build_fedsgc, 0),
      ("fedsgc_readjust_round_s", fedsgc.build_fedsgc, 1),
      ("feddst_round_s", feddst.build_feddst, 0),
    ):
      runs[key] = build(
        evolve_config(
          config,
          algorithm=key.split("_")[0],
          sparsity=0.8,
          readjust_every=every,
          readjust_begin_epoch=1,
          readjust_end_epoch=10**6,
        ),
        task,
        ids,
      )
    # Interleaved: one round of each algorithm in turn, so that a change in
    # the machine's load reaches every algorithm alike; the ratio is the
    # median of the ratios of rounds run side by side.
    latest = {key: [None] for key in runs}
    rounds = {
      key: rounds_of(a, latest[key], key, handle) for key, a in runs.items()
    }
    times = _interleaved_seconds(rounds, timed, after_warmup=rpc.clear)
    for key, seconds in times.items():
      _spread(results, key, seconds)
      run = key[: -len("_round_s")]
      for direction in ("sent", "received"):
        results[f"{run}_rpc_mib_{direction}"] = round(
          rpc[key][direction] / timed / 2**20, 3
        )
    ratios = [
      s / a for s, a in zip(times["fedsgc_round_s"], times["fedavg_round_s"])
    ]
    sgc, sgc_state = runs["fedsgc_round_s"], latest["fedsgc_round_s"][0]
    # The server step with 100 remembered clients (rows filled as uploads).
    rng = np.random.default_rng(0)
    memory = sgc_state.memory
    memory = memory._replace(
      values=[
        rng.normal(size=v.shape).astype(np.float32) for v in memory.values
      ],
      masks=[
        (rng.random(m.shape) < 0.2).astype(np.uint8) for m in memory.masks
      ],
      weight=np.full(memory.weight.shape, 20.0, np.float32),
    )
    step = sgc.rounds.server_steps[(False, False)]
    rows = list(range(len(cohort)))
    forgotten = tf.nest.map_structure(lambda a: a[rows], memory)
    # The cohort's new rows as a round without readjustment gathers them:
    # packed at the global model's masks, with their reports.
    kept = sum(
      int(np.count_nonzero(m))
      for m in computations.full_masks(
        sgc.layout, sgc_state.model.trainable, sgc_state.model.masks
      )
    )
    zeros = np.zeros(len(rows), np.int64)
    gathered = cohort_positions.Gathered(
      rows=(
        computations.PackedRow(
          values=rng.normal(size=(len(rows), kept)).astype(np.float32),
          weight=np.full(len(rows), 20.0, np.float32),
        ),
        client_update.ClientReport(
          upload_bytes=zeros,
          epochs=zeros,
          gradient_examples=zeros,
          non_finite=zeros.astype(np.int32),
        ),
      ),
      positions=np.arange(len(rows), dtype=np.int32),
    )
    durations = []
    for _ in range(timed + 1):
      # The driver forgets the cohort's rows, the worker runs the step.
      start = time.perf_counter()
      others = computations.without_rows(
        sgc.layout, computations.MaskedSums(*sgc_state.sums), forgotten
      )
      step(sgc_state.model, others, gathered)
      durations.append(time.perf_counter() - start)
    results["fedsgc_server_step_s"] = float(statistics.median(durations[1:]))
    received = forgotten
    durations = []
    for _ in range(timed):
      start = time.perf_counter()
      sgc._remember(memory, rows, received, [True] * len(rows))  # pylint: disable=protected-access
      durations.append(time.perf_counter() - start)
    results["fedsgc_memory_update_s"] = float(statistics.median(durations))
  results["fedsgc_vs_fedavg"] = round(float(statistics.median(ratios)), 3)
  results["fedsgc_vs_fedavg_min"] = round(float(min(ratios)), 3)
  results["fedsgc_vs_fedavg_max"] = round(float(max(ratios)), 3)
  results["setup"] = (
    f"{_DATASET.value}/{_model()}, {clients_total} iid"
    f" clients, cohort {_COHORT.value}, batch 20, 1 epoch,"
    f" sparsity 0.8, {timed} interleaved rounds of each (medians)"
  )
  return results


# Suite `scale`: (name, population, cohort).
SCALE_CONFIGS = (
  ("pop100_cohort10", 100, 10),
  ("pop1000_cohort10", 1000, 10),
  ("pop1000_cohort100", 1000, 100),
)
# One batch per client: 40 examples at 100 clients of mnist5k, 4 at 1,000.
SCALE_BATCH = 40


def bench_scale() -> collections.OrderedDict:
  """Our program's FedAvg at each `SCALE_CONFIGS` entry (module docstring)."""
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  timed = _ROUNDS.value
  results = collections.OrderedDict()
  times = {name: [] for name, _, _ in SCALE_CONFIGS}
  rss = {name: [] for name, _, _ in SCALE_CONFIGS}
  with tempfile.TemporaryDirectory() as root:
    # Runs of the three in turn, each taking each place in the order once,
    # so that a change in the machine's load reaches every size alike.
    for cycle in range(len(SCALE_CONFIGS)):
      order = SCALE_CONFIGS[cycle:] + SCALE_CONFIGS[:cycle]
      for name, population, cohort in order:

        def record(round_num, row, name=name):
          del round_num, row
          rss[name].append(_rss_bytes())

        result = loop.run_experiment(
          _config(
            num_clients=population,
            clients_per_round=cohort,
            min_samples_per_client=1,
            batch_size=SCALE_BATCH,
            rounds=timed + 2,
            eval_every=10**6,
            root_output_dir=root,
            experiment_name=f"{name}_{cycle}",
          ),
          on_round=record,
        )
        history = result.report["history"]
        times[name] += _timed_round_seconds(history)
        if any(r["clients"] != cohort for r in history):
          raise AssertionError(
            f"{name}: a round did not train {cohort} clients"
          )
  for name, _, _ in SCALE_CONFIGS:
    _spread(results, f"{name}_round_s", times[name])
    results[f"{name}_rss_mib"] = round(max(rss[name]) / 2**20, 1)
  results["population_ratio"] = round(
    results["pop1000_cohort10_round_s"] / results["pop100_cohort10_round_s"], 3
  )
  results["cohort_ratio"] = round(
    results["pop1000_cohort100_round_s"] / results["pop1000_cohort10_round_s"],
    3,
  )
  results["setup"] = (
    f"{_DATASET.value}/{_model()} FedAvg, iid, batch {SCALE_BATCH} (one"
    f" batch per client at either population), 1 epoch, median/min/max of"
    f" {len(SCALE_CONFIGS)} runs' {timed} rounds after 1 warm-up each"
  )
  return results


def _gkt_run(mode: str, rounds: int, cohort: int) -> collections.OrderedDict:
  """One FedGKT run in `mode`: round and server-step times, memory growth."""
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  rss, rows = {}, {}

  def record(round_num, row):
    rss[round_num] = _rss_bytes()
    rows[round_num] = row

  with tempfile.TemporaryDirectory() as root:
    loop.run_experiment(
      _config(
        algorithm="fedgkt",
        gkt_server_model=_GKT_SERVER.value,
        clients_per_round=cohort,
        rounds=rounds,
        eval_every=10**6,
        gkt_mode=mode,
        root_output_dir=root,
        experiment_name="gkt",
      ),
      on_round=record,
    )
  # Round 1 traces the computations; the last round also evaluates.
  timed = range(2, rounds)
  walls = {
    r: rows[r]["wall_time_s"] - rows[r - 1]["wall_time_s"] for r in timed
  }
  prefix = "fedgkt" if mode == "sync" else "fedgkt_async"
  results = collections.OrderedDict()
  results[f"{prefix}_round_s"] = float(statistics.median(walls.values()))
  results[f"{prefix}_server_step_s"] = float(
    statistics.median(rows[r]["server_step_s"] for r in timed)
  )
  results[f"{prefix}_clients_per_round"] = round(
    statistics.mean(rows[r]["clients"] for r in timed), 2
  )
  results.update(_rss_growth(rss, f"{prefix}_rss"))
  results[f"{prefix}_feature_mib_per_round"] = round(
    statistics.mean(rows[r]["feature_bytes"] for r in timed) / 2**20, 2
  )
  return results


def _gkt_rpc_bytes(cohort: int, rounds: int) -> collections.OrderedDict:
  """Sync FedGKT's driver<->worker gRPC bytes per round, rounds 2..`rounds`
  (the same cohort each round, so every client holds an answer after round
  1 and its teacher logits travel in its data), and on two workers each
  worker's CPU seconds over those rounds."""
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import api  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  experiment = loop.build_experiment(
    _config(
      algorithm="fedgkt",
      gkt_server_model=_GKT_SERVER.value,
      clients_per_round=cohort,
    )
  )
  algorithm, fed = experiment.algorithm, experiment.federated_data
  ids = list(fed.client_ids)[:cohort]

  def clients(state, round_num, client_states):
    del state
    out = []
    for cid in ids:
      held = client_states.get(cid, algorithm.initial_client_state())
      out.append(
        api.ClientRound(
          client_id=cid,
          num_examples=len(fed.client_train(cid)),
          dataset=algorithm.client_dataset(
            fed.client_train(cid),
            batch_size=20,
            local_epochs=1,
            shuffle_seed=round_num,
            state=held,
          ),
          state=held,
        )
      )
    return out

  with runtime.local_execution() as handle:
    _, _, rpc = _median_next_s(algorithm, clients, 1, rounds - 1, handle)
  results = collections.OrderedDict(
    (f"fedgkt_rpc_mib_{direction}", round(rpc[direction] / 2**20, 2))
    for direction in ("sent", "received")
  )
  # Two workers (TFF's mergeable context): each worker's CPU seconds over
  # rounds 2..`rounds`. The server step runs on one worker when the round's
  # results are all SERVER-placed (`fedgkt_computations`).
  with runtime.local_execution(num_workers=2) as handle:
    processes = [psutil.Process(w.pid) for w in handle.workers]
    state, client_states = algorithm.initialize(), {}
    for round_num in range(1, rounds + 1):
      if round_num == 2:
        before = [_cpu_seconds(p) for p in processes]
      output = algorithm.next(
        state, round_num, clients(state, round_num, client_states)
      )
      state = output.state
      client_states.update(output.client_states)
    spent = [_cpu_seconds(p) - b for p, b in zip(processes, before)]
  results["fedgkt_two_worker_cpu_s"] = sorted(
    (round(s, 1) for s in spent), reverse=True
  )
  return results


def _cpu_seconds(process, *, children: bool = True) -> float:
  """User + system CPU seconds of `process` and, unless `children` is
  False, of its descendants alive now (TFF workers, the compiler process)."""
  total = 0.0
  for p in [process, *(process.children(recursive=True) if children else ())]:
    try:
      times = p.cpu_times()
    except psutil.NoSuchProcess:
      continue
    total += times.user + times.system
  return total


def bench_gkt() -> collections.OrderedDict:
  rounds = max(_GKT_ROUNDS.value, 20)
  cohort = _COHORT.value if _COHORT.present else 4
  results = collections.OrderedDict()
  if not _GKT_RPC_ONLY.value:
    for mode in ("sync", "async"):
      results.update(_gkt_run(mode, rounds, cohort))
  results.update(_gkt_rpc_bytes(cohort, _ROUNDS.value + 1))
  results["setup"] = (
    f"{_DATASET.value}/{_model()} + {_GKT_SERVER.value},"
    f" {_CLIENTS.value} iid clients, cohort {cohort} (async:"
    f" {cohort} devices at work, tiers 4:3:3 at 0.25/0.5/1"
    f" of the MAC capacity), batch 20, 1 client and 1"
    f" server epoch, median of rounds 2..{rounds - 1}"
  )
  return results


# `--suite=coldstart`: models of the algorithms that cannot train the default.
_GKT_MODELS = (
  "--model=fedgkt_edge_resnet8",
  "--gkt_server_model=fedgkt_server_resnet19",
)
_COLDSTART_FLAGS = {
  "fedgkt": _GKT_MODELS,
  "split_learning": _GKT_MODELS,
  # The depth algorithms' own default model (the transformer).
  **dict.fromkeys(
    (
      "inclusivefl",
      "inclusivefl_all_large",
      "inclusivefl_all_small",
      "exclusivefl",
      "inclusivefl_local",
    ),
    (),
  ),
}
_COLDSTART_MODEL = "--model=mnist_cnn"
# If the registry cannot be imported (its names as of this script).
_REGISTERED = (
  "fedavg",
  "fedprox",
  "fedadam",
  "adaptivefl",
  "heterofl",
  "all_large",
  "decoupled",
  "fedsgc",
  "feddst",
  "prunefl",
  "grasp",
  "fedgkt",
  "split_learning",
)
COLDSTART_GOAL_S = 30.0


def _registered_algorithms() -> list[str]:
  try:
    from tff_hetero.algorithms import registry  # pylint: disable=g-import-not-at-top
  except ImportError:
    return list(_REGISTERED)
  return list(registry.ALGORITHMS)


def _last_line(*texts: str) -> str:
  for text in texts:
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    if lines:
      return lines[-1]
  return ""


def _coldstart_run(name: str, root: str) -> collections.OrderedDict:
  """One round of `name` in a fresh `python -m pipelines.train` process."""
  import csv  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top

  from tff_hetero.runtime import testing as proc_testing  # pylint: disable=g-import-not-at-top

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [
    sys.executable,
    "-m",
    "pipelines.train",
    f"--algorithm={name}",
    f"--dataset={_DATASET.value}",
    "--rounds=1",
    "--noprogress",
    f"--root_output_dir={root}",
    f"--experiment_name={name}",
    *_COLDSTART_FLAGS.get(name, (_COLDSTART_MODEL,)),
  ]
  for flag in (_CLIENTS, _COHORT):
    if flag.present:
      command.append(f"--{flag.name}={flag.value}")
  tag, env = proc_testing.tagged_env()
  results = collections.OrderedDict()
  started = time.time()
  start = time.perf_counter()
  proc = subprocess.Popen(
    command,
    cwd=repo,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    out, err = proc.communicate(timeout=_COLDSTART_TIMEOUT.value)
    failure = (
      None
      if proc.returncode == 0
      else (f"error (exit {proc.returncode}): {_last_line(err, out)}")
    )
  except subprocess.TimeoutExpired:
    proc.terminate()  # SIGTERM: the pipeline stops its worker and exits.
    try:
      out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
      proc.kill()  # Its worker, if any, is found below by its tag.
      out, err = proc.communicate()
    failure = (
      f"timeout after {_COLDSTART_TIMEOUT.value:g} s: {_last_line(err, out)}"
    )
  elapsed = time.perf_counter() - start
  leftover = [w.pid for w in proc_testing.worker_processes(tag=tag)]
  leftover += proc_testing.compiler_processes(tag=tag)
  leftover = proc_testing.wait_until_gone(leftover, timeout_s=10)
  if leftover:  # The run's own workers, orphaned: recorded, then stopped.
    results[f"coldstart_{name}_workers_left"] = len(leftover)
    for pid in leftover:
      try:
        os.kill(pid, signal.SIGTERM)
      except ProcessLookupError:
        pass
  if failure is not None:
    results[f"coldstart_{name}_s"] = failure
    return results
  results[f"coldstart_{name}_s"] = round(elapsed, 2)
  metrics = os.path.join(root, name, "metrics.csv")
  if not os.path.exists(metrics):
    results[f"coldstart_{name}_s"] = "error: the run wrote no metrics.csv"
    return results
  # metrics.csv is last written when round 1's row is released.
  results[f"coldstart_{name}_first_round_s"] = round(
    os.stat(metrics).st_mtime - started, 2
  )
  with open(metrics, newline="") as f:
    first = next(csv.DictReader(f))
  results[f"coldstart_{name}_round1_wall_s"] = float(first["wall_time_s"])
  return results


def bench_coldstart() -> collections.OrderedDict:
  names = _COLDSTART_ALGORITHMS.value or _registered_algorithms()
  results = collections.OrderedDict()
  slow = []
  with tempfile.TemporaryDirectory() as root:
    for name in names:
      results.update(_coldstart_run(name, root))
      first = results.get(f"coldstart_{name}_first_round_s")
      if first is None or first >= COLDSTART_GOAL_S:
        slow.append(name)
  results["coldstart_goal_s"] = COLDSTART_GOAL_S
  results["coldstart_over_goal"] = slow
  cohort = ", ".join(
    f"--{f.name}={f.value}" if f.present else f"the pipeline's {f.name}"
    for f in (_CLIENTS, _COHORT)
  )
  by_flags = collections.defaultdict(list)
  for name, flags_of in sorted(_COLDSTART_FLAGS.items()):
    by_flags[" ".join(flags_of) or "the algorithm's default model"].append(name)
  exceptions = "; ".join(
    f"{described} for {', '.join(names)}"
    for described, names in by_flags.items()
  )
  results["setup"] = (
    f"python -m pipelines.train --rounds=1 on {_DATASET.value}, {cohort},"
    f" {_COLDSTART_MODEL[2:]} ({exceptions}), other flags at their"
    " defaults; one fresh process per algorithm, run one at a time"
  )
  return results


def bench_depth() -> collections.OrderedDict:
  """InclusiveFL's round (three depth groups) against FedAvg of the deepest
  model on the same cohort, and its server step (see the module docstring)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import api  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import inclusivefl  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import evolve_config  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  timed = _ROUNDS.value
  config = _config(
    algorithm="inclusivefl",
    model=_MODEL.value or "transformer",
    rounds=1,
    tier_proportions="1:1:1",
  )
  experiment = loop.build_experiment(config)
  fed, population, task = (
    experiment.federated_data,
    experiment.population,
    experiment.task,
  )
  cohort = list(fed.client_ids)[: _COHORT.value]
  datasets = {
    cid: data_lib.make_client_dataset(
      fed.client_train(cid), batch_size=20, local_epochs=1, shuffle_seed=i
    )
    for i, cid in enumerate(cohort)
  }
  clients = [
    api.ClientRound(
      client_id=cid,
      dataset=datasets[cid],
      num_examples=len(fed.client_train(cid)),
      tier=population.tier_of(cid),
    )
    for cid in cohort
  ]
  results = collections.OrderedDict()
  ours = experiment.algorithm
  all_large = inclusivefl.build_inclusivefl(
    evolve_config(config, algorithm="inclusivefl_all_large"), task
  )
  deepest = all_large.groups[-1]
  process = tff.learning.algorithms.build_weighted_fed_avg(
    task.tff_model_fn(deepest.keras_fn, plain_graph_methods=False),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(CLIENT_LR),
    server_optimizer_fn=tff.learning.optimizers.build_adam(config.server_lr),
    client_weighting=tff.learning.ClientWeighting.UNIFORM,
    loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )
  data = [datasets[c] for c in cohort]

  def algorithm_rounds(algorithm):
    state = algorithm.initialize()
    for round_num in itertools.count(1):
      start = time.perf_counter()
      state = algorithm.next(state, round_num, clients).state
      yield time.perf_counter() - start

  def tff_rounds():
    state = process.initialize()
    while True:
      start = time.perf_counter()
      state = process.next(state, data).state
      yield time.perf_counter() - start

  with runtime.local_execution():
    rounds = collections.OrderedDict(
      inclusivefl_round_s=algorithm_rounds(ours),
      all_large_round_s=algorithm_rounds(all_large),
      tff_fedavg_large_round_s=tff_rounds(),
    )
    times = _interleaved_seconds(rounds, timed)
    for key, seconds in times.items():
      results[key] = float(statistics.median(seconds))
    # The server step alone, every group present.
    server_state = ours.initialize()
    updates = [
      [np.full_like(w, 1e-3) for w in m] for m in server_state["models"]
    ]
    counts = np.ones([len(ours.groups)], np.float32)
    ours.computations.server_step(server_state, updates, counts)  # Warm-up.
    step_times = []
    for _ in range(timed):
      start = time.perf_counter()
      ours.computations.server_step(server_state, updates, counts)
      step_times.append(time.perf_counter() - start)
    results["server_step_s"] = float(statistics.median(step_times))
  for key in ("inclusivefl", "all_large"):
    ratios = [
      a / b
      for a, b in zip(
        times[f"{key}_round_s"], times["tff_fedavg_large_round_s"]
      )
    ]
    results[f"{key}_over_tff_fedavg_large"] = round(
      float(statistics.median(ratios)), 3
    )
    results[f"{key}_over_tff_fedavg_large_min"] = round(min(ratios), 3)
    results[f"{key}_over_tff_fedavg_large_max"] = round(max(ratios), 3)
  tiers = collections.Counter(c.tier for c in clients)
  results["setup"] = (
    f"{_DATASET.value}/{config.model} depths"
    f" {':'.join(str(g.depth) for g in ours.groups)}, {_CLIENTS.value} iid"
    f" clients, cohort {_COHORT.value} ("
    + ", ".join(f"{t} {n}" for t, n in sorted(tiers.items()))
    + f"), batch 20, 1 epoch, SGD {CLIENT_LR}, FedAdam, medians of {timed}"
    " interleaved rounds after 1 warm-up; ratios: median of the per-cycle"
    " ratios"
  )
  return results


def bench_spatl() -> collections.OrderedDict:
  """SPATL's round (training, the agent's search and the salient upload)
  against TFF's FedAvg round of the whole model on the same cohort; the
  agent's share of a round from SPATL without selection on the same cohort,
  in a fine-tuning round (PPO updates) and after (search only)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import api  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.spatl import spatl  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import evolve_config  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  timed = _ROUNDS.value
  config = _config(
    algorithm="spatl", model=_MODEL.value or "mnist_cnn", rounds=1
  )
  experiment = loop.build_experiment(config)
  fed, task = experiment.federated_data, experiment.task
  cohort = list(fed.client_ids)[: _COHORT.value]

  def batches(arrays, seed):
    return data_lib.make_client_dataset(
      arrays, batch_size=20, local_epochs=1, shuffle_seed=seed
    )

  clients = [
    api.ClientRound(
      client_id=cid,
      dataset=batches(fed.client_train(cid), i),
      num_examples=len(fed.client_train(cid)),
      validation=batches(fed.client_validation(cid), None),
    )
    for i, cid in enumerate(cohort)
  ]
  ours = experiment.algorithm
  no_selection = spatl.build_spatl(
    evolve_config(config, spatl_selection=False), task, fed.client_ids
  )
  process = tff.learning.algorithms.build_weighted_fed_avg(
    task.tff_model_fn(plain_graph_methods=False),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(CLIENT_LR),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
    loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )
  data = [c.dataset for c in clients]
  after = config.settings.spatl_finetune_rounds + 1

  def algorithm_rounds(algorithm, round_num):
    state = algorithm.initialize()
    while True:
      start = time.perf_counter()
      state = algorithm.next(state, round_num, clients).state
      yield time.perf_counter() - start

  def tff_rounds():
    state = process.initialize()
    while True:
      start = time.perf_counter()
      state = process.next(state, data).state
      yield time.perf_counter() - start

  results = collections.OrderedDict()
  with runtime.local_execution():
    rounds = collections.OrderedDict(
      spatl_finetune_round_s=algorithm_rounds(ours, 1),
      spatl_round_s=algorithm_rounds(ours, after),
      spatl_no_selection_round_s=algorithm_rounds(no_selection, after),
      tff_fedavg_round_s=tff_rounds(),
    )
    times = _interleaved_seconds(rounds, timed)
  for key, seconds in times.items():
    results[key] = float(statistics.median(seconds))
  for key in ("spatl_finetune_round_s", "spatl_round_s"):
    ratios = [a / b for a, b in zip(times[key], times["tff_fedavg_round_s"])]
    name = key[: -len("_round_s")]
    results[f"{name}_over_tff_fedavg"] = round(statistics.median(ratios), 3)
    results[f"{name}_over_tff_fedavg_min"] = round(min(ratios), 3)
    results[f"{name}_over_tff_fedavg_max"] = round(max(ratios), 3)
    shares = [
      1.0 - b / a
      for a, b in zip(times[key], times["spatl_no_selection_round_s"])
    ]
    results[f"{name}_agent_share"] = round(statistics.median(shares), 3)
  s = config.settings
  results["setup"] = (
    f"{_DATASET.value}/{config.model}, {_CLIENTS.value} clients"
    f" ({config.partition}), cohort {_COHORT.value}, batch 20, 1 epoch, SGD"
    f" {CLIENT_LR}, validation fraction {config.val_fraction}; agent"
    f" {s.spatl_episodes} episodes, {s.spatl_ppo_epochs} PPO epochs when"
    f" fine-tuning (round 1; round {after} does not); medians of {timed}"
    " interleaved rounds after 1 warm-up; agent share: 1 - (SPATL without"
    " selection) / SPATL, per cycle"
  )
  return results


@contextlib.contextmanager
def _remote_setting(name: str, certs: dict):
  """The execution context of one `--suite=remote` setting (workers
  started here, stopped on exit): 'local', 'loopback_{1,3}' (plaintext),
  'loopback_tls_3', 'netns_tls_{1,3}' (each worker a host of its own)."""
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.runtime import testing as proc_testing  # pylint: disable=g-import-not-at-top
  from tff_hetero.runtime import tls as tls_lib  # pylint: disable=g-import-not-at-top

  if name == "local":
    with runtime.local_execution() as handle:
      yield handle
    return
  count = int(name.rsplit("_", 1)[1])
  tls = "tls" in name
  tls_args = (
    [
      f"--tls_cert={certs['worker.pem']}",
      f"--tls_key={certs['worker.key']}",
      f"--tls_ca={certs['ca.pem']}",
    ]
    if tls
    else []
  )
  driver_tls = (
    tls_lib.TlsConfig.from_flags(
      certs["driver.pem"], certs["driver.key"], certs["ca.pem"]
    )
    if tls
    else None
  )
  with contextlib.ExitStack() as stack:
    if name.startswith("netns"):
      _, hosts = stack.enter_context(
        proc_testing.veth_hosts(count, driver_namespace=False)
      )
      places = [dict(namespace=ns, host=host, port=8101) for ns, host in hosts]
    else:
      places = [{} for _ in range(count)]
    workers = []
    stack.callback(lambda: [w.stop() for w in workers])
    for place in places:
      workers.append(
        proc_testing.CliWorker(*tls_args, stderr=subprocess.DEVNULL, **place)
      )
    with runtime.remote_execution(
      [w.address for w in workers], tls=driver_tls
    ) as handle:
      yield handle


REMOTE_SETTINGS = (
  "local",
  "loopback_1",
  "loopback_3",
  "loopback_tls_3",
  "netns_tls_1",
  "netns_tls_3",
)


def bench_remote() -> collections.OrderedDict:
  from tff_hetero.runtime import certificates  # pylint: disable=g-import-not-at-top
  from tff_hetero.runtime import testing as proc_testing  # pylint: disable=g-import-not-at-top

  timed = _ROUNDS.value
  config, experiment, client, cohort = _hetero_cohort()
  fedavg = experiment.algorithm  # config.algorithm == "fedavg"
  results = collections.OrderedDict()
  no_namespaces = proc_testing.namespaces_unavailable()
  with tempfile.TemporaryDirectory() as root:
    hosts = ["127.0.0.1", "localhost"] + [
      f"10.{100 + os.getpid() % 100}.{i}.2" for i in (1, 2, 3)
    ]
    certs = certificates.make_test_certificates(root, hosts, days=1)
    for name in REMOTE_SETTINGS:
      if name.startswith("netns") and no_namespaces:
        results[f"{name}_skipped"] = no_namespaces
        continue
      with _remote_setting(name, certs) as handle:
        mixed, planned = _adaptivefl_mixed(config, experiment, client)
        for algorithm, cohort_fn, key in (
          (fedavg, lambda s, r, _: [client(c) for c in cohort], "fedavg"),
          (mixed, planned, "adaptivefl"),
        ):
          seconds, _, rpc = _median_next_s(
            algorithm, cohort_fn, 1, timed, handle
          )
          results[f"{name}_{key}_round_s"] = round(seconds, 3)
          if name != "local":
            for direction in ("sent", "received"):
              results[f"{name}_{key}_rpc_mib_{direction}"] = round(
                rpc[direction] / 2**20, 3
              )
  for key in ("fedavg", "adaptivefl"):
    local = results[f"local_{key}_round_s"]
    for name in REMOTE_SETTINGS[1:]:
      if f"{name}_{key}_round_s" in results:
        results[f"{name}_{key}_over_local"] = round(
          results[f"{name}_{key}_round_s"] / local, 3
        )
    results[f"tls_overhead_{key}"] = round(
      results[f"loopback_tls_3_{key}_round_s"]
      / results[f"loopback_3_{key}_round_s"],
      3,
    )
  results["setup"] = (
    f"{_DATASET.value}/{_model()}, {_CLIENTS.value} iid clients, cohort"
    f" {_COHORT.value}, batch 20, 1 epoch, SGD momentum 0.5; AdaptiveFL with"
    f" its default pool and selection; median of {timed} rounds after 1"
    " warm-up, settings one after the other; rpc_mib: serialized gRPC"
    " payload per round between the driver and all its workers"
  )
  return results


SUITES = collections.OrderedDict(
  spatl=bench_spatl,
  remote=bench_remote,
  base=bench_base,
  rss=bench_rss,
  depth=bench_depth,
  hetero=bench_hetero,
  sparse=bench_sparse,
  scale=bench_scale,
  gkt=bench_gkt,
  coldstart=bench_coldstart,
)


def main(argv):
  del argv
  from absl import logging  # pylint: disable=g-import-not-at-top

  logging.set_verbosity(logging.WARNING)
  results = SUITES[_SUITE.value]()
  if _SMOKE.value:
    results["smoke"] = True  # Too few rounds to be a result.
  for key, value in results.items():
    print(f"{key}: {value}")
  print(json.dumps(results), flush=True)


if __name__ == "__main__":
  app.run(main)
