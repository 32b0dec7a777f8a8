"""`build_fedgkt_process` on a user's own Keras edge and server models.

Known answers: after a round, every answer the server sends client k for
its sample i is the new server model applied, in inference mode, to the
features client k's new edge model extracts from sample i, computed here
with Keras from the weights the process returns; the bytes each way by hand
from the shapes (answers down, features + logits + labels + metric sums
up). The client and server steps themselves are checked by hand in
`fedgkt_test.py`.
"""

import collections

from conftest import GKT_TOY_CLASSES
from conftest import GKT_TOY_FEATURES
from conftest import GKT_TOY_SHAPE
from conftest import gkt_toy_arrays
from conftest import gkt_toy_edge_model
from conftest import gkt_toy_server_model
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms.fedgkt import build_fedgkt_process
from tff_hetero.errors import ModelError
from tff_hetero.errors import UsageError

SHAPE, CLASSES, FEATURES = GKT_TOY_SHAPE, GKT_TOY_CLASSES, GKT_TOY_FEATURES
edge_model, server_model = gkt_toy_edge_model, gkt_toy_server_model
_arrays = gkt_toy_arrays


def _process(**changes):
  options = dict(
    split_layer="cut",
    client_ids=("a", "b", "c"),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_adam(0.01),
    batch_size=4,
    local_epochs=1,
    server_epochs=2,
    seed=0,
  )
  options.update(changes)
  return build_fedgkt_process(edge_model, server_model, **options)


@pytest.fixture(scope="module")
def process(tff_context):
  del tff_context
  return _process()


def test_type_signatures(process):
  comps = process.computations
  assert list(comps) == ["client_step", "server_step", "round"]
  round_type = comps["round"].type_signature
  placements = [p.placement for p in round_type.parameter]
  assert placements == [tff.SERVER] * 3 + [tff.CLIENTS] * 3
  assert all(r.placement is tff.SERVER for r in round_type.result)
  upload = comps["client_step"].type_signature.result[1].upload
  assert list(upload.features.shape) == [None, *FEATURES]
  assert list(upload.logits.shape) == [None, CLASSES]


def _composed(edge_weights, server_weights):
  """Keras: the answer logits of images (edge up to the cut, then the
  server model, inference mode) at the given weights."""
  edge, server = edge_model(), server_model()
  tff.learning.models.ModelWeights(*edge_weights).assign_weights_to(edge)
  server_weights.assign_weights_to(server)
  cut = tf.keras.Model(edge.input, edge.get_layer("cut").output)
  return lambda x: server(cut(x, training=False), training=False).numpy()


def test_answers_are_the_new_server_model_on_each_clients_features(process):
  state = process.initialize()
  data = {"a": _arrays(5, 1), "c": _arrays(7, 2)}
  output = process.next(state, data)
  server = process.get_model_weights(output.state)
  for client_id, arrays in data.items():
    edge = process.client_state(output.state, client_id)
    expected = _composed((edge.trainable, edge.non_trainable), server)(arrays.x)
    np.testing.assert_allclose(
      edge.server_logits, expected, rtol=1e-4, atol=1e-5
    )
    assert int(edge.logits_version) == 1
  # Client b was not sampled: it keeps the initial state, and only the
  # sampled clients' models are evaluated (the initial edge model before).
  assert process.client_state(output.state, "b") is state.clients[1]
  assert list(process.evaluation_models(output.state)) == [
    "edge_server/a",
    "edge_server/c",
    "edge/a",
    "edge/c",
  ]
  assert list(process.evaluation_models(state)) == [
    "edge_server/initial",
    "edge/initial",
  ]
  # Bytes by hand: down, the answers (n x 3 float32); up, features
  # (n x 6 x 6 x 2 float32), logits (n x 3 float32), labels (n int32) and
  # the client's metric sums.
  sums = 5 * 4  # loss, ce, kd, correct, examples: float32 each.
  for traffic, n in zip(output.clients, (5, 7)):
    assert traffic.bytes_down == n * CLASSES * 4
    assert traffic.bytes_up == n * (72 * 4 + CLASSES * 4 + 4) + sums
    assert traffic.examples == n
  assert output.metrics["bytes_up"] == sum(t.bytes_up for t in output.clients)


def test_the_next_round_trains_with_the_answers_and_learns(process):
  data = {c: _arrays(12, seed) for c, seed in zip("abc", (3, 4, 5))}
  state = process.initialize()
  for _ in range(5):
    state = process.next(state, data).state
  test = _arrays(60, 9)
  correct = []
  for name, (model_fn, weights) in process.evaluation_models(state).items():
    model = model_fn()
    weights.assign_weights_to(model)
    predicted = np.argmax(model(test.x, training=False).numpy(), axis=1)
    correct.append((name, float(np.mean(predicted == test.y))))
  names = [n for n, _ in correct]
  assert names == [f"edge_server/{c}" for c in "abc"] + [
    f"edge/{c}" for c in "abc"
  ]
  # Three classes: chance is 1/3.
  assert min(a for _, a in correct) > 0.8, correct


class _NoLearningRate(tff.learning.optimizers.Optimizer):
  """An optimizer whose state has no learning rate (a plain step of 1)."""

  def initialize(self, specs):
    return collections.OrderedDict()

  def next(self, state, weights, gradients):
    return state, tf.nest.map_structure(lambda w, g: w - g, weights, gradients)


@pytest.mark.parametrize(
  "changes, error, match",
  [
    (dict(split_layer="nope"), ValueError, "split_layer 'nope' is not a"),
    (dict(client_ids="abc"), TypeError, "client_ids must be a sequence"),
    (dict(client_ids=("a", "a")), ValueError, "distinct"),
    (dict(batch_size=0), ValueError, "batch_size must be an integer"),
    (
      dict(client_optimizer_fn=tf.keras.optimizers.SGD()),
      TypeError,
      "client_optimizer_fn",
    ),
    (
      dict(server_optimizer_fn=_NoLearningRate()),
      TypeError,
      "no learning_rate",
    ),
    (dict(temperature=0.0), UsageError, "--gkt_temperature"),
  ],
)
def test_bad_arguments_are_refused_in_one_line(changes, error, match):
  with pytest.raises(error, match=match) as caught:
    _process(**changes)
  assert "\n" not in str(caught.value)


def test_bad_cohorts_are_refused(process):
  state = process.initialize()
  with pytest.raises(KeyError, match="not among the client ids"):
    process.next(state, {"z": _arrays(2, 0)})
  with pytest.raises(TypeError, match="must map client ids"):
    process.next(state, [_arrays(2, 0)])
  with pytest.raises(TypeError, match="ArrayDataset or an"):
    process.next(state, {"a": tf.data.Dataset.range(3)})
  with pytest.raises(ValueError, match="at least one client"):
    process.next(state, collections.OrderedDict())


def test_a_server_model_of_other_classes_is_refused():
  def four_classes():
    features = tf.keras.Input(FEATURES)
    return tf.keras.Model(
      features, tf.keras.layers.Dense(4)(tf.keras.layers.Flatten()(features))
    )

  with pytest.raises(ModelError, match="outputs 4 classes") as caught:
    build_fedgkt_process(
      edge_model,
      four_classes,
      split_layer="cut",
      client_ids=("a",),
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer_fn=tff.learning.optimizers.build_adam(0.01),
      batch_size=4,
    )
  assert "\n" not in str(caught.value)
