"""`model_fns.variable_model_fn`: TFF's Keras model with `forward_pass` and
`predict_on_batch` traced into the caller's graph. The oracle is TFF's own
`from_keras_model` model (`plain_graph_methods=False`), run on the same
weights and batches; the counts are by hand."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_hetero.algorithms import model_fns

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 3], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


def _keras_model():
  return tf.keras.Sequential(
    [
      tf.keras.layers.Input([3]),
      tf.keras.layers.Dense(4, activation="relu", kernel_initializer="ones"),
      # Moving statistics: updated by a training pass, read otherwise.
      tf.keras.layers.BatchNormalization(momentum=0.5),
      tf.keras.layers.Dense(2, kernel_initializer="ones"),
    ]
  )


def _ours():
  return model_fns.variable_model_fn(_keras_model, _SPEC)()


def _tffs_model():
  return model_fns.variable_model_fn(
    _keras_model, _SPEC, plain_graph_methods=False
  )()


def _batches():
  rng = np.random.default_rng(0)
  return [
    collections.OrderedDict(
      x=tf.constant(rng.normal(size=[n, 3]), tf.float32),
      y=tf.constant(rng.integers(0, 2, size=[n]), tf.int32),
    )
    for n in (5, 2)
  ]


def _two_sgd_steps(model, autograph=True):
  """Loss per step, the weights (moving statistics included), the
  unfinalized metrics and the logits of a pass with `training=False`, after
  two SGD steps in one `tf.function`, as a client's loop takes them."""

  @tf.function(autograph=autograph)
  def train(batches):
    losses = []
    for batch in batches:
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      grads = tape.gradient(output.loss, model.trainable_variables)
      for variable, grad in zip(model.trainable_variables, grads):
        variable.assign_sub(0.1 * grad)
      losses.append(output.loss)
    return losses, model.predict_on_batch(batches[0]["x"], training=False)

  losses, logits = train(_batches())
  weights = [v.numpy() for v in model.trainable_variables]
  weights += [v.numpy() for v in model.non_trainable_variables]
  metrics = tf.nest.map_structure(
    lambda t: np.asarray(t), dict(model.report_local_unfinalized_metrics())
  )
  return [float(x) for x in losses], weights, metrics, logits.numpy()


def test_methods_are_tffs_functions_outside_and_plain_inside_a_trace():
  ours = _ours()
  tffs = _tffs_model()
  function = tf.types.experimental.GenericFunction
  assert isinstance(tffs.forward_pass, function)
  assert isinstance(tffs.predict_on_batch, function)
  assert not isinstance(ours.forward_pass, function)
  assert not isinstance(ours.predict_on_batch, function)


@pytest.mark.parametrize("autograph", [True, False])
def test_training_and_metrics_equal_tffs_own_model(autograph):
  ours = _two_sgd_steps(_ours(), autograph)
  theirs = _two_sgd_steps(_tffs_model(), autograph)
  np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6)
  assert len(ours[1]) == len(theirs[1]) == 8  # 6 trained, 2 moving stats.
  for mine, tffs in zip(ours[1], theirs[1]):
    np.testing.assert_allclose(mine, tffs, rtol=1e-6)
  # The moving mean moved from its initial zeros: the updates ran.
  assert np.any(ours[1][6] != 0.0)
  assert ours[2].keys() == theirs[2].keys()
  for name in theirs[2]:
    np.testing.assert_allclose(ours[2][name], theirs[2][name])
  # Seven examples in two batches, counted once each.
  np.testing.assert_array_equal(ours[2]["num_examples"], [7])
  np.testing.assert_array_equal(ours[2]["num_batches"], [2])
  np.testing.assert_allclose(ours[3], theirs[3], rtol=1e-6)


def test_a_tf1_graph_runs_the_metric_updates_of_a_fetched_loss():
  """Outside any traced function the model calls TFF's `tf.function`, whose
  call op runs the updates a session would otherwise prune."""
  with tf.Graph().as_default():
    model = _ours()
    loss = model.forward_pass(_batches()[0], training=True).loss
    metrics = model.report_local_unfinalized_metrics()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(tf.compat.v1.variables_initializer(model.local_variables))
      session.run(loss)
      counted = session.run(metrics["num_examples"])
  np.testing.assert_array_equal(counted, [5])


def test_a_traced_step_calls_no_nested_function():
  model = _ours()

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


def test_a_model_without_tffs_private_attributes_is_refused():
  # Another TFF version's model, say: a clear error, not an AttributeError.
  class _OtherModel:
    forward_pass = predict_on_batch = None

  with pytest.raises(RuntimeError, match="plain_graph_methods=False"):
    model_fns._plain_graph_methods(_OtherModel())  # pylint: disable=protected-access
