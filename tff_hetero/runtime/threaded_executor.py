"""TFF's `RemoteExecutor` with its RPCs sent from a thread pool.

TFF's `RemoteExecutor` makes blocking gRPC calls inside its coroutines, so
under the mergeable context (one event loop driving every worker) the
subrounds would run one after another. `threaded_remote_executor_class()`
returns a subclass whose value-creating RPCs and `Compute` run in a shared
thread pool, so the workers compute in parallel.

Its methods are copies of TFF 0.87.0's `RemoteExecutor` methods
(`tensorflow_federated/python/core/impl/executors/remote_executor.py`) with
the blocking stub call moved to the pool; they rely on that version's
private attributes (`_executor_id`, `_stub`, `_check_has_executor_id`).
One departs from its original: `create_value` serializes its request with
`wire.create_value_request_bytes` (the same message without copying a
round's client data into it twice, `wire`'s docstring), in the thread, and
hands the stub those bytes: the stub must accept serialized requests, as
`bounded_stub.BoundedExecutorStub` does (TFF's own stub does not). The
class is built only under the TFF version they were copied from
(`COPIED_FROM_TFF`): another version raises `RuntimeError` naming both, so
an upgrade re-reads them instead of running stale copies.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import importlib.metadata
import threading
from typing import Optional

from tff_hetero.runtime import wire

COPIED_FROM_TFF = "0.87.0"


def check_tff_version(installed: Optional[str] = None) -> None:
  """`RuntimeError` unless TFF is the version the methods were copied from."""
  installed = installed or importlib.metadata.version("tensorflow-federated")
  if installed != COPIED_FROM_TFF:
    raise RuntimeError(
      "tff_hetero.runtime.threaded_executor copies RemoteExecutor methods of"
      f" tensorflow-federated {COPIED_FROM_TFF}, but {installed} is installed:"
      " compare them with the installed remote_executor.py and update"
      " COPIED_FROM_TFF"
    )


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


def threaded_remote_executor_class():
  """`RemoteExecutor` whose slow RPCs leave the event loop free.

  TFF's `RemoteExecutor` makes blocking gRPC calls inside its coroutines, so
  under the mergeable context (one event loop driving every worker) the
  subrounds would run one after another (the C++ worker does the work of a
  federated computation inside `CreateCall`, which blocks). Sending every
  value-creating RPC and `Compute` from a thread (`_in_rpc_thread`) lets
  the workers compute in parallel. Only `stream_structs=False` (TFF's default)
  is supported.
  """
  check_tff_version()
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
      # TFF's request, serialized without copies (`wire`), in the thread.
      self._check_has_executor_id()
      # Read here: TFF's `close` may clear it before the thread runs.
      executor_id = self._executor_id

      def send():
        request, value_type = wire.create_value_request_bytes(
          executor_id, value, type_spec
        )
        return self._stub.create_value(request), value_type

      response, type_spec = await _in_rpc_thread(send)
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
