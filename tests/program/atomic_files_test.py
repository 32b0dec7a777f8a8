"""`atomic_write`: the new file whole, or the old file untouched."""

import os

import numpy as np
import pytest

from tff_hetero.program import atomic_files


def test_replaces_the_file_and_leaves_no_temporary(tmp_path):
  path = str(tmp_path / "report.json")
  atomic_files.write_json(path, {"a": 1})
  atomic_files.write_json(path, {"a": 2})
  assert open(path).read() == '{\n "a": 2\n}'
  assert os.listdir(tmp_path) == ["report.json"]  # No temporary left.


def test_a_failed_write_keeps_the_old_file(tmp_path):
  path = str(tmp_path / "table.md")
  atomic_files.write_text(path, "old")
  with pytest.raises(ZeroDivisionError):
    with atomic_files.atomic_write(path) as f:
      f.write("half of the new")
      raise ZeroDivisionError
  assert open(path).read() == "old"
  assert os.listdir(tmp_path) == ["table.md"]


def test_binary_numpy_archive(tmp_path):
  path = str(tmp_path / "weights.npz")
  with atomic_files.atomic_write(path, "wb") as f:
    np.savez(f, w=np.arange(3))
  with np.load(path) as saved:
    np.testing.assert_array_equal(saved["w"], [0, 1, 2])


def test_file_gets_the_mode_open_would_give(tmp_path):
  path = tmp_path / "report.json"
  atomic_files.write_text(str(path), "x")
  umask = os.umask(0)
  os.umask(umask)
  assert path.stat().st_mode & 0o777 == 0o666 & ~umask
