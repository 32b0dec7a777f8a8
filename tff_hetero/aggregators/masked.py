"""Masked weighted sums: aggregation of values each client holds only in part.

Width sub-models (HeteroFL, AdaptiveFL), sparse masks (FedSGC, FedDST) and
selected channels (SPATL) all send the server values that cover part of the
model. AdaptiveFL's Algorithm 2 (Jia et al., DAC 2024) aggregates them per
element: with n_c the client's weight (the examples it trained on, i.e. its
data size times its local epochs) and m_c its mask,

    sum_c n_c * m_c * v_c   and   sum_c n_c * m_c,

then divides where the second sum is positive and keeps the previous value
where no client covered the element.

`MaskedSumFactory` is a `tff.aggregators.WeightedAggregationFactory` computing
the two sums. The mask rides in the WEIGHT, never in the value, so TFF's
clipping and zeroing factories, which transform only the value and pass the
weight through, wrap it unchanged:

    tff.aggregators.clipping_factory(1.0, MaskedSumFactory())

(Zeroing keeps a zeroed client's weight, as TFF's does for its mean: the
client's elements then average towards zero; clipping has no such effect.)

Weight types it accepts:

* `float32`: every element is covered (a dense upload, e.g. a width
  sub-model in its own shape); `weight_sum` is then a scalar.
* `MaskedWeight(weight=float32, mask=M)`, `M` the value's structure with
  float32 0/1 masks of the same shapes; `weight_sum` then has the value's
  structure.

Its process (with `T` the value type, `W` the weight type, `C` the weight-sum
type: `float32` or `T`):

    initialize: ( -> <value_sum_process=S_v, weight_sum_process=S_w>@SERVER)
    next: (<S@SERVER, T@CLIENTS, W@CLIENTS> ->
           <state=S@SERVER, result=MaskedSums<weighted_sum=T, weight_sum=C>@SERVER,
            measurements=<value_sum=.., weight_sum=..>@SERVER>)

It is stateless apart from its inner sum factories' state (both
`tff.aggregators.SumFactory` by default; any unweighted factory works, e.g.
secure sum). The server's divide step is separate because the sums of several
federated computations (one per sub-model group in a heterogeneous round) are
added first: `add_masked_sums`, then `masked_average` (values, Algorithm 2) or
`masked_mean_or_zero` (updates: an element nobody covered gets update 0, so
`w - lr * update` keeps it).

`MaskedMeanFactory` does the divide inside the process and returns `T` with 0
where no weight fell. With a scalar weight it computes what
`tff.aggregators.MeanFactory` computes (tested); with a `MaskedWeight` it
needs client work that emits one, as TFF's own builders pass a scalar.
"""

from __future__ import annotations

import collections
from typing import Any
from typing import NamedTuple
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class MaskedWeight(NamedTuple):
  """A client's weight and the mask of the elements its value covers."""

  weight: Any
  mask: Any


class MaskedSums(NamedTuple):
  """Per-element sums of weight x mask x value and of weight x mask."""

  weighted_sum: Any
  weight_sum: Any


# --------------------------------------------------------------------------
# Layer 1: pure TensorFlow.


def weigh(value, weight):
  """Client side: `(weight x mask x value, weight x mask)` (module docstring)."""
  if isinstance(weight, MaskedWeight):
    w = weight.weight
    weighted = tf.nest.map_structure(
      lambda v, m: v * tf.cast(w, v.dtype) * tf.cast(m, v.dtype),
      value,
      weight.mask,
    )
    counts = tf.nest.map_structure(
      lambda m: tf.cast(w, tf.float32) * tf.cast(m, tf.float32), weight.mask
    )
    return weighted, counts
  weighted = tf.nest.map_structure(
    lambda v: v * tf.cast(weight, v.dtype), value
  )
  return weighted, tf.cast(weight, tf.float32)


def add_masked_sums(a: MaskedSums, b: MaskedSums) -> MaskedSums:
  """Element-wise sum of two `MaskedSums` of the same structure."""
  return MaskedSums(
    tf.nest.map_structure(tf.add, a.weighted_sum, b.weighted_sum),
    _map_counts(tf.add, a.weight_sum, b.weight_sum, a.weighted_sum),
  )


def _map_counts(fn, counts_a, counts_b, like):
  """Applies `fn` leaf-wise; a scalar count stands for every leaf of `like`."""
  if not tf.nest.is_nested(counts_a) and not tf.nest.is_nested(counts_b):
    return fn(counts_a, counts_b)
  flat_like = tf.nest.flatten(like)
  flat_a = (
    tf.nest.flatten(counts_a)
    if tf.nest.is_nested(counts_a)
    else [counts_a] * len(flat_like)
  )
  flat_b = (
    tf.nest.flatten(counts_b)
    if tf.nest.is_nested(counts_b)
    else [counts_b] * len(flat_like)
  )
  return tf.nest.pack_sequence_as(
    like, [fn(x, y) for x, y in zip(flat_a, flat_b)]
  )


def _counts_like(sums: MaskedSums):
  """The weight sums as a structure like `weighted_sum` (scalars broadcast)."""
  if tf.nest.is_nested(sums.weight_sum):
    return sums.weight_sum
  return tf.nest.map_structure(lambda _: sums.weight_sum, sums.weighted_sum)


def masked_average(sums: MaskedSums, previous):
  """Algorithm 2: sum / count where count > 0, `previous` elsewhere."""

  def leaf(total, count, prev):
    count = tf.cast(count, total.dtype)
    covered = tf.broadcast_to(count > 0, tf.shape(total))
    return tf.where(covered, tf.math.divide_no_nan(total, count), prev)

  return tf.nest.map_structure(
    leaf, sums.weighted_sum, _counts_like(sums), previous
  )


