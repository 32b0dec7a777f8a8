"""The code has one format and passes the linter (`pyproject.toml`'s ruff).

Fix with `.venv/bin/ruff format . && .venv/bin/ruff check --fix .`.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
RUFF = pathlib.Path(sys.executable).with_name("ruff")


def _ruff(*args):
  return subprocess.run(
    [str(RUFF), *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )


def test_code_is_formatted():
  completed = _ruff("format", "--check", ".")
  assert completed.returncode == 0, completed.stdout[-3000:]


def test_linter_passes():
  completed = _ruff("check", ".")
  assert completed.returncode == 0, completed.stdout[-3000:]
