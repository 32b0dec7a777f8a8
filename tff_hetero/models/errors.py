"""The one error type of `tff_hetero.models`.

`ModelError` is a `ValueError` whose message is a single line naming the bad
value and what is accepted; the command-line pipelines print it and exit with
status 2.
"""

from __future__ import annotations


class ModelError(ValueError):
  """A model name, shape, argument or layer the models package cannot handle."""
