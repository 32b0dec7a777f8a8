"""AdaptiveFL's server and device decisions, checked by hand (no TFF).

A pool of p = 2 over four width units of 10 channels, ratios 0.6 / 0.3 and
start indices (2, 1):

  index  level  widths          params (made up)
  0      S2     10, 3, 3, 3     10
  1      S1     10,10, 3, 3     20
  2      M2     10, 6, 6, 6     30
  3      M1     10,10, 6, 6     40
  4      L1     10,10,10,10     100
"""

import numpy as np
import pytest

from tff_hetero.algorithms import adaptivefl
from tff_hetero.models.width import WidthUnit
from tff_hetero.submodels import pools

UNITS = tuple(WidthUnit(i, f"u{i}", 10, (f"u{i}",)) for i in range(1, 5))
POOL = pools.adaptivefl_pool(UNITS, 0.6, 0.3, (2, 1))
PARAMS = (10, 20, 30, 40, 100)


def test_pool_order_and_widths():
  assert POOL.levels() == ("S2", "S1", "M2", "M1", "L1")
  assert [m.widths for m in POOL.members] == [
      (10, 3, 3, 3), (10, 10, 3, 3), (10, 6, 6, 6), (10, 10, 6, 6),
      (10, 10, 10, 10)]


def test_initial_rewards_by_hand():
  tables = adaptivefl.initial_tables(5, 2)
  # Suffix sums of T_r = 1: 5, 4, 3, 2, 1; total 5.
  s = adaptivefl.resource_reward(tables, POOL, POOL.member("S1"))
  m = adaptivefl.resource_reward(tables, POOL, POOL.member("M2"))
  large = adaptivefl.resource_reward(tables, POOL, POOL.member("L1"))
  np.testing.assert_allclose(s, [(5 + 4) / (2 * 5)] * 2)
  np.testing.assert_allclose(m, [(3 + 2) / (2 * 5)] * 2)
  np.testing.assert_allclose(large, [1 / 5] * 2)
  rl = adaptivefl.reward(tables, POOL, POOL.member("S2"), "rl")
  np.testing.assert_allclose(rl, [0.5, 0.5])  # min(0.5, 0.9) x 1/sqrt(1)
  np.testing.assert_allclose(
      adaptivefl.reward(tables, POOL, POOL.member("S2"), "resource"), 0.9)


def test_kept_model_updates_tables():
  tables = adaptivefl.update_tables(adaptivefl.initial_tables(5, 2), POOL,
                                    client=1, sent=2, returned=2, p=2)
  np.testing.assert_array_equal(tables.resource[:, 1], [1, 1, 2, 2, 3])
  np.testing.assert_array_equal(tables.resource[:, 0], [1, 1, 1, 1, 1])
  np.testing.assert_array_equal(tables.curiosity[:, 1], [1, 3, 1])  # S, M, L


def test_pruned_model_updates_tables():
  tables = adaptivefl.update_tables(adaptivefl.initial_tables(5, 1), POOL,
                                    client=0, sent=4, returned=1, p=2)
  # T_r[S1] += 2, then minus 0, 1, 2, 3 from S1 up to L1, floored at 0.
  np.testing.assert_array_equal(tables.resource[:, 0], [1, 3, 0, 0, 0])
  np.testing.assert_array_equal(tables.curiosity[:, 0], [2, 1, 2])


def test_failed_client_updates_tables():
  tables = adaptivefl.update_tables(adaptivefl.initial_tables(5, 1), POOL,
                                    client=0, sent=3, returned=None, p=2)
  # As a prune to S2 without its credit: minus 0, 1, 2, 3, 4 from S2 up.
  np.testing.assert_array_equal(tables.resource[:, 0], [1, 0, 0, 0, 0])
  np.testing.assert_array_equal(tables.curiosity[:, 0], [1, 2, 1])
  # Still selectable for S models.
  assert adaptivefl.reward(tables, POOL, POOL.member("S2"), "rl")[0] > 0


@pytest.mark.parametrize("sent, capacity, tau, expected", [
    (2, None, 0, 2),     # No limit: keeps what it received.
    (2, 30, 0, 2),       # Fits exactly.
    (2, 25, 0, 0),       # M2 -> S2: S1 (20) fits but is not part of M2.
    (4, 35, 0, 2),       # L1 -> the largest part that fits: M2.
    (4, 35, 2, 1),       # With I >= 2 only S1 and M1 qualify; S1 fits.
    (4, 5, 0, None),     # Nothing fits.
])
def test_device_prunes_to_largest_fitting_part(sent, capacity, tau, expected):
  assert adaptivefl.choose_trained_member(POOL, PARAMS, sent, capacity,
                                          tau) == expected


def test_selection_without_repeats_among_available():
  tables = adaptivefl.initial_tables(5, 6)
  candidates = np.array([True, False, True, True, False, True])
  rng = np.random.default_rng(0)
  for _ in range(50):
    chosen = adaptivefl.select_clients(tables, POOL, POOL.members[:4],
                                       candidates, "rl", rng)
    assert len(chosen) == 4 and len(set(chosen)) == 4
    assert all(candidates[c] for c in chosen)


def test_selection_probability_follows_reward():
  tables = adaptivefl.initial_tables(5, 3)
  tables = adaptivefl.SelectionTables(
      curiosity=np.array([[1, 4, 9]] * 3, np.int64), resource=tables.resource)
  rng = np.random.default_rng(1)
  counts = np.zeros(3)
  for _ in range(6000):
    counts[adaptivefl.select_clients(tables, POOL, [POOL.members[0]],
                                     np.ones(3, bool), "curiosity", rng)[0]] += 1
  # R_c = 1, 1/2, 1/3: probabilities 6/11, 3/11, 2/11.
  np.testing.assert_allclose(counts / counts.sum(), [6 / 11, 3 / 11, 2 / 11],
                             atol=0.02)


def test_zero_rewards_fall_back_to_uniform():
  tables = adaptivefl.SelectionTables(
      curiosity=np.ones([3, 4], np.int64), resource=np.zeros([5, 4], np.int64))
  assert not adaptivefl.reward(tables, POOL, POOL.members[0], "rl").any()
  rng = np.random.default_rng(0)
  firsts = np.zeros(4)
  for _ in range(4000):
    chosen = adaptivefl.select_clients(tables, POOL, POOL.members[:4],
                                       np.ones(4, bool), "rl", rng)
    assert sorted(chosen) == [0, 1, 2, 3]
    firsts[chosen[0]] += 1
  np.testing.assert_allclose(firsts / firsts.sum(), [0.25] * 4, atol=0.03)
