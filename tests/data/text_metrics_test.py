"""Tests of `tff_hetero.data.text_metrics` against hand-computed values.

Each binary case is worked out from its confusion matrix in the comments;
scikit-learn (and NumPy's `corrcoef`) serve as independent oracles on random
data.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tff_hetero.data import text_metrics as tm
from tff_hetero.errors import DataError

# Pairs (truth, prediction): (1,1) (1,1) (1,0) (0,1) (0,0) (0,0) (0,0) (1,0)
# -> TP = 2, FN = 2, FP = 1, TN = 3.
_TRUE = np.array([1, 1, 1, 0, 0, 0, 0, 1])
_PRED = np.array([1, 1, 0, 1, 0, 0, 0, 0])


def test_accuracy_by_hand():
  # Equal at positions 0, 1 and 3 of 5.
  assert tm.accuracy([0, 1, 1, 0, 2], [0, 1, 0, 0, 1]) == pytest.approx(0.6)
  assert tm.accuracy(_TRUE, _PRED) == pytest.approx(5 / 8)  # TP + TN.
  assert isinstance(tm.accuracy([1], [1]), float)


def test_f1_by_hand():
  # 2 TP / (2 TP + FP + FN) = 4 / (4 + 1 + 2).
  assert tm.f1_binary(_TRUE, _PRED) == pytest.approx(4 / 7)
  assert tm.f1_binary(_TRUE, _TRUE) == 1.0
  assert tm.f1_binary(_TRUE, 1 - _TRUE) == 0.0  # TP = 0.
  # No positive label and no positive prediction: 0 / 0 -> 0.0.
  assert tm.f1_binary([0, 0, 0], [0, 0, 0]) == 0.0


def test_f1_counts_class_1_as_positive():
  # Swapping the classes changes F1: TP = 3, FN = 1, FP = 2 for class 0,
  # 2 * 3 / (6 + 2 + 1) = 2 / 3.
  assert tm.f1_binary(1 - _TRUE, 1 - _PRED) == pytest.approx(2 / 3)


def test_matthews_by_hand():
  # (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))
  # = (2*3 - 1*2) / sqrt(3 * 4 * 4 * 5) = 4 / sqrt(240) = 1 / sqrt(15).
  assert tm.matthews_corrcoef(_TRUE, _PRED) == pytest.approx(1 / math.sqrt(15))
  assert tm.matthews_corrcoef(_TRUE, _TRUE) == pytest.approx(1.0)
  assert tm.matthews_corrcoef(_TRUE, 1 - _TRUE) == pytest.approx(-1.0)
  # Symmetric in its arguments: FP and FN swap, the formula does not care.
  assert tm.matthews_corrcoef(_PRED, _TRUE) == pytest.approx(1 / math.sqrt(15))


def test_matthews_is_zero_when_undefined():
  # All predictions 1: TN + FN = 0, the denominator vanishes.
  assert tm.matthews_corrcoef([0, 1, 1, 0], [1, 1, 1, 1]) == 0.0
  # All labels 0: TP + FN = 0.
  assert tm.matthews_corrcoef([0, 0, 0], [0, 1, 0]) == 0.0


def test_matthews_on_counts_whose_product_overflows_int64():
  # TP = 60,000, FN = 40,000, FP = 50,000, TN = 50,000:
  # (3e9 - 2e9) / sqrt(110,000 * 100,000 * 90,000 * 100,000); the product
  # 9.9e19 exceeds the int64 range.
  y_true = np.repeat([1, 1, 0, 0], [60_000, 40_000, 50_000, 50_000])
  y_pred = np.repeat([1, 0, 1, 0], [60_000, 40_000, 50_000, 50_000])
  expected = 1e9 / math.sqrt(110_000 * 100_000 * 90_000 * 100_000)
  assert tm.matthews_corrcoef(y_true, y_pred) == pytest.approx(expected)


def test_pearson_by_hand():
  # x = 1, 2, 3 (mean 2); y = 2, 4, 7 (mean 13/3).
  # Deviations: dx = -1, 0, 1; dy = -7/3, -1/3, 8/3.
  # sum dx dy = 7/3 + 8/3 = 5; sum dx^2 = 2; sum dy^2 = 114/9 = 38/3.
  # r = 5 / sqrt(2 * 38 / 3) = 5 sqrt(3 / 76).
  assert tm.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(
    5 * math.sqrt(3 / 76)
  )
  x = np.array([0.5, 1.5, 4.0, 2.0], np.float32)
  assert tm.pearson(x, 3 * x + 1) == pytest.approx(1.0)
  assert tm.pearson(x, -2 * x) == pytest.approx(-1.0)


def test_pearson_is_zero_for_constant_inputs():
  assert tm.pearson([1.0, 2.0, 3.0], [2.5, 2.5, 2.5]) == 0.0
  assert tm.pearson([4.0], [1.0]) == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_independent_oracles(seed):
  sklearn_metrics = pytest.importorskip("sklearn.metrics")
  rng = np.random.default_rng(seed)
  y_true = rng.integers(0, 2, size=101)
  y_pred = np.where(rng.random(101) < 0.7, y_true, 1 - y_true)
  assert tm.accuracy(y_true, y_pred) == pytest.approx(
    sklearn_metrics.accuracy_score(y_true, y_pred)
  )
  assert tm.f1_binary(y_true, y_pred) == pytest.approx(
    sklearn_metrics.f1_score(y_true, y_pred)
  )
  assert tm.matthews_corrcoef(y_true, y_pred) == pytest.approx(
    sklearn_metrics.matthews_corrcoef(y_true, y_pred)
  )
  scores = rng.normal(size=101)
  noisy = scores + rng.normal(size=101)
  assert tm.pearson(scores, noisy) == pytest.approx(
    np.corrcoef(scores, noisy)[0, 1]
  )


def test_sklearn_also_returns_zero_when_undefined():
  sklearn_metrics = pytest.importorskip("sklearn.metrics")
  assert sklearn_metrics.matthews_corrcoef([0, 1, 1, 0], [1, 1, 1, 1]) == 0.0
  assert sklearn_metrics.f1_score([0, 0, 0], [0, 0, 0], zero_division=0) == 0


def test_glue_metrics_score_the_argmax_of_logits():
  logits = np.array([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.5, 0.6]])
  labels = np.array([0, 1, 1, 1])
  # Predictions 0, 1, 0, 1: TN at 0, TP at 1 and 3, FN at 2.
  # MCC = (2*1 - 0) / sqrt(2 * 3 * 1 * 2) = 1 / sqrt(3); F1 = 4 / 5.
  assert tm.glue_metric("cola", logits, labels) == pytest.approx(
    1 / math.sqrt(3)
  )
  assert tm.glue_metric("mrpc", logits, labels) == pytest.approx(0.8)
  for task in ("qnli", "qqp", "rte", "sst2"):
    assert tm.glue_metric(task, logits, labels) == pytest.approx(0.75)
  np.testing.assert_array_equal(
    tm.glue_predictions("sst2", logits), [0, 1, 0, 1]
  )


def test_mnli_scores_three_classes():
  logits = np.array([[3.0, 1, 0], [0, 2, 1], [0, 0, 5], [1, 2, 0]])
  # Predictions 0, 1, 2, 1 against 0, 1, 2, 2: three of four right.
  assert tm.glue_metric("mnli", logits, [0, 1, 2, 2]) == pytest.approx(0.75)
  assert tm.GLUE_METRICS["mnli"].name == "matched_accuracy"


def test_stsb_scores_the_single_output():
  scores = np.array([1.0, 2.0, 3.0])
  labels = np.array([2.0, 4.0, 7.0], np.float32)
  expected = 5 * math.sqrt(3 / 76)  # As in test_pearson_by_hand.
  assert tm.glue_metric("stsb", scores, labels) == pytest.approx(expected)
  assert tm.glue_metric("stsb", scores[:, None], labels) == pytest.approx(
    expected
  )
  name, fn = tm.GLUE_METRICS["stsb"]
  assert name == "pearson"
  assert fn(scores[:, None], labels) == pytest.approx(expected)
  np.testing.assert_array_equal(
    tm.glue_predictions("stsb", scores[:, None]), scores
  )


def test_metric_names_follow_the_paper():
  names = {task: metric.name for task, metric in tm.GLUE_METRICS.items()}
  assert names == {
    "cola": "matthews_corrcoef",
    "mnli": "matched_accuracy",
    "mrpc": "f1",
    "qnli": "accuracy",
    "qqp": "accuracy",
    "rte": "accuracy",
    "sst2": "accuracy",
    "stsb": "pearson",
  }


@pytest.mark.parametrize(
  "call, match",
  [
    (lambda: tm.accuracy([0, 1], [0]), "2 labels but 1 predictions"),
    (lambda: tm.accuracy([], []), "at least one example"),
    (lambda: tm.accuracy([[0, 1]], [[0, 1]]), "1-D arrays"),
    (
      lambda: tm.f1_binary([0, 2], [0, 1]),
      re.escape("binary labels in {0, 1}, got 2"),
    ),
    (
      lambda: tm.matthews_corrcoef([0, 1], [0, -1]),
      re.escape("binary predictions in {0, 1}, got -1"),
    ),
    (lambda: tm.pearson([1.0, 2.0], [1.0]), "2 labels but 1 predictions"),
    (
      lambda: tm.glue_metric("sst-2", [[0.0, 1.0]], [1]),
      "unknown GLUE task 'sst-2'; accepted: cola, mnli, mrpc, qnli, qqp, "
      "rte, sst2, stsb",
    ),
    (
      lambda: tm.glue_metric("sst2", [0.0, 1.0], [0, 1]),
      r"shape \[n, num_classes >= 2\], got \(2,\)",
    ),
    (
      lambda: tm.glue_metric("stsb", [[0.0, 1.0]], [1.0]),
      r"shape \[n\] or \[n, 1\], got \(1, 2\)",
    ),
  ],
)
def test_bad_inputs_are_one_line_errors(call, match):
  with pytest.raises(DataError, match=match) as error:
    call()
  assert "\n" not in str(error.value)
