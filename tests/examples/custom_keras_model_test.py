"""The README's library example, run as a user would: a separate process.

`examples/custom_keras_model.py` imports only `tff_hetero`'s public names and
trains a Keras model of its own. The bytes it prints are checked against a
hand count, and no TFF worker it started may outlive it.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

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


def _run_example(*args):
  """The example's per-round lines (round, loss, accuracy, down, up)."""
  tag, env = runtime_testing.tagged_env()
  env["PYTHONPATH"] = str(REPO)
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  completed = subprocess.run(
    [sys.executable, str(EXAMPLE), "--rounds=4", *args],
    cwd=REPO / "examples",
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  runtime_testing.assert_no_workers_left(tag)
  assert completed.returncode == 0, completed.stderr[-2000:]
  rounds = re.findall(
    r"^round (\d+): loss=(\S+) test_accuracy=(\S+) bytes_down=(\d+)"
    r" bytes_up=(\d+)$",
    completed.stdout,
    flags=re.M,
  )
  assert [int(r[0]) for r in rounds] == [1, 2, 3, 4]
  return rounds


# Each aggregator once (a run is a whole process: ~15 s): the mean here, the
# private one on HeteroFL's widths below (its masked path is the harder one).
def test_example_trains_and_measures_by_hand_count():
  rounds = _run_example("--aggregator=mean")
  # The MLP: 10x16 + 16 + 16x3 + 3 = 227 float32 = 908 bytes. Four clients a
  # round each receive the model and send its update and a float32 weight.
  for _, _, _, down, up in rounds:
    assert int(down) == 4 * 908
    assert int(up) == 4 * (908 + 4)
  losses = [float(r[1]) for r in rounds]
  assert losses[-1] < losses[0] / 2
  # Three classes: chance is 1/3.
  assert float(rounds[-1][2]) > 0.9


def test_feddst_example_trains_sparse_and_measures_by_hand_count():
  rounds = _run_example("--algorithm=feddst")
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


def test_heterofl_example_trains_two_widths_and_measures_by_hand_count():
  rounds = _run_example("--algorithm=heterofl", "--aggregator=dp")
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
