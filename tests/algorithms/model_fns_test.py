"""`model_fns.variable_model_fn`: TFF's Keras model with `forward_pass` and
`predict_on_batch` traced into the caller's graph. The oracle is TFF's own
`from_keras_model` model, run on the same weights and batches."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms import model_fns

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 3], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


def _keras_model():
  return tf.keras.Sequential(
    [
      tf.keras.layers.Input([3]),
      tf.keras.layers.Dense(4, activation="relu", kernel_initializer="ones"),
      tf.keras.layers.Dense(2, kernel_initializer="ones"),
    ]
  )


def _tffs_model():
  return tff.learning.models.from_keras_model(
    _keras_model(),
    loss=model_fns.default_loss_fn(),
    input_spec=_SPEC,
    metrics=model_fns.default_metrics_fn(),
  )


def _batches():
  rng = np.random.default_rng(0)
  return [
    collections.OrderedDict(
      x=tf.constant(rng.normal(size=[n, 3]), tf.float32),
      y=tf.constant(rng.integers(0, 2, size=[n]), tf.int32),
    )
    for n in (5, 2)
  ]


def _two_sgd_steps(model):
  """Loss per step, the trained weights and the unfinalized metrics of two
  SGD steps in one `tf.function`, as a client's loop takes them."""

  @tf.function
  def train(batches):
    losses = []
    for batch in batches:
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      grads = tape.gradient(output.loss, model.trainable_variables)
      for variable, grad in zip(model.trainable_variables, grads):
        variable.assign_sub(0.1 * grad)
      losses.append(output.loss)
    return losses

  losses = [float(x) for x in train(_batches())]
  weights = [v.numpy() for v in model.trainable_variables]
  metrics = tf.nest.map_structure(
    lambda t: np.asarray(t), dict(model.report_local_unfinalized_metrics())
  )
  return losses, weights, metrics


def test_methods_are_not_tf_functions():
  ours = model_fns.variable_model_fn(_keras_model, _SPEC)()
  tffs = _tffs_model()
  function = tf.types.experimental.GenericFunction
  assert isinstance(tffs.forward_pass, function)
  assert isinstance(tffs.predict_on_batch, function)
  assert not isinstance(ours.forward_pass, function)
  assert not isinstance(ours.predict_on_batch, function)


def test_training_and_metrics_equal_tffs_own_model():
  ours_losses, ours_weights, ours_metrics = _two_sgd_steps(
    model_fns.variable_model_fn(_keras_model, _SPEC)()
  )
  tff_losses, tff_weights, tff_metrics = _two_sgd_steps(_tffs_model())
  np.testing.assert_allclose(ours_losses, tff_losses, rtol=1e-6)
  for ours, theirs in zip(ours_weights, tff_weights):
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
  assert ours_metrics.keys() == tff_metrics.keys()
  for name in tff_metrics:
    np.testing.assert_allclose(ours_metrics[name], tff_metrics[name])
  # Seven examples in two batches, counted once each.
  np.testing.assert_array_equal(ours_metrics["num_examples"], [7])
  np.testing.assert_array_equal(ours_metrics["num_batches"], [2])


def test_a_traced_step_calls_no_nested_function():
  model = model_fns.variable_model_fn(_keras_model, _SPEC)()

  @tf.function
  def step(batch):
    with tf.GradientTape() as tape:
      loss = model.forward_pass(batch, training=True).loss
    return tape.gradient(loss, model.trainable_variables)

  graph = step.get_concrete_function(
    collections.OrderedDict(x=_SPEC["x"], y=_SPEC["y"])
  ).graph
  ops = {op.type for op in graph.get_operations()}
  assert "MatMul" in ops  # The model's layers are in the step's own graph.
  assert not ops & {"PartitionedCall", "StatefulPartitionedCall"}
