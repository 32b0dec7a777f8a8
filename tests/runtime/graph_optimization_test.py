"""The driver's graph optimization (`compiler_process.driver_grappler_config`): before
a computation goes to a worker (which runs it as it is), the driver inlines
its nested function calls, as TFF's compilation does, and does not fold
constants, which TFF's does (`desugar_and_transform_to_native`, the
contrast). The value is checked by hand on a real worker."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.computation import computation_impl

from tff_hetero import runtime
from tff_hetero.runtime import compiler_process


@tf.function
def _doubled(x):
  return x * 2.0


@tf.function
def _quadrupled(x):
  return _doubled(_doubled(x))  # A call inside a call.


@tff.tensorflow.computation(np.float32)
def _doubled_plus_three(x):
  three = tf.reduce_sum(tf.constant([1.0, 2.0]))  # Foldable.
  return _doubled(x) + three


@tff.tensorflow.computation(np.float32)
def _quadrupled_plus_one(x):
  return _quadrupled(x) + 1.0


def _graph_ops(computation) -> list[str]:
  """The op of every node in every TensorFlow graph of `computation`'s proto,
  the graphs' function libraries included."""
  ops = []

  def visit(message):
    for field, value in message.ListFields():
      if field.name == "graph_def" and hasattr(value, "Unpack"):
        graph = tf.compat.v1.GraphDef()
        value.Unpack(graph)
        ops.extend(node.op for node in graph.node)
        for function in graph.library.function:
          ops.extend(node.op for node in function.node_def)
        continue
      if field.message_type is None:
        continue
      values = value if field.label == field.LABEL_REPEATED else [value]
      for item in values:
        visit(item)

  visit(computation_impl.ConcreteComputation.get_proto(computation))
  return ops


def test_driver_inlines_calls_and_does_not_fold_constants():
  ours = _graph_ops(compiler_process.compile_for_worker(_doubled_plus_three))
  tffs = _graph_ops(
    tff.backends.native.desugar_and_transform_to_native(_doubled_plus_three)
  )
  traced = _graph_ops(_doubled_plus_three)
  calls = {"PartitionedCall", "StatefulPartitionedCall"}
  assert calls & set(traced)  # The traced graph calls `_doubled`.
  assert not calls & set(ours)
  assert not calls & set(tffs)
  # TFF's constant folding turns the sum of two constants into a constant;
  # ours leaves the sum (one more small op on the worker).
  assert "Sum" not in tffs
  assert "Sum" in ours


def test_the_compiled_computation_runs_on_a_worker():
  with runtime.local_execution(worker_timeout_s=60):
    assert _doubled_plus_three(np.float32(4.0)) == 11.0  # 4 * 2 + (1 + 2)


def test_one_round_of_passes_inlines_nested_calls():
  """The driver runs Grappler's passes once, not twice: a call inside a
  called function is inlined all the same."""
  traced = _graph_ops(_quadrupled_plus_one)
  ours = _graph_ops(compiler_process.compile_for_worker(_quadrupled_plus_one))
  calls = {"PartitionedCall", "StatefulPartitionedCall"}
  assert (
    traced.count("PartitionedCall") + traced.count("StatefulPartitionedCall")
    >= 3
  )  # _quadrupled's call and its two calls of _doubled.
  assert not calls & set(ours)
  assert ours.count("Mul") == 2  # Both doublings, inlined.
