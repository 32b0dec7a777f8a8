"""Per-client results back in the cohort's order, on any number of TFF workers.

On several TFF workers, TFF 0.87's mergeable execution context runs a
computation on each worker's share of the clients and concatenates the
workers' CLIENTS-placed results in the order the workers *finish*
(`_run_in_async_context_pool` waits with `FIRST_COMPLETED`), not in the order
the clients were passed in. Every CLIENTS-placed output of one call shares
that permutation, because a worker returns its whole result at once.

A round whose driver reads per-client results (memory rows, reports, edge
models) therefore takes each client's position in the cohort as one more
argument, `int32@CLIENTS`, and returns those results SERVER-placed, stacked
with their positions (`gather`, a federated collect through a concatenating
`tff.federated_aggregate`); the driver reads row `unstack_rows(..)[k]` for
cohort position k. With no CLIENTS-placed result, the mergeable context runs
the part after the merge (the server step) once, on one worker; with one, it
would run it on every worker.

    gather: (<V@CLIENTS, int32@CLIENTS> -> <rows=V[?], positions=int32[?]>@SERVER)

A computation whose results are all CLIENTS-placed (AdaptiveFL's device
decisions) returns each client's position beside its result, and the driver
puts them back in cohort order (`cohort_order`, `reorder`). SERVER-placed
sums and means do not depend on the order.

The same context splits an argument's clients among the workers element by
element and carries the split's progress over from the argument's last
element only (`_partition_value`): a computation that takes CLIENTS-placed
values must take one of them last, or every worker gets the first clients
(FedGKT's round, `fedgkt_computations`, measured it, and
`tests/program/executors_test.py` catches it; all our rounds end with their
positions or their data).

A round whose cohort size varies from call to call (FedGKT's asynchronous
arrivals) pads it to one fixed size with clients that train on nothing
(`padded`), and keeps the results of cohort positions 0..n-1
(`cohort_order(..)[:n]`): the TFF worker builds and keeps one executor
stack per CLIENTS cardinality it is sent, each with its own copy of the
computations' kernels (measured by calling FedGKT's client computation
with its ResNet-8 edge model: the worker at ~430 MiB after 60 calls of 4
clients, ~1,100-1,280 MiB after 60 calls cycling through 1..6 clients).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.data.options import without_autotune

POSITION_TYPE = tff.TensorType(np.int32)
POSITIONS_AT_CLIENTS = tff.FederatedType(POSITION_TYPE, tff.CLIENTS)


def positions(n: int) -> list[np.int32]:
  """The driver's argument for a cohort of `n` clients: 0, 1, ..., n - 1."""
  return [np.int32(k) for k in range(n)]


def padded(values: Sequence, size: int, fill) -> list:
  """`values` followed by `fill` up to `size` entries (module docstring)."""
  if len(values) > size:
    raise ValueError(
      f"a cohort of {len(values)} clients does not fit the padded size {size}"
    )
  return list(values) + [fill] * (size - len(values))


def empty_dataset(element_spec) -> tf.data.Dataset:
  """A padding client's dataset: no batches, of `element_spec` (a structure
  of `tf.TensorSpec`s with a leading batch axis of any size)."""
  return without_autotune(
    tf.data.Dataset.from_tensor_slices(
      tf.nest.map_structure(
        lambda s: np.zeros((0, *s.shape[1:]), s.dtype.as_numpy_dtype),
        element_spec,
      )
    ).batch(1)
  )


def cohort_order(echoed: Sequence, n: int, what: str) -> list[int]:
  """For each cohort position k, the index of its result in the output.

  Raises `RuntimeError` (naming `what`) unless `echoed` holds each of
  0 .. n - 1 exactly once.
  """
  where = {}
  for index, position in enumerate(echoed):
    where.setdefault(int(position), []).append(index)
  if sorted(where) != list(range(n)) or any(
    len(v) != 1 for v in where.values()
  ):
    raise RuntimeError(
      f"{what}: the runtime returned results for cohort positions"
      f" {sorted(int(p) for p in echoed)}, expected 0..{n - 1} once each"
    )
  return [where[k][0] for k in range(n)]


