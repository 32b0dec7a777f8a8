"""Central evaluation: the numbers Keras's own `evaluate` gives on the arrays,
and accuracy and loss computed by hand from the model's logits."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tff_hetero.program import evaluation


def _model() -> tf.keras.Model:
  return tf.keras.Sequential(
    [
      tf.keras.Input((3,)),
      tf.keras.layers.Dense(
        4, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1)
      ),
    ]
  )


def _weights(seed: int) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  return [
    rng.normal(size=(3, 4)).astype(np.float32),
    rng.normal(size=4).astype(np.float32),
  ]


class _Weights:
  def __init__(self, arrays):
    self.arrays = arrays

  def assign_weights_to(self, model):
    model.set_weights(self.arrays)


def _by_hand(weights, x, y):
  logits = x @ weights[0] + weights[1]
  shifted = logits - logits.max(axis=1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
  return (
    float(np.mean(np.argmax(logits, axis=1) == y)),
    float(-np.mean(log_probs[np.arange(len(y)), y])),
  )


def test_accuracy_and_loss_of_the_test_split_and_of_given_data(monkeypatch):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(23, 3)).astype(np.float32)  # 3 batches: 10, 10, 3.
  y = rng.integers(0, 4, 23).astype(np.int32)
  evaluator = evaluation.CentralEvaluator(_model, x, y, batch_size=10)
  # Keras gets datasets, never arrays (its array adapter leaks memory).
  given = []
  keras_evaluate = tf.keras.Model.evaluate

  def evaluate(model, data=None, *args, **kwargs):
    given.append(type(data))
    return keras_evaluate(model, data, *args, **kwargs)

  monkeypatch.setattr(tf.keras.Model, "evaluate", evaluate)
  oracle = _model()
  oracle.compile(
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
  )
  for seed in (1, 2):  # The same model, new weights each call.
    weights = _weights(seed)
    result = evaluator(_Weights(weights))
    accuracy, loss = _by_hand(weights, x, y)
    assert abs(result["accuracy"] - accuracy) < 1e-6  # float32 count / n
    assert abs(result["loss"] - loss) < 1e-6
    oracle.set_weights(weights)
    keras_loss, keras_accuracy = oracle.evaluate(x, y, batch_size=10, verbose=0)
    assert (result["loss"], result["accuracy"]) == (keras_loss, keras_accuracy)
  assert all(issubclass(t, tf.data.Dataset) for t in given[::2]), given
  # Given data (a client's split) instead of the test split.
  mine = evaluator(_Weights(weights), data=(x[:7], y[:7]))
  assert abs(mine["accuracy"] - _by_hand(weights, x[:7], y[:7])[0]) < 1e-6


def test_a_task_metric_is_computed_on_all_logits_in_order():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(23, 3)).astype(np.float32)
  y = rng.integers(0, 4, 23).astype(np.int32)
  seen = {}

  def metric(logits, labels):
    seen["logits"], seen["labels"] = logits, labels
    return 0.5

  evaluator = evaluation.CentralEvaluator(
    _model, x, y, batch_size=10, metric=evaluation.TaskMetric("m", metric)
  )
  weights = _weights(3)
  result = evaluator(_Weights(weights))
  np.testing.assert_allclose(
    seen["logits"], x @ weights[0] + weights[1], rtol=1e-5, atol=1e-6
  )
  np.testing.assert_array_equal(seen["labels"], y)
  accuracy, loss = _by_hand(weights, x, y)
  assert result["accuracy"] == accuracy and result["m"] == 0.5
  assert abs(result["loss"] - loss) < 1e-6
