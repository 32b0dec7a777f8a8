"""Turn SIGTERM/SIGHUP (and SIGINT, reliably) into exceptions so `with` blocks unwind.

Python's default for SIGTERM and SIGHUP is to die on the spot: no `finally`,
no `__exit__`, no `atexit`. Workers we started would then only be reaped by
PR_SET_PDEATHSIG. Inside `handle_termination()` these signals raise
`Terminated` in the main thread instead, exactly like SIGINT raises
KeyboardInterrupt, so execution contexts exit normally and stop their workers.

`Terminated` subclasses `SystemExit` (code 128 + signal number, e.g. 143 for
SIGTERM): `except Exception` does not swallow it, and if nothing catches it
the interpreter exits quietly with the conventional "killed by signal" status.

`run_to_completion(coro)` runs a short coroutine (a metrics release, a
checkpoint write) with these signals held back until it returns: raised
inside an event loop, they would leave half-written files and orphaned
asyncio tasks whose errors are logged after the one-line error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from collections.abc import Iterator
from collections.abc import Sequence
import contextlib
import os
import signal
import sys
import threading
from typing import Any
from typing import TypeVar

__all__ = ["Terminated", "handle_termination", "run_to_completion"]

_T = TypeVar("_T")


class Terminated(SystemExit):
  """Raised in the main thread when a handled termination signal arrives."""

  def __init__(self, signum: int):
    super().__init__(128 + int(signum))
    self.signum = int(signum)

  @property
  def signal_name(self) -> str:
    try:
      return signal.Signals(self.signum).name
    except ValueError:
      return str(self.signum)

  def __str__(self):
    return f"terminated by {self.signal_name}"


def _exception_for(signum: int) -> BaseException:
  if signum == signal.SIGINT:
    return KeyboardInterrupt()
  return Terminated(signum)


# Main-thread only (signal handlers run there): how many `_held_back()`
# blocks are open, and the signal that arrived inside one.
_hold_depth = 0
_held_signal: list[int] = []


@contextlib.contextmanager
def _held_back() -> Iterator[None]:
  """A signal handled by `handle_termination` raises when the block ends."""
  global _hold_depth
  _hold_depth += 1
  try:
    yield
  finally:
    _hold_depth -= 1
    signum = _held_signal.pop() if not _hold_depth and _held_signal else None
  if signum is not None:  # Only on a normal exit; an error wins otherwise.
    raise _exception_for(signum)


def run_to_completion(coro: Coroutine[Any, Any, _T]) -> _T:
  """`asyncio.run(coro)`, with handled signals raised once it has finished.

  Outside the main thread this is plain `asyncio.run`.
  """
  if threading.current_thread() is not threading.main_thread():
    return asyncio.run(coro)
  with _held_back():
    return asyncio.run(coro)


_DEFAULT_SIGNALS = tuple(
  s
  for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
  if s is not None
)


@contextlib.contextmanager
def handle_termination(
  signals: Sequence[int] = _DEFAULT_SIGNALS,
) -> Iterator[None]:
  """Within the block, `signals` raise `Terminated` in the main thread.

  SIGINT raises `KeyboardInterrupt` as usual, but from our handler: with
  Python's default handler in place, each `asyncio.run` (the release and
  checkpoint managers run one per round) swaps in asyncio's own, which only
  cancels the running task, and a task that absorbs the cancellation lets
  the interrupt vanish (the run went on). An ignored SIGINT (a background
  job's) stays ignored.
  A signal arriving inside `run_to_completion` raises when that returns.
  Only the first signal raises; later ones (while the block is unwinding and
  stopping workers) are ignored so they cannot interrupt the clean-up. Once
  a signal has arrived, any other error leaving the block becomes that
  signal's exception (the error chained as its cause): raised in the middle
  of library code, the signal can leave it half-done, and what fails next
  while the block unwinds (a TensorFlow call that finds its eager context
  half-switched, say) is a consequence of being stopped, not a failure of
  the run. A signal whose exception Python drops (raised inside a garbage-
  collector callback or a `__del__`, where Python only prints errors) is
  delivered again 50 ms later, without the printout: once, a SIGTERM
  arriving in a collector callback was lost and the run went on, deaf to
  further signals. The previous handlers are restored on exit. Outside the main
  thread (where Python cannot install handlers) this is a no-op.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  fired = []
  raised = []  # The exception the handler raised last.
  redeliver = []  # Set once Python has dropped that exception.
  timers = []

  def handler(signum, frame):
    del frame
    if fired and not redeliver:
      return
    redeliver.clear()
    if not fired:
      fired.append(signum)
    if _hold_depth:
      _held_signal.append(fired[0])
      return
    raised[:] = [_exception_for(fired[0])]
    raise raised[0]

  previous_unraisable_hook = sys.unraisablehook

  def unraisable_hook(unraisable):
    # Raised inside a garbage-collector callback or a `__del__` (a signal
    # handler runs wherever the main thread is), the exception is only
    # printed, and the block would go on. Deliver the signal again, from a
    # thread, a moment later: the main thread is by then back in code whose
    # errors propagate (else this repeats).
    if raised and unraisable.exc_value is raised[0]:
      redeliver.append(True)
      timer = threading.Timer(0.05, os.kill, (os.getpid(), fired[0]))
      timer.daemon = True
      timers.append(timer)
      timer.start()
      return
    previous_unraisable_hook(unraisable)

  previous = {}
  sys.unraisablehook = unraisable_hook
  try:
    interrupt = (
      (signal.SIGINT,)
      if signal.getsignal(signal.SIGINT) is signal.default_int_handler
      else ()
    )  # Not if ignored.
    for signum in (*signals, *interrupt):
      previous[signum] = signal.signal(signum, handler)
    yield
  except BaseException as e:
    stopped = _exception_for(fired[0]) if fired else None
    if stopped is None or isinstance(e, type(stopped)):
      raise
    raise stopped from e
  finally:
    for timer in timers:
      timer.cancel()
    sys.unraisablehook = previous_unraisable_hook
    for signum, old in previous.items():
      signal.signal(signum, old if old is not None else signal.SIG_DFL)
