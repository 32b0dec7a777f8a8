"""Central evaluation of model weights on held-out test data (Keras, in the driver)."""

from __future__ import annotations

import collections
from collections.abc import Callable

import numpy as np
import tensorflow as tf


class CentralEvaluator:
  """Evaluates `tff.learning.models.ModelWeights` on one test set.

  The Keras model is built once; each call assigns the weights and runs
  `evaluate`, returning `OrderedDict(accuracy=, loss=)`.
  """

  def __init__(self, model_fn: Callable[[], tf.keras.Model], x: np.ndarray,
               y: np.ndarray, batch_size: int = 500):
    self._model = model_fn()
    self._model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
    self._x = x
    self._y = y
    self._batch_size = batch_size

  def __call__(self, model_weights) -> collections.OrderedDict:
    model_weights.assign_weights_to(self._model)
    loss, accuracy = self._model.evaluate(
        self._x, self._y, batch_size=self._batch_size, verbose=0)
    return collections.OrderedDict(accuracy=float(accuracy), loss=float(loss))
