"""`python -m pipelines.reproduce.spatl`: its plan, its errors, its tables
(from reports made by hand), a tiny run."""

import json
import math

from conftest import finish_runs_by_hand
import pytest

from pipelines import _cli
from pipelines.reproduce import _common
from pipelines.reproduce import spatl as reproduce


def _base(**changes):
  values = dict(reproduce.OFFLINE_DEFAULTS)
  values.update(root_output_dir="/r", experiment_name="x", **changes)
  from tff_hetero.program import make_config  # pylint: disable=g-import-not-at-top

  return make_config(**values)


def test_plan_covers_every_part_once():
  runs = reproduce.plan_runs(_base(), list(reproduce.PARTS), seeds=(0, 5))
  names = [r.name for r in runs]
  # Table: 5 x 2 seeds; second model and convergence: 2 x 2 + 3 x 1 each;
  # ablation: 4.
  assert len(names) == len(set(names)) == 10 + 7 + 7 + 4
  assert names[:5] == [
    f"{n}_seed0" for n in ("fedavg", "fednova", "fedprox", "scaffold", "spatl")
  ]
  by_name = {r.name: r.config for r in runs}
  assert by_name["fedprox_seed5"].settings.prox_mu == 0.01
  assert by_name["second_model_spatl_seed5"].model == "resnet20"
  assert "second_model_fedavg_seed5" not in by_name
  convergence = by_name["convergence_scaffold_seed5"]
  assert (convergence.num_clients, convergence.clients_per_round) == (30, 12)
  assert by_name["spatl_w_o_transfer_seed0"].settings.spatl_transfer is False
  damped = by_name["spatl_with_correction_x_0_01_seed0"].settings
  assert damped.spatl_control_scale == 0.01
  for config in by_name.values():
    assert config.local_evaluation and config.val_fraction == 0.2


def test_prepared_cifar10_switches_to_the_papers_setting(tmp_path):
  # Nothing prepared, or a data set asked for: the offline default.
  assert (
    reproduce.default_settings(False, str(tmp_path))["dataset"] == "mnist5k"
  )
  # A prepared TFDS version directory holds dataset_info.json.
  (tmp_path / "cifar10" / "3.0.2").mkdir(parents=True)
  assert (
    reproduce.default_settings(False, str(tmp_path))["dataset"] == "mnist5k"
  )
  (tmp_path / "cifar10" / "3.0.2" / "dataset_info.json").write_text("{}")
  assert reproduce.default_settings(True, str(tmp_path))["dataset"] == "mnist5k"
  defaults = reproduce.default_settings(False, str(tmp_path))
  assert (defaults["dataset"], defaults["model"], defaults["local_epochs"]) == (
    "cifar10",
    "resnet20",
    10,
  )
  values = dict(defaults, root_output_dir="/r", experiment_name="x")
  from tff_hetero.program import make_config  # pylint: disable=g-import-not-at-top

  runs = reproduce.plan_runs(make_config(**values), ["second_model"], (0,))
  assert {r.config.model for r in runs} == {"resnet32"}


