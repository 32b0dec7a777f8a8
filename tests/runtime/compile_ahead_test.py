"""`AheadOfTimeCompiler`: what TFF's context gets back is what the compile
function returned for that very computation, compiled once, on the
background thread when it was submitted, and failures surface at the call
as they would without it. Plain Python stands in for the computations (the
compiler only holds them), compiled on the thread (`in_process=True`);
`compiler_process_test.py` compiles real ones in the child process and
`runtime_contexts_test.py` runs it under TFF."""

import threading

import pytest

from tff_hetero.runtime.contexts import AheadOfTimeCompiler


class _Computation:
  def __init__(self, name):
    self.name = name


class _Recorder:
  """A compile function that records which thread compiled what."""

  def __init__(self, fail=()):
    self.calls = []
    self.fail = set(fail)
    self.release = threading.Event()
    self.release.set()

  def __call__(self, computation):
    self.release.wait(10)
    self.calls.append((computation.name, threading.current_thread().name))
    if computation.name in self.fail:
      raise ValueError(f"cannot compile {computation.name}")
    return f"compiled {computation.name}"


def test_submitted_computation_is_compiled_once_in_the_background():
  compile_fn = _Recorder()
  compiler = AheadOfTimeCompiler(compile_fn, in_process=True)
  a, b = _Computation("a"), _Computation("b")
  compiler.submit(a)
  compiler.submit(a)  # Still pending: not queued twice.
  compiler.submit(b)
  assert compiler(b) == "compiled b"
  assert compiler(a) == "compiled a"
  assert [name for name, _ in compile_fn.calls] == ["a", "b"]
  assert all(
    thread.startswith("tff-hetero-compile") for _, thread in compile_fn.calls
  )
  # Handed over to TFF, which keeps it: a later submit queues nothing, so
  # a call (TFF would not make it) compiles on the calling thread.
  compiler.submit(a)
  assert compiler(a) == "compiled a"
  assert compile_fn.calls[2] == ("a", threading.current_thread().name)
  assert len(compile_fn.calls) == 3
  compiler.close()


def test_unsubmitted_computation_compiles_on_the_calling_thread():
  compile_fn = _Recorder()
  compiler = AheadOfTimeCompiler(compile_fn, in_process=True)
  assert compiler(_Computation("c")) == "compiled c"
  assert compile_fn.calls == [("c", threading.current_thread().name)]


def test_call_waits_for_a_compilation_under_way():
  compile_fn = _Recorder()
  compile_fn.release.clear()
  compiler = AheadOfTimeCompiler(compile_fn, in_process=True)
  slow = _Computation("slow")
  compiler.submit(slow)
  result = []
  caller = threading.Thread(target=lambda: result.append(compiler(slow)))
  caller.start()
  caller.join(0.2)
  assert caller.is_alive() and not result  # Waiting for the background.
  compile_fn.release.set()
  caller.join(10)
  assert result == ["compiled slow"]
  assert len(compile_fn.calls) == 1


def test_a_failed_compilation_raises_at_the_call():
  compiler = AheadOfTimeCompiler(_Recorder(fail=["bad"]), in_process=True)
  bad = _Computation("bad")
  compiler.submit(bad)
  with pytest.raises(ValueError, match="cannot compile bad"):
    compiler(bad)


def test_close_drops_what_was_not_called():
  compile_fn = _Recorder()
  compile_fn.release.clear()  # The background is held inside `first`.
  compiler = AheadOfTimeCompiler(compile_fn, in_process=True)
  first, queued = _Computation("first"), _Computation("queued")
  compiler.submit(first)
  compiler.submit(queued)
  compiler.close()
  compiler.submit(_Computation("late"))  # Closed: taken no more.
  compile_fn.release.set()
  # `queued` was dropped: a call compiles it on the calling thread, and the
  # background compiles neither it nor `late`.
  here = threading.current_thread().name
  assert compiler(queued) == "compiled queued"
  assert compiler(first) == "compiled first"  # Dropped too: on the spot.
  background = [name for name, thread in compile_fn.calls if thread != here]
  assert background in ([], ["first"])  # `first` had started, or not.
  assert ("queued", here) in compile_fn.calls
