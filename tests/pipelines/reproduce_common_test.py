"""The reproductions' shared run bookkeeping: which saved runs are reused,
resumed, or started afresh."""

import json
import math
import os
import threading
import time

from conftest import finish_runs_by_hand
import pytest

from pipelines.reproduce import _common
from tff_hetero.errors import UsageError
from tff_hetero.program import evolve_config
from tff_hetero.program import make_config


def test_saved_settings_match_unless_a_result_setting_differs():
  config = make_config(
    algorithm="fedgkt", root_output_dir="/a", rounds=10, checkpoint_every=5
  )
  saved = json.loads(json.dumps(config.to_json_dict()))
  # Where it ran and how often it checkpointed do not change results.
  moved = make_config(
    algorithm="fedgkt",
    root_output_dir="/b",
    rounds=10,
    checkpoint_every=1,
    executor="remote",
    workers=("127.0.0.1:5000",),
  )
  assert moved.same_results_as(saved)
  assert not make_config(
    algorithm="fedgkt", root_output_dir="/a", rounds=10, seed=1
  ).same_results_as(saved)
  # A setting added after the report was written matches at its default.
  del saved["gkt_temperature"]
  assert config.same_results_as(saved)
  assert not make_config(
    algorithm="fedgkt", rounds=10, gkt_temperature=1.0
  ).same_results_as(saved)
  # A checkpoint's fingerprint (a JSON string) likewise.
  fingerprint = json.loads(config.fingerprint())
  del fingerprint["augment"]
  assert moved.same_results_as(json.dumps(fingerprint))
  assert not evolve_config(moved, augment="crop").same_results_as(
    json.dumps(fingerprint)
  )


def test_run_stopped_before_its_first_checkpoint_restarts_keeping_outputs(
  tmp_path,
):
  logged = []
  fresh = tmp_path / "fresh"
  assert not _common.prepare_run_dir(str(fresh), logged.append)
  assert not logged

  stopped = tmp_path / "stopped"
  for attempt in (1, 2):
    stopped.mkdir()
    (stopped / "metrics.csv").write_text(f"round,loss\n1,{attempt}\n")
    assert not _common.prepare_run_dir(str(stopped), logged.append)
    assert not stopped.exists()
  assert (tmp_path / "stopped.interrupted" / "metrics.csv").read_text() == (
    "round,loss\n1,1\n"
  )
  assert (tmp_path / "stopped.interrupted-2" / "metrics.csv").read_text() == (
    "round,loss\n1,2\n"
  )
  assert "stopped.interrupted-2" in logged[-1]

  resumable = tmp_path / "resumable"
  (resumable / "checkpoints").mkdir(parents=True)
  (resumable / "checkpoints" / "round_3.json").write_text("{}")
  (resumable / "metrics.csv").write_text("round\n1\n2\n3\n4\n")
  assert _common.prepare_run_dir(str(resumable), logged.append)
  assert (resumable / "metrics.csv").exists()


def test_a_run_locked_by_another_process_is_waited_for_at_the_end(tmp_path):
  plan = _common.RunPlan(
    make_config(root_output_dir=str(tmp_path), experiment_name="r", rounds=3)
  )
  for name in ("a", "b", "c"):
    plan.add(name, seed=ord(name))
  runs = plan.runs()
  for run in runs:  # Every run is done: run_all reuses the reports.
    os.makedirs(run.config.experiment_dir)
    with open(os.path.join(run.config.experiment_dir, "report.json"), "w") as f:
      json.dump(
        dict(
          config=run.config.to_json_dict(), rounds_completed=3, name=run.name
        ),
        f,
      )
  logged, result = [], {}
  with _common._run_lock(runs[0], wait=False) as held:  # "Another process".
    assert held
    worker = threading.Thread(
      target=lambda: result.update(_common.run_all(runs, log=logged.append))
    )
    worker.start()
    deadline = time.monotonic() + 30
    while not any(line.startswith("waiting for a") for line in logged):
      assert time.monotonic() < deadline, logged
      time.sleep(0.01)
    assert worker.is_alive()  # Blocked on run a.
  worker.join(30)
  assert logged == [
    "[1/3] a: another process is running it; left for last",
    "[2/3] b: done before, reused",
    "[3/3] c: done before, reused",
    "waiting for a (another process)",
  ]
  assert list(result) == ["a", "b", "c"]
  assert [r["name"] for r in result.values()] == ["a", "b", "c"]


