r"""CPU seconds of a command's processes, second by second: finds idle stalls.

  python tools/cpu_trace.py [--interval_s=1] [--stall_cpu_s=0.05] -- \
      .venv/bin/python -m pipelines.train --rounds=8 ...

Runs the command and, every `--interval_s`, prints the CPU seconds each
process of its tree (the driver, its TFF workers) used in that interval and
its thread count. At the end it prints one JSON object: the intervals, how
many of them had the whole tree below `--stall_cpu_s` CPU seconds between
the first and the last interval with real work (half a core or more) (`stalled_intervals`: the program waited on
nothing it could compute), and the longest run of such intervals. A round on
two busy cores uses about 2 CPU seconds a second; an interval near 0 inside
a round means every thread was waiting. On 2026-11-28 this found the TFF
worker idle for 6 s in a row inside FedAvg rounds, on an iterator's
destructor waiting for tf.data's autotuning thread (`tff_hetero/data/options.py`).

The command's output goes to `--log` (default: discarded). Not part of the
test suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from absl import app
from absl import flags
import psutil

_INTERVAL = flags.DEFINE_float("interval_s", 1.0, "Seconds between samples.")
_STALL = flags.DEFINE_float(
  "stall_cpu_s",
  0.05,
  "An interval whose whole tree used fewer CPU seconds counts as stalled.",
)
_LOG = flags.DEFINE_string("log", None, "File for the command's output.")


def _tree_cpu(root: psutil.Process) -> dict[int, tuple[str, float, int]]:
  """pid -> (name, CPU seconds so far, threads) for `root` and children."""
  out = {}
  try:
    processes = [root] + root.children(recursive=True)
  except psutil.NoSuchProcess:
    return out
  for process in processes:
    try:
      times = process.cpu_times()
      out[process.pid] = (
        process.name()[:16],
        times.user + times.system,
        process.num_threads(),
      )
    except psutil.NoSuchProcess:
      pass
  return out


def main(argv):
  command = argv[1:]
  if not command:
    raise app.UsageError("give the command to trace after --")
  log = open(_LOG.value, "w") if _LOG.value else subprocess.DEVNULL  # noqa: SIM115
  child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
  root = psutil.Process(child.pid)
  seen: dict[int, float] = {}
  intervals = []
  try:
    while child.poll() is None:
      time.sleep(_INTERVAL.value)
      sample = _tree_cpu(root)
      used = {
        pid: cpu - seen.get(pid, 0.0) for pid, (_, cpu, _) in sample.items()
      }
      seen.update({pid: cpu for pid, (_, cpu, _) in sample.items()})
      intervals.append(round(sum(used.values()), 3))
      print(
        time.strftime("%H:%M:%S"),
        " ".join(
          f"{name}[{pid}]:{used[pid]:.2f}s/{threads}thr"
          for pid, (name, _, threads) in sample.items()
        ),
        flush=True,
      )
  finally:
    if child.poll() is None:
      child.kill()
    child.wait()
    if log is not subprocess.DEVNULL:
      log.close()
  # Real work: at least half a core busy.
  busy = [i for i, cpu in enumerate(intervals) if cpu >= _INTERVAL.value / 2]
  first_busy = busy[0] if busy else len(intervals)
  last_busy = busy[-1] if busy else -1
  inside = intervals[first_busy : last_busy + 1]
  stalled, longest, run = 0, 0, 0
  for cpu in inside:
    run = run + 1 if cpu < _STALL.value else 0
    stalled += cpu < _STALL.value
    longest = max(longest, run)
  print(
    json.dumps(
      dict(
        returncode=child.returncode,
        interval_s=_INTERVAL.value,
        intervals=len(intervals),
        stalled_intervals=stalled,
        longest_stall_intervals=longest,
        cpu_s_per_interval=intervals,
      )
    )
  )
  sys.exit(child.returncode)


if __name__ == "__main__":
  app.run(main)
