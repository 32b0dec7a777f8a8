"""tools/ci_supervisor.py: orphans are found and killed, a leftover TFF worker
fails the run, the command's exit status and signals pass through.

A "worker" here is a copy of `sleep` named `worker_binary`: what the
supervisor and the tests recognise a TFF worker by.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parents[2]


_TOOL = [sys.executable, "-m", "tools.ci_supervisor"]


def _tool(*args, timeout=60):
  """`python -m tools.ci_supervisor *args` from the repo root, finished."""
  return subprocess.run(
    [*_TOOL, *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


def _supervise(script):
  return _tool("supervise", "--", "bash", "-c", script)


def _fake_worker(tmp_path) -> str:
  path = tmp_path / "worker_binary"
  shutil.copy(shutil.which("sleep"), path)
  return str(path)


def _gone(pid, timeout_s=10.0):
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    try:
      if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
        return True
    except psutil.NoSuchProcess:
      return True
    time.sleep(0.1)
  return False


def test_exit_status_passes_through():
  assert _supervise("exit 3").returncode == 3
  assert _supervise("true").returncode == 0


def test_orphan_is_killed_but_does_not_fail_the_run(tmp_path):
  pid_file = tmp_path / "pid"
  done = _supervise(f"(sleep 300 & echo $! > {pid_file}) ; exit 0")
  assert done.returncode == 0, done.stdout + done.stderr
  pid = int(pid_file.read_text())
  assert "outlived it, killing them" in done.stdout
  assert f"pid {pid}: " in done.stdout
  assert _gone(pid)


def test_orphaned_worker_fails_the_run(tmp_path):
  worker = _fake_worker(tmp_path)
  pid_file = tmp_path / "pid"
  # The script ends once the orphan runs the binary (not a bash fork of it).
  done = _supervise(
    f"({worker} 300 & echo $! > {pid_file}); pid=$(cat {pid_file});"
    ' until [ "$(cat /proc/$pid/comm)" = worker_binary ]; do sleep 0.05;'
    " done; exit 0"
  )
  assert done.returncode == 1
  assert "FAILED: a TFF worker_binary outlived the run" in done.stdout
  assert _gone(int(pid_file.read_text()))


def test_sigterm_reaches_the_command(tmp_path):
  marker = tmp_path / "got_term"
  proc = subprocess.Popen(
    [
      *_TOOL,
      "supervise",
      "--",
      "bash",
      "-c",
      f"trap 'touch {marker}; exit 7' TERM; sleep 300 & wait",
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  time.sleep(3)  # Let bash install its trap.
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=60)
  assert proc.returncode == 7
  assert marker.exists()


def test_leftovers_finds_workers_by_run_id(tmp_path):
  worker = _fake_worker(tmp_path)
  env = dict(os.environ, TFF_HETERO_CI_RUN_ID="run-under-test")
  before = _tool("workers").stdout
  ours = subprocess.Popen([worker, "300"], env=env, start_new_session=True)
  others = subprocess.Popen([worker, "300"], start_new_session=True)
  try:
    listed = _tool("workers").stdout.split()
    assert {str(ours.pid), str(others.pid)} <= set(listed)
    done = _tool(
      "leftovers", "--run-id", "run-under-test", "--preexisting", before
    )
    assert done.returncode == 1, done.stdout
    assert f"pid {ours.pid}" in done.stdout
    assert f"pid {others.pid}" not in done.stdout
    ours.wait(timeout=30)
    assert others.poll() is None  # Not ours: untouched.
  finally:
    for proc in (ours, others):
      if proc.poll() is None:
        proc.kill()
        proc.wait()
