"""Central evaluation of model weights on held-out test data (Keras, in the driver)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Optional

import numpy as np
import tensorflow as tf


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
  """

  def __init__(
    self,
    model_fn: Callable[[], tf.keras.Model],
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = 500,
  ):
    self._default_fn = model_fn
    self._models = {}
    self._x = x
    self._y = y
    self._batch_size = batch_size

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
    self, model_weights, model_fn: Optional[Callable[[], tf.keras.Model]] = None
  ) -> collections.OrderedDict:
    model = self._model(model_fn)
    model_weights.assign_weights_to(model)
    loss, accuracy = model.evaluate(
      self._x, self._y, batch_size=self._batch_size, verbose=0
    )
    return collections.OrderedDict(accuracy=float(accuracy), loss=float(loss))
