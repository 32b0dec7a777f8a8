"""`python -m pipelines.train` end to end, as a user runs it.

Each test starts the pipeline as a subprocess, ends it one way (normal exit,
SIGKILL then --resume from a truncated newest checkpoint, SIGINT, SIGTERM,
divergence) and checks what it wrote
and that no TFF worker it started outlives it.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

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


def test_run_writes_everything_and_sigkill_then_resume_matches_it(tmp_path):
  # The uninterrupted run: what it writes, and no worker left after it.
  args = ["--rounds=4", "--eval_every=1", "--checkpoint_every=1"]
  reference = _start(args + ["--experiment_name=whole"], tmp_path)
  workers = _workers_of(reference)
  code, out, err = _finish(reference)
  assert code == 0, err
  proc_testing.assert_no_workers_left(reference.worker_tag, pids=workers)
  run_dir = tmp_path / "whole"
  assert f"report: {run_dir}/report.json" in out
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
  assert report["rounds_completed"] == 4
  assert 0.0 <= report["final_metrics"]["accuracy"] <= 1.0
  assert len(report["partition"]["label_counts"]) == 8
  # mlp on 8x8x1, 10 classes: 64*64+64 + 64*10+10 = 4,810 float32 parameters
  # broadcast densely to 3 clients in each of 4 rounds.
  assert report["bytes_down_total"] == 4 * 3 * 4810 * 4
  # Each client uploads the delta, its weight and its metric sums.
  assert report["bytes_up_total"] > report["bytes_down_total"]
  assert report["client_flops_total"] > 0
  rows = (run_dir / "metrics.csv").read_text().strip().splitlines()
  assert len(rows) == 5  # Header and four rounds.
  for name in ("accuracy_vs_round.png", "accuracy_vs_upload_mib.png"):
    assert (run_dir / name).stat().st_size > 1000
  assert os.listdir(run_dir / "tensorboard")

  # The same run killed once its round-2 checkpoint exists, its newest
  # checkpoint then truncated (a disk full mid-write), and resumed: it
  # falls back to the checkpoint before, with a one-line warning.
  interrupted = _start(args + ["--experiment_name=cut"], tmp_path)
  workers = _workers_of(interrupted)
  checkpoints = tmp_path / "cut" / "checkpoints"
  sidecar = checkpoints / "program_state_2.json"
  _wait_for(sidecar.exists, 300, "the round-2 checkpoint")
  interrupted.send_signal(signal.SIGKILL)
  interrupted.communicate()
  proc_testing.assert_no_workers_left(interrupted.worker_tag, pids=workers)
  assert not (tmp_path / "cut" / "report.json").exists()  # Killed mid-run.
  # Complete versions only (directory and sidecar): a kill while TFF
  # removes the oldest version can leave its sidecar behind.
  previous, newest = sorted(
    int(p.stem.split("_")[-1])
    for p in checkpoints.glob("program_state_*.json")
    if (checkpoints / p.stem).is_dir()
  )[-2:]
  variables = checkpoints / f"program_state_{newest}" / "variables"
  (truncated,) = variables.glob("variables.data*")
  truncated.write_bytes(truncated.read_bytes()[:100])

  # How often a run checkpoints does not change its results: it may differ.
  resumed = _start(
    args[:-1] + ["--checkpoint_every=2", "--experiment_name=cut", "--resume"],
    tmp_path,
  )
  code, _, err = _finish(resumed)
  assert code == 0, err
  assert (
    f"warning: checkpoint file {truncated} is corrupt (its SHA-256 does not"
    f" match); falling back to the checkpoint of round {previous}"
  ) in err

  whole = outputs.load_final_weights(tmp_path / "whole")
  cut = outputs.load_final_weights(tmp_path / "cut")
  assert whole.keys() == cut.keys()
  for key in whole:
    np.testing.assert_allclose(cut[key], whole[key], rtol=0, atol=1e-6)
  columns = ("accuracy", "loss", "bytes_up_cumulative", "bytes_down_cumulative")
  cut_report = json.loads((tmp_path / "cut" / "report.json").read_text())
  assert cut_report["rounds_completed"] == 4
  for a, b in zip(report["history"], cut_report["history"]):
    for column in columns:
      assert a[column] == pytest.approx(b[column], abs=1e-6), column
  csv_rows = (tmp_path / "cut" / "metrics.csv").read_text().strip().splitlines()
  assert len(csv_rows) == 5  # No duplicated rounds after the resume.


def test_sigint_and_sigterm_stop_the_run_and_its_worker(tmp_path):
  # Both runs start together (their TensorFlow start-up overlaps) and are
  # signalled once each has written a checkpoint (only the newest two are
  # kept, so any will do).
  runs = {}
  for sig in (signal.SIGINT, signal.SIGTERM):
    name = f"sig{int(sig)}"
    runs[sig] = (
      name,
      _start(
        [
          "--rounds=500",
          "--eval_every=100",
          "--checkpoint_every=1",
          f"--experiment_name={name}",
        ],
        tmp_path,
      ),
    )

  def checkpoints(name):
    return list((tmp_path / name / "checkpoints").glob("program_state_*.json"))

  try:
    workers = {sig: _workers_of(proc) for sig, (_, proc) in runs.items()}
    for name, _ in runs.values():
      _wait_for(lambda: checkpoints(name), 300, f"a checkpoint of {name}")  # pylint: disable=cell-var-from-loop
    for sig, (_, proc) in runs.items():
      proc.send_signal(sig)
    for sig, (name, proc) in runs.items():
      code, _, err = _finish(proc, timeout_s=120)
      assert code != 0, sig
      lines = err.strip().splitlines()
      assert lines and lines[-1].startswith("error: "), err
      assert "--resume" in lines[-1]
      proc_testing.assert_no_workers_left(proc.worker_tag, pids=workers[sig])
      assert checkpoints(name)
  finally:
    for _, proc in runs.values():
      if proc.poll() is None:
        proc.kill()
        proc.communicate()


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
