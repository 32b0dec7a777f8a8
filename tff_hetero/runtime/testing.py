"""Test helpers: find TFF `worker_binary` processes (and our compiler
processes, `compiler_process.py`) and prove none outlives a run.

A worker left behind by a run is an orphan: once its parent has died it is
re-parented (to init or a subreaper), so "children of the run's process" no
longer finds it. The reliable handle is the environment, which a worker
inherits from the process that started it (ours or TFF's own `local_cpp`
context alike) and keeps for life. So:

    tag, env = tagged_env()                     # env = os.environ + a unique tag
    proc = subprocess.Popen([sys.executable, '-m', 'pipelines.train', ...],
                            env=env)
    ...                                         # the run ends, however it ends
    assert_no_workers_left(tag)                 # waits a little, then fails
                                                # listing (and killing) leftovers

Linux only (psutil reads /proc). Processes of other users are skipped\nsilently.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Optional
import uuid

import psutil

from tff_hetero.runtime import compiler_process
from tff_hetero.runtime import workers

__all__ = [
  "CliWorker",
  "namespaces_unavailable",
  "veth_hosts",
  "TAG_VARIABLE",
  "WorkerInfo",
  "assert_all_gone",
  "assert_no_workers_left",
  "compiler_processes",
  "is_worker_process",
  "kill_pids",
  "pid_alive",
  "tagged_env",
  "wait_until_gone",
  "worker_pids_of",
  "worker_processes",
]

TAG_VARIABLE = "TFF_HETERO_TEST_RUN_TAG"
_WORKER_NAME = "worker_binary"


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
  """A live `worker_binary` process (psutil's view of it)."""

  pid: int
  ppid: int
  pgid: int
  state: str
  cmdline: tuple[str, ...]
  tag: Optional[str]


def tagged_env(
  base: Optional[Mapping[str, str]] = None, tag: Optional[str] = None
) -> tuple[str, dict[str, str]]:
  """Returns `(tag, env)`: a copy of `base` (default `os.environ`) with a
  unique `TFF_HETERO_TEST_RUN_TAG`, to start a run whose workers can be found
  later with `worker_processes(tag=tag)`."""
  tag = tag or uuid.uuid4().hex
  env = dict(os.environ if base is None else base)
  env[TAG_VARIABLE] = tag
  return tag, env


_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)
_DEAD = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def _tag_of(process: psutil.Process) -> Optional[str]:
  try:
    return process.environ().get(TAG_VARIABLE)
  except _GONE:  # Gone, or not ours to read.
    return None


def is_worker_process(process: psutil.Process) -> bool:
  """Whether `process` is a TFF `worker_binary` (by its name), alive or not."""
  return _worker_cmdline(process) is not None


def _worker_cmdline(process: psutil.Process) -> Optional[tuple[str, ...]]:
  """The process's command line if it is a `worker_binary`, else None."""
  try:
    if process.name() != _WORKER_NAME:
      return None
    return tuple(process.cmdline())
  except _GONE:
    return None


def worker_processes(
  *,
  tag: Optional[str] = None,
  parent: Optional[int] = None,
  pgid: Optional[int] = None,
  include_zombies: bool = False,
) -> list[WorkerInfo]:
  """Live `worker_binary` processes, optionally filtered.

  Args:
    tag: only those whose environment carries this `tagged_env` tag (finds
      orphans of a dead run).
    parent: only direct children of this pid (only works while it lives).
    pgid: only members of this process group (our own workers each lead a
      group of their own; TFF's `local_cpp` worker shares its parent's).
    include_zombies: also list exited-but-unreaped ones (state 'Z').
  """
  found = []
  for process in psutil.process_iter():
    cmdline = _worker_cmdline(process)
    if cmdline is None:
      continue
    try:
      state, ppid = process.status(), process.ppid()
      group = os.getpgid(process.pid)
    except (*_GONE, ProcessLookupError):
      continue
    if state in _DEAD and not include_zombies:
      continue
    if parent is not None and ppid != parent:
      continue
    if pgid is not None and group != pgid:
      continue
    process_tag = _tag_of(process)
    if tag is not None and process_tag != tag:
      continue
    found.append(
      WorkerInfo(process.pid, ppid, group, state, cmdline, process_tag)
    )
  return found


def _is_compiler_process(process: psutil.Process) -> bool:
  try:
    cmdline = process.cmdline()
  except _GONE:
    return False
  return len(cmdline) >= 3 and cmdline[1:3] == ["-m", compiler_process.MODULE]


