"""`compiler_process.CompilerProcess`: a computation compiled in the child is
the one the driver compiles itself (the same proto), runs on a real worker
with the value worked out by hand, a child that died leaves the driver
compiling on its own, a request the child cannot compile is answered with a
reason, and the child never outlives its parent (SIGKILL included)."""

import io
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.computation import computation_impl

from tff_hetero import runtime
from tff_hetero.runtime import compiler_process
from tff_hetero.runtime import testing as proc_testing


@tf.function
def _doubled(x):
  return x * 2.0


@tff.tensorflow.computation(np.float32)
def _doubled_plus_three(x):
  return _doubled(x) + tf.reduce_sum(tf.constant([1.0, 2.0]))


def _record_calls(monkeypatch, owner, name) -> list:
  """The first argument of every call of `owner.name` from now on (the
  function patched to record it, then run as before)."""
  original = getattr(owner, name)
  calls = []

  def recorded(first, *args, **kwargs):
    calls.append(first)
    return original(first, *args, **kwargs)

  monkeypatch.setattr(owner, name, recorded)
  return calls


def _proto(computation):
  """`computation`'s proto without the ids TFF's compilation hashes from
  each graph with Python's `hash`, which differs from process to process
  (`PYTHONHASHSEED`); the worker only caches by them."""
  proto = type(_proto_of(computation))()
  proto.CopyFrom(_proto_of(computation))

  def clear(message):
    for field, value in message.ListFields():
      if field.name == "cache_key":
        message.ClearField("cache_key")
      elif field.message_type is not None:
        for item in value if field.label == field.LABEL_REPEATED else [value]:
          clear(item)

  clear(proto)
  return proto


def _proto_of(computation):
  return computation_impl.ConcreteComputation.get_proto(computation)


def _compiler_children() -> set[int]:
  """This process's compiler processes (another test's context, e.g. the
  session's `tff_context`, may have one of its own)."""
  mine = {p.pid for p in psutil.Process().children(recursive=True)}
  return {pid for pid in proc_testing.compiler_processes() if pid in mine}


def _wait_until(condition, what: str, timeout_s: float = 10.0):
  """`condition()`'s first true value, polled for up to `timeout_s` (a
  child shows under its module's name once the launcher has exec'd it)."""
  deadline = time.monotonic() + timeout_s
  while True:
    value = condition()
    if value:
      return value
    assert time.monotonic() < deadline, f"{what} never showed"
    time.sleep(0.05)


def _new_compiler_child(others: set[int]) -> int:
  """The one compiler process of this process not in `others`."""
  new = _wait_until(lambda: _compiler_children() - others, "a compiler child")
  assert len(new) == 1, new
  return new.pop()


def _must_not_compile_here(computation):
  raise AssertionError(f"compiled in the driver: {computation}")


def test_the_child_compiles_what_the_driver_compiles():
  process = compiler_process.CompilerProcess(_must_not_compile_here)
  try:
    compiled = process.compile(_doubled_plus_three)
    _wait_until(lambda: process.pid in _compiler_children(), "the child")
    assert (process.compiled, process.broken) == (1, None)
  finally:
    process.close()
  assert process.pid not in proc_testing.compiler_processes()
  here = compiler_process.compile_for_worker(_doubled_plus_three)
  assert _proto(compiled) == _proto(here)
  assert compiled.type_signature.is_equivalent_to(here.type_signature)
  with pytest.raises(RuntimeError, match="closed"):
    process.compile(_doubled_plus_three)


def test_compiled_ahead_in_the_child_runs_on_a_worker(monkeypatch):
  in_driver = _record_calls(monkeypatch, compiler_process, "compile_for_worker")
  others = _compiler_children()
  with runtime.local_execution(worker_timeout_s=60):
    assert runtime.compile_ahead(_doubled_plus_three)
    child = _new_compiler_child(others)  # Started by the submission.
    assert _doubled_plus_three(np.float32(4.0)) == 11.0  # 4 * 2 + (1 + 2)
  assert _doubled_plus_three not in in_driver  # The child compiled it.
  assert proc_testing.wait_until_gone([child], timeout_s=5) == []


def test_a_dead_child_leaves_the_driver_compiling():
  process = compiler_process.CompilerProcess().start()
  os.kill(process.pid, signal.SIGKILL)
  compiled = process.compile(_doubled_plus_three)
  assert process.broken == "the compiler process exited"
  here = compiler_process.compile_for_worker(_doubled_plus_three)
  assert _proto(compiled) == _proto(here)
  process.close()


def test_a_request_the_child_cannot_parse_gets_a_reason():
  requests, replies = io.BytesIO(), io.BytesIO()
  compiler_process.write_frame(requests, b"not a computation")
  requests.seek(0)
  compiler_process._serve(requests, replies)  # pylint: disable=protected-access
  replies.seek(0)
  reply = compiler_process.read_frame(replies)
  assert reply[:1] == compiler_process.FAILED
  assert b"DecodeError" in reply
  assert compiler_process.read_frame(replies) is None  # One request, one reply.


_DRIVER = """
import subprocess
import time
from tff_hetero.runtime import compiler_process
process = compiler_process.CompilerProcess().start()
# Another process holds the child's stdin open, so that only the death
# signal, not the end of its input, can stop the child.
holder = subprocess.Popen(
  ["sleep", "120"], pass_fds=[process._proc.stdin.fileno()]
)
print(process.pid, holder.pid, flush=True)
time.sleep(120)
"""


def test_the_child_dies_with_its_parent():
  tag, env = proc_testing.tagged_env()
  driver = subprocess.Popen(
    [sys.executable, "-c", _DRIVER],
    stdout=subprocess.PIPE,
    text=True,
    env=env,
  )
  holder = None
  try:
    child, holder = map(int, driver.stdout.readline().split())
    _wait_until(
      lambda: child in proc_testing.compiler_processes(tag=tag),
      "the compiler process",
      timeout_s=30,
    )
    driver.kill()  # SIGKILL: no atexit hook runs.
    driver.wait()
    proc_testing.assert_no_workers_left(tag, timeout_s=10)
  finally:
    driver.kill()
    driver.wait()
    if holder is not None:
      proc_testing.kill_pids([holder])


def test_memoized_type_deserialization_builds_each_type_once(monkeypatch):
  from tensorflow_federated.python.core.impl.types import type_serialization  # pylint: disable=g-import-not-at-top

  # Restored by monkeypatch after the test: the memo is for the child.
  calls = _record_calls(monkeypatch, type_serialization, "deserialize_type")
  compiler_process.memoize_type_deserialization()
  memoized = type_serialization.deserialize_type
  value = tff.StructType(
    [("w", tff.TensorType(np.float32, [2, 3])), ("n", np.int32)]
  )
  proto = type_serialization.serialize_type(value)
  built = memoized(proto)
  assert built == value
  assert len(calls) == 3  # The struct and its two elements.
  assert memoized(proto) is built
  assert memoized(type_serialization.serialize_type(value)) is built
  assert memoized(proto.struct.element[0].value) is built.w  # Its parts too.
  assert len(calls) == 3  # Each built once.
