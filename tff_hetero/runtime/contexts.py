"""TFF execution contexts whose workers and connections we own.

Three ways to run TFF computations, all context managers that install a TFF
execution context on entry and restore the previous one on exit (normal exit or
exception alike):

* `local_execution()`: starts our own `WorkerProcess` on this machine (see
  `workers.py`) and talks to it exactly like to a remote worker. This replaces
  TFF's default `local_cpp` context, whose worker leaks. The worker is stopped
  on exit.
* `remote_execution(['host:port', ...])`: TFF workers started elsewhere (e.g.
  with `python -m pipelines.worker --port=N`). One address: a remote executor
  stack in a `SyncExecutionContext`. Several: TFF's
  `MergeableCompExecutionContext`, one async remote context per worker; each
  invocation's CLIENTS-placed arguments are split into one subround per
  worker (contiguous chunks), whose results are merged on the driver. A
  computation must then compile to TFF's `MergeableCompForm`: no aggregation
  may depend on the result of another (FedAvg's `next` qualifies; a
  computation that broadcasts an aggregate and aggregates again fails with
  TFF's `ValueError: Detected one aggregate dependent on another`). Every
  worker is health-checked on entry.
* `execution_context(executor, workers, worker_timeout_s)`: picks one of the
  above by name from a small registry (`register_executor` adds more).

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

Threads: TFF's context stack is thread-local; the installed context is visible
in the thread that entered the `with` block only.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import os
import threading
import time
from typing import Any
from typing import Optional
import weakref

from absl import logging
import grpc

from tff_hetero.runtime import heap
from tff_hetero.runtime import workers as workers_lib
from tff_hetero.runtime.workers import DEFAULT_MAX_MESSAGE_MB
from tff_hetero.runtime.workers import WorkerProcess
from tff_hetero.runtime.workers import WorkerUnavailableError

__all__ = [
  "BoundedExecutorStub",
  "DEFAULT_WORKER_TIMEOUT_S",
  "ExecutionHandle",
  "available_executors",
  "check_workers",
  "execution_context",
  "local_execution",
  "parse_address",
  "register_executor",
  "remote_execution",
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
  """Splits 'host:port' (or '[v6addr]:port') and validates the port."""
  text = str(address).strip()
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
  """A fresh gRPC connection attempt to `address` (own subchannel)."""

  def __init__(self, address: str):
    self.started = time.monotonic()
    self._channel = grpc.insecure_channel(
      address, options=_PROBE_CHANNEL_OPTIONS
    )
    self._future = grpc.channel_ready_future(self._channel)

  def succeeded(self) -> bool:
    if not self._future.done() or self._future.cancelled():
      return False
    try:
      self._future.result(timeout=0)
      return True
    except Exception:  # pylint: disable=broad-except
      return False

  def wait(self, timeout_s: float) -> bool:
    try:
      self._future.result(timeout=max(0.0, timeout_s))
      return True
    except grpc.FutureTimeoutError:
      return False

  def close(self):
    self._future.cancel()
    workers_lib.close_channel(self._channel)


def check_workers(
  addresses: Sequence[str], timeout_s: float, *, flag_name: str = "--workers"
) -> None:
  """Raises `WorkerUnavailableError` unless every address accepts a gRPC
  connection within `timeout_s` (all probed in parallel). One-line message:
  `--workers: cannot reach TFF worker at host:port within Ns`."""
  for address in addresses:
    parse_address(address)
  probes = [(address, _Probe(address)) for address in addresses]
  deadline = time.monotonic() + timeout_s
  failed = []
  try:
    for address, probe in probes:
      if not probe.wait(deadline - time.monotonic()):
        failed.append(address)
  finally:
    for _, probe in probes:
      probe.close()
  if failed:
    noun = "worker" if len(failed) == 1 else "workers"
    raise WorkerUnavailableError(
      f"{flag_name}: cannot reach TFF {noun} at {', '.join(failed)} within"
      f" {timeout_s:g}s"
    )


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
      self._channel = grpc.insecure_channel(
        address,
        options=workers_lib.grpc_channel_options(max_message_mb)
        + _MAIN_CHANNEL_EXTRA_OPTIONS,
      )
      self._stub = executor_pb2_grpc.ExecutorGroupStub(self._channel)
      self._closed = threading.Event()
      # Set when a call gave up on the worker; disposal RPCs are skipped
      # until a call succeeds again (they would only add waiting).
      self._given_up = False
      self._stale_retries = 0
      self.rpc_counts: collections.Counter[str] = collections.Counter()
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
      if self._closed.is_set():
        raise WorkerUnavailableError(
          f"connection to TFF worker at {self._address} is closed"
          " (execution context exited)"
        )
      method = getattr(self._stub, name)
      try:
        future = method.future(request, wait_for_ready=True)
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
            response = future.result(timeout=_POLL_S)
            self._given_up = False
            self._stale_retries = 0
            self.rpc_counts[name] += 1
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
              probes.append(_Probe(self._address))
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


# ---------------------------------------------------------------------------
# Executor stacks and contexts.


_RPC_POOL_LOCK = threading.Lock()
_RPC_POOL: Optional[concurrent.futures.ThreadPoolExecutor] = None


async def _in_rpc_thread(fn, *args):
  """Runs blocking `fn(*args)` in a thread of a pool shared by all stubs
  (large enough for one blocking call per worker of a big mergeable
  context), keeping the caller's contextvars (TFF's tracing uses them)."""
  global _RPC_POOL
  with _RPC_POOL_LOCK:
    if _RPC_POOL is None:
      _RPC_POOL = concurrent.futures.ThreadPoolExecutor(
        max_workers=64, thread_name_prefix="tff-hetero-rpc"
      )
  context = contextvars.copy_context()
  return await asyncio.get_running_loop().run_in_executor(
    _RPC_POOL, functools.partial(context.run, fn, *args)
  )


def _make_threaded_remote_executor_class():
  """`RemoteExecutor` whose slow RPCs leave the event loop free.

  TFF's `RemoteExecutor` makes blocking gRPC calls inside its coroutines, so
  under the mergeable context (one event loop driving every worker) the
  subrounds would run one after another (the C++ worker does the work of a
  federated computation inside `CreateCall`, which blocks). Sending every
  value-creating RPC and `Compute` from a thread (`_in_rpc_thread`) lets
  the workers compute in parallel. Only `stream_structs=False` (TFF's default)
  is supported.
  """
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.proto.v0 import executor_pb2
  from tensorflow_federated.python.common_libs import structure
  from tensorflow_federated.python.core.impl.executors import remote_executor
  from tensorflow_federated.python.core.impl.executors import (
    value_serialization,
  )
  from tensorflow_federated.python.core.impl.types import computation_types
  # pylint: enable=g-import-not-at-top

  class _ThreadedRemoteExecutor(remote_executor.RemoteExecutor):
    """Same requests as `RemoteExecutor`, sent from a worker thread."""

    async def create_value(self, value, type_spec=None):
      self._check_has_executor_id()
      value_proto, type_spec = value_serialization.serialize_value(
        value, type_spec
      )
      request = executor_pb2.CreateValueRequest(
        executor=self._executor_id, value=value_proto
      )
      response = await _in_rpc_thread(self._stub.create_value, request)
      return remote_executor.RemoteValue(response.value_ref, type_spec, self)

    async def create_call(self, comp, arg=None):
      self._check_has_executor_id()
      request = executor_pb2.CreateCallRequest(
        executor=self._executor_id,
        function_ref=comp.reference,
        argument_ref=(arg.reference if arg is not None else None),
      )
      response = await _in_rpc_thread(self._stub.create_call, request)
      return remote_executor.RemoteValue(
        response.value_ref, comp.type_signature.result, self
      )

    async def create_struct(self, elements):
      self._check_has_executor_id()
      elements = structure.from_container(elements)
      proto_elements = []
      type_elements = []
      for name, value in structure.iter_elements(elements):
        proto_elements.append(
          executor_pb2.CreateStructRequest.Element(
            name=(name if name else None), value_ref=value.reference
          )
        )
        type_elements.append(
          (name, value.type_signature) if name else value.type_signature
        )
      request = executor_pb2.CreateStructRequest(
        executor=self._executor_id, element=proto_elements
      )
      response = await _in_rpc_thread(self._stub.create_struct, request)
      return remote_executor.RemoteValue(
        response.value_ref, computation_types.StructType(type_elements), self
      )

    async def create_selection(self, source, index):
      self._check_has_executor_id()
      request = executor_pb2.CreateSelectionRequest(
        executor=self._executor_id, source_ref=source.reference, index=index
      )
      response = await _in_rpc_thread(self._stub.create_selection, request)
      return remote_executor.RemoteValue(
        response.value_ref, source.type_signature[index], self
      )

    async def _compute(self, value_ref, type_spec):
      self._check_has_executor_id()
      request = executor_pb2.ComputeRequest(
        executor=self._executor_id, value_ref=value_ref
      )
      response = await _in_rpc_thread(self._stub.compute, request)
      value, _ = value_serialization.deserialize_value(
        response.value, type_spec
      )
      return value

  return _ThreadedRemoteExecutor


class _RemoteStack:
  """One worker's stub, executor factory and the executors it created."""

  def __init__(
    self,
    address: str,
    *,
    worker_timeout_s: float,
    default_num_clients: int,
    max_message_mb: int,
  ):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.types import placements  # pylint: disable=g-import-not-at-top

    self.address = address
    self.stub = BoundedExecutorStub(
      address, worker_timeout_s=worker_timeout_s, max_message_mb=max_message_mb
    )
    executor_class = _make_threaded_remote_executor_class()
    self._executors: list[weakref.ref] = []
    self.client_cardinalities: list[int] = []
    clients = placements.CLIENTS

    def stack_fn(cardinalities):
      # The worker builds its federating executor from the cardinalities we
      # send; computations with no CLIENTS-placed argument (initialize, the
      # merge stages of the mergeable context) would send none, so fill in a
      # default like TFF's own local factory does.
      if cardinalities.get(clients) is None:
        cardinalities[clients] = default_num_clients
      executor = executor_class(self.stub)
      executor.set_cardinalities(cardinalities)
      self._executors.append(weakref.ref(executor))
      self.client_cardinalities.append(int(cardinalities[clients]))
      return executor

    self.factory = tff.framework.ResourceManagingExecutorFactory(stack_fn)

  def close(self, dispose: bool = True):
    """Closes the connection; first frees the worker's executors (best
    effort, <= 2 s each) when `dispose`: a long-lived remote worker keeps
    their values in memory otherwise."""
    if dispose:
      for ref in self._executors:
        executor = ref()
        if executor is not None:
          try:
            executor.close()  # DisposeExecutor.
          except Exception:  # pylint: disable=broad-except
            pass
    self._executors.clear()
    self.stub.close()


def _context_kwargs():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_frontend import (
    tensorflow_computation,
  )  # pylint: disable=g-import-not-at-top

  return dict(
    compiler_fn=tff.backends.native.desugar_and_transform_to_native,
    transform_args=tensorflow_computation.transform_args,
    transform_result=tensorflow_computation.transform_result,
  )


def _build_context(
  stacks: Sequence[_RemoteStack], num_subrounds: Optional[int]
):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  if len(stacks) == 1 and num_subrounds in (None, 1):
    return tff.framework.SyncExecutionContext(
      executor_fn=stacks[0].factory, **_context_kwargs()
    )
  async_contexts = [
    tff.framework.AsyncExecutionContext(
      executor_fn=stack.factory, **_context_kwargs()
    )
    for stack in stacks
  ]
  return tff.backends.native.create_mergeable_comp_execution_context(
    async_contexts, num_subrounds=num_subrounds
  )


@dataclasses.dataclass(frozen=True)
class ExecutionHandle:
  """What the execution-context managers yield.

  Attributes:
    kind: 'local' or 'remote' (or a registered name).
    addresses: 'host:port' of every worker used, in subround order.
    worker_timeout_s: the bound described in the module docstring.
    context: the installed TFF context (`SyncExecutionContext`, or
      `MergeableCompExecutionContext` when there are several workers).
    workers: the `WorkerProcess`es this context started (local only).
  """

  kind: str
  addresses: tuple[str, ...]
  worker_timeout_s: float
  context: Any
  workers: tuple[WorkerProcess, ...] = ()
  _stacks: tuple[_RemoteStack, ...] = dataclasses.field(
    default=(), repr=False, compare=False
  )

  @property
  def mergeable(self) -> bool:
    """True when computations run through TFF's mergeable context."""
    return not isinstance(self.context, _sync_context_class())

  def rpc_counts(self) -> dict[str, dict[str, int]]:
    """Successful RPCs so far, by worker address and RPC name (diagnostics)."""
    return {s.address: dict(s.stub.rpc_counts) for s in self._stacks}

  def client_cardinalities(self) -> dict[str, list[int]]:
    """CLIENTS cardinality of each executor created on each worker, in order:
    shows how the mergeable context split the clients (diagnostics)."""
    return {s.address: list(s.client_cardinalities) for s in self._stacks}


def _sync_context_class():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  return tff.framework.SyncExecutionContext


@contextlib.contextmanager
def _run_on(
  kind: str,
  addresses: Sequence[str],
  *,
  worker_timeout_s: float,
  default_num_clients: int,
  max_message_mb: int,
  num_subrounds: Optional[int],
  workers: Sequence[WorkerProcess] = (),
  dispose_on_exit: bool = True,
) -> Iterator[ExecutionHandle]:
  """Builds one stack per address, installs the context, closes on exit."""
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )  # pylint: disable=g-import-not-at-top

  stacks: list[_RemoteStack] = []
  try:
    for address in addresses:
      stacks.append(
        _RemoteStack(
          address,
          worker_timeout_s=worker_timeout_s,
          default_num_clients=default_num_clients,
          max_message_mb=max_message_mb,
        )
      )
    context = _build_context(stacks, num_subrounds)
    handle = ExecutionHandle(
      kind=kind,
      addresses=tuple(addresses),
      worker_timeout_s=worker_timeout_s,
      context=context,
      workers=tuple(workers),
      _stacks=tuple(stacks),
    )
    with context_stack_impl.context_stack.install(context):
      yield handle
  finally:
    for stack in stacks:
      stack.close(dispose=dispose_on_exit)


