"""AdaptiveFL's server and device decisions, checked by hand.

Everything but the device decision's TFF form runs without TFF.

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
from tff_hetero.algorithms import adaptivefl_simulation as simulation
from tff_hetero.devices import Capacity
from tff_hetero.models.width import WidthUnit
from tff_hetero.submodels import pools

UNITS = tuple(WidthUnit(i, f"u{i}", 10, (f"u{i}",)) for i in range(1, 5))
POOL = pools.adaptivefl_pool(UNITS, 0.6, 0.3, (2, 1))
PARAMS = (10, 20, 30, 40, 100)


def test_pool_order_and_widths():
  assert POOL.levels() == ("S2", "S1", "M2", "M1", "L1")
  assert [m.widths for m in POOL.members] == [
    (10, 3, 3, 3),
    (10, 10, 3, 3),
    (10, 6, 6, 6),
    (10, 10, 6, 6),
    (10, 10, 10, 10),
  ]


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
    adaptivefl.reward(tables, POOL, POOL.member("S2"), "resource"), 0.9
  )


def test_kept_model_updates_tables():
  tables = adaptivefl.update_tables(
    adaptivefl.initial_tables(5, 2), POOL, client=1, sent=2, returned=2, p=2
  )
  np.testing.assert_array_equal(tables.resource[:, 1], [1, 1, 2, 2, 3])
  np.testing.assert_array_equal(tables.resource[:, 0], [1, 1, 1, 1, 1])
  np.testing.assert_array_equal(tables.curiosity[:, 1], [1, 3, 1])  # S, M, L


def test_pruned_model_updates_tables():
  tables = adaptivefl.update_tables(
    adaptivefl.initial_tables(5, 1), POOL, client=0, sent=4, returned=1, p=2
  )
  # T_r[S1] += 2, then minus 0, 1, 2, 3 from S1 up to L1, floored at 0.
  np.testing.assert_array_equal(tables.resource[:, 0], [1, 3, 0, 0, 0])
  np.testing.assert_array_equal(tables.curiosity[:, 0], [2, 1, 2])


def test_pruned_update_spares_members_the_device_could_not_reach():
  # Sent M2 (10,6,6,6) with capacity 25: S1 (20, 10,10,3,3) fits but is not
  # part of M2, so the device returns S2. T_r[S2] += p = 2; S1 is unknown and
  # keeps its score; M2, M1, L1 (reachable or larger than M2, not fitting)
  # lose t - S2 = 2, 3, 4, floored at 0. Algorithm 1 as written would also
  # take 1 from S1.
  tables = adaptivefl.initial_tables(5, 1)
  tables = adaptivefl.SelectionTables(
    curiosity=tables.curiosity,
    resource=np.array([[1], [3], [5], [5], [5]], np.int64),
  )
  assert adaptivefl.choose_trained_member(POOL, PARAMS, 2, 25) == 0
  tables = adaptivefl.update_tables(
    tables, POOL, client=0, sent=2, returned=0, p=2
  )
  np.testing.assert_array_equal(tables.resource[:, 0], [3, 3, 3, 2, 1])
  np.testing.assert_array_equal(tables.curiosity[:, 0], [2, 2, 1])


def test_rewards_on_uneven_tables_by_hand():
  # Client 0: T_r = (S2, S1, M2, M1, L1) = (2, 0, 3, 1, 4), T_c = (4, 1, 9).
  # Suffix sums from L1 down: L1 4, M1 5, M2 8, S1 8, S2 10; total 10.
  # R_s: S (10 + 8) / (2 x 10) = 0.9; M (8 + 5) / (2 x 10) = 0.65;
  #      L 4 / (1 x 10) = 0.4.
  # R_c: S 1/sqrt(4) = 0.5; M 1; L 1/3.
  # R = min(0.5, R_s) x R_c: S 0.25, M 0.5, L 0.4/3.
  # Client 1: T_r all 0 -> R_s = 0 -> R = 0; T_c = (1, 16, 1).
  tables = adaptivefl.SelectionTables(
    curiosity=np.array([[4, 1], [1, 16], [9, 1]], np.int64),
    resource=np.array([[2, 0], [0, 0], [3, 0], [1, 0], [4, 0]], np.int64),
  )
  for level, r_s, r_c, r in (
    ("S1", 0.9, 0.5, 0.25),
    ("S2", 0.9, 0.5, 0.25),
    ("M2", 0.65, 1.0, 0.5),
    ("M1", 0.65, 1.0, 0.5),
    ("L1", 0.4, 1 / 3, 0.4 / 3),
  ):
    member = POOL.member(level)
    np.testing.assert_allclose(
      adaptivefl.resource_reward(tables, POOL, member), [r_s, 0.0]
    )
    np.testing.assert_allclose(
      adaptivefl.reward(tables, POOL, member, "rl"), [r, 0.0]
    )
    np.testing.assert_allclose(
      adaptivefl.reward(tables, POOL, member, "curiosity")[0], r_c
    )
  np.testing.assert_allclose(
    adaptivefl.reward(tables, POOL, POOL.member("M2"), "curiosity"), [1.0, 0.25]
  )
  # Client 1 has reward 0: with both available, client 0 is always chosen.
  rng = np.random.default_rng(0)
  for _ in range(20):
    assert adaptivefl.select_clients(
      tables, POOL, [POOL.member("M1")], np.ones(2, bool), "rl", rng
    ) == [0]


def test_failed_client_updates_tables():
  tables = adaptivefl.update_tables(
    adaptivefl.initial_tables(5, 1), POOL, client=0, sent=3, returned=None, p=2
  )
  # As a prune to S2 without its credit: minus 0, 1, 2, 3, 4 from S2 up.
  np.testing.assert_array_equal(tables.resource[:, 0], [1, 0, 0, 0, 0])
  np.testing.assert_array_equal(tables.curiosity[:, 0], [1, 2, 1])
  # Still selectable for S models.
  assert adaptivefl.reward(tables, POOL, POOL.member("S2"), "rl")[0] > 0


_DEVICE_CASES = [
  (2, None, 1, 2),  # No limit: keeps what it received.
  (2, 30, 1, 2),  # Fits exactly.
  (2, 25, 1, 0),  # M2 -> S2: S1 (20) fits but is not part of M2.
  (4, 35, 1, 2),  # L1 -> the largest part that fits: M2.
  (4, 35, 2, 1),  # With I >= 2 only S1 and M1 qualify; S1 fits.
  (4, 5, 1, None),  # Nothing fits.
  (1, 15, 1, 0),  # S1 -> S2.
  (3, 100, 1, 3),  # M1 fits.
]


@pytest.mark.parametrize("sent, capacity, tau, expected", _DEVICE_CASES)
def test_device_prunes_to_largest_fitting_part(sent, capacity, tau, expected):
  assert (
    adaptivefl.choose_trained_member(POOL, PARAMS, sent, capacity, tau)
    == expected
  )


def test_device_decision_in_tff_gives_the_same_answers(tff_context):
  del tff_context
  for tau in (1, 2):
    cases = [c for c in _DEVICE_CASES if c[2] == tau]
    decide = adaptivefl.DeviceDecision(POOL, PARAMS, tau)
    budgets = [
      adaptivefl.device_budget(None if c is None else Capacity(c, None))
      for _, c, _, _ in cases
    ]
    assert decide([s for s, _, _, _ in cases], budgets) == [
      e for _, _, _, e in cases
    ]


def test_plan_selection_variants():
  tables = adaptivefl.initial_tables(5, 6)
  candidates = np.array([True, True, False, True, True, True])
  rng = np.random.default_rng(3)
  for selection in adaptivefl.SELECTIONS:
    pairs = adaptivefl.plan_selection(
      tables, POOL, candidates, 4, selection, rng
    )
    clients = [c for c, _ in pairs]
    assert len(pairs) == 4 and len(set(clients)) == 4
    assert all(candidates[c] for c in clients)
    if selection == "greedy":
      assert [m for _, m in pairs] == [4] * 4
  # More asked than available: every available client once.
  pairs = adaptivefl.plan_selection(tables, POOL, candidates, 9, "random", rng)
  assert sorted(c for c, _ in pairs) == [0, 1, 3, 4, 5]


def test_selection_without_repeats_among_available():
  tables = adaptivefl.initial_tables(5, 6)
  candidates = np.array([True, False, True, True, False, True])
  rng = np.random.default_rng(0)
  for _ in range(50):
    chosen = adaptivefl.select_clients(
      tables, POOL, POOL.members[:4], candidates, "rl", rng
    )
    assert len(chosen) == 4 and len(set(chosen)) == 4
    assert all(candidates[c] for c in chosen)


def test_selection_probability_follows_reward():
  tables = adaptivefl.initial_tables(5, 3)
  tables = adaptivefl.SelectionTables(
    curiosity=np.array([[1, 4, 9]] * 3, np.int64), resource=tables.resource
  )
  rng = np.random.default_rng(1)
  counts = np.zeros(3)
  for _ in range(6000):
    counts[
      adaptivefl.select_clients(
        tables, POOL, [POOL.members[0]], np.ones(3, bool), "curiosity", rng
      )[0]
    ] += 1
  # R_c = 1, 1/2, 1/3: probabilities 6/11, 3/11, 2/11.
  np.testing.assert_allclose(
    counts / counts.sum(), [6 / 11, 3 / 11, 2 / 11], atol=0.02
  )


def test_zero_rewards_fall_back_to_uniform():
  tables = adaptivefl.SelectionTables(
    curiosity=np.ones([3, 4], np.int64), resource=np.zeros([5, 4], np.int64)
  )
  assert not adaptivefl.reward(tables, POOL, POOL.members[0], "rl").any()
  rng = np.random.default_rng(0)
  firsts = np.zeros(4)
  for _ in range(4000):
    chosen = adaptivefl.select_clients(
      tables, POOL, POOL.members[:4], np.ones(4, bool), "rl", rng
    )
    assert sorted(chosen) == [0, 1, 2, 3]
    firsts[chosen[0]] += 1
  np.testing.assert_allclose(firsts / firsts.sum(), [0.25] * 4, atol=0.03)


def _weak_population(capacity, n=6):
  return simulation.population(n, 0, tiers=(("weak", 1, capacity, 0.0),))


def test_simulated_greedy_waste_by_hand():
  # Every device holds 25 parameters: greedy sends L1 (100) and gets back the
  # largest part of L1 that fits, S1 (20): waste 1 - 20/100 in every round.
  result = simulation.simulate_selection(
    POOL,
    PARAMS,
    _weak_population(25),
    clients_per_round=3,
    rounds=4,
    selection="greedy",
    seed=0,
  )
  np.testing.assert_array_equal(result.sent, [300] * 4)
  np.testing.assert_array_equal(result.returned, [60] * 4)
  assert result.waste_rate() == pytest.approx(0.8)
  # Devices too small for S2 (10) return nothing: waste 1.
  result = simulation.simulate_selection(
    POOL,
    PARAMS,
    _weak_population(9),
    clients_per_round=2,
    rounds=2,
    selection="rl",
    seed=0,
  )
  assert result.waste_rate() == 1.0
  np.testing.assert_array_equal(result.failed, [2, 2])


def test_rl_selection_wastes_less_than_random_over_many_rounds():
  # Weak devices hold S1 (20) but not M2 (30); medium ones M1 (40) but not
  # L1; strong ones everything. Random dispatch keeps wasting; the tables
  # learn who holds what.
  devices = simulation.population(
    20,
    1,
    tiers=(
      ("weak", 2, 25, 0.0),
      ("medium", 1, 45, 0.0),
      ("strong", 1, 120, 0.0),
    ),
  )
  waste = {}
  for selection in ("rl", "random", "greedy"):
    result = simulation.simulate_selection(
      POOL,
      PARAMS,
      devices,
      clients_per_round=4,
      rounds=300,
      selection=selection,
      seed=2,
    )
    waste[selection] = result.waste_rate(150)
  assert waste["rl"] < waste["random"] < waste["greedy"]
