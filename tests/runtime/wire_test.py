"""`wire.create_value_request_bytes` against the request TFF itself builds."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.python.core.impl.executors import value_serialization

from tff_hetero.runtime import wire

_EXECUTOR = executor_pb2.ExecutorId(id="clients=3")


def _tff_request(value, type_spec):
  """What TFF 0.87's `RemoteExecutor.create_value` sends: the oracle."""
  proto, type_spec = value_serialization.serialize_value(value, type_spec)
  return (
    executor_pb2.CreateValueRequest(executor=_EXECUTOR, value=proto),
    type_spec,
  )


def _canonical(request):
  """`request` with each dataset's graph re-serialized deterministically:
  a `GraphDef`'s attribute maps serialize in no fixed order, so two
  serializations of one dataset differ in bytes, not in graph."""
  request = executor_pb2.CreateValueRequest.FromString(
    request.SerializeToString()
  )
  values = [request.value]
  while values:
    value = values.pop()
    kind = value.WhichOneof("value")
    if kind == "federated":
      values.extend(value.federated.value)
    elif kind == "struct":
      values.extend(e.value for e in value.struct.element)
    elif kind == "sequence":
      graph = tf.compat.v1.GraphDef.FromString(
        value.sequence.serialized_graph_def
      )
      value.sequence.serialized_graph_def = graph.SerializeToString(
        deterministic=True
      )
  return request


def _datasets(n):
  return [
    tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(
        x=np.full([4 + i, 2], float(i), np.float32),
        y=np.arange(4 + i, dtype=np.int32),
      )
    ).batch(3)
    for i in range(n)
  ]


_ELEMENT = tff.types.to_type(
  collections.OrderedDict(
    x=tff.TensorType(np.float32, [None, 2]),
    y=tff.TensorType(np.int32, [None]),
  )
)

CASES = {
  "client datasets": (
    _datasets(3),
    tff.FederatedType(tff.SequenceType(_ELEMENT), tff.CLIENTS),
  ),
  "server struct": (
    collections.OrderedDict(w=np.arange(6, dtype=np.float32), n=np.int64(7)),
    tff.FederatedType(
      collections.OrderedDict(
        w=tff.TensorType(np.float32, [6]), n=tff.TensorType(np.int64)
      ),
      tff.SERVER,
    ),
  ),
  "no clients": ([], tff.FederatedType(np.float32, tff.CLIENTS)),
  "clients, all equal": (
    np.float32(0.5),
    tff.FederatedType(np.float32, tff.CLIENTS, all_equal=True),
  ),
  "tensor": (np.ones([3, 3], np.float32), tff.TensorType(np.float32, [3, 3])),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_request_as_tff(name):
  # Serialized as TFF serializes, but never copied into a message first.
  value, type_spec = CASES[name]
  expected, expected_type = _tff_request(value, type_spec)
  data, value_type = wire.create_value_request_bytes(
    _EXECUTOR, value, type_spec
  )
  got = executor_pb2.CreateValueRequest.FromString(data)
  assert _canonical(got) == _canonical(expected)
  # Parsing merges a field written twice; the length would not match then.
  # (A graph's maps serialize in any order, never to another length.)
  assert len(data) == expected.ByteSize()
  assert value_type == expected_type


def test_a_computation_as_tff_sends_it():
  @tff.tensorflow.computation(np.int32)
  def double(x):
    return x * 2

  expected, _ = _tff_request(double, double.type_signature)
  data, value_type = wire.create_value_request_bytes(
    _EXECUTOR, double, double.type_signature
  )
  assert executor_pb2.CreateValueRequest.FromString(data) == expected
  assert len(data) == expected.ByteSize()
  assert value_type == double.type_signature


def test_lengths_beyond_one_varint_byte():
  # A field longer than 127 bytes needs a length of two or more varint
  # bytes, and a client of 300,000 bytes one of three.
  big = np.arange(75_000, dtype=np.float32)
  type_spec = tff.FederatedType(
    tff.TensorType(np.float32, [75_000]), tff.CLIENTS
  )
  expected, _ = _tff_request([big, big + 1.0], type_spec)
  data, _ = wire.create_value_request_bytes(
    _EXECUTOR, [big, big + 1.0], type_spec
  )
  assert len(data) == expected.ByteSize() > 600_000
  assert executor_pb2.CreateValueRequest.FromString(data) == expected


def test_varint_known_answers():
  # Protobuf's encoding documentation: 1 -> 01, 150 -> 96 01, 300 -> ac 02.
  assert wire._varint(0) == b"\x00"  # pylint: disable=protected-access
  assert wire._varint(1) == b"\x01"  # pylint: disable=protected-access
  assert wire._varint(150) == b"\x96\x01"  # pylint: disable=protected-access
  assert wire._varint(300) == b"\xac\x02"  # pylint: disable=protected-access


def test_a_member_of_the_wrong_type_is_refused_as_tff_refuses_it():
  # TFF's member serializer refuses it first (a shape it cannot serialize
  # to); the assignability check after it is TFF's too, kept as TFF has it.
  type_spec = tff.FederatedType(tff.TensorType(np.float32, [2]), tff.CLIENTS)
  bad = [np.zeros([2], np.float32), np.zeros([3], np.float32)]
  with pytest.raises(TypeError):
    _tff_request(bad, type_spec)
  with pytest.raises(TypeError):
    wire.create_value_request_bytes(_EXECUTOR, bad, type_spec)
