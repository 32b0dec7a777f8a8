"""No TFF worker outlives the process that started it, however it ends.

One child Python process per ending (SIGINT, SIGTERM, SIGKILL during a
computation) enters `local_execution()`, runs a computation and reports its
worker's pid. The children start together (a
module fixture) to overlap their TensorFlow start-up, then idle until their
test says go. Each test then ends
its child and checks, by pid and by the environment tag every worker
inherits, that no worker is left.

A normal exit and an exception leave `local_execution()` through its
`__exit__` as in-process runs do: `runtime_contexts_test.py` checks the
worker gone after both (`test_federated_mean_and_fedavg_agree_on_all_contexts`,
`test_previous_context_restored_after_exception`), and
`runtime_workers_test.py` a worker left to `atexit`. `lifecycle_child.py`
still has those modes (`normal`, `raise`).
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tff_hetero.runtime import testing as proc_testing

# Multi-process end-to-end checks: outside the unit tier.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
CHILD = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "lifecycle_child.py"
)

# mode -> (signal sent after READY or None, expected return codes)
CASES = {
  # Signalled in the middle of a long computation (the main thread blocked
  # in TFF's invoke, an RPC in flight): the hardest moment to unwind.
  "compute_sigint": (signal.SIGINT, {-signal.SIGINT}),
  "compute_sigterm": (signal.SIGTERM, {128 + signal.SIGTERM}),
  # No clean-up at all (as for SIGTERM without `handle_termination`):
  # PR_SET_PDEATHSIG must take the worker down.
  "compute_sigkill": (signal.SIGKILL, {-signal.SIGKILL}),
}


class _Child:
  def __init__(self, mode):
    self.mode = mode
    self.tag, env = proc_testing.tagged_env()
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    # stderr to a file: a pipe nobody reads could fill up and block the child.
    self.stderr = tempfile.TemporaryFile(mode="w+")  # pylint: disable=consider-using-with
    self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, CHILD, mode],
      cwd=REPO,
      env=env,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=self.stderr,
      text=True,
    )
    self.worker_pid = None

  def read_ready(self, timeout_s=240):
    """Waits for `READY <pid> <result>`; returns (pid, result)."""
    line = _readline(self.proc, timeout_s)
    assert line.startswith("READY "), line + self.err()
    _, pid, result = line.split()
    self.worker_pid = int(pid)
    return self.worker_pid, float(result)

  def err(self):
    self.stderr.seek(0)
    return self.stderr.read()

  def kill(self):
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.communicate()
    self.stderr.close()


def _readline(proc, timeout_s):
  import selectors  # pylint: disable=g-import-not-at-top

  sel = selectors.DefaultSelector()
  sel.register(proc.stdout, selectors.EVENT_READ)
  try:
    if not sel.select(timeout_s):
      raise AssertionError(f"no output from child within {timeout_s}s")
    return proc.stdout.readline().strip()
  finally:
    sel.close()


@pytest.fixture(scope="module")
def children():
  started = {mode: _Child(mode) for mode in CASES}
  yield started
  for child in started.values():
    child.kill()
    if child.worker_pid:
      proc_testing.assert_all_gone([child.worker_pid], timeout_s=1)


@pytest.mark.parametrize("mode", list(CASES))
def test_worker_does_not_outlive_its_parent(children, mode):
  child = children[mode]
  sig, expected_codes = CASES[mode]
  worker_pid, result = child.read_ready()
  assert result == pytest.approx(3.0)
  # Our worker: a child of the run, leading its own process group.
  info = [w for w in proc_testing.worker_processes(tag=child.tag)]
  assert [w.pid for w in info] == [worker_pid]
  assert info[0].ppid == child.proc.pid
  assert info[0].pgid == worker_pid
  assert proc_testing.worker_pids_of(child.proc.pid) == [worker_pid]

  child.proc.stdin.write("go\n")
  child.proc.stdin.flush()
  start = time.monotonic()
  if sig is not None:
    line = _readline(child.proc, 120)
    assert line in ("WAITING", "COMPUTING"), line + child.err()
    # Into the sleep loop, or past compilation into the computation.
    time.sleep(2.0 if line == "COMPUTING" else 0.3)
    start = time.monotonic()
    child.proc.send_signal(sig)
  child.proc.communicate(timeout=120)
  err = child.err()
  assert child.proc.returncode in expected_codes, err
  print(
    f"{mode}: exit code {child.proc.returncode} after"
    f" {time.monotonic() - start:.2f}s"
  )
  proc_testing.assert_all_gone([worker_pid], timeout_s=5)
  proc_testing.assert_no_workers_left(child.tag, timeout_s=1)
  assert time.monotonic() - start < 30
  if mode.endswith("_sigterm"):
    assert "Traceback" not in err, err  # `Terminated` exits quietly with 143.