def _check_timeout(worker_timeout_s: float) -> float:
  worker_timeout_s = float(worker_timeout_s)
  if not worker_timeout_s > 0:
    raise ValueError(f"worker_timeout_s must be > 0, got {worker_timeout_s}")
  return worker_timeout_s


@contextlib.contextmanager
def remote_execution(
  addresses: Sequence[str],
  *,
  worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
  default_num_clients: int = 0,
  max_message_mb: int = DEFAULT_MAX_MESSAGE_MB,
  num_subrounds: Optional[int] = None,
) -> Iterator[ExecutionHandle]:
  """Runs TFF computations on already running TFF workers.

  Args:
    addresses: 'host:port' of each worker (`python -m pipelines.worker`).
      One: a sync remote context. Several: TFF's mergeable context, clients
      split in contiguous chunks, one subround per worker (computations must
      then be compilable to `MergeableCompForm`: no aggregation may depend
      on the result of another; FedAvg-style rounds qualify).
    worker_timeout_s: bound on waiting for an unresponsive worker, used for
      the entry health check and every RPC (see module docstring).
    default_num_clients: CLIENTS cardinality sent when a computation has no
      CLIENTS-placed argument.
    max_message_mb: gRPC message limit; must not exceed the workers'.
    num_subrounds: mergeable context only (see TFF); defaults to one per
      worker.

  Raises:
    WorkerUnavailableError: on entry if a worker does not accept a connection
      within `worker_timeout_s` (one line, naming the address).
    ValueError: a malformed or duplicate address.
  """
  worker_timeout_s = _check_timeout(worker_timeout_s)
  addresses = tuple(str(a).strip() for a in addresses)
  if not addresses:
    raise ValueError("remote_execution needs at least one worker address")
  if len(set(addresses)) != len(addresses):
    raise ValueError(f"--workers: duplicate addresses in {','.join(addresses)}")
  check_workers(addresses, worker_timeout_s)
  with _run_on(
    "remote",
    addresses,
    worker_timeout_s=worker_timeout_s,
    default_num_clients=default_num_clients,
    max_message_mb=max_message_mb,
    num_subrounds=num_subrounds,
  ) as handle:
    yield handle


