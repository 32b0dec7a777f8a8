r"""Where a profiled run's rounds spent their time, from its trace.

  python -m pipelines.train ... --profile_rounds=5 --experiment_name=p
  python tools/trace_summary.py runs/p/tensorboard

Reads the newest `--profile_rounds` trace under the given TensorBoard
directory (`plugins/profile/<run>/*.xplane.pb`) and prints, for the
program's per-round steps (`STEPS`), the total seconds of their calls
(inclusive: a step's own callees count in it) as recorded by the Python
tracer, each as a share of the trace's span (the traced rounds), with the
number of calls. `invoke` is the driver waiting in TFF's synchronous call: the
round's computations on the TFF worker, which the trace cannot see into.
"""

from __future__ import annotations

import collections
import glob
import os
import sys

# Python functions of the training loop and what they stand for, as
# (file, function) of the Python tracer's event names (`$file:line name`).
STEPS = collections.OrderedDict(
  [
    (("loop.py", "_round_clients"), "cohort sampling and its client datasets"),
    (
      ("sync_execution_context.py", "invoke"),
      "TFF's call: the worker runs the round's computations",
    ),
    (("ledger.py", "record"), "the ledger records the measured traffic"),
    (("outputs.py", "release"), "metrics release (CSV, TensorBoard)"),
    (("checkpoint.py", "save"), "checkpoint"),
    (("loop.py", "_evaluate"), "central evaluation"),
  ]
)


def _events(trace: str):
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top

  space = xplane_pb2.XSpace()
  with open(trace, "rb") as f:
    space.ParseFromString(f.read())
  for plane in space.planes:
    for line in plane.lines:
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name
        if name.startswith("$"):
          yield (
            name,
            event.offset_ps + line.timestamp_ns * 1000,
            event.duration_ps,
          )


def summarize(directory: str) -> collections.OrderedDict:
  traces = sorted(
    glob.glob(os.path.join(directory, "plugins/profile/*/*.xplane.pb"))
  )
  if not traces:
    raise SystemExit(
      f"error: no profiler trace under {directory}/plugins/profile"
    )
  seconds = collections.Counter()
  calls = collections.Counter()
  first, last = None, None
  for name, start_ps, duration_ps in _events(traces[-1]):
    where, function = name[1:].rsplit(" ", 1) if " " in name else (name, "")
    step = (where.split(":", 1)[0], function)
    first = start_ps if first is None else min(first, start_ps)
    last = (
      start_ps + duration_ps
      if last is None
      else max(last, start_ps + duration_ps)
    )
    if step in STEPS:
      # The steps do not call one another recursively: no double count.
      seconds[step] += duration_ps / 1e12
      calls[step] += 1
  total = (last - first) / 1e12 if first is not None else 0.0
  out = collections.OrderedDict(trace=traces[-1], traced_s=round(total, 3))
  for step in STEPS:
    out[step] = (round(seconds[step], 3), calls[step])
  return out


def main(argv):
  if len(argv) != 2:
    raise SystemExit(f"usage: {argv[0]} <experiment dir>/tensorboard")
  summary = summarize(argv[1])
  total = summary["traced_s"]
  print(f"trace: {summary['trace']}")
  print(f"traced: {total:.3f} s")
  for step, meaning in STEPS.items():
    secs, n = summary[step]
    share = 100.0 * secs / total if total else float("nan")
    label = f"{step[0]} {step[1]}"
    print(f"{label:>36}: {secs:7.3f} s {share:5.1f} % in {n} calls ({meaning})")


if __name__ == "__main__":
  main(sys.argv)
