"""Turn SIGTERM/SIGHUP (and SIGINT, reliably) into exceptions so `with` blocks unwind.

Python's default for SIGTERM and SIGHUP is to die on the spot: no `finally`,
no `__exit__`, no `atexit`. Workers we started would then only be reaped by
PR_SET_PDEATHSIG. Inside `handle_termination()` these signals raise
`Terminated` in the main thread instead, exactly like SIGINT raises
KeyboardInterrupt, so execution contexts exit normally and stop their workers.

`Terminated` subclasses `SystemExit` (code 128 + signal number, e.g. 143 for
SIGTERM): `except Exception` does not swallow it, and if nothing catches it
the interpreter exits quietly with the conventional "killed by signal" status.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence

__all__ = ['Terminated', 'handle_termination']


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
    return f'terminated by {self.signal_name}'


_DEFAULT_SIGNALS = tuple(
    s for s in (getattr(signal, 'SIGTERM', None), getattr(signal, 'SIGHUP', None))
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
  Only the first signal raises; later ones (while the block is unwinding and
  stopping workers) are ignored so they cannot interrupt the clean-up. The
  previous handlers are restored on exit. Outside the main thread (where
  Python cannot install handlers) this is a no-op.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  fired = []

  def handler(signum, frame):
    del frame
    if fired:
      return
    fired.append(signum)
    if signum == signal.SIGINT:
      raise KeyboardInterrupt()
    raise Terminated(signum)

  previous = {}
  try:
    interrupt = ((signal.SIGINT,) if signal.getsignal(signal.SIGINT) is
                 signal.default_int_handler else ())  # Not if ignored.
    for signum in (*signals, *interrupt):
      previous[signum] = signal.signal(signum, handler)
    yield
  finally:
    for signum, old in previous.items():
      signal.signal(signum, old if old is not None else signal.SIG_DFL)