def compiler_processes(*, tag: Optional[str] = None) -> list[int]:
  """PIDs of live compiler processes (`compiler_process.CompilerProcess`),
  only those whose environment carries `tag` if given."""
  found = []
  for process in psutil.process_iter():
    if not _is_compiler_process(process):
      continue
    try:
      if process.status() in _DEAD:
        continue
    except _GONE:
      continue
    if tag is not None and _tag_of(process) != tag:
      continue
    found.append(process.pid)
  return found


def worker_pids_of(pid: int) -> list[int]:
  """PIDs of live `worker_binary` processes whose parent is `pid`."""
  return [w.pid for w in worker_processes(parent=pid)]


def pid_alive(pid: int) -> bool:
  """True if `pid` exists and is not (entirely) a zombie.

  A multi-threaded process whose main thread has exited shows as a zombie
  while its other threads are still tearing down (and may still hold its
  sockets, e.g. a worker's listening port): that counts as alive here.
  """
  try:
    process = psutil.Process(pid)
    if process.status() not in _DEAD:
      return True
    threads = process.threads()
  except _GONE:
    return False
  for thread in threads:
    try:
      if psutil.Process(thread.id).status() not in _DEAD:
        return True
    except _GONE:
      continue
  return False


def _worker_alive(pid: int) -> bool:
  # Checking the name too guards against a recycled pid.
  try:
    process = psutil.Process(pid)
  except _GONE:
    return False
  return pid_alive(pid) and _worker_cmdline(process) is not None


def wait_until_gone(pids: Iterable[int], timeout_s: float = 5.0) -> list[int]:
  """Waits up to `timeout_s` for `pids` to exit; returns those still alive."""
  pids = list(pids)
  deadline = time.monotonic() + timeout_s
  while True:
    alive = [p for p in pids if pid_alive(p)]
    if not alive or time.monotonic() >= deadline:
      return alive
    time.sleep(0.05)


def kill_pids(pids: Iterable[int]) -> None:
  """SIGKILLs `pids` (ignoring those already gone). Only pass pids you own."""
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


def assert_no_workers_left(
  tag: Optional[str] = None,
  *,
  pids: Iterable[int] = (),
  timeout_s: float = 5.0,
  kill: bool = True,
) -> None:
  """Fails unless every worker of the run is gone within `timeout_s`.

  The run's workers are those carrying `tag` (see `tagged_env`), its
  compiler processes carrying `tag` too (`compiler_processes`), plus the
  explicit `pids` (e.g. printed by the run; a pid counts only while it is
  still a `worker_binary`, so a recycled pid is never blamed or killed).
  Leftovers are SIGKILLed (when `kill`) so that one failing test does not
  leak into the next, and an AssertionError lists them.
  """
  deadline = time.monotonic() + timeout_s
  explicit = list(pids)
  while True:
    leftovers = {p for p in explicit if _worker_alive(p)}
    if tag is not None:
      leftovers.update(w.pid for w in worker_processes(tag=tag))
      leftovers.update(compiler_processes(tag=tag))
    if not leftovers or time.monotonic() >= deadline:
      break
    time.sleep(0.05)
  if leftovers:
    if kill:
      kill_pids(leftovers)
    raise AssertionError(
      f"TFF worker or compiler process(es) still alive {timeout_s:g}s after"
      " the run"
      f" ended: {sorted(leftovers)}"
    )


def assert_all_gone(
  pids: Iterable[int], timeout_s: float = 5.0, *, kill: bool = True
) -> None:
  """Fails unless every pid in `pids` (e.g. from `worker_pids_of` while the
  run was alive) has exited within `timeout_s`; leftovers are SIGKILLed when
  `kill`. Same as `assert_no_workers_left(pids=pids)`."""
  assert_no_workers_left(None, pids=pids, timeout_s=timeout_s, kill=kill)


_REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


