"""TFF parts that measure traffic on the values they move.

Plugged into TFF's own learning-process builders (`model_distributor`,
`model_aggregator`, `metrics_aggregator`), they count, inside the federated
computation and on the actual tensors, the bytes each client received or sent:

* `build_measured_broadcast_process(value_type, nbytes_fn=None)`: a
  `tff.learning.templates.DistributionProcess`

      next: (<()@SERVER, V@SERVER> ->
             <state=()@SERVER, result=V@CLIENTS,
              measurements=<bytes_down=int64, clients=int64>@SERVER>)

  `bytes_down` is the sum over clients of the size of what each received.
* `MeasuredUploadFactory(inner, nbytes_fn=None)`: a
  `tff.aggregators.WeightedAggregationFactory` whose process wraps `inner`'s
  and adds `bytes_up` (sum over clients of the size of value and weight) and
  `zero_weight_clients` (how many clients sent weight 0: TFF's client work
  gives it to a client whose update was not finite, and, when weighting by
  examples, to an empty one) to the measurements as
  `<inner=..., bytes_up=int64, clients=int64, zero_weight_clients=int64>`.
  Stateless itself; composes with TFF's clipping, zeroing and DP factories on
  either side.

Sizes are those of an encoding: by default every tensor is sent dense
(`payload.tf_dense_nbytes`); `nbytes_fn` (a TF function of the value, or of
`(value, weight)` for uploads, returning an int64 scalar) states another, e.g.
masked values plus bit masks for sparse models. Either way it runs on the
tensors each client actually receives or sends, given as Python containers
(an upload's `nbytes_fn` gets the value and the weight as two arguments).
Each process adds one `federated_map` at the clients and one
`federated_sum` of a struct per round (the upload also one map at the
server to assemble its measurements): each intrinsic costs the runtime
about a millisecond per round whatever it carries.
* `measured_metrics_aggregator(inner)`: wraps a metrics aggregator
  (default `tff.learning.metrics.sum_then_finalize`) and adds
  `uploaded_bytes` (sum over clients of the unfinalized metrics' size) to the
  finalized metrics.
"""

from __future__ import annotations

import collections
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import payload


def dense_nbytes(value):
  """Inside a TF computation: the dense size of `value` (a structure of
  tensors, or a TFF `Struct` of them) in bytes, int64."""
  if isinstance(value, tff.structure.Struct):
    value = tff.structure.flatten(value)
  return payload.tf_dense_nbytes(value)


def _client_nbytes_fn(value_type: tff.Type, nbytes_fn=None) -> tff.Computation:

  @tff.tensorflow.computation(value_type)
  def client_nbytes(value):
    return (nbytes_fn or dense_nbytes)(value)

  return client_nbytes


def _is_zero_weight(weight, masked: bool):
  """int64 1 if the client's weight (or a `MaskedWeight`'s `weight`) is 0."""
  if masked:
    weight = weight.weight
  return tf.cast(tf.equal(weight, tf.zeros_like(weight)), tf.int64)


def _download_counts_fn(value_type: tff.Type, nbytes_fn=None):
  """`value -> <bytes_down, clients=1>`: one client's share of the sums."""

  @tff.tensorflow.computation(value_type)
  def download_counts(value):
    return collections.OrderedDict(
      bytes_down=(nbytes_fn or dense_nbytes)(value),
      clients=tf.constant(1, tf.int64),
    )

  return download_counts


def _upload_counts_fn(value_type: tff.Type, weight_type: tff.Type, nbytes_fn):
  """`<value, weight> -> <bytes_up, clients=1, zero_weight_clients>`."""
  masked = isinstance(weight_type, tff.StructType)

  @tff.tensorflow.computation(value_type, weight_type)
  def upload_counts(value, weight):
    if nbytes_fn is None:
      nbytes = dense_nbytes(value) + dense_nbytes(weight)
    else:
      nbytes = nbytes_fn(value, weight)
    return collections.OrderedDict(
      bytes_up=nbytes,
      clients=tf.constant(1, tf.int64),
      zero_weight_clients=_is_zero_weight(weight, masked),
    )

  return upload_counts


def build_measured_broadcast_process(
  value_type: tff.Type, nbytes_fn=None
) -> tff.learning.templates.DistributionProcess:
  """A broadcast that measures the bytes every client receives."""
  if isinstance(value_type, tff.FederatedType):
    raise TypeError(f"value_type must not be federated, got {value_type}")
  download_counts = _download_counts_fn(value_type, nbytes_fn)

  @tff.federated_computation()
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  @tff.federated_computation(
    init_fn.type_signature.result, tff.FederatedType(value_type, tff.SERVER)
  )
  def next_fn(state, value):
    received = tff.federated_broadcast(value)
    measurements = tff.federated_sum(
      tff.federated_map(download_counts, received)
    )
    return tff.templates.MeasuredProcessOutput(state, received, measurements)

  return tff.learning.templates.DistributionProcess(init_fn, next_fn)


class MeasuredUploadFactory(tff.aggregators.WeightedAggregationFactory):
  """Wraps a weighted aggregation factory and measures client uploads."""

  def __init__(
    self,
    inner: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    nbytes_fn=None,
  ):
    self._nbytes_fn = nbytes_fn
    if inner is None:
      inner = tff.aggregators.MeanFactory()
    if not isinstance(inner, tff.aggregators.WeightedAggregationFactory):
      raise TypeError(
        "MeasuredUploadFactory wraps a WeightedAggregationFactory, got"
        f" {type(inner).__name__}"
      )
    self._inner = inner

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    inner_process = self._inner.create(value_type, weight_type)
    upload_counts = _upload_counts_fn(value_type, weight_type, self._nbytes_fn)

    @tff.tensorflow.computation(
      inner_process.next.type_signature.result.measurements.member,
      upload_counts.type_signature.result,
    )
    def assemble(inner, counts):
      return collections.OrderedDict(
        inner=inner,
        bytes_up=counts["bytes_up"],
        clients=counts["clients"],
        zero_weight_clients=counts["zero_weight_clients"],
      )

    @tff.federated_computation()
    def init_fn():
      return inner_process.initialize()

    @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
      tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      counts = tff.federated_sum(
        tff.federated_map(upload_counts, (value, weight))
      )
      inner_output = inner_process.next(state, value, weight)
      measurements = tff.federated_map(
        assemble, (inner_output.measurements, counts)
      )
      return tff.templates.MeasuredProcessOutput(
        inner_output.state, inner_output.result, measurements
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


def measured_metrics_aggregator(inner=None):
  """A `metrics_aggregator` that adds the measured metric upload size."""
  if inner is None:
    inner = tff.learning.metrics.sum_then_finalize

  def aggregator(metric_finalizers, local_unfinalized_metrics_type=None):
    inner_computation = inner(metric_finalizers, local_unfinalized_metrics_type)

    # Polymorphic, like TFF's `sum_then_finalize`: typed at first call.
    @tff.federated_computation
    def aggregate(local_unfinalized_metrics):
      finalized = inner_computation(local_unfinalized_metrics)
      client_nbytes = _client_nbytes_fn(
        local_unfinalized_metrics.type_signature.member
      )
      nbytes = tff.federated_sum(
        tff.federated_map(client_nbytes, local_unfinalized_metrics)
      )
      return tff.federated_zip(
        collections.OrderedDict(metrics=finalized, uploaded_bytes=nbytes)
      )

    return aggregate

  return aggregator
