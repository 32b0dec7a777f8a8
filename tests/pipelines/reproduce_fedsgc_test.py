"""`python -m pipelines.reproduce.fedsgc`: its plan, its errors, a tiny run."""

import json

from conftest import finish_runs_by_hand
import pytest

from pipelines import _cli
from pipelines.reproduce import fedsgc as reproduce
from tff_hetero.program import make_config


def test_plan_covers_every_part_once_seed_by_seed():
  base = make_config(
    algorithm="fedsgc", root_output_dir="/r", experiment_name="x"
  )
  runs = reproduce.plan_runs(
    base,
    ["table", "ablation", "sparsity", "baselines", "dirichlet"],
    seeds=(0, 5),
  )
  names = [r.name for r in runs]
  assert len(names) == len(set(names)) == (8 + 4) * 2 + 4 + 1 + 12
  # A whole first-seed table comes before the second seed.
  assert names[:12] == [
    f"{n}_seed0"
    for n in (
      "fedavg",
      "fedprox",
      "prunefl",
      "grasp",
      "feddst",
      "feddst_mu_1_0",
      "fedsgc",
      "fedsgc_mu_1_0",
      "fedsgc_memory_updates",
      "fedsgc_memory_none",
      "fedsgc_lambda_0",
      "fedsgc_memory_none_lambda_0",
    )
  ]
  by_name = {r.name: r.config for r in runs}
  assert by_name["fedsgc_mu_1_0_seed5"].settings.prox_mu == 1.0
  assert by_name["fedsgc_mu_1_0_seed5"].seed == 5
  assert by_name["fedprox_seed0"].settings.prox_mu == 1.0
  assert by_name["fedsgc_memory_none_seed0"].settings.sgc_memory == "none"
  assert by_name["fedsgc_lambda_0_seed5"].settings.congruity_lambda == 0.0
  unguided = by_name["fedsgc_memory_none_lambda_0_seed0"].settings
  assert (unguided.sgc_memory, unguided.congruity_lambda) == ("none", 0.0)
  assert by_name["feddst_shards_s60_seed0"].settings.sparsity == 0.6
  # FedDST's code passes its sparsity to GraSP as the fraction kept.
  assert by_name["grasp_kept_80_seed0"].algorithm == "grasp"
  assert by_name["grasp_kept_80_seed0"].settings.sparsity == pytest.approx(0.2)
  assert by_name["fedprox_dirichlet_0_1_seed0"].partition == "dirichlet"
  # CIFAR-10: the paper's table uses mu = 0.1.
  cifar = reproduce.plan_runs(
    make_config(
      algorithm="fedsgc",
      dataset="cifar10",
      root_output_dir="/r",
      experiment_name="x",
    ),
    ["table"],
    seeds=(0,),
  )
  by_name = {r.name: r.config for r in cifar}
  assert by_name["fedsgc_mu_0_1_seed0"].settings.prox_mu == 0.1
  assert "prox_mu" not in by_name["fedavg_seed0"].to_json_dict()


