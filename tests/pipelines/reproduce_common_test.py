"""The reproductions' shared run bookkeeping: which saved runs are reused,
resumed, or started afresh."""

import json

from pipelines.reproduce import _common
from tff_hetero.program import ExperimentConfig


def test_saved_settings_match_unless_a_result_setting_differs():
  config = ExperimentConfig(root_output_dir="/a", rounds=10,
                            checkpoint_every=5)
  saved = json.loads(json.dumps(config.to_json_dict()))
  # Where it ran and how often it checkpointed do not change results.
  moved = ExperimentConfig(root_output_dir="/b", rounds=10,
                           checkpoint_every=1, executor="remote", workers=2)
  assert moved.same_results_as(saved)
  assert not ExperimentConfig(root_output_dir="/a", rounds=10,
                              seed=1).same_results_as(saved)
  # A setting added after the report was written matches at its default.
  del saved["gkt_temperature"]
  assert config.same_results_as(saved)
  assert not ExperimentConfig(rounds=10,
                              gkt_temperature=1.0).same_results_as(saved)
  # A checkpoint's fingerprint (a JSON string) likewise.
  fingerprint = json.loads(config.fingerprint())
  del fingerprint["augment"]
  assert moved.same_results_as(json.dumps(fingerprint))
  assert not ExperimentConfig(augment="crop").same_results_as(
      json.dumps(fingerprint))


def test_run_stopped_before_its_first_checkpoint_restarts_keeping_outputs(
    tmp_path):
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
      "round,loss\n1,1\n")
  assert (tmp_path / "stopped.interrupted-2" / "metrics.csv").read_text() == (
      "round,loss\n1,2\n")
  assert "stopped.interrupted-2" in logged[-1]

  resumable = tmp_path / "resumable"
  (resumable / "checkpoints").mkdir(parents=True)
  (resumable / "checkpoints" / "round_3.json").write_text("{}")
  (resumable / "metrics.csv").write_text("round\n1\n2\n3\n4\n")
  assert _common.prepare_run_dir(str(resumable), logged.append)
  assert (resumable / "metrics.csv").exists()