def test_settings_only_other_algorithms_read_do_not_count():
  # A report written when every run saved every algorithm's settings.
  saved = json.loads(json.dumps(make_config().to_json_dict()))
  saved.update(sparsity=0.5, prunefl_initial_rounds=50)
  fedavg = make_config(algorithm="fedavg")
  assert "prunefl_initial_rounds" not in fedavg.to_json_dict()
  assert fedavg.same_results_as(saved)
  # PruneFL reads both; with the saved values it matches, else not.
  saved["algorithm"] = "prunefl"
  prunefl = evolve_config(fedavg, algorithm="prunefl", sparsity=0.5)
  assert not prunefl.same_results_as(saved)
  assert evolve_config(prunefl, prunefl_initial_rounds=50).same_results_as(
    saved
  )
  # A setting the algorithm does not read is refused, naming its readers.
  with pytest.raises(UsageError, match="--prunefl_initial_rounds: is not a"):
    make_config(algorithm="fedavg", prunefl_initial_rounds=1)
  # Changing the algorithm carries the settings both read, no others.
  fedsgc = make_config(algorithm="fedsgc", sparsity=0.6, congruity_lambda=0)
  feddst = evolve_config(fedsgc, algorithm="feddst")
  assert feddst.settings.sparsity == 0.6
  assert "congruity_lambda" not in feddst.to_json_dict()


def test_a_finished_run_is_extended_to_more_rounds_from_its_checkpoint(
  tmp_path,
):
  config = make_config(
    algorithm="fedavg", root_output_dir=str(tmp_path), experiment_name="r"
  )
  run_dir = tmp_path / "r"
  run_dir.mkdir()
  report = dict(config=config.to_json_dict(), rounds_completed=config.rounds)
  (run_dir / _common.REPORT_JSON).write_text(json.dumps(report))
  assert _common._saved_report(_common.Run("r", config)) == report
  longer = evolve_config(config, rounds=config.rounds + 5)
  # Without a checkpoint it cannot continue: another run's directory.
  with pytest.raises(SystemExit, match="holds a run made with other settings"):
    _common._saved_report(_common.Run("r", longer))
  (run_dir / "checkpoints").mkdir()
  (run_dir / "checkpoints" / "program_state_10.json").write_text("{}")
  assert _common._saved_report(_common.Run("r", longer)) is None
  # Fewer rounds, or other settings, are still refused.
  for other in (
    evolve_config(config, rounds=config.rounds - 1),
    evolve_config(longer, seed=7),
  ):
    with pytest.raises(SystemExit, match="other settings"):
      _common._saved_report(_common.Run("r", other))


def test_a_diverging_run_is_a_result_kept_and_reused(tmp_path):
  config = make_config(
    algorithm="fedavg",
    dataset="synthetic",
    model="mlp",
    num_clients=4,
    clients_per_round=2,
    rounds=6,
    client_lr=1e12,
    checkpoint_every=1,
    progress=False,
    root_output_dir=str(tmp_path),
    experiment_name="diverges",
  )
  run = _common.Run("diverges", config)
  logged = []
  (report,) = _common.run_all([run], log=logged.append).values()
  diverged = report["diverged_at_round"]
  assert 1 <= diverged <= 6 and report["rounds_completed"] == diverged - 1
  assert f"round {diverged}: training diverged" in report["diverged"]
  assert [row["round"] for row in report["history"]] == list(range(1, diverged))
  assert report["final_metrics"] == {}
  assert any("kept as a result" in line for line in logged)
  saved = json.loads((tmp_path / "diverges" / _common.REPORT_JSON).read_text())
  assert saved["diverged_at_round"] == diverged
  # Runs are seeded: the next call reuses the result instead of rerunning.
  logged.clear()
  assert _common.run_all([run], log=logged.append)["diverges"] == saved
  assert logged == ["[1/1] diverges: done before, reused"]


