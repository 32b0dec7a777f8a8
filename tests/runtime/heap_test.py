"""heap: the compact profile's fixed mmap threshold returns freed tensors'
memory to the system (the throughput profile keeps glibc's dynamic one, which
does not), both profiles' arena limit caps the threads' heaps, in this
process (`mallopt`) and in the TFF workers we start (environment), and the
throughput profile's workers take their tensors from TensorFlow's pools."""

import os
import resource
import subprocess
import sys
import textwrap

import psutil
import pytest

from tff_hetero import runtime
from tff_hetero.runtime import heap

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

# After glibc frees a mapped 8 MiB block it raises its mmap threshold to 8 MiB,
# so 200 blocks of 1 MiB come from the heap; 64 KiB blocks kept between them
# pin the freed space there: about 200 MiB stay resident. With the threshold
# fixed at 128 KiB (the compact profile) each 1 MiB block is its own mapping,
# unmapped when freed.
_FRAGMENT = textwrap.dedent("""
    import ctypes, sys
    import psutil
    from tff_hetero.runtime import heap
    def rss_mib():
      return psutil.Process().memory_info().rss / 2**20
    profile, _, then = sys.argv[1].partition("+")
    if profile != "default":
      assert heap.configure_process_heap(heap.get_profile(profile))
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    first = libc.malloc(8 << 20)
    ctypes.memset(first, 1, 8 << 20)
    libc.free(first)
    before = rss_mib()
    big, small = [], []
    for _ in range(200):
      block = libc.malloc(1 << 20)
      ctypes.memset(block, 1, 1 << 20)
      big.append(block)
      small.append(libc.malloc(64 << 10))
    for block in big:
      libc.free(block)
    if then == "release":
      assert heap.release_free_memory()
    print(rss_mib() - before)
""")


def _run(script, mode, **extra_env):
  """`script` in a fresh interpreter whose environment sets no allocator
  setting but `extra_env` (a user's setting wins over the configured one)."""
  env = heap.without_allocator_settings(os.environ)
  env.update(extra_env)
  return subprocess.run(
    [sys.executable, "-c", script, mode],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    check=True,
    timeout=120,
  ).stdout


def _retained_mib(mode):
  return float(_run(_FRAGMENT, mode))


def test_only_the_compact_profile_returns_freed_blocks():
  assert _retained_mib("default") > 150
  assert _retained_mib("throughput") > 150
  assert _retained_mib("compact") < 20


def test_releasing_free_memory_returns_the_throughput_heaps_blocks():
  # What the program does after every round.
  assert _retained_mib("throughput+release") < 20


def test_worker_environment_carries_the_profile_and_keeps_a_users_value():
  assert heap.worker_environment({}, heap.COMPACT) == {
    "MALLOC_MMAP_THRESHOLD_": "131072",
    "MALLOC_ARENA_MAX": "2",
  }
  assert heap.worker_environment({}, heap.THROUGHPUT) == {
    "MALLOC_ARENA_MAX": "2",
    "TF_CPU_ALLOCATOR_USE_BFC": "true",
  }
  mine = {
    heap.ENVIRONMENT_VARIABLE: "65536",
    heap.ARENA_ENVIRONMENT_VARIABLE: "4",
    "TF_CPU_ALLOCATOR_USE_BFC": "false",
    "PATH": "/bin",
  }
  assert heap.worker_environment(mine, heap.COMPACT) == mine
  assert heap.worker_environment(mine, heap.THROUGHPUT) == mine


def test_a_fixed_threshold_stays_the_process_profile():
  script = textwrap.dedent("""
      from tff_hetero.runtime import heap
      def state(done="-"):
        threshold = heap.worker_environment({}).get("MALLOC_MMAP_THRESHOLD_")
        return f"{heap.process_profile().name}:{threshold}:{done}"
      states = [state()]
      for profile in (heap.THROUGHPUT, heap.COMPACT, heap.THROUGHPUT):
        states.append(state(heap.configure_process_heap(profile)))
      print(",".join(states))
  """)
  # Workers started after a compact configuration get its threshold; a
  # later throughput configuration cannot undo it and says so.
  assert _run(script, "-").strip() == (
    "throughput:None:-,throughput:None:True,compact:131072:True,"
    "compact:131072:False"
  )


def test_without_allocator_settings_drops_only_the_allocator_variables():
  env = {
    "MALLOC_ARENA_MAX": "8",
    "MALLOC_MMAP_THRESHOLD_": "1",
    "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1",
    "TF_CPU_ALLOCATOR_USE_BFC": "true",
    "PATH": "/bin",
    "MY_MALLOC_": "x",
  }
  assert heap.without_allocator_settings(env) == {
    "PATH": "/bin",
    "MY_MALLOC_": "x",
  }


