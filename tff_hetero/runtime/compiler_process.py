"""Compiling TFF computations for a worker in a Python process of its own.

`contexts.AheadOfTimeCompiler` compiles a computation for the worker
(`contexts._compile_for_worker`: TFF's native form, Grappler over its
graphs) while the program traces the next one. On a thread of the driver,
that compilation's Python (TFF's building-block passes, type
deserialization, the graphs imported into `tf.Graph`s for Grappler) holds
the GIL that the tracing thread needs: InclusiveFL's first round traced its
three groups in 15.0 s with nothing compiling beside it and in about 30 s
with the compile thread running (docs/performance.md, "Cold start: compiling
in a process of its own"). `CompilerProcess` runs the same function in a
child Python process instead, so that the two use a core each.

Protocol, over the child's stdin and stdout (binary pipes; the child points
its own file descriptor 1 at its stderr, so nothing else can write into
the reply stream): each request is a frame, an 8-byte big-endian length and
that many bytes of a serialized `pb.Computation`; each reply is a frame
whose first byte is `OK` (the rest: the compiled `pb.Computation`) or
`FAILED` (the rest: a one-line reason in UTF-8). The child compiles one
request at a time, in order, and exits when its stdin closes.

The parent never depends on the child for a result: when the child reports
a failure, or dies, or cannot be started, `compile` compiles the
computation in the calling process (where a genuine compilation error is
raised as it would have been without the child) and, if the child is gone,
does so from then on. The child cannot outlive its parent: it is started
through `_pdeathsig_exec.py` (SIGTERM when the parent dies, SIGKILL
included, as the workers are), from a thread that lives as long as the
process (`workers._SPAWNER`), and `close` (or, at interpreter exit, an
`atexit` hook) stops it. `testing.compiler_processes` finds it by its
command line.

Type signature: `compile(c)` returns a computation of `c`'s type (the
compiled proto's own, as `_compile_for_worker`'s result has).
"""

from __future__ import annotations

import atexit
import os
import struct
import subprocess
import sys
import threading
from typing import Any
from typing import Callable
from typing import Optional

MODULE = "tff_hetero.runtime.compiler_process"
OK = b"\x00"
FAILED = b"\x01"
_HEADER = struct.Struct(">Q")

_LIVE_LOCK = threading.Lock()
_LIVE: dict[int, "CompilerProcess"] = {}


def _read_exactly(stream, size: int) -> Optional[bytes]:
  """`size` bytes from `stream`, or None at end of file."""
  chunks, remaining = [], size
  while remaining:
    chunk = stream.read(remaining)
    if not chunk:
      return None
    chunks.append(chunk)
    remaining -= len(chunk)
  return b"".join(chunks)


def read_frame(stream) -> Optional[bytes]:
  """One frame's payload, or None when the stream ends (before or inside
  the frame)."""
  header = _read_exactly(stream, _HEADER.size)
  if header is None:
    return None
  return _read_exactly(stream, _HEADER.unpack(header)[0])


def write_frame(stream, payload: bytes) -> None:
  stream.write(_HEADER.pack(len(payload)))
  stream.write(payload)
  stream.flush()


def _package_root() -> str:
  """The directory holding the `tff_hetero` package this process runs."""
  return os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )


def _child_environment() -> dict[str, str]:
  """This process's environment, with the `tff_hetero` it runs first on
  the child's path (a checkout, a Bazel runfiles tree or an install)."""
  env = dict(os.environ)
  path = [_package_root()]
  if env.get("PYTHONPATH"):
    path.append(env["PYTHONPATH"])
  env["PYTHONPATH"] = os.pathsep.join(path)
  return env