def test_a_committed_run_is_restored_on_another_machine(tmp_path, monkeypatch):
  def plan(root, **changes):
    settings = dict(
      algorithm="fedavg",
      dataset="synthetic",
      model="mlp",
      num_clients=4,
      clients_per_round=2,
      rounds=3,
      eval_every=2,
      progress=False,
      root_output_dir=str(root),
      experiment_name="repro",
    )
    return _common.RunPlan(make_config(**{**settings, **changes}))

  # Run a runs for real; run b, where it runs, is finished by hand: 3
  # rounds, 100 bytes up each.
  dispatched = finish_runs_by_hand(
    monkeypatch,
    {"a"},
    lambda config: dict(
      history=[
        {"round": r, "accuracy": a, "bytes_up_cumulative": 100 * r}
        for r, a in ((1, 0.2), (2, 0.4), (3, 0.3))
      ],
      final_metrics={"accuracy": 0.3},
      best_accuracy=0.4,
      bytes_up_total=300,
    ),
  )
  first = plan(tmp_path / "first")
  first.add("a", seed=1)
  (run,) = first.runs()
  reports = _common.run_all([run], log=lambda _: None)
  assert [c.experiment_name for c in dispatched] == ["a"]
  # What a pipeline commits: results.json's records and metrics/<run>.csv.
  committed = tmp_path / "committed"
  committed.mkdir()
  (committed / "results.json").write_text(
    json.dumps({"runs": [_common.run_record(run, reports["a"])]})
  )
  (committed / "metrics").mkdir()
  (committed / "metrics" / "a.csv").write_text(
    (tmp_path / "first" / "repro" / "runs" / "a" / "metrics.csv").read_text()
  )

  elsewhere = plan(tmp_path / "second")
  elsewhere.add("a", seed=1)
  elsewhere.add("b", seed=2)  # Not committed: runs.
  logged = []
  restored = _common.run_all(
    elsewhere.runs(), log=logged.append, reuse_from=str(committed)
  )
  assert logged[0] == f"[1/2] a: restored from {committed}"
  assert logged[1] == "[2/2] b: running (fedavg, 3 rounds)"
  assert [c.experiment_name for c in dispatched] == ["a", "b"]
  original, copy = reports["a"], restored["a"]
  assert copy["rounds_completed"] == 3
  assert copy["best_accuracy"] == original["best_accuracy"]
  assert copy["final_metrics"] == original["final_metrics"]
  assert copy["bytes_down_total"] == original["bytes_down_total"]
  assert copy["algorithm"] == original["algorithm"]
  # Every measured value of every round survives; unmeasured ones are NaN.
  assert len(copy["history"]) == len(original["history"]) == 3
  for before, after in zip(original["history"], copy["history"]):
    for key, value in after.items():
      if key in before:
        assert value == pytest.approx(before[key], rel=1e-12, nan_ok=True)
      else:
        assert math.isnan(value), key
  assert [math.isnan(r["accuracy"]) for r in copy["history"]] == [
    True,
    False,
    False,
  ]
  segments = json.loads(
    (tmp_path / "second/repro/runs/a/provenance.json").read_text()
  )["segments"]
  assert [s["action"] for s in segments] == ["started", "restored"]
  # The restored run is now done here: the next call reuses it.
  logged.clear()
  _common.run_all(
    elsewhere.runs(), log=logged.append, reuse_from=str(committed)
  )
  assert logged == [
    "[1/2] a: done before, reused",
    "[2/2] b: done before, reused",
  ]

  # Each finished run left its record and rows beside the tables: a third
  # machine restores both runs from them alone (no results.json yet).
  kept = tmp_path / "second" / "repro"
  assert sorted(os.listdir(kept / "records")) == ["a.json", "b.json"]
  assert not (kept / "results.json").exists()
  third = plan(tmp_path / "third")
  third.add("a", seed=1)
  third.add("b", seed=2)
  logged.clear()
  again = _common.run_all(third.runs(), log=logged.append, reuse_from=str(kept))
  assert logged == [
    f"[1/2] a: restored from {kept}",
    f"[2/2] b: restored from {kept}",
  ]
  assert again["b"]["best_accuracy"] == restored["b"]["best_accuracy"] == 0.4
  assert [r["accuracy"] for r in again["b"]["history"]] == [0.2, 0.4, 0.3]
  assert len(dispatched) == 2  # Restored, not run.

  # Other settings, or more rounds than the record holds: not restored.
  for changes in (dict(client_lr=0.5), dict(rounds=4)):
    other = plan(
      tmp_path / f"other{len(changes)}{changes.get('rounds', 0)}", **changes
    )
    other.add("a", seed=1)
    assert not _common.restore_run(
      other.runs()[0],
      _common.committed_records(str(committed))["a"],
      str(committed),
    )
  # A record that diverged after these rounds finished them: not a result
  # of a run of this length.
  record = _common.committed_records(str(committed))["a"]
  later = dict(record, diverged_at_round=4, diverged="round 4: diverged")
  fresh = plan(tmp_path / "fourth")
  fresh.add("a", seed=1)
  assert not _common.restore_run(fresh.runs()[0], later, str(committed))
  with pytest.raises(UsageError, match="--reuse_from: .* holds no readable"):
    _common.committed_records(str(tmp_path / "nowhere"))
