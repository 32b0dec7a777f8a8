"""`python -m pipelines.reproduce.adaptivefl`: its plan, its errors, a tiny run."""

import json
import os

import pytest

from pipelines import _cli
from pipelines.reproduce import adaptivefl as reproduce
from tff_hetero.program import ExperimentConfig


def test_plan_covers_every_table_once():
  base = ExperimentConfig(model="vgg16_eighth", root_output_dir="/r",
                          experiment_name="x")
  runs = reproduce.plan_runs(base, ["2", "3", "4", "5"])
  names = [r.name for r in runs]
  assert len(names) == len(set(names)) == 12 + 6 + 3 + 4
  by_name = {r.name: r.config for r in runs}
  assert by_name["adaptivefl_alpha_0_3"].alpha == 0.3
  assert by_name["adaptivefl_alpha_0_3"].partition == "dirichlet"
  assert by_name["heterofl_iid_181"].tier_proportions == "1:8:1"
  assert by_name["adaptivefl_coarse_iid"].pool_start_indices == "8"
  assert by_name["adaptivefl_curiosity_iid"].adaptivefl_selection == "curiosity"
  assert by_name["all_large_iid"].root_output_dir == "/r/x/runs"
  # Table 5 alone needs the five selection variants on IID data only.
  assert sorted(r.name for r in reproduce.plan_runs(base, ["5"])) == sorted(
      ["adaptivefl_iid", "adaptivefl_greedy_iid", "adaptivefl_random_iid",
       "adaptivefl_curiosity_iid", "adaptivefl_resource_iid"])


@pytest.mark.parametrize("argv, expected", [
    (["--tables=9"], "--tables"),
    (["--rounds=0"], "--rounds"),
    (["--model=nope"], "--model"),
])
def test_bad_flags_exit_2_with_one_line(argv, expected, tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(reproduce.main, ["reproduce", *argv,
                                         f"--root_output_dir={tmp_path}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and expected in err[0], err
  assert not os.listdir(tmp_path)


def test_tiny_figure5_run_writes_tables_and_reuses_runs(tmp_path, capsys):
  argv = ["reproduce", "--tables=5", "--dataset=synthetic", "--model=small_cnn",
          "--num_clients=6", "--clients_per_round=3", "--rounds=2",
          "--local_epochs=1", "--eval_every=2", "--pool_start_indices=1",
          f"--root_output_dir={tmp_path}"]
  _cli.run_in_process(reproduce.main, argv)
  out_dir = tmp_path / "adaptivefl_reproduction"
  results = json.loads((out_dir / "results.json").read_text())
  variants = results["figure5"]
  assert list(variants) == list(reproduce.VARIANTS)
  for numbers in variants.values():
    assert 0.0 <= numbers["waste_rate"] < 1.0
    assert 0.0 <= numbers["full"] <= 1.0
  # The run's rate sums bytes over its rounds (not a mean of round rates).
  greedy = json.loads((out_dir / "runs" / "adaptivefl_greedy_iid" /
                       "report.json").read_text())
  rows = greedy["history"]
  assert len(rows) == 2
  assert variants["AdaptiveFL+Greed"]["waste_rate"] == pytest.approx(
      1 - sum(r["returned_model_bytes"] for r in rows) /
      sum(r["sent_model_bytes"] for r in rows))
  # Greedy sends L1 only: 3 clients x 2 rounds x the full model's bytes.
  full_bytes = sum(r["sent_model_bytes"] for r in rows) / 6
  assert all(r["sent_model_bytes"] == 3 * full_bytes for r in rows)
  assert (out_dir / "figure5.png").exists()
  assert "| AdaptiveFL+CS |" in (out_dir / "tables.md").read_text()
  capsys.readouterr()
  _cli.run_in_process(reproduce.main, argv)  # Everything reused.
  assert capsys.readouterr().out.count("done before, reused") == 5
