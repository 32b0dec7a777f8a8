"""Compiling TFF computations for our workers, in this process or in a
Python process of its own.

`compile_for_worker` is what the driver does to a computation before a
worker runs it: secure sums simulated (`without_secure_intrinsics`), TFF's
native form, Grappler over its graphs with `driver_grappler_config`
(`contexts`' module docstring says why each).

`contexts.AheadOfTimeCompiler` compiles a computation while the program
traces the next one. On a thread of the driver, that compilation's Python
(TFF's building-block passes, type deserialization, the graphs imported
into `tf.Graph`s for Grappler) holds the GIL that the tracing thread needs:
InclusiveFL's first round traced its three groups in 15.0 s with nothing
compiling beside it and in about 30 s with the compile thread running
(docs/performance.md, "Cold start: compiling in a process of its own").
`CompilerProcess` runs `compile_for_worker` in a child Python process
instead, so that the two use a core each.

Protocol: the child reads requests from its stdin and writes replies to a
pipe of their own (the file descriptor given after `--reply-fd`; its
stdout and stderr go to /dev/null, so nothing a library prints can reach
the replies). Each request is a frame, an 8-byte big-endian length and
that many bytes of a serialized `pb.Computation`; each reply is a frame
whose first byte is `OK` (the rest: the compiled `pb.Computation`) or
`FAILED` (the rest: a one-line reason in UTF-8). The child compiles one
request at a time, in order, and exits when its stdin closes.

The parent never depends on the child for a result: when the child reports
a failure (kept in `last_failure`), or dies, or cannot be started,
`compile` compiles the computation in the calling process (where a genuine
compilation error is raised as it would have been without the child) and,
if the child is gone, does so from then on (`broken` says why). The child
cannot outlive its parent: it is started through `_pdeathsig_exec.py`
(SIGTERM when the parent dies, SIGKILL included, as the workers are), from
a thread that lives as long as the process (`workers._SPAWNER`), in a
process group of its own (a Ctrl-C in the terminal reaches the driver,
which stops it), and `close` (or, at interpreter exit, an `atexit` hook)
stops it. `testing.compiler_processes` finds it by its command line.

Type signature: `compile(c)` returns a computation of `c`'s type (the
compiled proto's own, as `compile_for_worker`'s result has).
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

from tff_hetero.runtime import workers

MODULE = "tff_hetero.runtime.compiler_process"
OK = b"\x00"
FAILED = b"\x01"
_HEADER = struct.Struct(">Q")

_LIVE_LOCK = threading.Lock()
_LIVE: dict[int, "CompilerProcess"] = {}


def without_secure_intrinsics(computation):
  """`computation` with its secure sums as plain sums of their integers
  (`contexts`' module docstring): what
  `tff.backends.test.replace_secure_intrinsics_with_bodies` does, but
  `computation` itself when it has none, and with its type (Python
  containers included) kept otherwise, since the mergeable context builds
  its results from the compiled computation's type. It calls a private
  function of TFF 0.87, the version `threaded_executor.check_tff_version`
  pins."""
  from tensorflow_federated.python.core.backends.test import (
    compiler as test_compiler,
  )  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.computation import computation_impl  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )  # pylint: disable=g-import-not-at-top

  block, replaced = (
    test_compiler._replace_secure_intrinsics_with_insecure_bodies(  # pylint: disable=protected-access
      computation.to_building_block()
    )
  )
  if not replaced:
    return computation
  return computation_impl.ConcreteComputation(
    computation_proto=block.proto,
    context_stack=context_stack_impl.context_stack,
    annotated_type=computation.type_signature,
  )


def driver_grappler_config():
  """The Grappler configuration the driver runs over each graph before it
  goes to a worker (`contexts`' module docstring, "Graph optimization"):
  TFF's (function inlining, arithmetic and loop optimization aggressive;
  the dependency optimizer and the pruner at their defaults) without
  constant folding, the layout optimizer, the remapper and the memory
  optimizer, without the MLIR (TFG) passes (a topological sort with shape
  inference, and the sinking of ops into conditional branches), and with
  one round of passes instead of two."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  config = tf.compat.v1.ConfigProto()
  rewrite = config.graph_options.rewrite_options
  aggressive = rewrite.AGGRESSIVE
  rewrite.function_optimization = aggressive
  rewrite.arithmetic_optimization = aggressive
  rewrite.loop_optimization = aggressive
  rewrite.constant_folding = rewrite.OFF
  rewrite.layout_optimizer = rewrite.OFF
  rewrite.remapping = rewrite.OFF
  rewrite.memory_optimization = rewrite.NO_MEM_OPT
  rewrite.disable_tfg_optimizer = True
  rewrite.experimental_conditional_code_motion = rewrite.OFF
  rewrite.meta_optimizer_iterations = rewrite.ONE
  return config


def compile_for_worker(computation):
  """`computation` in the native form our workers run: TFF's
  `desugar_and_transform_to_native` with `driver_grappler_config`, secure
  sums replaced first. Like `without_secure_intrinsics`, it calls a private
  module of TFF 0.87 (`replace_intrinsics_with_bodies`, which TFF's function
  calls)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_backend import (
    tensorflow_tree_transformations,
  )  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.computation import computation_impl  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )  # pylint: disable=g-import-not-at-top

  desugared, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(
    without_secure_intrinsics(computation).to_building_block()
  )
  return tff.backends.native.transform_to_native_form(
    computation_impl.ConcreteComputation(
      computation_proto=desugared.proto,
      context_stack=context_stack_impl.context_stack,
    ),
    grappler_config=driver_grappler_config(),
  )


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
  """The directory holding the `tff_hetero` package this process runs (a
  checkout, a Bazel runfiles tree or site-packages): the child's working
  directory, first on its path under `-m`."""
  return os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )


class CompilerProcess:
  """A child Python process that compiles computations (module docstring).

  `compile` is thread-safe (one request at a time). The child is started
  by `start` or at the first `compile`; `pid` is None before. `compiled`
  counts the compilations the child returned.
  """

  def __init__(self, compile_fn: Optional[Callable[[Any], Any]] = None):
    """`compile_fn` compiles in this process when the child cannot
    (default `compile_for_worker`, what the child runs)."""
    self._compile_fn = compile_fn or compile_for_worker
    self._lock = threading.Lock()  # The fields below.
    self._request_lock = threading.Lock()  # One request in flight.
    self._proc: Optional[subprocess.Popen] = None
    self._replies = None  # The read end of the child's reply pipe.
    self._broken: Optional[str] = None  # Why the child is not used.
    self._closed = False
    self.compiled = 0
    self.last_failure: Optional[str] = None  # The child's last reason.

  @property
  def pid(self) -> Optional[int]:
    return None if self._proc is None else self._proc.pid

  @property
  def broken(self) -> Optional[str]:
    """Why compilations no longer go to the child (None while they do)."""
    return self._broken

  def start(self) -> "CompilerProcess":
    """Starts the child (does not wait for it to import TensorFlow)."""
    with self._lock:
      if self._proc is not None or self._broken or self._closed:
        return self
      read_end, write_end = os.pipe()
      try:
        self._proc = workers._SPAWNER.popen(  # pylint: disable=protected-access
          workers._with_pdeathsig(  # pylint: disable=protected-access
            [sys.executable, "-m", MODULE, "--reply-fd", str(write_end)]
          ),
          stdin=subprocess.PIPE,
          stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL,
          pass_fds=(write_end,),
          close_fds=True,
          process_group=0,
          cwd=_package_root(),
        )
      except OSError as e:
        os.close(read_end)
        self._broken = f"cannot start the compiler process: {e}"
        return self
      finally:
        os.close(write_end)
      self._replies = os.fdopen(read_end, "rb")
      with _LIVE_LOCK:
        _LIVE[self._proc.pid] = self
    return self

  def compile(self, computation):
    """`computation` compiled for the worker: by the child, or here if the
    child cannot (module docstring).

    Raises:
      RuntimeError: `close` was called.
    """
    from tensorflow_federated.proto.v0 import computation_pb2  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.computation import (
      computation_impl,
    )  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.context_stack import (
      context_stack_impl,
    )  # pylint: disable=g-import-not-at-top

    if not isinstance(computation, computation_impl.ConcreteComputation):
      return self._compile_fn(computation)
    self.start()
    request = computation_impl.ConcreteComputation.get_proto(
      computation
    ).SerializeToString()
    reply = None
    with self._request_lock:
      with self._lock:
        if self._closed:
          raise RuntimeError("the compiler process was closed")
        proc = None if self._broken else self._proc
      if proc is not None:
        try:
          write_frame(proc.stdin, request)
          reply = read_frame(self._replies)
        except (OSError, ValueError):  # A closed or broken pipe.
          reply = None
        except BaseException:
          # Interrupted between frames: the stream is out of step.
          with self._lock:
            self._broken = "a request to the compiler process was interrupted"
            self._stop_locked()
          raise
        if reply is None:
          with self._lock:
            if self._closed:
              raise RuntimeError("the compiler process was closed")
            self._broken = "the compiler process exited"
            self._stop_locked()
    if reply is not None and reply[:1] == OK:
      self.compiled += 1
      return computation_impl.ConcreteComputation(
        computation_proto=computation_pb2.Computation.FromString(reply[1:]),
        context_stack=context_stack_impl.context_stack,
      )
    if reply is not None:
      self.last_failure = reply[1:].decode("utf-8", "replace")
    # The child failed or is gone: compile here, raising what it raises.
    return self._compile_fn(computation)

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
      for stream in (proc.stdin, self._replies):
        try:
          if stream is not None:
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

  while True:
    request = read_frame(requests)
    if request is None:
      return
    try:
      compiled = compile_for_worker(
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
  12.4 s with it and 17.0 s without (`compile_for_worker`, one process).
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


def main(argv: list[str]) -> None:
  """The child: `python -m tff_hetero.runtime.compiler_process --reply-fd N`
  (module docstring)."""
  if len(argv) != 3 or argv[1] != "--reply-fd":
    sys.exit(f"usage: python -m {MODULE} --reply-fd N")
  replies = os.fdopen(int(argv[2]), "wb")
  requests = os.fdopen(os.dup(0), "rb")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  memoize_type_deserialization()
  _serve(requests, replies)


if __name__ == "__main__":
  main(sys.argv)
