"""FedGKT's pure TensorFlow layer: the edge's and the server's `tf.function`s.

He, Annavaram and Avestimehr, "Group Knowledge Transfer: Federated Learning
of Large CNNs at the Edge" (NeurIPS 2020), Algorithm 1; `fedgkt.py` states
the algorithm, its settings and every departure from the paper. This module
holds what runs inside TFF's computations (`fedgkt_computations.py` types
and places them; `fedgkt.FedGKT` drives the rounds):

* `build_edge_update`: a client's `tf.function`,
  `(ClientModel, batches, int32 position) -> (ClientModel, TaggedUpload,
  UploadSizes, metric sums)`: E_c epochs of SGD on CE + alpha_c x KD(z_s ->
  z_c) over the batches marked `train`, then features, logits and labels of
  the batches marked not `train` (every local sample once, inference mode),
  each sample tagged with the client's cohort position;
* `build_server_update`: the server's `tf.function`, `(ModelWeights,
  optimizer state, TaggedUpload, ServerPlan) -> ServerResult`: the received
  samples put in cohort order (a stable sort on the tags), then for each
  group of the plan in turn (sync: one group, the cohort; async: one group
  per arrival, in arrival order) the server model's accuracy on the group's
  features, E_s epochs over them in the plan's sample order on CE +
  alpha_s x KD(z_c -> z_s), and the answer z_s = f_s(H) of the group's
  samples (inference mode, the model after training on that group).
"""

from __future__ import annotations

import collections
from typing import Any
from typing import NamedTuple

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import data as data_lib
from tff_hetero.accounting import payload
from tff_hetero.algorithms import local_training
from tff_hetero.algorithms.distillation import soft_label_kl
from tff_hetero.data.options import without_autotune
from tff_hetero.models import fedgkt as gkt_models

TRANSFERS = ("both", "server_to_edge", "none")
MODES = ("sync", "async")
# The server's pass over the received features: "shuffled" over all of the
# round's clients (ours), or "by_client", client after client in sample order
# (Algorithm 1's loops and the official code).
SERVER_ORDERS = ("shuffled", "by_client")
SERVER_OPTIMIZERS = collections.OrderedDict(
  adam=lambda lr: tff.learning.optimizers.build_adam(learning_rate=lr),
  sgd=lambda lr: tff.learning.optimizers.build_sgdm(
    learning_rate=lr, momentum=0.9
  ),
)


@attrs.frozen
class GKTSettings:
  """FedGKT's hyper-parameters (`fedgkt.py`'s docstring)."""

  temperature: float = 3.0
  client_kd_weight: float = 1.0
  server_kd_weight: float = 1.0
  kd_t_squared: bool = True
  server_epochs: int = 1
  server_batch_size: int = 32
  server_optimizer: str = "adam"
  server_lr: float = 1e-3
  lr_patience: int = 10
  lr_factor: float = 0.1
  transfer: str = "both"
  mode: str = "sync"
  server_order: str = "shuffled"

  @property
  def client_kd(self) -> bool:
    return self.transfer in ("both", "server_to_edge") and (
      self.client_kd_weight > 0
    )

  @property
  def server_kd(self) -> bool:
    return self.transfer == "both" and self.server_kd_weight > 0


class ClientModel(NamedTuple):
  """What the client computation trains: its weights and optimizer state."""

  trainable: Any
  non_trainable: Any
  optimizer_state: Any


class GKTUpload(NamedTuple):
  """What a client sends: features, logits and labels of all its samples."""

  features: Any
  logits: Any
  labels: Any


class TaggedUpload(NamedTuple):
  """Uploads of one or more clients, concatenated, with each sample's
  client: `owners` int32[?] holds its cohort position, `valid` float32[?]
  is 0 for the samples of a client whose round was not finite (their
  features and logits zeroed), else 1. Within a client the samples keep
  their order; the clients may come in any order (the aggregation over
  several TFF workers concatenates in the order the workers finish)."""

  upload: Any
  owners: Any
  valid: Any


class UploadSizes(NamedTuple):
  """A client's upload, measured on its tensors: total bytes (features,
  logits, labels and metric sums), samples, the features' bytes, and 1 if
  its round was not finite (then rolled back and its upload zeroed), else
  0."""

  bytes_up: Any
  samples: Any
  feature_bytes: Any
  non_finite: Any


