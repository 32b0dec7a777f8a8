"""Central evaluation of model weights on held-out test data (Keras, in the driver).

`CentralEvaluator` reports each model's `accuracy` and `loss` on the whole
test split and, given a task metric (`TaskMetric`, e.g. a GLUE task's F1 or
Matthews correlation, `tff_hetero.data.text_metrics.glue_metric`), that
metric of the model's outputs on the whole test split too, under its name.

Keras gets the examples as a batched `tf.data.Dataset` (slices and batch
only), never as NumPy arrays: Keras's array adapter builds new `Dataset.map`
functions at every `evaluate` or `predict` call, and each keeps native memory
for the rest of the process (about 0.5 MiB a call, TensorFlow 2.14: +143 MiB
over 280 `evaluate` calls of 1,000 MNIST-sized examples, flat with a dataset).
A run evaluating every few rounds, AdaptiveFL's three sub-models each time,
grew by that much. The batches are the same, so the numbers are too.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import NamedTuple
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_hetero.data.options import without_autotune


class TaskMetric(NamedTuple):
  """A metric of a whole test split: its name and fn(outputs, labels).

  `fn` gets the model's outputs (logits, [n, num_classes]) on every test
  example and the [n] labels, and returns a float (higher is better).
  """

  name: str
  fn: Callable[[np.ndarray, np.ndarray], float]


def _swapped_to_v1(model: tf.keras.Model) -> bool:
  """Whether Keras has since switched this model's classes to graph mode.

  Keras 2 picks a layer's base class (eager v2 or graph v1) when a layer is
  created and rewrites the class's `__bases__` in place: building a Keras
  model inside a `tf.Graph` (as every TFF computation over a Keras model
  does) turns every existing instance of those classes into a v1 object
  whose `evaluate` fails. A fresh eager build swaps them back.
  """
  return any(c.__module__.endswith("training_v1") for c in type(model).__mro__)


class CentralEvaluator:
  """Evaluates `tff.learning.models.ModelWeights` on one test set.

  Each Keras model is built once (the default one and one per other
  `model_fn` it is given, e.g. each sub-model level); each call assigns the
  weights and runs `evaluate`, returning `OrderedDict(accuracy=, loss=)`.

  With a `metric`, each call instead computes the model's logits on the
  whole test split once (`predict`, in batches) and returns
  `OrderedDict(accuracy=, loss=, <metric.name>=)`: accuracy the fraction of
  examples whose argmax is the label, loss the mean sparse cross-entropy of
  the logits, and the metric `metric.fn(logits, y)`. (A metric named
  ``accuracy`` is computed and its value kept under that name.)
  """

  def __init__(
    self,
    model_fn: Callable[[], tf.keras.Model],
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = 500,
    metric: Optional[TaskMetric] = None,
  ):
    self._default_fn = model_fn
    self._models = {}
    self._x = x
    self._y = y
    self._batch_size = batch_size
    self.metric = metric
    self._test_batches = None

  def _model(self, model_fn) -> tf.keras.Model:
    model_fn = model_fn or self._default_fn
    if model_fn not in self._models or _swapped_to_v1(self._models[model_fn]):
      model = model_fn()
      model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
      )
      self._models[model_fn] = model
    return self._models[model_fn]

  def __call__(
    self,
    model_weights,
    model_fn: Optional[Callable[[], tf.keras.Model]] = None,
    data=None,
  ) -> collections.OrderedDict:
    """Metrics of `model_weights` on the test split, or on `data` (`(x, y)`
    arrays, e.g. a client's validation split) when given."""
    model = self._model(model_fn)
    model_weights.assign_weights_to(model)
    if data is None:
      if self._test_batches is None:
        self._test_batches = self._batched(self._x, self._y)
      x, y, batches = self._x, self._y, self._test_batches
    else:
      x, y = data
      batches = self._batched(x, y)
    if self.metric is not None:
      return self._with_metric(model, batches, y)
    loss, accuracy = model.evaluate(batches, verbose=0)
    return collections.OrderedDict(accuracy=float(accuracy), loss=float(loss))

  def _batched(self, x, y) -> tf.data.Dataset:
    """`(x, y)` in batches, in order (module docstring: not arrays)."""
    return without_autotune(
      tf.data.Dataset.from_tensor_slices((x, y)).batch(self._batch_size)
    )

  def _with_metric(
    self, model: tf.keras.Model, batches: tf.data.Dataset, y
  ) -> collections.OrderedDict:
    """Accuracy, loss and the task metric from one pass of `predict`."""
    logits = np.asarray(model.predict(batches, verbose=0))
    labels = np.asarray(y)
    losses = tf.keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True
    )
    result = collections.OrderedDict(
      accuracy=float(np.mean(np.argmax(logits, axis=-1) == labels)),
      loss=float(np.mean(np.asarray(losses, np.float64))),
    )
    result[self.metric.name] = float(self.metric.fn(logits, labels))
    return result