def masked_mean_or_zero(sums: MaskedSums):
  """sum / count where count > 0, 0 elsewhere (for updates)."""

  def leaf(total, count):
    count = tf.cast(count, total.dtype)
    return tf.math.divide_no_nan(total, tf.broadcast_to(count, tf.shape(total)))

  return tf.nest.map_structure(leaf, sums.weighted_sum, _counts_like(sums))


# --------------------------------------------------------------------------
# Layers 2 and 3: typed computations and the aggregation process.


def _check_value_type(value_type) -> None:
  """Floating tensors (or structures of them), as TFF's MeanFactory requires."""
  if isinstance(value_type, tff.FederatedType):
    raise TypeError(f"value_type must not be federated, got {value_type}")
  if not tff.types.is_structure_of_floats(value_type):
    raise TypeError(
      "MaskedSumFactory aggregates floating-point values (a tensor or a"
      f" structure of them), got {value_type}"
    )


def _check_weight_type(weight_type, value_type) -> bool:
  """True for a `MaskedWeight`, False for a scalar weight; TypeError else."""
  scalar = tff.TensorType(np.float32)
  if isinstance(weight_type, tff.TensorType):
    if weight_type.is_assignable_from(scalar) and not weight_type.shape:
      return False
    raise TypeError(
      f"the weight must be float32 or MaskedWeight<weight=float32, mask=..>,"
      f" got {weight_type}"
    )
  if not isinstance(weight_type, tff.StructType) or tff.structure.name_list(
    weight_type
  ) != ["weight", "mask"]:
    raise TypeError(
      "the weight must be float32 or MaskedWeight<weight=float32, mask=..>,"
      f" got {weight_type}"
    )
  if not scalar.is_assignable_from(weight_type.weight):
    raise TypeError(
      f"MaskedWeight.weight must be float32, got {weight_type.weight}"
    )
  value_leaves = tff.structure.flatten(value_type)
  mask_leaves = tff.structure.flatten(weight_type.mask)
  if len(value_leaves) != len(mask_leaves) or any(
    v.shape != m.shape or m.dtype != np.float32
    for v, m in zip(value_leaves, mask_leaves)
  ):
    raise TypeError(
      "MaskedWeight.mask must hold one float32 mask per value tensor, of the"
      f" same shape: value {value_type}, mask {weight_type.mask}"
    )
  return True


class MaskedSumFactory(tff.aggregators.WeightedAggregationFactory):
  """Per-element sums of weight x mask x value and weight x mask (see module)."""

  def __init__(
    self,
    value_sum_factory: Optional[
      tff.aggregators.UnweightedAggregationFactory
    ] = None,
    weight_sum_factory: Optional[
      tff.aggregators.UnweightedAggregationFactory
    ] = None,
  ):
    for name, inner in (
      ("value_sum_factory", value_sum_factory),
      ("weight_sum_factory", weight_sum_factory),
    ):
      if inner is not None and not isinstance(
        inner, tff.aggregators.UnweightedAggregationFactory
      ):
        raise TypeError(
          f"{name} must be an UnweightedAggregationFactory, got"
          f" {type(inner).__name__}"
        )
    self._value_sum_factory = value_sum_factory or tff.aggregators.SumFactory()
    self._weight_sum_factory = (
      weight_sum_factory or tff.aggregators.SumFactory()
    )

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    _check_value_type(value_type)
    masked = _check_weight_type(weight_type, value_type)

    @tff.tensorflow.computation(value_type, weight_type)
    def weigh_at_client(value, weight):
      if masked:
        weight = MaskedWeight(weight.weight, weight.mask)
      return weigh(value, weight)

    count_type = weigh_at_client.type_signature.result[1]
    value_sum_process = self._value_sum_factory.create(value_type)
    weight_sum_process = self._weight_sum_factory.create(count_type)

    @tff.federated_computation()
    def init_fn():
      return tff.federated_zip(
        collections.OrderedDict(
          value_sum_process=value_sum_process.initialize(),
          weight_sum_process=weight_sum_process.initialize(),
        )
      )

    @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      weighted, counts = tff.federated_map(weigh_at_client, (value, weight))
      value_output = value_sum_process.next(state.value_sum_process, weighted)
      weight_output = weight_sum_process.next(state.weight_sum_process, counts)
      new_state = tff.federated_zip(
        collections.OrderedDict(
          value_sum_process=value_output.state,
          weight_sum_process=weight_output.state,
        )
      )
      result = tff.federated_zip(
        MaskedSums(value_output.result, weight_output.result)
      )
      measurements = tff.federated_zip(
        collections.OrderedDict(
          value_sum=value_output.measurements,
          weight_sum=weight_output.measurements,
        )
      )
      return tff.templates.MeasuredProcessOutput(
        new_state, result, measurements
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


class MaskedMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """`MaskedSumFactory` followed by `masked_mean_or_zero` on the server.

  next: (<S@SERVER, T@CLIENTS, W@CLIENTS> ->
         <state=S@SERVER, result=T@SERVER, measurements=..@SERVER>)
  """

  def __init__(self, masked_sum_factory: Optional[MaskedSumFactory] = None):
    self._sum_factory = masked_sum_factory or MaskedSumFactory()

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    sum_process = self._sum_factory.create(value_type, weight_type)
    sums_type = sum_process.next.type_signature.result.result.member

    @tff.tensorflow.computation(sums_type)
    def divide(sums):
      return masked_mean_or_zero(MaskedSums(*sums))

    @tff.federated_computation()
    def init_fn():
      return sum_process.initialize()

    @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      output = sum_process.next(state, value, weight)
      return tff.templates.MeasuredProcessOutput(
        output.state,
        tff.federated_map(divide, output.result),
        output.measurements,
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)
