"""Width-heterogeneous algorithms through `pipelines.train` (in process).

AdaptiveFL end to end (outputs, per-level metrics), and a run stopped after
round 1 and resumed equals the uninterrupted run: the RL tables and the
sampling RNG live in the checkpoint.

The stopped run is `conftest.resume_from_round_1`'s; the pipeline as a
subprocess is `train_run_test.py`'s (the same `loop.run_experiment`).
"""

import json

from conftest import resume_from_round_1
import numpy as np
import pytest

from pipelines import _cli
from pipelines import train
from tff_hetero.program import outputs

_FLAGS = [
  "--algorithm=adaptivefl",
  "--dataset=synthetic",
  "--model=small_cnn",
  "--num_clients=8",
  "--clients_per_round=4",
  "--batch_size=10",
  "--client_lr=0.1",
  "--noprogress",
  "--checkpoint_every=1",
  "--pool_ratios=0.5:0.25",
  "--pool_start_indices=1",
  # Every device holds exactly S1: small_cnn on 8x8x1 with conv2 at
  # floor(32 x 0.25) = 8 channels: 160 + (144*8 + 8) + (32*10 + 10).
  "--tier_capacities=1650:1650:1650",
]
_S1_PARAMS = 160 + 1160 + 330


def test_adaptivefl_run_resume_and_outputs(tmp_path):
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
  final = report["final_metrics"]
  assert final["avg_accuracy"] == np.mean(
    [final["accuracy"], final["M1_accuracy"], final["S1_accuracy"]]
  )
  # The full model's accuracy, recomputed by Keras from the saved weights.
  from tff_hetero import data  # pylint: disable=g-import-not-at-top
  from tff_hetero import models  # pylint: disable=g-import-not-at-top

  splits = data.load_dataset("synthetic", seed=0)
  model = models.build_model(
    "small_cnn", splits.input_shape, splits.num_classes, seed=0
  )
  saved = outputs.load_final_weights(whole)
  model.set_weights(
    [saved[f"trainable_{i}"] for i in range(len(model.trainable_weights))]
  )
  predicted = np.argmax(model(splits.test.x, training=False), axis=-1)
  assert final["accuracy"] == pytest.approx(
    np.mean(predicted == splits.test.y), abs=1e-6
  )
  rows = outputs.read_metrics(whole)
  assert [r["round"] for r in rows] == ["1", "2"]
  for row in rows:
    # Each of the 4 clients returns S1 (4 bytes a parameter).
    assert float(row["returned_model_bytes"]) == 4 * 4 * _S1_PARAMS
    assert float(row["waste_rate"]) == pytest.approx(
      1 - 4 * 4 * _S1_PARAMS / float(row["sent_model_bytes"])
    )
    assert int(row["clients"]) == 4
  assert report["bytes_up_total"] == sum(int(r["bytes_up"]) for r in rows)

  # The same run, stopped after round 1 and resumed.
  parts = resume_from_round_1(whole, [*_FLAGS, "--rounds=2"])
  a, b = outputs.load_final_weights(whole), outputs.load_final_weights(parts)
  assert sorted(a) == sorted(b)
  for key in a:
    np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-6)
  resumed_rows = outputs.read_metrics(parts)
  assert [r["round"] for r in resumed_rows] == ["1", "2"]
  # Round 1's row is the copy; round 2 ran again from its checkpoint.
  for x, y in zip(outputs.read_metrics(whole)[1:], resumed_rows[1:]):
    for key in ("accuracy", "bytes_up", "bytes_down", "waste_rate", "pruned"):
      assert x[key] == y[key], key
