"""cohort_positions: the gather computation's type and results, and the
driver's reordering, against permutations written by hand."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_hetero.algorithms import cohort_positions


def test_cohort_order_undoes_a_worker_permutation():
  # Worker B (cohort positions 3, 4) finished before worker A (0, 1, 2).
  echoed = [np.int32(3), np.int32(4), np.int32(0), np.int32(1), np.int32(2)]
  order = cohort_positions.cohort_order(echoed, 5, "FedX")
  assert order == [2, 3, 4, 0, 1]
  returned = ["d", "e", "a", "b", "c"]
  assert cohort_positions.reorder(order, returned) == ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize("echoed", [[0, 1], [0, 0, 1], [0, 1, 3]])
def test_cohort_order_refuses_missing_or_repeated_positions(echoed):
  with pytest.raises(RuntimeError, match=r"^FedX: .*expected 0\.\.2 once each"):
    cohort_positions.cohort_order(echoed, 3, "FedX")


def test_padded_fills_to_the_size_and_refuses_a_larger_cohort():
  assert cohort_positions.padded(["a", "b"], 4, "-") == ["a", "b", "-", "-"]
  assert cohort_positions.padded(["a", "b"], 2, "-") == ["a", "b"]
  # A padded cohort's results: the real clients are positions 0..n-1.
  echoed = [np.int32(2), np.int32(3), np.int32(0), np.int32(1)]
  assert cohort_positions.cohort_order(echoed, 4, "FedX")[:2] == [2, 3]
  with pytest.raises(ValueError, match="3 clients does not fit"):
    cohort_positions.padded(["a", "b", "c"], 2, "-")


def _gather_comp():
  value_type = tff.FederatedType(
    (tff.TensorType(np.float32, [2]), tff.TensorType(np.int64)), tff.CLIENTS
  )

  @tff.federated_computation(value_type, cohort_positions.POSITIONS_AT_CLIENTS)
  def comp(values, positions):
    return cohort_positions.gather(values, positions)

  return comp


def test_gather_type_signature():
  result = _gather_comp().type_signature.result
  assert result.placement is tff.SERVER
  assert str(result.member) == (
    "<rows=<float32[?,2],int64[?]>,positions=int32[?]>"
  )


def test_gather_stacks_each_clients_value_with_its_position(tff_context):
  del tff_context
  values = [(np.array([k, -k], np.float32), np.int64(10 * k)) for k in range(3)]
  # Positions given out of order: the rows follow them, not the arguments.
  positions = [np.int32(2), np.int32(0), np.int32(1)]
  gathered = _gather_comp()(values, positions)
  assert sorted(int(p) for p in gathered.positions) == [0, 1, 2]
  rows = cohort_positions.unstack_rows(gathered, 3, "FedX")
  # Position 0 was given to the second client (k = 1), and so on.
  for (vector, count), k in zip(rows, (1, 2, 0)):
    np.testing.assert_array_equal(vector, [k, -k])
    assert count == 10 * k
  # Still stacked: row k is position k's value.
  vectors, counts = cohort_positions.in_cohort_order(gathered, 3, "FedX")
  np.testing.assert_array_equal(vectors, [[1, -1], [2, -2], [0, 0]])
  np.testing.assert_array_equal(counts, [10, 20, 0])
  broken = cohort_positions.Gathered(
    gathered.rows, np.zeros_like(gathered.positions)
  )
  with pytest.raises(RuntimeError, match="^FedX: "):
    cohort_positions.unstack_rows(broken, 3, "FedX")


def test_gather_stacks_values_whose_size_the_type_leaves_open(tff_context):
  del tff_context
  value_type = tff.FederatedType(
    tff.TensorType(np.float32, [None]), tff.CLIENTS
  )

  @tff.federated_computation(value_type, cohort_positions.POSITIONS_AT_CLIENTS)
  def comp(values, positions):
    return cohort_positions.gather(values, positions)

  assert str(comp.type_signature.result.member) == (
    "<rows=float32[?,?],positions=int32[?]>"
  )
  values = [np.array([k, k + 0.5, -k], np.float32) for k in range(3)]
  gathered = comp(values, [np.int32(1), np.int32(2), np.int32(0)])
  stacked = cohort_positions.in_cohort_order(gathered, 3, "FedX")
  np.testing.assert_array_equal(
    stacked, [[2, 2.5, -2], [0, 0.5, 0], [1, 1.5, -1]]
  )