def _start_local_worker(
  *, start_timeout_s, max_message_mb, max_concurrent_computation_calls, log_dir
) -> WorkerProcess:
  """Starts a worker on a free port; retries a port clash (see workers.py)."""
  attempts = 3
  for attempt in range(attempts):
    port = workers_lib.find_free_port()
    worker = WorkerProcess(
      port,
      max_message_mb=max_message_mb,
      max_concurrent_computation_calls=max_concurrent_computation_calls,
      log_path=(
        os.path.join(log_dir, f"tff_worker_{port}.log") if log_dir else None
      ),
    )
    try:
      worker.start()
      worker.wait_ready(start_timeout_s)
      return worker
    except workers_lib.PortInUseError:
      worker.stop()
      if attempt == attempts - 1:
        raise
    except BaseException:
      worker.stop()
      raise
  raise AssertionError("unreachable")


@contextlib.contextmanager
def local_execution(
  *,
  worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
  default_num_clients: int = 0,
  num_workers: int = 1,
  start_timeout_s: float = 60.0,
  max_message_mb: int = DEFAULT_MAX_MESSAGE_MB,
  max_concurrent_computation_calls: int = -1,
  log_dir: Optional[str] = None,
) -> Iterator[ExecutionHandle]:
  """Runs TFF computations on worker processes we start and stop ourselves.

  Starts `num_workers` `WorkerProcess`es on free ports (reached on
  127.0.0.1; they listen on all interfaces, see `workers.py`), waits up to
  `start_timeout_s` for each, and installs the same context `remote_execution`
  would for their addresses (several workers: the mergeable context). On exit
  (normal, exception, KeyboardInterrupt, `signals.Terminated`) the previous
  context is restored and the workers are stopped (SIGTERM, then SIGKILL).

  Args:
    worker_timeout_s: see the module docstring.
    default_num_clients: CLIENTS cardinality for computations without a
      CLIENTS-placed argument.
    num_workers: >1 runs TFF's mergeable context over local workers.
    start_timeout_s: how long a worker may take to answer after starting.
    max_message_mb: gRPC message limit (worker flag and channel options).
    max_concurrent_computation_calls: passed to the worker.
    log_dir: if set, worker logs go to `log_dir/tff_worker_<port>.log`;
      otherwise to /dev/null.

  Raises:
    WorkerStartError: a worker did not start or answer in time.
  """
  worker_timeout_s = _check_timeout(worker_timeout_s)
  if num_workers < 1:
    raise ValueError(f"num_workers must be >= 1, got {num_workers}")
  if log_dir:
    os.makedirs(log_dir, exist_ok=True)
  started: list[WorkerProcess] = []
  try:
    for _ in range(num_workers):
      started.append(
        _start_local_worker(
          start_timeout_s=start_timeout_s,
          max_message_mb=max_message_mb,
          max_concurrent_computation_calls=max_concurrent_computation_calls,
          log_dir=log_dir,
        )
      )
    with _run_on(
      "local",
      [w.address for w in started],
      worker_timeout_s=worker_timeout_s,
      default_num_clients=default_num_clients,
      max_message_mb=max_message_mb,
      num_subrounds=None,
      workers=started,
      dispose_on_exit=False,  # The workers are stopped right after.
    ) as handle:
      yield handle
  finally:
    for worker in started:
      worker.stop()


