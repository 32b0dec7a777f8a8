"""A fixed glibc mmap threshold and arena limit for the driver and its TFF
workers.

glibc's malloc serves an allocation of at least M_MMAP_THRESHOLD bytes (128
KiB at start) with its own mapping and unmaps it when it is freed. After the
first such free it raises the threshold to the freed block's size (up to 32
MiB on 64-bit), so later tensors of that size come from the heap instead. A
round that allocates and frees many tensors of a few MiB among long-lived
small objects (FedGKT: each client's features and logits, the server's
batches) then leaves the freed space scattered through the heap, where it
cannot be returned to the system, and resident memory creeps up round after
round. Setting the threshold explicitly turns the adjustment off: every
tensor of 128 KiB or more is mapped and unmapped on its own.

Measured with `python tools/bench.py --suite=gkt` (driver + worker resident
memory from round 10 to 50 of FedGKT, sync / async): 21.8 % / 30.0 % at
800df27, before this module, and 14.9 % / 18.1 % at f4c86e7, with it.

glibc also gives each new thread an arena of its own, up to 8 per core;
TensorFlow's and gRPC's thread pools then spread a round's allocations over
many heaps, each keeping its own freed space. Limiting the arenas to
`ARENA_MAX` (2) keeps that space where the next round reuses it. Measured
with `python tools/gkt_memory.py 50 async` (FedGKT, driver / worker resident
memory, rounds 10 -> 45, on a machine busy with other runs, commit 14c0f69):
851 -> 1,042 / 505 -> 596 MiB by default, 802 -> 818 / 445 -> 499 MiB with
`MALLOC_ARENA_MAX=2` in the environment of both.

`configure_process_heap` sets both in the running process (`mallopt`),
except a setting the environment already gives (`MALLOC_MMAP_THRESHOLD_`,
`MALLOC_ARENA_MAX`, read by glibc at start-up: the user's setting wins).
Arenas created before the limit is set are kept, so the command-line entry
points call it before importing TensorFlow, whose thread pools allocate;
the execution contexts call it again for library users. `worker_environment`
carries both to a child through the same variables. Both do nothing where
the C library is not glibc.
"""

from __future__ import annotations

from collections.abc import Mapping
import ctypes
import ctypes.util
import functools
import os
from typing import Optional

MMAP_THRESHOLD_BYTES = 128 * 1024
# glibc's malloc.h: #define M_MMAP_THRESHOLD -3
_M_MMAP_THRESHOLD = -3
ENVIRONMENT_VARIABLE = "MALLOC_MMAP_THRESHOLD_"
ARENA_MAX = 2
# glibc's malloc.h: #define M_ARENA_MAX -8
_M_ARENA_MAX = -8
ARENA_ENVIRONMENT_VARIABLE = "MALLOC_ARENA_MAX"


@functools.lru_cache(maxsize=None)
def _glibc() -> Optional[ctypes.CDLL]:
  name = ctypes.util.find_library("c")
  if not name:
    return None
  try:
    libc = ctypes.CDLL(name)
  except OSError:
    return None
  return (
    libc
    if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version")
    else None
  )


def configure_process_heap() -> bool:
  """Fixes this process's mmap threshold and arena limit (module docstring);
  whether it could (glibc only)."""
  libc = _glibc()
  if libc is None:
    return False
  done = True
  for variable, parameter, value in (
    (ENVIRONMENT_VARIABLE, _M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
    (ARENA_ENVIRONMENT_VARIABLE, _M_ARENA_MAX, ARENA_MAX),
  ):
    if variable not in os.environ:
      done = bool(libc.mallopt(parameter, value)) and done
  return done


def worker_environment(
  base: Optional[Mapping[str, str]] = None,
) -> dict[str, str]:
  """`base` (default `os.environ`) with the threshold and the arena limit
  set for a child.

  A value already in `base` is kept: the user's setting wins.
  """
  env = dict(os.environ if base is None else base)
  env.setdefault(ENVIRONMENT_VARIABLE, str(MMAP_THRESHOLD_BYTES))
  env.setdefault(ARENA_ENVIRONMENT_VARIABLE, str(ARENA_MAX))
  return env
