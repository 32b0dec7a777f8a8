"""Heap settings for the driver and its TFF workers: two profiles.

glibc gives each new thread an arena (heap) of its own, up to 8 per core;
TensorFlow's and gRPC's thread pools then spread a round's allocations over
many heaps, each keeping its own freed space. Both profiles limit the arenas
to `ARENA_MAX` (2), which keeps that space where the next round reuses it.
Measured with `python tools/gkt_memory.py 50 async` (FedGKT, driver / worker
resident memory, rounds 10 -> 45, on a machine busy with other runs, commit
14c0f69): 851 -> 1,042 / 505 -> 596 MiB by default, 802 -> 818 / 445 -> 499
MiB with `MALLOC_ARENA_MAX=2` in the environment of both.

They differ in glibc's mmap threshold and in the workers' tensors:

* `THROUGHPUT` (the default, every algorithm's) keeps glibc's dynamic
  threshold. glibc serves an allocation of at least the threshold (128 KiB
  at start) with its own mapping; after the first such block is freed it
  raises the threshold to that block's size (up to 32 MiB), so a training
  step's activations and gradients of a few MiB come from the heap and are
  reused step after step. Blocks freed between live ones stay resident
  there; the program hands the driver's back after every round
  (`release_free_memory`). The workers, which cannot be asked to, get
  TensorFlow's own CPU allocator in its best-fit-with-coalescing form
  instead (`TF_CPU_ALLOCATOR_USE_BFC`, read by TensorFlow when it creates
  its CPU device): their tensors come from pools that grow to the largest
  working set a computation has needed and are reused from then on, so a
  step neither faults in fresh pages nor scatters freed blocks through
  glibc's heap, which keeps what is not a tensor (gRPC's and the protocol
  buffers' memory, small objects). The pools are never handed back: a
  worker's tensors hold the largest peak they have reached, for the life of
  the worker (a long-lived remote worker included). The driver keeps
  glibc's allocator: its evaluations' peaks would otherwise stay resident
  in pools.
* `COMPACT` fixes the threshold at 128 KiB (`MMAP_THRESHOLD_BYTES`), which
  turns the adjustment off, and leaves TensorFlow's allocator as it comes:
  every tensor of 128 KiB or more is mapped on its own and unmapped when
  freed, so freed space is never left in the heap, and every page of every
  such tensor faults at every step. Until 2026-11-28 FedGKT ran on it (its
  rounds free multi-MiB features and logits among long-lived client
  states).

Measured (docs/performance.md, 2026-11-28, beside other runs): `python
tools/heap_bench.py` (mnist_cnn_feddst, batch 50; a Python TensorFlow child
given a worker's environment) 0 minor faults a step on the throughput
profile, 525 without the pools, about 13,000 on the compact one. Driver +
worker resident memory: `python tools/gkt_memory.py 50 sync` (FedGKT,
round 10 to 50) +15.1 % on the throughput heap without the pools, +3.0 %
with them; `python tools/bench.py --suite=rss --rss_rounds=500
--rss_algorithms=adaptivefl` +7.29 % without the pools, +3.70 % with them
(FedAvg: +3.45 % and +3.86 %, its worker's growth not its tensors').

`configure_process_heap(profile)` sets the profile in the running process
(`mallopt`), except a setting the environment already gives
(`MALLOC_MMAP_THRESHOLD_`, `MALLOC_ARENA_MAX`, read by glibc at start-up:
the user's setting wins). Arenas created before the limit is set are kept,
so the command-line entry points call it before importing TensorFlow, whose
thread pools allocate; the execution contexts call it again for library
users. A threshold once fixed stays fixed for the life of the process
(glibc cannot turn the adjustment back on), so the process's profile is the
most compact one configured so far (`process_profile`).
`worker_environment` carries the process's profile to a child through
`environment_of`'s variables: the program's local workers inherit the
driver's, and a remote worker gets
`python -m pipelines.worker --heap_profile=...`
(default throughput; `--heap_profile=compact` for the old setting, which
`MALLOC_MMAP_THRESHOLD_=131072 TF_CPU_ALLOCATOR_USE_BFC=false` in the
environment gives any run).
`configure_process_heap` does nothing where the C library is not glibc.
A user's `MALLOC_*` or `TF_CPU_ALLOCATOR_USE_BFC` variable wins over the
profile but is not reflected in `process_profile()`.
"""

from __future__ import annotations

from collections.abc import Mapping
import ctypes
import ctypes.util
import functools
import os
from typing import NamedTuple
from typing import Optional

MMAP_THRESHOLD_BYTES = 128 * 1024
# glibc's malloc.h: #define M_MMAP_THRESHOLD -3
_M_MMAP_THRESHOLD = -3
ENVIRONMENT_VARIABLE = "MALLOC_MMAP_THRESHOLD_"
ARENA_MAX = 2
# glibc's malloc.h: #define M_ARENA_MAX -8
_M_ARENA_MAX = -8
ARENA_ENVIRONMENT_VARIABLE = "MALLOC_ARENA_MAX"
# TensorFlow's process_state.cc reads it when it creates the CPU allocator.
TF_BFC_ENVIRONMENT_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"