def test_unknown_profile_names_the_choices():
  with pytest.raises(
    ValueError, match="'fast'; choose from throughput, compact"
  ):
    heap.get_profile("fast")


def test_workers_start_with_the_process_profile(tmp_path, monkeypatch):
  for variable in heap.environment_of(heap.COMPACT) | heap.environment_of(
    heap.THROUGHPUT
  ):
    monkeypatch.delenv(variable, raising=False)
  # Nothing in the test session configures the compact profile in-process.
  assert heap.process_profile() == heap.THROUGHPUT
  worker = runtime.WorkerProcess(log_path=str(tmp_path / "w.log"))
  try:
    # Read the environment once the binary answers: right after fork, before
    # its exec completes, its environment may still read as empty.
    worker.start().wait_ready()
    env = psutil.Process(worker.pid).environ()
  finally:
    worker.stop()
  assert env["MALLOC_ARENA_MAX"] == "2"
  assert env["TF_CPU_ALLOCATOR_USE_BFC"] == "true"
  assert "MALLOC_MMAP_THRESHOLD_" not in env


# Eight threads that each hold a block: by default glibc gives each new
# thread an arena of its own (up to 8 per core), with the limit at most
# `ARENA_MAX` of them in all. `malloc_info` lists one <heap> per arena.
_ARENAS = textwrap.dedent("""
    import ctypes, re, sys, threading
    from tff_hetero.runtime import heap
    if sys.argv[1] == "configured":
      assert heap.configure_process_heap()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    ready, done = threading.Barrier(9, timeout=60), threading.Event()
    def hold():
      libc.malloc(1 << 10)
      ready.wait()
      done.wait(60)
    threads = [threading.Thread(target=hold) for _ in range(8)]
    for t in threads:
      t.start()
    ready.wait()
    libc.open_memstream.restype = ctypes.c_void_p
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    print(len(re.findall(rb"<heap nr=", buf.value)))
    done.set()
""")


def _arenas(mode, **extra_env):
  return int(_run(_ARENAS, mode, **extra_env))


def test_arena_limit_caps_the_threads_arenas():
  assert _arenas("default") > heap.ARENA_MAX
  assert _arenas("configured") <= heap.ARENA_MAX


def test_a_users_environment_setting_wins_in_this_process():
  # glibc reads MALLOC_ARENA_MAX at start-up; configuring keeps it.
  assert _arenas("configured", MALLOC_ARENA_MAX="8") > heap.ARENA_MAX


def test_importing_heap_does_not_import_tensorflow():
  # The CLI entry points configure the heap before TensorFlow starts threads.
  script = textwrap.dedent("""
      import sys
      from tff_hetero.runtime import heap
      print("tensorflow" in sys.modules)
  """)
  assert _run(script, "-").strip() == "False"


# A step that allocates and frees a 48 MiB tensor: above glibc's largest
# dynamic mmap threshold (32 MiB), so glibc maps it afresh at every step and
# each of its 12,288 pages faults; from TensorFlow's pools it is the same
# block each time, already resident.
_BIG_TENSOR_STEPS = textwrap.dedent("""
    import os, resource
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    @tf.function(autograph=False)  # `python -c`: no source to convert
    def steps(x):
      return tf.while_loop(
          lambda i, total: i < 10,
          lambda i, total: (i + 1, total + tf.reduce_sum(tf.fill([12 << 20], x))),
          (tf.constant(0), tf.constant(0.0)))[1]
    steps(tf.constant(1.0)).numpy()  # traced, pools grown
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    steps(tf.constant(2.0)).numpy()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
""")


def _transparent_huge_pages_always() -> bool:
  try:
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
      return "[always]" in f.read()
  except OSError:
    return False


def test_tensorflow_given_a_workers_environment_takes_tensors_from_pools():
  # A Python TensorFlow child, not the worker binary (which is the same
  # TensorFlow, and holds the same variable name): this version of
  # TensorFlow must still read the variable the throughput profile sets.
  env = heap.environment_of(heap.THROUGHPUT)
  assert float(_run(_BIG_TENSOR_STEPS, "-", **env)) < 100
  if _transparent_huge_pages_always():
    pytest.skip("huge pages: a fresh mapping costs few faults anyway")
  without = heap.environment_of(heap.THROUGHPUT._replace(worker_tf_bfc=False))
  pages = (48 << 20) // resource.getpagesize()
  faults_without = float(_run(_BIG_TENSOR_STEPS, "-", **without))
  if faults_without < 100:
    # Seen on a machine of 2026-11-28 (transparent huge pages "madvise"):
    # glibc kept the freed tensor's mapping, so the control shows nothing.
    pytest.skip(
      f"this machine's allocator reuses the freed mapping anyway"
      f" ({faults_without:g} faults a step without the pools)"
    )
  assert faults_without > pages / 2