class ServerPlan(NamedTuple):
  """What the server trains on, group after group (module docstring).

  Group g holds the cohort positions [group_ends[g - 1], group_ends[g])
  (from 0 for g = 0) and `group_samples[g]` samples, which the server
  checks; its sample order (positions within the group, all its epochs, cut
  into batches in this order) is `orders[order_ends[g - 1]:order_ends[g]]`.
  """

  group_ends: Any  # int32[G]
  group_samples: Any  # int32[G]
  orders: Any  # int64[?]
  order_ends: Any  # int32[G]


class ServerResult(NamedTuple):
  """The server step's outputs: the trained model and optimizer state, the
  training metric sums and fresh-feature correct count over all groups,
  the answers (one row per received sample, in cohort order), each answer
  row's cohort position, and the step's seconds on the worker."""

  weights: Any
  optimizer_state: Any
  sums: Any
  fresh_correct: Any
  answers: Any
  answer_owners: Any
  seconds: Any


def server_plan(group_ends, group_samples, orders) -> ServerPlan:
  """`ServerPlan` (NumPy) from each group's end position, sample count and
  sample order (one array per group)."""
  return ServerPlan(
    np.asarray(group_ends, np.int32),
    np.asarray(group_samples, np.int32),
    np.concatenate(
      [np.zeros(0, np.int64)] + [np.asarray(o, np.int64) for o in orders]
    ),
    np.cumsum([0] + [len(o) for o in orders])[1:].astype(np.int32),
  )


def metric_sums() -> collections.OrderedDict:
  return collections.OrderedDict(
    loss=tf.constant(0.0),
    ce=tf.constant(0.0),
    kd=tf.constant(0.0),
    correct=tf.constant(0.0),
    examples=tf.constant(0.0),
  )


def assign(variables, values) -> None:
  for variable, value in zip(variables, values):
    variable.assign(value)


def correct(logits, labels, weights=None) -> tf.Tensor:
  """How many rows' argmax is the label (each counted by its weight)."""
  hits = tf.cast(
    tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels),
    tf.float32,
  )
  if weights is not None:
    hits *= weights
  return tf.reduce_sum(hits)


def train_pass(
  model,
  optimizer,
  optimizer_state,
  data,
  *,
  inputs_of,
  labels_of,
  teacher_of,
  kd_weight: float,
  temperature: float,
  t_squared: bool,
):
  """SGD over `data` on CE + kd_weight x KD(teacher -> model); metric sums.

  `inputs_of(batch)` and `labels_of(batch)` pick the model's input and the
  labels; `teacher_of(batch)` gives the teacher's logits and whether they
  count (a float 0/1 scalar).
  """
  trainable = model.trainable_variables

  def step(state, batch):
    optimizer_state, sums = state
    labels = tf.cast(labels_of(batch), tf.int32)
    with tf.GradientTape() as tape:
      logits = model(inputs_of(batch), training=True)
      ce = tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True
        )
      )
      if kd_weight:
        teacher, on = teacher_of(batch)
        kd = soft_label_kl(teacher, logits, temperature, t_squared) * on
        loss = ce + kd_weight * kd
      else:
        kd = tf.constant(0.0)
        loss = ce
    gradients = tape.gradient(loss, trainable)
    optimizer_state, updated = optimizer.next(
      optimizer_state, tuple(trainable), tuple(gradients)
    )
    assign(trainable, updated)
    n = tf.cast(tf.shape(labels)[0], tf.float32)
    sums = collections.OrderedDict(
      loss=sums["loss"] + loss * n,
      ce=sums["ce"] + ce * n,
      kd=sums["kd"] + kd * n,
      correct=sums["correct"] + correct(logits, labels),
      examples=sums["examples"] + n,
    )
    return optimizer_state, sums

  return data.reduce((optimizer_state, metric_sums()), step)


