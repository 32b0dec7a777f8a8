"""The program on text data: model choice, input checks, dtypes, GLUE metrics.

No TFDS here: the GLUE splits are built by hand (`GlueSplits` of token ids);
`tests/pipelines/train_glue_test.py` runs the pipeline on real TFDS files.
"""

import collections

from conftest import assert_one_line_error
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import models
from tff_hetero.algorithms import api
from tff_hetero.data import glue
from tff_hetero.data import load_dataset
from tff_hetero.data import text_metrics
from tff_hetero.errors import UsageError
from tff_hetero.program import evaluation
from tff_hetero.program import loop
from tff_hetero.program import make_config
from tff_hetero.program import validate_config

_VOCABULARY = ("", "[UNK]", "[SEP]", "good", "bad", "film", "plot", "dull")


def _mrpc_like(n_train=12, n_test=6, seq_len=8, seed=0) -> glue.GlueSplits:
  rng = np.random.default_rng(seed)

  def split(n):
    return glue.TextArrayDataset(
      x=rng.integers(0, len(_VOCABULARY), (n, seq_len)).astype(np.int32),
      y=(np.arange(n) % 2).astype(np.int32),
    )

  return glue.GlueSplits(
    name="glue_mrpc",
    task="mrpc",
    train=split(n_train),
    test=split(n_test),
    test_split="validation",
    num_classes=2,
    metric="f1",
    vocabulary=_VOCABULARY,
    seq_len=seq_len,
  )


def _usage_error(settings, *needles):
  return assert_one_line_error(
    UsageError, lambda: validate_config(make_config(**settings)), *needles
  )


def test_inclusivefls_default_model_becomes_the_text_transformer_on_glue():
  config = validate_config(
    make_config(algorithm="inclusivefl", dataset="glue_mrpc")
  )
  assert config.model == "transformer"  # The name given stays in the config.
  assert loop.resolve_model("transformer", "glue_mrpc", True) == (
    "text_transformer"
  )
  assert loop.resolve_model("transformer", "mnist5k", False) == "transformer"
  assert (
    loop.resolve_model("text_transformer", "glue_sst2", True)
    == "text_transformer"
  )
  validate_config(make_config(dataset="glue_sst2", model="text_transformer"))


def test_image_models_on_text_and_token_models_on_images_are_errors():
  _usage_error(
    dict(dataset="glue_sst2", model="mnist_cnn"),
    "--model: mnist_cnn takes images",
    "--dataset=glue_sst2 holds token ids",
    "--model=text_transformer",
  )
  _usage_error(
    dict(dataset="glue_cola", model="mlp"), "--model: mlp", "--dataset="
  )
  _usage_error(
    dict(dataset="mnist5k", model="text_transformer"),
    "--model: text_transformer takes token ids",
    "--dataset=mnist5k holds images",
  )


@pytest.mark.parametrize("augment", ["crop", "crop_flip"])
def test_text_takes_no_augmentation(augment):
  _usage_error(
    dict(dataset="glue_mrpc", model="text_transformer", augment=augment),
    f"--augment: --dataset=glue_mrpc holds token ids (text), which take no"
    f" augmentation; got --augment={augment}, use --augment=none",
  )


def test_stsb_is_a_one_line_error_saying_it_is_unsupported():
  message = _usage_error(
    dict(algorithm="inclusivefl", dataset="glue_stsb"),
    "--dataset: glue_stsb",
    "regression task",
    "does not support",
  )
  assert message.count("glue_") >= 8  # It lists the tasks that work.


def test_unknown_dataset_keeps_listing_the_accepted_names():
  message = _usage_error(dict(dataset="glue_wnli"), "--dataset")
  assert "accepted:" in message and "glue_mrpc" in message
  assert "mnist5k" in message


def test_build_task_takes_dtypes_and_vocabulary_from_the_splits():
  splits = _mrpc_like()
  config = make_config(algorithm="inclusivefl", dataset="glue_mrpc", seed=3)
  task = loop.build_task(config, splits)
  assert task.model_name == "text_transformer"
  assert task.element_spec["x"] == tf.TensorSpec([None, 8], tf.int32)
  assert task.element_spec["y"] == tf.TensorSpec([None], tf.int32)
  assert task.input_shape == (8,) and task.num_classes == 2
  assert task.depths == (4, 8, 12)
  model = task.model_fn()
  assert models.depth_of(model) == 12
  assert model.get_layer("token_embed").input_dim == len(_VOCABULARY)
  shallow = task.depth_model_fn(2)
  assert models.depth_of(shallow) == 2
  assert shallow.get_layer("token_embed").input_dim == len(_VOCABULARY)
  expected = models.build_model(
    "text_transformer", (8,), 2, seed=3, depth=2, vocab_size=len(_VOCABULARY)
  )
  for a, b in zip(shallow.get_weights(), expected.get_weights()):
    np.testing.assert_array_equal(a, b)
  assert [u.name for u in task.width_units] == ["hidden", "mlp"]
  narrow = task.width_model_fn((32, 64))
  assert narrow.get_layer("token_embed").get_weights()[0].shape == (8, 32)


