r"""Metrics release per round: TFF's release managers against ours.

  python tools/release_bench.py [--rounds=1000] [--fields=30]

Releases the same row of `--fields` float metrics for rounds 1..`--rounds`,
one release manager at a time, each into a fresh file or directory: TFF's
`CSVFileReleaseManager` in `WRITE` and in `APPEND` mode,
`outputs.AppendingCSVReleaseManager` (what `metrics.csv` is written with),
TFF's `TensorBoardReleaseManager` and
`outputs.CompiledTensorBoardReleaseManager` (what `tensorboard/` is written
with), and for scale the last part of a round's release, TFF's
`LoggingReleaseManager`. Prints, for each (`tff_csv_write`,
`tff_csv_append`, `ours_csv`, `tff_tensorboard`, `ours_tensorboard`,
`logging`), the median milliseconds of a release over the first and last 50
rounds and at three points between, then one JSON object with them. It
checks that the three CSV files are byte for byte the same and that the two
TensorBoard directories hold the same summaries (steps, tags, values).
"""

from __future__ import annotations

import asyncio
import collections
import glob
import json
import logging
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

from tff_hetero.program import outputs  # noqa: E402

_ROUNDS = flags.DEFINE_integer("rounds", 1000, "Releases per manager.")
_FIELDS = flags.DEFINE_integer("fields", 30, "Metrics in a row.")


def _managers(root: str):
  def tff_csv(mode):
    return lambda: tff.program.CSVFileReleaseManager(
      os.path.join(root, f"tff_{mode.value}.csv"),
      save_mode=mode,
      key_fieldname="round",
    )

  return collections.OrderedDict(
    tff_csv_write=tff_csv(tff.program.CSVSaveMode.WRITE),
    tff_csv_append=tff_csv(tff.program.CSVSaveMode.APPEND),
    ours_csv=lambda: outputs.AppendingCSVReleaseManager(
      os.path.join(root, "ours.csv"), key_fieldname="round"
    ),
    tff_tensorboard=lambda: tff.program.TensorBoardReleaseManager(
      os.path.join(root, "tff_tensorboard")
    ),
    ours_tensorboard=lambda: outputs.CompiledTensorBoardReleaseManager(
      os.path.join(root, "ours_tensorboard")
    ),
    logging=tff.program.LoggingReleaseManager,
  )


def _summaries(directory: str):
  """(step, tag, value) of every summary in `directory`'s event files."""
  found = []
  for path in sorted(glob.glob(os.path.join(directory, "events.out.*"))):
    for record in tf.data.TFRecordDataset(path):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for value in event.summary.value:
        found.append(
          (event.step, value.tag, tf.make_ndarray(value.tensor).tolist())
        )
  return sorted(found)


def main(argv):
  del argv
  logging.getLogger().setLevel(logging.WARNING)  # The logging manager's rows.
  rounds = _ROUNDS.value
  row = collections.OrderedDict(
    (f"metric_{i:02d}", 0.123456789 * i) for i in range(_FIELDS.value)
  )
  windows = sorted({0, rounds // 4, rounds // 2, 3 * rounds // 4, rounds - 50})
  windows = [w for w in windows if w >= 0]
  results = collections.OrderedDict(rounds=rounds, fields=_FIELDS.value)
  with tempfile.TemporaryDirectory() as root:
    managers = []
    for name, make in _managers(root).items():
      manager = make()
      managers.append(manager)
      times = []
      for key in range(1, rounds + 1):
        start = time.perf_counter()
        asyncio.run(manager.release(row, key=key))
        times.append(time.perf_counter() - start)
      medians = [
        round(1e3 * statistics.median(times[w : w + 50]), 2) for w in windows
      ]
      results[f"{name}_ms"] = medians
      print(
        f"{name}: median ms of rounds "
        + ", ".join(
          f"{w + 1}-{min(w + 50, rounds)}: {m}"
          for w, m in zip(windows, medians)
        ),
        flush=True,
      )
    contents = {
      name: open(os.path.join(root, name), "rb").read()
      for name in ("tff_write.csv", "tff_append.csv", "ours.csv")
    }
    for manager in managers:  # The TensorBoard ones' pending events.
      writer = getattr(manager, "_summary_writer", None) or getattr(
        manager, "_writer", None
      )
      if writer is not None:
        writer.flush()
    tensorboards = [
      _summaries(os.path.join(root, name))
      for name in ("tff_tensorboard", "ours_tensorboard")
    ]
  if len(set(contents.values())) != 1:
    raise SystemExit("error: the three CSV files differ")
  if tensorboards[0] != tensorboards[1] or not tensorboards[0]:
    raise SystemExit("error: the two TensorBoard directories differ")
  results["csv_files_identical"] = True
  results["tensorboard_summaries_identical"] = True
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
