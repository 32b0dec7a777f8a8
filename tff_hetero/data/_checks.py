"""Private argument checks and helpers shared by `tff_hetero.data` modules.

Each check raises `DataError` with a one-line message that names the value
the way the command line spells it (e.g. ``--num_clients``), because these
values normally arrive as flags.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from tff_hetero.errors import DataError


def read_only_view(array: object) -> np.ndarray:
  """A read-only view of `array` (the caller's array stays writeable)."""
  view = np.asarray(array).view()
  view.flags.writeable = False
  return view


def check_int(flag: str, value: object, *, minimum: int) -> int:
  """Returns `value` as an `int` if it is an integer >= `minimum`."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise DataError(f"{flag} must be an integer >= {minimum}, got {value!r}")
  if value < minimum:
    raise DataError(f"{flag} must be >= {minimum}, got {value}")
  return int(value)


def check_seed(value: object, *, flag: str = "--seed") -> int:
  """Returns `value` as an `int` if it is a valid NumPy seed (integer >= 0)."""
  if (
    isinstance(value, bool)
    or not isinstance(value, numbers.Integral)
    or value < 0
  ):
    raise DataError(f"{flag} must be a non-negative integer, got {value!r}")
  return int(value)


def check_positive_float(flag: str, value: object) -> float:
  """Returns `value` as a `float` if it is a finite real number > 0."""
  if (
    isinstance(value, bool)
    or not isinstance(value, numbers.Real)
    or not math.isfinite(value)
    or value <= 0
  ):
    raise DataError(f"{flag} must be a finite number > 0, got {value!r}")
  return float(value)


def check_fraction(flag: str, value: object) -> float:
  """Returns `value` as a `float` if it lies in [0, 1)."""
  if (
    isinstance(value, bool)
    or not isinstance(value, numbers.Real)
    or not 0.0 <= value < 1.0
  ):
    raise DataError(f"{flag} must be in [0, 1), got {value!r}")
  return float(value)


def check_choice(flag: str, value: object, choices: object) -> str:
  """Returns `value` if it is one of `choices` (an iterable of names)."""
  names = sorted(choices)  # type: ignore[call-overload]
  if not isinstance(value, str) or value not in names:
    raise DataError(f"unknown {flag} {value!r}; accepted: {', '.join(names)}")
  return value
