"""Width-heterogeneous algorithms through `python -m pipelines.train`.

AdaptiveFL end to end as a subprocess (outputs, per-level metrics, no worker
left), and a run stopped after round 2 and resumed equals the uninterrupted
run: the RL tables and the sampling RNG live in the checkpoint.
"""

import json
import os
import subprocess
import sys

import numpy as np

from pipelines import _cli
from pipelines import train
from tff_hetero.program import outputs
from tff_hetero.runtime import testing as proc_testing

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FLAGS = ["--algorithm=adaptivefl", "--dataset=synthetic", "--model=small_cnn",
          "--num_clients=8", "--clients_per_round=4", "--batch_size=10",
          "--client_lr=0.1", "--noprogress", "--checkpoint_every=1",
          "--pool_ratios=0.5:0.25", "--pool_start_indices=1"]


def test_adaptivefl_run_resume_and_outputs(tmp_path):
  tag, env = proc_testing.tagged_env()
  proc = subprocess.run(
      [sys.executable, "-m", "pipelines.train", *_FLAGS, "--rounds=3",
       f"--root_output_dir={tmp_path}", "--experiment_name=whole"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
      check=False)
  assert proc.returncode == 0, proc.stderr
  proc_testing.assert_no_workers_left(tag, timeout_s=5)
  whole = tmp_path / "whole"
  report = json.loads((whole / "report.json").read_text())
  final = report["final_metrics"]
  for key in ("accuracy", "M1_accuracy", "S1_accuracy", "avg_accuracy"):
    assert 0.0 <= final[key] <= 1.0, key
  assert final["avg_accuracy"] == np.mean(
      [final["accuracy"], final["M1_accuracy"], final["S1_accuracy"]])
  rows = outputs.read_metrics(whole)
  assert [r["round"] for r in rows] == ["1", "2", "3"]
  for row in rows:
    assert 0.0 <= float(row["waste_rate"]) < 1.0
    assert int(row["clients"]) == 4
  assert report["bytes_up_total"] == sum(int(r["bytes_up"]) for r in rows)

  # The same run, stopped after round 2 and resumed, in process.
  base = _FLAGS + [f"--root_output_dir={tmp_path}", "--experiment_name=parts"]
  _cli.run_in_process(train.main, ["train", *base, "--rounds=2"])
  _cli.run_in_process(train.main, ["train", *base, "--rounds=3", "--resume"])
  parts = tmp_path / "parts"
  a, b = outputs.load_final_weights(whole), outputs.load_final_weights(parts)
  assert sorted(a) == sorted(b)
  for key in a:
    np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-6)
  for x, y in zip(outputs.read_metrics(whole), outputs.read_metrics(parts)):
    for key in ("accuracy", "bytes_up", "bytes_down", "waste_rate", "pruned"):
      assert x[key] == y[key], key
