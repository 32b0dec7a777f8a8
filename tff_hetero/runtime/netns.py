"""Reach a TFF worker that lives in a network namespace of its own.

TFF's `worker_binary` binds `[::]:port`, every interface, and has no flag to
bind loopback only. `WorkerProcess(private_network=True)` therefore starts it
in a network namespace whose only interface is loopback (`_pdeathsig_exec.py
--private-network`): no other host, and no other process of this host, can
connect to it. `UnixBridge` is the one way in: a Unix socket in a private
directory of this host (mode 0700) whose connections are forwarded, byte for
byte, to `127.0.0.1:port` inside the worker's namespace. A Unix socket is a
file, not a network address, so it is reachable across namespaces, and its
directory's permissions decide who may use it.

How the bridge gets in: network namespaces are a property of each thread, not
of the process. The bridge's accept thread calls `setns(2)` on
`/proc/<worker pid>/ns/net` and opens every upstream connection from there;
the rest of this process stays in its own namespace. gRPC channels dial the
bridge as `unix:<path>`.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import time
from typing import Optional

__all__ = ["NamespaceEntryError", "UnixBridge", "wait_until_isolated"]

_CLONE_NEWNET = 0x40000000
_CHUNK = 1 << 20


class NamespaceEntryError(OSError):
  """`setns` into the worker's network namespace failed (privileges)."""


def _namespace_inode(pid) -> int:
  return os.stat(f"/proc/{pid}/ns/net").st_ino


def wait_until_isolated(pid: int, program: str, timeout_s: float) -> bool:
  """True once process `pid` runs `program` (the helper execs it only after
  it has entered its own namespace) in a namespace other than ours; False if
  the process is gone or `timeout_s` passed first."""
  deadline = time.monotonic() + timeout_s
  target = os.path.realpath(program)
  while time.monotonic() < deadline:
    try:
      if os.path.realpath(f"/proc/{pid}/exe") == target:
        return _namespace_inode(pid) != _namespace_inode("self")
    except OSError:
      return False
    time.sleep(0.01)
  return False


class UnixBridge:
  """Forwards connections to a Unix socket into `127.0.0.1:port` of the
  network namespace of process `pid`.

  Args:
    pid: a process in the target namespace (the isolated worker).
    port: the TCP port it listens on inside that namespace.
    socket_path: where to create the Unix socket (its directory should be
      private to this user).
  """

  def __init__(self, pid: int, port: int, socket_path: str):
    self._pid = int(pid)
    self._port = int(port)
    self._path = socket_path
    self._listener: Optional[socket.socket] = None
    self._connections: set[socket.socket] = set()
    self._lock = threading.Lock()
    self._closed = False
    self._thread: Optional[threading.Thread] = None

  @property
  def address(self) -> str:
    """The gRPC target of the bridge: 'unix:<path>'."""
    return f"unix:{self._path}"

  def start(self) -> "UnixBridge":
    """Enters the namespace on a thread of its own and starts accepting.

    Raises:
      OSError: the namespace cannot be entered or the socket not created.
    """
    started: list = []
    ready = threading.Event()
    self._thread = threading.Thread(
      target=self._serve,
      args=(started, ready),
      name=f"tff-hetero-netns-bridge-{self._pid}",
      daemon=True,
    )
    self._thread.start()
    ready.wait()
    if started and isinstance(started[0], BaseException):
      raise started[0]
    return self

  def _enter_namespace(self) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{self._pid}/ns/net", os.O_RDONLY)
    try:
      if libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(
          errno, f"setns into the worker's network: {os.strerror(errno)}"
        )
    finally:
      os.close(fd)

  def _serve(self, started: list, ready: threading.Event) -> None:
    try:
      self._enter_namespace()
      listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
      listener.bind(self._path)
      listener.listen(64)
      self._listener = listener
    except BaseException as e:  # pylint: disable=broad-except
      started.append(e)
      ready.set()
      return
    started.append(True)
    ready.set()
    while not self._closed:
      try:
        client, _ = listener.accept()
      except OSError:
        break  # Closed.
      try:
        # Created on this thread, so inside the worker's namespace.
        upstream = socket.create_connection(("127.0.0.1", self._port))
      except OSError:
        client.close()
        continue
      upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      with self._lock:
        if self._closed:
          client.close()
          upstream.close()
          break
        self._connections.update((client, upstream))
      for src, dst in ((client, upstream), (upstream, client)):
        threading.Thread(
          target=self._pump, args=(src, dst), daemon=True
        ).start()

  def _pump(self, src: socket.socket, dst: socket.socket) -> None:
    try:
      while True:
        data = src.recv(_CHUNK)
        if not data:
          break
        dst.sendall(data)
    except OSError:
      pass
    # One direction ended: end the other side's writes; the last pump of a
    # pair closes both sockets.
    for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
      try:
        sock.shutdown(how)
      except OSError:
        pass
    with self._lock:
      first = src in self._connections and dst in self._connections
      if first:  # The other pump of the pair still runs: mark this one.
        self._connections.discard(src)
        return
      self._connections.discard(src)
      self._connections.discard(dst)
    src.close()
    dst.close()

  def close(self) -> None:
    """Stops accepting, cuts every connection and removes the socket."""
    with self._lock:
      self._closed = True
      sockets = list(self._connections)
      self._connections.clear()
    if self._listener is not None:
      try:
        self._listener.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass
      self._listener.close()
    for sock in sockets:
      try:
        sock.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass
      sock.close()
    if self._thread is not None:
      self._thread.join(timeout=2)
    try:
      os.unlink(self._path)
    except OSError:
      pass
