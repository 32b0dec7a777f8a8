"""Dynamic sparse training, layer 1: the client's local training `tf.function`.

`build_client_update(...)` returns

    client_update(optimizer, received: SparseModel, directions, epochs_before,
                  data, requested=True) -> (SparseUpload, ClientReport,
                                            ReadjustCounts, unfinalized metrics)

over a model wrapped by `tff_hetero.submodels.masks.prune_wrap`:

* load the received sparse model (values, kernel masks, statistics;
  kernels multiplied by their masks);
* local SGD on the unmasked weights only: each masked kernel's gradient is
  multiplied by its mask, and so are its new values after each step, so
  masked weights stay zero (a weight pruned mid-round may keep velocity in
  the optimizer state; its value stays zero); an optional FedProx term
  prox_mu (w - w_received) joins the gradient. The model's tfmot wrappers
  therefore need not re-apply the masks before each forward pass, and do
  not (`computations.SparseRounds.model_fn(masks_in_call=False)`);
* with `readjust` (a round the server requested it; built with `readjust`,
  the bool tensor `requested` may still say no, for a decision made in the
  graph), after every epoch
  boundary whose cumulative epoch t the `ReadjustSchedule` marks due: a
  dense loss gradient (`GROWTH_GRADIENTS`: the mean over the batches trained
  since the round began or since the last readjustment, or the last batch's,
  recomputed after its step without the FedProx term as FedDST's code does)
  and the pseudo-gradient (weights now minus received) drive
  `prune_grow.readjust_mask` on every kernel with alpha_t; grown weights
  that were inactive start at zero; training continues on the new masks;
* upload `SparseUpload`: masked values, masks, weight (examples trained),
  and per kernel whether the mask is part of the message (only when it
  differs from the received one: otherwise the server knows it);
* with `importance` (PruneFL's reconfiguration rounds), also the sum over
  the local steps of every kernel's squared loss gradient (dense: masked
  weights included), uploaded as float32 per element.

Epoch boundaries are found by counting batches: the data must hold
`local_epochs` passes whose batches do not span two epochs
(`SparseTraining.client_dataset` makes them so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import payload
from tff_hetero.algorithms import local_training
from tff_hetero.algorithms import model_fns
from tff_hetero.algorithms.sparse import prune_grow
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel

# Which dense loss gradient ranks growth.
GROWTH_GRADIENTS = ("accumulated", "last_batch")


class SparseUpload(NamedTuple):
  """What a client sends (`importance`: an empty tuple unless requested).

  Attributes:
    trainable: Every trainable tensor, masked kernels zero off-mask.
    masks: One float32 0/1 mask per masked kernel.
    weight: float32 examples trained (the aggregation weight).
    mask_sent: float32 [num kernels]: 1 where that kernel's mask differs
      from the one received (it is then sent; otherwise the server knows it).
    importance: Per kernel, the sum over local steps of its squared loss
      gradient (PruneFL), or ().
  """

  trainable: Any
  masks: Any
  weight: Any
  mask_sent: Any
  importance: Any = ()


class ClientReport(NamedTuple):
  """Per-client facts the program records (not uploads: measurements).

  Attributes:
    upload_bytes: int64 bytes of the `SparseUpload` encoding.
    epochs: int64 cumulative epochs after this round (the client's state).
    gradient_examples: int64 examples whose loss gradient was computed again
      for growth (compute beyond the training passes).
    non_finite: int32 1 if the client's values (or squared gradients) were
      not finite and it sent zeros with weight 0 instead, as TFF's FedAvg
      client work does (its metrics reset too); else 0.
  """

  upload_bytes: Any
  epochs: Any
  gradient_examples: Any
  non_finite: Any


def upload_nbytes(
  layout: masks_lib.MaskLayout, trainable, masks, mask_sent, importance=()
) -> tf.Tensor:
  """Bytes of an upload: each kernel's kept values (4 bytes each) plus its
  bit mask (ceil(size / 8) bytes) where sent, the other tensors dense, the
  float32 weight, and any importance tensors dense."""
  masked = {k.trainable_index for k in layout.kernels}
  total = (
    payload.tf_dense_nbytes(
      [v for i, v in enumerate(trainable) if i not in masked]
    )
    + 4
  )
  total += payload.tf_dense_nbytes(list(importance))
  for j, kernel in enumerate(layout.kernels):
    value = trainable[kernel.trainable_index]
    total += tf.math.count_nonzero(masks[j], dtype=tf.int64) * value.dtype.size
    total += tf.cast(mask_sent[j], tf.int64) * ((kernel.size + 7) // 8)
  return total


def model_nbytes(layout: masks_lib.MaskLayout, model: SparseModel) -> tf.Tensor:
  """Bytes of a downloaded sparse model: kept kernel values plus bit masks,
  every other tensor (biases, batch-norm statistics) dense."""
  masked = {k.trainable_index for k in layout.kernels}
  kernels = [model.trainable[k.trainable_index] for k in layout.kernels]
  dense = [v for i, v in enumerate(model.trainable) if i not in masked]
  return (
    payload.tf_masked_nbytes(kernels, list(model.masks))
    + payload.tf_dense_nbytes(dense)
    + payload.tf_dense_nbytes(model.statistics)
  )


class MaskedTraining:
  """Masked local SGD on a wrapped model (every sparse client uses it).

  Call `load` and `step` inside a `tf.function`: `load(received)` assigns a
  `SparseModel` to the model's weights and returns the received trainable
  values; `step(optimizer, state, batch, received_trainable)` takes one
  optimizer step (`local_training.sgd_step`) on the loss gradient plus
  prox_mu (w - w_received) when `prox_mu` > 0, each masked kernel's then
  multiplied by its mask, and the kernel's new values too, and returns
  (optimizer state, the raw dense loss gradients, the examples in the
  batch). Masked weights so stay zero in every forward pass and upload,
  and the model's tfmot wrappers need not apply kernel := kernel x mask
  before each call themselves: the rounds build it with that switched off
  (`computations.SparseRounds.model_fn(masks_in_call=False)`: the same
  values, without an assignment per kernel and pass). With momentum, a
  weight pruned in the middle of local training keeps its velocity in the
  optimizer state until the round ends, and its value stays zero.
  """

  def __init__(self, model, layout: masks_lib.MaskLayout, prox_mu: float):
    self.model = model
    self.layout = layout
    self.weights = tff.learning.models.ModelWeights.from_model(model)
    self.mask_vars = [
      self.weights.non_trainable[k.mask_index] for k in layout.kernels
    ]
    self._kernel_of = {
      k.trainable_index: j for j, k in enumerate(layout.kernels)
    }
    self._prox_mu = float(prox_mu)

  def load(self, received: SparseModel) -> list:
    start = self.layout.to_model_weights(received)
    # Kernels zero off their masks from the start (every sender already
    # sends them so; here it is guaranteed in one place).
    trainable = list(start.trainable)
    for kernel in self.layout.kernels:
      i = kernel.trainable_index
      trainable[i] = trainable[i] * tf.cast(
        start.non_trainable[kernel.mask_index], trainable[i].dtype
      )
    start = tff.learning.models.ModelWeights(
      trainable=trainable, non_trainable=list(start.non_trainable)
    )
    tf.nest.map_structure(
      lambda v, t: v.assign(t), self.weights, start, check_types=False
    )
    return [tf.identity(t) for t in start.trainable]

  def initial_state(self, optimizer):
    return optimizer.initialize(
      tuple(tf.TensorSpec(v.shape, v.dtype) for v in self.weights.trainable)
    )

  def step(self, optimizer, optimizer_state, batch, received_trainable):
    # Dense: the layer reads the kernel itself (zero off-mask), so masked
    # entries get their raw gradient too; the step masks it.
    def masked(i, value):
      if i in self._kernel_of:
        return value * self.mask_vars[self._kernel_of[i]]
      return value

    return local_training.sgd_step(
      self.model,
      self.weights.trainable,
      optimizer,
      optimizer_state,
      batch,
      anchor=received_trainable,
      prox_mu=self._prox_mu,
      transform=masked,
      project=masked,
    )

  def upload_values(self) -> tuple[list, list]:
    """(masked trainable values, float32 masks) as they are now."""
    masks = [tf.cast(tf.identity(m), tf.float32) for m in self.mask_vars]
    trainable = [tf.identity(w) for w in self.weights.trainable]
    for j, kernel in enumerate(self.layout.kernels):
      trainable[kernel.trainable_index] *= masks[j]
    return trainable, masks


def build_client_update(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  layout: masks_lib.MaskLayout,
  *,
  prox_mu: float,
  local_epochs: int,
  schedule: prune_grow.ReadjustSchedule,
  congruity_lambda: float,
  readjust: bool,
  importance: bool = False,
  growth_gradient: str = "accumulated",
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
):
  """The client's `tf.function` (module docstring); `loss_fn()` is the loss
  of the growth gradients (default `model_fns.default_loss_fn`, the
  training loss of every registered model; pass the loss `model_fn`'s
  model trains on)."""
  if growth_gradient not in GROWTH_GRADIENTS:
    raise ValueError(
      f"growth_gradient must be one of {GROWTH_GRADIENTS},"
      f" got {growth_gradient!r}"
    )
  accumulate = readjust and growth_gradient == "accumulated"
  loss_object = (loss_fn or model_fns.default_loss_fn)()
  model = model_fn()
  trainer = MaskedTraining(model, layout, prox_mu)
  local_epochs = int(local_epochs)

  @tf.function
  def client_update(
    optimizer,
    received: SparseModel,
    directions,
    epochs_before,
    data,
    requested=True,
  ):
    weights, mask_vars = trainer.weights, trainer.mask_vars
    received_trainable = trainer.load(received)
    received_masks = [tf.cast(m, tf.float32) for m in received.masks]
    epochs_before = tf.cast(epochs_before, tf.int64)

    def loss_gradient(batch):
      # Not `forward_pass`: that would count the batch in the metrics again.
      with tf.GradientTape() as tape:
        logits = model.predict_on_batch(batch["x"], training=True)
        loss = loss_object(batch["y"], logits)
      # Dense: the layer reads the kernel itself (zero off-mask), so masked
      # entries get their gradient too.
      return tape.gradient(loss, weights.trainable)

    def readjust_all(batch, epochs_done, summed, batches):
      if accumulate:
        gradients = [
          g / tf.cast(tf.maximum(batches, 1), tf.float32) for g in summed
        ]
      else:
        gradients = loss_gradient(batch)
      fraction = schedule.prune_fraction(epochs_done)
      counts = prune_grow.ReadjustCounts.zeros()
      for j, kernel in enumerate(layout.kernels):
        i = kernel.trainable_index
        j_gradient = gradients[j] if accumulate else gradients[i]
        new_mask, newly_active, kernel_counts = prune_grow.readjust_mask(
          mask_vars[j],
          weights.trainable[i],
          received_trainable[i],
          j_gradient,
          directions[j],
          fraction,
          congruity_lambda,
        )
        mask_vars[j].assign(tf.cast(new_mask, mask_vars[j].dtype))
        weights.trainable[i].assign(
          weights.trainable[i] * new_mask * (1.0 - newly_active)
        )
        # One event per client and due epoch, not per kernel.
        counts += kernel_counts._replace(
          readjusts=tf.constant(0.0), prune_fraction=tf.constant(0.0)
        )
      # The last-batch gradient is computed again: compute beyond training.
      examples = (
        tf.constant(0.0)
        if accumulate
        else tf.cast(tf.shape(batch["y"])[0], tf.float32)
      )
      return counts._replace(
        readjusts=tf.constant(1.0),
        prune_fraction=tf.cast(fraction, tf.float32),
        gradient_examples=examples,
      )

    if readjust:  # Epoch boundaries: count the batches first.

      def count_batches():
        return data.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)

      if isinstance(requested, bool):
        total = count_batches() if requested else tf.constant(0, tf.int64)
      else:  # A round the server did not request needs no boundaries.
        total = tf.cond(
          requested, count_batches, lambda: tf.constant(0, tf.int64)
        )
      per_epoch = tf.maximum(total // local_epochs, 1)

    def train(state, numbered):
      number, batch = numbered
      examples, optimizer_state, counts, squares, summed, batches = state
      optimizer_state, raw, count = trainer.step(
        optimizer, optimizer_state, batch, received_trainable
      )
      if importance:
        squares = tuple(
          s + tf.square(raw[k.trainable_index])
          for s, k in zip(squares, layout.kernels)
        )
      if accumulate:
        summed = tuple(
          s + raw[k.trainable_index] for s, k in zip(summed, layout.kernels)
        )
        batches += 1
      if readjust:
        done = number + 1
        epochs_done = epochs_before + done // per_epoch
        due = tf.logical_and(
          tf.logical_and(tf.equal(done % per_epoch, 0), requested),
          schedule.due(epochs_done),
        )
        counts, summed, batches = tf.cond(
          due,
          lambda: (
            counts + readjust_all(batch, epochs_done, summed, batches),
            tuple(tf.zeros_like(s) for s in summed),
            tf.zeros_like(batches),
          ),
          lambda: (counts, summed, batches),
        )
      return examples + count, optimizer_state, counts, squares, summed, batches

    zeros = tuple(tf.zeros(k.shape, tf.float32) for k in layout.kernels)
    state = (
      tf.constant(0, tf.int64),
      trainer.initial_state(optimizer),
      prune_grow.ReadjustCounts.zeros(),
      zeros if importance else (),
      zeros if accumulate else (),
      tf.constant(0, tf.int64),
    )
    examples, _, counts, squares, _, _ = local_training.fold_batches(
      data.enumerate(), state, train
    )
    trainable, masks = trainer.upload_values()
    mask_sent = tf.stack(
      [
        tf.cast(tf.reduce_any(tf.not_equal(m, r)), tf.float32)
        for m, r in zip(masks, received_masks)
      ]
    )
    (trainable, squares), non_finite = (
      local_training.zero_all_if_any_non_finite(
        (trainable, list(squares) if importance else [])
      )
    )
    weight = tf.cast(examples, tf.float32)
    if non_finite > 0:
      weight = tf.constant(0.0, tf.float32)
      model.reset_metrics()
    upload = SparseUpload(
      trainable=trainable,
      masks=masks,
      weight=weight,
      mask_sent=mask_sent,
      importance=list(squares) if importance else (),
    )
    report = ClientReport(
      upload_bytes=upload_nbytes(
        layout, trainable, masks, mask_sent, squares if importance else ()
      ),
      epochs=epochs_before + local_epochs,
      gradient_examples=tf.cast(counts.gradient_examples, tf.int64),
      non_finite=tf.cast(non_finite, tf.int32),
    )
    return upload, report, counts, model.report_local_unfinalized_metrics()

  return client_update
