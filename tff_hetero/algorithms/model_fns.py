"""From a Keras model factory to the TFF model the builders train.

Every public builder takes a no-arg Keras factory, the spec of one batch of
client data, and optionally a loss and metrics factory, as
`tff.learning.models.from_keras_model` does; `variable_model_fn` makes TFF's
no-arg `VariableModel` builder from them. The defaults are the loss and
metric of every registered model: cross-entropy on logits against integer
labels, and accuracy.

One departure from `from_keras_model`'s model: its `forward_pass` and
`predict_on_batch` are `tf.function`s, so a client step that takes a
gradient through `forward_pass` inside a traced loop crosses two nested
function boundaries, and TensorFlow captures every forward intermediate
across each to build the backward function: for InclusiveFL's 12-block
transformer a sixth of the client work's tracing (docs/performance.md,
"Cold start: tracing, and Grappler once"). Inside a function being traced
(`tf.inside_function()`: a `tf.function`, a loop body, a dataset
function), `variable_model_fn`'s models run the two methods as plain
functions instead, converted by AutoGraph as the `tf.function`s converted
them (`_plain_graph_methods`): the same ops, traced into the caller's graph,
where automatic control dependencies (or a function body's stateful ops)
run the metric updates. Elsewhere (eagerly, or in a TF1 `tf.Graph`, where
an unfetched update would not run) they call TFF's `tf.function`s as they
are. `plain_graph_methods=False` gives TFF's model unchanged (the
baselines of `tools/bench.py` and the TFF oracles of the tests). This reads
two private attributes of TFF 0.87's Keras model (`_forward_pass`,
`_keras_model`), the version `threaded_executor.check_tff_version` pins.
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
  *,
  plain_graph_methods: bool = True,
):
  """A no-arg function building the `tff.learning.models.VariableModel` of
  `keras_model_fn()` (TFF's `from_keras_model`), with `loss_fn()` (default
  `default_loss_fn`) and `metrics_fn()` (default `default_metrics_fn`); its
  `forward_pass` and `predict_on_batch` traced into the caller's graph
  unless `plain_graph_methods` is False (module docstring)."""
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
    model = tff.learning.models.from_keras_model(
      keras_model_fn(),
      loss=loss_fn(),
      input_spec=input_spec,
      metrics=metrics_fn(),
    )
    return _plain_graph_methods(model) if plain_graph_methods else model

  return model_fn


def _plain_graph_methods(model: tff.learning.models.VariableModel):
  """`model` with `forward_pass` and `predict_on_batch` run as
  AutoGraph-converted plain functions inside a traced function, and as
  TFF's `tf.function`s elsewhere (module docstring).

  Raises:
    RuntimeError: `model` lacks the private attributes of TFF 0.87's Keras
      model this reads (another TFF version).
  """
  if not (
    hasattr(model, "_keras_model") and hasattr(type(model), "_forward_pass")
  ):
    raise RuntimeError(
      "model_fns reads _keras_model and _forward_pass of TFF 0.87's Keras"
      f" model; {type(model).__name__} has not both: build it with"
      " plain_graph_methods=False or install tensorflow-federated 0.87.0"
    )
  keras_model = model._keras_model  # pylint: disable=protected-access
  forward_pass = type(model)._forward_pass  # pylint: disable=protected-access
  tffs_forward_pass = model.forward_pass
  tffs_predict_on_batch = model.predict_on_batch

  def plain_predict_on_batch(x, training=True):
    return keras_model(x, training=training)

  def plain_forward_pass(batch_input, training=True):
    return forward_pass(model, batch_input, training=training)

  plain_predict_on_batch = tf.autograph.to_graph(plain_predict_on_batch)
  plain_forward_pass = tf.autograph.to_graph(plain_forward_pass)

  def dispatch_predict_on_batch(x, training=True):
    if tf.inside_function():
      return plain_predict_on_batch(x, training=training)
    return tffs_predict_on_batch(x, training=training)

  def dispatch_forward_pass(batch_input, training=True):
    if tf.inside_function():
      return plain_forward_pass(batch_input, training=training)
    return tffs_forward_pass(batch_input, training=training)

  model.predict_on_batch = dispatch_predict_on_batch
  model.forward_pass = dispatch_forward_pass
  return model
