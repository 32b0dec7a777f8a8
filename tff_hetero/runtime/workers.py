"""TFF `worker_binary` processes whose whole lifecycle this process owns.

TFF's default local execution context starts a `worker_binary` subprocess that
inherits the parent's stdout/stderr and is often left running after the parent
exits (its clean-up lives in a `__del__` that fails at interpreter shutdown).
`WorkerProcess` starts the same binary so that it can never outlive us:

* stdin, stdout and stderr are never inherited (a log file or `/dev/null`), so
  an orphan could not hold a pipe open even if one survived;
* the child is started through `_pdeathsig_exec.py`, which calls
  `prctl(PR_SET_PDEATHSIG, SIGTERM)` and then execs the binary (same pid), so
  the kernel sends it SIGTERM when its parent dies, SIGKILL of the parent
  included (not a `preexec_fn`: see `_with_pdeathsig` for why);
* it runs in its own process group (see "Process group" below);
* every live worker is kept in a module registry and an `atexit` hook stops
  whatever is still running at interpreter exit;
* `stop()` sends SIGTERM, waits, then SIGKILLs.

Process group: the worker is put in a process group of its own
(`process_group=0`). A Ctrl-C in a terminal sends SIGINT to the whole
foreground process group; if the worker were in ours it would die at once,
under a driver that is still unwinding (and perhaps still talking to it, e.g.
to save a checkpoint in an `except KeyboardInterrupt`). In its own group the
worker only ever receives signals from us: the driver's KeyboardInterrupt
unwinds its `with` blocks, which stop the worker deliberately. If the driver
dies instead (any signal, SIGKILL included), PR_SET_PDEATHSIG stops the worker.
The same holds for SIGHUP when the terminal closes.

PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not only
the process. Workers are therefore always spawned from a thread that lives as
long as the process: the main thread, or (when `start()` is called from any
other thread) a dedicated daemon spawner thread.

Security: `worker_binary` listens on `[::]:port` (all interfaces) with
insecure gRPC and no authentication; anybody who reaches the port can run
arbitrary TensorFlow graphs as this user. It cannot be told to bind loopback
only. `private_network=True` starts it in a network namespace of its own
(loopback only) and reaches it through a Unix socket in a private directory
(`netns.py`); `pipelines.worker` serves such a worker behind TLS
(`front.py`).

Caveat on ports: the worker's gRPC server binds with SO_REUSEPORT, so a second
worker on a busy port starts "successfully" and shares the port with the first
(the kernel then splits connections between the two). `WorkerProcess.start()`
therefore checks that the port is free itself before starting the binary, and
`wait_ready()` checks that the worker is the port's only listener once it
answers (another server may have bound it in between); both raise
`PortInUseError`. `local_execution` retries such a clash on a new port.
"""

from __future__ import annotations

import atexit
from collections.abc import Sequence
import errno
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO
from typing import Optional
from typing import Union

import grpc
import psutil

from tff_hetero.errors import WorkerError
from tff_hetero.runtime import heap
from tff_hetero.runtime import netns

__all__ = [
  "DEFAULT_MAX_MESSAGE_MB",
  "PortInUseError",
  "WorkerProcess",
  "WorkerIsolationError",
  "WorkerStartError",
  "WorkerUnavailableError",
  "find_free_port",
  "grpc_channel_options",
  "listening_socket_count",
  "live_workers",
  "port_is_free",
  "stop_all_workers",
  "worker_binary_path",
]

# `worker_binary`'s own default (10000 MB) overflows a 32-bit int in its
# server; 2000 MB is below 2**31 bytes whether MB means 10**6 or 2**20.
DEFAULT_MAX_MESSAGE_MB = 2000
_MAX_MESSAGE_MB_LIMIT = 2047


class WorkerUnavailableError(WorkerError):
  """A TFF worker cannot be reached (or did not start). Message: one line."""


class WorkerStartError(WorkerUnavailableError):
  """A `WorkerProcess` could not be started or did not become ready."""


