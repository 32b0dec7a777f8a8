"""Split learning: the cut changes nothing in the mathematics (two clients'
turns equal plain SGD on the whole model over their batches in turn, with
one gradient tape), the bytes of the exchange by hand, and bad flags."""

import numpy as np
import pytest
import tensorflow as tf

from tff_hetero import data as data_lib
from tff_hetero import models
from tff_hetero.algorithms import api
from tff_hetero.algorithms import split_learning
from tff_hetero.errors import UsageError
from tff_hetero.program import loop
from tff_hetero.program import make_config

SHAPE, CLASSES, LR = (8, 8, 1), 10, 0.1


def _task():
  return api.Task(
    model_name="fedgkt_edge_resnet4",
    model_fn=lambda: models.build_model(
      "fedgkt_edge_resnet4", SHAPE, CLASSES, 0
    ),
    input_shape=SHAPE,
    num_classes=CLASSES,
    element_spec=None,
    training_flops_per_example=1,
  )


def _client(cid, n, seed, nan=False):
  rng = np.random.default_rng(seed)
  x = rng.uniform(0, 1, (n,) + SHAPE).astype(np.float32)
  arrays = data_lib.ArrayDataset(
    x=np.full_like(x, np.nan) if nan else x,
    y=rng.integers(0, CLASSES, n).astype(np.int32),
  )
  dataset = data_lib.make_client_dataset(
    arrays, batch_size=8, local_epochs=1, shuffle_seed=seed
  )
  return api.ClientRound(client_id=cid, dataset=dataset, num_examples=n)


@pytest.fixture(scope="module")
def algorithm():
  """Split learning of fedgkt_edge_resnet4 and fedgkt_server_resnet7,
  built (and its computations traced) once for the tests that run it: its
  state is explicit."""
  return split_learning.SplitLearning.of_registry(
    _task(), "fedgkt_server_resnet7", client_lr=LR
  )


@pytest.mark.slow
def test_two_turns_equal_sgd_on_the_whole_model(tff_context, algorithm):
  del tff_context
  clients = [_client("a", 20, 1), _client("b", 12, 2)]
  output = algorithm.next(algorithm.initialize(), 1, clients)

  # Reference: the composed model, one tape over it, SGD, batch by batch.
  model = algorithm.composed_fn()
  algorithm.model_weights(algorithm.initialize()).assign_weights_to(model)
  for client in clients:
    for batch in client.dataset:
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(
          tf.keras.losses.sparse_categorical_crossentropy(
            batch["y"], model(batch["x"], training=True), from_logits=True
          )
        )
      grads = tape.gradient(loss, model.trainable_variables)
      for v, g in zip(model.trainable_variables, grads):
        v.assign_sub(LR * g)
  weights = algorithm.model_weights(output.state)
  for ours, reference in zip(weights.trainable, model.trainable_weights):
    np.testing.assert_allclose(ours, reference.numpy(), atol=2e-5)
  for ours, reference in zip(
    weights.non_trainable, model.non_trainable_weights
  ):
    np.testing.assert_allclose(ours, reference.numpy(), atol=2e-5)

  # Bytes by hand: per sample, 8x8x16 float32 activations and an int32
  # label up, their gradient down; per turn, the extractor's weights (3x3x1
  # x16 kernel, BN gamma, beta, mean, variance: 208 floats) down and up.
  activation = 8 * 8 * 16 * 4
  extractor = (9 * 16 + 4 * 16) * 4
  for traffic, n in zip(output.traffic, (20, 12)):
    assert traffic.bytes_up == n * (activation + 4) + extractor
    assert traffic.bytes_down == n * activation + extractor
    assert traffic.examples == n
  assert output.metrics["activation_bytes"] == 32 * (activation + 4)
  assert output.metrics["gradient_bytes"] == 32 * activation


def test_a_turn_that_is_not_finite_is_undone(tff_context, algorithm):
  del tff_context
  a, c = _client("a", 12, 1), _client("c", 8, 3)
  with_b = algorithm.next(
    algorithm.initialize(), 1, [a, _client("b", 8, 2, nan=True), c]
  )
  without_b = algorithm.next(algorithm.initialize(), 1, [a, c])
  assert with_b.metrics["non_finite_updates"] == 1.0
  assert without_b.metrics["non_finite_updates"] == 0.0
  # b's turn undone: c trains on what a left, as if b had not come.
  assert with_b.metrics["loss"] == without_b.metrics["loss"]
  for x, y in zip(
    tf.nest.flatten(with_b.state), tf.nest.flatten(without_b.state)
  ):
    np.testing.assert_array_equal(x, y)
  # b's exchange happened: its traffic is charged.
  assert [t.client_id for t in with_b.traffic] == ["a", "b", "c"]
  assert with_b.traffic[1].bytes_up > 0


def test_bad_flags_name_the_flag():
  for changes, flag in (
    (dict(model="resnet20"), "--model"),
    (dict(gkt_server_model="resnet56"), "--gkt_server_model"),
  ):
    settings = dict(
      algorithm="split_learning",
      dataset="synthetic",
      model="fedgkt_edge_resnet4",
      gkt_server_model="fedgkt_server_resnet7",
    )
    settings.update(changes)
    with pytest.raises(UsageError, match=flag):
      loop.build_experiment(make_config(**settings))