def reorder(order: Sequence[int], values: Sequence) -> list:
  """`values` (one per client, as the runtime returned them) in cohort order."""
  return [values[i] for i in order]


class Gathered(NamedTuple):
  """Per-client values stacked along a leading axis, with their positions."""

  rows: Any
  positions: Any


def concatenated_type(member: tff.Type) -> tff.Type:
  """The type `concatenated` returns (SERVER-placed) for clients' values of
  type `member`: each leading axis of any length."""
  return tff.types.tensorflow_to_type(
    tf.nest.map_structure(
      lambda s: tf.TensorSpec([None, *s.shape[1:]], s.dtype),
      tff.types.type_to_tf_tensor_specs(member),
    )
  )


def concatenated(values):
  """Inside a federated computation: the clients' values (structures of
  tensors, each with a leading axis of any length) concatenated along that
  axis, SERVER-placed: a federated collect through a concatenating
  `tff.federated_aggregate` (several workers' partial results concatenate
  the same way). Inner sizes may be unknown in the type (each must then be
  the same for every client)."""
  accumulator_type = concatenated_type(values.type_signature.member)
  specs = tff.types.type_to_tf_tensor_specs(accumulator_type)

  @tff.tensorflow.computation
  def nothing():
    return tf.nest.map_structure(
      lambda s: tf.zeros([0] + [d or 0 for d in s.shape[1:]], s.dtype), specs
    )

  def join(x, y):
    if x.shape[1:].is_fully_defined():
      return tf.concat([x, y], 0)
    # Unknown inner sizes: the empty start has size 0 there.
    return tf.cond(
      tf.equal(tf.shape(x)[0], 0),
      lambda: y,
      lambda: tf.cond(
        tf.equal(tf.shape(y)[0], 0), lambda: x, lambda: tf.concat([x, y], 0)
      ),
    )

  @tff.tensorflow.computation(accumulator_type, accumulator_type)
  def concatenate(a, b):
    return tf.nest.map_structure(join, a, b)

  @tff.tensorflow.computation(accumulator_type)
  def report(accumulated):
    return tf.nest.map_structure(tf.identity, accumulated)

  return tff.federated_aggregate(
    values, nothing(), concatenate, concatenate, report
  )


def as_gathered_row(value, position) -> Gathered:
  """TF: one client's `value` (a structure of tensors) with a new leading
  axis, and its position: one client's part of a `gather`."""
  return Gathered(
    rows=tf.nest.map_structure(lambda t: tf.expand_dims(t, 0), value),
    positions=tf.reshape(position, [1]),
  )


def gather(values, client_positions):
  """Inside a federated computation: each client's value (a structure of
  tensors) with a new leading axis, concatenated over the clients, beside
  their cohort positions, SERVER-placed (module docstring)."""

  @tff.tensorflow.computation(values.type_signature.member, POSITION_TYPE)
  def as_row(value, position):
    return as_gathered_row(value, position)

  return concatenated(tff.federated_map(as_row, (values, client_positions)))


def in_cohort_order(gathered, n: int, what: str):
  """A `gather` result's rows (NumPy, still stacked) with row k holding
  cohort position k's value (raises `RuntimeError` naming `what` as
  `cohort_order` does)."""
  order = cohort_order(np.asarray(gathered.positions), n, what)
  return tf.nest.map_structure(lambda t: np.asarray(t)[order], gathered.rows)


def unstacked(stacked, n: int) -> list:
  """Rows 0..n-1 of a structure of stacked arrays, one structure each
  (copies: a kept row does not hold on to the whole stack)."""
  return [
    tf.nest.map_structure(lambda t, k=k: np.array(t[k]), stacked)
    for k in range(n)
  ]


def unstack_rows(gathered, n: int, what: str) -> list:
  """Cohort positions 0..n-1's values from a `gather` result (NumPy):
  element k is position k's value (`in_cohort_order`, unstacked)."""
  return unstacked(in_cohort_order(gathered, n, what), n)
