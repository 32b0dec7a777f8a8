"""WorkerProcess: start, readiness, stop, ports, process group, parent death.

No TensorFlow is imported here: the runtime package must not need it to
manage workers.
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tff_hetero import runtime
from tff_hetero.runtime import testing as proc_testing
from tff_hetero.runtime import workers

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def test_start_ready_stop(tmp_path):
  log = tmp_path / "worker.log"
  with runtime.WorkerProcess(log_path=log) as worker:
    assert worker.is_running()
    assert worker.address == f"127.0.0.1:{worker.port}"
    assert worker in runtime.live_workers()
    assert not runtime.port_is_free(worker.port)
    assert runtime.workers.listening_socket_count(worker.port) == 1
    info = proc_testing.worker_processes(parent=os.getpid())
    mine = [w for w in info if w.pid == worker.pid]
    assert mine, info
    # Own process group: a terminal's SIGINT to our group does not reach it.
    assert mine[0].pgid == worker.pid != os.getpgid(0)
    assert f"--port={worker.port}" in mine[0].cmdline
    assert "--grpc_max_message_length_megabytes=2000" in mine[0].cmdline
    pid = worker.pid
  assert not worker.is_running()
  assert worker.returncode == -signal.SIGTERM
  assert worker not in runtime.live_workers()
  assert not proc_testing.pid_alive(pid)
  assert log.exists()
  assert worker.stop() == -signal.SIGTERM  # Idempotent.


def test_busy_port_is_refused_not_shared():
  # worker_binary's gRPC server sets SO_REUSEPORT: started on a busy port it
  # would "succeed" and share it. We must refuse.
  with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", 0))
    sock.listen()
    port = sock.getsockname()[1]
    assert not runtime.port_is_free(port)
    worker = runtime.WorkerProcess(port)
    with pytest.raises(
      runtime.PortInUseError, match=f"port {port} is already in use"
    ):
      worker.start()
    assert worker.pid is None


def test_port_shared_through_so_reuseport_is_detected(monkeypatch):
  # Simulates another server binding the port between our free-port check
  # and the worker's own bind: both gRPC servers set SO_REUSEPORT, so both
  # binds succeed. wait_ready() must notice the second listener.
  port = runtime.find_free_port()
  other = subprocess.Popen(  # pylint: disable=consider-using-with
    [
      runtime.worker_binary_path(),
      f"--port={port}",
      "--grpc_max_message_length_megabytes=2000",
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    runtime.check_workers([f"127.0.0.1:{port}"], 30)
    assert runtime.workers.listening_socket_count(port) == 1
    monkeypatch.setattr(runtime.workers, "port_is_free", lambda port: True)
    worker = runtime.WorkerProcess(port).start()
    with pytest.raises(runtime.PortInUseError, match="shared with another"):
      worker.wait_ready(30)
    assert not worker.is_running()
  finally:
    other.kill()
    other.wait()


def test_second_worker_on_same_port_is_refused():
  with runtime.WorkerProcess() as first:
    with pytest.raises(runtime.PortInUseError):
      runtime.WorkerProcess(first.port).start()


def test_stop_escalates_to_sigkill(tmp_path, monkeypatch):
  # A stand-in binary that ignores SIGTERM (worker_binary itself dies on it,
  # even when stopped).
  stubborn = tmp_path / "stubborn"
  stubborn.write_text("#!/bin/sh\ntrap '' TERM\nexec sleep 60\n")
  stubborn.chmod(0o755)
  monkeypatch.setattr(
    runtime.workers, "worker_binary_path", lambda: str(stubborn)
  )
  worker = runtime.WorkerProcess().start()
  time.sleep(0.3)
  start = time.monotonic()
  assert worker.stop(timeout_s=0.5) == -signal.SIGKILL
  assert time.monotonic() - start < 3
  assert worker not in runtime.live_workers()


def test_wait_ready_reports_early_exit(tmp_path):
  log = tmp_path / "bad.log"
  worker = runtime.WorkerProcess(log_path=log, extra_args=["--no_such_flag"])
  worker.start()
  with pytest.raises(runtime.WorkerStartError, match="exited with code") as e:
    worker.wait_ready(30)
  assert "no_such_flag" in str(e.value)  # The log's last line.
  assert "\n" not in str(e.value)
  assert not worker.is_running()
  assert worker not in runtime.live_workers()


def test_worker_started_from_a_finished_thread_survives():
  # PR_SET_PDEATHSIG fires when the forking *thread* exits; workers are
  # therefore forked from a thread that lives as long as the process.
  box = []
  thread = threading.Thread(
    target=lambda: box.append(runtime.WorkerProcess().start())
  )
  thread.start()
  thread.join()
  worker = box[0]
  try:
    worker.wait_ready(30)
    time.sleep(0.5)
    assert worker.is_running()
  finally:
    worker.stop()


def test_invalid_arguments():
  with pytest.raises(ValueError):
    runtime.WorkerProcess(max_message_mb=10000)
  with pytest.raises(ValueError):
    runtime.WorkerProcess(port=70000)


def test_worker_dies_with_sigkilled_parent():
  script = textwrap.dedent("""
      import time
      from tff_hetero.runtime import WorkerProcess
      w = WorkerProcess().start()
      w.wait_ready(30)
      print(w.pid, flush=True)
      time.sleep(600)
  """)
  tag, env = proc_testing.tagged_env()
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  parent = subprocess.Popen(
    [sys.executable, "-c", script],
    env=env,  # pylint: disable=consider-using-with
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    worker_pid = int(parent.stdout.readline())
    assert proc_testing.worker_pids_of(parent.pid) == [worker_pid]
  finally:
    parent.kill()
    parent.communicate()
  proc_testing.assert_all_gone([worker_pid], timeout_s=5)
  proc_testing.assert_no_workers_left(tag, timeout_s=1)


def test_atexit_stops_workers_left_running():
  script = textwrap.dedent("""
      from tff_hetero.runtime import WorkerProcess
      w = WorkerProcess().start()
      w.wait_ready(30)
      print(w.pid, flush=True)
      # No stop(): the atexit hook must do it.
  """)
  tag, env = proc_testing.tagged_env()
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  out = subprocess.run(
    [sys.executable, "-c", script],
    env=env,
    check=True,
    stdout=subprocess.PIPE,
    text=True,
    timeout=60,
  ).stdout
  proc_testing.assert_all_gone([int(out)], timeout_s=5)
  proc_testing.assert_no_workers_left(tag, timeout_s=1)


def test_testing_helpers_find_tagged_orphans():
  tag, env = proc_testing.tagged_env()
  # An orphan on purpose: its parent exits at once and it ignores nothing.
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
    [
      runtime.worker_binary_path(),
      f"--port={runtime.find_free_port()}",
      "--grpc_max_message_length_megabytes=2000",
    ],
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    deadline = time.monotonic() + 10
    found = []
    while not found and time.monotonic() < deadline:  # Until it has exec'd.
      found = proc_testing.worker_processes(tag=tag)
      time.sleep(0.02)
    assert [w.pid for w in found] == [proc.pid]
    assert found[0].tag == tag
    with pytest.raises(AssertionError, match=str(proc.pid)):
      proc_testing.assert_no_workers_left(tag, timeout_s=0.2)  # Kills it.
    proc.wait(timeout=5)
    assert proc_testing.worker_processes(tag=tag) == []
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def test_close_channel_waits_for_grpcs_polling_thread(monkeypatch):
  # grpc watches a subscribed channel from a thread that re-checks its
  # subscribers every 0.2 s; a channel closed under it makes the thread
  # die with a printed "Channel closed!" traceback (plain `close()` here).
  import grpc  # pylint: disable=g-import-not-at-top

  errors = []
  monkeypatch.setattr(
    threading, "excepthook", lambda args: errors.append(args.exc_value)
  )
  before = set(threading.enumerate())
  channel = grpc.insecure_channel(f"localhost:{runtime.find_free_port()}")

  def callback(connectivity):
    del connectivity

  channel.subscribe(callback, try_to_connect=True)
  channel.unsubscribe(callback)
  workers.close_channel(channel)
  assert not set(threading.enumerate()) - before  # The poller has ended.
  time.sleep(0.5)
  assert not errors
  with pytest.raises(ValueError, match="closed"):
    channel.unary_unary("/none")(b"")


def test_close_channel_leaves_a_busy_poller_to_stop_first(monkeypatch):
  # With no time to wait (a loaded machine), the channel is closed by a
  # daemon thread once grpc's poller has stopped: no traceback either.
  import grpc  # pylint: disable=g-import-not-at-top

  errors = []
  monkeypatch.setattr(
    threading, "excepthook", lambda args: errors.append(args.exc_value)
  )
  channel = grpc.insecure_channel(f"localhost:{runtime.find_free_port()}")

  def callback(connectivity):
    del connectivity

  # Still subscribed when `close_channel` gives up waiting: the poller is
  # certainly running; unsubscribed right after, it stops within 0.2 s.
  channel.subscribe(callback, try_to_connect=True)
  workers.close_channel(channel, timeout_s=0)
  assert channel._connectivity_state.polling  # pylint: disable=protected-access
  channel.unsubscribe(callback)
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline and any(
    t.name == "close_channel" for t in threading.enumerate()
  ):
    time.sleep(0.05)
  time.sleep(0.3)
  assert not errors
  with pytest.raises(ValueError, match="closed"):
    channel.unary_unary("/none")(b"")
