"""Checks the test setup itself, under `tools/test.sh` (pytest) and under Bazel.

- the interpreter is the project's virtualenv (.venv) on Python 3.11;
- `tff_hetero` and `pipelines` import from this workspace's sources;
- a subprocess started as tests do (`sys.executable -m pipelines.<x>`) gets the same
  interpreter and resolves the same packages;
- tmp_path is writable (under Bazel: inside $TEST_TMPDIR).
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pipelines
import tff_hetero

# tests/bazel_smoke_test.py -> the workspace root (through Bazel's runfiles symlinks).
REPO_ROOT = pathlib.Path(os.path.realpath(__file__)).parent.parent


def _real(path):
  return pathlib.Path(os.path.realpath(path))


def test_interpreter_is_project_venv_python_3_11():
  assert sys.version_info[:2] == (3, 11), sys.version
  assert sys.prefix != sys.base_prefix, f"not a virtualenv: {sys.prefix}"
  assert _real(sys.prefix) == _real(REPO_ROOT / ".venv"), (
    sys.prefix,
    REPO_ROOT,
  )
  # The TFF stack and the test tools are installed there (checked without importing TF).
  for name in ("tensorflow_federated", "tensorflow", "pytest"):
    spec = importlib.util.find_spec(name)
    assert spec is not None, name
    assert _real(spec.origin).is_relative_to(_real(sys.prefix)), (
      name,
      spec.origin,
    )


def test_packages_import_from_workspace_sources():
  assert _real(tff_hetero.__file__) == REPO_ROOT / "tff_hetero" / "__init__.py"
  assert _real(pipelines.__file__) == REPO_ROOT / "pipelines" / "__init__.py"


def test_subprocess_sees_same_interpreter_and_packages(tmp_path):
  # What `subprocess.run([sys.executable, "-m", "pipelines.train", ...])` relies on:
  # -m resolves modules with importlib.util.find_spec, from a neutral cwd here.
  code = (
    "import importlib.util, json, sys; "
    "print(json.dumps({'prefix': sys.prefix, 'version': list(sys.version_info[:2]), "
    "'pipelines': importlib.util.find_spec('pipelines').origin, "
    "'tff_hetero': importlib.util.find_spec('tff_hetero').origin}))"
  )
  out = subprocess.run(
    [sys.executable, "-c", code],
    check=True,
    capture_output=True,
    text=True,
    cwd=os.getcwd(),
    timeout=120,
  ).stdout
  info = json.loads(out)
  assert info["version"] == [3, 11]
  assert _real(info["prefix"]) == _real(sys.prefix)
  assert _real(info["pipelines"]) == REPO_ROOT / "pipelines" / "__init__.py"
  assert _real(info["tff_hetero"]) == REPO_ROOT / "tff_hetero" / "__init__.py"


def test_tmp_path_is_writable_and_inside_bazel_tmpdir(tmp_path):
  f = tmp_path / "probe.txt"
  f.write_text("ok")
  assert f.read_text() == "ok"
  if "TEST_TMPDIR" in os.environ:  # under `bazel test`
    assert _real(tmp_path).is_relative_to(_real(os.environ["TEST_TMPDIR"]))
