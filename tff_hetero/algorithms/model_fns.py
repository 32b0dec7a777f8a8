"""From a Keras model factory to the TFF model the builders train.

Every public builder takes a no-arg Keras factory, the spec of one batch of
client data, and optionally a loss and metrics factory, as
`tff.learning.models.from_keras_model` does; `variable_model_fn` makes TFF's
no-arg `VariableModel` builder from them. The defaults are the loss and
metric of every registered model: cross-entropy on logits against integer
labels, and accuracy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff


def default_loss_fn() -> tf.keras.losses.Loss:
  """The classification loss of every registered model: cross-entropy on
  logits against integer labels."""
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def default_metrics_fn() -> list[tf.keras.metrics.Metric]:
  """Accuracy against integer labels (`sparse_categorical_accuracy`)."""
  return [tf.keras.metrics.SparseCategoricalAccuracy()]


def variable_model_fn(
  keras_model_fn: Callable[[], tf.keras.Model],
  input_spec: Any,
  loss_fn=None,
  metrics_fn=None,
):
  """A no-arg function building the `tff.learning.models.VariableModel` of
  `keras_model_fn()` (TFF's `from_keras_model`), with `loss_fn()` (default
  `default_loss_fn`) and `metrics_fn()` (default `default_metrics_fn`)."""
  if not callable(keras_model_fn):
    raise TypeError(
      "model_fn must be a no-arg callable returning a"
      f" tf.keras.Model, got {type(keras_model_fn).__name__}"
    )
  if input_spec is None:
    raise TypeError(
      "input_spec is required: the spec of one batch of client"
      " data, e.g. OrderedDict(x=TensorSpec, y=TensorSpec)"
    )
  loss_fn = loss_fn or default_loss_fn
  metrics_fn = metrics_fn or default_metrics_fn

  def model_fn():
    return tff.learning.models.from_keras_model(
      keras_model_fn(),
      loss=loss_fn(),
      input_spec=input_spec,
      metrics=metrics_fn(),
    )

  return model_fn
