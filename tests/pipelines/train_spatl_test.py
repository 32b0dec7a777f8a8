"""SPATL through `pipelines.train` (in process): its outputs, and a run
stopped after round 1 and resumed equals the uninterrupted run (each client's
predictor, control variate, agent actor and the actor's Adam state live in
the checkpointed client-state store).

Reported numbers checked against what happened: `accuracy` is the mean over
the clients' models on their own validation splits (`local_accuracy`), the
kept fractions respect the flags, and each round's upload is smaller than
the dense encoder plus Delta c it replaces.

The stopped run is `conftest.resume_from_round_1`'s; the pipeline as a
subprocess is `train_run_test.py`'s (the same `loop.run_experiment`)."""

import json

from conftest import resume_from_round_1
import numpy as np

from pipelines import _cli
from pipelines import train
from tff_hetero import models
from tff_hetero.program import outputs

_FLAGS = [
  "--algorithm=spatl",
  "--dataset=synthetic",
  "--model=small_cnn",
  "--num_clients=4",
  "--clients_per_round=2",
  "--batch_size=16",
  "--spatl_episodes=2",
  "--spatl_ppo_epochs=2",
  "--spatl_min_keep=0.25",
  "--spatl_finetune_rounds=1",
  "--noprogress",
  "--checkpoint_every=1",
  "--eval_every=1",
]


def test_spatl_run_resume_and_outputs(tmp_path):
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
  assert report["config"]["val_fraction"] == 0.2  # SPATL's default.
  assert report["algorithm"]["spatl_prunable_layers"] == ["conv1", "conv2"]
  rows = outputs.read_metrics(whole)
  assert [r["round"] for r in rows] == ["1", "2"]
  model = models.build_model("small_cnn", (8, 8, 1), 10, seed=0)
  encoder_bytes = 4 * sum(
    int(np.prod(w.shape))
    for w in model.trainable_weights
    if not w.name.startswith("logits")
  )
  for row in rows:
    assert row["accuracy"] == row["local_accuracy"]
    keep = [float(row[f"keep_{layer}"]) for layer in ("conv1", "conv2")]
    assert all(0.25 <= k <= 1.0 for k in keep)
    # Each client's saving is counted exactly (`spatl_subnetwork_test.py`);
    # under the default budget (0.7 of the prunable parameters) every
    # client drops channels, so every client saves some compute.
    saved = float(row["model_flops_saved"])
    assert 0.0 < saved <= float(row["model_flops_saved_max"]) < 1.0
    clients = int(row["clients"])
    # Down: the encoder and c_g. Up, by hand from the kept channels: per
    # channel of conv1 (3x3x1 kernel + bias) and conv2 (3x3x16 + bias),
    # float32 values of the encoder and of Delta c, and one int32 index;
    # each client's float32 weight.
    assert int(row["bytes_down"]) == clients * 2 * encoder_bytes
    kept = [round(k * out * clients) for k, out in zip(keep, (16, 32))]
    per_channel = [(9 + 1) * 4 * 2 + 4, (144 + 1) * 4 * 2 + 4]
    assert int(row["bytes_up"]) == (
      sum(n * b for n, b in zip(kept, per_channel)) + 4 * clients
    )
  assert report["bytes_up_total"] == sum(int(r["bytes_up"]) for r in rows)
  # Every client's own model was evaluated (two never trained: Eq. 4).
  clients = json.loads((whole / outputs.CLIENT_ACCURACY_JSON).read_text())
  assert clients["round"] == 2
  local = clients["groups"]["local"]
  assert len(local) == 4
  assert np.mean(list(local.values())) == float(rows[-1]["accuracy"])

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
    for key in ("bytes_up", "bytes_down", "accuracy", "keep_conv1"):
      np.testing.assert_allclose(float(x[key]), float(y[key]), atol=1e-5)


def test_local_evaluation_of_a_global_model(tmp_path):
  _cli.run_in_process(
    train.main,
    [
      "train",
      "--algorithm=fedavg",
      "--dataset=synthetic",
      "--model=mlp",
      "--num_clients=4",
      "--clients_per_round=2",
      "--rounds=1",
      "--val_fraction=0.25",
      "--local_evaluation",
      "--noprogress",
      f"--root_output_dir={tmp_path}",
      "--experiment_name=fedavg",
    ],
  )
  run = tmp_path / "fedavg"
  row = outputs.read_metrics(run)[-1]
  local = json.loads((run / outputs.CLIENT_ACCURACY_JSON).read_text())
  values = list(local["groups"]["local"].values())
  assert len(values) == 4 and all(0.0 <= v <= 1.0 for v in values)
  np.testing.assert_allclose(float(row["local_accuracy"]), np.mean(values))
  # The global model's test accuracy is a different number from its
  # clients' validation accuracies.
  assert row["accuracy"] != row["local_accuracy"]
