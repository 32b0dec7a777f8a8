"""Federated dynamic sparse training: the mechanics FedSGC and FedDST share.

FedDST (Bibikar et al., "Federated Dynamic Sparse Training: Computing Less,
Communicating Less, Yet Learning Better", AAAI 2022) and FedSGC ("Gradient-
Congruity Guided Federated Sparse Training") train a model whose kernels keep
a fixed fraction of their weights, with masks held by tfmot's pruning
wrappers (`tff_hetero.submodels.masks`). `fedsgc.py` and `feddst.py` only
choose the settings; everything is here, in three layers.

Client (layer 1, `build_sparse_client_update`), a `tf.function` over the
wrapped model:

* load the received `SparseModel` (values, kernel masks, statistics);
* local SGD on the unmasked weights only: the gradient of every masked
  kernel is multiplied by its mask, so masked weights stay exactly zero and
  SGD momentum never moves them; an optional FedProx term
  `prox_mu * (w - w_received)` joins the gradient;
* on a readjustment round, after the first `readjust_after` fraction of the
  batches (FedSGC's reference code: E // 2 + 1 of E epochs), per masked
  kernel with n active weights and k = floor(prune_fraction x n):
    - prune k active weights: first, among those whose local pseudo-gradient
      (weights now minus weights received) moves against the global
      direction map, the floor(lambda x k) smallest |w|; then the rest by
      smallest |w| among the remaining active ones;
    - grow as many inactive weights (inactive before the pruning, so a
      weight just pruned is not grown back at once): first, among those
      whose learning direction (minus the loss gradient, on the last batch
      before the readjustment) agrees with the global direction, the
      floor(lambda x k) with the largest |gradient|; then the rest by largest
      |gradient|. Grown weights start at zero.
  then train on the remaining batches. lambda = 0 is FedDST's rule
  (magnitude prune, gradient-magnitude grow; RigL's).
* send `SparseUpload(trainable=w * mask, masks, weight=examples)`.

Server (layer 1, `aggregate`): per element, the weighted average over the
uploads whose mask holds it, sum_k n_k m_k w_k / sum_k n_k m_k
(`tff_hetero.aggregators.MaskedSumFactory`); the new mask is the OR of the
masks (every element some upload holds); then each kernel is pruned by
magnitude back to its ERK budget. FedSGC's sums also hold the last upload of
every client not sampled this round (`remember_uploads`): the server keeps
running sums and, when a client uploads again, its previous contribution is
replaced. The direction map sign(w_t - w_{t-1}) of each kernel is computed
every round and sent, with the prune fraction, on readjustment rounds.

Typed computations (layers 2-3), built by `SparseRounds`, one per kind of
round (plain or readjusting), with S = `SparseModel`, U = `SparseUpload`,
R = `MaskedSums` of the trainable weights, G = int8 direction maps:

    round: (<S@SERVER, G@SERVER, float32@SERVER, R@SERVER, U@CLIENTS,
             {D*}@CLIENTS> ->
            <S@SERVER, G@SERVER, R@SERVER, U@CLIENTS, int64@CLIENTS,
             metrics@SERVER>)

(the global model, its direction map, the prune fraction, the running sums,
the cohort's previous uploads; the new global model, map and sums, the new
uploads, each client's upload bytes, and measured metrics). The previous
uploads live in the program's client-state store, as server memory would in
a deployment; they are not sent and not counted. Without remembered uploads
(FedDST) the sums and uploads are neither inputs nor outputs:

    round: (<S@SERVER, G@SERVER, float32@SERVER, {D*}@CLIENTS> ->
            <S@SERVER, G@SERVER, int64@CLIENTS, metrics@SERVER>)

Accounting, measured on the tensors sent: a masked kernel costs its kept
values (4 bytes each) plus its bit mask (ceil(size / 8) bytes); every other
tensor is dense; the direction maps (int8, one byte per element) and the
prune fraction are added on readjustment rounds; an upload adds its weight.
Client compute is the dense model's training MACs per example: TensorFlow
multiplies the masked zeros too.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import payload
from tff_hetero.accounting import tff_measure
from tff_hetero.aggregators import MaskedSumFactory
from tff_hetero.aggregators import MaskedSums
from tff_hetero.aggregators import MaskedWeight
from tff_hetero.aggregators import weigh
from tff_hetero.accounting import ClientTraffic
from tff_hetero.algorithms import api
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import static_batch_norm
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel


class SparseUpload(NamedTuple):
  """What a client sends: masked values, its kernel masks, its weight."""

  trainable: Any
  masks: Any
  weight: Any


# --------------------------------------------------------------------------
# Layer 1: pure TensorFlow.


def sparse_nbytes(layout: masks_lib.MaskLayout, trainable, masks) -> tf.Tensor:
  """Bytes of trainable values sent as kept values + bit masks (kernels)."""
  masked = {k.trainable_index for k in layout.kernels}
  kernels = [trainable[k.trainable_index] for k in layout.kernels]
  dense = [v for i, v in enumerate(trainable) if i not in masked]
  return (payload.tf_masked_nbytes(kernels, list(masks)) +
          payload.tf_dense_nbytes(dense))


def readjust_mask(mask, weight_now, weight_received, loss_gradient, direction,
                  prune_fraction, congruity_lambda):
  """FedSGC's prune-and-grow of one kernel (module docstring); new mask.

  (`tf.equal`, never `==`: in the graph TFF traces, `tensor == 0` is Python
  identity, False, not an element-wise comparison.)
  """
  mask = tf.cast(mask, tf.float32)
  active = mask > 0
  inactive = tf.logical_not(active)
  n_active = tf.reduce_sum(mask)
  k = tf.cast(tf.floor(prune_fraction * n_active), tf.int32)
  k_guided = tf.cast(tf.floor(congruity_lambda * tf.cast(k, tf.float32)),
                     tf.int32)
  direction = tf.cast(direction, tf.float32)
  magnitude = tf.abs(weight_now)
  # Prune: against the global direction first, then by magnitude.
  local_direction = tf.sign(weight_now - weight_received)
  incongruent = tf.logical_and(active, local_direction * direction < 0)
  pruned = masks_lib.top_k_mask(-magnitude, k_guided, incongruent)
  rest = k - tf.cast(tf.reduce_sum(pruned), tf.int32)
  pruned += masks_lib.top_k_mask(-magnitude, rest,
                                 tf.logical_and(active, tf.equal(pruned, 0.0)))
  # Grow: along the global direction first, then by gradient magnitude.
  grad_magnitude = tf.abs(loss_gradient)
  congruent = tf.logical_and(inactive, -tf.sign(loss_gradient) * direction > 0)
  grown = masks_lib.top_k_mask(grad_magnitude, k_guided, congruent)
  rest = tf.cast(tf.reduce_sum(pruned), tf.int32) - tf.cast(
      tf.reduce_sum(grown), tf.int32)
  grown += masks_lib.top_k_mask(grad_magnitude, rest,
                                tf.logical_and(inactive, tf.equal(grown, 0.0)))
  return mask - pruned + grown


def aggregate(layout: masks_lib.MaskLayout, keep: Sequence[int],
              sums: MaskedSums, statistics) -> SparseModel:
  """Server: masked average, OR of masks, magnitude re-prune to `keep`."""
  counts = sums.weight_sum
  average = [tf.math.divide_no_nan(s, c)
             for s, c in zip(sums.weighted_sum, counts)]
  new_masks = []
  for kernel, budget in zip(layout.kernels, keep):
    held = counts[kernel.trainable_index] > 0
    mask = masks_lib.top_k_mask(tf.abs(average[kernel.trainable_index]),
                                budget, held)
    average[kernel.trainable_index] *= mask
    new_masks.append(mask)
  return SparseModel(trainable=average, masks=new_masks,
                     statistics=list(statistics))


def direction_maps(layout: masks_lib.MaskLayout, new_trainable,
                   old_trainable) -> list:
  """sign(w_t - w_{t-1}) of every masked kernel, as int8."""
  return [tf.cast(tf.sign(new_trainable[k.trainable_index] -
                          old_trainable[k.trainable_index]), tf.int8)
          for k in layout.kernels]


def build_sparse_client_update(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    layout: masks_lib.MaskLayout, *, prox_mu: float, readjust: bool,
    readjust_after: float, congruity_lambda: float):
  """Layer 1: the client's `tf.function` (module docstring)."""
  model = model_fn()
  kernel_of = {k.trainable_index: j for j, k in enumerate(layout.kernels)}
  prox_mu = float(prox_mu)

  @tf.function
  def client_update(optimizer, received: SparseModel, directions,
                    prune_fraction, data):
    weights = tff.learning.models.ModelWeights.from_model(model)
    start = layout.to_model_weights(received)
    tf.nest.map_structure(lambda v, t: v.assign(t), weights, start,
                          check_types=False)
    received_trainable = [tf.identity(t) for t in start.trainable]
    mask_vars = [weights.non_trainable[k.mask_index] for k in layout.kernels]

    def masked(gradients):
      out = []
      for i, (g, w, w0) in enumerate(zip(gradients, weights.trainable,
                                         received_trainable)):
        if prox_mu:
          g = g + prox_mu * (w - w0)
        if i in kernel_of:
          g = g * mask_vars[kernel_of[i]]
        out.append(g)
      return out

    def train(state, batch):
      examples, optimizer_state = state
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      gradients = masked(tape.gradient(output.loss, weights.trainable))
      optimizer_state, updated = optimizer.next(
          optimizer_state, tuple(weights.trainable), tuple(gradients))
      for variable, value in zip(weights.trainable, updated):
        variable.assign(value)
      if output.num_examples is None:
        count = tf.shape(output.predictions, out_type=tf.int64)[0]
      else:
        count = tf.cast(output.num_examples, tf.int64)
      return examples + count, optimizer_state

    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in weights.trainable)
    state = (tf.constant(0, tf.int64), optimizer.initialize(specs))
    if readjust:
      total = data.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
      before = tf.cast(
          tf.math.ceil(readjust_after * tf.cast(total, tf.float32)), tf.int64)
      state = data.take(before).reduce(state, train)
      # The loss gradient of the last batch trained (dense: tfmot's wrapper
      # computes with kernel * mask, so masked entries get their gradient).
      last = data.skip(tf.maximum(before - 1, 0)).take(1)

      def gradient_of(_, batch):
        # Not `forward_pass`: that would count the batch in the metrics again.
        with tf.GradientTape() as tape:
          logits = model.predict_on_batch(batch["x"], training=True)
          loss = tf.reduce_mean(
              tf.keras.losses.sparse_categorical_crossentropy(
                  batch["y"], logits, from_logits=True))
        return tuple(tape.gradient(loss, weights.trainable))

      zeros = tuple(tf.zeros_like(w) for w in weights.trainable)
      gradients = last.reduce(zeros, gradient_of)
      for j, kernel in enumerate(layout.kernels):
        i = kernel.trainable_index
        new_mask = readjust_mask(mask_vars[j], weights.trainable[i],
                                 received_trainable[i], gradients[i],
                                 directions[j], prune_fraction,
                                 congruity_lambda)
        mask_vars[j].assign(tf.cast(new_mask, mask_vars[j].dtype))
        weights.trainable[i].assign(weights.trainable[i] * new_mask)
      state = data.skip(before).reduce(state, train)
    else:
      state = data.reduce(state, train)
    examples, _ = state
    masks = [tf.identity(m) for m in mask_vars]
    trainable = [tf.identity(w) for w in weights.trainable]
    for j, kernel in enumerate(layout.kernels):
      trainable[kernel.trainable_index] *= masks[j]
    upload = SparseUpload(trainable=trainable, masks=masks,
                          weight=tf.cast(examples, tf.float32))
    return upload, model.report_local_unfinalized_metrics()

  return client_update


