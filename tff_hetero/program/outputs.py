"""What a run writes under `<root_output_dir>/<experiment_name>/`.

* `metrics.csv`: one row per round, released through
  `AppendingCSVReleaseManager` (a resumed run rewrites rows from the
  resumed round on, so the file matches the checkpointed history);
* `tensorboard/`: the same values as summaries, through
  `CompiledTensorBoardReleaseManager` (what TFF's `TensorBoardReleaseManager`
  writes, in one compiled call per release);
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
import io
import math
import os
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tree

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


class AppendingCSVReleaseManager(tff.program.ReleaseManager):
  """A CSV file of one row per key, each release appended.

  Writes what `tff.program.CSVFileReleaseManager` writes for the same
  releases of flat mappings: the key column first, then the fields (sorted
  within a release, in order of first release across releases), values as
  `np.asarray(v).tolist()`, missing fields empty; a release with a key not
  above the last one first removes the rows from that key on, as a resumed
  run needs. TFF's manager reads and rewrites the whole file at every
  release, in either save mode (its check for rows to remove compares
  `key - 1` with the last key, so it rewrites every time): a release of 30
  metrics took 10 ms over rounds 1-50 and 33 ms over rounds 251-300 on two
  idle cores (`tools/release_bench.py`). Here a release appends one line,
  and the file is rewritten (atomically) only when a row brings a new field
  or a key goes back.

  The one file of the program not written all at once: an appended line
  can be torn by a kill (SIGKILL, a power cut; the program's handled
  signals wait for a release to finish). Opening the file drops an
  unterminated last line, and a resumed run rewrites every row from its
  resumed round on, so a torn line never outlives the run that tore it.
  """

  def __init__(self, path: str, key_fieldname: str = "key"):
    self._path = path
    self._key = key_fieldname
    if os.path.exists(path):
      self._fieldnames, rows = self._read()
      if self._key not in self._fieldnames:
        raise ValueError(f"{path} has no {self._key!r} column")
      self._last_key = int(rows[-1][self._key]) if rows else None
      self._write(self._fieldnames, rows)  # Without a torn last line.
    else:
      self._fieldnames = [self._key]
      self._last_key = None
      self._write(self._fieldnames, [])

  def _read(self) -> tuple[list[str], list[dict[str, str]]]:
    with open(self._path, newline="") as f:
      text = f.read()
    if not text.endswith("\n"):
      text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text))
    return list(reader.fieldnames or []), list(reader)

  def _write(self, fieldnames, rows) -> None:
    with atomic_files.atomic_write(self._path, "w") as f:
      writer = csv.DictWriter(f, fieldnames=fieldnames, lineterminator="\r\n")
      writer.writeheader()
      writer.writerows(rows)

  async def release(self, value: Mapping[str, Any], key: int) -> None:
    row = collections.OrderedDict([(self._key, int(key))])
    for name in sorted(value):  # TFF's order: flattened, names sorted.
      row[name] = np.asarray(value[name]).tolist()
    new_fields = [name for name in row if name not in self._fieldnames]
    if new_fields or (self._last_key is not None and key <= self._last_key):
      _, rows = self._read()
      kept = [r for r in rows if int(r[self._key]) < key]
      self._fieldnames = self._fieldnames + new_fields
      self._write(self._fieldnames, [*kept, row])
    else:
      with open(self._path, "a", newline="") as f:
        csv.DictWriter(
          f, fieldnames=self._fieldnames, lineterminator="\r\n"
        ).writerow(row)
    self._last_key = int(key)


# What `tf.summary.scalar` attaches: TensorBoard's scalars plugin, no content.
_SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
  plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
).SerializeToString()


class CompiledTensorBoardReleaseManager(tff.program.ReleaseManager):
  """Summaries of a release's numbers, one compiled call per release.

  Writes the events `tff.program.TensorBoardReleaseManager` writes for the
  same releases: the value flattened as TFF flattens it (nested names joined
  by `/`), each boolean or numeric leaf under its name at step `key`, a
  scalar as a float32 `scalars` summary, an array with
  `tf.summary.histogram`; other leaves (strings) are skipped, as TFF's
  manager skips them (and a `tf.data.Dataset` leaf, which TFF's manager
  turns into a list). TFF's manager issues one eager summary op per value:
  a release of 30 scalars took 15-24 ms at every round on two idle cores
  (`tools/release_bench.py`). Here the scalars of a release go into one
  `tf.function` call (one per set of names, traced once: an evaluated round
  and one without evaluation are two), their values in one float64 vector
  cast to float32 inside, as TFF's conversion of a Python number does for
  any value below 2**53. Each scalar is written with `tf.summary.write`
  under its name as the tag: `tf.summary.scalar` would open a name scope in
  the traced graph, which refuses names starting with `_`, `-` or `/`, and
  would add an enclosing `tf.name_scope` (TFF's manager, in eager mode,
  adds the caller's scope; the program releases outside any).
  """

  def __init__(self, summary_dir: str):
    if not summary_dir:
      raise ValueError("summary_dir must not be empty")
    os.makedirs(summary_dir, exist_ok=True)
    self._writer = tf.summary.create_file_writer(summary_dir)
    self._functions = {}

  def flush(self) -> None:
    """Writes the pending events to disk (the writer also flushes on its
    own, every two minutes and when the program ends)."""
    self._writer.flush()

  def _scalar_writer(self, names: tuple[str, ...]):
    if names not in self._functions:
      writer = self._writer

      @tf.function(
        input_signature=(
          tf.TensorSpec([len(names)], tf.float64),
          tf.TensorSpec([], tf.int64),
        )
      )
      def write(values, step):
        with writer.as_default(step=step):
          for i, name in enumerate(names):
            tf.summary.write(
              tag=name,
              tensor=tf.cast(values[i], tf.float32),
              step=step,
              metadata=_SCALAR_METADATA,
            )
        return tf.constant(True)

      self._functions[names] = write
    return self._functions[names]

  async def release(self, value: Mapping[str, Any], key: int) -> None:
    value = await tff.program.materialize_value(value)
    scalars, arrays = [], []
    for path, v in tree.flatten_with_path(value):
      name = "/".join(map(str, path))  # TFF's names of nested values.
      array = np.asarray(v)
      if array.dtype.kind not in "biuf":
        continue
      (arrays if array.shape else scalars).append((name, array))
    if scalars:
      names = tuple(name for name, _ in scalars)
      values = np.array([a for _, a in scalars], dtype=np.float64)
      self._scalar_writer(names)(values, np.int64(key))
    if arrays:
      with self._writer.as_default():
        for name, array in arrays:
          tf.summary.histogram(name, array, step=key)


class MetricsReleaser:
  """Releases one round's metrics to CSV, TensorBoard and the log."""

  def __init__(self, experiment_dir: str):
    self._csv = AppendingCSVReleaseManager(
      os.path.join(experiment_dir, METRICS_CSV), key_fieldname="round"
    )
    self._tensorboard = CompiledTensorBoardReleaseManager(
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
