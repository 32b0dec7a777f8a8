"""`python -m pipelines.reproduce.fedsgc`: its plan, its errors, a tiny run."""

import json

import pytest

from pipelines import _cli
from pipelines.reproduce import fedsgc as reproduce
from tff_hetero.program import ExperimentConfig


def test_plan_covers_every_part_once():
  base = ExperimentConfig(root_output_dir="/r", experiment_name="x")
  runs = reproduce.plan_runs(base, ["table", "sparsity", "dirichlet"])
  names = [r.name for r in runs]
  assert len(names) == len(set(names)) == 7 + 6 + 12
  by_name = {r.name: r.config for r in runs}
  assert by_name["fedsgc_mu_1_0_shards"].prox_mu == 1.0
  assert not by_name["fedsgc_no_upload_memory_shards"].sgc_remember_uploads
  assert by_name["feddst_shards_s60"].sparsity == 0.6
  assert by_name["fedprox_dirichlet_0_1"].alpha == 0.1
  assert by_name["fedprox_dirichlet_0_1"].partition == "dirichlet"


def test_bad_parts_flag(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(reproduce.main, ["reproduce", "--parts=nope",
                                         f"--root_output_dir={tmp_path}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--parts" in err[0]


def test_tiny_table_run(tmp_path):
  _cli.run_in_process(reproduce.main, [
      "reproduce", "--parts=table", "--dataset=synthetic", "--model=mlp",
      "--num_clients=6", "--clients_per_round=3", "--rounds=2",
      "--local_epochs=1", "--eval_every=1", "--readjust_every=1",
      "--upload_budgets_mib=0.001:100", f"--root_output_dir={tmp_path}"])
  out_dir = tmp_path / "fedsgc_reproduction"
  results = json.loads((out_dir / "results.json").read_text())
  assert results["budgets_mib"] == [0.001, 100.0]
  table = results["table"]
  assert list(table) == list(reproduce.TABLE_ROWS)
  for best in table.values():
    # Nothing fits in 1 kB of upload; everything in 100 MiB.
    assert best[0] != best[0]  # NaN
    assert 0.0 <= best[1] <= 1.0
  assert (out_dir / "accuracy_vs_upload.png").exists()
  fedsgc = json.loads((out_dir / "runs" / "fedsgc_shards" /
                       "report.json").read_text())
  assert fedsgc["bytes_up_total"] < json.loads(
      (out_dir / "runs" / "fedavg_shards" / "report.json").read_text()
  )["bytes_up_total"]
