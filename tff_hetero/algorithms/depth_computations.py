"""Typed TFF computations of depth-heterogeneous rounds (InclusiveFL).

The computations `inclusivefl.InclusiveFL` runs, in three layers: pure
TensorFlow functions of the server step (`distill_and_step`,
`share_layers`), typed `tff.tensorflow.computation`s around them, and one
thin `tff.federated_computation` per depth group for the clients' part.

A depth group j trains a sub-global model W_j of depth L_j (its own
trainable weights: embedding, encoder blocks 1..L_j, head; see
`tff_hetero.models.depth`). The groups' values have different TFF types, so
a round runs one federated computation per group present, `group_round/<j>`:

    (<W_j@SERVER, {D*}@CLIENTS> -> <W_j@SERVER, M@SERVER>)

1. the measured broadcast (`tff_measure`) sends W_j to each client of the
   group and counts the bytes each received;
2. local training: FedProx's client work with `prox_mu = 0` (TFF's FedAvg
   client step, `fedprox.py`) with every client weighted 1, giving the
   update `w_received - w_trained`;
3. the measured upload (`tff_measure.MeasuredUploadFactory` around TFF's
   `MeanFactory`): the unweighted mean update of the group, g_j (Algorithm 1
   line 14: the mean over the group's users, not over their examples).

The server step runs once per round over every group, present or not:

    server_step: (<S, <W_1, ..., W_G>, float32[G]> -> S)

with S = `OrderedDict(models=<W_1, ..., W_G>, optimizer_states=<...>,
momenta=<B, ..., B>)` (B: the weights of one encoder block; one momentum per
group but the shallowest; each group's optimizer state is over its weights
concatenated into one vector, `flatten_weights`) and the third argument the
number of clients of each group this round (0: absent). It is Algorithm 1's lines 15-29:

* `distill_and_step` (lines 15-23), per group j present, shallowest first:
  the update of j's top block L_j becomes `beta m_{k} + (1 - beta) g` with
  m_k the momentum of the next deeper group k from the previous round; then
  the group's server optimizer (FedAdam: TFF's `tff.learning.optimizers`
  Adam) steps W_j with the update; then, for every group but the
  shallowest, m_j is the mean of the updates of blocks L^- .. L_j (L^- the
  next shallower group's depth, both ends included), the update of block
  L_j as distilled at line 17 when j has a deeper group;
* `share_layers` (lines 25-29): the embedding and every block l are the
  client-count-weighted mean over the groups that hold l below their top
  block (depth > l), written back into each of those groups; a group's top
  block L_j and its head stay its own.

A group absent from a round keeps its model, its optimizer state and its
momentum (Algorithm 1 does not define g_j or m_j for an empty group: we
carry the last momentum over rather than reset it, so that the next
shallower group keeps receiving the deeper group's last distilled
direction); it has weight 0 in `share_layers`, where it still receives the
shared layers the present groups produced.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import tff_measure
from tff_hetero.algorithms import fedprox
from tff_hetero.algorithms import learning_process
from tff_hetero.models import depth as depth_lib


@attrs.frozen
class DepthGroup:
  """Clients that train one sub-global model of depth `depth`.

  Attributes:
    name: How metrics and evaluation name it (e.g. `L4`).
    depth: Its number of encoder blocks L_j.
    keras_fn: No-arg builder of its Keras model (seeded). Its first call
      outside a graph may return the model the group was made from (see
      `InclusiveFL._group`): every caller replaces the weights.
    partition: Its `depth_lib.DepthPartition` (indices of the embedding,
      block and head variables in the model's trainable weights).
    training_flops_per_example: Forward+backward MACs per example.
    initial_weights: The seeded model's trainable weights (NumPy), in
      order: their shapes are the group's model type.
  """

  name: str
  depth: int
  keras_fn: Any
  partition: depth_lib.DepthPartition
  training_flops_per_example: int
  initial_weights: tuple = attrs.field(default=(), repr=False)


# -- pure TensorFlow: Algorithm 1, lines 15-29 --------------------------------


def _select(present, new, old):
  return tf.nest.map_structure(lambda a, b: tf.where(present, a, b), new, old)


def flatten_weights(weights) -> tf.Tensor:
  """The tensors of `weights`, flattened and concatenated in order."""
  return tf.concat([tf.reshape(w, [-1]) for w in weights], axis=0)


def unflatten_weights(flat: tf.Tensor, like) -> list:
  """`flat` (`flatten_weights` of tensors shaped as `like`) cut back into
  tensors of those shapes."""
  shapes = [w.shape for w in like]
  sizes = [int(np.prod(shape)) for shape in shapes]
  return [
    tf.reshape(part, shape)
    for part, shape in zip(tf.split(flat, sizes), shapes)
  ]


def distill_and_step(
  groups: Sequence[DepthGroup],
  optimizer: tff.learning.optimizers.Optimizer,
  beta,
  models,
  optimizer_states,
  momenta,
  updates,
  counts,
):
  """Lines 15-23 (module docstring): (models, states, momenta) after the
  homomorphic step. `models[j]`, `updates[j]`: lists of W_j's trainable
  tensors; `optimizer_states[j]`: the state of W_j's optimizer over its
  weights as one flat vector (`flatten_weights`); `momenta[j - 1]`: group
  j's momentum (a list of block tensors).

  The optimizer must act on each entry alone (TFF's SGD, Adam, AdamW,
  Adagrad, RMSprop or Yogi: `DepthComputations` checks), so that stepping
  the flat vector is the same step as stepping each tensor, in a graph of a
  few ops instead of a few per tensor (the server step built in 0.97 s
  instead of 3.4 s for the 4 / 8 / 12-block transformer,
  docs/performance.md)."""
  new_models, new_states, new_momenta = [], [], []
  last = len(groups) - 1
  for j, group in enumerate(groups):
    present = counts[j] > 0
    update = list(updates[j])
    blocks = group.partition.blocks
    if j < last:  # Line 17: distil the deeper group's momentum into L_j.
      for position, index in enumerate(blocks[group.depth - 1]):
        update[index] = (
          beta * momenta[j][position] + (1.0 - beta) * update[index]
        )
    model = flatten_weights(models[j])
    state, (stepped,) = optimizer.next(
      optimizer_states[j], (model,), (flatten_weights(update),)
    )
    new_models.append(
      unflatten_weights(tf.where(present, stepped, model), models[j])
    )
    new_states.append(_select(present, state, optimizer_states[j]))
    if j > 0:  # Line 22: the mean over blocks L^- .. L_j (1-based).
      layers = range(groups[j - 1].depth, group.depth + 1)
      momentum = [
        tf.add_n([update[blocks[layer - 1][position]] for layer in layers])
        / float(len(layers))
        for position in range(len(blocks[0]))
      ]
      new_momenta.append(_select(present, momentum, list(momenta[j - 1])))
  return new_models, new_states, new_momenta


def share_layers(groups: Sequence[DepthGroup], models, counts):
  """Lines 25-29 (module docstring): every group's models with the shared
  layers replaced by their client-weighted mean over the groups holding
  them below their top block."""
  models = [list(m) for m in models]
  deepest = max(g.depth for g in groups)
  # Shared layer keys: "embedding", then block l = 1 .. deepest - 1.
  for layer in range(0, deepest):
    holders = [j for j, g in enumerate(groups) if g.depth > layer]
    if len(holders) < 2:
      continue  # Nothing to share (only its own group holds it).

    def indices(j, layer=layer):
      partition = groups[j].partition
      return partition.embedding if layer == 0 else partition.blocks[layer - 1]

    weights = [counts[j] for j in holders]
    total = tf.add_n(weights)
    for position in range(len(indices(holders[0]))):
      values = [models[j][indices(j)[position]] for j in holders]
      mean = tf.add_n([w * v for w, v in zip(weights, values)]) / tf.maximum(
        total, 1.0
      )
      # No holder present: they all kept the same (shared) value.
      shared = tf.where(total > 0, mean, values[-1])
      for j in holders:
        models[j][indices(j)[position]] = shared
  return models


# -- typed computations ------------------------------------------------------


def _trainable_type(weights):
  return tff.types.tensorflow_to_type(
    [tf.TensorSpec(np.shape(w), tf.float32) for w in weights]
  )


# TFF's optimizers that step each entry alone (`distill_and_step` steps each
# group's weights as one flat vector), by module.
_ELEMENTWISE_OPTIMIZERS = frozenset(
  f"tensorflow_federated.python.learning.optimizers.{name}"
  for name in ("sgdm", "adam", "adamw", "adagrad", "rmsprop", "yogi")
)


class DepthComputations:
  """The typed computations over the depth groups of one run, cached.

  Attributes:
    groups: The `DepthGroup`s, shallowest first.
    server_state_type: S of the module docstring.
    initialize: `( -> S)` from given initial models (`initial_state`).
    server_step: (<S, <W_1, ..., W_G>, float32[G]> -> S).
  """

  def __init__(
    self,
    groups: Sequence[DepthGroup],
    element_spec: Any,
    tff_model_fn,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    beta: float,
    share: bool = True,
  ):
    depths = [g.depth for g in groups]
    if depths != sorted(set(depths)):
      raise ValueError(f"groups must have increasing depths, got {depths}")
    if not 0.0 <= beta <= 1.0:
      raise ValueError(f"beta must be in [0, 1], got {beta}")
    if type(server_optimizer).__module__ not in _ELEMENTWISE_OPTIMIZERS:
      raise TypeError(
        "server_optimizer must act on each entry alone (TFF's"
        " tff.learning.optimizers.build_sgdm, build_adam, build_adamw,"
        " build_adagrad, build_rmsprop or build_yogi), got"
        f" {type(server_optimizer).__name__}"
      )
    self.groups = tuple(groups)
    self._element_spec = element_spec
    self._tff_model_fn = tff_model_fn
    self._client_optimizer = client_optimizer
    self._server_optimizer = server_optimizer
    self._beta = float(beta)
    self._share = bool(share)
    self._rounds: dict[int, tff.Computation] = {}
    self.model_types = [_trainable_type(g.initial_weights) for g in groups]
    block = [
      groups[-1].initial_weights[i] for i in groups[-1].partition.blocks[0]
    ]
    self.block_type = tff.types.tensorflow_to_type(
      [tf.TensorSpec(w.shape, tf.float32) for w in block]
    )
    self.server_step = self._build_server_step()

  def initial_state(self, models: Sequence[Sequence[np.ndarray]]):
    """S with the given initial models, fresh optimizer states and zero
    momenta (Algorithm 1, line 1), as NumPy."""
    states = [
      self._server_optimizer.initialize(
        (
          tf.TensorSpec(
            [sum(int(np.prod(np.shape(w))) for w in model)], tf.float32
          ),
        )
      )
      for model in models
    ]
    zeros = [np.zeros(t.shape, np.float32) for t in self.block_type]
    return tf.nest.map_structure(
      np.asarray,
      collections.OrderedDict(
        models=[[np.asarray(w, np.float32) for w in m] for m in models],
        optimizer_states=states,
        momenta=[list(zeros) for _ in self.groups[1:]],
      ),
    )

  def state_type(self):
    example = self.initial_state(
      [[np.zeros(t.shape, np.float32) for t in mt] for mt in self.model_types]
    )
    return learning_process.type_of(example)

  def _build_server_step(self) -> tff.Computation:
    groups, optimizer = self.groups, self._server_optimizer
    beta, share = self._beta, self._share
    updates_type = tff.StructType(list(self.model_types))
    counts_type = tff.TensorType(np.float32, [len(groups)])
    state_type = self.state_type()

    @tff.tensorflow.computation(state_type, updates_type, counts_type)
    def server_step(state, updates, counts):
      models, states, momenta = distill_and_step(
        groups,
        optimizer,
        tf.constant(beta, tf.float32),
        state["models"],
        state["optimizer_states"],
        state["momenta"],
        updates,
        counts,
      )
      if share:
        models = share_layers(groups, models, counts)
      return collections.OrderedDict(
        models=models, optimizer_states=states, momenta=momenta
      )

    return server_step

  def group_round(self, j: int) -> tff.Computation:
    """`group_round/<j>` of the module docstring, cached."""
    if j in self._rounds:
      return self._rounds[j]
    group = self.groups[j]
    model_type = self.model_types[j]
    client_work = fedprox.build_proximal_client_work(
      self._tff_model_fn(group.keras_fn),
      self._client_optimizer,
      0.0,
      metrics_aggregator=tff_measure.measured_metrics_aggregator(),
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
    )
    aggregator = tff_measure.MeasuredUploadFactory(
      tff.aggregators.MeanFactory()
    ).create(model_type, tff.TensorType(np.float32))

    @tff.tensorflow.computation(model_type)
    def start(trainable):
      return tff.learning.models.ModelWeights(
        trainable=trainable, non_trainable=[]
      )

    group_round = learning_process.compose_cohort_round(
      model_type,
      tff.SequenceType(tff.types.tensorflow_to_type(self._element_spec)),
      tff_measure.build_measured_broadcast_process(model_type),
      start,
      client_work,
      aggregator,
    )
    self._rounds[j] = group_round
    return group_round