def build_edge_update(
  edge_fn, split_layer: str, optimizer, settings: GKTSettings
):
  """The client's `tf.function` (module docstring): train, then extract.

  `(ClientModel, batches, int32 position) -> (ClientModel, TaggedUpload,
  UploadSizes, sums)`.
  """
  edge = edge_fn()
  with_features = gkt_models.edge_with_features(edge, split_layer)
  feature_shape = tuple(with_features.outputs[0].shape[1:])
  num_classes = int(edge.output.shape[-1])
  kd_weight = float(settings.client_kd_weight) if settings.client_kd else 0.0

  @tf.function
  def edge_update(model: ClientModel, data, position):
    assign(edge.trainable_variables, model.trainable)
    assign(edge.non_trainable_variables, model.non_trainable)
    optimizer_state, sums = train_pass(
      edge,
      optimizer,
      model.optimizer_state,
      data.filter(lambda b: b["train"]),
      inputs_of=lambda b: b["x"],
      labels_of=lambda b: b["y"],
      teacher_of=lambda b: (
        b["teacher"],
        tf.cast(b["has_teacher"], tf.float32),
      ),
      kd_weight=kd_weight,
      temperature=settings.temperature,
      t_squared=settings.kd_t_squared,
    )

    def extract(upload, batch):
      features, logits = with_features(batch["x"], training=False)
      return GKTUpload(
        features=tf.concat([upload.features, features], 0),
        logits=tf.concat([upload.logits, logits], 0),
        labels=tf.concat([upload.labels, tf.cast(batch["y"], tf.int32)], 0),
      )

    empty = GKTUpload(
      features=tf.zeros((0,) + feature_shape),
      logits=tf.zeros((0, num_classes)),
      labels=tf.zeros((0,), tf.int32),
    )
    upload = data.filter(lambda b: tf.logical_not(b["train"])).reduce(
      empty, extract
    )
    new_model = ClientModel(
      [tf.identity(v) for v in edge.trainable_variables],
      [tf.identity(v) for v in edge.non_trainable_variables],
      optimizer_state,
    )
    # A round that is not finite anywhere (the edge model, its optimizer,
    # what it uploads, its metrics) is rolled back: the client keeps the
    # model it had, and sends zeros the server leaves out (`valid`). The
    # rows stay, so the plan's counts and the traffic hold.
    finite = local_training.all_finite(
      (new_model, upload.features, upload.logits, sums)
    )
    new_model = tf.nest.map_structure(
      lambda new, old: tf.where(finite, new, old),
      new_model,
      model,
      check_types=False,
    )
    upload = GKTUpload(
      features=tf.where(finite, upload.features, 0.0),
      logits=tf.where(finite, upload.logits, 0.0),
      labels=upload.labels,
    )
    sums = collections.OrderedDict(
      (key, tf.where(finite, value, 0.0)) for key, value in sums.items()
    )
    sizes = UploadSizes(
      bytes_up=payload.tf_dense_nbytes(list(upload))
      + payload.tf_dense_nbytes(list(sums.values())),
      samples=tf.cast(tf.shape(upload.labels)[0], tf.int64),
      feature_bytes=payload.tf_dense_nbytes([upload.features]),
      non_finite=1 - tf.cast(finite, tf.int32),
    )
    owners = tf.fill(tf.shape(upload.labels), tf.cast(position, tf.int32))
    valid = tf.fill(tf.shape(upload.labels), tf.cast(finite, tf.float32))
    return new_model, TaggedUpload(upload, owners, valid), sizes, sums

  return edge_update


