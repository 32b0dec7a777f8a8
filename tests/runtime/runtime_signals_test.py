"""handle_termination: SIGTERM/SIGHUP raise `Terminated` once, then restore."""

import gc
import os
import signal
import threading
import time

import pytest

from tff_hetero import runtime


def _signal_and_spin(sig=signal.SIGTERM, spins=10**6):
  """Sends `sig` to this process and runs bytecode until it is handled."""
  os.kill(os.getpid(), sig)
  for _ in range(spins):
    pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_raises_terminated_and_handlers_are_restored(sig):
  before = signal.getsignal(sig)
  with pytest.raises(runtime.Terminated) as e:
    with runtime.handle_termination():
      os.kill(os.getpid(), sig)  # Handled at the next bytecode boundary.
      for _ in range(1000):
        pass
      pytest.fail("no Terminated raised")
  assert e.value.code == 128 + sig
  assert e.value.signum == sig
  assert str(e.value) == f"terminated by {signal.Signals(sig).name}"
  assert isinstance(e.value, SystemExit)
  assert not isinstance(e.value, Exception)  # `except Exception` won't eat it.
  assert signal.getsignal(sig) is before


def test_second_signal_does_not_interrupt_cleanup():
  cleaned = []
  with pytest.raises(runtime.Terminated):
    with runtime.handle_termination():
      try:
        _signal_and_spin()
      finally:
        _signal_and_spin(spins=10**5)  # Ignored: clean-up goes on.
        cleaned.append(True)
  assert cleaned == [True]


def test_no_op_outside_main_thread():
  errors = []

  def body():
    try:
      with runtime.handle_termination():
        pass
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  thread = threading.Thread(target=body)
  thread.start()
  thread.join()
  assert not errors


async def _absorbs_cancellation(started):
  """A task like the release/checkpoint managers': it swallows a cancel."""
  import asyncio  # pylint: disable=g-import-not-at-top

  try:
    started.append(True)
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.sleep(5)
  except asyncio.CancelledError:
    pass
  return "finished"


@pytest.fixture
def default_sigint():
  """Python's own SIGINT handler (a background job inherits SIGINT ignored)."""
  before = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, before)


def test_sigint_during_asyncio_run_is_not_lost(default_sigint):
  del default_sigint
  import asyncio  # pylint: disable=g-import-not-at-top

  # With Python's default handler, asyncio.run swaps in its own, which only
  # cancels the task: here the interrupt vanishes.
  assert asyncio.run(_absorbs_cancellation([])) == "finished"
  started = []
  with pytest.raises(KeyboardInterrupt):
    with runtime.handle_termination():
      asyncio.run(_absorbs_cancellation(started))
  assert started == [True]
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ignored_sigint_stays_ignored():
  before = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    with runtime.handle_termination():
      assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
      os.kill(os.getpid(), signal.SIGINT)
      for _ in range(1000):
        pass
  finally:
    signal.signal(signal.SIGINT, before)


async def _writes_in_two_steps(steps, sig):
  """A release/checkpoint-like coroutine: a signal arrives between writes."""
  import asyncio  # pylint: disable=g-import-not-at-top

  steps.append("first")
  os.kill(os.getpid(), sig)
  await asyncio.gather(asyncio.sleep(0.05), asyncio.sleep(0.05))
  steps.append("second")
  return "done"


@pytest.mark.parametrize(
  "sig,error",
  [(signal.SIGTERM, runtime.Terminated), (signal.SIGINT, KeyboardInterrupt)],
)
def test_run_to_completion_finishes_then_raises(default_sigint, sig, error):
  del default_sigint
  steps, after = [], []
  with pytest.raises(error):
    with runtime.handle_termination():
      runtime.run_to_completion(_writes_in_two_steps(steps, sig))
      after.append("next statement")  # Not reached: raised on return.
  assert steps == ["first", "second"]
  assert not after


def test_run_to_completion_without_a_signal_returns_the_result():
  steps = []

  async def body():
    steps.append("ran")
    return 7

  with runtime.handle_termination():
    assert runtime.run_to_completion(body()) == 7
  assert runtime.run_to_completion(body()) == 7  # Outside: plain asyncio.run.
  assert steps == ["ran", "ran"]


@pytest.mark.parametrize("failure", [TypeError, ValueError, RuntimeError])
def test_an_error_after_the_signal_is_reported_as_the_signal(failure):
  # What a signal raised in the middle of library code can leave behind: the
  # unwinding fails with some other error. The run was stopped, so the block
  # still ends as the signal's exception, with that error as its cause.
  with pytest.raises(runtime.Terminated) as e:
    with runtime.handle_termination():
      try:
        _signal_and_spin()
      finally:
        raise failure("the eager context is half-switched")
  assert e.value.code == 128 + signal.SIGTERM
  assert isinstance(e.value.__cause__, failure)


def test_an_error_without_a_signal_is_left_as_it_is():
  with pytest.raises(ValueError, match="not a signal"):
    with runtime.handle_termination():
      raise ValueError("not a signal")


def test_a_signal_dropped_in_a_gc_callback_is_delivered_again(capsys):
  """Raised inside a garbage-collector callback, the exception is only
  printed by Python; the block must still stop, and print nothing."""
  sent, finished = [], []

  def callback(phase, info):
    del info
    if phase == "start" and not sent:
      sent.append(True)
      _signal_and_spin()  # Handled here, inside the callback.

  gc.callbacks.append(callback)
  try:
    with pytest.raises(runtime.Terminated):
      with runtime.handle_termination():
        gc.collect()
        # Up to 10 s for the second delivery (a loaded machine).
        for _ in range(1000):
          time.sleep(0.01)
        finished.append(True)
  finally:
    gc.callbacks.remove(callback)
  assert sent == [True]
  assert not finished
  assert "Exception ignored" not in capsys.readouterr().err
