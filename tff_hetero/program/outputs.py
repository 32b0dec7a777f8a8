"""What a run writes under `<root_output_dir>/<experiment_name>/`.

* `metrics.csv`: one row per round, released through
  `tff.program.CSVFileReleaseManager` (a resumed run rewrites rows from the
  resumed round on, so the file matches the checkpointed history);
* `tensorboard/`: the same values through `tff.program.TensorBoardReleaseManager`;
* `report.json`: configuration, partition (per-client label counts), device
  tiers, final metrics and measured totals;
* `accuracy_vs_round.png`, `accuracy_vs_upload_mib.png`;
* `final_model_weights.npz`: the global model's weights after the last round;
* `client_accuracy.json`: when the evaluation has per-client models or
  `--local_evaluation` is on, the latest evaluation's accuracy of each
  client (by group, e.g. `local`), with its round.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping
from collections.abc import Sequence
import csv
import math
import os
from typing import Any

import tensorflow_federated as tff

from tff_hetero.program import atomic_files
from tff_hetero.runtime.signals import run_to_completion

CLIENT_ACCURACY_JSON = "client_accuracy.json"
METRICS_CSV = "metrics.csv"
REPORT_JSON = "report.json"
FINAL_WEIGHTS = "final_model_weights.npz"
TENSORBOARD_DIR = "tensorboard"
PLOT_ROUNDS = "accuracy_vs_round.png"
PLOT_UPLOAD = "accuracy_vs_upload_mib.png"
MIB = float(1 << 20)


class MetricsReleaser:
  """Releases one round's metrics to CSV, TensorBoard and the log."""

  def __init__(self, experiment_dir: str):
    self._csv = tff.program.CSVFileReleaseManager(
      os.path.join(experiment_dir, METRICS_CSV),
      save_mode=tff.program.CSVSaveMode.WRITE,
      key_fieldname="round",
    )
    self._tensorboard = tff.program.TensorBoardReleaseManager(
      os.path.join(experiment_dir, TENSORBOARD_DIR)
    )
    self._log = tff.program.LoggingReleaseManager()

  def release(self, row: Mapping[str, Any], round_num: int) -> None:
    csv_row = collections.OrderedDict(
      (k, "" if _missing(v) else v) for k, v in row.items() if k != "round"
    )
    scalars = collections.OrderedDict(
      (k, v) for k, v in row.items() if k != "round" and not _missing(v)
    )

    async def release_all():
      await asyncio.gather(
        self._csv.release(csv_row, key=round_num),
        self._tensorboard.release(scalars, key=round_num),
        self._log.release(scalars, key=round_num),
      )

    run_to_completion(release_all())


def _missing(value) -> bool:
  return value is None or (isinstance(value, float) and math.isnan(value))


def write_report(path: str, report: Mapping[str, Any]) -> None:
  atomic_files.write_json(path, report)


def write_client_accuracy(
  experiment_dir: str, round_num: int, groups: Mapping[str, Any]
) -> None:
  """Writes the latest per-client accuracies (`CLIENT_ACCURACY_JSON`)."""
  atomic_files.write_json(
    os.path.join(experiment_dir, CLIENT_ACCURACY_JSON),
    collections.OrderedDict(round=int(round_num), groups=groups),
  )


def read_metrics(experiment_dir: str) -> list[dict[str, str]]:
  """The rows of a run's `metrics.csv`, as written (strings)."""
  with open(os.path.join(experiment_dir, METRICS_CSV)) as f:
    return list(csv.DictReader(f))


def load_final_weights(experiment_dir: str) -> dict[str, Any]:
  """A run's `final_model_weights.npz` as `{trainable_i: array, ...}`."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  with np.load(
    os.path.join(experiment_dir, FINAL_WEIGHTS), allow_pickle=False
  ) as f:
    return {k: f[k] for k in f.files}


def plot_history(
  experiment_dir: str, history: Sequence[Mapping[str, Any]], title: str
) -> list[str]:
  """Accuracy against round and against cumulative upload; returns paths."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  evaluated = [r for r in history if not _missing(r.get("accuracy"))]
  rounds = [r["round"] for r in evaluated]
  accuracy = [r["accuracy"] for r in evaluated]
  upload = [r["bytes_up_cumulative"] / MIB for r in evaluated]
  paths = []
  for file_name, xs, xlabel in (
    (PLOT_ROUNDS, rounds, "round"),
    (PLOT_UPLOAD, upload, "cumulative upload (MiB)"),
  ):
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
    ax.plot(xs, accuracy, marker="o", markersize=3)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = os.path.join(experiment_dir, file_name)
    fig.savefig(path)
    plt.close(fig)
    paths.append(path)
  return paths
