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
    between round 10 and round `--rss_rounds` of our pipeline.
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

_SUITE = flags.DEFINE_enum("suite", "base", ["base"], "Benchmark suite.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds (after 1 warm-up).")
_RSS_ROUNDS = flags.DEFINE_integer("rss_rounds", 100,
                                   "Rounds of the memory-growth run.")
_DATASET = flags.DEFINE_string("dataset", "mnist5k", "Data set.")
_MODEL = flags.DEFINE_string("model", "mnist_cnn", "Model.")
_CLIENTS = flags.DEFINE_integer("num_clients", 20, "Clients in all.")
_COHORT = flags.DEFINE_integer("clients_per_round", 10, "Cohort size.")


def _config(**overrides):
  from tff_hetero.program import ExperimentConfig  # pylint: disable=g-import-not-at-top
  settings = dict(
      algorithm="fedavg", dataset=_DATASET.value, model=_MODEL.value,
      partition="iid", num_clients=_CLIENTS.value,
      clients_per_round=_COHORT.value, local_epochs=1, batch_size=20,
      client_lr=0.05, seed=0, checkpoint_every=10**6, progress=False)
  settings.update(overrides)
  return ExperimentConfig(**settings)


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
    base = rss[10]
    results["rss_round10_mib"] = round(base / 2**20, 1)
    results[f"rss_round{rss_rounds}_mib"] = round(rss[rss_rounds] / 2**20, 1)
    results["rss_growth_pct"] = round(100.0 * (rss[rss_rounds] - base) / base, 2)
  results["overhead_vs_tff"] = round(
      results["ours_fedavg_round_s"] / results["tff_fedavg_round_s"], 3)
  results["setup"] = (f"{_DATASET.value}/{_MODEL.value}, {_CLIENTS.value} iid"
                      f" clients, cohort {_COHORT.value}, batch 20, 1 epoch,"
                      f" median of {timed} rounds")
  return results


SUITES = collections.OrderedDict(base=bench_base)


def main(argv):
  del argv
  results = SUITES[_SUITE.value]()
  for key, value in results.items():
    print(f"{key}: {value}")
  print(json.dumps(results), flush=True)


if __name__ == "__main__":
  app.run(main)