class CompilerProcess:
  """A child Python process that compiles computations (module docstring).

  `compile` is thread-safe (one request at a time). The child is started
  by `start` or at the first `compile`; `pid` is None before.
  """

  def __init__(self, compile_fn: Optional[Callable[[Any], Any]] = None):
    """`compile_fn` compiles in this process when the child cannot
    (default `contexts._compile_for_worker`, what the child runs)."""
    self._compile_fn = compile_fn
    self._lock = threading.Lock()  # The fields below.
    self._request_lock = threading.Lock()  # One request in flight.
    self._proc: Optional[subprocess.Popen] = None
    self._broken: Optional[str] = None  # Why the child is not used.
    self._closed = False

  @property
  def pid(self) -> Optional[int]:
    return None if self._proc is None else self._proc.pid

  @property
  def broken(self) -> Optional[str]:
    """Why compilations no longer go to the child (None while they do)."""
    return self._broken

  def start(self) -> "CompilerProcess":
    """Starts the child (does not wait for it to import TensorFlow)."""
    from tff_hetero.runtime import workers  # pylint: disable=g-import-not-at-top

    with self._lock:
      if self._proc is not None or self._broken or self._closed:
        return self
      try:
        self._proc = workers._SPAWNER.popen(  # pylint: disable=protected-access
          workers._with_pdeathsig([sys.executable, "-m", MODULE]),  # pylint: disable=protected-access
          stdin=subprocess.PIPE,
          stdout=subprocess.PIPE,
          stderr=subprocess.DEVNULL,
          close_fds=True,
          env=_child_environment(),
        )
      except OSError as e:
        self._broken = f"cannot start the compiler process: {e}"
        return self
      with _LIVE_LOCK:
        _LIVE[self._proc.pid] = self
    return self

  def compile(self, computation):
    """`computation` compiled for the worker: by the child, or here if the
    child cannot (module docstring)."""
    from tensorflow_federated.proto.v0 import computation_pb2  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.computation import (
      computation_impl,
    )  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.context_stack import (
      context_stack_impl,
    )  # pylint: disable=g-import-not-at-top

    if not isinstance(computation, computation_impl.ConcreteComputation):
      return self._local_compile_fn()(computation)
    self.start()
    request = computation_impl.ConcreteComputation.get_proto(
      computation
    ).SerializeToString()
    reply = None
    with self._request_lock:
      with self._lock:
        proc = None if self._broken or self._closed else self._proc
      if proc is not None:
        try:
          write_frame(proc.stdin, request)
          reply = read_frame(proc.stdout)
        except (OSError, ValueError):  # A closed or broken pipe.
          reply = None
        if reply is None:
          with self._lock:
            if self._closed:
              raise RuntimeError("the compiler process was closed")
            self._broken = "the compiler process exited"
            self._stop_locked()
    if reply is not None and reply[:1] == OK:
      return computation_impl.ConcreteComputation(
        computation_proto=computation_pb2.Computation.FromString(reply[1:]),
        context_stack=context_stack_impl.context_stack,
      )
    # The child failed or is gone: compile here, raising what it raises.
    return self._local_compile_fn()(computation)

  def _local_compile_fn(self):
    if self._compile_fn is not None:
      return self._compile_fn
    from tff_hetero.runtime import contexts  # pylint: disable=g-import-not-at-top

    return contexts._compile_for_worker  # pylint: disable=protected-access

  def close(self, timeout_s: float = 5.0) -> None:
    """Stops the child without waiting for a compilation under way (its
    `compile` raises RuntimeError). Idempotent."""
    with self._lock:
      self._closed = True
      self._stop_locked(timeout_s)

  def _stop_locked(self, timeout_s: float = 5.0) -> None:
    proc = self._proc
    if proc is None:
      return
    try:
      if proc.poll() is None:
        proc.terminate()
        try:
          proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
          proc.kill()
          proc.wait()
    finally:
      for stream in (proc.stdin, proc.stdout):
        try:
          stream.close()
        except OSError:
          pass
      with _LIVE_LOCK:
        if _LIVE.get(proc.pid) is self:
          del _LIVE[proc.pid]


def live_compiler_processes() -> list[CompilerProcess]:
  """Compiler processes started by this process and not yet stopped."""
  with _LIVE_LOCK:
    return list(_LIVE.values())


def _stop_all() -> None:
  for process in live_compiler_processes():
    try:
      process.close(timeout_s=1.0)
    except Exception:  # pylint: disable=broad-except
      pass


atexit.register(_stop_all)


def _serve(requests, replies) -> None:
  """The child's loop: compile each request until stdin closes."""
  from tensorflow_federated.proto.v0 import computation_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.computation import computation_impl  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )  # pylint: disable=g-import-not-at-top

  from tff_hetero.runtime import contexts  # pylint: disable=g-import-not-at-top

  while True:
    request = read_frame(requests)
    if request is None:
      return
    try:
      compiled = contexts._compile_for_worker(  # pylint: disable=protected-access
        computation_impl.ConcreteComputation(
          computation_proto=computation_pb2.Computation.FromString(request),
          context_stack=context_stack_impl.context_stack,
        )
      )
      reply = (
        OK
        + computation_impl.ConcreteComputation.get_proto(
          compiled
        ).SerializeToString()
      )
    except Exception as e:  # pylint: disable=broad-except
      reason = " ".join(f"{type(e).__name__}: {e}".split())[:500]
      reply = FAILED + reason.encode("utf-8", "replace")
    write_frame(replies, reply)


def memoize_type_deserialization() -> None:
  """Makes TFF's `type_serialization.deserialize_type` return the type it
  already built from an equal type proto, in this process.

  TFF deserializes the type of every building block when it reads a
  computation (`building_blocks.*.from_proto`), and again for each nested
  part: compiling one InclusiveFL group's round deserialized a type 228,452
  times. TFF's types are immutable (its `_Intern` metaclass shares one
  object among equal tensor types), so an equal type built before serves
  as well as a new one. Compiling InclusiveFL's four first-round computations took
  12.4 s with it and 17.0 s without (`_compile_for_worker`, one process).
  Applied in the child only, whose TFF runs nothing else."""
  from tensorflow_federated.python.core.impl.types import type_serialization  # pylint: disable=g-import-not-at-top

  deserialize = type_serialization.deserialize_type
  if getattr(deserialize, "memoized", False):
    return
  built = {}

  def memoized(type_proto):
    if type_proto is None:
      return deserialize(type_proto)
    key = type_proto.SerializeToString(deterministic=True)
    found = built.get(key)
    if found is None:
      found = built[key] = deserialize(type_proto)
    return found

  memoized.memoized = True
  type_serialization.deserialize_type = memoized


def main() -> None:
  # The replies get a file descriptor of their own; fd 1 (print, a library
  # writing to stdout) goes to stderr instead.
  replies = os.fdopen(os.dup(1), "wb")
  os.dup2(2, 1)
  requests = os.fdopen(os.dup(0), "rb")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  memoize_type_deserialization()
  _serve(requests, replies)


if __name__ == "__main__":
  main()
