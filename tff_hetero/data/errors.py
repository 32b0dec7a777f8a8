"""The user-facing error type of `tff_hetero.data`.

Every invalid flag value, unknown name or missing data set raised by this
package is a `DataError`: a `ValueError` whose message is a single line naming
the offending value, so a command-line entry point can print it verbatim and
exit with status 2.
"""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
  """A one-line, user-facing error about data sets, partitions or their flags.

  The message is collapsed onto one line (runs of whitespace, including
  newlines, become single spaces) so it can be printed as is by a CLI.
  """

  def __init__(self, message: str) -> None:
    super().__init__(" ".join(str(message).split()))