def test_build_task_keeps_float_images():
  splits = load_dataset("synthetic", seed=0)
  task = loop.build_task(make_config(model="mlp"), splits)
  assert task.element_spec["x"] == tf.TensorSpec([None, 8, 8, 1], tf.float32)
  assert task.model_name == "mlp"


def test_build_task_rejects_a_model_of_the_other_kind():
  assert_one_line_error(
    UsageError,
    lambda: loop.build_task(
      make_config(dataset="glue_mrpc", model="small_cnn"), _mrpc_like()
    ),
    "--model: small_cnn takes images",
    "--dataset=glue_mrpc",
  )
  assert_one_line_error(
    UsageError,
    lambda: loop.build_task(
      make_config(model="text_transformer"), load_dataset("synthetic")
    ),
    "--model: text_transformer takes token ids",
    "--dataset=synthetic holds images",
  )


def test_task_metric_is_the_glue_tasks():
  metric = loop.task_metric(_mrpc_like())
  assert metric.name == "f1"
  logits = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0]])
  labels = np.array([1, 1, 0])
  assert metric.fn(logits, labels) == text_metrics.f1_binary(labels, [1, 0, 1])
  assert loop.task_metric(load_dataset("synthetic")) is None


def test_evaluator_reports_the_metric_of_the_whole_test_split():
  splits = _mrpc_like(n_test=23)

  def model_fn():
    return models.build_model(
      "text_transformer", (8,), 2, seed=1, depth=1, vocab_size=8
    )

  weights = tff.learning.models.ModelWeights.from_model(model_fn())
  plain = evaluation.CentralEvaluator(
    model_fn, splits.test.x, splits.test.y, batch_size=5
  )
  with_metric = evaluation.CentralEvaluator(
    model_fn,
    splits.test.x,
    splits.test.y,
    batch_size=5,
    metric=loop.task_metric(splits),
  )
  expected = plain(weights)
  got = with_metric(weights)
  assert list(got) == ["accuracy", "loss", "f1"]
  assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
  assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
  model = model_fn()
  weights.assign_weights_to(model)
  predicted = np.argmax(model(splits.test.x).numpy(), axis=-1)
  truth = splits.test.y
  tp = int(np.sum((predicted == 1) & (truth == 1)))
  wrong = int(np.sum(predicted != truth))
  assert got["f1"] == pytest.approx(2 * tp / (2 * tp + wrong))


class _FakeEvaluator:
  """Returns fixed results per model_fn; has a metric like the real one."""

  def __init__(self, metric_name, results):
    self.metric = evaluation.TaskMetric(metric_name, None)
    self._results = results

  def __call__(self, weights, model_fn):
    del weights
    return self._results[model_fn]


def _result(accuracy, loss, **metric):
  return collections.OrderedDict(accuracy=accuracy, loss=loss, **metric)


def test_every_evaluated_model_gets_the_metric_column():
  evaluator = _FakeEvaluator(
    "f1",
    {
      "L12": _result(0.5, 1.0, f1=0.25),
      "L8": _result(0.4, 2.0, f1=0.5),
      "L4": _result(0.3, 3.0, f1=0.0),
    },
  )
  evaluated = collections.OrderedDict(
    (name, api.EvaluationModel(None, model_fn=name))
    for name in ("L12", "L8", "L4")
  )
  row = loop._evaluate(evaluator, evaluated)
  assert list(row) == [
    *("accuracy", "test_loss", "f1"),
    *("L8_accuracy", "L8_test_loss", "L8_f1"),
    *("L4_accuracy", "L4_test_loss", "L4_f1"),
    *("avg_accuracy", "avg_f1"),
  ]
  assert row["f1"] == 0.25 and row["L8_f1"] == 0.5 and row["L4_f1"] == 0.0
  assert row["avg_f1"] == pytest.approx(0.25)
  assert row["avg_accuracy"] == pytest.approx(0.4)


def test_grouped_models_report_the_mean_metric():
  evaluator = _FakeEvaluator(
    "matthews_corrcoef",
    {
      "a": _result(0.5, 1.0, matthews_corrcoef=0.2),
      "b": _result(0.7, 3.0, matthews_corrcoef=0.4),
    },
  )
  evaluated = collections.OrderedDict(
    (name, api.EvaluationModel(None, model_fn=name, group="local"))
    for name in ("a", "b")
  )
  row = loop._evaluate(evaluator, evaluated)
  assert list(row)[:3] == ["accuracy", "test_loss", "matthews_corrcoef"]
  assert row["matthews_corrcoef"] == row["local_matthews_corrcoef"]
  assert row["local_matthews_corrcoef"] == pytest.approx(0.3)
  assert row["accuracy"] == pytest.approx(0.6)


def test_a_metric_that_is_accuracy_adds_no_column():
  evaluator = _FakeEvaluator(
    "accuracy",
    {"L2": _result(0.5, 1.0), "L1": _result(0.25, 2.0)},
  )
  evaluated = collections.OrderedDict(
    (name, api.EvaluationModel(None, model_fn=name)) for name in ("L2", "L1")
  )
  row = loop._evaluate(evaluator, evaluated)
  assert list(row) == [
    *("accuracy", "test_loss", "L1_accuracy", "L1_test_loss", "avg_accuracy"),
  ]
