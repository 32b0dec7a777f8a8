"""NumPy metrics of the GLUE tasks, as InclusiveFL (Liu et al., 2022) reports.

Per-example metrics on 1-D arrays, arguments in scikit-learn's order
(truth first):

* `accuracy(y_true, y_pred)` -- the fraction of equal entries.
* `f1_binary(y_true, y_pred)` -- F1 of the positive class 1:
  2 TP / (2 TP + FP + FN); 0.0 when there is neither a positive label nor a
  positive prediction (TP + FP + FN = 0), as scikit-learn's `f1_score` does.
* `matthews_corrcoef(y_true, y_pred)` -- binary Matthews correlation
  (TP TN - FP FN) / sqrt((TP + FP) (TP + FN) (TN + FP) (TN + FN)); 0.0 when
  a factor of the denominator is 0 (all labels or all predictions one class),
  as scikit-learn does.
* `pearson(y_true, y_score)` -- the Pearson correlation coefficient,
  computed in float64; 0.0 when either input is constant (undefined, no
  linear relation to measure; scipy would return nan).

Binary metrics take labels in {0, 1}. Every metric raises a one-line
`DataError` for inputs that are not 1-D, differ in length or are empty.
Non-finite scores make `pearson` nan.

`GLUE_METRICS` maps each GLUE task (the names of `tff_hetero.data.glue`) to a
`GlueMetric`: the metric's name and a function of (model outputs, labels)
-- note the order, outputs first. For the classification tasks the outputs
are logits (or probabilities) of shape [n, num_classes] and the prediction
is their argmax; for STS-B they are the regression scores, shape [n] or
[n, 1]. The metric per task follows the paper (Table 2 and "Evaluation
Protocols"):

=====  ==================  =====================================
task   metric name         function
=====  ==================  =====================================
cola   matthews_corrcoef   `matthews_corrcoef` of the argmax
mnli   matched_accuracy    `accuracy` of the argmax (on the
                           ``validation_matched`` split)
mrpc   f1                  `f1_binary` of the argmax (1 =
                           equivalent)
qnli   accuracy            `accuracy` of the argmax
qqp    accuracy            `accuracy` of the argmax
rte    accuracy            `accuracy` of the argmax
sst2   accuracy            `accuracy` of the argmax
stsb   pearson             `pearson` of the single output
=====  ==================  =====================================

`glue_metric(task, outputs, labels)` computes a task's metric;
`glue_predictions(task, outputs)` gives the predictions it scores.

Imports only NumPy and the standard library (no TensorFlow); tensors with
``__array__`` (eager TensorFlow tensors) are accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from tff_hetero.errors import DataError

__all__ = [
  "GLUE_METRICS",
  "GlueMetric",
  "accuracy",
  "f1_binary",
  "glue_metric",
  "glue_predictions",
  "matthews_corrcoef",
  "pearson",
]


def _pair(
  metric: str, y_true: object, y_pred: object
) -> tuple[np.ndarray, np.ndarray]:
  """Both inputs as 1-D arrays of the same, non-zero length."""
  y_true = np.asarray(y_true)
  y_pred = np.asarray(y_pred)
  if y_true.ndim != 1 or y_pred.ndim != 1:
    raise DataError(
      f"{metric} needs 1-D arrays, got shapes {y_true.shape} and {y_pred.shape}"
    )
  if len(y_true) != len(y_pred):
    raise DataError(
      f"{metric} got {len(y_true)} labels but {len(y_pred)} predictions"
    )
  if not len(y_true):
    raise DataError(f"{metric} needs at least one example, got none")
  return y_true, y_pred


def _binary(metric: str, name: str, values: np.ndarray) -> np.ndarray:
  """`values` as a bool array if every entry is 0 or 1."""
  outside = values[(values != 0) & (values != 1)]
  if len(outside):
    raise DataError(
      f"{metric} needs binary {name} in {{0, 1}}, got {outside[0].item()!r}"
    )
  return values == 1


def _confusion(
  metric: str, y_true: object, y_pred: object
) -> tuple[int, int, int, int]:
  """(TP, TN, FP, FN) of binary labels and predictions, positive class 1."""
  y_true, y_pred = _pair(metric, y_true, y_pred)
  truth = _binary(metric, "labels", y_true)
  predicted = _binary(metric, "predictions", y_pred)
  tp = int(np.sum(truth & predicted))
  tn = int(np.sum(~truth & ~predicted))
  fp = int(np.sum(~truth & predicted))
  fn = int(np.sum(truth & ~predicted))
  return tp, tn, fp, fn


def accuracy(y_true: object, y_pred: object) -> float:
  """The fraction of examples whose prediction equals the label."""
  y_true, y_pred = _pair("accuracy", y_true, y_pred)
  return float(np.mean(y_true == y_pred))


def f1_binary(y_true: object, y_pred: object) -> float:
  """F1 of the positive class 1; 0.0 if there are no positives at all."""
  tp, _, fp, fn = _confusion("f1_binary", y_true, y_pred)
  denominator = 2 * tp + fp + fn
  return 2 * tp / denominator if denominator else 0.0


def matthews_corrcoef(y_true: object, y_pred: object) -> float:
  """Binary Matthews correlation in [-1, 1]; 0.0 when undefined."""
  tp, tn, fp, fn = _confusion("matthews_corrcoef", y_true, y_pred)
  # Python integers: the product of four counts overflows no fixed width.
  product = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
  if not product:
    return 0.0
  return float((tp * tn - fp * fn) / np.sqrt(float(product)))


def pearson(y_true: object, y_score: object) -> float:
  """Pearson correlation of labels and scores; 0.0 if either is constant."""
  y_true, y_score = _pair("pearson", y_true, y_score)
  x = y_true.astype(np.float64) - np.mean(y_true, dtype=np.float64)
  y = y_score.astype(np.float64) - np.mean(y_score, dtype=np.float64)
  denominator = np.sqrt(np.sum(x * x) * np.sum(y * y))
  if denominator == 0:
    return 0.0
  # Rounding can push |r| a hair past 1 for perfectly (anti)correlated data.
  return float(np.clip(np.sum(x * y) / denominator, -1.0, 1.0))


class GlueMetric(NamedTuple):
  """A GLUE task's metric: its name and fn(outputs, labels) -> float."""

  name: str
  fn: Callable[[object, object], float]