class CliWorker:
  """`python -m pipelines.worker` started as an operator would, for tests.

  Waits for its ready line; `address` is where a driver reaches it,
  `worker_pid` the `worker_binary` behind it, `tag` its environment tag
  (`assert_no_workers_left(tag)`). `stop()` signals it and returns (exit
  code, stderr). Extra command-line flags go in `args`; `port` defaults to
  a free one (a restarted worker may take its predecessor's); `namespace`
  runs it in that network namespace (`veth_hosts`) listening on `host`.
  """

  def __init__(
    self,
    *args: str,
    port: Optional[int] = None,
    stderr=None,
    namespace: Optional[str] = None,
    host: str = "127.0.0.1",
  ):
    self.port = port or workers.find_free_port()
    self.tag, env = tagged_env()
    env["PYTHONPATH"] = _REPO + os.pathsep + env.get("PYTHONPATH", "")
    in_namespace = ["ip", "netns", "exec", namespace] if namespace else []
    if host != "127.0.0.1":
      args = (f"--listen_address={host}", *args)
    self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
      [
        *in_namespace,
        sys.executable,
        "-m",
        "pipelines.worker",
        f"--port={self.port}",
        *args,
      ],
      cwd=_REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE if stderr is None else stderr,
      text=True,
    )
    self.ready_line = self.proc.stdout.readline().strip()
    if not self.ready_line.startswith("TFF worker ready on "):
      err = ""
      if self.proc.poll() is not None and stderr is None:
        err = self.proc.stderr.read()
      raise AssertionError(f"worker did not start: {self.ready_line!r} {err}")
    self.worker_pid = int(self.ready_line.rsplit(" ", 1)[1].rstrip(")"))
    self.address = f"{host}:{self.port}"

  def stop(self, sig=signal.SIGTERM) -> tuple[Optional[int], str]:
    if self.proc.poll() is None:
      self.proc.send_signal(sig)
    _, err = self.proc.communicate(timeout=30)
    return self.proc.returncode, err or ""


@contextlib.contextmanager
def cli_workers(count: int, *args: str, stderr=None):
  """`count` `CliWorker`s on loopback, started one after the other; on exit
  (or if one fails to start) all are stopped and checked gone. Yields the
  `CliWorker`s."""
  started = []
  try:
    for _ in range(count):
      started.append(CliWorker(*args, stderr=stderr))
    yield started
  finally:
    for worker in started:
      worker.stop()
    for worker in started:
      assert_no_workers_left(worker.tag)


# ---------------------------------------------------------------------------
# Hosts of our own: Linux network namespaces joined by veth links.


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
  return subprocess.run(
    ["ip", *args], capture_output=True, text=True, check=check, timeout=30
  )


def namespaces_unavailable() -> str:
  """Why `veth_hosts` cannot run here ('' when it can): it needs root and
  `ip` (iproute2)."""
  if shutil.which("ip") is None:
    return "no `ip` command (iproute2)"
  if os.geteuid() != 0:
    return "network namespaces need root"
  name = f"tffh-check-{uuid.uuid4().hex[:6]}"
  made = _ip("netns", "add", name, check=False)
  if made.returncode:
    return f"`ip netns add` failed: {made.stderr.strip()}"
  _ip("netns", "del", name, check=False)
  return ""


@contextlib.contextmanager
def veth_hosts(num_hosts: int, *, driver_namespace: bool = True):
  """`num_hosts` network namespaces ("hosts"), each joined by its own veth
  link (10.X.i.0/30) to the driver: a namespace of its own when
  `driver_namespace`, else this process's. Yields `(driver, hosts)`:
  the driver's namespace name (None for ours) and each host's
  `(namespace, address)`. Everything is deleted on exit."""
  tag = uuid.uuid4().hex[:6]
  subnet = 100 + os.getpid() % 100
  made, links = [], []
  driver = f"tffh-{tag}-d" if driver_namespace else None
  on_driver = ["-n", driver] if driver else []
  try:
    if driver:
      _ip("netns", "add", driver)
      made.append(driver)
      _ip(*on_driver, "link", "set", "lo", "up")
    hosts = []
    for i in range(1, num_hosts + 1):
      name = f"tffh-{tag}-w{i}"
      _ip("netns", "add", name)
      made.append(name)
      _ip("-n", name, "link", "set", "lo", "up")
      outer, inner = f"tffh{tag}d{i}", f"tffh{tag}w{i}"
      _ip(
        *on_driver, "link", "add", outer, "type", "veth", "peer", "name",
        inner, "netns", name,
      )  # fmt: skip
      links.append(outer)
      _ip(*on_driver, "addr", "add", f"10.{subnet}.{i}.1/30", "dev", outer)
      _ip("-n", name, "addr", "add", f"10.{subnet}.{i}.2/30", "dev", inner)
      _ip(*on_driver, "link", "set", outer, "up")
      _ip("-n", name, "link", "set", inner, "up")
      hosts.append((name, f"10.{subnet}.{i}.2"))
    yield driver, hosts
  finally:
    if not driver:
      for link in links:
        _ip("link", "del", link, check=False)
    for name in reversed(made):
      _ip("netns", "del", name, check=False)
