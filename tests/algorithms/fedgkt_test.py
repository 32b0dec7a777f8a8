"""FedGKT: the distillation loss by hand, the typed computations' signatures,
the client step against a reference computation, and rounds whose server
logits must reach the right samples (sync and async), the transfer ablation
and what is measured."""

import collections

import attrs
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import data as data_lib
from tff_hetero.algorithms import api
from tff_hetero.algorithms import fedgkt
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms.distillation import soft_label_kl
from tff_hetero.models import fedgkt as gkt_models
from tff_hetero.program import ExperimentConfig
from tff_hetero.program import loop

CLASSES = 10


def test_soft_label_kl_by_hand():
  teacher = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]], np.float32)
  student = np.array([[0.0, 1.0, 0.0], [1.0, -1.0, 0.0]], np.float32)
  t = 2.0
  p = np.exp(teacher / t) / np.exp(teacher / t).sum(1, keepdims=True)
  q = np.exp(student / t) / np.exp(student / t).sum(1, keepdims=True)
  expected = t * t * np.mean(np.sum(p * np.log(p / q), axis=1))
  np.testing.assert_allclose(soft_label_kl(teacher, student, t), expected,
                             rtol=1e-5)
  assert float(soft_label_kl(student, student, 3.0)) == pytest.approx(0.0,
                                                                      abs=1e-6)


def _config(**overrides):
  settings = dict(
      algorithm="fedgkt", dataset="synthetic", model="fedgkt_edge_resnet4",
      gkt_server_model="fedgkt_server_resnet19", partition="iid",
      num_clients=4, clients_per_round=2, rounds=2, batch_size=16,
      client_lr=0.05, seed=0, progress=False, checkpoint_every=10**6,
      gkt_server_epochs=1)
  settings.update(overrides)
  return ExperimentConfig(**settings)


@pytest.fixture(scope="module")
def experiment():
  return loop.build_experiment(_config())


def _clients(experiment, algorithm, ids, stored, seed=0):
  fed = experiment.federated_data
  out = []
  for i, cid in enumerate(ids):
    arrays = fed.client_train(cid)
    out.append(api.ClientRound(
        client_id=cid, num_examples=len(arrays),
        dataset=algorithm.client_dataset(arrays, batch_size=16,
                                         local_epochs=1,
                                         shuffle_seed=seed + i),
        state=stored.get(cid, algorithm.initial_client_state())))
  return out


def test_type_signatures(experiment):
  comps = experiment.algorithm.computations
  client = comps.client_round.type_signature
  assert [p.placement for p in client.parameter] == [tff.CLIENTS] * 2
  edges, uploads, traffic, sums = client.result
  assert [edges.placement, uploads.placement, traffic.placement,
          sums.placement] == [tff.CLIENTS, tff.CLIENTS, tff.CLIENTS,
                              tff.SERVER]
  features = uploads.member.features
  assert features.shape == (None, 8, 8, gkt_models.FEATURE_CHANNELS)
  assert uploads.member.logits.shape == (None, CLASSES)
  # The server logits a client holds have a row per sample, any number.
  assert client.parameter[0].member.server_logits.shape == (None, CLASSES)
  server = comps.server_round.type_signature
  assert all(p.placement == tff.SERVER for p in server.parameter)
  assert server.result.placement == tff.SERVER
  # The received features, logits and labels and the sample order.
  assert server.parameter[2].member.features.shape == (
      None, 8, 8, gkt_models.FEATURE_CHANNELS)
  assert server.parameter[3].member.shape == (None,)
  logits = comps.server_logits.type_signature
  assert logits.result.placement == tff.SERVER
  assert logits.result.member.shape == (None, CLASSES)


def _edge_and_data(experiment, seed=0):
  arrays = experiment.federated_data.client_train(
      experiment.federated_data.client_ids[0])
  dataset = data_lib.make_indexed_client_dataset(
      arrays, batch_size=16, local_epochs=1, shuffle_seed=seed)
  return arrays, dataset


