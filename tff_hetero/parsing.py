"""Settings given as flag strings: `":"`-separated number lists.

Standard library only, so that settings can be checked before TensorFlow
loads.
"""

from __future__ import annotations

import math

from tff_hetero.errors import UsageError


def parse_number_list(flag: str, text: str, kind: type = float) -> list:
  """`"0.66:0.4"` -> [0.66, 0.4]; `UsageError` naming `flag` if malformed."""
  parts = [p.strip() for p in str(text).split(":")]
  try:
    values = [kind(p) for p in parts]
  except ValueError:
    raise UsageError(
      flag,
      f"{text!r} is not a ':'-separated list of"
      f" {'integers' if kind is int else 'numbers'}",
    ) from None
  if kind is float and not all(math.isfinite(v) for v in values):
    raise UsageError(flag, f"{text!r} holds a non-finite number")
  return values
