"""`build_split_learning_process` on a user's own Keras edge and server models.

Known answer: with one batch per client (batch size above its samples, one
local epoch), a round of clients a then b is two SGD steps on the composed
model (the edge model up to its "cut" layer, then the server model), a's
batch then b's, computed here with one Keras `GradientTape` over the
composed model; the batch's mean loss does not depend on the order of its
samples, so the process's shuffle does not matter. Bytes by hand: the
extractor's 20 weights each way per turn, and per sample the activations
(6 x 6 x 2 float32) up with the label and their gradients down.
"""

from conftest import GKT_TOY_CLASSES
from conftest import gkt_toy_arrays
from conftest import gkt_toy_edge_model
from conftest import gkt_toy_server_model
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms.split_learning import build_split_learning_process

LR = 0.1


@pytest.fixture(scope="module")
def process(tff_context):
  del tff_context
  return build_split_learning_process(
    gkt_toy_edge_model,
    gkt_toy_server_model,
    split_layer="cut",
    client_ids=("a", "b"),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
    batch_size=64,
  )


def _composed():
  edge, server = gkt_toy_edge_model(), gkt_toy_server_model()
  image = tf.keras.Input(edge.input_shape[1:])
  cut = tf.keras.Model(edge.input, edge.get_layer("cut").output)
  return tf.keras.Model(image, server(cut(image)))


def test_a_round_is_sgd_on_the_composed_model_turn_after_turn(process):
  assert list(process.computations) == ["turn"]
  data = {"a": gkt_toy_arrays(9, 1), "b": gkt_toy_arrays(5, 2)}
  output = process.next(process.initialize(), data)

  model = _composed()
  for arrays in data.values():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(
          arrays.y, model(arrays.x, training=True), from_logits=True
        )
      )
    gradients = tape.gradient(loss, model.trainable_variables)
    for variable, gradient in zip(model.trainable_variables, gradients):
      variable.assign_sub(LR * gradient)

  weights = process.get_model_weights(output.state)
  for got, want in zip(weights.trainable, model.trainable_weights):
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
  # Batch norm's moving statistics, updated by the two training batches.
  for got, want in zip(weights.non_trainable, model.non_trainable_weights):
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
  name, (model_fn, evaluated) = next(
    iter(process.evaluation_models(output.state).items())
  )
  assert name == "full_model"
  evaluated.assign_weights_to(model_fn())

  extractor_bytes = (3 * 3 * 1 * 2 + 2) * 4
  for traffic, n in zip(output.clients, (9, 5)):
    assert traffic.client_id == "ab"[(9, 5).index(n)]
    assert traffic.bytes_down == extractor_bytes + n * 72 * 4
    assert traffic.bytes_up == extractor_bytes + n * (72 * 4 + 4)
    assert traffic.examples == n
  assert output.metrics["clients"] == 2
  assert 0.0 < output.metrics["loss"] < 2 * np.log(GKT_TOY_CLASSES)


def test_bad_arguments_are_refused_in_one_line(tff_context):
  del tff_context
  with pytest.raises(ValueError, match="split_layer 'x' is not") as caught:
    build_split_learning_process(
      gkt_toy_edge_model,
      gkt_toy_server_model,
      split_layer="x",
      client_ids=("a",),
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
      batch_size=4,
    )
  assert "\n" not in str(caught.value)
  with pytest.raises(TypeError, match="server_model_fn must return"):
    build_split_learning_process(
      gkt_toy_edge_model,
      lambda: "not a model",
      split_layer="cut",
      client_ids=("a",),
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
      batch_size=4,
    )