@pytest.mark.parametrize("with_server_logits", [False, True])
def test_edge_update_against_a_reference(experiment, with_server_logits):
  # Learning rate 0: the weights stay, so every training batch's logits are
  # the initial model's (batch-norm in training mode: batch statistics).
  algorithm = experiment.algorithm
  arrays, dataset = _edge_and_data(experiment)
  n = len(arrays)
  rng = np.random.default_rng(1)
  server_logits = (rng.normal(size=(n, CLASSES)).astype(np.float32)
                   if with_server_logits else
                   np.zeros((0, CLASSES), np.float32))
  update = fedgkt.build_edge_update(
      algorithm.edge_fn, algorithm.split_layer,
      learning_process.client_sgd(0.0),
      algorithm.settings)
  initial = algorithm.initial_client_state()
  weights, upload, traffic, sums = update(
      fedgkt.EdgeState(initial.trainable, initial.non_trainable,
                       server_logits), dataset)

  reference = algorithm.edge_fn()
  ce_sum = kd_sum = 0.0
  for batch in dataset:
    if not bool(batch["train"]):
      continue
    logits = reference(batch["x"], training=True)
    m = len(batch["y"])
    ce_sum += m * float(tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(
            batch["y"], logits, from_logits=True)))
    if with_server_logits:
      kd_sum += m * float(soft_label_kl(
          server_logits[batch["index"].numpy()], logits,
          algorithm.settings.temperature))
  assert float(sums["examples"]) == n
  np.testing.assert_allclose(float(sums["ce"]), ce_sum, rtol=1e-4)
  np.testing.assert_allclose(float(sums["kd"]), kd_sum, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(float(sums["loss"]), ce_sum + kd_sum, rtol=1e-4)
  for after, before in zip(weights.trainable, initial.trainable):
    np.testing.assert_array_equal(after, before)

  # Features, logits and labels of every sample, in sample order, from the
  # model as it left training (inference mode: its moving statistics).
  edge = algorithm.edge_fn()
  edge.set_weights(algorithm.edge_fn().get_weights())
  for v, w in zip(edge.trainable_weights, weights.trainable):
    v.assign(w)
  for v, w in zip(edge.non_trainable_weights, weights.non_trainable):
    v.assign(w)
  features, logits = gkt_models.edge_with_features(
      edge, algorithm.split_layer)(arrays.x, training=False)
  np.testing.assert_allclose(upload.features, features, atol=1e-5)
  np.testing.assert_allclose(upload.logits, logits, atol=1e-5)
  np.testing.assert_array_equal(upload.labels, arrays.y)
  assert int(traffic["bytes_down"]) == server_logits.nbytes
  assert int(traffic["bytes_up"]) == (
      upload.features.numpy().nbytes + upload.logits.numpy().nbytes +
      upload.labels.numpy().nbytes + 5 * 4)


def _composed_logits(algorithm, state, edge_state, x):
  model = algorithm.composed_fn()
  weights = algorithm._composed_weights(edge_state, state)  # pylint: disable=protected-access
  weights.assign_weights_to(model)
  return model(x, training=False).numpy()


_RUNS = {}


def _two_rounds(experiment, **settings):
  """Two rounds on the same two clients; cached per settings."""
  key = tuple(sorted(settings.items()))
  if key not in _RUNS:
    algorithm = fedgkt.FedGKT(
        experiment.task, "fedgkt_server_resnet19",
        attrs.evolve(experiment.algorithm.settings, **settings),
        client_lr=0.05)
    ids = list(experiment.federated_data.client_ids[:2])
    state, stored, outputs = algorithm.initialize(), {}, []
    for round_num in (1, 2):
      output = algorithm.next(state, round_num,
                              _clients(experiment, algorithm, ids, stored,
                                       seed=10 * round_num))
      state = output.state
      stored.update(output.client_states)
      outputs.append(output)
    _RUNS[key] = (algorithm, state, stored, outputs, ids)
  return _RUNS[key]


def test_sync_round_answers_each_client_with_its_samples_logits(
    experiment, tff_context):
  del tff_context
  algorithm, state, stored, outputs, ids = _two_rounds(experiment)
  fed = experiment.federated_data
  for cid in ids:
    x = fed.client_train(cid).x
    np.testing.assert_allclose(
        stored[cid].server_logits,
        _composed_logits(algorithm, state, stored[cid], x), atol=1e-4)
  # Traffic: nothing down in round 1; the server logits in round 2.
  first, second = outputs
  for traffic in first.traffic:
    assert traffic.bytes_down == 0
  for traffic, cid in zip(second.traffic, ids):
    n = len(fed.client_train(cid))
    assert traffic.bytes_down == n * CLASSES * 4
    feature = np.prod(algorithm.feature_shape) * 4
    assert traffic.bytes_up == n * (feature + CLASSES * 4 + 4) + 5 * 4
  metrics = second.metrics
  assert metrics["feature_bytes"] == sum(
      len(fed.client_train(cid)) * feature for cid in ids)
  assert metrics["split_learning_bytes_per_batch"] == (
      2 * 16 * feature + 16 * 4)
  assert first.metrics["client_kd"] == 0.0  # no server logits yet
  assert second.metrics["client_kd"] > 0.0
  assert second.metrics["server_kd"] > 0.0


def test_async_answers_each_client_when_its_features_arrive(
    experiment, tff_context):
  del tff_context
  algorithm, state, stored, _, ids = _two_rounds(experiment, mode="async")
  x = {cid: experiment.federated_data.client_train(cid).x for cid in ids}
  matches = [np.allclose(stored[cid].server_logits,
                         _composed_logits(algorithm, state, stored[cid],
                                          x[cid]), atol=1e-4)
             for cid in ids]
  # Only the last arrival was answered by the final server model; the other
  # got the logits of the server as it was when its own features arrived.
  assert sorted(matches) == [False, True]


@pytest.mark.parametrize("transfer, client_kd, server_kd", [
    ("none", False, False), ("server_to_edge", True, False),
    ("both", True, True)])
def test_transfer_ablation(experiment, tff_context, transfer, client_kd,
                           server_kd):
  del tff_context
  _, _, _, outputs, _ = _two_rounds(experiment, transfer=transfer)
  metrics = outputs[1].metrics
  assert (metrics["client_kd"] > 0) == client_kd
  assert (metrics["server_kd"] > 0) == server_kd
  if not client_kd:
    assert metrics["loss"] == pytest.approx(metrics["client_ce"])


def test_arrival_order_follows_simulated_completion_time(experiment):
  algorithm = experiment.algorithm
  capacity = collections.namedtuple("Capacity", "params flops")
  clients = [api.ClientRound(client_id=str(i), dataset=None, num_examples=n,
                             capacity=capacity(1, speed))
             for i, (n, speed) in enumerate([(100, 1.0), (100, 4.0),
                                             (10, 1.0)])]
  uploads = [fedgkt.GKTUpload(None, None, np.zeros(n)) for n in (100, 100, 10)]
  order = algorithm._arrival_order(  # pylint: disable=protected-access
      clients, uploads, np.random.default_rng(0))
  assert order == [2, 1, 0]


def test_evaluation_groups_every_client_seen(experiment, tff_context):
  del tff_context
  algorithm, state, stored, _, ids = _two_rounds(experiment)

  class Data(api.EvaluationData):

    def client_datasets(self):
      return []

    def client_states(self):
      return stored

  evaluated = algorithm.evaluation_models(state, Data())
  assert list(evaluated) == ([f"edge_server/{c}" for c in ids] +
                             [f"edge/{c}" for c in ids])
  assert {m.group for m in evaluated.values()} == {"edge_server", "edge"}
  test = experiment.splits.test
  row = loop._evaluate(  # pylint: disable=protected-access
      loop.CentralEvaluator(experiment.task.model_fn, test.x, test.y),
      evaluated)
  assert row["accuracy"] == row["edge_server_accuracy"]
  x = test.x
  expected = np.mean([
      np.mean(np.argmax(_composed_logits(algorithm, state, stored[c], x), 1)
              == test.y) for c in ids])
  assert row["edge_server_accuracy"] == pytest.approx(expected, abs=1e-6)
  assert 0.0 <= row["edge_accuracy"] <= 1.0