@pytest.mark.parametrize(
  "flags, needle",
  [
    (["--parts=nope"], "--parts"),
    (["--val_fraction=0"], "--local_evaluation"),
    (["--spatl_budget=2"], "--spatl_budget"),
    (["--sparsity=0.5"], "--sparsity: no run of this reproduction reads"),
  ],
)
def test_bad_flags_are_one_line_errors(flags, needle, tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(
      reproduce.main, ["reproduce", *flags, f"--root_output_dir={tmp_path}"]
    )
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and needle in err[0], err
  assert not list(tmp_path.iterdir())


def _report(local, up=1000, down=3000, clients=10):
  """Evaluated every second round with these local accuracies; every
  round moves `up` and `down` bytes per client."""
  history = []
  for i, acc in enumerate(local):
    for round_num in (2 * i + 1, 2 * i + 2):
      history.append(
        {
          "round": round_num,
          "local_accuracy": acc if round_num % 2 == 0 else math.nan,
          "clients": clients,
          "bytes_up": up * clients,
          "bytes_down": down * clients,
          "bytes_up_cumulative": up * clients * round_num,
          "bytes_down_cumulative": down * clients * round_num,
        }
      )
  return {"history": history, "config": {}, "final_metrics": {}}


def test_tables_count_rounds_and_mib_to_the_target_and_judge_claims():
  base = _base()
  reports = {
    run.name: _report([0.5, 0.6])
    for run in reproduce.plan_runs(base, ["table"], seeds=(0, 1))
  }
  mib = float(1 << 20)
  # SPATL reaches 80 % at round 4 (seed 0) and 2 (seed 1); SCAFFOLD at 6
  # on one seed only; FedAvg never.
  reports["spatl_seed0"] = _report([0.7, 0.81], up=500, down=3000)
  reports["spatl_seed1"] = _report([0.85], up=500, down=3000)
  reports["scaffold_seed0"] = _report([0.6, 0.7, 0.8], up=2000, down=6000)
  # SCAFFOLD's seed 1 diverged in round 5 (`_common.diverged_report`).
  reports["scaffold_seed1"] = dict(
    _report([0.5, 0.6]), diverged_at_round=5, rounds_completed=4
  )
  # The final round's selections: 30 % / 40 % saved on average, 45 % / 38 %
  # by the client saving most.
  for name, mean, largest in (
    ("spatl_seed0", 0.3, 0.45),
    ("spatl_seed1", 0.4, 0.38),
  ):
    reports[name]["history"][-1].update(
      model_flops_saved=mean, model_flops_saved_max=largest
    )
  text, results = reproduce.build_tables(base, reports, ["table"], (0, 1))
  assert results["inference"] == {
    base.model: dict(mean=[0.3, 0.4], max=[0.45, 0.38])
  }
  # Mean 35.0, sample std 7.1 (sqrt(0.005)); the largest over seeds 45.0.
  assert f"| {base.model} | 35.0 ± 7.1 | 45.0 |" in text
  spatl = results["table"]["SPATL"]
  assert spatl["rounds_to_target"] == 3.0 and spatl["reached"] == "2/2"
  # Seed 0: 4 rounds x 10 clients x 3500 B; seed 1: 2 rounds.
  assert spatl["mib_to_target"] == pytest.approx(
    (4 * 35000 + 2 * 35000) / 2 / mib
  )
  assert spatl["mib_per_client_round"] == pytest.approx(3500 / mib)
  scaffold = results["table"]["SCAFFOLD"]
  assert (scaffold["rounds_to_target"], scaffold["reached"]) == (6.0, "1/2")
  assert scaffold["diverged"] == "round 5" and spatl["diverged"] == "-"
  assert math.isnan(reproduce.final_local(reports["scaffold_seed1"]))
  assert reproduce.final_local(reports["scaffold_seed0"]) == 0.8
  assert "is kept as a result" in text
  assert math.isnan(results["table"]["FedAvg"]["rounds_to_target"])
  verdicts = {
    (c["claim"], c["setting"]): c["verdict"] for c in results["claims"]
  }
  table = "table"
  assert (
    verdicts[("SPATL reaches the target in fewer rounds than SCAFFOLD", table)]
    == "supported"
  )
  assert (
    verdicts[("SPATL reaches the target in fewer rounds than FedAvg", table)]
    == "not measured"
  )
  assert (
    verdicts[("SPATL's round costs a client less than SCAFFOLD's", table)]
    == "supported"
  )
  assert "| SPATL | 3.0 | 2/2 |" in text


def test_tiny_run(tmp_path, monkeypatch):
  # FedAvg, SCAFFOLD and SPATL run for real; FedNova and FedProx are
  # finished by hand, each with its own local accuracy (0.11, 0.12) and
  # 1,000 bytes up and 3,000 down per client, so that each row must be read
  # from its own run.
  by_hand = {"fednova_seed1": 0.11, "fedprox_seed1": 0.12}
  dispatched = finish_runs_by_hand(
    monkeypatch,
    {"fedavg_seed1", "scaffold_seed1", "spatl_seed1"},
    lambda config: dict(
      history=[
        {
          "round": 1,
          "accuracy": 0.5,
          "local_accuracy": by_hand[config.experiment_name],
          "clients": 4,
          "bytes_up": 4000,
          "bytes_down": 12000,
          "bytes_up_cumulative": 4000,
          "bytes_down_cumulative": 12000,
        }
      ],
      final_metrics={
        "accuracy": 0.5,
        "local_accuracy": by_hand[config.experiment_name],
      },
    ),
  )
  _cli.run_in_process(
    reproduce.main,
    [
      "reproduce",
      "--parts=table",
      "--dataset=synthetic",
      "--model=small_cnn",
      "--num_clients=4",
      "--clients_per_round=4",
      "--rounds=1",
      "--eval_every=1",
      "--local_epochs=1",
      "--spatl_episodes=2",
      "--spatl_ppo_epochs=2",
      "--seeds=1",
      f"--root_output_dir={tmp_path}",
    ],
  )
  # Every method's run was dispatched, once, with its algorithm.
  assert [(c.experiment_name, c.algorithm) for c in dispatched] == [
    ("fedavg_seed1", "fedavg"),
    ("fednova_seed1", "fednova"),
    ("fedprox_seed1", "fedprox"),
    ("scaffold_seed1", "scaffold"),
    ("spatl_seed1", "spatl"),
  ]
  out_dir = tmp_path / "spatl_reproduction"
  results = json.loads((out_dir / "results.json").read_text())
  assert list(results["table"]) == list(reproduce.METHODS)
  for label, row in results["table"].items():
    assert len(row["best_local_accuracy"]) == 1
    assert 0.0 <= row["best_local_accuracy"][0] <= 1.0
    assert row["mib_per_client_round"] > 0
    name = f"{_common.slug(label)}_seed1"
    if name in by_hand:
      assert row["best_local_accuracy"] == [by_hand[name]], label
      assert row["mib_per_client_round"] == pytest.approx(4000 / 2**20)
  # SCAFFOLD sends its control variate both ways: its round costs a client
  # more than FedAvg's.
  assert (
    results["table"]["SCAFFOLD"]["mib_per_client_round"]
    > results["table"]["FedAvg"]["mib_per_client_round"]
  )
  assert len(results["runs"]) == 5
  (saved,) = results["inference"]["small_cnn"]["mean"]
  assert 0.0 < saved < 1.0
  assert "## Claims" in (out_dir / "tables.md").read_text()
  for name in ("local_accuracy_vs_round.png", "client_accuracy.png"):
    assert (out_dir / name).exists()
