"""The one error type of `tff_hetero.devices`.

`DeviceError` is a `ValueError` whose message is a single line naming the bad
value (and the command-line flag it came from) and what is accepted; the
pipelines print it and exit with status 2.
"""

from __future__ import annotations


class DeviceError(ValueError):
  """A tier specification, client id or round the devices package rejects."""