class WorkerIsolationError(WorkerStartError):
  """A worker could not be put in a network namespace of its own."""


class PortInUseError(WorkerStartError):
  """The requested port is already bound by another process."""


def worker_binary_path() -> str:
  """Path of `worker_binary` shipped inside the installed TFF wheel."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  spec = importlib.util.find_spec("tensorflow_federated")
  if spec is None or not spec.submodule_search_locations:
    raise WorkerStartError("tensorflow_federated is not installed")
  for location in spec.submodule_search_locations:
    path = os.path.join(location, "data", "worker_binary")
    if os.path.isfile(path):
      return path
  raise WorkerStartError(
    "worker_binary not found under tensorflow_federated/data in "
    + ", ".join(spec.submodule_search_locations)
  )


def grpc_channel_options(max_message_mb: int = DEFAULT_MAX_MESSAGE_MB):
  """gRPC channel options matching a worker's `--grpc_max_message_length_megabytes`.

  Uses 2**20 bytes per MB: the worker multiplies its flag by 1024*1024.
  """
  _check_max_message_mb(max_message_mb)
  size = int(max_message_mb) * 1024 * 1024
  return [
    ("grpc.max_send_message_length", size),
    ("grpc.max_receive_message_length", size),
  ]


def _check_max_message_mb(max_message_mb: int) -> None:
  if not 1 <= int(max_message_mb) <= _MAX_MESSAGE_MB_LIMIT:
    raise ValueError(
      f"max_message_mb must be in [1, {_MAX_MESSAGE_MB_LIMIT}] (it is a"
      f" 32-bit byte count in the worker), got {max_message_mb}"
    )


def close_channel(channel: grpc.Channel, timeout_s: float = 1.0) -> None:
  """Closes `channel` once grpc's connectivity-polling thread has stopped.

  Closed while that thread watches it, the channel makes the thread die
  with "ValueError: Cannot monitor channel state: Channel closed!" printed
  as a traceback (seen on a SIGTERM'd run). grpc polls in steps of 0.2 s
  and stops once nobody subscribes, so callers unsubscribe (or cancel
  their `channel_ready_future`) first. If the thread is still polling after
  `timeout_s` (seen in the logs of a reproduction on a machine at load 7:
  the same traceback between two runs), a daemon thread closes the channel
  once it has stopped, or after `timeout_s` more seconds x 10 regardless,
  and this returns (calls still in flight on other threads end with the
  channel's close).
  """
  state = getattr(channel, "_connectivity_state", None)  # grpc's own.

  def polling() -> bool:
    return bool(getattr(state, "polling", False))

  deadline = time.monotonic() + timeout_s
  while polling() and time.monotonic() < deadline:
    time.sleep(0.01)
  if not polling():
    channel.close()
    return

  def close_when_stopped():
    give_up = time.monotonic() + 10 * max(timeout_s, 1.0)
    while polling() and time.monotonic() < give_up:
      time.sleep(0.05)
    try:
      channel.close()
    except Exception:  # pylint: disable=broad-except
      pass  # Nothing to report from a daemon thread; the channel is gone.

  threading.Thread(
    target=close_when_stopped, name="close_channel", daemon=True
  ).start()


def port_is_free(port: int) -> bool:
  """True if nothing is bound to TCP `port` on any interface (IPv4 or IPv6).

  Binds a dual-stack `[::]:port` socket (falling back to `0.0.0.0`) with
  SO_REUSEADDR (so TIME_WAIT leftovers do not count as busy) and without
  SO_REUSEPORT (so a listening gRPC server, which sets SO_REUSEPORT, does).
  """
  families = []
  if socket.has_ipv6:
    families.append(socket.AF_INET6)
  families.append(socket.AF_INET)
  for family in families:
    try:
      sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
      continue
    try:
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", port))
      else:
        sock.bind(("0.0.0.0", port))
      return True
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        return False
      if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        continue  # No IPv6 on this host: try IPv4.
      raise
    finally:
      sock.close()
  raise OSError(f"cannot test whether port {port} is free")


def _listening(port: int, pid: Optional[int] = None) -> Optional[list]:
  """TCP sockets in LISTEN state on `port` (any address) in this network
  namespace, of process `pid` if given; None if they cannot be read."""
  try:
    if pid is None:
      connections = psutil.net_connections(kind="tcp")
    else:
      connections = psutil.Process(pid).net_connections(kind="tcp")
  except (psutil.Error, OSError):
    return None
  return [
    c
    for c in connections
    if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
  ]


def listening_socket_count(port: int) -> int:
  """Number of TCP sockets listening on `port` here; -1 if unknown."""
  found = _listening(port)
  return -1 if found is None else len(found)


def _listens_on(pid: int, port: int) -> Optional[bool]:
  """Whether process `pid` holds a listening socket on `port` (None: unknown)."""
  found = _listening(port, pid)
  return None if found is None else bool(found)


def find_free_port() -> int:
  """A TCP port that is currently free on all interfaces (racy, like all such)."""
  for _ in range(50):
    family = socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
    try:
      sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
      family = socket.AF_INET
      sock = socket.socket(family, socket.SOCK_STREAM)
    with sock:
      sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
      port = sock.getsockname()[1]
    if port_is_free(port):
      return port
  raise WorkerStartError("could not find a free TCP port")


# ---------------------------------------------------------------------------
# Spawning with PR_SET_PDEATHSIG from a thread that lives as long as we do.

_PDEATHSIG_EXEC = os.path.join(os.path.dirname(__file__), "_pdeathsig_exec.py")
# The readiness method of our worker front (`front.py`); a bare
# `worker_binary` answers it with UNIMPLEMENTED (`bounded_stub._Probe`).
READY_METHOD = "/tff_hetero.WorkerFront/Ready"
# `_pdeathsig_exec.py`'s exit status when it cannot isolate the worker.
_PRIVATE_NETWORK_FAILED = 3
# The worker's port inside a private network namespace.
_PRIVATE_PORT = 8000


def _with_pdeathsig(
  args: Sequence[str], private_network: bool = False
) -> list[str]:
  """`args` run through `_pdeathsig_exec.py`: the program gets SIGTERM when
  the thread that spawns it (see `_Spawner`) dies.

  Not `preexec_fn`: that makes `subprocess` use `fork()`, whose gRPC
  `pthread_atfork` handlers were seen to deadlock this process inside
  `fork()` (gRPC channels open, TFF 0.87 / grpcio 1.74). Without it,
  `subprocess` uses `vfork()`, which runs no fork handlers.
  """
  return [
    sys.executable,
    "-I",
    "-S",
    _PDEATHSIG_EXEC,
    str(os.getpid()),
    str(int(signal.SIGTERM)),
    *(["--private-network"] if private_network else []),
    *args,
  ]


class _Spawner:
  """Runs `subprocess.Popen` on a thread that lives as long as the process."""

  def __init__(self):
    self._lock = threading.Lock()
    self._requests: Optional[queue.Queue] = None

  def popen(self, args, **kwargs) -> subprocess.Popen:
    if threading.current_thread() is threading.main_thread():
      return subprocess.Popen(args, **kwargs)  # pylint: disable=consider-using-with
    with self._lock:
      if self._requests is None:
        self._requests = queue.Queue()
        threading.Thread(
          target=self._serve,
          args=(self._requests,),
          name="tff-hetero-worker-spawner",
          daemon=True,
        ).start()
      requests = self._requests
    done = queue.Queue(maxsize=1)
    requests.put((args, kwargs, done))
    ok, value = done.get()
    if ok:
      return value
    raise value

  @staticmethod
  def _serve(requests: queue.Queue):
    while True:
      args, kwargs, done = requests.get()
      try:
        done.put((True, subprocess.Popen(args, **kwargs)))  # pylint: disable=consider-using-with
      except BaseException as e:  # pylint: disable=broad-except
        done.put((False, e))


_SPAWNER = _Spawner()

# ---------------------------------------------------------------------------
# Registry of live workers, stopped at interpreter exit.

_LIVE_LOCK = threading.Lock()
_LIVE: dict[int, "WorkerProcess"] = {}


def live_workers() -> list["WorkerProcess"]:
  """Workers started by this process and not yet stopped."""
  with _LIVE_LOCK:
    return list(_LIVE.values())


def stop_all_workers(timeout_s: float = 5.0) -> None:
  """Stops every worker this process started (registered `atexit`)."""
  for worker in live_workers():
    try:
      worker.stop(timeout_s)
    except Exception:  # pylint: disable=broad-except
      pass


atexit.register(stop_all_workers)


def _tail(path: Optional[str], max_chars: int = 300) -> str:
  """Last non-empty line of a log file, shortened, for one-line errors."""
  if not path:
    return ""
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 4096))
      lines = [
        l.strip() for l in f.read().decode("utf-8", "replace").splitlines()
      ]
  except OSError:
    return ""
  lines = [l for l in lines if l]
  return lines[-1][-max_chars:] if lines else ""


class WorkerProcess:
  """One TFF `worker_binary` process owned by this Python process.

  Usage::

      with WorkerProcess() as worker:        # start() + wait_ready()
        ...  # talk to worker.address ('127.0.0.1:PORT')
      # stopped here, on normal exit and on exceptions alike

  Args:
    port: TCP port to serve on; a free one is chosen when None.
    max_message_mb: `--grpc_max_message_length_megabytes` (1..2047; the binary's
      own default of 10000 overflows).
    max_concurrent_computation_calls: passed through; non-positive = no limit.
    log_path: file receiving the worker's stdout and stderr (appended);
      `/dev/null` when None. Never inherited from this process.
    ready_timeout_s: used by `__enter__` for `wait_ready`.
    extra_args: more command-line flags for the binary.
    private_network: run the binary in a network namespace of its own and
      reach it through a Unix socket (module docstring); `address` is then
      'unix:<path>' and `port` the port inside that namespace.
  """

  def __init__(
    self,
    port: Optional[int] = None,
    *,
    max_message_mb: int = DEFAULT_MAX_MESSAGE_MB,
    max_concurrent_computation_calls: int = -1,
    log_path: Optional[Union[str, os.PathLike]] = None,
    ready_timeout_s: float = 60.0,
    extra_args: Sequence[str] = (),
    private_network: bool = False,
  ):
    _check_max_message_mb(max_message_mb)
    if port is not None and not 0 < int(port) < 65536:
      raise ValueError(f"port must be in 1..65535, got {port}")
    self._requested_port = None if port is None else int(port)
    self._port: Optional[int] = self._requested_port
    self._max_message_mb = int(max_message_mb)
    self._max_concurrent = int(max_concurrent_computation_calls)
    self._log_path = None if log_path is None else os.fspath(log_path)
    self._ready_timeout_s = float(ready_timeout_s)
    self._extra_args = list(extra_args)
    self._proc: Optional[subprocess.Popen] = None
    self._lock = threading.Lock()
    self._private = bool(private_network)
    self._bridge = None
    self._socket_dir: Optional[str] = None
    self._socket_path: Optional[str] = None

  # -- properties -----------------------------------------------------------

  @property
  def pid(self) -> Optional[int]:
    """PID of the worker process (None before `start`)."""
    return None if self._proc is None else self._proc.pid

  @property
  def port(self) -> Optional[int]:
    return self._port

  @property
  def address(self) -> str:
    """Where this process reaches the worker: '127.0.0.1:PORT', or
    'unix:<path>' for a worker in a private network."""
    if self._port is None:
      raise RuntimeError("worker has no port before start()")
    if self._private:
      return f"unix:{self._socket_path}"
    return f"127.0.0.1:{self._port}"

  @property
  def private_network(self) -> bool:
    return self._private

  @property
  def log_path(self) -> Optional[str]:
    return self._log_path

  @property
  def returncode(self) -> Optional[int]:
    return None if self._proc is None else self._proc.poll()

  def is_running(self) -> bool:
    return self._proc is not None and self._proc.poll() is None

  def __repr__(self):
    return (
      f"WorkerProcess(port={self._port}, pid={self.pid},"
      f" running={self.is_running()})"
    )

  # -- lifecycle ------------------------------------------------------------

  def command(self) -> list[str]:
    """The command line `start()` runs (port must be known)."""
    return [
      worker_binary_path(),
      f"--port={self._port}",
      f"--grpc_max_message_length_megabytes={self._max_message_mb}",
      f"--max_concurrent_computation_calls={self._max_concurrent}",
      *self._extra_args,
    ]

  def start(self) -> "WorkerProcess":
    """Starts the binary (does not wait for it to answer; see `wait_ready`).

    Raises:
      PortInUseError: the requested port is bound by another process.
      WorkerStartError: the binary is missing or cannot be executed.
    """
    with self._lock:
      if self._proc is not None:
        raise RuntimeError(f"{self!r} was already started")
      if self._private:
        # Nothing else lives in the worker's namespace: any port is free.
        self._port = self._requested_port or _PRIVATE_PORT
        self._socket_dir = tempfile.mkdtemp(prefix="tff-hetero-worker-")
        self._socket_path = os.path.join(self._socket_dir, "worker.sock")
      elif self._requested_port is None:
        self._port = find_free_port()
      elif not port_is_free(self._requested_port):
        raise PortInUseError(
          f"port {self._requested_port} is already in use; cannot start a"
          " TFF worker on it"
        )
      args = self.command()
      log_file: Union[int, IO[bytes]]
      if self._log_path is None:
        log_file = subprocess.DEVNULL
      else:
        try:
          log_file = open(self._log_path, "ab")  # pylint: disable=consider-using-with
        except OSError as e:
          raise WorkerStartError(
            f"cannot open TFF worker log file {self._log_path}:"
            f" {e.strerror or e}"
          ) from None
      try:
        self._proc = _SPAWNER.popen(
          _with_pdeathsig(args, self._private),
          stdin=subprocess.DEVNULL,
          stdout=log_file,
          stderr=subprocess.STDOUT if self._log_path else subprocess.DEVNULL,
          close_fds=True,
          process_group=0,
          env=heap.worker_environment(),
        )
      except OSError as e:
        raise WorkerStartError(
          f"cannot execute TFF worker binary {args[0]}: {e}"
        ) from None
      finally:
        if not isinstance(log_file, int):
          log_file.close()
      with _LIVE_LOCK:
        _LIVE[self._proc.pid] = self
    return self

  def wait_ready(self, timeout_s: Optional[float] = None) -> "WorkerProcess":
    """Blocks until the worker answers gRPC on 127.0.0.1:port.

    Raises:
      WorkerStartError: the process exited, or did not answer within
        `timeout_s` (the worker is then stopped).
    """
    if self._proc is None:
      raise RuntimeError("wait_ready() before start()")
    timeout_s = self._ready_timeout_s if timeout_s is None else float(timeout_s)
    deadline = time.monotonic() + timeout_s
    if self._private and self._bridge is None:
      self._open_bridge(timeout_s)
    channel = grpc.insecure_channel(
      self.address, options=[("grpc.use_local_subchannel_pool", 1)]
    )
    ready = grpc.channel_ready_future(channel)
    try:
      while True:
        code = self._proc.poll()
        if code is not None:
          ready.cancel()
          self._forget()
          tail = _tail(self._log_path)
          raise WorkerStartError(
            f"TFF worker {self._where()} exited with code {code} before"
            " answering" + (f": {tail}" if tail else "")
          )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
          ready.cancel()
          self.stop()
          raise WorkerStartError(
            f"TFF worker {self._where()} (pid {self.pid}) did not answer"
            f" within {timeout_s:g}s"
          )
        try:
          ready.result(timeout=min(0.2, remaining))
        except grpc.FutureTimeoutError:
          continue
        if self._private:
          return self  # Alone in its namespace: nobody else can listen.
        # Something answers on the port; make sure it is (also) our process.
        if _listens_on(self._proc.pid, self._port) is False:
          time.sleep(min(0.05, max(0.0, remaining)))
          continue
        listeners = listening_socket_count(self._port)
        if listeners > 1:
          # Another server bound the port between our check and the
          # worker's bind (SO_REUSEPORT lets both succeed): connections
          # would be split between the two. Back off.
          self.stop()
          raise PortInUseError(
            f"port {self._port} is shared with another server"
            f" ({listeners} listening sockets); cannot use it for a TFF"
            " worker"
          )
        return self
    finally:
      if not ready.done():  # grpc's cancel() fails when called twice.
        ready.cancel()
      close_channel(channel)

  def _where(self) -> str:
    """How errors name the worker: its port, or that it has a private
    network (whose port means nothing outside)."""
    return (
      "in its private network" if self._private else f"on port {self._port}"
    )

  def _open_bridge(self, timeout_s: float) -> None:
    """Starts the Unix-socket bridge into the worker's namespace once the
    helper has entered it and exec'd the binary."""
    isolated = netns.wait_until_isolated(
      self._proc.pid, worker_binary_path(), timeout_s
    )
    if not isolated:
      try:
        code = self._proc.wait(timeout=1)
      except subprocess.TimeoutExpired:
        code = None
      self.stop()
      tail = _tail(self._log_path)
      if code == _PRIVATE_NETWORK_FAILED:
        raise WorkerIsolationError(
          "cannot start the TFF worker in a network namespace of its own"
          " (needs root, or CAP_SYS_ADMIN and CAP_NET_ADMIN)"
          + (f": {tail}" if tail else "")
        )
      raise WorkerStartError(
        f"TFF worker (pid {self.pid}) did not enter its own network"
        f" namespace within {timeout_s:g}s" + (f": {tail}" if tail else "")
      )
    bridge = netns.UnixBridge(self._proc.pid, self._port, self._socket_path)
    try:
      bridge.start()
    except netns.NamespaceEntryError as e:
      self.stop()
      raise WorkerIsolationError(
        f"cannot reach the TFF worker's network namespace: {e}"
      ) from None
    except OSError as e:
      self.stop()
      raise WorkerStartError(
        f"cannot serve the TFF worker on Unix socket {self._socket_path}: {e}"
      ) from None
    self._bridge = bridge

  def stop(self, timeout_s: float = 5.0) -> Optional[int]:
    """SIGTERM, wait up to `timeout_s`, then SIGKILL. Idempotent.

    Returns the exit code (negative signal number if killed), None if never
    started. If interrupted (e.g. a second Ctrl-C) the worker is SIGKILLed
    before the exception propagates.
    """
    proc = self._proc
    if proc is None:
      return None
    try:
      if proc.poll() is None:
        try:
          proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
          pass
        try:
          proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
          proc.kill()
          proc.wait()
    except BaseException:
      try:
        proc.kill()
        proc.wait(timeout=1)
      except Exception:  # pylint: disable=broad-except
        pass
      raise
    finally:
      if proc.poll() is not None:
        self._forget()
    return proc.returncode

  def _forget(self):
    if self._bridge is not None:
      self._bridge.close()
      self._bridge = None
    if self._socket_dir is not None:
      shutil.rmtree(self._socket_dir, ignore_errors=True)
      self._socket_dir = None
    if self._proc is not None:
      with _LIVE_LOCK:
        if _LIVE.get(self._proc.pid) is self:
          del _LIVE[self._proc.pid]

  def __enter__(self) -> "WorkerProcess":
    if self._proc is None:
      self.start()
    try:
      self.wait_ready()
    except BaseException:
      self.stop()
      raise
    return self

  def __exit__(self, exc_type, exc, tb):
    self.stop()
    return False
