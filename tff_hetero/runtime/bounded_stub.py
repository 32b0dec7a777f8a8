"""gRPC stubs to TFF workers whose calls cannot hang on a dead worker.

`BoundedExecutorStub` (a `tff.framework.RemoteExecutorStub`), the liveness
probes it uses, `check_workers` and `parse_address`, for the execution
contexts of `contexts.py`.

What `worker_timeout_s` bounds
------------------------------
TFF's own stub sets no RPC deadline and its async context retries UNAVAILABLE
forever, so a dead worker hangs a round. Here every RPC to a worker goes
through `BoundedExecutorStub`, which never lets TFF retry an unreachable
worker and bounds how long a call waits on a worker that shows no sign of
life, *not* how long a computation may run (the C++ worker does a round's
work inside one `CreateCall` RPC, which can legitimately take minutes):

* Each RPC is sent with `wait_for_ready=True` and no deadline. While it is
  pending the stub tracks the last *proof of life* of the worker: the start of
  the call, then every successful probe, a brand-new gRPC connection (its own
  subchannel, not the call's) to the worker's address, made every
  `probe_interval_s` (`worker_timeout_s / 4`, clamped to 0.5..5 s) while the
  call is pending. A worker that can accept a new gRPC connection is alive,
  however long its computation takes: a round of an hour is never interrupted.
* If there has been no proof of life for `worker_timeout_s` while a call is
  pending, the call is cancelled and `WorkerUnavailableError` is raised
  (checked every 0.1 s): `cannot reach TFF worker at host:port within Ns`. This covers a worker that
  died between calls (the next call cannot connect), a host that vanished or
  was partitioned (no RST, the old connection looks fine, new ones fail), and
  a stopped/frozen worker process (SIGSTOP: the kernel still accepts TCP but
  nothing answers the HTTP/2 handshake).
* If the worker dies *during* a call, gRPC reports UNAVAILABLE at once and the
  stub raises `WorkerUnavailableError` immediately (`TFF worker at host:port
  became unavailable during Compute ...`), with no retry: the worker's
  state for this invocation is gone.
* Errors the worker itself returns (a TensorFlow error in a computation,
  RESOURCE_EXHAUSTED for an oversized message, ...) are re-raised unchanged
  and are not retried. One exception: FAILED_PRECONDITION, which the worker
  returns for an executor id it does not know (it was restarted since the
  executor was created), is passed to TFF as retryable, at most 3 times in a
  row, so the invocation is re-run on a fresh executor (TFF itself would
  retry it forever).
* Not bounded: a worker that accepts connections but never finishes a call
  (a deadlock inside the worker looks exactly like a long computation), and
  the driver's own Python work (compilation, serialization).
* Disposal RPCs (freeing remote values, executors) are best effort: at most
  `min(worker_timeout_s, 2 s)` each, errors ignored, skipped while the
  channel is not connected or after a call gave up on the worker, and
  skipped altogether when `local_execution` exits (its workers are stopped).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import os
import threading
import time
from typing import Optional

from absl import logging
import grpc

from tff_hetero.runtime import workers as workers_lib
from tff_hetero.runtime.tls import TlsConfig
from tff_hetero.runtime.tls import secure_or_insecure_channel
from tff_hetero.runtime.workers import DEFAULT_MAX_MESSAGE_MB
from tff_hetero.runtime.workers import READY_METHOD
from tff_hetero.runtime.workers import WorkerUnavailableError

__all__ = [
  "BoundedExecutorStub",
  "DEFAULT_WORKER_TIMEOUT_S",
  "check_workers",
  "parse_address",
  "probe",
]

DEFAULT_WORKER_TIMEOUT_S = 60.0
# FAILED_PRECONDITION answers (stale executor after a worker restart) that
# may be retried in a row before the error is raised.
_MAX_STALE_RETRIES = 3
_POLL_S = 0.1
_PROBE_CHANNEL_OPTIONS = [
  # A probe must open its own connection: with the global subchannel pool a
  # new channel to the same target would reuse the call's connection and
  # report READY even when the peer is frozen or gone.
  ("grpc.use_local_subchannel_pool", 1),
  ("grpc.initial_reconnect_backoff_ms", 200),
  ("grpc.min_reconnect_backoff_ms", 200),
  ("grpc.max_reconnect_backoff_ms", 1000),
]
# Retry connecting to a worker that went away every <= 2 s (gRPC's default
# back-off grows to 120 s), so a call waiting for it notices a comeback soon.
_MAIN_CHANNEL_EXTRA_OPTIONS = [
  ("grpc.initial_reconnect_backoff_ms", 500),
  ("grpc.max_reconnect_backoff_ms", 2000),
]


def _one_line(text: object, limit: int = 240) -> str:
  line = " ".join(str(text).split())
  return line if len(line) <= limit else line[: limit - 3] + "..."


def parse_address(address: str) -> tuple[str, int]:
  """Splits 'host:port' (or '[v6addr]:port') and validates the port.
  'unix:/absolute/path' (a worker on this host in a private network,
  `WorkerProcess(private_network=True)`) gives (address, 0)."""
  text = str(address).strip()
  if text.startswith("unix:"):
    if not os.path.isabs(text[len("unix:") :]):
      raise ValueError(
        f"--workers: expected unix:/absolute/path, got {address!r}"
      )
    return text, 0
  host, sep, port_text = text.rpartition(":")
  if not sep or not host or not port_text.isdigit():
    raise ValueError(f"--workers: expected host:port, got {address!r}")
  port = int(port_text)
  if not 0 < port < 65536:
    raise ValueError(f"--workers: port out of range in {address!r}")
  if host.startswith("["):
    if not host.endswith("]"):
      raise ValueError(f"--workers: expected host:port, got {address!r}")
  elif ":" in host:
    raise ValueError(
      f"--workers: write IPv6 addresses as [addr]:port, got {address!r}"
    )
  return host, port


# ---------------------------------------------------------------------------
# Liveness probes.


class _Probe:
  """Is the worker at `address` alive? A fresh connection (own subchannel)
  and a call of the readiness method (`front.READY_METHOD`): a front
  answers it only while its worker answers, a bare `worker_binary` with
  UNIMPLEMENTED. Either is proof of life; an error from the front (its
  worker does not answer) is not, and the call is made again."""

  def __init__(self, address: str, tls: Optional[TlsConfig] = None):
    self.started = time.monotonic()
    self._channel = secure_or_insecure_channel(
      address, _PROBE_CHANNEL_OPTIONS, tls
    )
    self._ready = self._channel.unary_unary(READY_METHOD)
    self._future = self._call()
    self.kind = ""  # "front" or "bare" once alive.
    self._last_error = ""

  def _call(self):
    return self._ready.future(b"", wait_for_ready=True)

  def _settle(self) -> Optional[bool]:
    """True/False once the current call has an answer, None before."""
    if not self._future.done() or self._future.cancelled():
      return None
    try:
      self._future.result(timeout=0)
      self.kind = "front"
      return True
    except grpc.RpcError as e:
      if e.code() == grpc.StatusCode.UNIMPLEMENTED:
        self.kind = "bare"
        return True
      self._last_error = _one_line(e.details() or e.code().name)
      self._future = self._call()  # Ask again.
      return False

  def succeeded(self) -> bool:
    return bool(self._settle())

  def wait(self, timeout_s: float) -> bool:
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
      try:
        self._future.result(timeout=max(0.0, deadline - time.monotonic()))
      except grpc.FutureTimeoutError:
        return False
      except grpc.RpcError:
        pass
      if self._settle():
        return True
      if time.monotonic() >= deadline:
        return False
      time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

  def reason(self) -> str:
    """Why the worker is not alive: the front's answer, or gRPC's reason
    the connection is not up (refused, TLS handshake failed, ...), from one
    fail-fast call; '' if there is none."""
    if self._last_error:
      return self._last_error
    try:
      self._channel.unary_unary(READY_METHOD)(
        b"", timeout=1.0, wait_for_ready=False
      )
    except grpc.RpcError as e:
      if e.code() == grpc.StatusCode.UNAVAILABLE:
        return _one_line(e.details() or "")
    return ""

  def close(self):
    self._future.cancel()
    workers_lib.close_channel(self._channel)


def check_workers(
  addresses: Sequence[str],
  timeout_s: float,
  *,
  flag_name: str = "--workers",
  tls: Optional[TlsConfig] = None,
) -> list[str]:
  """Raises `WorkerUnavailableError` unless every address answers the
  readiness probe (`_Probe`; with `tls` over a mutual-TLS handshake) within
  `timeout_s`, all probed in parallel. One-line message: `--workers: cannot
  reach TFF worker at host:port within Ns (the reason)`. Returns each
  worker's kind: 'front' or 'bare' (a `worker_binary` without our front)."""
  for address in addresses:
    parse_address(address)
  probes = [(address, _Probe(address, tls)) for address in addresses]
  deadline = time.monotonic() + timeout_s
  failed = []
  try:
    for address, probe in probes:
      if not probe.wait(deadline - time.monotonic()):
        failed.append((address, probe.reason()))
  finally:
    for _, probe in probes:
      probe.close()
  if not failed:
    return [probe.kind for _, probe in probes]
  noun = "worker" if len(failed) == 1 else "workers"
  reasons = "; ".join(r for _, r in failed if r)
  if "Socket closed" in reasons:
    reasons += (
      " (a worker serving TLS closes plaintext connections: pass"
      " --tls_cert, --tls_key and --tls_ca)"
      if tls is None
      else " (the worker ended the TLS handshake: it may not accept this"
      " driver's certificate; --tls_cert must be signed by the CA the"
      " worker's --tls_ca names)"
    )
  raise WorkerUnavailableError(
    f"{flag_name}: cannot reach TFF {noun} at"
    f" {', '.join(a for a, _ in failed)} within {timeout_s:g}s"
    + (f" ({reasons})" if reasons else "")
  )


