"""`CreateValue` requests for a TFF worker, serialized once.

TFF 0.87's `RemoteExecutor.create_value` builds the request as nested
messages: `serialize_value` gives each client's value its own `Value`, which
`Value.Federated.value.append` copies, then `CreateValueRequest(value=...)`
copies the whole again, gRPC serializes it, and our stub's byte count
serialized it once more (`request.ByteSize()`, which the upb runtime computes
by serializing). A cohort's client datasets hold their samples, so each copy
is the size of the round's data: 31 MB for FedAvg's compute-bound benchmark
configuration (10 clients, 5 epochs of 200 MNIST samples, materialized).

`create_value_request_bytes` writes the same request in protobuf's wire
format directly: each client's `Value` is built by TFF's own
`serialize_value` and serialized on its own, and the enclosing messages are
length-delimited fields around those bytes (protobuf's encoding of an
embedded message or a repeated one is its tag, its length and its bytes;
field numbers are read from TFF's descriptors); one join copies the pieces
into the request. Parsing the result gives the message TFF would have
built, and it has that message's length (`tests/runtime/wire_test.py`
checks both). It calls TFF 0.87's private serialization modules, the
version `threaded_executor.check_tff_version` pins (checked when our
executor class is built, before any request).
"""

from __future__ import annotations


def _varint(number: int) -> bytes:
  """Protobuf's base-128 varint of a non-negative integer."""
  out = bytearray()
  while True:
    low = number & 0x7F
    number >>= 7
    if number:
      out.append(low | 0x80)
    else:
      out.append(low)
      return bytes(out)


_LENGTH_DELIMITED = 2


def _field_header(field_number: int, length: int) -> bytes:
  return _varint(field_number << 3 | _LENGTH_DELIMITED) + _varint(length)


def _message_field(field_number: int, chunks: list[bytes]) -> list[bytes]:
  """A length-delimited field whose payload is `chunks` joined."""
  return [_field_header(field_number, sum(map(len, chunks))), *chunks]


def _number(message_class, field: str) -> int:
  return message_class.DESCRIPTOR.fields_by_name[field].number


def _value_chunks(value, type_spec) -> tuple[list[bytes], object]:
  """A `Value` of `value` as serialized chunks, and its TFF type.

  What TFF's `serialize_value` gives, with a federated value's members
  serialized one by one rather than copied into one message."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.proto.v0 import executor_pb2
  from tensorflow_federated.python.common_libs import py_typecheck
  from tensorflow_federated.python.core.impl.executors import (
    value_serialization,
  )
  from tensorflow_federated.python.core.impl.types import computation_types
  from tensorflow_federated.python.core.impl.types import type_serialization
  # pylint: enable=g-import-not-at-top

  if not isinstance(type_spec, computation_types.FederatedType):
    proto, type_spec = value_serialization.serialize_value(value, type_spec)
    return [proto.SerializeToString()], type_spec
  # As TFF's `_serialize_federated_value`.
  members = [value] if type_spec.all_equal else value
  py_typecheck.check_type(members, list)
  federated = executor_pb2.Value.Federated
  chunks = _message_field(
    _number(federated, "type"),
    [
      type_serialization.serialize_type(type_spec).federated.SerializeToString()
    ],
  )
  for member in members:
    proto, member_type = value_serialization.serialize_value(
      member, type_spec.member
    )
    type_spec.member.check_assignable_from(member_type)
    chunks += _message_field(
      _number(federated, "value"), [proto.SerializeToString()]
    )
  return _message_field(_number(executor_pb2.Value, "federated"), chunks), (
    type_spec
  )


def create_value_request_bytes(executor_id, value, type_spec=None):
  """The serialized `CreateValueRequest` of `value` for the worker executor
  `executor_id` (an `executor_pb2.ExecutorId`), and `value`'s TFF type."""
  from tensorflow_federated.proto.v0 import executor_pb2  # pylint: disable=g-import-not-at-top

  request = executor_pb2.CreateValueRequest
  value_chunks, type_spec = _value_chunks(value, type_spec)
  chunks = [
    *_message_field(
      _number(request, "executor"), [executor_id.SerializeToString()]
    ),
    *_message_field(_number(request, "value"), value_chunks),
  ]
  return b"".join(chunks), type_spec