@pytest.mark.parametrize(
  "flags, needle",
  [
    (["--parts=nope"], "--parts"),
    (["--seeds=a,b"], "--seeds"),
    (["--seeds=1,1"], "--seeds"),
    (["--upload_budgets_mib="], "--upload_budgets_mib"),
    (["--sparsity=1.5"], "--sparsity: must be in [0, 1)"),
    (["--algorithm=fedavg"], "--algorithm: a reproduction sets each run's"),
    (["--gkt_mode=async"], "--gkt_mode: no run of this reproduction reads"),
  ],
)
def test_bad_flags_are_one_line_errors(flags, needle, tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(
      reproduce.main, ["reproduce", *flags, f"--root_output_dir={tmp_path}"]
    )
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and needle in err[0]
  assert not list(tmp_path.iterdir())


def test_tiny_table_run(tmp_path, monkeypatch):
  # FedAvg and FedSGC run for real; the other six rows are finished by
  # hand, each with its own accuracy (0.11, 0.12, ... in table order) after
  # 4,000 bytes of upload (more than 1 kB), so that each row must be read
  # from its own run.
  labels = list(reproduce.table_rows(make_config(algorithm="fedsgc")))
  by_hand = {
    f"{reproduce._row_runs(label)}_seed1": 0.1 + 0.01 * (i + 1)  # pylint: disable=protected-access
    for i, label in enumerate(labels)
    if label not in ("FedAvg", "FedSGC")
  }
  dispatched = finish_runs_by_hand(
    monkeypatch,
    {"fedavg_seed1", "fedsgc_seed1"},
    lambda config: dict(
      history=[
        {
          "round": 1,
          "accuracy": by_hand[config.experiment_name],
          "bytes_up_cumulative": 4000,
        }
      ],
      final_metrics={"accuracy": by_hand[config.experiment_name]},
      bytes_up_total=4000,
    ),
  )
  _cli.run_in_process(
    reproduce.main,
    [
      "reproduce",
      "--parts=table",
      "--dataset=synthetic",
      "--model=mlp",
      "--num_clients=6",
      "--clients_per_round=3",
      "--rounds=1",
      "--local_epochs=1",
      "--eval_every=1",
      "--seeds=1",
      "--prunefl_initial_rounds=1",
      "--prunefl_initial_readjust_every=1",
      "--upload_budgets_mib=0.001:100",
      f"--root_output_dir={tmp_path}",
    ],
  )
  # Every row's run was dispatched, once, with its algorithm.
  assert [(c.experiment_name, c.algorithm) for c in dispatched] == [
    ("fedavg_seed1", "fedavg"),
    ("fedprox_seed1", "fedprox"),
    ("prunefl_seed1", "prunefl"),
    ("grasp_seed1", "grasp"),
    ("feddst_seed1", "feddst"),
    ("feddst_mu_1_0_seed1", "feddst"),
    ("fedsgc_seed1", "fedsgc"),
    ("fedsgc_mu_1_0_seed1", "fedsgc"),
  ]
  out_dir = tmp_path / "fedsgc_reproduction"
  results = json.loads((out_dir / "results.json").read_text())
  assert results["budgets_mib"] == [0.001, 100.0]
  assert results["seeds"] == [1]
  table = results["table"]
  assert list(table) == list(
    reproduce.table_rows(make_config(algorithm="fedsgc"))
  )
  for label, per_budget in table.items():
    # Nothing fits in 1 kB of upload; everything in 100 MiB.
    assert all(v != v for v in per_budget[0]), label  # NaN
    assert len(per_budget[1]) == 1
    assert all(0.0 <= v <= 1.0 for v in per_budget[1])
    name = f"{reproduce._row_runs(label)}_seed1"  # pylint: disable=protected-access
    if name in by_hand:
      assert per_budget[1] == [by_hand[name]], label
  runs = {r["name"]: r for r in results["runs"]}
  assert len(runs) == 8
  record = runs["fedsgc_seed1"]
  assert record["seed"] == 1 and record["settings"]["algorithm"] == "fedsgc"
  assert record["code"][0]["action"] == "started"
  assert len(record["code"][0]["commit"]) == 40
  # The flags given reach the runs that read them.
  assert runs["prunefl_seed1"]["settings"]["prunefl_initial_rounds"] == 1
  verdicts = {c["verdict"] for c in results["claims"]}
  assert verdicts <= {
    "supported",
    "not supported",
    "within noise",
    "not measured",
  }
  assert "## Claims" in (out_dir / "tables.md").read_text()
  assert (out_dir / "accuracy_vs_upload.png").exists()
  assert sorted(p.name for p in (out_dir / "metrics").iterdir()) == sorted(
    f"{name}.csv" for name in runs
  )
  sgc = json.loads(
    (out_dir / "runs" / "fedsgc_seed1" / "report.json").read_text()
  )
  assert (
    sgc["bytes_up_total"]
    < json.loads(
      (out_dir / "runs" / "fedavg_seed1" / "report.json").read_text()
    )["bytes_up_total"]
  )


def _report(best_by_round):
  """A report whose evaluated rounds reach `best_by_round` = [(MiB, acc)]."""
  return {
    "history": [
      {"round": i + 1, "accuracy": acc, "bytes_up_cumulative": mib * 2**20}
      for i, (mib, acc) in enumerate(best_by_round)
    ],
    "config": {},
    "final_metrics": {},
  }


def test_tables_average_seeds_and_judge_claims(tmp_path):
  base = make_config(
    algorithm="fedsgc",
    root_output_dir=str(tmp_path),
    experiment_name="x",
    upload_budgets_mib="1:10",
  )
  reports = {}
  # Per seed: FedSGC 0.80/0.90 and 0.82/0.92; FedDST 0.60/0.91 and
  # 0.62/0.89; everyone else 0.5/0.5.
  for run in reproduce.plan_runs(base, ["table", "ablation"], seeds=(0, 1)):
    reports[run.name] = _report([(1, 0.5), (10, 0.5)])
  for seed, (sgc, dst) in enumerate(
    (((0.80, 0.90), (0.60, 0.91)), ((0.82, 0.92), (0.62, 0.89)))
  ):
    reports[f"fedsgc_seed{seed}"] = _report([(1, sgc[0]), (10, sgc[1])])
    reports[f"feddst_seed{seed}"] = _report([(1, dst[0]), (10, dst[1])])
  text, results = reproduce.build_tables(
    base, reports, ["table", "ablation"], seeds=(0, 1)
  )
  assert results["table"]["FedSGC"] == [[0.80, 0.82], [0.90, 0.92]]
  # mean 81.0, sample std 1.4; 91.0 and 90.0 ± 1.4.
  assert "| FedSGC | 81.0 ± 1.4 | 91.0 ± 1.4 |" in text
  verdicts = {
    (c["claim"], c["budget"]): c["verdict"] for c in results["claims"]
  }
  assert verdicts[("FedSGC > FedDST", "1 MiB")] == "supported"
  assert verdicts[("FedSGC > FedDST", "10 MiB")] == "within noise"
  assert verdicts[("FedSGC > FedAvg", "10 MiB")] == "supported"
  assert verdicts[("guidance: FedSGC > FedSGC lambda=0", "1 MiB")] == (
    "supported"
  )
