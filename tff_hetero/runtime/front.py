"""A gRPC front for one TFF worker: the address drivers connect to.

`pipelines.worker` runs TFF's `worker_binary` where nothing can reach it (a
network namespace of its own, `netns.py`) and serves this front on the
operator's `--listen_address:--port` instead. The front

* terminates TLS and requires a client certificate signed by the operator's
  CA (`tls.TlsConfig.server_credentials`), or serves plaintext when the
  operator allows it (loopback, or `--insecure`);
* forwards the TFF executor service's RPCs (`tensorflow_federated.v0.
  ExecutorGroup/*`, all unary) to the worker as opaque bytes: requests and
  replies are never parsed, their status codes and details are passed back
  unchanged (the driver's `BoundedExecutorStub` reads them);
* answers nothing else but `READY_METHOD`, a readiness probe that succeeds
  only when the worker behind it answers a call within 2 s
  (`bounded_stub.probe`; the
  driver's liveness probes call it too, so a worker that hangs behind a
  live front is noticed within `--worker_timeout_s`);
* logs one line per computation result the driver fetches (`Compute`), with
  its duration, the bytes returned, and the RPCs since the previous line,
  and one line per forwarded call the worker answered with an error.

A connection that fails the TLS handshake (plaintext, no client certificate,
a certificate from another CA) never reaches a handler: nothing is forwarded
and nothing runs on the worker.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from concurrent import futures
import sys
import threading
import time
from typing import Optional

import grpc

from tff_hetero.runtime import tls as tls_lib
from tff_hetero.runtime import workers as workers_lib

__all__ = ["READY_METHOD", "WorkerFront"]

EXECUTOR_SERVICE = "/tensorflow_federated.v0.ExecutorGroup/"
READY_METHOD = workers_lib.READY_METHOD
_COMPUTE = EXECUTOR_SERVICE + "Compute"
_READY_WAIT_S = 2.0
_UPSTREAM_PING = "/tff_hetero.WorkerFront/Ping"
_NO_DEADLINE_S = 1e9


def _stderr_line(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def _size(num_bytes: int) -> str:
  if num_bytes < 1024 * 1024:
    return f"{num_bytes / 1024:.1f} KiB"
  return f"{num_bytes / 2**20:.2f} MiB"


class _CallLog:
  """Counts forwarded RPCs and writes the per-computation lines."""

  def __init__(self, write: Callable[[str], None]):
    self._write = write
    self._lock = threading.Lock()
    self._since = collections.Counter()
    self._bytes_in = 0
    self.computations = 0
    self.failures = 0

  def failed(self, method: str, seconds: float, code) -> None:
    """A forwarded call the worker answered with an error: one line."""
    name = method[len(EXECUTOR_SERVICE) :]
    with self._lock:
      self.failures += 1
    self._write(f"call {name} failed after {seconds:.3f} s: {code.name}")

  def record(self, method: str, seconds: float, sent: int, received: int):
    name = method[len(EXECUTOR_SERVICE) :]
    with self._lock:
      self._bytes_in += received
      if method != _COMPUTE:
        self._since[name] += 1
        return
      self.computations += 1
      since = ", ".join(f"{n} {k}" for k, n in sorted(self._since.items()))
      line = (
        f"computation {self.computations}: {seconds:.3f} s, {_size(sent)}"
        f" back; before it {since or 'no other call'},"
        f" {_size(self._bytes_in)} in"
      )
      self._since.clear()
      self._bytes_in = 0
    self._write(line)


class _Forwarder(grpc.GenericRpcHandler):
  """Routes the executor service to the worker and answers readiness."""

  def __init__(self, upstream: grpc.Channel, log: _CallLog):
    self._upstream = upstream
    self._log = log
    self._calls: dict[str, Callable] = {}
    self._lock = threading.Lock()

  def service(self, handler_call_details):
    method = handler_call_details.method
    if method == READY_METHOD:
      return grpc.unary_unary_rpc_method_handler(self._ready)
    if not method.startswith(EXECUTOR_SERVICE):
      return None  # UNIMPLEMENTED.
    with self._lock:
      call = self._calls.get(method)
      if call is None:
        call = self._calls[method] = self._upstream.unary_unary(method)

    def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
      started = time.monotonic()
      remaining = context.time_remaining()  # ~9.2e18 s without a deadline.
      try:
        reply = call(
          request, timeout=remaining if remaining < _NO_DEADLINE_S else None
        )
      except grpc.RpcError as e:
        self._log.failed(method, time.monotonic() - started, e.code())
        context.abort(e.code(), e.details() or "")
      self._log.record(
        method, time.monotonic() - started, len(reply), len(request)
      )
      return reply

    return grpc.unary_unary_rpc_method_handler(forward)

  def _ready(self, request: bytes, context: grpc.ServicerContext) -> bytes:
    """OK only if the worker itself answers a call now (a method it does
    not have: UNIMPLEMENTED is its answer). A frozen or deadlocked worker
    keeps its connection up but answers nothing: the call times out."""
    del request
    try:
      self._upstream.unary_unary(_UPSTREAM_PING)(b"", timeout=_READY_WAIT_S)
    except grpc.RpcError as e:
      if e.code() != grpc.StatusCode.UNIMPLEMENTED:
        context.abort(
          grpc.StatusCode.UNAVAILABLE,
          f"the TFF worker behind this front does not answer ({e.code().name})",
        )
    return b"ready"


class WorkerFront:
  """Serves `target` (a worker's gRPC address) on `listen_address:port`.

  Args:
    target: where the front reaches the worker, e.g. a `WorkerProcess`'s
      `address` ('unix:<path>' for a worker in a private network).
    listen_address: interface to serve on ('127.0.0.1', '::1', '0.0.0.0',
      a host address...).
    port: TCP port.
    tls: mutual TLS for the listening side; None serves plaintext (the
      caller decides when that is allowed).
    max_message_mb: gRPC message limit on both sides of the front.
    log: receives the per-computation lines (default: stderr).
  """

  def __init__(
    self,
    target: str,
    *,
    listen_address: str,
    port: int,
    tls: Optional[tls_lib.TlsConfig] = None,
    max_message_mb: int = workers_lib.DEFAULT_MAX_MESSAGE_MB,
    log: Callable[[str], None] = _stderr_line,
    max_concurrent_rpcs: int = 64,
  ):
    options = workers_lib.grpc_channel_options(max_message_mb)
    self._target = target
    self._bind = (
      f"[{listen_address}]:{port}"
      if ":" in listen_address
      else f"{listen_address}:{port}"
    )
    self._tls = tls
    self._upstream = grpc.insecure_channel(target, options=options)
    self.calls = _CallLog(log)
    self._server = grpc.server(
      futures.ThreadPoolExecutor(
        max_workers=max_concurrent_rpcs, thread_name_prefix="tff-hetero-front"
      ),
      handlers=[_Forwarder(self._upstream, self.calls)],
      options=options + [("grpc.so_reuseport", 0)],
    )
    self._started = False

  @property
  def bind_address(self) -> str:
    return self._bind

  def start(self) -> "WorkerFront":
    """Binds and serves. Raises `workers.PortInUseError` (one line) when
    the address cannot be bound."""
    try:
      if self._tls is None:
        bound = self._server.add_insecure_port(self._bind)
      else:
        bound = self._server.add_secure_port(
          self._bind, self._tls.server_credentials()
        )
    except RuntimeError:
      bound = 0
    if not bound:
      self.stop()
      raise workers_lib.PortInUseError(
        f"cannot serve on {self._bind}: the port is in use or the address"
        " is not one of this host's"
      )
    self._server.start()
    self._started = True
    return self

  def stop(self, grace_s: float = 1.0) -> None:
    """Stops serving (pending calls get `grace_s`) and closes the channel to
    the worker. Idempotent."""
    if self._started:
      self._server.stop(grace_s).wait()
      self._started = False
    workers_lib.close_channel(self._upstream)