class HeapProfile(NamedTuple):
  """glibc's settings of one profile, and whether its workers use
  TensorFlow's pools (module docstring)."""

  name: str
  # None: glibc's dynamic threshold.
  mmap_threshold_bytes: Optional[int]
  arena_max: int
  # TensorFlow's BFC pools for the tensors of a child (a worker), not of
  # the driver (module docstring).
  worker_tf_bfc: bool = False


THROUGHPUT = HeapProfile("throughput", None, ARENA_MAX, worker_tf_bfc=True)
COMPACT = HeapProfile("compact", MMAP_THRESHOLD_BYTES, ARENA_MAX)
PROFILES: Mapping[str, HeapProfile] = {p.name: p for p in (THROUGHPUT, COMPACT)}

# The profile this process runs with, once configured.
_process_profile: Optional[HeapProfile] = None


def get_profile(name: str) -> HeapProfile:
  """The profile called `name`; ValueError naming the choices otherwise."""
  try:
    return PROFILES[name]
  except KeyError:
    raise ValueError(
      f"unknown heap profile {name!r}; choose from {', '.join(PROFILES)}"
    ) from None


def environment_of(profile: HeapProfile) -> dict[str, str]:
  """The environment variables that give a new worker process `profile`."""
  env = {ARENA_ENVIRONMENT_VARIABLE: str(profile.arena_max)}
  if profile.mmap_threshold_bytes is not None:
    env[ENVIRONMENT_VARIABLE] = str(profile.mmap_threshold_bytes)
  if profile.worker_tf_bfc:
    env[TF_BFC_ENVIRONMENT_VARIABLE] = "true"
  return env


def process_profile() -> HeapProfile:
  """The profile this process runs with: the most compact one configured so
  far (`THROUGHPUT` before any)."""
  return _process_profile or THROUGHPUT


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


def configure_process_heap(profile: HeapProfile = THROUGHPUT) -> bool:
  """Gives this process `profile` (module docstring); whether it did
  (glibc only). A threshold fixed before stays fixed: `THROUGHPUT` after
  `COMPACT` only limits the arenas and returns False."""
  global _process_profile
  libc = _glibc()
  if libc is None:
    return False
  fixed = _process_profile is not None and (
    _process_profile.mmap_threshold_bytes is not None
  )
  if not fixed:
    _process_profile = profile
  done = profile.mmap_threshold_bytes is not None or not fixed
  settings = [(ARENA_ENVIRONMENT_VARIABLE, _M_ARENA_MAX, profile.arena_max)]
  if profile.mmap_threshold_bytes is not None:
    settings.append(
      (ENVIRONMENT_VARIABLE, _M_MMAP_THRESHOLD, profile.mmap_threshold_bytes)
    )
  for variable, parameter, value in settings:
    if variable not in os.environ:
      done = bool(libc.mallopt(parameter, value)) and done
  return done


def without_allocator_settings(base: Mapping[str, str]) -> dict[str, str]:
  """`base` without glibc's malloc tunables (`MALLOC_*`, `GLIBC_TUNABLES`)
  and TensorFlow's allocator choice (`TF_CPU_ALLOCATOR_USE_BFC`): the
  environment of a child whose heap is to be chosen afresh."""
  return {
    k: v
    for k, v in base.items()
    if not k.startswith("MALLOC_")
    and k not in ("GLIBC_TUNABLES", TF_BFC_ENVIRONMENT_VARIABLE)
  }


def worker_environment(
  base: Optional[Mapping[str, str]] = None,
  profile: Optional[HeapProfile] = None,
) -> dict[str, str]:
  """`base` (default `os.environ`) with `profile`'s settings (default: this
  process's, `process_profile()`) set for a child.

  A value already in `base` is kept: the user's setting wins.
  """
  env = dict(os.environ if base is None else base)
  for variable, value in environment_of(profile or process_profile()).items():
    env.setdefault(variable, value)
  return env


def release_free_memory() -> bool:
  """Hands the free pages inside this process's heaps back to the system
  (glibc's `malloc_trim(0)`; about 2 ms in a driver with TensorFlow loaded);
  whether it could (glibc only).

  On the throughput heap, freed blocks of a few MiB stay in the heap between
  live ones, resident; the program calls this after every round, so the
  driver's resident memory stays flat. (The TFF workers are a C++ binary
  that cannot be asked to; their tensors come from TensorFlow's pools
  instead, module docstring.)
  """
  libc = _glibc()
  if libc is None or not hasattr(libc, "malloc_trim"):
    return False
  libc.malloc_trim(0)
  return True