# ---------------------------------------------------------------------------
# Registry.

ExecutorFactoryFn = Callable[..., contextlib.AbstractContextManager]
_REGISTRY: dict[str, ExecutorFactoryFn] = {}


def register_executor(name: str, factory: ExecutorFactoryFn) -> None:
  """Registers `factory(workers, worker_timeout_s=..., **kwargs)` under `name`.

  The factory returns a context manager yielding an `ExecutionHandle`.
  """
  _REGISTRY[name] = factory


def available_executors() -> tuple[str, ...]:
  return tuple(sorted(_REGISTRY))


def _local_factory(workers: Sequence[str], **kwargs):
  if workers:
    raise ValueError(
      "--executor=local starts its own worker; --workers must be empty"
      f" (got {','.join(workers)})"
    )
  return local_execution(**kwargs)


def _remote_factory(workers: Sequence[str], **kwargs):
  if not workers:
    raise ValueError("--executor=remote needs --workers=host:port[,host:port]")
  kwargs.pop("num_workers", None)
  return remote_execution(workers, **kwargs)


def _auto_factory(workers: Sequence[str], **kwargs):
  return (_remote_factory if workers else _local_factory)(workers, **kwargs)


register_executor("local", _local_factory)
register_executor("remote", _remote_factory)
register_executor("auto", _auto_factory)


def _split_workers(workers) -> tuple[str, ...]:
  if workers is None:
    return ()
  if isinstance(workers, str):
    workers = workers.split(",")
  return tuple(w.strip() for w in workers if w and w.strip())


def execution_context(
  executor: str = "auto",
  workers: Sequence[str] | str | None = (),
  worker_timeout_s: float = DEFAULT_WORKER_TIMEOUT_S,
  **kwargs,
) -> contextlib.AbstractContextManager:
  """The context manager registered as `executor` ('local', 'remote', 'auto').

  `workers` may be a sequence or a comma-separated string ('' = none).
  'auto' is 'remote' when workers are given, else 'local'. Extra keyword
  arguments go to `local_execution` / `remote_execution`
  (e.g. `default_num_clients`). Fixes this process's mmap threshold and
  arena limit (`heap.py`) so that resident memory stays flat over long
  runs.
  """
  try:
    factory = _REGISTRY[executor]
  except KeyError:
    raise ValueError(
      f"--executor: unknown executor {executor!r}; choose from"
      f" {', '.join(available_executors())}"
    ) from None
  heap.configure_process_heap()
  return factory(
    _split_workers(workers), worker_timeout_s=worker_timeout_s, **kwargs
  )
