"""`python -m pipelines.worker`: ready line, clean stop on signals, errors."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from tff_hetero import runtime
from tff_hetero.runtime import testing as proc_testing

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _start(*args):
  tag, env = proc_testing.tagged_env()
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
    [sys.executable, "-m", "pipelines.worker", *args],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  return tag, proc


def _ready_pid(proc, port):
  line = proc.stdout.readline().strip()
  prefix = f"TFF worker ready on 127.0.0.1:{port} (plaintext; worker pid "
  assert line.startswith(prefix), (line, proc.stderr.read())
  return int(line[len(prefix) :].rstrip(")"))


@pytest.mark.parametrize(
  "sig",
  [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
  ids=["SIGINT", "SIGTERM", "SIGHUP"],
)
def test_signal_stops_worker_and_exits_zero(sig):
  port = runtime.find_free_port()
  tag, proc = _start(f"--port={port}")
  try:
    worker_pid = _ready_pid(proc, port)
    assert proc_testing.worker_pids_of(proc.pid) == [worker_pid]
    runtime.check_workers([f"127.0.0.1:{port}"], 5)  # It answers.
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  proc_testing.assert_all_gone([worker_pid], timeout_s=5)
  proc_testing.assert_no_workers_left(tag, timeout_s=1)
  assert runtime.port_is_free(port)


def test_sigkill_of_the_launcher_takes_the_worker_down():
  port = runtime.find_free_port()
  tag, proc = _start(f"--port={port}")
  worker_pid = _ready_pid(proc, port)
  proc.kill()
  proc.communicate()
  proc_testing.assert_all_gone([worker_pid], timeout_s=5)
  proc_testing.assert_no_workers_left(tag, timeout_s=1)


def test_worker_dying_on_its_own_is_status_1():
  port = runtime.find_free_port()
  tag, proc = _start(f"--port={port}")
  worker_pid = _ready_pid(proc, port)
  os.kill(worker_pid, signal.SIGKILL)  # Started by our launcher: ours.
  _, err = proc.communicate(timeout=30)
  assert proc.returncode == 1
  assert err.strip().splitlines() == [
    f"error: TFF worker on port {port} exited on its own (code -9)"
  ]
  proc_testing.assert_no_workers_left(tag, timeout_s=1)


def test_busy_port_is_a_one_line_error_with_status_2():
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    port = sock.getsockname()[1]
    tag, proc = _start(f"--port={port}")
    out, err = proc.communicate(timeout=30)
  assert proc.returncode == 2
  assert out == ""
  assert err.strip().splitlines() == [
    f"error: port {port} is already in use; cannot start a TFF worker on it"
  ]
  proc_testing.assert_no_workers_left(tag, timeout_s=1)


@pytest.mark.parametrize(
  "args,message",
  [
    ([], "error: --port is required"),
    (["--port=0"], "error: --port must be in 1..65535, got 0"),
    (
      ["--port=9000", "--max_message_mb=10000"],
      "error: --max_message_mb must be in 1..2047, got 10000",
    ),
    (
      ["--port=9000", "--heap_profile=fast"],
      "error: --heap_profile: unknown heap profile 'fast'; choose from"
      " throughput, compact",
    ),
  ],
)
def test_bad_flags(args, message):
  _, proc = _start(*args)
  _, err = proc.communicate(timeout=30)
  assert proc.returncode == 2
  assert err.strip().splitlines() == [message]


def test_worker_failing_to_start_is_status_2(tmp_path):
  port = runtime.find_free_port()
  bad_log = tmp_path / "missing-dir" / "w.log"
  _, proc = _start(f"--port={port}", f"--log_file={bad_log}")
  _, err = proc.communicate(timeout=30)
  assert proc.returncode == 2, err
  assert err.strip().splitlines() == [
    f"error: cannot open TFF worker log file {bad_log}: No such file or"
    " directory"
  ]
