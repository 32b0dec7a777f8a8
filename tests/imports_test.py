"""Every module imports on its own, without import cycles or side effects.

One interpreter per module would cost TensorFlow's and TFF's start-up (~5 s)
eighty times. Instead a parent process imports the third-party stack once
(TensorFlow, Keras, TFF, NumPy, absl), none of our modules, and forks a child
per module: each child starts with no `tff_hetero` or `pipelines` module
loaded, imports one module, and reports whether it failed and whether the
environment changed (two children at a time; our modules' bytecode is
cached for the run, outside the repo). A module that
only imports because another one was imported first (a cycle dodged by the
order of imports) fails here.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _our_modules() -> list[str]:
  names = []
  for package in ("tff_hetero", "pipelines"):
    for path in sorted((REPO / package).rglob("*.py")):
      parts = list(path.relative_to(REPO).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      names.append(".".join(parts))
  return names


_ZYGOTE = textwrap.dedent(r"""
    import importlib, json, os, select, sys, traceback
    import numpy, absl.flags, attrs, tree  # noqa
    import tensorflow as tf
    tf.keras.layers.Dense  # Keras loads lazily.
    import tensorflow_federated  # noqa
    assert not [m for m in sys.modules
                if m.split('.')[0] in ('tff_hetero', 'pipelines')]
    # Our modules' bytecode is cached, in a directory of this run only (not
    # the repo): without it each child compiles again every module it
    # loads, half of its import time. Cached or compiled, the same code runs.
    sys.pycache_prefix = sys.argv[2]
    sys.dont_write_bytecode = False
    results = {}
    pending = json.loads(sys.argv[1])
    running = {}  # read fd -> [module, child pid, bytes read so far]
    poll = select.poll()

    def start(name):
      read_fd, write_fd = os.pipe()
      pid = os.fork()
      if pid == 0:
        os.close(read_fd)
        # TensorFlow's import sets its log level; unset, a module's
        # `setdefault` shows.
        for key in [k for k in os.environ
                    if k.startswith(('TF_CPP', 'MALLOC_'))]:
          del os.environ[key]
        before = dict(os.environ)
        try:
          importlib.import_module(name)
          error = None
        except BaseException:  # pylint: disable=broad-except
          error = traceback.format_exc(limit=-3)
        after = dict(os.environ)
        env = sorted(k for k in set(before) | set(after)
                     if before.get(k) != after.get(k))
        with os.fdopen(write_fd, 'w') as f:
          json.dump({'error': error, 'env': env}, f)
        os._exit(0)
      os.close(write_fd)  # Before the next fork: no child holds another's.
      running[read_fd] = [name, pid, b'']
      poll.register(read_fd, select.POLLIN)

    # Two children at a time (two cores), each forked from this process as
    # it is: with none of our modules loaded.
    while pending or running:
      while pending and len(running) < 2:
        start(pending.pop(0))
      for fd, _ in poll.poll():
        chunk = os.read(fd, 65536)
        if chunk:
          running[fd][2] += chunk
          continue
        poll.unregister(fd)
        os.close(fd)
        name, pid, text = running.pop(fd)
        os.waitpid(pid, 0)
        results[name] = (json.loads(text) if text
                         else {'error': 'child died', 'env': []})
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def import_results(tmp_path_factory):
  import json  # pylint: disable=g-import-not-at-top

  modules = _our_modules()
  env = dict(os.environ, PYTHONPATH=str(REPO))
  for name in [k for k in env if k.startswith(("TF_CPP", "MALLOC_"))]:
    del env[name]
  completed = subprocess.run(
    [
      sys.executable,
      "-c",
      _ZYGOTE,
      json.dumps(modules),
      str(tmp_path_factory.mktemp("pycache")),
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  return json.loads(completed.stdout.strip().splitlines()[-1])


def test_finds_the_modules():
  modules = _our_modules()
  assert "tff_hetero.algorithms.fedavg" in modules
  assert "pipelines.train" in modules
  assert len(modules) > 60


def test_every_module_imports_on_its_own(import_results):
  failed = {
    name: r["error"] for name, r in import_results.items() if r["error"]
  }
  assert not failed, "\n\n".join(f"{k}:\n{v}" for k, v in failed.items())


def test_importing_the_library_sets_no_environment_variables(import_results):
  changed = {
    name: r["env"]
    for name, r in import_results.items()
    if r["env"] and name.startswith("tff_hetero")
  }
  assert not changed


def test_entry_points_may_set_them(import_results):
  # The check above can see a change: the CLI entry points set TensorFlow's
  # log level and glibc's heap limits.
  assert "TF_CPP_MIN_LOG_LEVEL" in import_results["pipelines._cli"]["env"]


def test_no_module_imports_inside_a_function_to_dodge_a_cycle():
  offenders = []
  for path in sorted((REPO / "tff_hetero").rglob("*.py")):
    tree = ast.parse(path.read_text())
    for function in ast.walk(tree):
      if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      for node in ast.walk(function):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
          names = [node.module or ""]
        elif isinstance(node, ast.Import):
          names = [alias.name for alias in node.names]
        else:
          continue
        if any(n.split(".")[0] == "tff_hetero" for n in names):
          offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
  assert not offenders, "\n".join(sorted(set(offenders)))


def test_errors_module_loads_neither_tensorflow_nor_tff():
  code = (
    "import sys, tff_hetero.errors; "
    "print(sorted(m for m in ('tensorflow', 'tensorflow_federated') "
    "if m in sys.modules))"
  )
  completed = subprocess.run(
    [sys.executable, "-c", code],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  )
  assert completed.stdout.strip() == "[]"
