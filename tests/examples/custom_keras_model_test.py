"""The README's library example, run as a user would: as `__main__` of a
separate process.

`examples/custom_keras_model.py` imports only `tff_hetero`'s public names and
trains a Keras model of its own. The bytes it prints are checked against a
hand count, and no TFF worker it started may outlive it. Its three runs (one
per algorithm) share one process (a module fixture), one after the other,
each executed as `__main__` with its own command line: importing TensorFlow
is paid once instead of three times.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys

import pytest

import tff_hetero
from tff_hetero.runtime import testing as runtime_testing

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom_keras_model.py"


def test_example_uses_only_the_public_api():
  tree = ast.parse(EXAMPLE.read_text())
  ours = [
    node
    for node in ast.walk(tree)
    if isinstance(node, (ast.Import, ast.ImportFrom))
    and "tff_hetero" in ast.unparse(node)
  ]
  assert [ast.unparse(n) for n in ours] == ["import tff_hetero"]
  used = {
    node.attr
    for node in ast.walk(tree)
    if isinstance(node, ast.Attribute)
    and isinstance(node.value, ast.Name)
    and node.value.id == "tff_hetero"
  }
  assert used == {
    "MaskedAggregation",
    "build_fedavg_process",
    "build_feddst_process",
    "build_heterofl_process",
    "build_model_aggregator",
    "local_execution",
  }
  assert used <= set(tff_hetero.__all__)


# Runs the example once per command line, each as `__main__` (as
# `python custom_keras_model.py ...` does), with a marker line before each
# and, after each, the TFF workers of this process still alive (waiting up
# to 5 s for them to go).
_DRIVER = """
import json, os, runpy, sys, time
example = sys.argv[1]
for args in json.loads(sys.argv[2]):
  print("=== run", *args, flush=True)
  sys.argv = [example, *args]
  runpy.run_path(example, run_name="__main__")
  from tff_hetero.runtime import testing
  deadline = time.monotonic() + 5
  while testing.worker_pids_of(os.getpid()) and time.monotonic() < deadline:
    time.sleep(0.05)
  print("workers left:", *testing.worker_pids_of(os.getpid()), flush=True)
"""
_RUNS = {
  "mean": ["--aggregator=mean"],
  "feddst": ["--algorithm=feddst"],
  "heterofl_dp": ["--algorithm=heterofl", "--aggregator=dp"],
}


@pytest.fixture(scope="module")
def example_output():
  """The example's per-round lines (round, loss, accuracy, down, up), by
  run."""
  tag, env = runtime_testing.tagged_env()
  env["PYTHONPATH"] = str(REPO)
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  command_lines = [["--rounds=4", *args] for args in _RUNS.values()]
  completed = subprocess.run(
    [
      sys.executable,
      "-c",
      _DRIVER,
      str(EXAMPLE),
      json.dumps(command_lines),
    ],
    cwd=REPO / "examples",
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  runtime_testing.assert_no_workers_left(tag)
  assert completed.returncode == 0, completed.stderr[-2000:]
  parts = completed.stdout.split("=== run ")[1:]
  assert [p.splitlines()[0].split() for p in parts] == command_lines
  by_run = {}
  for name, part in zip(_RUNS, parts):
    rounds = re.findall(
      r"^round (\d+): loss=(\S+) test_accuracy=(\S+) bytes_down=(\d+)"
      r" bytes_up=(\d+)$",
      part,
      flags=re.M,
    )
    assert [int(r[0]) for r in rounds] == [1, 2, 3, 4], (name, part)
    # The run's own worker is gone before the next run starts.
    assert part.splitlines()[-1] == "workers left:", (name, part)
    by_run[name] = rounds
  return by_run


# Each aggregator once (a run builds and traces its process): the mean here,
# the private one on HeteroFL's widths below (its masked path is the harder
# one).
def test_example_trains_and_measures_by_hand_count(example_output):
  rounds = example_output["mean"]
  # The MLP: 10x16 + 16 + 16x3 + 3 = 227 float32 = 908 bytes. Four clients a
  # round each receive the model and send its update and a float32 weight.
  for _, _, _, down, up in rounds:
    assert int(down) == 4 * 908
    assert int(up) == 4 * (908 + 4)
  losses = [float(r[1]) for r in rounds]
  assert losses[-1] < losses[0] / 2
  # Three classes: chance is 1/3.
  assert float(rounds[-1][2]) > 0.9


def test_feddst_example_trains_sparse_and_measures_by_hand_count(
  example_output,
):
  rounds = example_output["feddst"]
  # ERK at sparsity 0.5 over the kernels 10x16 and 16x3: raw densities
  # 26/160 and 19/48, eps = 104 / (26 + 19); 60 of 160 and 44 of 48 kept.
  # Down, per client: the round number (8), kept values 4 x 104, bit masks
  # 20 + 6, biases 4 x 19 = 526. Up: values and biases, the float32
  # weight (496), plus a kernel's bit mask where the readjustment changed it.
  for _, _, _, down, up in rounds:
    assert int(down) == 4 * 526
    assert 4 * 496 <= int(up) <= 4 * (496 + 26)
  losses = [float(r[1]) for r in rounds]
  assert losses[-1] < losses[0]
  assert float(rounds[-1][2]) > 0.8  # Three classes: chance is 1/3.


def test_heterofl_example_trains_two_widths_and_measures_by_hand_count(
  example_output,
):
  rounds = example_output["heterofl_dp"]
  # Weak clients (ids 0-3) get the MLP at half its hidden width: 10x8 + 8 +
  # 8x3 + 3 = 115 float32 (460 bytes); strong ones the whole 908 bytes. Up:
  # the same values, a float32 weight and the four metric sums (loss and
  # accuracy as float32 pairs, examples and batches as int64: 32 bytes).
  for _, _, _, down, up in rounds:
    weak = (4 * 908 - int(down)) / (908 - 460)
    assert weak in (0, 1, 2, 3, 4)
    assert int(up) == int(down) + 4 * (4 + 32)
  weak_counts = {(4 * 908 - int(r[3])) // (908 - 460) for r in rounds}
  assert len(weak_counts) > 1  # Both widths trained in some round.
  losses = [float(r[1]) for r in rounds]
  assert losses[-1] < losses[0] / 2
  assert float(rounds[-1][2]) > 0.9  # Three classes: chance is 1/3.
