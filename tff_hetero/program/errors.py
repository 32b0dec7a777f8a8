"""Errors the pipelines turn into one line and an exit status."""


class UsageError(ValueError):
  """A flag value or combination that cannot run; the message is one line.

  Attributes:
    flag: The flag at fault, e.g. `--alpha` (included in the message).
  """

  def __init__(self, flag: str, message: str):
    self.flag = flag
    super().__init__(f"{flag}: {message}")


class DivergenceError(RuntimeError):
  """Training produced a non-finite loss or weights; names the round."""
