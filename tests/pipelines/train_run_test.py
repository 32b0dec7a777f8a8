"""`python -m pipelines.train` end to end, as a user runs it.

The runs that end other than normally are subprocesses, each ended one way
(SIGINT then --resume from a truncated newest checkpoint, SIGTERM,
divergence), and so is the resumed run: the tests check what they wrote, the
one line an interrupted run ends with, and that no TFF worker they started
outlives them. The uninterrupted run the resumed one must match runs in
process (its outputs are what is checked; it needs no process of its own).

A pipeline killed outright (SIGKILL) runs none of its own code: that its
worker dies with it (PR_SET_PDEATHSIG) is `runtime/runtime_lifecycle_test.py`'s
`compute_sigkill` case, and a resume from a damaged newest checkpoint is the
first test here.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from pipelines import _cli
from pipelines import train
from tff_hetero.program import outputs
from tff_hetero.runtime import testing as proc_testing

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
_SMALL = [
  "--dataset=synthetic",
  "--model=mlp",
  "--num_clients=8",
  "--clients_per_round=3",
  "--batch_size=10",
  "--client_lr=0.1",
  "--noprogress",
]


def _start(args, root):
  """Starts the pipeline; its workers carry a tag (`proc.worker_tag`)."""
  tag, env = proc_testing.tagged_env()
  env["PYTHONUNBUFFERED"] = "1"
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "pipelines.train",
      *_SMALL,
      f"--root_output_dir={root}",
      *args,
    ],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  proc.worker_tag = tag
  return proc


def _wait_for(predicate, timeout_s, what):
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if predicate():
      return
    time.sleep(0.1)
  raise AssertionError(f"timed out waiting for {what}")


def _finish(proc, timeout_s=300):
  out, err = proc.communicate(timeout=timeout_s)
  return proc.returncode, out, err


def _workers_of(proc):
  """Worker processes the pipeline started (waits until it has one)."""
  found = []

  def has_worker():
    found[:] = proc_testing.worker_pids_of(proc.pid)
    return bool(found)

  _wait_for(has_worker, 120, "the pipeline's TFF worker")
  return list(found)


def _interrupt_when(proc, ready, what, signum):
  """Sends `signum` to `proc` once `ready()` (waiting up to 300 s for
  `what`); returns its workers, exit code and stderr. `proc` is killed if it
  is still alive afterwards."""
  try:
    workers = _workers_of(proc)
    _wait_for(ready, 300, what)
    proc.send_signal(signum)
    code, _, err = _finish(proc, timeout_s=120)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  return workers, code, err


def test_sigint_stops_the_run_and_the_resumed_run_matches_a_whole_one(
  tmp_path, capsys
):
  # A run interrupted (SIGINT) once its round-2 checkpoint exists (it has
  # rounds enough never to finish first) ends with one line and leaves no
  # worker; its newest checkpoint then truncated (a disk full mid-write),
  # the resumed run falls back to the checkpoint before, with a one-line
  # warning, and runs two more rounds.
  # Two kept (the default), complete at every moment: a signal may land
  # while version n + 1 is written, after TFF's own pruning.
  args = ["--eval_every=1", "--checkpoint_every=1"]
  interrupted = _start(
    args + ["--rounds=500", "--experiment_name=cut"], tmp_path
  )
  checkpoints = tmp_path / "cut" / "checkpoints"
  sidecar = checkpoints / "program_state_2.json"
  workers, code, err = _interrupt_when(
    interrupted, sidecar.exists, "the round-2 checkpoint", signal.SIGINT
  )
  assert code == 130, err
  lines = err.strip().splitlines()
  assert lines and lines[-1] == (
    "error: interrupted by SIGINT; continue with --resume"
  ), err
  proc_testing.assert_no_workers_left(interrupted.worker_tag, pids=workers)
  assert not (tmp_path / "cut" / "report.json").exists()  # Stopped mid-run.
  # Complete versions only (directory and sidecar), as after any
  # interruption.
  previous, newest = sorted(
    int(p.stem.split("_")[-1])
    for p in checkpoints.glob("program_state_*.json")
    if (checkpoints / p.stem).is_dir()
  )[-2:]
  variables = checkpoints / f"program_state_{newest}" / "variables"
  (truncated,) = variables.glob("variables.data*")
  truncated.write_bytes(truncated.read_bytes()[:100])
  rounds = previous + 2

  # The uninterrupted run (in process): what it writes.
  _cli.run_in_process(
    train.main,
    [
      "train",
      *_SMALL,
      f"--root_output_dir={tmp_path}",
      *args,
      f"--rounds={rounds}",
      "--experiment_name=whole",
    ],
  )
  run_dir = tmp_path / "whole"
  assert f"report: {run_dir}/report.json" in capsys.readouterr().out
  report = json.loads((run_dir / "report.json").read_text())
  for key in (
    "config",
    "partition",
    "final_metrics",
    "bytes_up_total",
    "bytes_down_total",
    "client_flops_total",
    "rounds_completed",
    "wall_time_s",
  ):
    assert key in report
  assert report["rounds_completed"] == rounds
  assert 0.0 <= report["final_metrics"]["accuracy"] <= 1.0
  assert len(report["partition"]["label_counts"]) == 8
  # mlp on 8x8x1, 10 classes: 64*64+64 + 64*10+10 = 4,810 float32 parameters
  # broadcast densely to 3 clients in each round.
  assert report["bytes_down_total"] == rounds * 3 * 4810 * 4
  # Each client uploads the delta, its weight and its metric sums.
  assert report["bytes_up_total"] > report["bytes_down_total"]
  assert report["client_flops_total"] > 0
  rows = (run_dir / "metrics.csv").read_text().strip().splitlines()
  assert len(rows) == rounds + 1  # Header and a row a round.
  for name in ("accuracy_vs_round.png", "accuracy_vs_upload_mib.png"):
    assert (run_dir / name).stat().st_size > 1000
  assert os.listdir(run_dir / "tensorboard")

  # How often a run checkpoints does not change its results: it may differ,
  # and so may --rounds.
  resumed = _start(
    args[:-1]
    + [
      "--checkpoint_every=2",
      f"--rounds={rounds}",
      "--experiment_name=cut",
      "--resume",
    ],
    tmp_path,
  )
  code, out, err = _finish(resumed)
  assert code == 0, err
  proc_testing.assert_no_workers_left(resumed.worker_tag)
  assert f"report: {tmp_path / 'cut'}/report.json" in out
  # The warning is all a normal exit writes to stderr.
  assert err.strip().splitlines() == [
    f"warning: checkpoint file {truncated} is corrupt (its SHA-256 does not"
    f" match); falling back to the checkpoint of round {previous}"
  ], err

  whole = outputs.load_final_weights(tmp_path / "whole")
  cut = outputs.load_final_weights(tmp_path / "cut")
  assert whole.keys() == cut.keys()
  for key in whole:
    np.testing.assert_allclose(cut[key], whole[key], rtol=0, atol=1e-6)
  columns = ("accuracy", "loss", "bytes_up_cumulative", "bytes_down_cumulative")
  cut_report = json.loads((tmp_path / "cut" / "report.json").read_text())
  assert cut_report["rounds_completed"] == rounds
  assert len(cut_report["history"]) == rounds
  for a, b in zip(report["history"], cut_report["history"]):
    for column in columns:
      assert a[column] == pytest.approx(b[column], abs=1e-6), column
  csv_rows = (tmp_path / "cut" / "metrics.csv").read_text().strip().splitlines()
  assert len(csv_rows) == rounds + 1  # No duplicated rounds after the resume.


def test_sigterm_stops_the_run_and_its_worker(tmp_path):
  # Signalled once it has written a checkpoint (only the newest two are
  # kept, so any will do).
  proc = _start(
    [
      "--rounds=500",
      "--eval_every=100",
      "--checkpoint_every=1",
      "--experiment_name=sigterm",
    ],
    tmp_path,
  )

  def checkpoints():
    return list(
      (tmp_path / "sigterm" / "checkpoints").glob("program_state_*.json")
    )

  workers, code, err = _interrupt_when(
    proc, checkpoints, "a checkpoint", signal.SIGTERM
  )
  assert code == 128 + signal.SIGTERM, err
  lines = err.strip().splitlines()
  assert lines and lines[-1].startswith("error: "), err
  assert "--resume" in lines[-1]
  proc_testing.assert_no_workers_left(proc.worker_tag, pids=workers)
  assert checkpoints()


def test_divergence_stops_with_one_line_naming_the_round(tmp_path):
  proc = _start(
    [
      "--rounds=20",
      "--client_lr=1e12",
      "--checkpoint_every=1",
      "--experiment_name=diverge",
    ],
    tmp_path,
  )
  workers = _workers_of(proc)
  code, _, err = _finish(proc)
  assert code == 3, err
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith("error: round ") and "diverged" in lines[0]
  proc_testing.assert_no_workers_left(proc.worker_tag, pids=workers)
