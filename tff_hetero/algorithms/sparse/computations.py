"""Dynamic sparse training, layers 2 and 3: typed TFF computations.

`SparseRounds` builds (once per kind, cached) the round of one sparse model,
with S = `SparseModel`, G = int8 direction maps (one per masked kernel),
P = the same maps packed at 2 bits per element (`prune_grow.pack_ternary`),
R = `MaskedSums` of the trainable weights, M = `MemoryRows` (the server's
record of uploads, one row per client, leading dimension = rows),
U = `ClientReport`, C = `ReadjustCounts`:

    round: (<S@SERVER, G@SERVER, R@SERVER, int64@CLIENTS, {D*}@CLIENTS,
             int32@CLIENTS (position)> ->
            <S@SERVER, G@SERVER, R@SERVER,
             <rows=<M[K], U[K]>, positions=int32[K]>@SERVER, metrics@SERVER>)

(in a round without readjustment, M is a `PackedRow`, float32[?] values
and the weight: the values at the sent model's masks, which every client
kept; `unpacked_rows` restores the row on the driver).

Inputs: the global model, its direction map, the running sums over every
remembered upload except those of this round's K clients (whose new
uploads replace them: the driver subtracts their memory rows beforehand,
`without_rows`, so the old rows are not sent to the worker), each
client's cumulative epochs and data.
Outputs: the new model, map and running sums, each client's new memory row
(what the server received from it, as it remembers it) and report (upload
bytes, new cumulative epochs), stacked at the server with each client's
cohort position (each client tags its row, `cohort_positions.as_gathered_row`,
and `cohort_positions.concatenated` stacks them: on several TFF workers they
arrive in the order the workers finish, and the driver reads them by
position), and measured metrics (bytes down, the readjust counts, per-kernel
densities, training metrics). Every result is SERVER-placed, so on several
workers TFF's mergeable context runs the server step once.

Without server memory (FedDST, `--sgc_memory=none`) R is neither an input
nor an output, and the rows are reports only:

    round: (<S@SERVER, G@SERVER, int64@CLIENTS, {D*}@CLIENTS,
             int32@CLIENTS (position)> ->
            <S@SERVER, G@SERVER, <rows=U[K], positions=int32[K]>@SERVER,
             metrics@SERVER>)

On a round the server requests readjustment, G is packed on the server
(`pack`: G -> P) and broadcast with the model when clients read it
(congruity_lambda > 0: not FedDST); otherwise only the model is sent, and
the client computation takes no map (a client that readjusts without
guidance reads zero maps it makes itself). The
memory rows are server state throughout: they come back SERVER-placed
(TFF 0.87 has no federated collect; `gather` is one, a concatenating
`tff.federated_aggregate`), the driver keeps them between rounds and takes
the next cohort's rows out of the running sums.

With memory, each client runs one computation (`client_round`: its
training, its memory row and report, tagged with its position) and the
server forms the cohort's masked sums from the rows it gathers (the running
sums are by definition the sums of the remembered rows), instead of a
separate masked sum of the uploads: one client map and one gather per round.
Its server step (`server_update`, a `tff.tensorflow.computation`), with W
the gathered `<rows=<M[K], U[K]>, positions=int32[K]>`:

    (<S, R, W> -> <S, G, R, float32[kernels], float32, int64, int32>)

adds the cohort's new rows (memory `models`: values; `updates`: changes to
the model they were trained from; packed rows are summed packed and
scattered once at the sent masks, `packed_row_sums`) to the running sums
without their old ones, takes the union average (Eq. 5) over every upload
that holds an element, computes the direction map against the previous
global model, re-prunes each kernel by magnitude to its ERK budget, and
reports densities, the fraction of globally inactive weights whose new
direction is non-zero, and the cohort's upload bytes and non-finite
uploads. Without memory the uploads go through `model_aggregator` (a masked
sum) and the server step is `(<S, R> -> <S, G, R, float32[kernels],
float32>)`, or `(<S, R, I> -> ...)` with I the clients' example-weighted
mean of squared gradients in PruneFL's reconfiguration rounds.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import functools
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import tff_measure
from tff_hetero.aggregators import MaskedSumFactory
from tff_hetero.aggregators import MaskedSums
from tff_hetero.aggregators import MaskedWeight
from tff_hetero.aggregators import masked_dp
from tff_hetero.algorithms import cohort_positions
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import model_fns
from tff_hetero.algorithms.sparse import client_update as client_lib
from tff_hetero.algorithms.sparse import prune_grow
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel

# `round_computation(readjust=BY_ROUND)`: the clients' int64 input is the
# round number (from 1), each client's data is one pass (`local_epochs` 1),
# and whether it readjusts at the end of that pass is decided in the graph
# from the round number by the `ReadjustSchedule` (alpha_t keyed on the
# round): a `LearningProcess`'s clients hold no state of their own.
BY_ROUND = "by_round"

# What the server remembers of each client's last upload (`--sgc_memory`).
MEMORIES = collections.OrderedDict(
  models="the client's uploaded values (the paper's literal reading)",
  updates="the client's change to the model it was sent",
  none="nothing: this round's uploads only (FedDST)",
)


class MemoryRows(NamedTuple):
  """The server's record of uploads, one row per client (leading axis).

  Attributes:
    values: Per trainable tensor: the uploaded values (memory `models`) or
      their change to the model the client was sent (`updates`), masked.
    masks: Per masked kernel: uint8 0/1 masks of those uploads.
    weight: float32 aggregation weights (0: no upload remembered).
  """

  values: Any
  masks: Any
  weight: Any


class PackedRow(NamedTuple):
  """A memory row as a round without readjustment returns it.

  In such a round every client keeps the masks it was sent (the global
  model's), so its row is known from the values at those masks: the
  elements of each trainable tensor that the sent model's mask keeps
  (kernels; every element of the other tensors), in row-major order,
  concatenated over the tensors, and the weight. At sparsity 0.8 that is
  about a fifth of the dense row and no mask; the driver restores the
  `MemoryRows` (`unpacked_rows`).

  Attributes:
    values: float32 [kept elements].
    weight: float32 aggregation weight.
  """

  values: Any
  weight: Any


def _kept_elements(layout: masks_lib.MaskLayout, trainable, kernel_masks):
  """Per trainable tensor, the flat positions its mask keeps (NumPy, on
  the driver: every element of an unmasked tensor)."""
  kept = [np.arange(np.size(w)) for w in trainable]
  for kernel, mask in zip(layout.kernels, kernel_masks):
    kept[kernel.trainable_index] = np.flatnonzero(np.ravel(mask))
  return kept


def packed_values(layout: masks_lib.MaskLayout, values, kernel_masks):
  """TF: `PackedRow.values` of `values` (one per trainable tensor) at
  `kernel_masks` (those of the model the client was sent)."""
  masks = full_masks(layout, values, kernel_masks)
  return tf.concat(
    [
      tf.boolean_mask(tf.reshape(v, [-1]), tf.reshape(m, [-1]) > 0)
      for v, m in zip(values, masks)
    ],
    0,
  )


def unpacked_rows(
  layout: masks_lib.MaskLayout, sent: SparseModel, packed: PackedRow
) -> MemoryRows:
  """On the driver (NumPy): the `MemoryRows` of stacked `PackedRow`s whose
  clients were all sent the model `sent` (zeros off its masks, its masks)."""
  values = np.asarray(packed.values, np.float32)
  rows = values.shape[0]
  out, offset = [], 0
  for w, kept in zip(
    sent.trainable, _kept_elements(layout, sent.trainable, sent.masks)
  ):
    dense = np.zeros((rows, np.size(w)), np.float32)
    dense[:, kept] = values[:, offset : offset + kept.size]
    offset += kept.size
    out.append(dense.reshape((rows,) + np.shape(w)))
  if offset != values.shape[1]:
    raise ValueError(
      f"packed memory rows hold {values.shape[1]} values, the sent model's"
      f" masks keep {offset}"
    )
  masks = [
    np.repeat((np.asarray(m) > 0).astype(np.uint8)[None], rows, axis=0)
    for m in sent.masks
  ]
  return MemoryRows(
    values=out, masks=masks, weight=np.asarray(packed.weight, np.float32)
  )


_spec = learning_process.tensor_spec


def empty_memory(initial: SparseModel, rows: int) -> MemoryRows:
  """`rows` rows that remember nothing (weight 0), as NumPy arrays."""
  return MemoryRows(
    values=[
      np.zeros((rows,) + np.shape(w), np.float32) for w in initial.trainable
    ],
    masks=[np.zeros((rows,) + np.shape(m), np.uint8) for m in initial.masks],
    weight=np.zeros((rows,), np.float32),
  )


def full_masks(layout: masks_lib.MaskLayout, trainable, kernel_masks):
  """One float32 mask per trainable tensor: the kernel's, ones elsewhere."""
  out = [tf.ones_like(w) for w in trainable]
  for kernel, mask in zip(layout.kernels, kernel_masks):
    out[kernel.trainable_index] = tf.cast(mask, tf.float32)
  return out


def row_sums(layout: masks_lib.MaskLayout, rows: MemoryRows) -> MaskedSums:
  """sum_k n_k m_k v_k and sum_k n_k m_k over the rows (leading axis)."""
  weight = rows.weight
  kernel_of = {k.trainable_index: j for j, k in enumerate(layout.kernels)}
  weighted, counts = [], []
  for i, values in enumerate(rows.values):
    shape = [-1] + [1] * (len(values.shape) - 1)
    n = tf.reshape(weight, shape)
    if i in kernel_of:
      m = tf.cast(rows.masks[kernel_of[i]], tf.float32)
    else:
      m = tf.ones_like(values)
    weighted.append(tf.reduce_sum(n * m * values, axis=0))
    counts.append(tf.reduce_sum(n * m, axis=0))
  return MaskedSums(weighted, counts)


def packed_row_sums(
  layout: masks_lib.MaskLayout, sent: SparseModel, rows: PackedRow
) -> MaskedSums:
  """TF: `row_sums` of stacked `PackedRow`s whose clients were all sent the
  model `sent`: the weighted sum of the packed values, scattered once at
  the sent masks; the weights' sum wherever a mask keeps an element."""
  packed = tf.linalg.matvec(rows.values, rows.weight, transpose_a=True)
  total = tf.reduce_sum(rows.weight)
  masks = full_masks(layout, sent.trainable, sent.masks)
  kept = [tf.where(tf.reshape(m, [-1]) > 0) for m in masks]
  pieces = tf.split(packed, [tf.shape(k)[0] for k in kept])
  weighted = [
    tf.reshape(
      tf.scatter_nd(k, piece, [tf.size(m, out_type=tf.int64)]), tf.shape(m)
    )
    for k, piece, m in zip(kept, pieces, masks)
  ]
  return MaskedSums(weighted, [total * m for m in masks])


def without_rows(
  layout: masks_lib.MaskLayout, running: MaskedSums, rows: MemoryRows
) -> MaskedSums:
  """On the driver (NumPy in and out): the running sums less the
  contributions of `rows` (the round's argument R, module docstring).

  `row_sums` in NumPy: on the driver, TensorFlow's eager ops cost more than
  the arithmetic (about 60 small ops a round)."""
  weight = np.asarray(rows.weight, np.float32)
  kernel_of = {k.trainable_index: j for j, k in enumerate(layout.kernels)}
  weighted, counts = [], []
  for i, (values, total, count) in enumerate(
    zip(rows.values, running.weighted_sum, running.weight_sum)
  ):
    values = np.asarray(values, np.float32)
    n = weight.reshape((-1,) + (1,) * (values.ndim - 1))
    if i in kernel_of:
      nm = n * np.asarray(rows.masks[kernel_of[i]], np.float32)
    else:
      nm = np.broadcast_to(n, values.shape)
    weighted.append(np.asarray(total, np.float32) - (nm * values).sum(axis=0))
    counts.append(np.asarray(count, np.float32) - nm.sum(axis=0))
  return MaskedSums(weighted, counts)


def server_aggregate(
  layout: masks_lib.MaskLayout,
  keep: Sequence[int],
  memory: str,
  model: SparseModel,
  sums: MaskedSums,
  importance=None,
  reconfigure=None,
):
  """Union average, direction map and re-prune (module docstring).

  With `importance` (per kernel) and `reconfigure` (PruneFL), the new masks
  are `reconfigure(importance)` instead of the magnitude re-prune: weights
  it adds that no upload held start at zero.

  Returns (new `SparseModel`, direction maps, per-kernel densities, the
  fraction of inactive weights of the new model whose direction is non-zero).
  """
  chosen = reconfigure(list(importance)) if importance is not None else None
  trainable, directions, new_masks = [], [], []
  kernel_of = {k.trainable_index: j for j, k in enumerate(layout.kernels)}
  for i, (previous, weighted, counts) in enumerate(
    zip(model.trainable, sums.weighted_sum, sums.weight_sum)
  ):
    average, held = prune_grow.union_average(weighted, counts)
    if memory == "updates":
      candidate = tf.where(held, previous + average, tf.zeros_like(average))
    else:
      candidate = average
    if i not in kernel_of:  # Dense: nobody trained it -> keep it.
      trainable.append(tf.where(held, candidate, previous))
      continue
    j = kernel_of[i]
    directions.append(prune_grow.direction_map(candidate, held, previous))
    if chosen is None:
      # No upload holds any of the kernel (every client of the round sent
      # nothing, and nothing is remembered): keep the kernel and its mask
      # instead of re-pruning to nothing.
      anything = tf.reduce_any(held)
      mask = tf.where(
        anything,
        prune_grow.reprune(candidate, held, keep[j]),
        tf.cast(model.masks[j], tf.float32),
      )
      value = tf.where(anything, candidate * mask, previous)
    else:
      mask = tf.cast(chosen[j], tf.float32)
      value = candidate * mask
    new_masks.append(mask)
    trainable.append(value)
  inactive = [1.0 - m for m in new_masks]
  informed = tf.add_n(
    [
      tf.reduce_sum(i * tf.cast(tf.not_equal(d, 0), tf.float32))
      for i, d in zip(inactive, directions)
    ]
  )
  inactive_total = tf.add_n([tf.reduce_sum(i) for i in inactive])
  density = [tf.reduce_mean(m) for m in new_masks]
  new_model = SparseModel(
    trainable=trainable, masks=new_masks, statistics=list(model.statistics)
  )
  return (
    new_model,
    directions,
    density,
    tf.math.divide_no_nan(informed, inactive_total),
  )


class SparseRounds:
  """Builds and caches the round computations of one sparse model.

  Args:
    keras_fn: Builds the *wrapped* Keras model (`masks.prune_wrap`).
    element_spec: One batch of client data.
    initial: A `SparseModel` of NumPy arrays (for the types).
    keep: Weights each masked kernel keeps (its ERK budget).
    client_optimizer: A `tff.learning.optimizers.Optimizer`.
    prox_mu: FedProx strength of the local objective.
    local_epochs: Epochs per round (to find epoch boundaries).
    schedule: The `prune_grow.ReadjustSchedule`.
    congruity_lambda: Share of each prune/grow guided by congruity.
    memory: A `MEMORIES` key.
    model_aggregator: The unweighted-sum-based factory that forms the masked
      sums (default `MaskedSumFactory()`); memory `none` only (with memory
      the server sums the remembered rows).
    reconfigure: PruneFL's server mask rule, a TF function of the per-kernel
      importance (the clients' example-weighted mean) returning the new
      per-kernel masks; used on rounds built with `importance=True`.
    growth_gradient: `client_update.GROWTH_GRADIENTS` entry.
    loss_fn / metrics_fn: No-arg factories of the training loss and the
      metrics (None: cross-entropy on logits and accuracy,
      `model_fns.default_loss_fn` / `default_metrics_fn`).
  """

  def __init__(
    self,
    keras_fn,
    element_spec,
    initial: SparseModel,
    keep: Sequence[int],
    client_optimizer,
    *,
    prox_mu: float,
    local_epochs: int,
    schedule: prune_grow.ReadjustSchedule,
    congruity_lambda: float,
    memory: str,
    model_aggregator=None,
    reconfigure=None,
    growth_gradient: str = "accumulated",
    loss_fn=None,
    metrics_fn=None,
  ):
    if memory not in MEMORIES:
      raise ValueError(
        f"memory must be one of {list(MEMORIES)}, got {memory!r}"
      )
    self._keras_fn = keras_fn
    self._element_spec = element_spec
    self._keep = tuple(int(k) for k in keep)
    self._optimizer = client_optimizer
    self._client_settings = dict(
      prox_mu=float(prox_mu),
      local_epochs=int(local_epochs),
      schedule=schedule,
      congruity_lambda=float(congruity_lambda),
      growth_gradient=growth_gradient,
      loss_fn=loss_fn,
    )
    self._metrics_fn = metrics_fn
    # The direction maps go out only if clients read them (lambda > 0).
    self.sends_directions = float(congruity_lambda) > 0
    self._memory = memory
    if model_aggregator is not None and memory != "none":
      raise ValueError(
        "model_aggregator applies only without server memory: the server"
        " sums the remembered rows themselves"
      )
    self._aggregator = model_aggregator or MaskedSumFactory()
    self._reconfigure = reconfigure
    with tf.Graph().as_default():
      self.layout = masks_lib.MaskLayout.of(keras_fn())
    self.model_type = learning_process.type_of(initial)
    self.directions_type = learning_process.type_of(
      [tf.TensorSpec(np.shape(m), tf.int8) for m in initial.masks]
    )
    self.packed_type = learning_process.type_of(
      [
        tf.TensorSpec([prune_grow.packed_ternary_size(np.shape(m))], tf.uint8)
        for m in initial.masks
      ]
    )
    self.sums_type = learning_process.type_of(
      MaskedSums(
        [_spec(w) for w in initial.trainable],
        [_spec(w) for w in initial.trainable],
      )
    )
    self.data_type = tff.SequenceType(
      tff.types.tensorflow_to_type(element_spec)
    )
    self._rounds = {}
    self._bodies = {}
    # The server step of each kind of round built so far (for benchmarks).
    self.server_steps = {}

  @property
  def client_optimizer(self):
    return self._optimizer

  @property
  def remembers(self) -> bool:
    return self._memory != "none"

  def zero_sums(self, initial: SparseModel) -> MaskedSums:
    zeros = [np.zeros_like(np.asarray(w)) for w in initial.trainable]
    return MaskedSums(zeros, [z.copy() for z in zeros])

  def zero_directions(self, initial: SparseModel) -> list:
    return [np.zeros(np.asarray(m).shape, np.int8) for m in initial.masks]

  def model_fn(self, masks_in_call: bool = True):
    """The wrapped model as a `tff.learning.models.VariableModel`; with
    `masks_in_call` False its wrappers do not apply the masks before each
    forward pass (for `client_update.MaskedTraining`, which keeps masked
    weights at zero itself)."""

    def keras_fn():
      keras_model = self._keras_fn()
      masks_lib.apply_masks_in_call(keras_model, masks_in_call)
      return keras_model

    return model_fns.variable_model_fn(
      keras_fn,
      self._element_spec,
      self._client_settings["loss_fn"],
      self._metrics_fn,
    )()

  def packs_rows(self, readjust, importance: bool = False) -> bool:
    """Whether `round_computation(readjust, importance)` returns its memory
    rows as `PackedRow`s (with memory, in rounds without readjustment:
    every client keeps the masks it was sent)."""
    return self.remembers and not readjust and not importance

  def round_body(self, readjust, importance: bool = False):
    """The Python body of `round_computation(readjust, importance)`, to call
    inside another `tff.federated_computation` (without memory `positions`
    may be None: then no per-client result is gathered)."""
    self.round_computation(readjust, importance)
    return self._bodies[self._kind(readjust, importance)]

  @staticmethod
  def _kind(readjust, importance):
    return (
      readjust if readjust == BY_ROUND else bool(readjust),
      bool(importance),
    )

  def round_computation(
    self, readjust, importance: bool = False
  ) -> tff.Computation:
    """The round of the module docstring (cached per kind).

    `readjust`: False, True (the server requested readjustment this round),
    or `BY_ROUND` (the clients decide from the round number they receive as
    their int64 input; `local_epochs` must be 1 and no direction map is
    sent).
    `importance`: clients also upload their squared-gradient sums, the server
    averages them (by examples) and sets the masks with `reconfigure`; the
    round then has `importance@SERVER` among its metrics' inputs to the
    server step (PruneFL).
    """
    kind = self._kind(readjust, importance)
    if kind in self._rounds:
      return self._rounds[kind]
    if importance and (self._reconfigure is None or self.remembers):
      raise ValueError(
        "importance rounds need a reconfigure rule and no server memory"
      )
    by_round = readjust == BY_ROUND
    if by_round and (
      self.sends_directions or self._client_settings["local_epochs"] != 1
    ):
      raise ValueError(
        "rounds that readjust by round number need congruity_lambda 0 and"
        " local_epochs 1"
      )
    schedule = self._client_settings["schedule"]
    layout, keep, memory = self.layout, self._keep, self._memory
    optimizer, model_fn = self._optimizer, self.model_fn
    sends_directions = self.sends_directions
    reconfigure = self._reconfigure
    settings = dict(
      self._client_settings, readjust=bool(readjust), importance=importance
    )
    shapes = [k.shape for k in layout.kernels]

    with tf.Graph().as_default():
      metrics_aggregate = tff_measure.measured_metrics_aggregator()(
        model_fn().metric_finalizers()
      )

    packs_rows = self.packs_rows(readjust, importance)
    # Only rounds that readjust with guidance send the direction maps; the
    # other rounds' client computations take no such argument (the zero
    # maps they would read are made on the client, and nothing travels).
    takes_directions = bool(readjust) and sends_directions
    # The client computations' types: the model, [the packed maps,] the
    # clock and the data.
    client_types = (
      (self.model_type, self.packed_type)
      if takes_directions
      else (self.model_type,)
    ) + (np.int64, self.data_type)

    def client_computation(fn, *more_types):
      """`fn(received, packed or None, clock, data[, more])` as a TF
      computation of `client_types + more_types`, with at most one more
      type (TFF takes no varargs, so each arity is spelled out)."""
      if len(more_types) > 1:
        raise ValueError(f"at most one more type, got {more_types}")
      if takes_directions:
        return tff.tensorflow.computation(fn, *client_types, *more_types)
      if more_types:

        def without_maps(received, clock, data, more):
          return fn(received, None, clock, data, more)
      else:

        def without_maps(received, clock, data):
          return fn(received, None, clock, data)

      return tff.tensorflow.computation(
        without_maps, *client_types, *more_types
      )

    def work(received, packed, clock, data):
      """`clock`: cumulative epochs before this round (`BY_ROUND`: the
      round number)."""
      update = client_lib.build_client_update(
        functools.partial(model_fn, masks_in_call=False), layout, **settings
      )
      if packed is None:
        directions = [tf.zeros(s, tf.float32) for s in shapes]
      else:
        directions = [
          prune_grow.unpack_ternary(p, s) for p, s in zip(packed, shapes)
        ]
      received = SparseModel(*received)
      if by_round:
        return update(
          optimizer,
          received,
          directions,
          clock - 1,
          data,
          requested=schedule.requested(clock),
        )
      return update(optimizer, received, directions, clock, data)

    def value_of(upload, received):
      """What the masked sum adds up (values, or changes for `updates`)."""
      if memory == "updates":
        masks = full_masks(layout, upload.trainable, upload.masks)
        return [
          (w - w0) * m
          for w, w0, m in zip(upload.trainable, received.trainable, masks)
        ]
      return list(upload.trainable)

    def row_of(value, upload, received):
      """The client's memory row (module docstring)."""
      if not packs_rows:
        return MemoryRows(
          values=list(value),
          masks=[tf.cast(m, tf.uint8) for m in upload.masks],
          weight=upload.weight,
        )
      # Packing at the sent masks holds only if the client kept them.
      kept = tf.debugging.assert_equal(
        tf.reduce_sum(upload.mask_sent),
        0.0,
        message="a client changed its masks in a round without readjustment",
      )
      with tf.control_dependencies([kept]):
        return PackedRow(
          values=packed_values(layout, list(value), received.masks),
          weight=tf.identity(upload.weight),
        )

    if self.remembers:

      def client_round_fn(received, packed, clock, data, position):
        """Memory rounds: the client's work, its memory row and report (its
        `gather` row, with its position), its counts and metrics, in one
        computation."""
        upload, report, counts, metrics = work(received, packed, clock, data)
        row = row_of(value_of(upload, received), upload, received)
        gathered = cohort_positions.as_gathered_row((row, report), position)
        return gathered, counts, metrics

      client_round = client_computation(
        client_round_fn, cohort_positions.POSITION_TYPE
      )
    else:
      client_work = client_computation(work)
      upload_type = client_work.type_signature.result[0]
      to_value = tff.tensorflow.computation(
        value_of, upload_type, self.model_type
      )

      @tff.tensorflow.computation(upload_type)
      def to_weight(upload):
        return MaskedWeight(
          upload.weight, full_masks(layout, upload.trainable, upload.masks)
        )

      aggregator = self._aggregator.create(
        to_value.type_signature.result, to_weight.type_signature.result
      )
      masked_dp.check_masked_sums(aggregator)

    packed_type = self.packed_type

    @tff.tensorflow.computation(self.directions_type)
    def pack(directions):
      return [prune_grow.pack_ternary(d) for d in directions]

    distributor = tff_measure.build_measured_broadcast_process(
      self.model_type,
      nbytes_fn=lambda model: client_lib.model_nbytes(
        layout, SparseModel(*model)
      ),
    )
    directions_distributor = tff_measure.build_measured_broadcast_process(
      packed_type
    )  # Dense uint8: exactly the packed bytes.
    sums_type = self.sums_type

    def aggregate(model, sums, importance=None):
      new_model, directions, density, informed = server_aggregate(
        layout,
        keep,
        memory,
        SparseModel(*model),
        MaskedSums(*sums),
        importance,
        reconfigure if importance is not None else None,
      )
      return new_model, directions, sums, density, informed

    if importance:

      @tff.tensorflow.computation(
        self.model_type, sums_type, upload_type.importance
      )
      def server_update(model, new, importance_mean):
        return aggregate(model, new, importance_mean)
    elif memory == "none":

      @tff.tensorflow.computation(self.model_type, sums_type)
      def server_update(model, new):
        return aggregate(model, new)
    else:
      gathered_type = cohort_positions.concatenated_type(
        client_round.type_signature.result[0]
      )

      @tff.tensorflow.computation(self.model_type, sums_type, gathered_type)
      def server_update(model, others, gathered):
        """Adds the cohort's new rows (`gathered`) to the running sums of
        the others, aggregates, and sums the cohort's reports."""
        model = SparseModel(*model)
        rows, reports = gathered.rows
        if packs_rows:
          new = packed_row_sums(layout, model, PackedRow(*rows))
        else:
          new = row_sums(layout, MemoryRows(*rows))
        total = tf.nest.map_structure(
          lambda o, n: o + n, MaskedSums(*others), new
        )
        return aggregate(model, total) + (
          tf.reduce_sum(reports.upload_bytes),
          tf.reduce_sum(reports.non_finite),
        )

    self.server_steps[kind] = server_update

    @tff.tensorflow.computation
    def no_counts():
      return prune_grow.ReadjustCounts.zeros()

    def readjust_counts(counts):
      """The clients' summed `ReadjustCounts`; zeros from the server in a
      round built without readjustment (a client cannot readjust then, and
      a sum over the clients would cost a call per client)."""
      if readjust:
        return tff.federated_sum(counts)
      return tff.federated_eval(no_counts, tff.SERVER)

    def body(model, directions, others, epochs, data, positions):
      delivered = distributor.next(distributor.initialize(), model)
      measurements = collections.OrderedDict(distributor=delivered.measurements)
      if takes_directions:
        sent = directions_distributor.next(
          directions_distributor.initialize(),
          tff.federated_map(pack, directions),
        )
        measurements["directions_distributor"] = sent.measurements
        client_directions = (sent.result,)
      else:  # Nothing but the model is sent.
        client_directions = ()
      if memory != "none":
        return remembering_body(
          model,
          others,
          data,
          positions,
          measurements,
          delivered,
          client_directions,
          epochs,
        )
      uploads, reports, counts, metrics = tff.federated_map(
        client_work, (delivered.result, *client_directions, epochs, data)
      )
      values = tff.federated_map(to_value, (uploads, delivered.result))
      aggregated = aggregator.next(
        aggregator.initialize(), values, tff.federated_map(to_weight, uploads)
      )
      if importance:
        mean_importance = tff.federated_mean(
          tff.federated_map(
            tff.tensorflow.computation(lambda u: u.importance, upload_type),
            uploads,
          ),
          weight=tff.federated_map(
            tff.tensorflow.computation(lambda u: u.weight, upload_type), uploads
          ),
        )
        server_inputs = (model, aggregated.result, mean_importance)
      else:
        server_inputs = (model, aggregated.result)
      new_model, new_directions, sums, density, informed = tff.federated_map(
        server_update, server_inputs
      )
      measurements["train"] = metrics_aggregate(metrics)
      measurements["readjust"] = readjust_counts(counts)
      measurements["upload_bytes"] = tff.federated_sum(
        tff.federated_map(
          tff.tensorflow.computation(
            lambda r: r.upload_bytes, reports.type_signature.member
          ),
          reports,
        )
      )
      measurements["non_finite_updates"] = tff.federated_sum(
        tff.federated_map(
          tff.tensorflow.computation(
            lambda r: r.non_finite, reports.type_signature.member
          ),
          reports,
        )
      )
      measurements["density"] = density
      measurements["direction_informed"] = informed
      # Each client's report, stacked at the server by cohort position
      # (`cohort_positions.gather`).
      if positions is None:
        received = None
      else:
        received = cohort_positions.gather(reports, positions)
      return (
        new_model,
        new_directions,
        sums,
        received,
        tff.federated_zip(measurements),
      )

    def remembering_body(
      model,
      others,
      data,
      positions,
      measurements,
      delivered,
      client_directions,
      epochs,
    ):
      # With memory the running sums are the sums of the memory rows, so the
      # server forms them from the cohort's new rows (which it receives
      # anyway) instead of a separate masked sum of the uploads; the
      # reports are summed there too. One client computation, one gather.
      if positions is None:
        raise ValueError("a round with server memory gathers its rows")
      gathered, counts, metrics = tff.federated_map(
        client_round,
        (delivered.result, *client_directions, epochs, data, positions),
      )
      received = cohort_positions.concatenated(gathered)
      (
        new_model,
        new_directions,
        sums,
        density,
        informed,
        upload_bytes,
        non_finite,
      ) = tff.federated_map(server_update, (model, others, received))
      measurements["train"] = metrics_aggregate(metrics)
      measurements["readjust"] = readjust_counts(counts)
      measurements["upload_bytes"] = upload_bytes
      measurements["non_finite_updates"] = non_finite
      measurements["density"] = density
      measurements["direction_informed"] = informed
      return (
        new_model,
        new_directions,
        sums,
        received,
        tff.federated_zip(measurements),
      )

    self._bodies[kind] = body

    model_at = tff.FederatedType(self.model_type, tff.SERVER)
    directions_at = tff.FederatedType(self.directions_type, tff.SERVER)
    epochs_at = tff.FederatedType(np.int64, tff.CLIENTS)
    data_at = tff.FederatedType(self.data_type, tff.CLIENTS)
    if self.remembers:

      @tff.federated_computation(
        model_at,
        directions_at,
        tff.FederatedType(sums_type, tff.SERVER),
        epochs_at,
        data_at,
        cohort_positions.POSITIONS_AT_CLIENTS,
      )
      def sparse_round(model, directions, others, epochs, data, positions):
        return body(model, directions, others, epochs, data, positions)
    else:

      @tff.federated_computation(
        model_at,
        directions_at,
        epochs_at,
        data_at,
        cohort_positions.POSITIONS_AT_CLIENTS,
      )
      def sparse_round(model, directions, epochs, data, positions):
        new_model, new_directions, _, received, measurements = body(
          model, directions, None, epochs, data, positions
        )
        return new_model, new_directions, received, measurements

    self._rounds[kind] = sparse_round
    return sparse_round
