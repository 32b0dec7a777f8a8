"""Runs one pytest file as a Bazel py_test: `pytest_runner.py <test file> [pytest args]`.

Used by the `pytest_test` macro in tools/bazel/pytest.bzl. Bazel starts it with the
project's virtualenv Python (the registered toolchain), cwd = the workspace's runfiles
directory and PYTHONPATH = the runfiles roots, so `tff_hetero`, `pipelines` and `tests`
import from the workspace sources and `python -m pipelines.<x>` works in subprocesses.
"""

import os
import sys


def main(argv):
  if len(argv) < 2:
    sys.stderr.write("usage: pytest_runner.py <test file> [pytest args...]\n")
    return 2
  test_file, extra = argv[1], argv[2:]

  # Subprocesses started by tests (sys.executable -m pipelines.x) must see the same
  # interpreter and import path. Bazel's stub already exports PYTHONPATH; make the cwd
  # (the workspace root inside runfiles) importable too, like `python -m pytest` does.
  cwd = os.getcwd()
  paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  if cwd not in paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([cwd] + paths)
  if cwd not in sys.path:
    sys.path.insert(0, cwd)

  args = [test_file, "-q", "-p", "no:cacheprovider"]
  tmp = os.environ.get("TEST_TMPDIR")
  if tmp:
    # tempfile / pytest's tmp_path live under Bazel's per-test writable directory.
    os.environ["TMPDIR"] = tmp
    import tempfile

    tempfile.tempdir = None
    args += ["--basetemp", os.path.join(tmp, "pytest")]
  xml = os.environ.get("XML_OUTPUT_FILE")
  if xml:
    args += ["--junitxml", xml]
  args += extra

  import pytest  # after TMPDIR is set

  return int(pytest.main(args))


if __name__ == "__main__":
  sys.exit(main(sys.argv))
