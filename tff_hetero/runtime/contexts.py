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

Every RPC to a worker goes through `bounded_stub.BoundedExecutorStub` (its
docstring says exactly what `worker_timeout_s` bounds), sent by TFF's
`RemoteExecutor` from a thread pool (`threaded_executor`) so that several
workers compute at once.

Secure aggregation is simulated, as TFF's own simulation backends do
(`tff.backends.test`): before TFF compiles a computation for the worker, its
secure-sum intrinsics (`tff.federated_secure_sum_bitwidth`, ..., which
`tff.aggregators.SecureSumFactory` uses after clipping and quantizing each
value) become plain sums of the same integers, so the numbers are those a
secure aggregation protocol would produce, but no protocol runs: the worker
sees each client's quantized values. The C++ worker has no secure-sum
implementation (it refuses the intrinsic).

Compiling ahead: TFF compiles a computation for the worker (native form,
Grappler over its graphs, below) when it is first called. With one worker,
`compile_ahead(computation)` starts that compilation in the background
(`AheadOfTimeCompiler`, in a child process: `compiler_process.py`), so that
a program tracing several computations before calling them overlaps the
two; the mergeable context compiles into its own form and ignores the hint.

Starting: `local_execution` starts its workers and returns at once; they
load (about 1.3 s) while the program builds its computations, and the
first call waits for them (`ExecutionHandle.ensure_ready`).

Graph optimization: TFF's compiler runs Grappler over every graph in the
driver (`desugar_and_transform_to_native`: function inlining, constant
folding, arithmetic, loop and memory optimization aggressive, the other
passes at their defaults); the worker runs the graphs it is given as they
are (TFF's session options switch Grappler off there; with
`TF_CPP_VMODULE=meta_optimizer=1` the worker logs no pass). Our driver runs
the same configuration without constant folding, the layout optimizer, the
remapper and the memory optimizer, without the MLIR (TFG) passes, and with
one round of passes instead of two (`compiler_process.driver_grappler_config`);
what the driver skips no process runs. The first four took 22 of the 33 s
that Grappler's passes logged in InclusiveFL's first round; the TFG passes
and the second round took about a third of what was left
(docs/performance.md, "Cold start: tracing, and Grappler once"). FedAvg's
compute-bound round (`tools/bench.py`) takes as long without them, and 1.4
to 1.7 times as long without the dependency optimizer or with inlining
alone, so those stay. Losses differ from those under TFF's configuration in
the eighth or ninth significant digit (the same arithmetic rewritten
differently); two identical 12-round InclusiveFL runs gave the same losses.
Switching the arithmetic optimizer, common subexpression elimination and
the loop, shape and implementation-selector passes off as well would save
more, but two identical runs then differed in the eighth digit, so they
stay.

Threads: TFF's context stack is thread-local; the installed context is visible
in the thread that entered the `with` block only.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
import contextlib
import os
from typing import Any
from typing import Optional
import weakref

from tff_hetero.runtime import compiler_process
from tff_hetero.runtime import heap
from tff_hetero.runtime import threaded_executor
from tff_hetero.runtime import workers as workers_lib
from tff_hetero.runtime.bounded_stub import DEFAULT_WORKER_TIMEOUT_S
from tff_hetero.runtime.bounded_stub import BoundedExecutorStub
from tff_hetero.runtime.bounded_stub import check_workers
from tff_hetero.runtime.tls import TlsConfig
from tff_hetero.runtime.workers import DEFAULT_MAX_MESSAGE_MB
from tff_hetero.runtime.workers import WorkerProcess

__all__ = [
  "AheadOfTimeCompiler",
  "ExecutionHandle",
  "available_executors",
  "compile_ahead",
  "execution_context",
  "local_execution",
  "register_executor",
  "remote_execution",
]


class _RemoteStack:
  """One worker's stub, executor factory and the executors it created."""

  def __init__(
    self,
    address: str,
    *,
    worker_timeout_s: float,
    default_num_clients: int,
    max_message_mb: int,
    tls=None,
  ):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.types import placements  # pylint: disable=g-import-not-at-top

    self.address = address
    self.stub = BoundedExecutorStub(
      address,
      worker_timeout_s=worker_timeout_s,
      max_message_mb=max_message_mb,
      tls=tls,
    )
    executor_class = threaded_executor.threaded_remote_executor_class()
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