def _class_predictions(outputs: object) -> np.ndarray:
  """The argmax class of [n, num_classes] logits or probabilities."""
  outputs = np.asarray(outputs)
  if outputs.ndim != 2 or outputs.shape[1] < 2:
    raise DataError(
      f"classification outputs must have shape [n, num_classes >= 2], got "
      f"{outputs.shape}"
    )
  return np.argmax(outputs, axis=-1)


def _regression_predictions(outputs: object) -> np.ndarray:
  """The scores of regression outputs of shape [n] or [n, 1]."""
  outputs = np.asarray(outputs)
  if outputs.ndim == 2 and outputs.shape[1] == 1:
    outputs = outputs[:, 0]
  if outputs.ndim != 1:
    raise DataError(
      f"regression outputs must have shape [n] or [n, 1], got {outputs.shape}"
    )
  return outputs


def _on_classes(metric: Callable[[object, object], float]):
  """fn(logits, labels) scoring the argmax of the logits with `metric`."""
  return lambda outputs, labels: metric(labels, _class_predictions(outputs))


def _on_scores(metric: Callable[[object, object], float]):
  """fn(scores, labels) scoring the regression outputs with `metric`."""
  return lambda outputs, labels: metric(
    labels, _regression_predictions(outputs)
  )


_REGRESSION_TASKS = frozenset({"stsb"})

GLUE_METRICS: Mapping[str, GlueMetric] = MappingProxyType(
  {
    "cola": GlueMetric("matthews_corrcoef", _on_classes(matthews_corrcoef)),
    "mnli": GlueMetric("matched_accuracy", _on_classes(accuracy)),
    "mrpc": GlueMetric("f1", _on_classes(f1_binary)),
    "qnli": GlueMetric("accuracy", _on_classes(accuracy)),
    "qqp": GlueMetric("accuracy", _on_classes(accuracy)),
    "rte": GlueMetric("accuracy", _on_classes(accuracy)),
    "sst2": GlueMetric("accuracy", _on_classes(accuracy)),
    "stsb": GlueMetric("pearson", _on_scores(pearson)),
  }
)
"""GLUE task -> `GlueMetric(name, fn(outputs, labels))`; see the module doc."""


def _metric(task: object) -> GlueMetric:
  if not isinstance(task, str) or task not in GLUE_METRICS:
    raise DataError(
      f"unknown GLUE task {task!r}; accepted: {', '.join(sorted(GLUE_METRICS))}"
    )
  return GLUE_METRICS[task]


def glue_predictions(task: str, outputs: object) -> np.ndarray:
  """What `task`'s metric scores: argmax classes, or the STS-B scores.

  Args:
    task: a key of `GLUE_METRICS`.
    outputs: model outputs, [n, num_classes] logits (or probabilities) for
      the classification tasks, [n] or [n, 1] scores for ``stsb``.

  Returns:
    An [n] array: integer classes, or the scores.

  Raises:
    DataError: unknown `task` or outputs of the wrong shape.
  """
  _metric(task)
  if task in _REGRESSION_TASKS:
    return _regression_predictions(outputs)
  return _class_predictions(outputs)


def glue_metric(task: str, outputs: object, labels: object) -> float:
  """`task`'s GLUE metric of model `outputs` against `labels`.

  Args:
    task: a key of `GLUE_METRICS`.
    outputs: model outputs, as for `glue_predictions`.
    labels: the [n] labels (class ids, or STS-B similarity scores).

  Returns:
    The metric named by ``GLUE_METRICS[task].name`` (higher is better).

  Raises:
    DataError: unknown `task`, or outputs and labels that do not fit.
  """
  return float(_metric(task).fn(outputs, labels))
