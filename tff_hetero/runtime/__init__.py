"""Execution runtime: TFF workers and execution contexts we own.

* `WorkerProcess`: a TFF `worker_binary` that cannot outlive this process.
* `local_execution`, `remote_execution`, `execution_context`: context managers
  installing a TFF execution context (local own worker, remote workers, several
  workers through TFF's mergeable context) whose RPCs are bounded by
  `worker_timeout_s` (see `contexts`); `compile_ahead` starts compiling a
  computation for those workers before its first call.
* `handle_termination`: SIGTERM/SIGHUP raise `Terminated` so contexts unwind;
  `run_to_completion` runs a short coroutine that such a signal must not cut.
* `testing`: helpers for tests asserting that no worker outlives a run.

Importing this package does not import TensorFlow Federated; the contexts do,
when entered.
"""

from tff_hetero.runtime.bounded_stub import DEFAULT_WORKER_TIMEOUT_S
from tff_hetero.runtime.bounded_stub import BoundedExecutorStub
from tff_hetero.runtime.bounded_stub import check_workers
from tff_hetero.runtime.bounded_stub import parse_address
from tff_hetero.runtime.contexts import ExecutionHandle
from tff_hetero.runtime.contexts import available_executors
from tff_hetero.runtime.contexts import compile_ahead
from tff_hetero.runtime.contexts import execution_context
from tff_hetero.runtime.contexts import local_execution
from tff_hetero.runtime.contexts import register_executor
from tff_hetero.runtime.contexts import remote_execution
from tff_hetero.runtime.signals import Terminated
from tff_hetero.runtime.signals import handle_termination
from tff_hetero.runtime.signals import run_to_completion
from tff_hetero.runtime.workers import DEFAULT_MAX_MESSAGE_MB
from tff_hetero.runtime.workers import PortInUseError
from tff_hetero.runtime.workers import WorkerIsolationError
from tff_hetero.runtime.workers import WorkerProcess
from tff_hetero.runtime.workers import WorkerStartError
from tff_hetero.runtime.workers import WorkerUnavailableError
from tff_hetero.runtime.workers import find_free_port
from tff_hetero.runtime.workers import live_workers
from tff_hetero.runtime.workers import port_is_free
from tff_hetero.runtime.workers import stop_all_workers
from tff_hetero.runtime.workers import worker_binary_path

__all__ = [
  "BoundedExecutorStub",
  "DEFAULT_MAX_MESSAGE_MB",
  "DEFAULT_WORKER_TIMEOUT_S",
  "ExecutionHandle",
  "PortInUseError",
  "Terminated",
  "WorkerIsolationError",
  "WorkerProcess",
  "WorkerStartError",
  "WorkerUnavailableError",
  "available_executors",
  "check_workers",
  "compile_ahead",
  "execution_context",
  "find_free_port",
  "handle_termination",
  "live_workers",
  "local_execution",
  "parse_address",
  "port_is_free",
  "register_executor",
  "remote_execution",
  "run_to_completion",
  "stop_all_workers",
  "worker_binary_path",
]