class AheadOfTimeCompiler:
  """The `compiler_fn` of a worker's TFF context that can start compiling a
  computation before its first call (`compile_ahead`).

  TFF compiles a computation for the worker at its first invocation, in the
  calling context's event-loop thread: it rewrites the computation into the
  native form and runs Grappler over every TensorFlow graph in it
  (`compiler_process.compile_for_worker`: TFF's
  `desugar_and_transform_to_native` with `driver_grappler_config`). For a
  program that traces several large computations before it calls them,
  that work can run while the next one is traced. `submit` queues a
  computation (one background thread, in order), whose compilation runs in
  a child process
  (`compiler_process.CompilerProcess`, started at the first `submit`): on a
  thread of this process its Python would hold the GIL the tracing needs
  (docs/performance.md measures both). `in_process=True` compiles on the
  thread instead. `__call__` is what TFF calls and returns the queued
  result, waiting for it if need be (as long as compiling it takes, as
  TFF's own call would), or compiles on the spot, in this process, a
  computation never submitted. A compilation that failed raises at that
  call, as it would have without `submit`.

  A computation object is compiled once: TFF keeps what it compiled
  (`CompilerPipeline`), so one already handed over is not submitted again.
  TFF's cache matches computations by equality: a second object equal to a
  compiled one is compiled again if submitted, and that result is dropped
  only by `close`. The thread is a daemon and `close` stops the child
  process: a run that ends, or is interrupted, while a compilation is under
  way does not wait for it.
  """

  def __init__(
    self,
    compile_fn: Callable[[Any], Any],
    *,
    in_process: Optional[bool] = None,
  ):
    """`in_process` None: in the child process when `compile_fn` is
    `compiler_process.compile_for_worker` (what the child runs), on the
    thread otherwise."""
    import queue  # pylint: disable=g-import-not-at-top
    import threading  # pylint: disable=g-import-not-at-top

    self._compile_fn = compile_fn
    if in_process is None:
      in_process = compile_fn is not compiler_process.compile_for_worker
    elif (
      not in_process and compile_fn is not compiler_process.compile_for_worker
    ):
      raise ValueError(
        "in_process=False compiles with compiler_process.compile_for_worker"
        f" in the child; got compile_fn={compile_fn!r}"
      )
    self._in_process = bool(in_process)
    self._process: Optional[compiler_process.CompilerProcess] = None
    self._lock = threading.Lock()
    self._queue = queue.SimpleQueue()
    self._thread = None
    self._closed = False
    self._pending: dict[int, tuple[Any, Any]] = {}  # id -> (comp, Future)
    self._handed_over: dict[int, Any] = {}  # id -> weakref of the computation

  def submit(self, computation) -> None:
    """Starts compiling `computation` in the background, once; nothing
    after `close`."""
    from concurrent import futures  # pylint: disable=g-import-not-at-top
    import threading  # pylint: disable=g-import-not-at-top

    with self._lock:
      key = id(computation)
      if self._closed or key in self._pending:
        return
      handed_over = self._handed_over.get(key)
      if handed_over is not None and handed_over() is computation:
        return
      future = futures.Future()
      # The computation is kept with its future, so its id stays its own.
      self._pending[key] = (computation, future)
      self._queue.put((computation, future))
      if self._thread is None:
        if not self._in_process:
          self._process = compiler_process.CompilerProcess(
            self._compile_fn
          ).start()
        self._thread = threading.Thread(
          target=self._work, name="tff-hetero-compile", daemon=True
        )
        self._thread.start()

  def _work(self) -> None:
    while True:
      item = self._queue.get()
      if item is None:
        return
      computation, future = item
      if not future.set_running_or_notify_cancel():
        continue  # Dropped by `close`.
      try:
        with self._lock:
          process = self._process
        if process is None:
          future.set_result(self._compile_fn(computation))
        else:
          future.set_result(process.compile(computation))
      except BaseException as e:  # pylint: disable=broad-except
        future.set_exception(e)
      del computation, future, item

  def __call__(self, computation):
    key = id(computation)
    with self._lock:
      pending = self._pending.pop(key, None)
      try:
        self._handed_over[key] = weakref.ref(
          computation, lambda _, key=key: self._handed_over.pop(key, None)
        )
      except TypeError:  # Not weakly referenceable: it may be submitted again.
        pass
    if pending is None:
      return self._compile_fn(computation)
    return pending[1].result()

  def close(self) -> None:
    """Drops what was not called yet, stops the child process (a
    compilation under way there is abandoned; one on the thread finishes,
    and the thread then ends) and takes no more submissions."""
    with self._lock:
      self._closed = True
      for _, future in self._pending.values():
        future.cancel()
      self._pending.clear()
      self._handed_over.clear()
      if self._thread is not None:
        self._queue.put(None)
      process, self._process = self._process, None
    if process is not None:
      process.close()


