"""Files written all or nothing: reports, checkpoints, saved models, tables.

A run can be killed at any moment (SIGTERM, SIGKILL, power): a reader must
find either the previous file or the new one, never a torn one. Every writer
of the program and the pipelines goes through `atomic_write`.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import json
import os
from typing import IO
from typing import Any


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w") -> Iterator[IO]:
  """Yields a file whose contents replace `path` when the block succeeds.

  Written to `<path>.tmp`, flushed and fsynced, then renamed over `path`
  (atomic on POSIX). If the block raises, the temporary file is removed and
  `path` is left as it was.
  """
  temp = f"{path}.tmp"
  try:
    with open(temp, mode) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(temp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(temp)
    raise


def write_json(path: str, value: Any) -> None:
  """`value` as indented JSON, atomically."""
  with atomic_write(path) as f:
    json.dump(value, f, indent=1)


def write_text(path: str, text: str) -> None:
  """`text`, atomically."""
  with atomic_write(path) as f:
    f.write(text)
