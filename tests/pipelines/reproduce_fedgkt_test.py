"""`python -m pipelines.reproduce.fedgkt`: its plan, its tables, its errors,
a tiny run."""

import json

import pytest

from pipelines import _cli
from pipelines.reproduce import fedgkt as reproduce
from tff_hetero.program import ExperimentConfig


def _base(**changes):
  settings = dict(root_output_dir="/r", experiment_name="x",
                  model="fedgkt_edge_resnet8",
                  gkt_server_model="fedgkt_server_resnet19", num_clients=8,
                  clients_per_round=8, batch_size=32)
  settings.update(changes)
  return ExperimentConfig(**settings)


def test_plan_covers_every_table_once():
  runs = reproduce.plan_runs(_base(), list(reproduce.PARTS))
  by_name = {r.name: r.config for r in runs}
  assert len(by_name) == len(runs) == 13
  assert by_name["fedavg_iid"].model == "resnet20"
  assert by_name["fedavg_noniid"].partition == "dirichlet"
  assert by_name["central_full"].num_clients == 1
  assert by_name["central_edge"].model == "fedgkt_edge_resnet8"
  assert by_name["fedgkt_async"].gkt_mode == "async"
  assert by_name["fedgkt_transfer_none"].gkt_transfer == "none"
  assert by_name["fedgkt_edges_16"].clients_per_round == 16
  assert by_name["fedgkt_edges_4"].num_clients == 4
  assert by_name["fedgkt_resnet4"].model == "fedgkt_edge_resnet4"
  for config in by_name.values():
    assert config.root_output_dir == "/r/x/runs"


def _report(accuracy, up, down, flops, examples=1000, **extra):
  history = [dict(round=1, accuracy=accuracy,
                  split_learning_bytes_per_batch=1000.0)]
  report = dict(final_metrics=dict(accuracy=accuracy, edge_accuracy=0.5),
                best_accuracy=accuracy, bytes_up_total=up,
                bytes_down_total=down, client_flops_total=flops,
                examples_processed_total=examples, history=history)
  report.update(extra)
  return report


def test_table_1_and_efficiency_from_the_reports():
  profile = dict(edge_params=100, full_params=1000, edge_flops=10,
                 full_flops=90)
  reports = {
      "fedgkt_iid": _report(0.9, 3 << 20, 1 << 20, 10**6,
                            algorithm=dict(fedgkt_models=profile)),
      "fedgkt_noniid": _report(0.8, 1, 1, 1),
      "fedavg_iid": _report(0.85, 6 << 20, 6 << 20, 9 * 10**6),
      "fedavg_noniid": _report(0.7, 1, 1, 1),
      "central_full": _report(0.95, 0, 0, 1),
      "central_edge": _report(0.6, 0, 0, 1),
  }
  text, results = reproduce.build_tables(_base(), reports, ["1"])
  assert results["table1"]["fedgkt_iid"] == 0.9
  assert "| FedGKT | 90.00 (90.00) | 80.00 (80.00) | 92.97 / 86.59 |" in text
  assert "| edge parameters | 100 | 1,000 | 10.0x |" in text
  assert "| client compute, whole run (MACs) | 1,000,000 | 9,000,000 | 9.0x |" in text
  # 4 MiB for FedGKT against 12 MiB for FedAvg.
  assert "| traffic, whole run (MiB, up + down) | 4.00 | 12.00 | 3.00x |" in text
  # Split learning: 1000 bytes per batch x 1000 examples / 32 per batch.
  split = 1000 * 1000 / 32 / (1 << 20)
  assert f"| 4.00 | {split:.2f} |" in text


def test_bad_parts_flag(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(reproduce.main, ["reproduce", "--parts=6",
                                         f"--root_output_dir={tmp_path}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--parts" in err[0]


def test_bad_server_model_fails_before_any_run(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(reproduce.main, [
        "reproduce", "--gkt_server_model=resnet56",
        f"--root_output_dir={tmp_path}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--gkt_server_model" in err[0]
  assert not (tmp_path / "fedgkt_reproduction" / "runs").exists()


def test_tiny_sync_async_run(tmp_path):
  _cli.run_in_process(reproduce.main, [
      "reproduce", "--parts=3", "--dataset=synthetic",
      "--model=fedgkt_edge_resnet4", "--num_clients=2",
      "--clients_per_round=2", "--rounds=2", "--batch_size=16",
      "--gkt_server_epochs=1", f"--root_output_dir={tmp_path}"])
  out_dir = tmp_path / "fedgkt_reproduction"
  results = json.loads((out_dir / "results.json").read_text())
  assert set(results["table3"]) == {"sync", "async"}
  for accuracy in results["table3"].values():
    assert 0.0 <= accuracy <= 1.0
  assert (out_dir / "accuracy.png").exists()
  assert "Table 3" in (out_dir / "tables.md").read_text()
