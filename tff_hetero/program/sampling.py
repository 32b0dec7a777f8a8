"""Seeded cohort sampling whose RNG state is checkpointed.

One `numpy.random.Generator` (PCG64, seeded with `--seed`) draws, in order,
each round's cohort and the shuffle seed of every sampled client's data. Its
bit-generator state goes into every checkpoint, so a resumed run draws exactly
what the uninterrupted run would have drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np


class CohortSampler:
  """Draws cohorts (without replacement) and per-client shuffle seeds."""

  def __init__(self, seed: int):
    self._rng = np.random.Generator(np.random.PCG64(seed))

  @property
  def rng(self) -> np.random.Generator:
    """The generator itself, for algorithms that choose clients their way."""
    return self._rng

  def get_state(self) -> Mapping[str, Any]:
    return self._rng.bit_generator.state

  def set_state(self, state: Mapping[str, Any]) -> None:
    self._rng.bit_generator.state = dict(state)

  def sample(self, available: Sequence[str], size: int) -> list[str]:
    """`size` distinct ids from `available` (all of them if fewer)."""
    available = list(available)
    if len(available) <= size:
      return available
    chosen = self._rng.choice(len(available), size=size, replace=False)
    return [available[i] for i in sorted(chosen)]

  def shuffle_seeds(self, count: int) -> list[int]:
    return [int(s) for s in self._rng.integers(0, 2**31 - 1, size=count)]
