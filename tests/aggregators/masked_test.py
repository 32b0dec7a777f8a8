"""The masked weighted-sum aggregation: type signatures, then known answers."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.aggregators import MaskedMeanFactory
from tff_hetero.aggregators import MaskedSumFactory
from tff_hetero.aggregators import MaskedSums
from tff_hetero.aggregators import MaskedWeight
from tff_hetero.aggregators import masked_average
from tff_hetero.aggregators import masked_mean_or_zero

_VALUE = tff.StructWithPythonType(
  [
    ("w", tff.TensorType(np.float32, [2, 2])),
    ("b", tff.TensorType(np.float32, [2])),
  ],
  collections.OrderedDict,
)
_MASKED_WEIGHT = tff.to_type(MaskedWeight(tff.TensorType(np.float32), _VALUE))
_SCALAR = tff.TensorType(np.float32)


def _value(w, b):
  return collections.OrderedDict(
    w=np.asarray(w, np.float32), b=np.asarray(b, np.float32)
  )


# -- type signatures ----------------------------------------------------------


def test_scalar_weight_gives_scalar_weight_sum():
  process = MaskedSumFactory().create(_VALUE, _SCALAR)
  result = process.next.type_signature.result.result
  assert result.placement == tff.SERVER
  assert str(result.member) == (
    "<weighted_sum=<w=float32[2,2],b=float32[2]>,weight_sum=float32>"
  )


def test_masked_weight_gives_per_element_weight_sum():
  process = MaskedSumFactory().create(_VALUE, _MASKED_WEIGHT)
  result = process.next.type_signature.result.result.member
  assert str(result.weight_sum) == "<w=float32[2,2],b=float32[2]>"
  assert process.next.type_signature.parameter[2] == tff.FederatedType(
    _MASKED_WEIGHT, tff.CLIENTS
  )


@pytest.mark.parametrize(
  "weight_type, message",
  [
    (tff.TensorType(np.float32, [3]), "float32 or MaskedWeight"),
    (
      tff.to_type(MaskedWeight(tff.TensorType(np.int32), _VALUE)),
      "MaskedWeight.weight must be float32",
    ),
    (
      tff.to_type(
        MaskedWeight(
          _SCALAR,
          tff.to_type(
            collections.OrderedDict(w=tff.TensorType(np.float32, [2, 2]))
          ),
        )
      ),
      "one float32 mask per value tensor",
    ),
    (
      tff.to_type(collections.OrderedDict(a=_SCALAR, b=_VALUE)),
      "float32 or MaskedWeight",
    ),
  ],
)
def test_bad_weight_types_are_named(weight_type, message):
  with pytest.raises(TypeError, match=message):
    MaskedSumFactory().create(_VALUE, weight_type)


def test_integer_values_are_refused():
  with pytest.raises(TypeError, match="floating-point"):
    MaskedSumFactory().create(tff.TensorType(np.int32, [2]), _SCALAR)


def test_composes_with_clipping_and_zeroing_signatures():
  clipped = tff.aggregators.clipping_factory(1.0, MaskedSumFactory())
  process = clipped.create(_VALUE, _MASKED_WEIGHT)
  assert "clipping_norm=float32" in str(
    process.next.type_signature.result.measurements.member
  )
  zeroed = tff.aggregators.zeroing_factory(10.0, MaskedSumFactory())
  process = zeroed.create(_VALUE, _MASKED_WEIGHT)
  assert "zeroed_count=int32" in str(
    process.next.type_signature.result.measurements.member
  )


# -- known answers ------------------------------------------------------------

_VALUES = [_value([[1, 2], [3, 4]], [1, 1]), _value([[5, 6], [7, 8]], [3, 3])]
_MASKS = [_value([[1, 1], [0, 0]], [1, 0]), _value([[1, 0], [1, 0]], [1, 0])]
_WEIGHTS = [1.0, 3.0]


def _masked_weights():
  return [MaskedWeight(np.float32(w), m) for w, m in zip(_WEIGHTS, _MASKS)]


def test_masked_sums_by_hand(tff_context):
  del tff_context
  process = MaskedSumFactory().create(_VALUE, _MASKED_WEIGHT)
  output = process.next(process.initialize(), _VALUES, _masked_weights())
  sums = output.result
  # w[0,0]: 1*1 + 3*5 = 16 over 1 + 3; w[0,1]: only client 0 (2, weight 1);
  # w[1,0]: only client 1 (7, weight 3); w[1,1]: nobody. b[0]: 1 + 9 over 4.
  np.testing.assert_allclose(sums.weighted_sum["w"], [[16, 2], [21, 0]])
  np.testing.assert_allclose(sums.weight_sum["w"], [[4, 1], [3, 0]])
  np.testing.assert_allclose(sums.weighted_sum["b"], [10, 0])
  np.testing.assert_allclose(sums.weight_sum["b"], [4, 0])
  previous = _value([[-1, -1], [-1, -1]], [-1, -1])
  average = masked_average(MaskedSums(*sums), previous)
  np.testing.assert_allclose(average["w"], [[4, 2], [7, -1]])
  np.testing.assert_allclose(average["b"], [2.5, -1])
  update = masked_mean_or_zero(MaskedSums(*sums))
  np.testing.assert_allclose(update["w"], [[4, 2], [7, 0]])


def test_scalar_weight_equals_tff_mean(tff_context):
  del tff_context
  ours = MaskedMeanFactory().create(_VALUE, _SCALAR)
  tffs = tff.aggregators.MeanFactory().create(_VALUE, _SCALAR)
  a = ours.next(ours.initialize(), _VALUES, _WEIGHTS).result
  b = tffs.next(tffs.initialize(), _VALUES, _WEIGHTS).result
  for key in ("w", "b"):
    np.testing.assert_allclose(a[key], b[key], rtol=1e-6)
  # (1*1 + 3*5) / 4 = 4.
  assert a["w"][0, 0] == pytest.approx(4.0)


def test_clipping_scales_values_not_masks(tff_context):
  del tff_context
  process = tff.aggregators.clipping_factory(1.0, MaskedSumFactory()).create(
    _VALUE, _MASKED_WEIGHT
  )
  output = process.next(process.initialize(), _VALUES, _masked_weights())
  norms = [
    np.sqrt(sum(np.sum(np.square(v)) for v in value.values()))
    for value in _VALUES
  ]
  expected = sum(
    w * m["w"] * v["w"] / max(n, 1.0)
    for w, m, v, n in zip(_WEIGHTS, _MASKS, _VALUES, norms)
  )
  np.testing.assert_allclose(
    output.result.weighted_sum["w"], expected, rtol=1e-5
  )
  # The counts are untouched by clipping.
  np.testing.assert_allclose(output.result.weight_sum["w"], [[4, 1], [3, 0]])
  assert output.measurements["clipped_count"] == 2


def test_zeroing_drops_a_large_client(tff_context):
  del tff_context
  process = tff.aggregators.zeroing_factory(7.5, MaskedSumFactory()).create(
    _VALUE, _MASKED_WEIGHT
  )
  output = process.next(process.initialize(), _VALUES, _masked_weights())
  # TFF zeroes on the max-norm: client 1's largest entry (8) exceeds 7.5, so
  # its value is zeroed; its weight still counts (TFF's zeroing semantics).
  np.testing.assert_allclose(output.result.weighted_sum["w"], [[1, 2], [0, 0]])
  np.testing.assert_allclose(output.result.weight_sum["w"], [[4, 1], [3, 0]])
  assert output.measurements["zeroed_count"] == 1


def test_pure_functions_broadcast_scalar_counts():
  sums = MaskedSums([tf.constant([2.0, 4.0])], tf.constant(2.0))
  np.testing.assert_allclose(masked_mean_or_zero(sums)[0], [1.0, 2.0])
  empty = MaskedSums([tf.constant([2.0, 4.0])], tf.constant(0.0))
  np.testing.assert_allclose(
    masked_average(empty, [tf.constant([7.0, 8.0])])[0], [7.0, 8.0]
  )
