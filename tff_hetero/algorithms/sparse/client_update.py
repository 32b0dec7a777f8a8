"""Dynamic sparse training, layer 1: the client's local training `tf.function`.

`build_client_update(...)` returns

    client_update(optimizer, received: SparseModel, directions, epochs_before,
                  data) -> (SparseUpload, ClientReport, ReadjustCounts,
                            unfinalized metrics)

over a model wrapped by `tff_hetero.submodels.masks.prune_wrap`:

* load the received sparse model (values, kernel masks, statistics);
* local SGD on the unmasked weights only: each masked kernel's gradient is
  multiplied by its mask, so masked weights stay zero and momentum never
  moves them; an optional FedProx term prox_mu (w - w_received) joins the
  gradient;
* with `readjust` (a round the server requested it), after every epoch
  boundary whose cumulative epoch t the `ReadjustSchedule` marks due: the
  loss gradient of the epoch's last batch (recomputed after the step,
  without the FedProx term, as FedDST's code does) and the pseudo-gradient
  (weights now minus received) drive `prune_grow.readjust_mask` on every
  kernel with alpha_t; grown weights that were inactive start at zero;
  training continues on the new masks;
* upload `SparseUpload`: masked values, masks, weight (examples trained),
  and per kernel whether the mask is part of the message (only when it
  differs from the received one: otherwise the server knows it).

Epoch boundaries are found by counting batches: the data must hold
`local_epochs` passes whose batches do not span two epochs
(`SparseTraining.client_dataset` makes them so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import payload
from tff_hetero.algorithms.sparse import prune_grow
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel


class SparseUpload(NamedTuple):
  """What a client sends.

  Attributes:
    trainable: Every trainable tensor, masked kernels zero off-mask.
    masks: One float32 0/1 mask per masked kernel.
    weight: float32 examples trained (the aggregation weight).
    mask_sent: float32 [num kernels]: 1 where that kernel's mask differs
      from the one received (it is then sent; otherwise the server knows it).
  """

  trainable: Any
  masks: Any
  weight: Any
  mask_sent: Any


class ClientReport(NamedTuple):
  """Per-client facts the program records (not uploads: measurements).

  Attributes:
    upload_bytes: int64 bytes of the `SparseUpload` encoding.
    epochs: int64 cumulative epochs after this round (the client's state).
    gradient_examples: int64 examples whose loss gradient was computed again
      for growth (compute beyond the training passes).
  """

  upload_bytes: Any
  epochs: Any
  gradient_examples: Any


def upload_nbytes(layout: masks_lib.MaskLayout, trainable, masks,
                  mask_sent) -> tf.Tensor:
  """Bytes of an upload: each kernel's kept values (4 bytes each) plus its
  bit mask (ceil(size / 8) bytes) where sent, the other tensors dense, and
  the float32 weight."""
  masked = {k.trainable_index for k in layout.kernels}
  total = payload.tf_dense_nbytes(
      [v for i, v in enumerate(trainable) if i not in masked]) + 4
  for j, kernel in enumerate(layout.kernels):
    value = trainable[kernel.trainable_index]
    total += (tf.math.count_nonzero(masks[j], dtype=tf.int64) *
              value.dtype.size)
    total += tf.cast(mask_sent[j], tf.int64) * ((kernel.size + 7) // 8)
  return total


def model_nbytes(layout: masks_lib.MaskLayout, model: SparseModel) -> tf.Tensor:
  """Bytes of a downloaded sparse model: kept kernel values plus bit masks,
  every other tensor (biases, batch-norm statistics) dense."""
  masked = {k.trainable_index for k in layout.kernels}
  kernels = [model.trainable[k.trainable_index] for k in layout.kernels]
  dense = [v for i, v in enumerate(model.trainable) if i not in masked]
  return (payload.tf_masked_nbytes(kernels, list(model.masks)) +
          payload.tf_dense_nbytes(dense) +
          payload.tf_dense_nbytes(model.statistics))


def build_client_update(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    layout: masks_lib.MaskLayout, *, prox_mu: float, local_epochs: int,
    schedule: prune_grow.ReadjustSchedule, congruity_lambda: float,
    readjust: bool):
  """The client's `tf.function` (module docstring)."""
  model = model_fn()
  kernel_of = {k.trainable_index: j for j, k in enumerate(layout.kernels)}
  prox_mu = float(prox_mu)
  local_epochs = int(local_epochs)

  @tf.function
  def client_update(optimizer, received: SparseModel, directions,
                    epochs_before, data):
    weights = tff.learning.models.ModelWeights.from_model(model)
    start = layout.to_model_weights(received)
    tf.nest.map_structure(lambda v, t: v.assign(t), weights, start,
                          check_types=False)
    received_trainable = [tf.identity(t) for t in start.trainable]
    received_masks = [tf.cast(m, tf.float32) for m in received.masks]
    mask_vars = [weights.non_trainable[k.mask_index] for k in layout.kernels]
    epochs_before = tf.cast(epochs_before, tf.int64)

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

    def loss_gradient(batch):
      # Not `forward_pass`: that would count the batch in the metrics again.
      with tf.GradientTape() as tape:
        logits = model.predict_on_batch(batch["x"], training=True)
        loss = tf.reduce_mean(
            tf.keras.losses.sparse_categorical_crossentropy(
                batch["y"], logits, from_logits=True))
      # Dense: tfmot's wrapper computes with kernel * mask, so masked entries
      # get their gradient too.
      return tape.gradient(loss, weights.trainable)

    def readjust_all(batch, epochs_done):
      gradients = loss_gradient(batch)
      fraction = schedule.prune_fraction(epochs_done)
      counts = prune_grow.ReadjustCounts.zeros()
      for j, kernel in enumerate(layout.kernels):
        i = kernel.trainable_index
        new_mask, newly_active, kernel_counts = prune_grow.readjust_mask(
            mask_vars[j], weights.trainable[i], received_trainable[i],
            gradients[i], directions[j], fraction, congruity_lambda)
        mask_vars[j].assign(tf.cast(new_mask, mask_vars[j].dtype))
        weights.trainable[i].assign(
            weights.trainable[i] * new_mask * (1.0 - newly_active))
        # One event per client and due epoch, not per kernel.
        counts += kernel_counts._replace(
            readjusts=tf.constant(0.0), prune_fraction=tf.constant(0.0))
      examples = tf.cast(tf.shape(batch["y"])[0], tf.float32)
      return counts._replace(readjusts=tf.constant(1.0),
                             prune_fraction=tf.cast(fraction, tf.float32),
                             gradient_examples=examples)

    total = data.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
    per_epoch = tf.maximum(total // local_epochs, 1)

    def train(state, numbered):
      number, batch = numbered
      examples, optimizer_state, counts = state
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
      if readjust:
        done = number + 1
        epochs_done = epochs_before + done // per_epoch
        due = tf.logical_and(tf.equal(done % per_epoch, 0),
                             schedule.due(epochs_done))
        counts = tf.cond(
            due, lambda: counts + readjust_all(batch, epochs_done),
            lambda: counts)
      return examples + count, optimizer_state, counts

    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in weights.trainable)
    state = (tf.constant(0, tf.int64), optimizer.initialize(specs),
             prune_grow.ReadjustCounts.zeros())
    examples, _, counts = data.enumerate().reduce(state, train)
    masks = [tf.cast(tf.identity(m), tf.float32) for m in mask_vars]
    trainable = [tf.identity(w) for w in weights.trainable]
    for j, kernel in enumerate(layout.kernels):
      trainable[kernel.trainable_index] *= masks[j]
    mask_sent = tf.stack([
        tf.cast(tf.reduce_any(tf.not_equal(m, r)), tf.float32)
        for m, r in zip(masks, received_masks)])
    upload = SparseUpload(trainable=trainable, masks=masks,
                          weight=tf.cast(examples, tf.float32),
                          mask_sent=mask_sent)
    report = ClientReport(
        upload_bytes=upload_nbytes(layout, trainable, masks, mask_sent),
        epochs=epochs_before + total // per_epoch,
        gradient_examples=tf.cast(counts.gradient_examples, tf.int64))
    return upload, report, counts, model.report_local_unfinalized_metrics()

  return client_update
