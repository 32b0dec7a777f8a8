"""`python -m pipelines.train` on GLUE, in process, from real TFDS files.

The data are a tiny GLUE prepared by TFDS's own builder
(`tests/data/glue_fixture.py`): SST-2 and a generated MRPC. InclusiveFL
runs one round without `--model` (its default `transformer` is built as the
text transformer) and its metrics.csv must hold MRPC's F1 for every
evaluated model, the deepest's equal to F1 recomputed with scikit-learn from
the saved final weights on the validation split.
"""

import json
import math
import os

from data import glue_fixture
import numpy as np
import pytest

from pipelines import _cli
from pipelines import train
from tff_hetero.data import glue
from tff_hetero.models import transformer
from tff_hetero.program import outputs

_TINY = [
  "--inclusivefl_depths=1:1:2",
  "--rounds=1",
  "--num_clients=4",
  "--clients_per_round=4",
  "--partition=iid",
  "--min_samples_per_client=2",
  "--batch_size=4",
  "--noprogress",
]


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds")
  glue_fixture.prepare_glue(
    root,
    tmp_path_factory.mktemp("glue_sources"),
    ("sst2", "mrpc"),
    mrpc=glue_fixture.mrpc_rows(40, 12),
  )
  return root


def _run(flags):
  _cli.run_in_process(train.main, ["train", *flags])


def test_inclusivefl_on_mrpc_reports_f1_of_the_saved_model(tfds_dir, tmp_path):
  _run(
    [
      "--algorithm=inclusivefl",
      "--dataset=glue_mrpc",
      f"--data_dir={tfds_dir}",
      f"--root_output_dir={tmp_path}",
      "--experiment_name=mrpc",
      *_TINY,
    ]
  )
  run_dir = tmp_path / "mrpc"
  (row,) = outputs.read_metrics(run_dir)
  # Every evaluated model (L2 unprefixed, L1) and their mean.
  for column in ("f1", "L1_f1", "avg_f1", "accuracy", "L1_accuracy"):
    assert 0.0 <= float(row[column]) <= 1.0, column
  assert float(row["avg_f1"]) == pytest.approx(
    (float(row["f1"]) + float(row["L1_f1"])) / 2
  )

  # The deepest model (2 blocks), rebuilt from the saved weights without the
  # registry and scored with scikit-learn on MRPC's validation split.
  from sklearn import metrics  # pylint: disable=g-import-not-at-top

  splits = glue.load_glue("mrpc", os.fspath(tfds_dir))
  assert len(splits.test) == 12
  model = transformer.text_transformer(
    splits.seq_len, splits.vocab_size, 2, seed=0, depth=2
  )
  saved = outputs.load_final_weights(run_dir)
  assert len(saved) == len(model.weights)
  model.set_weights([saved[f"trainable_{i}"] for i in range(len(saved))])
  predicted = np.argmax(model(splits.test.x, training=False), axis=-1)
  expected_f1 = metrics.f1_score(splits.test.y, predicted, zero_division=0.0)
  assert float(row["f1"]) == pytest.approx(expected_f1, abs=1e-12)
  assert float(row["accuracy"]) == pytest.approx(
    metrics.accuracy_score(splits.test.y, predicted), abs=1e-12
  )

  report = json.loads((run_dir / "report.json").read_text())
  assert report["config"]["model"] == "transformer"  # As given (default).
  assert report["glue"] == {
    "task": "mrpc",
    "metric": "f1",
    "test_split": "validation",
    "seq_len": 64,
    "vocab_size": splits.vocab_size,
    "model": "text_transformer",
  }
  final = report["final_metrics"]
  assert final["f1"] == pytest.approx(expected_f1, abs=1e-12)
  assert {"L1_f1", "avg_f1"} <= set(final)
  assert report["history"][0]["f1"] == final["f1"]


def test_text_transformer_on_sst2_reports_accuracy(tfds_dir, tmp_path):
  _run(
    [
      "--algorithm=inclusivefl",
      "--model=text_transformer",
      "--dataset=glue_sst2",
      f"--data_dir={tfds_dir}",
      f"--root_output_dir={tmp_path}",
      "--experiment_name=sst2",
      "--inclusivefl_depths=0:0:1",
      *_TINY[1:],
      "--num_clients=2",
      "--clients_per_round=2",
      "--min_samples_per_client=1",
    ]
  )
  (row,) = outputs.read_metrics(tmp_path / "sst2")
  # SST-2's metric is accuracy: no column besides it; 2 validation examples.
  assert float(row["accuracy"]) in (0.0, 0.5, 1.0)
  assert not any(k.endswith(("f1", "matthews_corrcoef")) for k in row)
  report = json.loads((tmp_path / "sst2" / "report.json").read_text())
  assert report["glue"]["metric"] == "accuracy"
  assert math.isfinite(report["final_metrics"]["test_loss"])


@pytest.mark.parametrize(
  "flags, expected",
  [
    (["--dataset=glue_stsb"], "--dataset: glue_stsb (GLUE STS-B) is a"),
    (["--dataset=glue_mrpc", "--augment=crop"], "--augment: --dataset="),
    (["--dataset=glue_mrpc", "--model=depth_cnn"], "--model: depth_cnn takes"),
    (
      ["--dataset=mnist5k", "--model=text_transformer"],
      "--model: text_transformer takes token ids (text), but --dataset=mnist5k",
    ),
  ],
)
def test_text_misuse_exits_2_with_one_line(flags, expected, tmp_path, capsys):
  argv = [
    "--algorithm=inclusivefl",
    f"--data_dir={tmp_path / 'no_tfds_here'}",
    f"--root_output_dir={tmp_path}",
    *flags,
  ]
  with pytest.raises(SystemExit) as exit_info:
    _run(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert err[0].startswith(f"error: {expected}")