def probe(
  address: str,
  timeout_s: float,
  tls: Optional[TlsConfig] = None,
) -> str:
  """Asks the worker at `address` whether it is ready: a `WorkerFront`
  whose worker answers, or a bare `worker_binary` (which answers the probe
  with UNIMPLEMENTED). Returns a one-line description; raises
  `WorkerUnavailableError` (one line, with the reason: refused connection,
  failed TLS handshake, a worker that does not answer...) otherwise."""
  kind = check_workers([address], timeout_s, flag_name="--probe", tls=tls)[0]
  if kind == "bare":
    return f"{address}: ready (a TFF worker without our front)"
  mode = "mutual TLS" if tls else "plaintext"
  return f"{address}: ready (tff-hetero worker front, {mode})"


# ---------------------------------------------------------------------------
# The bounded stub.


def _make_bounded_stub_class():
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.proto.v0 import executor_pb2
  from tensorflow_federated.proto.v0 import executor_pb2_grpc
  from tensorflow_federated.python.core.impl.executors import executors_errors
  from tensorflow_federated.python.core.impl.executors import (
    remote_executor_stub,
  )
  # pylint: enable=g-import-not-at-top

  _RESPONSE_TYPES = {
    "GetExecutor": executor_pb2.GetExecutorResponse,
    "CreateValue": executor_pb2.CreateValueResponse,
    "CreateStruct": executor_pb2.CreateStructResponse,
    "CreateCall": executor_pb2.CreateCallResponse,
    "CreateSelection": executor_pb2.CreateSelectionResponse,
    "Compute": executor_pb2.ComputeResponse,
  }

  class _BoundedExecutorStub(remote_executor_stub.RemoteExecutorStub):
    """`RemoteExecutorStub` whose RPCs cannot hang on a dead worker.

    See the module docstring for exactly what is bounded. Raises TFF's
    `RetryableError` only for a stale executor (FAILED_PRECONDITION, at most
    `_MAX_STALE_RETRIES` times in a row), so TFF's async context never
    retries an unreachable worker.
    """

    def __init__(
      self,
      address: str,
      *,
      worker_timeout_s: float,
      max_message_mb: int = DEFAULT_MAX_MESSAGE_MB,
      probe_interval_s: Optional[float] = None,
      tls: Optional[TlsConfig] = None,
    ):
      parse_address(address)
      if worker_timeout_s <= 0:
        raise ValueError(
          f"worker_timeout_s must be > 0, got {worker_timeout_s}"
        )
      self._address = address
      self._timeout_s = float(worker_timeout_s)
      self._probe_interval_s = (
        min(5.0, max(0.5, self._timeout_s / 4))
        if probe_interval_s is None
        else float(probe_interval_s)
      )
      self._tls = tls
      self._channel = secure_or_insecure_channel(
        address,
        workers_lib.grpc_channel_options(max_message_mb)
        + _MAIN_CHANNEL_EXTRA_OPTIONS,
        tls,
      )
      self._stub = executor_pb2_grpc.ExecutorGroupStub(self._channel)
      # The bounded calls send and receive serialized messages: a request
      # may come serialized already (`wire`), and the bytes counted below
      # are the payloads themselves, not a second serialization of them.
      service = executor_pb2.DESCRIPTOR.services_by_name["ExecutorGroup"]
      self._raw = {
        name: self._channel.unary_unary(
          f"/{service.full_name}/{name}",
          request_serializer=None,
          response_deserializer=None,
        )
        for name in _RESPONSE_TYPES
      }
      self._closed = threading.Event()
      # Set when a call gave up on the worker; disposal RPCs are skipped
      # until a call succeeds again (they would only add waiting).
      self._given_up = False
      self._stale_retries = 0
      self.rpc_counts: collections.Counter[str] = collections.Counter()
      # Serialized bytes of every successful call's request and response
      # (the gRPC messages' payloads), by direction.
      self.rpc_bytes: collections.Counter[str] = collections.Counter()
      self._counts_lock = threading.Lock()
      self._state = None
      self._channel.subscribe(self._on_state, try_to_connect=True)

    def _on_state(self, state):
      self._state = state

    @property
    def address(self) -> str:
      return self._address

    @property
    def worker_timeout_s(self) -> float:
      return self._timeout_s

    @property
    def is_ready(self) -> bool:
      return self._state == grpc.ChannelConnectivity.READY

    def close(self):
      """Cancels pending calls and closes the channel. Idempotent."""
      if not self._closed.is_set():
        self._closed.set()
        try:
          self._channel.unsubscribe(self._on_state)
        except Exception:  # pylint: disable=broad-except
          pass
        workers_lib.close_channel(self._channel)

    def _unreachable(self) -> WorkerUnavailableError:
      return WorkerUnavailableError(
        f"cannot reach TFF worker at {self._address} within"
        f" {self._timeout_s:g}s"
      )

    def _call(self, name: str, request):
      """Sends `request` (a message, or one serialized) and returns the
      response message, bounded as the module docstring says."""
      if self._closed.is_set():
        raise WorkerUnavailableError(
          f"connection to TFF worker at {self._address} is closed"
          " (execution context exited)"
        )
      if not isinstance(request, bytes):
        request = request.SerializeToString()
      try:
        future = self._raw[name].future(request, wait_for_ready=True)
      except ValueError as e:  # Channel closed concurrently.
        raise WorkerUnavailableError(
          f"connection to TFF worker at {self._address} is closed: {e}"
        ) from None
      last_alive = time.monotonic()
      next_probe = last_alive + self._probe_interval_s
      # Pending connection attempts. A slow one is kept (on a loaded machine
      # a handshake may take longer than the probe interval); an additional
      # fresh one (fresh back-off) is started once it is two intervals old.
      probes: list[_Probe] = []
      try:
        while True:
          try:
            payload = future.result(timeout=_POLL_S)
            response = _RESPONSE_TYPES[name].FromString(payload)
            self._given_up = False
            self._stale_retries = 0
            with self._counts_lock:  # Calls come from several RPC threads.
              self.rpc_counts[name] += 1
              self.rpc_bytes["sent"] += len(request)
              self.rpc_bytes["received"] += len(payload)
            return response
          except grpc.FutureTimeoutError:
            pass
          except grpc.FutureCancelledError:
            raise WorkerUnavailableError(
              f"call {name} to TFF worker at {self._address} was cancelled"
              " (execution context exited)"
            ) from None
          except grpc.RpcError as e:
            raise self._translate(name, e) from None
          now = time.monotonic()
          if self._closed.is_set():
            future.cancel()
            raise WorkerUnavailableError(
              f"call {name} to TFF worker at {self._address} abandoned: the"
              " execution context exited"
            )
          if any(p.succeeded() for p in probes):
            last_alive = now
            for p in probes:
              p.close()
            probes = []
          if now - last_alive > self._timeout_s:
            future.cancel()
            self._given_up = True
            raise self._unreachable()
          if now >= next_probe:
            next_probe = now + self._probe_interval_s
            if not probes or (
              now - probes[-1].started >= 2 * self._probe_interval_s
            ):
              probes.append(_Probe(self._address, self._tls))
              if len(probes) > 2:
                probes.pop(0).close()
      finally:
        for p in probes:
          p.close()

    def _translate(self, name: str, e: grpc.RpcError) -> Exception:
      code = e.code() if isinstance(e, grpc.Call) else None
      if code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
      ):
        details = e.details() if isinstance(e, grpc.Call) else str(e)
        self._given_up = True
        return WorkerUnavailableError(
          f"TFF worker at {self._address} became unavailable during {name}"
          f" (worker_timeout_s={self._timeout_s:g}):"
          f" {_one_line(details, 160)}"
        )
      if (
        code == grpc.StatusCode.FAILED_PRECONDITION
        and self._stale_retries < _MAX_STALE_RETRIES
      ):
        # "No executor found for ID": the worker was restarted since our
        # executor was created there. TFF's context drops the executor and
        # retries the invocation, which creates a fresh one.
        self._stale_retries += 1
        return executors_errors.RetryableGRPCError(e)
      return e  # An error the worker returned: not retried, unchanged.

    def _best_effort(self, name: str, request, response_type):
      if self._closed.is_set() or self._given_up or not self.is_ready:
        return response_type()
      try:
        return getattr(self._stub, name)(
          request, timeout=min(self._timeout_s, 2.0), wait_for_ready=False
        )
      except Exception as e:  # pylint: disable=broad-except
        logging.debug("Ignoring failed %s to %s: %s", name, self._address, e)
        return response_type()

    def get_executor(self, request):
      return self._call("GetExecutor", request)

    def create_value(self, request):
      return self._call("CreateValue", request)

    def create_struct(self, request):
      return self._call("CreateStruct", request)

    def create_call(self, request):
      return self._call("CreateCall", request)

    def create_selection(self, request):
      return self._call("CreateSelection", request)

    def compute(self, request):
      return self._call("Compute", request)

    def dispose(self, request):
      return self._best_effort("Dispose", request, executor_pb2.DisposeResponse)

    def dispose_executor(self, request):
      return self._best_effort(
        "DisposeExecutor", request, executor_pb2.DisposeExecutorResponse
      )

  return _BoundedExecutorStub


_BOUNDED_STUB_CLASS = None


def BoundedExecutorStub(address: str, **kwargs):  # pylint: disable=invalid-name
  """Creates a `tff.framework.RemoteExecutorStub` for `address` whose calls
  are bounded as described in the module docstring. Keyword arguments:
  `worker_timeout_s` (required), `max_message_mb`, `probe_interval_s`."""
  global _BOUNDED_STUB_CLASS
  if _BOUNDED_STUB_CLASS is None:
    _BOUNDED_STUB_CLASS = _make_bounded_stub_class()
  return _BOUNDED_STUB_CLASS(address, **kwargs)
