"""The error family of tff-hetero: one-line, user-facing errors.

Every invalid setting, name or value the library rejects raises a subclass of
`HeteroError` whose message is a single line (runs of whitespace, newlines
included, become one space) naming the value and what is accepted. The
command-line pipelines print it as `error: <message>` and exit with status 2;
library users can catch `HeteroError` (or the `ValueError` / `RuntimeError`
each subclass also is).

This module imports nothing but the standard library, so a program can import
it to catch errors without loading TensorFlow or TFF.
"""

from __future__ import annotations

__all__ = [
  "HeteroError",
  "UsageError",
  "DataError",
  "DeviceError",
  "ModelError",
  "DivergenceError",
  "WorkerError",
]


class HeteroError(Exception):
  """Base of the family: the message is collapsed onto one line."""

  def __init__(self, message: str) -> None:
    super().__init__(" ".join(str(message).split()))


class UsageError(HeteroError, ValueError):
  """A setting or combination of settings that cannot run.

  Attributes:
    flag: The setting at fault, as its command-line flag (e.g. `--alpha`);
      the message starts with it.
  """

  def __init__(self, flag: str, message: str) -> None:
    self.flag = flag
    super().__init__(f"{flag}: {message}")


class DataError(HeteroError, ValueError):
  """A data set, partition or data flag `tff_hetero.data` cannot handle."""


class DeviceError(HeteroError, ValueError):
  """A tier specification, client id or round `tff_hetero.devices` rejects."""


class ModelError(HeteroError, ValueError):
  """A model name, shape, argument or layer `tff_hetero.models` rejects."""


class DivergenceError(HeteroError, RuntimeError):
  """Training produced a non-finite loss or weights; names the round."""


class WorkerError(HeteroError, RuntimeError):
  """A TFF worker cannot be reached, did not start, or was lost
  (`tff_hetero.runtime.workers`: `WorkerUnavailableError` and its kinds)."""
