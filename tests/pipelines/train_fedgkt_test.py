"""FedGKT through `pipelines.train` (in process): outputs, and a run stopped
after round 1 and resumed equals the uninterrupted run (edge models, their
optimizer states and server logits live in the checkpointed client-state
store; the asynchronous mode's event simulation, the plateau schedule and the
update counter in the server state). Asynchronous, with 2 of 4 devices at
work: freed slots are refilled by seeded draws; two local epochs (each client
still sends every sample once).

The stopped run is `conftest.resume_from_round_1`'s; the pipeline as a
subprocess is `train_run_test.py`'s (the same `loop.run_experiment`).
"""

import json

from conftest import resume_from_round_1
import numpy as np

from pipelines import _cli
from pipelines import train
from tff_hetero.program import outputs

_FLAGS = [
  "--algorithm=fedgkt",
  "--dataset=synthetic",
  "--model=fedgkt_edge_resnet4",
  "--gkt_server_model=fedgkt_server_resnet7",
  "--partition=iid",
  "--num_clients=4",
  "--clients_per_round=2",
  "--batch_size=16",
  "--local_epochs=2",
  "--gkt_mode=async",
  "--noprogress",
  "--checkpoint_every=1",
  "--eval_every=1",
]


def test_fedgkt_run_resume_and_outputs(tmp_path):
  _cli.run_in_process(
    train.main,
    [
      "train",
      *_FLAGS,
      "--rounds=2",
      f"--root_output_dir={tmp_path}",
      "--experiment_name=whole",
    ],
  )
  whole = tmp_path / "whole"
  report = json.loads((whole / "report.json").read_text())
  profile = report["algorithm"]["fedgkt_models"]
  assert profile["edge_model"] == "fedgkt_edge_resnet4"
  assert profile["full_model"] == "resnet8"
  assert profile["edge_params"] < profile["full_params"]
  final = report["final_metrics"]
  assert final["accuracy"] == final["edge_server_accuracy"]
  assert 0.0 <= final["edge_accuracy"] <= 1.0
  rows = outputs.read_metrics(whole)
  assert [r["round"] for r in rows] == ["1", "2"]
  assert report["bytes_up_total"] == sum(int(r["bytes_up"]) for r in rows)
  # Features dominate the upload; the answers come down every round.
  for row in rows:
    assert float(row["feature_bytes"]) < int(row["bytes_up"])
    assert int(row["bytes_down"]) > 0

  # The same run, stopped after round 1 and resumed.
  parts = resume_from_round_1(whole, [*_FLAGS, "--rounds=2"])
  a, b = outputs.load_final_weights(whole), outputs.load_final_weights(parts)
  assert sorted(a) == sorted(b)
  for key in a:
    np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-5)
  resumed_rows = outputs.read_metrics(parts)
  assert [r["round"] for r in resumed_rows] == ["1", "2"]
  # Round 1's row is the copy; round 2 ran again from its checkpoint.
  for x, y in zip(outputs.read_metrics(whole)[1:], resumed_rows[1:]):
    for key in (
      "bytes_up",
      "bytes_down",
      "edge_server_accuracy",
      "edge_accuracy",
      "clients",
      "sim_time",
      "server_version",
      "staleness_mean",
    ):
      assert x[key] == y[key], key