# --------------------------------------------------------------------------
# Layers 2 and 3: typed computations, one per kind of round.


_spec = learning_process.tensor_spec


class SparseRounds:
  """Builds and caches the round computations of one sparse model.

  Args:
    keras_fn: Builds the *wrapped* Keras model (`masks.prune_wrap`).
    element_spec: One batch of client data.
    initial: A `SparseModel` of NumPy arrays (for the types).
    keep: Weights each masked kernel keeps (its ERK budget).
    client_optimizer: A `tff.learning.optimizers.Optimizer`.
    prox_mu, readjust_after, congruity_lambda: see the module docstring.
    remember_uploads: FedSGC's aggregation over every client's last upload.
  """

  def __init__(self, keras_fn, element_spec, initial: SparseModel,
               keep: Sequence[int], client_optimizer, *, prox_mu: float,
               readjust_after: float, congruity_lambda: float,
               remember_uploads: bool):
    self._keras_fn = keras_fn
    self._element_spec = element_spec
    self._keep = tuple(int(k) for k in keep)
    self._optimizer = client_optimizer
    self._prox_mu = float(prox_mu)
    self._readjust_after = float(readjust_after)
    self._lambda = float(congruity_lambda)
    self._remember = bool(remember_uploads)
    with tf.Graph().as_default():
      self.layout = masks_lib.MaskLayout.of(keras_fn())
    self.model_type = tff.types.tensorflow_to_type(
        tf.nest.map_structure(_spec, initial))
    trainable_type = self.model_type.trainable
    self.upload_type = tff.types.tensorflow_to_type(SparseUpload(
        trainable=[_spec(w) for w in initial.trainable],
        masks=[_spec(m) for m in initial.masks],
        weight=tf.TensorSpec([], tf.float32)))
    self.directions_type = tff.types.tensorflow_to_type(
        [tf.TensorSpec(m.shape, tf.int8) for m in initial.masks])
    self.sums_type = tff.types.to_type(MaskedSums(trainable_type,
                                                  trainable_type))
    self.data_type = tff.SequenceType(
        tff.types.tensorflow_to_type(element_spec))
    self._rounds = {}

  def zero_sums(self, initial: SparseModel) -> MaskedSums:
    zeros = [np.zeros_like(np.asarray(w)) for w in initial.trainable]
    return MaskedSums(zeros, [z.copy() for z in zeros])

  def zero_directions(self, initial: SparseModel) -> list:
    return [np.zeros(np.asarray(m).shape, np.int8) for m in initial.masks]

  def empty_upload(self, initial: SparseModel) -> SparseUpload:
    return SparseUpload(
        trainable=[np.zeros_like(np.asarray(w)) for w in initial.trainable],
        masks=[np.zeros_like(np.asarray(m)) for m in initial.masks],
        weight=np.float32(0.0))

  def _model_fn(self):
    return tff.learning.models.from_keras_model(
        self._keras_fn(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=self._element_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

  def round_computation(self, readjust: bool) -> tff.Computation:
    """The round of the module docstring (cached per kind)."""
    if readjust in self._rounds:
      return self._rounds[readjust]
    layout, keep = self.layout, self._keep
    optimizer = self._optimizer
    model_fn = self._model_fn
    settings = dict(prox_mu=self._prox_mu, readjust=readjust,
                    readjust_after=self._readjust_after,
                    congruity_lambda=self._lambda)

    with tf.Graph().as_default():
      metrics_aggregate = tff_measure.measured_metrics_aggregator()(
          model_fn().metric_finalizers())

    if readjust:

      @tff.tensorflow.computation(self.model_type, self.directions_type,
                                  np.float32, self.data_type)
      def client_work(received, directions, prune_fraction, data):
        update = build_sparse_client_update(model_fn, layout, **settings)
        return update(optimizer, SparseModel(*received), list(directions),
                      prune_fraction, data)
    else:

      @tff.tensorflow.computation(self.model_type, self.data_type)
      def client_work(received, data):
        update = build_sparse_client_update(model_fn, layout, **settings)
        unused = [tf.zeros(k.shape, tf.int8) for k in layout.kernels]
        return update(optimizer, SparseModel(*received), unused,
                      tf.constant(0.0), data)

    upload_type = self.upload_type

    def trainable_masks(upload):
      masks = [tf.ones_like(w) for w in upload.trainable]
      for k, mask in zip(layout.kernels, upload.masks):
        masks[k.trainable_index] = mask
      return masks

    @tff.tensorflow.computation(upload_type)
    def to_weighted(upload):
      return MaskedWeight(upload.weight, trainable_masks(upload))

    @tff.tensorflow.computation(upload_type)
    def contribution(upload):
      weighted, counts = weigh(list(upload.trainable),
                               MaskedWeight(upload.weight,
                                            trainable_masks(upload)))
      return MaskedSums(weighted, counts)

    def upload_nbytes(value, weight):
      masks = [weight.mask[k.trainable_index] for k in layout.kernels]
      return sparse_nbytes(layout, value, masks) + 4  # + the weight.

    def model_nbytes(model):
      return (sparse_nbytes(layout, model.trainable, model.masks) +
              payload.tf_dense_nbytes(model.statistics))

    distributor = tff_measure.build_measured_broadcast_process(
        self.model_type, nbytes_fn=model_nbytes)
    readjust_type = tff.StructType([self.directions_type, np.float32])
    readjust_distributor = tff_measure.build_measured_broadcast_process(
        readjust_type)  # Dense: int8 maps and the float32 fraction.
    weighted_type = to_weighted.type_signature.result
    aggregator = tff_measure.MeasuredUploadFactory(
        MaskedSumFactory(), nbytes_fn=upload_nbytes).create(
            self.model_type.trainable, weighted_type)
    sums_type = self.sums_type
    remember = self._remember

    @tff.tensorflow.computation(self.model_type, sums_type, sums_type,
                                sums_type)
    def server_update(model, running, old, new):
      running, old, new = (MaskedSums(*running), MaskedSums(*old),
                           MaskedSums(*new))
      if remember:
        sums = MaskedSums(
            [r - o + n for r, o, n in zip(running.weighted_sum,
                                          old.weighted_sum, new.weighted_sum)],
            [r - o + n for r, o, n in zip(running.weight_sum, old.weight_sum,
                                          new.weight_sum)])
      else:
        sums = new
      model = SparseModel(*model)
      new_model = aggregate(layout, keep, sums, model.statistics)
      directions = direction_maps(layout, new_model.trainable, model.trainable)
      density = [tf.reduce_mean(m) for m in new_model.masks]
      return new_model, directions, sums, density

    @tff.tensorflow.computation(upload_type)
    def sent_bytes(upload):
      return sparse_nbytes(layout, upload.trainable, upload.masks) + 4

    def body(model, directions, prune_fraction, running, previous, data):
      delivered = distributor.next(distributor.initialize(), model)
      measurements = collections.OrderedDict(
          distributor=delivered.measurements)
      if readjust:
        sent = readjust_distributor.next(
            readjust_distributor.initialize(),
            tff.federated_zip([directions, prune_fraction]))
        client_directions = tff.federated_map(
            tff.tensorflow.computation(lambda pair: pair[0],
                                       readjust_type), sent.result)
        client_fraction = tff.federated_map(
            tff.tensorflow.computation(lambda pair: pair[1],
                                       readjust_type), sent.result)
        measurements["readjust_distributor"] = sent.measurements
        uploads, metrics = tff.federated_map(
            client_work, (delivered.result, client_directions,
                          client_fraction, data))
      else:  # Nothing but the model is sent.
        uploads, metrics = tff.federated_map(client_work,
                                             (delivered.result, data))
      uploaded = aggregator.next(aggregator.initialize(), uploads.trainable,
                                 tff.federated_map(to_weighted, uploads))
      if remember:
        old = tff.federated_sum(tff.federated_map(contribution, previous))
      else:
        old = running = uploaded.result  # Unused: only this round counts.
      new_model, new_directions, new_sums, density = tff.federated_map(
          server_update, (model, running, old, uploaded.result))
      measurements["train"] = metrics_aggregate(metrics)
      measurements["aggregator"] = uploaded.measurements
      measurements["density"] = density
      return (new_model, new_directions, new_sums, uploads,
              tff.federated_map(sent_bytes, uploads),
              tff.federated_zip(measurements))

    server_inputs = [tff.FederatedType(self.model_type, tff.SERVER),
                     tff.FederatedType(self.directions_type, tff.SERVER),
                     tff.FederatedType(np.float32, tff.SERVER)]
    data_input = tff.FederatedType(self.data_type, tff.CLIENTS)
    if remember:

      @tff.federated_computation(
          *server_inputs, tff.FederatedType(sums_type, tff.SERVER),
          tff.FederatedType(upload_type, tff.CLIENTS), data_input)
      def sparse_round(model, directions, prune_fraction, running, previous,
                       data):
        return body(model, directions, prune_fraction, running, previous,
                    data)
    else:

      @tff.federated_computation(*server_inputs, data_input)
      def sparse_round(model, directions, prune_fraction, data):
        (new_model, new_directions, _, _, upload_bytes,
         measurements) = body(model, directions, prune_fraction, None, None,
                              data)
        return new_model, new_directions, upload_bytes, measurements

    self._rounds[readjust] = sparse_round
    return sparse_round


# --------------------------------------------------------------------------
# The algorithm the program drives.


class SparseState(NamedTuple):
  """Server state: the global sparse model, its direction maps, the sums."""

  model: Any       # SparseModel
  directions: Any  # one int8 map per masked kernel
  sums: Any        # MaskedSums of the uploads the aggregation holds


def prune_fraction(round_num: int, prune_alpha: float,
                   end_round: int) -> float:
  """The cosine schedule alpha / 2 (1 + cos(pi t / t_end)), t = round - 1."""
  t = round_num - 1
  if t >= end_round:
    return 0.0
  return prune_alpha / 2.0 * (1.0 + math.cos(math.pi * t / end_round))


class SparseTraining(api.FederatedAlgorithm):
  """FedSGC and FedDST as a `FederatedAlgorithm` (see `fedsgc.py`)."""

  def __init__(self, name: str, task, *, sparsity: float, readjust_every: int,
               readjust_end_round: int, prune_alpha: float,
               congruity_lambda: float, remember_uploads: bool,
               client_optimizer, prox_mu: float, local_epochs: int,
               seed: int):
    self.name = name
    self.sparsity = float(sparsity)
    self.readjust_every = int(readjust_every)
    self.readjust_end_round = int(readjust_end_round)
    self.prune_alpha = float(prune_alpha)
    self.remember_uploads = bool(remember_uploads)
    self._seed = int(seed)
    # What TensorFlow computes: dense kernels times 0/1 masks, so the dense
    # model's MACs (masked weights are not skipped on this hardware).
    self._flops_per_example = task.training_flops_per_example

    def keras_fn():
      return masks_lib.prune_wrap(task.model_fn())

    self.keras_fn = keras_fn
    self._static_bn = static_batch_norm.StaticBatchNorm(keras_fn,
                                                        task.element_spec)
    wrapped = keras_fn()
    self.layout = masks_lib.MaskLayout.of(wrapped)
    densities = masks_lib.erk_densities(self.layout.shapes, self.sparsity)
    self.keep = masks_lib.keep_counts(self.layout.shapes, densities)
    weights = tff.learning.models.ModelWeights.from_model(wrapped)
    weights = tf.nest.map_structure(lambda v: np.asarray(v.numpy()), weights)
    initial_masks = masks_lib.random_masks(self.layout.shapes, self.keep,
                                           self._seed)
    self._initial = self.layout.to_sparse(
        tf.nest.map_structure(np.asarray, self.layout.with_masks(
            weights, initial_masks)))
    self._initial = tf.nest.map_structure(np.asarray, self._initial)
    # E // 2 + 1 of E epochs before readjusting (FedSGC's reference code).
    readjust_after = min(1.0, (local_epochs // 2 + 1) / local_epochs)
    self.rounds = SparseRounds(
        keras_fn, task.element_spec, self._initial, self.keep,
        client_optimizer, prox_mu=prox_mu, readjust_after=readjust_after,
        congruity_lambda=congruity_lambda,
        remember_uploads=remember_uploads)

  def readjusts(self, round_num: int) -> bool:
    """Whether the server requests readjustment in `round_num` (from 1)."""
    return (self.readjust_every > 0 and self.prune_alpha > 0 and
            round_num <= self.readjust_end_round and
            (round_num - 1) % self.readjust_every == 0)

  def initialize(self) -> SparseState:
    return SparseState(model=self._initial,
                       directions=self.rounds.zero_directions(self._initial),
                       sums=self.rounds.zero_sums(self._initial))

  def initial_client_state(self) -> Optional[SparseUpload]:
    """FedSGC: the client's last upload (none yet); FedDST keeps nothing."""
    if not self.remember_uploads:
      return None
    return self.rounds.empty_upload(self._initial)

  def next(self, state: SparseState, round_num: int,
           clients: Sequence[api.ClientRound]) -> api.RoundOutput:
    readjust = self.readjusts(round_num)
    fraction = (prune_fraction(round_num, self.prune_alpha,
                               self.readjust_end_round) if readjust else 0.0)
    computation = self.rounds.round_computation(readjust)
    data = [c.dataset for c in clients]
    if self.remember_uploads:
      model, directions, sums, uploads, upload_bytes, measured = computation(
          state.model, state.directions, np.float32(fraction), state.sums,
          [c.state for c in clients], data)
      client_states = {c.client_id: u for c, u in zip(clients, uploads)}
    else:
      model, directions, upload_bytes, measured = computation(
          state.model, state.directions, np.float32(fraction), data)
      sums, client_states = state.sums, {}
    n = len(clients)
    down = int(measured["distributor"]["bytes_down"])
    if readjust:
      down += int(measured["readjust_distributor"]["bytes_down"])
    train = measured["train"]
    up = int(measured["aggregator"]["bytes_up"]) + int(train["uploaded_bytes"])
    bytes_down = learning_process.per_client_bytes(down, n, "download")
    processed = int(train["metrics"]["num_examples"])
    expected = sum(c.num_examples for c in clients)
    # Uploads differ in size (each client's mask): measured per client.
    per_client_up = [int(b) for b in upload_bytes]
    metric_bytes = learning_process.per_client_bytes(
        int(train["uploaded_bytes"]), n, "metrics upload")
    if sum(per_client_up) + n * metric_bytes != up:
      raise RuntimeError(
          f"{self.name}: uploads measured {up} bytes in the computation but"
          f" {sum(per_client_up) + n * metric_bytes} client by client")
    flops = [c.num_examples * self._flops_per_example for c in clients]
    traffic = tuple(
        ClientTraffic(client_id=c.client_id, bytes_down=bytes_down,
                      bytes_up=u + metric_bytes, flops=f,
                      examples=c.num_examples)
        for c, u, f in zip(clients, per_client_up, flops))
    loss = float(train["metrics"]["loss"])
    metrics = collections.OrderedDict(
        loss=loss if processed == expected else math.nan,
        train_accuracy=float(train["metrics"]["sparse_categorical_accuracy"]),
        readjusted=float(readjust), prune_fraction=fraction)
    densities = [float(d) for d in measured["density"]]
    sizes = [k.size for k in self.layout.kernels]
    metrics["sparsity"] = 1.0 - sum(d * n for d, n in zip(densities, sizes)) / sum(sizes)
    for kernel, density in zip(self.layout.kernels, densities):
      metrics[f"sparsity/{kernel.name.split(':')[0]}"] = 1.0 - density
    return api.RoundOutput(
        state=SparseState(model=model, directions=list(directions), sums=sums),
        metrics=metrics, traffic=traffic, client_states=client_states)

  def model_weights(self, state: SparseState):
    weights = self.layout.to_model_weights(SparseModel(*state.model))
    return tf.nest.map_structure(lambda t: np.asarray(t), weights)

  def evaluation_models(self, state: SparseState, data=None):
    """The global sparse model; with batch norm, statistics from the clients
    (the server aggregates kernels and biases only; `static_batch_norm`)."""
    return collections.OrderedDict(global_model=api.EvaluationModel(
        self._static_bn.calibrate(self.model_weights(state), data),
        model_fn=self.keras_fn))