def build_server_update(server_fn, optimizer, settings: GKTSettings):
  """The server's `tf.function`: for each group, score, train, answer.

  `(tff.learning.models.ModelWeights, optimizer state, TaggedUpload,
  ServerPlan) -> ServerResult` (module docstring).
  """
  model = server_fn()
  kd_weight = float(settings.server_kd_weight) if settings.server_kd else 0.0
  num_classes = int(model.output.shape[-1])
  batch_size = int(settings.server_batch_size)

  def inference(features):
    return without_autotune(
      tf.data.Dataset.from_tensor_slices(features).batch(batch_size)
    ).reduce(
      tf.zeros((0, num_classes)),
      lambda out, h: tf.concat([out, model(h, training=False)], 0),
    )

  @tf.function
  def server_update(
    weights: tff.learning.models.ModelWeights,
    optimizer_state,
    received: TaggedUpload,
    plan: ServerPlan,
  ):
    start = tf.timestamp()
    assign(model.trainable_variables, weights.trainable)
    assign(model.non_trainable_variables, weights.non_trainable)
    by_owner = tf.argsort(received.owners, stable=True)
    upload = GKTUpload(*(tf.gather(t, by_owner) for t in received.upload))
    owners = tf.gather(received.owners, by_owner)
    valid = tf.gather(received.valid, by_owner)
    group_starts = tf.concat([[0], plan.group_ends[:-1]], 0)
    sample_starts = tf.searchsorted(owners, group_starts, side="left")
    sample_ends = tf.searchsorted(owners, plan.group_ends, side="left")
    order_starts = tf.concat([[0], plan.order_ends[:-1]], 0)
    checks = [
      tf.debugging.assert_equal(
        sample_ends - sample_starts,
        plan.group_samples,
        message="FedGKT server: a group's received samples differ from its"
        " plan",
      ),
      tf.debugging.assert_equal(
        tf.reduce_sum(plan.group_samples),
        tf.size(owners),
        message="FedGKT server: received samples outside every group",
      ),
    ]
    fresh = tf.constant(0.0)
    sums = metric_sums()
    answers = tf.zeros((0, num_classes))
    with tf.control_dependencies(checks):
      num_groups = tf.size(plan.group_ends)
    for g in tf.range(num_groups):
      tf.autograph.experimental.set_loop_options(
        shape_invariants=[(answers, tf.TensorShape([None, num_classes]))]
      )
      group = GKTUpload(*(t[sample_starts[g] : sample_ends[g]] for t in upload))
      group_valid = valid[sample_starts[g] : sample_ends[g]]
      fresh += correct(inference(group.features), group.labels, group_valid)
      # The plan's order, without the samples of a client not finite.
      order = plan.orders[order_starts[g] : plan.order_ends[g]]
      order = tf.boolean_mask(order, tf.gather(group_valid, order) > 0)
      data = without_autotune(
        tf.data.Dataset.from_tensor_slices(order)
        .batch(batch_size)
        .map(
          lambda i, group=group: collections.OrderedDict(
            features=tf.gather(group.features, i),
            logits=tf.gather(group.logits, i),
            labels=tf.gather(group.labels, i),
          )
        )
      )
      optimizer_state, group_sums = train_pass(
        model,
        optimizer,
        optimizer_state,
        data,
        inputs_of=lambda b: b["features"],
        labels_of=lambda b: b["labels"],
        teacher_of=lambda b: (b["logits"], tf.constant(1.0)),
        kd_weight=kd_weight,
        temperature=settings.temperature,
        t_squared=settings.kd_t_squared,
      )
      sums = collections.OrderedDict(
        (key, sums[key] + group_sums[key]) for key in sums
      )
      answers = tf.concat([answers, inference(group.features)], 0)
    new_weights = tff.learning.models.ModelWeights(
      [tf.identity(v) for v in model.trainable_variables],
      [tf.identity(v) for v in model.non_trainable_variables],
    )
    with tf.control_dependencies(
      [answers] + new_weights.trainable + new_weights.non_trainable
    ):
      seconds = tf.timestamp() - start
    return ServerResult(
      new_weights, optimizer_state, sums, fresh, answers, owners, seconds
    )

  return server_update


# ----------------------------------------------------------------------------
# Data the steps read (NumPy / tf.data, on the driver).


def client_dataset_with_teacher(
  arrays,
  server_logits,
  num_classes: int,
  *,
  batch_size: int,
  local_epochs: int,
  shuffle_seed,
  augment: str = "none",
) -> tf.data.Dataset:
  """A client's indexed batches with the server logits of their samples.

  `data.make_indexed_client_dataset` batches (x, y, index, train) with
  `has_teacher` and `teacher`: `server_logits` has one row per sample of
  the client (its last answer), and each batch gets its own samples' rows;
  or it has none (no answer yet: `has_teacher` False, zero teachers).
  """
  logits = np.asarray(server_logits, np.float32).reshape(-1, num_classes)
  have = logits.shape[0] > 0
  if not have:
    logits = np.zeros((len(arrays), num_classes), np.float32)
  return data_lib.make_indexed_client_dataset(
    arrays,
    batch_size=batch_size,
    local_epochs=local_epochs,
    shuffle_seed=shuffle_seed,
    augment=augment,
    batch_values=collections.OrderedDict(has_teacher=have),
    sample_rows=collections.OrderedDict(teacher=logits),
  )


def server_batch_order(
  n: int, batch_size: int, epochs: int, order: str, seed: int
) -> np.ndarray:
  """The server's sample order over `n` received samples, all its epochs
  (cut into batches of `batch_size` in this order): `order` "shuffled" is a
  fresh permutation per epoch from `seed`; "by_client" is the samples as
  received (client after client, each in sample order) in every epoch."""
  if order not in SERVER_ORDERS:
    raise ValueError(
      f"server order {order!r}; accepted: {', '.join(SERVER_ORDERS)}"
    )
  return data_lib.epoch_order(
    n, batch_size, epochs, seed if order == "shuffled" else None
  )
