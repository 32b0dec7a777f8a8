"""The measuring TFF parts: type signatures, then known-answer execution."""

import collections

import numpy as np
import tensorflow_federated as tff

from tff_hetero import aggregators
from tff_hetero.accounting import tff_measure

_VALUE = tff.StructWithPythonType(
  [
    ("w", tff.TensorType(np.float32, [3, 2])),
    ("b", tff.TensorType(np.float32, [2])),
  ],
  collections.OrderedDict,
)


def test_broadcast_signature():
  process = tff_measure.build_measured_broadcast_process(_VALUE)
  result = process.next.type_signature.result
  assert result.result.placement == tff.CLIENTS
  assert result.result.member == _VALUE
  assert str(result.measurements.member) == "<bytes_down=int64,clients=int64>"


def test_upload_factory_composes_with_clipping_on_either_side():
  inside = tff.aggregators.clipping_factory(
    1.0, tff_measure.MeasuredUploadFactory(tff.aggregators.MeanFactory())
  )
  process = inside.create(_VALUE, tff.TensorType(np.float32))
  assert str(process.next.type_signature.result.measurements.member) == (
    "<clipping=<inner=<mean_value=<>,mean_weight=<>>,bytes_up=int64,"
    "clients=int64,zero_weight_clients=int64>,clipping_norm=float32,"
    "clipped_count=int32>"
  )
  outside = tff_measure.MeasuredUploadFactory(
    tff.aggregators.clipping_factory(1.0, tff.aggregators.MeanFactory())
  )
  process = outside.create(_VALUE, tff.TensorType(np.float32))
  assert str(process.next.type_signature.result.measurements.member) == (
    "<inner=<clipping=<mean_value=<>,mean_weight=<>>,clipping_norm=float32,"
    "clipped_count=int32>,bytes_up=int64,clients=int64,"
    "zero_weight_clients=int64>"
  )


def test_broadcast_measures_every_client(tff_context):
  del tff_context
  process = tff_measure.build_measured_broadcast_process(_VALUE)

  @tff.federated_computation(
    tff.FederatedType(_VALUE, tff.SERVER),
    tff.FederatedType(np.int32, tff.CLIENTS),
  )
  def broadcast_to(value, cohort):
    del cohort  # Only sets how many clients there are.
    return process.next(process.initialize(), value).measurements

  value = collections.OrderedDict(
    w=np.ones([3, 2], np.float32), b=np.zeros([2], np.float32)
  )
  measurements = broadcast_to(value, [0, 0, 0])
  # 8 float32 elements = 32 bytes, to each of the 3 clients.
  assert measurements["clients"] == 3
  assert measurements["bytes_down"] == 3 * 32


def test_upload_measures_value_and_weight_per_client(tff_context):
  del tff_context
  factory = tff_measure.MeasuredUploadFactory()
  process = factory.create(_VALUE, tff.TensorType(np.float32))
  values = [
    collections.OrderedDict(
      w=np.full([3, 2], i, np.float32), b=np.full([2], i, np.float32)
    )
    for i in (1.0, 3.0)
  ]
  weights = [1.0, 3.0]
  output = process.next(process.initialize(), values, weights)
  # (8 floats + 1 weight) * 4 bytes, from each of the two clients.
  assert output.measurements["bytes_up"] == 2 * 36
  assert output.measurements["clients"] == 2
  assert output.measurements["zero_weight_clients"] == 0
  # The inner mean is untouched: (1*1 + 3*3) / 4 = 2.5.
  np.testing.assert_allclose(output.result["w"], np.full([3, 2], 2.5))


def test_upload_counts_zero_weight_clients(tff_context):
  del tff_context
  process = tff_measure.MeasuredUploadFactory().create(
    _VALUE, tff.TensorType(np.float32)
  )
  values = [
    collections.OrderedDict(
      w=np.full([3, 2], i, np.float32), b=np.full([2], i, np.float32)
    )
    for i in (1.0, 0.0, 5.0)
  ]
  output = process.next(process.initialize(), values, [2.0, 0.0, 0.0])
  assert output.measurements["zero_weight_clients"] == 2
  assert output.measurements["clients"] == 3
  # Only the first client weighs: the mean is its value.
  np.testing.assert_allclose(output.result["w"], np.full([3, 2], 1.0))


def test_upload_counts_zero_masked_weights(tff_context):
  del tff_context
  mask_type = tff.StructWithPythonType(
    [
      ("w", tff.TensorType(np.float32, [3, 2])),
      ("b", tff.TensorType(np.float32, [2])),
    ],
    collections.OrderedDict,
  )
  weight_type = tff.StructWithPythonType(
    [("weight", np.float32), ("mask", mask_type)], aggregators.MaskedWeight
  )
  process = tff_measure.MeasuredUploadFactory(
    aggregators.MaskedMeanFactory()
  ).create(_VALUE, weight_type)
  ones = collections.OrderedDict(
    w=np.ones([3, 2], np.float32), b=np.ones([2], np.float32)
  )
  weights = [
    aggregators.MaskedWeight(np.float32(w), ones) for w in (0.0, 3.0, 0.0)
  ]
  output = process.next(process.initialize(), [ones] * 3, weights)
  assert output.measurements["zero_weight_clients"] == 2
