"""`python -m pipelines.reproduce.adaptivefl`: its plan, its errors, a tiny run."""

import json
import os

from conftest import finish_runs_by_hand
import pytest

from pipelines import _cli
from pipelines.reproduce import adaptivefl as reproduce
from tff_hetero.program import make_config


def test_plan_puts_every_method_on_one_population_per_seed():
  base = make_config(
    algorithm="adaptivefl",
    model="mnist_cnn",
    pool_start_indices="2:1",
    tier_capacities="9743:15402:22714",
    tier_fluctuation="0.125:0.0625:0.057",
    root_output_dir="/r",
    experiment_name="x",
  )
  runs = reproduce.plan_runs(base, reproduce.PARTS, seeds=(0, 1, 2))
  names = [r.name for r in runs]
  # Table 2: 4 methods x 3 distributions x 3 seeds; Table 4: the coarse pool
  # x 3 x 3; Figure 5: greedy and random x 3, C and S x 1; Table 3: HeteroFL
  # and AdaptiveFL at 8:1:1, 1:8:1 and 1:1:8, first seed (All-Large's row
  # is its Table 2 run).
  assert len(names) == len(set(names)) == 36 + 9 + 8 + 6
  by_name = {r.name: r.config for r in runs}
  assert by_name["adaptivefl_alpha_0_3_seed2"].alpha == 0.3
  assert by_name["adaptivefl_alpha_0_3_seed2"].partition == "dirichlet"
  assert by_name["heterofl_iid_118_seed0"].tier_proportions == "1:1:8"
  assert by_name["adaptivefl_iid_181_seed0"].tier_proportions == "1:8:1"
  assert "all_large_iid_181_seed0" not in by_name
  assert by_name["decoupled_alpha_0_6_seed1"].alpha == 0.6
  assert (
    by_name["adaptivefl_coarse_iid_seed1"].settings.pool_start_indices == "2"
  )
  assert by_name[
    "adaptivefl_curiosity_iid_seed0"
  ].settings.adaptivefl_selection == ("curiosity")
  assert "adaptivefl_curiosity_iid_seed1" not in by_name
  assert by_name["all_large_iid_seed0"].root_output_dir == "/r/x/runs"
  # Same population, partition and seed for the four methods.
  for seed in (0, 1, 2):
    configs = [
      by_name[f"{m}_{d}_seed{seed}"]
      for m in ("all_large", "decoupled", "heterofl", "adaptivefl")
      for d in ("iid", "alpha_0_6", "alpha_0_3")
    ]
    for field in (
      "seed",
      "tier_capacities",
      "tier_fluctuation",
      "tier_proportions",
      "num_clients",
      "clients_per_round",
      "rounds",
      "local_epochs",
      "batch_size",
    ):
      assert len({getattr(c, field) for c in configs}) == 1, field
    assert configs[0].seed == seed


def test_default_capacities_follow_the_pool():
  # small_cnn on 8x8x1 (synthetic), r = 0.66:0.3, I = 1, by hand:
  # S1 (16, 9): 160 + (144*9 + 9) + (36*10 + 10) = 1835;
  # M1 (16, 21): 160 + (144*21 + 21) + (84*10 + 10) = 4055;
  # L1 (16, 32): 6090. Weak 0.95 x S1, medium 0.95 x M1, strong 1.04 x L1.
  base = make_config(
    algorithm="adaptivefl",
    dataset="synthetic",
    model="small_cnn",
    pool_ratios="0.66:0.3",
    pool_start_indices="1",
  )
  assert reproduce.population_capacities(base) == "1743:3852:6334"


