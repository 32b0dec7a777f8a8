"""Remote conformance: a run on TFF workers ends where the local run ends.

`conform(algorithm, addresses, root_dir, atol)` runs a registered algorithm
for two rounds on the synthetic data set (`COMMON`, with what the algorithm
needs to run on 8x8 images in `OVERRIDES`) three times: on the local runtime,
on the first worker of `addresses`, and on all of them (TFF's mergeable
context, the cohort split in contiguous chunks). It returns a row: the
largest absolute difference of the final trainable weights from the local
run's, and whether the measured bytes and the final accuracy are the same.
`ok` when the weights are within `atol` (the order of summation differs
across workers) and the rest is equal.

Used by `tools/remote_conformance.py` (every algorithm) and by
`tests/program/remote_conformance_test.py` (a few, in CI).
"""

from __future__ import annotations

from collections.abc import Sequence
import time

import numpy as np

from tff_hetero.program.configs import make_config
from tff_hetero.program.loop import run_experiment

__all__ = ["COMMON", "OVERRIDES", "conform"]

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
    gkt_server_model="fedgkt_server_resnet7",
    gkt_server_epochs=1,
  ),
  "split_learning": dict(
    model="fedgkt_edge_resnet4", gkt_server_model="fedgkt_server_resnet7"
  ),
  "spatl": dict(model="small_cnn", local_evaluation=True, val_fraction=0.2),
  "inclusivefl": dict(model="depth_cnn"),
  "inclusivefl_all_large": dict(model="depth_cnn"),
  "inclusivefl_all_small": dict(model="depth_cnn"),
  "exclusivefl": dict(model="depth_cnn"),
  "inclusivefl_local": dict(model="depth_cnn"),
}


def conform(
  algorithm: str,
  addresses: Sequence[str],
  root_dir: str,
  atol: float = 1e-4,
  *,
  one_worker: bool = True,
  **changes,
) -> dict:
  """Runs `algorithm` locally, on `addresses[:1]` (unless not
  `one_worker`) and on all of them; the row (module docstring). `changes`
  override the shared settings (e.g. fewer rounds)."""
  settings = dict(COMMON, **OVERRIDES.get(algorithm, {}), **changes)
  runs = {}
  seconds = {}
  executors = [("local", {})]
  if one_worker:
    executors.append(
      ("one", dict(executor="remote", workers=tuple(addresses[:1])))
    )
  executors.append(("all", dict(executor="remote", workers=tuple(addresses))))
  for name, executor in executors:
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
  for name in [n for n, _ in executors[1:]]:
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
