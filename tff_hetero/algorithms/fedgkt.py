"""FedGKT: group knowledge transfer between small edge models and a large
server model.

He, Annavaram and Avestimehr, "Group Knowledge Transfer: Federated Learning
of Large CNNs at the Edge" (NeurIPS 2020), Algorithm 1. Every client keeps
its own small edge model (feature extractor + classifier; it is never
averaged); the server trains one large model on the clients' feature maps.
Per round:

* client k (`build_edge_update`, layer 1): E_c local epochs of SGD on
  CE(y, z_c) + alpha_c x KD(z_s -> z_c), where z_s are the server's logits
  of the same samples sent last round (CE alone before the server has sent
  any) and KD(t -> s) = T^2 KL(softmax(t / T) || softmax(s / T))
  (`distillation.soft_label_kl`); then, in inference mode, the features H,
  the logits z_c and the labels of every local sample, in sample order;
* server (`build_server_update`, layer 1): E_s epochs of its optimizer over
  the received features (shuffled) on CE(y, f_s(H)) + alpha_s x KD(z_c ->
  z_s); then, in inference mode, z_s = f_s(H) for every received sample,
  kept for its client and sent to it at the start of its next round.

Server logits are keyed by sample position, not by batch: FedGKT's reference
code stores them by batch index while the client's loader reshuffles, so
they reach the wrong images; here the client's training batches carry the
positions of their samples (`data.make_indexed_client_dataset`) and the
client gathers the matching rows. The reference code also keeps the logits
of the server's last training pass (training-mode batch norm, before the
last updates); we compute them after training, in inference mode.

Modes: `sync` waits for the whole cohort, then trains the server once on all
of its features; `async` lets the server train on each client's features as
they arrive (in order of the client's simulated completion time: its
training MACs divided by its device's MAC capacity, taken as its relative
speed; a seeded order when devices have no capacities) and answers that
client before the next arrives. Transfer
ablation (Table 2): `both`, `server_to_edge` (no KD term on the server) and
`none` (CE only on both sides).

State: the server model, its optimizer state (`GKTState`); per client, in
the program's client-state store, its edge model and the server logits of
its samples (`EdgeState`, rows = samples, no rows before the first answer).
Features are used within the round that sent them and dropped: nothing
accumulates on the server between rounds.

Typed computations, with E = edge weights <trainable, non_trainable>,
L = float32[?, C], D = the client's batches <x, y, index, train>,
U = <features=float32[?, h, w, 16], logits=L, labels=int32[?]>,
S = server weights, O = server optimizer state; the server trains on the
received U (concatenated over the clients it trains on) in the batches of
the int64 sample order it is given (shuffled, all its epochs): tensors, not
a `tf.data` dataset, which TFF would serialize with the features inside as
graph constants (capped at 100 MB):

    client round: (<E@CLIENTS, L@CLIENTS, {D*}@CLIENTS> ->
                   <E@CLIENTS, U@CLIENTS,
                    <bytes_down=int64, bytes_up=int64>@CLIENTS,
                    metric sums@SERVER>)
    server train: (<S@SERVER, O@SERVER, U@SERVER, int64[?]@SERVER> ->
                   <S, O, metric sums>@SERVER)
    server logits: (<S@SERVER, float32[?, h, w, 16]@SERVER> -> L@SERVER)

Accounting, measured on the tensors: a client downloads its server logits
(nothing in its first round: the edge model is initialised on the device)
and uploads its features, logits, labels and metric sums. Each round also
reports, from the same measured sizes, what FedAvg of the full model (the
ResNet-56/110 this split stands for) would move for the cohort and what
split learning would move per mini-batch (a batch of features up, their
gradients down, the labels up); `server_step_s` is the wall time of the
round's server training and answers.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import data as data_lib
from tff_hetero import models as models_lib
from tff_hetero.accounting import ClientTraffic
from tff_hetero.accounting import payload
from tff_hetero.algorithms import api
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms.distillation import soft_label_kl
from tff_hetero.models import fedgkt as gkt_models

TRANSFERS = ("both", "server_to_edge", "none")
MODES = ("sync", "async")
SERVER_OPTIMIZERS = collections.OrderedDict(
    adam=lambda lr: tff.learning.optimizers.build_adam(learning_rate=lr),
    sgd=lambda lr: tff.learning.optimizers.build_sgdm(learning_rate=lr,
                                                      momentum=0.9))
FULL_MODEL_OF_SERVER = gkt_models.FULL_MODEL_OF_SERVER


@attrs.frozen
class GKTSettings:
  """FedGKT's hyper-parameters (module docstring)."""

  temperature: float = 3.0
  client_kd_weight: float = 1.0
  server_kd_weight: float = 1.0
  server_epochs: int = 1
  server_batch_size: int = 32
  server_optimizer: str = "adam"
  server_lr: float = 1e-3
  transfer: str = "both"
  mode: str = "sync"

  @property
  def client_kd(self) -> bool:
    return self.transfer in ("both", "server_to_edge") and (
        self.client_kd_weight > 0)

  @property
  def server_kd(self) -> bool:
    return self.transfer == "both" and self.server_kd_weight > 0