@pytest.mark.parametrize(
  "argv, expected",
  [
    (["--parts=9"], "--parts"),
    (["--rounds=0"], "--rounds"),
    (["--model=nope"], "--model"),
    (["--seeds=a"], "--seeds"),
    (
      [
        "--parts=4",
        "--model=small_cnn",
        "--dataset=synthetic",
        "--pool_start_indices=1",
      ],
      "--pool_start_indices",
    ),
  ],
)
def test_bad_flags_exit_2_with_one_line(argv, expected, tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(
      reproduce.main, ["reproduce", *argv, f"--root_output_dir={tmp_path}"]
    )
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and expected in err[0], err
  assert not os.path.exists(tmp_path / "adaptivefl_reproduction" / "runs")


def test_tiny_figure5_run_writes_tables_and_reuses_runs(
  tmp_path, capsys, monkeypatch
):
  # Greedy and AdaptiveFL+CS (RL) run for real; the three other variants
  # are finished by hand, each with two rounds sending 100 and 300 bytes
  # and getting 50 + k and 300 back, k = 0, 10, 20 in dispatch order:
  # 1 - (350 + k) / 400 summed over the rounds (for k = 0, 0.125; a mean of
  # the round rates would be 0.25), a different rate for each variant.
  real = {"adaptivefl_greedy_iid_seed0", "adaptivefl_iid_seed0"}
  returned_first = {}

  def by_hand(config):
    k = returned_first.setdefault(
      config.experiment_name, 50 + 10 * len(returned_first)
    )
    return dict(
      history=[
        {
          "round": r,
          "accuracy": 0.5,
          "sent_model_bytes": sent,
          "returned_model_bytes": returned,
        }
        for r, sent, returned in ((1, 100, k), (2, 300, 300))
      ],
      final_metrics={"accuracy": 0.5, "avg_accuracy": 0.4},
    )

  dispatched = finish_runs_by_hand(monkeypatch, real, by_hand)
  # Every device holds exactly S1 (1,835 parameters, by hand above), so
  # every client returns S1 whatever it is sent.
  argv = [
    "reproduce",
    "--parts=5",
    "--dataset=synthetic",
    "--model=small_cnn",
    "--num_clients=6",
    "--clients_per_round=3",
    "--rounds=2",
    "--local_epochs=1",
    "--eval_every=2",
    "--pool_start_indices=1",
    "--tier_capacities=1835:1835:1835",
    "--tier_fluctuation=0",
    "--seeds=0",
    f"--root_output_dir={tmp_path}",
  ]
  _cli.run_in_process(reproduce.main, argv)
  names = [
    f"{reproduce._variant_name(s)}_seed0"  # pylint: disable=protected-access
    for s, _ in reproduce.VARIANTS.values()
  ]
  # Every variant's run was dispatched, once, with its selection.
  assert [
    (c.experiment_name, c.settings.adaptivefl_selection) for c in dispatched
  ] == [(n, s) for n, (s, _) in zip(names, reproduce.VARIANTS.values())]
  out_dir = tmp_path / "adaptivefl_reproduction"
  results = json.loads((out_dir / "results.json").read_text())
  variants = results["figure5"]
  assert list(variants) == list(reproduce.VARIANTS)
  for label, name in zip(reproduce.VARIANTS, names):
    report = json.loads((out_dir / "runs" / name / "report.json").read_text())
    rows = report["history"]
    if name in real:
      assert [r["returned_model_bytes"] for r in rows] == [3 * 4 * 1835] * 2
    else:
      k = returned_first[name]
      assert variants[label]["waste_rate"] == [
        pytest.approx(1 - (k + 300) / 400)
      ], label
    # The run's rate sums bytes over its rounds (not a mean of round rates).
    assert variants[label]["waste_rate"] == [
      pytest.approx(
        1
        - sum(r["returned_model_bytes"] for r in rows)
        / sum(r["sent_model_bytes"] for r in rows)
      )
    ]
  # Greedy sends L1 (6,090) and gets S1 back: 1 - 1835 / 6090.
  assert variants["AdaptiveFL+Greed"]["waste_rate"] == [
    pytest.approx(1 - 1835 / 6090)
  ]
  records = {r["name"]: r for r in results["runs"]}
  assert sorted(records) == sorted(names)
  for record in records.values():
    assert record["seed"] == 0
    assert record["settings"]["tier_capacities"] == "1835:1835:1835"
    assert record["code"][0]["commit"]
  assert (out_dir / "figure5.png").exists()
  assert (out_dir / "metrics" / "adaptivefl_iid_seed0.csv").exists()
  assert "| AdaptiveFL+CS |" in (out_dir / "tables.md").read_text()
  capsys.readouterr()
  _cli.run_in_process(reproduce.main, argv)  # Everything reused.
  assert capsys.readouterr().out.count("done before, reused") == 5
  assert len(dispatched) == 5
  assert sorted(returned_first.values()) == [50, 60, 70]


def _report(full, avg, failed=()):
  return {
    "final_metrics": {"accuracy": full, "avg_accuracy": avg},
    "client_flops_total": 10**9,
    "history": [{"round": i + 1, "failed": f} for i, f in enumerate(failed)],
  }


def test_tables_2_3_4_and_claims_from_hand_made_reports():
  base = make_config(
    algorithm="adaptivefl",
    model="mnist_cnn",
    pool_start_indices="2:1",
    tier_capacities="1:2:3",
  )
  parts = ["2", "3", "4"]
  reports = {}
  for run in reproduce.plan_runs(base, parts, seeds=(0, 1, 2)):
    seed = run.config.seed
    # Full accuracy 0.90 / 0.92 / 0.94 over seeds (mean 92.0, std 2.0) for
    # AdaptiveFL, 0.80 / 0.81 / 0.82 (81.0 ± 1.0) for every other run; avg
    # one point below full.
    full = (
      0.90 + 0.02 * seed
      if run.name.startswith("adaptivefl_") and "coarse" not in run.name
      else 0.80 + 0.01 * seed
    )
    # Coarse-pool runs: 2 + 3 idle client-rounds in seed 0, 3 + 3 later.
    failed = (2.0 + min(seed, 1), 3.0) if "coarse" in run.name else ()
    reports[run.name] = _report(full, full - 0.01, failed)
  text, results = reproduce.build_tables(base, reports, parts, seeds=(0, 1, 2))
  # Table 2: All-Large has no avg; three distributions beside the paper's.
  assert (
    "| All-Large | - | 81.0 ± 1.0 | - / 79.76 | - | 81.0 ± 1.0 |"
    " - / 77.29 | - | 81.0 ± 1.0 | - / 74.95 |"
  ) in text
  assert (
    "| AdaptiveFL | 91.0 ± 2.0 | 92.0 ± 2.0 | 82.97 / 83.14 |"
    " 91.0 ± 2.0 | 92.0 ± 2.0 | 81.12 / 81.31 |"
  ) in text
  # Table 3, seed 0 only: All-Large's one run in every column.
  assert (
    "| All-Large | - | 80.0 | - / 79.76 | - | 80.0 | - / 79.76 | - |"
    " 80.0 | - / 79.76 | - | 80.0 | - / 79.76 |"
  ) in text
  assert "| HeteroFL | 79.0 | 80.0 | 77.98 / 74.96 | 79.0 | 80.0 |" in text
  assert list(results["table3"]["AdaptiveFL"]) == [
    "4:3:3",
    "8:1:1",
    "1:8:1",
    "1:1:8",
  ]
  # Table 4 prints full, avg and idle client-rounds per seed, per
  # distribution.
  assert (
    "| fine | 92.0 ± 2.0 | 91.0 ± 2.0 | 0 / 0 / 0 | 92.0 ± 2.0 |"
    " 91.0 ± 2.0 | 0 / 0 / 0 | 92.0 ± 2.0 | 91.0 ± 2.0 | 0 / 0 / 0 |"
    " 83.14 / 81.31 / 78.99 |"
  ) in text
  assert "| coarse | 81.0 ± 1.0 | 80.0 ± 1.0 | 5 / 6 / 6 |" in text
  verdicts = {c["claim"]: c["verdict"] for c in results["claims"]}
  # 92.0 ± 2.0 against 81.0 ± 1.0: 11 points apart, above the larger std.
  assert verdicts["AdaptiveFL full > HeteroFL full (alpha=0.6, Table 2)"] == (
    "supported"
  )
  assert verdicts["fine pool full > coarse pool full (alpha=0.6, Table 4)"] == (
    "supported (coarse: some weak devices idle, see Table 4)"
  )
  # One seed: 90.0 vs 80.0, against the 4:3:3 runs' spread (2.0).
  assert verdicts[
    "AdaptiveFL full > All-Large full (1:8:1, Table 3)"
  ].startswith("supported")
