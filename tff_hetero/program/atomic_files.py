"""Files written all or nothing: reports, checkpoints, saved models, tables.

A run can be killed at any moment (SIGTERM, SIGKILL, power): a reader must
find either the previous file or the new one, never a torn one. Every writer
of the program and the pipelines goes through `atomic_write`, except the
appended rows of `metrics.csv` (`outputs.AppendingCSVReleaseManager`, which
drops a torn last line when it opens the file).
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import json
import os
import tempfile
from typing import IO
from typing import Any


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w") -> Iterator[IO]:
  """Yields a file whose contents replace `path` when the block succeeds.

  Written to a temporary file of its own in `path`'s directory (so that two
  processes writing the same path never share one), flushed and fsynced,
  renamed over `path` (atomic on POSIX), then the directory is fsynced so
  that the rename itself survives a power cut. If the block raises, the
  temporary file is removed and `path` is left as it was.
  """
  directory = os.path.dirname(os.path.abspath(path))
  fd, temp = tempfile.mkstemp(
    dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp"
  )
  # mkstemp makes the file 0600: give it the mode `open` would.
  umask = os.umask(0)
  os.umask(umask)
  os.fchmod(fd, 0o666 & ~umask)
  try:
    with os.fdopen(fd, mode) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(temp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(temp)
    raise
  dir_fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(dir_fd)
  finally:
    os.close(dir_fd)


def write_json(path: str, value: Any) -> None:
  """`value` as indented JSON, atomically."""
  with atomic_write(path) as f:
    json.dump(value, f, indent=1)


def write_text(path: str, text: str) -> None:
  """`text`, atomically."""
  with atomic_write(path) as f:
    f.write(text)