def _context_kwargs(compiler_fn):
  from tensorflow_federated.python.core.environments.tensorflow_frontend import (
    tensorflow_computation,
  )  # pylint: disable=g-import-not-at-top

  return dict(
    compiler_fn=compiler_fn,
    transform_args=tensorflow_computation.transform_args,
    transform_result=tensorflow_computation.transform_result,
  )


def _build_context(
  stacks: Sequence[_RemoteStack], num_subrounds: Optional[int]
) -> tuple[Any, Optional[AheadOfTimeCompiler]]:
  """The TFF context of `stacks`, and its `AheadOfTimeCompiler` (None for
  the mergeable context, which compiles into its own form)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  if len(stacks) == 1 and num_subrounds in (None, 1):
    compiler = AheadOfTimeCompiler(compiler_process.compile_for_worker)
    context = tff.framework.SyncExecutionContext(
      executor_fn=stacks[0].factory, **_context_kwargs(compiler)
    )
    return context, compiler
  async_contexts = [
    tff.framework.AsyncExecutionContext(
      executor_fn=stack.factory,
      **_context_kwargs(compiler_process.compile_for_worker),
    )
    for stack in stacks
  ]
  # TFF's own mergeable context (`create_mergeable_comp_execution_context`)
  # with the secure sums replaced before the split into mergeable form,
  # which refuses them.
  context = tff.framework.MergeableCompExecutionContext(
    async_contexts,
    compiler_fn=lambda computation: (
      tff.backends.native.compile_to_mergeable_comp_form(
        compiler_process.without_secure_intrinsics(computation)
      )
    ),
    num_subrounds=num_subrounds,
  )
  return context, None


def compile_ahead(computation) -> bool:
  """Starts compiling `computation` for the installed context's workers in
  the background, so that its first call finds it compiled
  (`AheadOfTimeCompiler`). A no-op, returning False, in any other context
  (TFF's own, the mergeable one): safe to call from code that does not know
  where it runs. Call it from the thread that installed the context."""
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )  # pylint: disable=g-import-not-at-top

  start = getattr(
    context_stack_impl.context_stack.current, "compile_ahead", None
  )
  return bool(start(computation)) if start is not None else False


def _switchable_context_class():
  from tensorflow_federated.python.core.impl.context_stack import context_base  # pylint: disable=g-import-not-at-top

  class _SwitchableContext(context_base.SyncContext):
    """The installed context: delegates to the context of the workers in
    use, which `ExecutionHandle` replaces when the set of workers changes
    (`--on_worker_loss=redistribute`)."""

    def __init__(self, connection, before_invoke: Callable[[], None]):
      self._before_invoke = before_invoke
      self.use(connection)

    def use(self, connection) -> None:
      self.inner = connection.context
      self._compiler = connection.compiler

    def invoke(self, comp, arg):
      self._before_invoke()
      return self.inner.invoke(comp, arg)

    def compile_ahead(self, comp) -> bool:
      """Starts compiling `comp` for the workers in use, if their context
      compiles with an `AheadOfTimeCompiler`; True if it does."""
      if self._compiler is None:
        return False
      self._compiler.submit(comp)
      return True

  return _SwitchableContext


class _Connection:
  """The stacks and TFF context of one set of workers."""

  def __init__(self, addresses, num_subrounds, **stack_kwargs):
    self.addresses = tuple(addresses)
    self.stacks: list[_RemoteStack] = []
    self.compiler: Optional[AheadOfTimeCompiler] = None
    try:
      for address in self.addresses:
        self.stacks.append(_RemoteStack(address, **stack_kwargs))
      self.context, self.compiler = _build_context(self.stacks, num_subrounds)
    except BaseException:
      self.close(dispose=False)
      raise

  def close(self, dispose: bool) -> None:
    if self.compiler is not None:
      self.compiler.close()
    for stack in self.stacks:
      stack.close(dispose=dispose)


class ExecutionHandle:
  """What the execution-context managers yield.

  Attributes:
    kind: 'local' or 'remote' (or a registered name).
    configured_addresses: 'host:port' of every worker the run was given.
    addresses: those in use now, in subround order (fewer after a worker
      was lost with `run_round(..., redistribute=True)`).
    worker_timeout_s: the bound described in the module docstring.
    context: the installed TFF context; it delegates to the workers' own
      (`SyncExecutionContext`, or `MergeableCompExecutionContext` when there
      are several workers).
    workers: the `WorkerProcess`es this context started (local only).

  `ready`, if given, is called once before the first call of a computation
  (`ensure_ready`): it waits for the workers and returns their addresses,
  which replace the configured ones if they differ (a worker started again
  on another port).
  """

  def __init__(
    self,
    *,
    kind: str,
    addresses: Sequence[str],
    worker_timeout_s: float,
    workers: Sequence[WorkerProcess],
    connect: Callable[[Sequence[str]], _Connection],
    ready: Optional[Callable[[], Sequence[str]]] = None,
    tls=None,
  ):
    import threading  # pylint: disable=g-import-not-at-top

    self.kind = kind
    self.configured_addresses = tuple(addresses)
    self.worker_timeout_s = worker_timeout_s
    self._workers = workers
    self._connect = connect
    self._ready = ready
    self._ready_lock = threading.Lock()
    self._tls = tls
    self._connection = connect(self.configured_addresses)
    self.context = _switchable_context_class()(
      self._connection, self.ensure_ready
    )

  @property
  def workers(self) -> tuple[WorkerProcess, ...]:
    return tuple(self._workers)

  def ensure_ready(self) -> None:
    """Waits for the workers (`ready`), once; raises what it raised, at
    every call until it succeeds."""
    if self._ready is None:
      return
    with self._ready_lock:
      if self._ready is None:
        return
      addresses = tuple(self._ready())
      if addresses != self.configured_addresses:
        # A worker restarted on another port (rare): the new connection
        # compiles anew what the old one had compiled or queued.
        self._use(addresses)
        self.configured_addresses = addresses
      self._ready = None

  def __repr__(self):
    return f"ExecutionHandle(kind={self.kind!r}, addresses={self.addresses})"

  @property
  def addresses(self) -> tuple[str, ...]:
    return self._connection.addresses

  @property
  def _stacks(self) -> list[_RemoteStack]:
    return self._connection.stacks

  @property
  def mergeable(self) -> bool:
    """True when computations run through TFF's mergeable context."""
    return not isinstance(self._connection.context, _sync_context_class())

  def close(self, dispose: bool) -> None:
    self._connection.close(dispose=dispose)

  def _use(self, addresses: Sequence[str]) -> None:
    """Switches the installed context to the workers at `addresses`."""
    connection = self._connect(tuple(addresses))
    old, self._connection = self._connection, connection
    self.context.use(connection)
    old.close(dispose=False)

  def _reachable(self, addresses: Sequence[str], timeout_s: float) -> list[str]:
    """Those of `addresses` that answer the readiness probe within
    `timeout_s` (probed in parallel), in their order."""
    from concurrent import futures  # pylint: disable=g-import-not-at-top

    def answers(address):
      try:
        check_workers([address], timeout_s, tls=self._tls)
        return True
      except workers_lib.WorkerUnavailableError:
        return False

    with futures.ThreadPoolExecutor(max(1, len(addresses))) as pool:
      flags = list(pool.map(answers, addresses))
    return [a for a, ok in zip(addresses, flags) if ok]

  def run_round(
    self,
    fn: Callable[[], Any],
    *,
    redistribute: bool,
    log: Callable[[str], None],
    what: str = "the round",
  ) -> Any:
    """`fn()` (a round, or an evaluation: TFF calls whose inputs the driver
    keeps), surviving lost workers when `redistribute`.

    With `redistribute`, a configured worker that is not in use but answers
    again within 1 s is taken back first. If `fn` fails because a worker
    became unavailable, the configured workers are probed; when some answer
    and they are not the set that failed, `fn` runs again on them (the
    cohort split among them), with one line to `log`, at most once per set
    of workers. Otherwise, and without `redistribute`, the
    `WorkerUnavailableError` propagates.
    """
    if not redistribute or self.kind == "local":
      return fn()
    missing = [a for a in self.configured_addresses if a not in self.addresses]
    if missing:
      back = self._reachable(missing, min(1.0, self.worker_timeout_s))
      if back:
        use = [
          a
          for a in self.configured_addresses
          if a in self.addresses or a in back
        ]
        log(
          f"TFF worker{'s' if len(back) > 1 else ''} at {', '.join(back)}"
          f" answer{'' if len(back) > 1 else 's'} again: running {what} on"
          f" {len(use)} of {len(self.configured_addresses)}"
        )
        self._use(use)
    tried = {self.addresses}
    while True:
      try:
        return fn()
      except workers_lib.WorkerUnavailableError as e:
        alive = self._reachable(
          self.configured_addresses, min(5.0, self.worker_timeout_s)
        )
        # At most one try per set of workers: workers that come and go
        # cannot keep a round going forever.
        if not alive or tuple(alive) in tried:
          raise
        tried.add(tuple(alive))
        lost = [a for a in self.addresses if a not in alive]
        log(
          f"{e}; running {what} again on {len(alive)} of"
          f" {len(self.configured_addresses)} workers"
          + (f" (lost: {', '.join(lost)})" if lost else "")
        )
        self._use(alive)

  def rpc_counts(self) -> dict[str, dict[str, int]]:
    """Successful RPCs so far, by worker address and RPC name (diagnostics)."""
    return {s.address: dict(s.stub.rpc_counts) for s in self._stacks}

  def rpc_bytes(self) -> dict[str, int]:
    """Serialized bytes of the successful RPCs so far, summed over workers:
    `sent` (driver to workers: values, computations, calls) and `received`
    (workers to driver: computed values)."""
    return {
      direction: sum(s.stub.rpc_bytes[direction] for s in self._stacks)
      for direction in ("sent", "received")
    }

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
  ready: Optional[Callable[[], Sequence[str]]] = None,
  dispose_on_exit: bool = True,
  tls=None,
) -> Iterator[ExecutionHandle]:
  """Builds one stack per address, installs the context, closes on exit.
  `ready` (see `ExecutionHandle`) runs before the first call."""
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )  # pylint: disable=g-import-not-at-top

  def connect(use: Sequence[str]) -> _Connection:
    return _Connection(
      use,
      num_subrounds,
      worker_timeout_s=worker_timeout_s,
      default_num_clients=default_num_clients,
      max_message_mb=max_message_mb,
      tls=tls,
    )

  handle = ExecutionHandle(
    kind=kind,
    addresses=addresses,
    worker_timeout_s=worker_timeout_s,
    workers=workers,
    connect=connect,
    ready=ready,
    tls=tls,
  )
  try:
    with context_stack_impl.context_stack.install(handle.context):
      yield handle
  finally:
    handle.close(dispose=dispose_on_exit)


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
  tls: Optional[TlsConfig] = None,
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
    tls: mutual TLS to the workers (`tls.TlsConfig`: this driver's
      certificate and the CA that signed the workers'); None: plaintext.

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
  check_workers(addresses, worker_timeout_s, tls=tls)
  with _run_on(
    "remote",
    addresses,
    worker_timeout_s=worker_timeout_s,
    default_num_clients=default_num_clients,
    max_message_mb=max_message_mb,
    num_subrounds=num_subrounds,
    tls=tls,
  ) as handle:
    yield handle


class _LocalWorkers:
  """The workers of `local_execution`: started at once, made ready on a
  background thread (`wait_ready`, up to `start_timeout_s` each; a port
  clash, see workers.py, starts that worker again on another port, at most
  3 times), so that the program builds its computations meanwhile. `ready`
  waits for that thread and raises what it raised."""

  _ATTEMPTS = 3

  def __init__(
    self,
    count: int,
    *,
    start_timeout_s: float,
    max_message_mb: int,
    max_concurrent_computation_calls: int,
    log_dir: Optional[str],
  ):
    import threading  # pylint: disable=g-import-not-at-top

    self._start_timeout_s = start_timeout_s
    self._max_message_mb = max_message_mb
    self._max_concurrent = max_concurrent_computation_calls
    self._log_dir = log_dir
    self._lock = threading.Lock()
    self._stopped = False
    self._error: Optional[BaseException] = None
    self.workers: list[WorkerProcess] = []
    try:
      for _ in range(count):
        self.workers.append(self._launch())
    except BaseException:
      self.stop()
      raise
    self._thread = threading.Thread(
      target=self._wait_all, name="tff-hetero-worker-ready", daemon=True
    )
    self._thread.start()

  def _launch(self) -> WorkerProcess:
    """A worker started on a free port (a port taken meanwhile: another)."""
    for attempt in range(self._ATTEMPTS):
      port = workers_lib.find_free_port()
      worker = WorkerProcess(
        port,
        max_message_mb=self._max_message_mb,
        max_concurrent_computation_calls=self._max_concurrent,
        log_path=(
          os.path.join(self._log_dir, f"tff_worker_{port}.log")
          if self._log_dir
          else None
        ),
      )
      try:
        return worker.start()
      except workers_lib.PortInUseError:
        worker.stop()
        if attempt == self._ATTEMPTS - 1:
          raise
    raise AssertionError("unreachable")

  def _wait_all(self) -> None:
    try:
      for index in range(len(self.workers)):
        for attempt in range(self._ATTEMPTS):
          worker = self.workers[index]
          try:
            worker.wait_ready(self._start_timeout_s)
            break
          except workers_lib.PortInUseError:
            worker.stop()
            with self._lock:
              if self._stopped or attempt == self._ATTEMPTS - 1:
                raise
              self.workers[index] = self._launch()
    except BaseException as e:  # pylint: disable=broad-except
      self._error = e

  def ready(self) -> tuple[str, ...]:
    """The workers' addresses once every one answers.

    Raises:
      WorkerStartError: a worker did not start or answer in time.
    """
    self._thread.join()
    if self._error is not None:
      raise self._error
    return tuple(w.address for w in self.workers)

  def stop(self) -> None:
    with self._lock:
      self._stopped = True
    for worker in list(self.workers):
      worker.stop()


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
  127.0.0.1; they listen on all interfaces, see `workers.py`) and installs
  the same context `remote_execution` would for their addresses (several
  workers: the mergeable context). The workers load meanwhile, so that a
  program can trace its computations while they start: each has
  `start_timeout_s` from entry to answer, and the first call of a
  computation waits for them (a worker that did not answer is a
  `WorkerStartError` there). On exit
  (normal, exception, KeyboardInterrupt, `signals.Terminated`) the previous
  context is restored and the workers are stopped (SIGTERM, then SIGKILL).

  Args:
    worker_timeout_s: see the module docstring.
    default_num_clients: CLIENTS cardinality for computations without a
      CLIENTS-placed argument.
    num_workers: >1 runs TFF's mergeable context over local workers.
    start_timeout_s: how long a worker may take to answer after entry.
    max_message_mb: gRPC message limit (worker flag and channel options).
    max_concurrent_computation_calls: passed to the worker.
    log_dir: if set, worker logs go to `log_dir/tff_worker_<port>.log`;
      otherwise to /dev/null.

  Raises:
    WorkerStartError: a worker did not start (on entry) or answer in time
      (at the first call).
  """
  worker_timeout_s = _check_timeout(worker_timeout_s)
  if num_workers < 1:
    raise ValueError(f"num_workers must be >= 1, got {num_workers}")
  if log_dir:
    os.makedirs(log_dir, exist_ok=True)
  started = _LocalWorkers(
    num_workers,
    start_timeout_s=start_timeout_s,
    max_message_mb=max_message_mb,
    max_concurrent_computation_calls=max_concurrent_computation_calls,
    log_dir=log_dir,
  )
  try:
    with _run_on(
      "local",
      [w.address for w in started.workers],
      worker_timeout_s=worker_timeout_s,
      default_num_clients=default_num_clients,
      max_message_mb=max_message_mb,
      num_subrounds=None,
      workers=started.workers,
      ready=started.ready,
      dispose_on_exit=False,  # The workers are stopped right after.
    ) as handle:
      yield handle
  finally:
    started.stop()


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
  if kwargs.pop("tls", None) is not None:
    raise ValueError(
      "--tls_cert, --tls_key, --tls_ca: only with --executor=remote (the"
      " local worker is reached over this host's loopback)"
    )
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
  (e.g. `default_num_clients`). Limits this process's glibc arenas
  (`heap.py`; a compact profile configured before is kept) so that
  resident memory stays flat over long runs; the workers started get the
  process's heap profile.
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