class EdgeState(NamedTuple):
  """A client's persistent state: its edge model and its server logits."""

  trainable: Any
  non_trainable: Any
  server_logits: Any


class ModelState(NamedTuple):
  trainable: Any
  non_trainable: Any


class GKTUpload(NamedTuple):
  """What a client sends: features, logits and labels of all its samples."""

  features: Any
  logits: Any
  labels: Any


class GKTState(NamedTuple):
  """The server's state: its model and its optimizer's state."""

  trainable: Any
  non_trainable: Any
  optimizer_state: Any


def _metric_sums() -> collections.OrderedDict:
  return collections.OrderedDict(
      loss=tf.constant(0.0), ce=tf.constant(0.0), kd=tf.constant(0.0),
      correct=tf.constant(0.0), examples=tf.constant(0.0))


def _assign(variables, values) -> None:
  for variable, value in zip(variables, values):
    variable.assign(value)


def _train_pass(model, optimizer, optimizer_state, data, *, inputs_of,
                labels_of, teacher_of, kd_weight: float, temperature: float):
  """SGD over `data` on CE + kd_weight x KD(teacher -> model); metric sums.

  `inputs_of(batch)` and `labels_of(batch)` pick the model's input and the
  labels; `teacher_of(batch, logits)` gives the teacher's logits and whether
  they count (a float 0/1 scalar).
  """
  trainable = model.trainable_variables

  def step(state, batch):
    optimizer_state, sums = state
    labels = tf.cast(labels_of(batch), tf.int32)
    with tf.GradientTape() as tape:
      logits = model(inputs_of(batch), training=True)
      ce = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True))
      if kd_weight:
        teacher, on = teacher_of(batch, logits)
        kd = soft_label_kl(teacher, logits, temperature) * on
        loss = ce + kd_weight * kd
      else:
        kd = tf.constant(0.0)
        loss = ce
    gradients = tape.gradient(loss, trainable)
    optimizer_state, updated = optimizer.next(
        optimizer_state, tuple(trainable), tuple(gradients))
    _assign(trainable, updated)
    n = tf.cast(tf.shape(labels)[0], tf.float32)
    hits = tf.reduce_sum(tf.cast(tf.equal(
        tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32))
    sums = collections.OrderedDict(
        loss=sums["loss"] + loss * n, ce=sums["ce"] + ce * n,
        kd=sums["kd"] + kd * n, correct=sums["correct"] + hits,
        examples=sums["examples"] + n)
    return optimizer_state, sums

  return data.reduce((optimizer_state, _metric_sums()), step)


# --------------------------------------------------------------------------
# Layer 1: pure TensorFlow.


def build_edge_update(edge_fn, split_layer: str, optimizer,
                      settings: GKTSettings):
  """The client's `tf.function` (module docstring): train, then extract."""
  edge = edge_fn()
  with_features = gkt_models.edge_with_features(edge, split_layer)
  feature_shape = tuple(with_features.outputs[0].shape[1:])
  num_classes = int(edge.output.shape[-1])
  kd_weight = float(settings.client_kd_weight) if settings.client_kd else 0.0

  @tf.function
  def edge_update(weights: EdgeState, data):
    _assign(edge.trainable_variables, weights.trainable)
    _assign(edge.non_trainable_variables, weights.non_trainable)
    server_logits = tf.convert_to_tensor(weights.server_logits)
    have = tf.shape(server_logits)[0] > 0

    def teacher_of(batch, logits):
      teacher = tf.cond(have, lambda: tf.gather(server_logits, batch["index"]),
                        lambda: tf.zeros_like(logits))
      return teacher, tf.cast(have, tf.float32)

    specs = tuple(tf.TensorSpec(v.shape, v.dtype)
                  for v in edge.trainable_variables)
    _, sums = _train_pass(
        edge, optimizer, optimizer.initialize(specs),
        data.filter(lambda b: b["train"]), inputs_of=lambda b: b["x"],
        labels_of=lambda b: b["y"], teacher_of=teacher_of,
        kd_weight=kd_weight, temperature=settings.temperature)

    def extract(upload, batch):
      features, logits = with_features(batch["x"], training=False)
      return GKTUpload(
          features=tf.concat([upload.features, features], 0),
          logits=tf.concat([upload.logits, logits], 0),
          labels=tf.concat([upload.labels, tf.cast(batch["y"], tf.int32)], 0))

    empty = GKTUpload(features=tf.zeros((0,) + feature_shape),
                      logits=tf.zeros((0, num_classes)),
                      labels=tf.zeros((0,), tf.int32))
    upload = data.filter(lambda b: tf.logical_not(b["train"])).reduce(
        empty, extract)
    new_weights = ModelState(
        [tf.identity(v) for v in edge.trainable_variables],
        [tf.identity(v) for v in edge.non_trainable_variables])
    traffic = collections.OrderedDict(
        bytes_down=payload.tf_dense_nbytes([server_logits]),
        bytes_up=payload.tf_dense_nbytes(list(upload)) +
        payload.tf_dense_nbytes(list(sums.values())))
    return new_weights, upload, traffic, sums

  return edge_update


def build_server_update(server_fn, optimizer, settings: GKTSettings):
  """The server's training `tf.function` and its logits `tf.function`."""
  model = server_fn()
  kd_weight = float(settings.server_kd_weight) if settings.server_kd else 0.0
  num_classes = int(model.output.shape[-1])

  batch_size = int(settings.server_batch_size)

  @tf.function
  def server_train(weights: ModelState, optimizer_state, received: GKTUpload,
                   order):
    """Batches of `received` in `order` (sample positions, all epochs)."""
    _assign(model.trainable_variables, weights.trainable)
    _assign(model.non_trainable_variables, weights.non_trainable)
    data = tf.data.Dataset.from_tensor_slices(order).batch(batch_size).map(
        lambda i: collections.OrderedDict(
            features=tf.gather(received.features, i),
            logits=tf.gather(received.logits, i),
            labels=tf.gather(received.labels, i)))
    optimizer_state, sums = _train_pass(
        model, optimizer, optimizer_state, data,
        inputs_of=lambda b: b["features"], labels_of=lambda b: b["labels"],
        teacher_of=lambda b, _: (b["logits"], tf.constant(1.0)),
        kd_weight=kd_weight, temperature=settings.temperature)
    new_weights = ModelState(
        [tf.identity(v) for v in model.trainable_variables],
        [tf.identity(v) for v in model.non_trainable_variables])
    return new_weights, optimizer_state, sums

  @tf.function
  def server_logits(weights: ModelState, features):
    _assign(model.trainable_variables, weights.trainable)
    _assign(model.non_trainable_variables, weights.non_trainable)
    return tf.data.Dataset.from_tensor_slices(features).batch(
        batch_size).reduce(
            tf.zeros((0, num_classes)),
            lambda out, h: tf.concat([out, model(h, training=False)], 0))

  return server_train, server_logits


# --------------------------------------------------------------------------
# Layers 2 and 3: typed computations.


class GKTComputations:
  """Builds FedGKT's typed computations for one edge/server pair."""

  def __init__(self, edge_fn, server_fn, element_spec, edge_initial: ModelState,
               server_initial: ModelState, client_optimizer, server_optimizer,
               settings: GKTSettings, num_classes: int,
               feature_shape: Sequence[int], split_layer: str):
    logits_spec = tf.TensorSpec([None, num_classes], tf.float32)
    features_spec = tf.TensorSpec([None, *feature_shape], tf.float32)
    edge_type = learning_process.type_of(ModelState(*edge_initial))
    edge_state_type = learning_process.type_of(EdgeState(
        list(edge_initial.trainable), list(edge_initial.non_trainable),
        logits_spec))
    data_type = tff.SequenceType(learning_process.type_of(element_spec))
    server_type = learning_process.type_of(ModelState(*server_initial))
    specs = [tf.TensorSpec(np.shape(v), tf.float32)
             for v in server_initial.trainable]
    self.server_optimizer_initial = tf.nest.map_structure(
        np.asarray, server_optimizer.initialize(tuple(specs)))
    optimizer_type = learning_process.type_of(self.server_optimizer_initial)
    upload_type = learning_process.type_of(GKTUpload(
        features=features_spec, logits=logits_spec,
        labels=tf.TensorSpec([None], tf.int32)))
    order_type = tff.TensorType(np.int64, [None])
    self.edge_type, self.server_type = edge_type, server_type

    @tff.tensorflow.computation(edge_state_type, data_type)
    def client_step(state, data):
      update = build_edge_update(edge_fn, split_layer, client_optimizer,
                                 settings)
      return update(EdgeState(*state), data)

    @tff.federated_computation(
        tff.FederatedType(edge_state_type, tff.CLIENTS),
        tff.FederatedType(data_type, tff.CLIENTS))
    def client_round(states, data):
      edges, uploads, traffic, sums = tff.federated_map(client_step,
                                                        (states, data))
      return edges, uploads, traffic, tff.federated_sum(sums)

    @tff.tensorflow.computation(server_type, optimizer_type, upload_type,
                                order_type)
    def server_step(weights, optimizer_state, received, order):
      train, _ = build_server_update(server_fn, server_optimizer, settings)
      return train(ModelState(*weights), optimizer_state,
                   GKTUpload(*received), order)

    @tff.federated_computation(
        tff.FederatedType(server_type, tff.SERVER),
        tff.FederatedType(optimizer_type, tff.SERVER),
        tff.FederatedType(upload_type, tff.SERVER),
        tff.FederatedType(order_type, tff.SERVER))
    def server_round(weights, optimizer_state, received, order):
      return tff.federated_map(server_step,
                               (weights, optimizer_state, received, order))

    features_type = learning_process.type_of(features_spec)

    @tff.tensorflow.computation(server_type, features_type)
    def logits_step(weights, features):
      _, logits = build_server_update(server_fn, server_optimizer, settings)
      return logits(ModelState(*weights), features)

    @tff.federated_computation(
        tff.FederatedType(server_type, tff.SERVER),
        tff.FederatedType(features_type, tff.SERVER))
    def server_logits(weights, features):
      return tff.federated_map(logits_step, (weights, features))

    self.client_round = client_round
    self.server_round = server_round
    self.server_logits = server_logits


# --------------------------------------------------------------------------
# The algorithm the program drives.


def _weights_of(model: tf.keras.Model) -> ModelState:
  return ModelState([np.asarray(v) for v in model.trainable_weights],
                    [np.asarray(v) for v in model.non_trainable_weights])


def _sources(composed: tf.keras.Model, edge: tf.keras.Model,
             server: tf.keras.Model, attribute: str) -> list:
  """(0 = edge / 1 = server, index) of each of `composed`'s variables."""
  where = {}
  for source, model in enumerate((edge, server)):
    for i, v in enumerate(getattr(model, attribute)):
      where[id(v)] = (source, i)
  return [where[id(v)] for v in getattr(composed, attribute)]


class FedGKT(api.FederatedAlgorithm):
  """FedGKT (module docstring) for the program."""

  name = "fedgkt"

  def __init__(self, task: api.Task, server_model: str,
               settings: GKTSettings, *, client_lr: float,
               client_momentum: float = 0.0, seed: int = 0):
    if server_model not in gkt_models.SERVER_MODELS:
      raise ValueError(f"FedGKT's server model must be one of "
                       f"{', '.join(gkt_models.SERVER_MODELS)}, got"
                       f" {server_model!r}")
    self.split_layer = models_lib.split_layer(task.model_name)
    self.task = task
    self.settings = settings
    self.seed = int(seed)
    shape, classes = task.input_shape, task.num_classes
    self.edge_fn = task.model_fn
    self.server_fn = lambda: models_lib.build_model(server_model, shape,
                                                    classes, seed=self.seed)
    self.server_model_name = server_model
    self.full_model_name = FULL_MODEL_OF_SERVER[server_model]

    def composed_fn():
      return gkt_models.extractor_and_server(self.edge_fn(), self.server_fn(),
                                             self.split_layer)

    self.composed_fn = composed_fn
    edge, server = self.edge_fn(), self.server_fn()
    composed = gkt_models.extractor_and_server(edge, server, self.split_layer)
    self._composed_sources = (
        _sources(composed, edge, server, "trainable_weights"),
        _sources(composed, edge, server, "non_trainable_weights"))
    self._edge_initial = _weights_of(edge)
    self._server_initial = _weights_of(server)
    self.feature_shape = gkt_models.feature_shape(shape)
    self.num_classes = classes
    self._edge_forward = models_lib.count_flops(edge)
    self._edge_training = models_lib.training_flops_per_example(edge)
    self._server_forward = models_lib.count_flops(server)
    self._server_training = models_lib.training_flops_per_example(server)
    full = models_lib.build_model(self.full_model_name, shape, classes,
                                  seed=self.seed)
    self._full_weights_nbytes = payload.dense_nbytes(full.weights)
    self.profile = collections.OrderedDict(
        edge_model=task.model_name,
        edge_params=models_lib.count_params(edge).trainable,
        edge_flops=self._edge_forward,
        server_model=server_model,
        server_params=models_lib.count_params(server).trainable,
        server_flops=self._server_forward,
        full_model=self.full_model_name,
        full_params=models_lib.count_params(full).trainable,
        full_flops=models_lib.count_flops(full))
    element_spec = collections.OrderedDict(
        x=tf.TensorSpec([None, *shape], tf.float32),
        y=tf.TensorSpec([None], tf.int32),
        index=tf.TensorSpec([None], tf.int64),
        train=tf.TensorSpec([], tf.bool))
    self.computations = GKTComputations(
        self.edge_fn, self.server_fn, element_spec, self._edge_initial,
        self._server_initial,
        learning_process.client_sgd(client_lr, client_momentum),
        SERVER_OPTIMIZERS[settings.server_optimizer](settings.server_lr),
        settings, classes, self.feature_shape, self.split_layer)

  # -- program interface --------------------------------------------------

  def initialize(self) -> GKTState:
    return GKTState(
        list(self._server_initial.trainable),
        list(self._server_initial.non_trainable),
        self.computations.server_optimizer_initial)

  def initial_client_state(self) -> EdgeState:
    return EdgeState(list(self._edge_initial.trainable),
                     list(self._edge_initial.non_trainable),
                     np.zeros((0, self.num_classes), np.float32))

  def client_dataset(self, arrays, *, batch_size, local_epochs,
                     shuffle_seed, augment="none"):
    return data_lib.make_indexed_client_dataset(
        arrays, batch_size=batch_size, local_epochs=local_epochs,
        shuffle_seed=shuffle_seed, augment=augment)

  def next(self, state: GKTState, round_num: int,
           clients: Sequence[api.ClientRound]) -> api.RoundOutput:
    comps = self.computations
    states = [c.state if c.state is not None else self.initial_client_state()
              for c in clients]
    edges, uploads, traffic, client_sums = comps.client_round(
        [EdgeState(*s) for s in states], [c.dataset for c in clients])
    uploads = [GKTUpload(*(np.asarray(t) for t in u)) for u in uploads]
    rng = np.random.default_rng([self.seed, round_num])
    if self.settings.mode == "sync":
      batches = [list(range(len(clients)))]
    else:
      batches = [[k] for k in self._arrival_order(clients, uploads, rng)]
    server_start = time.perf_counter()
    server = ModelState(state.trainable, state.non_trainable)
    optimizer_state = state.optimizer_state
    server_logits = [None] * len(clients)
    server_sums = collections.Counter()
    for group in batches:
      features = np.concatenate([uploads[k].features for k in group])
      logits = np.concatenate([uploads[k].logits for k in group])
      labels = np.concatenate([uploads[k].labels for k in group])
      order = data_lib.epoch_order(
          len(labels), self.settings.server_batch_size,
          self.settings.server_epochs, int(rng.integers(2**31)))
      server, optimizer_state, sums = comps.server_round(
          server, optimizer_state, GKTUpload(features, logits, labels), order)
      server = ModelState(*server)
      server_sums.update({k: float(v) for k, v in sums.items()})
      answered = np.asarray(comps.server_logits(server, features))
      offsets = np.cumsum([0] + [len(uploads[k].labels) for k in group])
      for k, start, end in zip(group, offsets[:-1], offsets[1:]):
        server_logits[k] = answered[start:end]
    server_seconds = time.perf_counter() - server_start
    client_states = collections.OrderedDict()
    for c, edge, answer in zip(clients, edges, server_logits):
      client_states[c.client_id] = EdgeState(
          [np.asarray(t) for t in edge.trainable],
          [np.asarray(t) for t in edge.non_trainable], answer)
    return api.RoundOutput(
        state=GKTState(list(server.trainable), list(server.non_trainable),
                       optimizer_state),
        metrics=collections.OrderedDict(
            **self._metrics(clients, uploads, client_sums, server_sums),
            server_step_s=server_seconds),
        traffic=self._traffic(clients, uploads, traffic),
        client_states=client_states)

  def model_weights(self, state: GKTState):
    return tff.learning.models.ModelWeights(
        trainable=list(state.trainable),
        non_trainable=list(state.non_trainable))

  def evaluation_models(self, state: GKTState, data=None):
    """Each client's extractor + the server model, and its edge model alone.

    Clients never sampled still hold the initial edge model; they are left
    out (the initial model stands in while no client has trained).
    """
    stored = dict(data.client_states()) if data is not None else {}
    if not stored:
      stored = {"initial": self.initial_client_state()}
    out = collections.OrderedDict()
    for client_id, edge in stored.items():
      out[f"edge_server/{client_id}"] = api.EvaluationModel(
          self._composed_weights(EdgeState(*edge), state),
          model_fn=self.composed_fn, group="edge_server")
    for client_id, edge in stored.items():
      edge = EdgeState(*edge)
      out[f"edge/{client_id}"] = api.EvaluationModel(
          tff.learning.models.ModelWeights(list(edge.trainable),
                                           list(edge.non_trainable)),
          model_fn=self.edge_fn, group="edge")
    return out

  def report_extras(self) -> collections.OrderedDict:
    return collections.OrderedDict(fedgkt_models=self.profile)

  # -- helpers --------------------------------------------------------------

  def _composed_weights(self, edge: EdgeState, state: GKTState):
    parts = []
    for sources, edge_values, server_values in zip(
        self._composed_sources, (edge.trainable, edge.non_trainable),
        (state.trainable, state.non_trainable)):
      parts.append([(edge_values, server_values)[s][i] for s, i in sources])
    return tff.learning.models.ModelWeights(*parts)

  def _client_flops(self, client: api.ClientRound, samples: int) -> int:
    return (client.num_examples * self._edge_training +
            samples * self._edge_forward)

  def _arrival_order(self, clients, uploads, rng) -> list[int]:
    """Async: clients by simulated completion time (module docstring)."""
    speeds = [getattr(c.capacity, "flops", None) for c in clients]
    if all(s for s in speeds):
      times = [self._client_flops(c, len(u.labels)) / s
               for c, u, s in zip(clients, uploads, speeds)]
      return sorted(range(len(clients)), key=lambda k: (times[k], k))
    return [int(k) for k in rng.permutation(len(clients))]

  def _traffic(self, clients, uploads, traffic) -> tuple[ClientTraffic, ...]:
    return tuple(
        ClientTraffic(client_id=c.client_id,
                      bytes_down=int(t["bytes_down"]),
                      bytes_up=int(t["bytes_up"]),
                      flops=self._client_flops(c, len(u.labels)),
                      examples=c.num_examples)
        for c, u, t in zip(clients, uploads, traffic))

  def _metrics(self, clients, uploads, client_sums,
               server_sums) -> collections.OrderedDict:
    examples = float(client_sums["examples"])
    expected = sum(c.num_examples for c in clients)
    mean = lambda sums, key, n: float(sums[key]) / n if n else math.nan
    server_n = server_sums["examples"]
    samples = sum(len(u.labels) for u in uploads)
    feature_bytes = sum(u.features.nbytes for u in uploads)
    per_sample = feature_bytes / samples if samples else 0.0
    label_bytes = (sum(u.labels.nbytes for u in uploads) / samples
                   if samples else 0.0)
    batch = self.settings.server_batch_size
    return collections.OrderedDict(
        loss=mean(client_sums, "loss", examples) if examples == expected
        else math.nan,
        train_accuracy=mean(client_sums, "correct", examples),
        client_ce=mean(client_sums, "ce", examples),
        client_kd=mean(client_sums, "kd", examples),
        server_loss=mean(server_sums, "loss", server_n),
        server_ce=mean(server_sums, "ce", server_n),
        server_kd=mean(server_sums, "kd", server_n),
        server_accuracy=mean(server_sums, "correct", server_n),
        server_flops=float(server_n * self._server_training +
                           samples * self._server_forward),
        feature_bytes=float(feature_bytes),
        # What other methods would move, from the same measured sizes.
        fedavg_full_model_bytes=float(2 * len(clients) *
                                      self._full_weights_nbytes),
        split_learning_bytes_per_batch=float(
            2 * batch * per_sample + batch * label_bytes))


def check_flags(config) -> None:
  """Raises `UsageError` naming the first `--model` / `--gkt_*` flag FedGKT
  cannot take (the numeric ones are checked by `ExperimentConfig`)."""
  from tff_hetero.program.errors import UsageError  # pylint: disable=g-import-not-at-top
  if config.model not in models_lib.MODELS or not models_lib.MODELS[
      config.model].split_layer:
    edges = sorted(n for n, s in models_lib.MODELS.items() if s.split_layer)
    raise UsageError("--model", f"fedgkt trains an edge model (a model with a"
                     f" split point); accepted: {', '.join(edges)}")
  for flag, value, accepted in (
      ("--gkt_server_model", config.gkt_server_model,
       tuple(gkt_models.SERVER_MODELS)),
      ("--gkt_server_optimizer", config.gkt_server_optimizer,
       tuple(SERVER_OPTIMIZERS)),
      ("--gkt_transfer", config.gkt_transfer, TRANSFERS),
      ("--gkt_mode", config.gkt_mode, MODES)):
    if value not in accepted:
      raise UsageError(flag, f"unknown value {value!r}; accepted: "
                       f"{', '.join(accepted)}")


def build_fedgkt(config, task: api.Task, client_ids=()) -> FedGKT:
  """Registry builder: `--algorithm=fedgkt` with the `--gkt_*` flags."""
  del client_ids
  check_flags(config)
  settings = GKTSettings(
      temperature=config.gkt_temperature,
      client_kd_weight=config.gkt_client_kd_weight,
      server_kd_weight=config.gkt_server_kd_weight,
      server_epochs=config.gkt_server_epochs,
      server_batch_size=config.batch_size,
      server_optimizer=config.gkt_server_optimizer,
      server_lr=config.gkt_server_lr,
      transfer=config.gkt_transfer,
      mode=config.gkt_mode)
  return FedGKT(task, config.gkt_server_model, settings,
                client_lr=config.client_lr,
                client_momentum=config.client_momentum, seed=config.seed)
