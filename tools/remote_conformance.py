r"""Every registered algorithm on the local runtime, one worker and three workers.

    .venv/bin/python tools/remote_conformance.py                 # all
    .venv/bin/python tools/remote_conformance.py --algorithms=fedavg,fedgkt

Starts three workers as an operator would (`python -m pipelines.worker`, on
loopback), then runs each algorithm for two rounds on the synthetic data set
three times: `--executor=local`, `--executor=remote` on the first worker, and
on all three (TFF's mergeable context, the cohort split 2 + 2 + 2). Each
remote run must end with the local run's final weights (absolute tolerance
`--atol`: the order of summation differs), its measured bytes and its final
accuracy. Prints one row per algorithm and writes them to `--output` (JSON);
exit status 1 if any algorithm differs or fails.

`tests/program/remote_conformance_test.py` runs the same check (this
module's `conform`) for a few algorithms in CI; this tool covers them all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

from absl import app
from absl import flags
import numpy as np

# Before `app.run` parses the flags: TensorFlow imported after that builds
# Keras layers that fail (`Flatten` on a None dimension, TF 2.14).
import tensorflow  # noqa: F401  pylint: disable=unused-import

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_ALGORITHMS = flags.DEFINE_list(
  "algorithms", [], "Algorithms to check (default: every registered one)."
)
_ATOL = flags.DEFINE_float("atol", 1e-4, "Absolute tolerance on weights.")
_OUTPUT = flags.DEFINE_string(
  "output", "", "JSON file for the rows (default: none)."
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The settings every run shares, and per algorithm what it needs to run on
# 8x8 synthetic images.
COMMON = dict(
  dataset="synthetic",
  model="mlp",
  num_clients=6,
  clients_per_round=6,
  rounds=2,
  batch_size=10,
  client_lr=0.1,
  seed=7,
  eval_every=2,
  checkpoint_every=2,
  progress=False,
)
OVERRIDES = {
  "adaptivefl": dict(model="small_cnn"),
  "heterofl": dict(model="small_cnn"),
  "all_large": dict(model="small_cnn"),
  "decoupled": dict(model="small_cnn"),
  "fedgkt": dict(
    model="fedgkt_edge_resnet4",
    gkt_server_model="fedgkt_server_resnet19",
    gkt_server_epochs=1,
  ),
  "split_learning": dict(
    model="fedgkt_edge_resnet4", gkt_server_model="fedgkt_server_resnet19"
  ),
  "spatl": dict(model="small_cnn", local_evaluation=True, val_fraction=0.2),
  "inclusivefl": dict(model="depth_cnn"),
  "inclusivefl_all_large": dict(model="depth_cnn"),
  "inclusivefl_all_small": dict(model="depth_cnn"),
  "exclusivefl": dict(model="depth_cnn"),
  "inclusivefl_local": dict(model="depth_cnn"),
}


def start_workers(count: int) -> list:
  """`count` workers on loopback (`runtime.testing.CliWorker`)."""
  # pylint: disable=g-import-not-at-top
  from tff_hetero.runtime import testing as proc_testing

  workers = []
  try:
    for _ in range(count):
      workers.append(proc_testing.CliWorker(stderr=subprocess.DEVNULL))
  except BaseException:
    stop_workers(workers)
    raise
  return workers


def stop_workers(workers) -> None:
  # pylint: disable=g-import-not-at-top
  from tff_hetero.runtime import testing as proc_testing

  for worker in workers:
    worker.stop()
  for worker in workers:
    proc_testing.assert_no_workers_left(worker.tag)


def conform(algorithm: str, addresses, root_dir: str, atol: float) -> dict:
  """Runs `algorithm` locally, on `addresses[:1]` and on all of them; the
  row: the largest weight difference and whether bytes and accuracy
  match."""
  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import make_config
  from tff_hetero.program import run_experiment

  settings = dict(COMMON, **OVERRIDES.get(algorithm, {}))
  runs = {}
  seconds = {}
  for name, executor in (
    ("local", {}),
    ("one", dict(executor="remote", workers=tuple(addresses[:1]))),
    ("all", dict(executor="remote", workers=tuple(addresses))),
  ):
    started = time.monotonic()
    runs[name] = run_experiment(
      make_config(
        algorithm=algorithm,
        root_output_dir=root_dir,
        experiment_name=f"{algorithm}_{name}",
        **settings,
        **executor,
      )
    )
    seconds[name] = round(time.monotonic() - started, 1)
  local = runs["local"]
  row = dict(algorithm=algorithm, seconds=seconds, ok=True)
  for name in ("one", "all"):
    other = runs[name]
    diff = max(
      float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
      for a, b in zip(
        local.final_weights.trainable, other.final_weights.trainable
      )
    )
    same_bytes = all(
      other.report[k] == local.report[k]
      for k in ("bytes_up_total", "bytes_down_total")
    )
    acc_local = local.report["final_metrics"].get("accuracy")
    acc_other = other.report["final_metrics"].get("accuracy")
    same_accuracy = (acc_local is None and acc_other is None) or abs(
      acc_local - acc_other
    ) <= 1e-5
    row[name] = dict(
      max_weight_diff=diff, same_bytes=same_bytes, same_accuracy=same_accuracy
    )
    row["ok"] &= diff <= atol and same_bytes and same_accuracy
  return row


def main(argv) -> None:
  del argv
  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import registry

  names = _ALGORITHMS.value or list(registry.ALGORITHMS)
  unknown = [n for n in names if n not in registry.ALGORITHMS]
  if unknown:
    sys.exit(f"error: --algorithms: unknown {', '.join(unknown)}")
  workers = start_workers(3)
  addresses = [w.address for w in workers]
  rows = []
  try:
    with tempfile.TemporaryDirectory() as root:
      for name in names:
        try:
          row = conform(name, addresses, root, _ATOL.value)
        except Exception as e:  # pylint: disable=broad-except
          traceback.print_exc()
          row = dict(
            algorithm=name, ok=False, error=" ".join(str(e).split())[:300]
          )
        rows.append(row)
        print(json.dumps(row), flush=True)
  finally:
    stop_workers(workers)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(rows, f, indent=1)
  failed = [r["algorithm"] for r in rows if not r["ok"]]
  print(
    f"{len(rows) - len(failed)}/{len(rows)} agree"
    + (f"; differ or fail: {', '.join(failed)}" if failed else "")
  )
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  app.run(main)
