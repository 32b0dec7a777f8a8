"""Dynamic sparse training, layer 1: the mask arithmetic in pure TensorFlow.

Everything here is a TF function of tensors (usable eagerly, inside
`tf.function`s and inside `tff.tensorflow.computation`s) with no TFF and no
Keras: the readjustment schedule, FedSGC's congruity-guided prune-and-grow
of one kernel, the server's union average, re-prune and direction map, and
the wire encodings whose sizes the accounting measures.

References: FedSGC ("Gradient-Congruity Guided Federated Sparse Training",
Section 3), FedDST (Bibikar et al., AAAI 2022), RigL (Evci et al., ICML 2020).
The reading of each step, where the papers leave it open, is stated in
`tff_hetero/algorithms/sparse/fedsgc.py`.

(`tf.equal`/`tf.greater`, never `==`/`>` on tensors that may be symbolic: in
a graph TFF traces, `tensor == 0` is Python identity, not a comparison.)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import attrs
import numpy as np
import tensorflow as tf

from tff_hetero.submodels import masks as masks_lib

# --------------------------------------------------------------------------
# The readjustment schedule (client side, keyed on cumulative epochs).


@attrs.frozen
class ReadjustSchedule:
  """When clients readjust their masks, and by how much.

  FedSGC Section 3.1: the server requests readjustment on rounds
  1, 1 + `request_every`, ... up to `request_end_round`; a requested client
  readjusts after each of its cumulative training epochs t (counted over all
  rounds it took part in) with t >= `begin_epoch`, (t - begin_epoch) a
  multiple of `delta_epochs` and t < `end_epoch` (E_end), pruning the
  fraction alpha_t = `alpha` / 2 (1 + cos(pi t / E_end)) of each kernel's
  active weights.

  Attributes:
    alpha: Initial prune fraction of the cosine schedule (0: never readjust).
    delta_epochs: Epochs between two readjustments of one client (Delta).
    begin_epoch: The first cumulative epoch after which a client readjusts.
    end_epoch: E_end: no readjustment at or after it; alpha_t reaches 0 there.
    request_every: The server requests readjustment every this many rounds
      (0: never).
    request_end_round: The last round the server requests it (0: no limit).
  """

  alpha: float
  delta_epochs: int
  begin_epoch: int
  end_epoch: int
  request_every: int = 1
  request_end_round: int = 0

  def __attrs_post_init__(self):
    if not 0.0 <= self.alpha <= 1.0:
      raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
    for name in ("delta_epochs", "begin_epoch", "end_epoch"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.request_every < 0 or self.request_end_round < 0:
      raise ValueError("request_every and request_end_round must be >= 0")

  def requested(self, round_num):
    """Whether the server requests readjustment in `round_num` (from 1; a
    Python int, or an int64 tensor for a decision made in the graph)."""
    if self.request_every == 0 or self.alpha == 0.0:
      return (
        False
        if isinstance(round_num, (int, np.integer))
        else tf.constant(False)
      )
    if isinstance(round_num, (int, np.integer)):
      if self.request_end_round and round_num > self.request_end_round:
        return False
      return (round_num - 1) % self.request_every == 0
    r = tf.cast(round_num, tf.int64)
    within = (
      tf.less_equal(r, self.request_end_round)
      if self.request_end_round
      else tf.constant(True)
    )
    return tf.logical_and(
      tf.logical_and(within, tf.greater_equal(r, 1)),
      tf.equal(tf.math.floormod(r - 1, self.request_every), 0),
    )

  def due(self, epochs_done):
    """Whether a client readjusts after its cumulative epoch `epochs_done`
    (a Python int or an int64 tensor)."""
    if isinstance(epochs_done, (int, np.integer)):
      return (
        self.alpha > 0
        and self.begin_epoch <= epochs_done < self.end_epoch
        and (epochs_done - self.begin_epoch) % self.delta_epochs == 0
      )
    t = tf.cast(epochs_done, tf.int64)
    return tf.logical_and(
      tf.logical_and(
        tf.constant(self.alpha > 0), tf.greater_equal(t, self.begin_epoch)
      ),
      tf.logical_and(
        tf.less(t, self.end_epoch),
        tf.equal(tf.math.floormod(t - self.begin_epoch, self.delta_epochs), 0),
      ),
    )

  def prune_fraction(self, epochs_done):
    """alpha_t at cumulative epoch t (Python float or float32 tensor)."""
    if isinstance(epochs_done, (int, np.integer)):
      if epochs_done >= self.end_epoch:
        return 0.0
      return (
        self.alpha
        / 2.0
        * (1.0 + math.cos(math.pi * epochs_done / self.end_epoch))
      )
    t = tf.cast(epochs_done, tf.float32)
    fraction = self.alpha / 2.0 * (1.0 + tf.cos(np.pi * t / self.end_epoch))
    return tf.where(t < self.end_epoch, fraction, 0.0)


# --------------------------------------------------------------------------
# The client's prune-and-grow of one kernel.


class ReadjustCounts(NamedTuple):
  """What readjustments did, summed over kernels (and clients, events).

  Attributes:
    readjusts: Readjustment events (one per client and due epoch).
    prune_fraction: Sum of alpha_t over the events.
    pruned: Weights pruned (k per kernel).
    pruned_incongruent: Of those, pruned from the incongruent set first.
    grow_candidates: Inactive weights after pruning (growth candidates).
    candidates_with_direction: Of those, weights whose global direction is
      non-zero (where guided growth has any information).
    grown: Weights grown (as many as pruned).
    grown_congruent: Of those, grown from the congruent set first.
    grown_new: Grown weights that were inactive before the pruning (they
      start at zero; the rest were just pruned and keep their value).
    gradient_examples: Examples of the batches whose loss gradient was
      computed again for growth (compute beyond the training passes).
  """

  readjusts: tf.Tensor
  prune_fraction: tf.Tensor
  pruned: tf.Tensor
  pruned_incongruent: tf.Tensor
  grow_candidates: tf.Tensor
  candidates_with_direction: tf.Tensor
  grown: tf.Tensor
  grown_congruent: tf.Tensor
  grown_new: tf.Tensor
  gradient_examples: tf.Tensor

  @classmethod
  def zeros(cls) -> "ReadjustCounts":
    return cls(*[tf.constant(0.0)] * len(cls._fields))

  def __add__(self, other):  # Field-wise, not tuple concatenation.
    return ReadjustCounts(*[a + b for a, b in zip(self, other)])


def _count(mask) -> tf.Tensor:
  return tf.reduce_sum(tf.cast(mask, tf.float32))


def readjust_mask(
  mask,
  weight_now,
  weight_received,
  loss_gradient,
  direction,
  prune_fraction,
  congruity_lambda,
):
  """FedSGC's prune-and-grow of one kernel (Section 3.2).

  With n active weights and k = floor(prune_fraction x n):

  * prune k active weights: first, among those whose local pseudo-gradient
    sign(weight_now - weight_received) opposes the global `direction`, the
    floor(congruity_lambda x k) smallest |w| (Eq. 1); the rest by smallest
    |w| among the remaining active ones (Eq. 2);
  * grow k weights among those inactive after the pruning (a weight just
    pruned may come back, as in RigL, so a dense layer stays dense): first,
    among those whose learning direction -sign(loss_gradient) agrees with
    `direction`, the floor(congruity_lambda x k) with the largest |gradient|
    (Eq. 3); the rest by largest |gradient| (Eq. 4).

  A weight whose direction is 0 is neither congruent nor incongruent.
  congruity_lambda = 0 is RigL's (and FedDST's) rule.

  Returns:
    (new 0/1 float32 mask, newly active 0/1 mask (grown weights that were
    inactive before the pruning: they start at zero), `ReadjustCounts` with
    one event).
  """
  mask = tf.cast(mask, tf.float32)
  active = tf.greater(mask, 0.0)
  n_active = tf.reduce_sum(mask)
  k = tf.cast(
    tf.floor(tf.cast(prune_fraction, tf.float32) * n_active), tf.int32
  )
  k_guided = tf.cast(
    tf.floor(congruity_lambda * tf.cast(k, tf.float32)), tf.int32
  )
  direction = tf.cast(direction, tf.float32)
  magnitude = tf.abs(tf.cast(weight_now, tf.float32))
  # Prune: against the global direction first, then by magnitude.
  local_direction = tf.sign(
    tf.cast(weight_now, tf.float32) - tf.cast(weight_received, tf.float32)
  )
  incongruent = tf.logical_and(
    active, tf.less(local_direction * direction, 0.0)
  )
  pruned_guided = masks_lib.top_k_mask(-magnitude, k_guided, incongruent)
  rest = k - tf.cast(tf.reduce_sum(pruned_guided), tf.int32)
  pruned = pruned_guided + masks_lib.top_k_mask(
    -magnitude, rest, tf.logical_and(active, tf.equal(pruned_guided, 0.0))
  )
  # Grow as many among the inactive after pruning (just-pruned included).
  candidates = tf.equal(mask - pruned, 0.0)
  gradient = tf.cast(loss_gradient, tf.float32)
  grad_magnitude = tf.abs(gradient)
  congruent = tf.logical_and(
    candidates, tf.greater(-tf.sign(gradient) * direction, 0.0)
  )
  grown_guided = masks_lib.top_k_mask(grad_magnitude, k_guided, congruent)
  rest = tf.cast(tf.reduce_sum(pruned), tf.int32) - tf.cast(
    tf.reduce_sum(grown_guided), tf.int32
  )
  grown = grown_guided + masks_lib.top_k_mask(
    grad_magnitude,
    rest,
    tf.logical_and(candidates, tf.equal(grown_guided, 0.0)),
  )
  new_mask = mask - pruned + grown
  newly_active = grown * (1.0 - mask)
  counts = ReadjustCounts(
    readjusts=tf.constant(1.0),
    prune_fraction=tf.cast(prune_fraction, tf.float32),
    pruned=tf.reduce_sum(pruned),
    pruned_incongruent=tf.reduce_sum(pruned_guided),
    grow_candidates=_count(candidates),
    candidates_with_direction=_count(
      tf.logical_and(candidates, tf.not_equal(direction, 0.0))
    ),
    grown=tf.reduce_sum(grown),
    grown_congruent=tf.reduce_sum(grown_guided),
    grown_new=tf.reduce_sum(newly_active),
    gradient_examples=tf.constant(0.0),
  )
  return new_mask, newly_active, counts


# --------------------------------------------------------------------------
# The server: union average, re-prune, direction map.


def union_average(weighted_sum, weight_sum):
  """Per element, sum n m w / sum n m over the uploads holding it (Eq. 5),
  and where some upload holds it (the OR of the masks)."""
  held = tf.greater(weight_sum, 0.0)
  return tf.math.divide_no_nan(weighted_sum, weight_sum), held


def reprune(values, held, keep):
  """The `keep` largest |values| among `held` (all of them if fewer): the
  server's magnitude re-prune back to the kernel's budget; 0/1 mask."""
  return masks_lib.top_k_mask(tf.abs(values), keep, held)


# A change smaller than this, relative to the larger of the two values and
# the kernel's mean magnitude, is no change: the server's running sums
# subtract and add float32 rows, so a value nobody moved comes back within
# rounding of where it was (even of 0).
DIRECTION_TOLERANCE = 1e-5


def direction_map(candidate, held, previous):
  """sign(candidate - previous) where some upload held the element and the
  change exceeds `DIRECTION_TOLERANCE` times max(|candidate|, |previous|,
  the kernel's mean |previous|), else 0; int8. `candidate` is the server's
  aggregate before the global re-prune (over the union of the masks) and
  `previous` the last global model."""
  change = candidate - previous
  scale = tf.maximum(
    tf.maximum(tf.abs(candidate), tf.abs(previous)),
    tf.reduce_mean(tf.abs(previous)),
  )
  moved = tf.logical_and(held, tf.abs(change) > DIRECTION_TOLERANCE * scale)
  return tf.cast(
    tf.where(moved, tf.sign(change), tf.zeros_like(change)), tf.int8
  )


# --------------------------------------------------------------------------
# Wire encodings.


def pack_ternary(values) -> tf.Tensor:
  """A {-1, 0, 1} tensor as 2-bit codes, four per byte: uint8[ceil(n / 4)].

  Codes: 0 -> 0, +1 -> 1, -1 -> 2; element i sits in bits 2 (i mod 4) of
  byte i // 4.
  """
  flat = tf.reshape(tf.cast(values, tf.int32), [-1])
  codes = tf.where(tf.less(flat, 0), 2, flat)
  n = tf.size(codes)
  codes = tf.pad(codes, [[0, (4 - n % 4) % 4]])
  codes = tf.reshape(codes, [-1, 4])
  packed = tf.reduce_sum(codes * tf.constant([1, 4, 16, 64]), axis=1)
  return tf.cast(packed, tf.uint8)


def unpack_ternary(packed, shape) -> tf.Tensor:
  """Inverse of `pack_ternary`: float32 {-1, 0, 1} of `shape`."""
  size = int(np.prod(shape))
  codes = tf.math.floormod(
    tf.bitwise.right_shift(
      tf.expand_dims(tf.cast(packed, tf.int32), 1), tf.constant([0, 2, 4, 6])
    ),
    4,
  )
  codes = tf.reshape(codes, [-1])[:size]
  values = tf.where(tf.equal(codes, 2), -1.0, tf.cast(codes, tf.float32))
  return tf.reshape(values, shape)


def packed_ternary_size(shape) -> int:
  return -(-int(np.prod(shape)) // 4)
