"""Tests of tier assignment and the per-round capacity and availability draws."""

import math

from conftest import assert_one_line_error
import numpy as np
import pytest

from tff_hetero import devices


def _one_line(call, *needles):
  return assert_one_line_error(devices.DeviceError, call, *needles)


def _ids(n):
  return [f"client_{i:04d}" for i in range(n)]


def _tiers(**kwargs):
  tiers = devices.parse_tiers("weak,medium,strong", "4:3:3", **kwargs)
  return devices.resolve_capacities(tiers, 21_840, 480_500)


@pytest.mark.parametrize(
  "n, expected",
  [
    (10, (4, 3, 3)),
    (100, (40, 30, 30)),
    (7, (3, 2, 2)),  # quotas 2.8/2.1/2.1: the leftover goes to weak
    (1, (1, 0, 0)),
    (3, (1, 1, 1)),  # quotas 1.2/0.9/0.9: weak 1, then ties go first-listed
  ],
)
def test_counts_follow_proportions_by_largest_remainder(n, expected):
  population = devices.assign_tiers(_ids(n), _tiers(), seed=0)
  assert tuple(population.tier_counts().values()) == expected
  assert list(population.tier_counts()) == ["weak", "medium", "strong"]
  assert devices.tier_sizes(n, _tiers()) == expected


def test_decimal_proportions_split_exactly():
  tiers = devices.parse_tiers(proportions="0.4:0.3:0.3")
  assert devices.tier_sizes(10, tiers) == (4, 3, 3)
  assert devices.tier_sizes(1000, tiers) == (400, 300, 300)


def test_assignment_is_seeded_and_independent_of_id_order():
  ids = _ids(100)
  first = devices.assign_tiers(ids, _tiers(), seed=5)
  again = devices.assign_tiers(list(reversed(ids)), _tiers(), seed=5)
  other = devices.assign_tiers(ids, _tiers(), seed=6)
  assert first == again
  tiers_first = [first.tier_of(c) for c in ids]
  tiers_other = [other.tier_of(c) for c in ids]
  assert tiers_first != tiers_other
  assert other.tier_counts() == first.tier_counts()
  # A permutation, not "the first 40 ids are weak".
  assert tiers_first[:40] != ["weak"] * 40


def test_profiles_carry_their_tier_resources():
  population = devices.assign_tiers(
    _ids(10), _tiers(availability="1:0.9:0.8"), seed=0
  )
  for client in population.client_ids:
    profile = population.profile(client)
    tier = {t.name: t for t in population.tiers}[profile.tier]
    assert profile.client_id == client
    assert (profile.capacity_params, profile.capacity_flops) == (
      tier.capacity_params,
      tier.capacity_flops,
    )
    assert profile.availability == tier.availability
  weak = population.clients_in_tier("weak")
  assert len(weak) == 4 and all(population.tier_of(c) == "weak" for c in weak)


def test_zero_fluctuation_gives_constant_nominal_capacity():
  population = devices.assign_tiers(_ids(10), _tiers(), seed=0)
  for client in population.client_ids:
    caps = {population.capacity_at_round(client, r) for r in range(50)}
    assert len(caps) == 1
  weak = population.clients_in_tier("weak")[0]
  assert population.capacity_at_round(weak, 0) == devices.Capacity(
    5_460, 120_125
  )


def test_fluctuation_varies_reproducibly_with_the_requested_spread():
  population = devices.assign_tiers(_ids(10), _tiers(fluctuation="0.2"), seed=3)
  client = population.clients_in_tier("strong")[0]
  caps = [population.capacity_at_round(client, r) for r in range(2000)]
  # Reproducible: same (seed, client, round), same capacity, in any order.
  assert population.capacity_at_round(client, 17) == caps[17]
  rebuilt = devices.assign_tiers(_ids(10), _tiers(fluctuation="0.2"), seed=3)
  assert rebuilt.capacity_at_round(client, 1999) == caps[1999]
  params = np.array([c.params for c in caps], dtype=float) / 21_840
  flops = np.array([c.flops for c in caps], dtype=float) / 480_500
  assert len(set(params)) > 100
  # One multiplier scales both budgets.
  np.testing.assert_allclose(params, flops, atol=1e-4)
  # Log-normal with mean 1 and relative std 0.2 (sampling error ~0.005).
  assert abs(params.mean() - 1.0) < 0.02
  assert abs(params.std() - 0.2) < 0.02
  assert params.min() > 0
  # Another seed gives another trajectory.
  other = devices.assign_tiers(_ids(10), _tiers(fluctuation="0.2"), seed=4)
  assert [other.capacity_at_round(client, r) for r in range(20)] != caps[:20]


def test_unlimited_capacity_stays_unlimited():
  tiers = devices.parse_tiers("a", "1", capacities="1", fluctuation="0.3")
  # Without resolve_capacities the fraction cannot be used: refused.
  with pytest.raises(devices.DeviceError, match="resolve_capacities"):
    devices.assign_tiers(_ids(3), tiers, seed=0)
  plain = devices.TierSpec("a", 1.0, fluctuation=0.3)
  population = devices.assign_tiers(_ids(3), [plain], seed=0)
  assert population.capacity_at_round("client_0000", 4) == devices.Capacity(
    None, None
  )


def test_availability_rate_matches_the_spec():
  tiers = _tiers(availability="0.3:0.7:1")
  population = devices.assign_tiers(_ids(100), tiers, seed=1)
  rounds = 200
  for tier, rate in (("weak", 0.3), ("medium", 0.7), ("strong", 1.0)):
    clients = population.clients_in_tier(tier)
    draws = [
      population.is_available(c, r) for c in clients for r in range(rounds)
    ]
    measured = sum(draws) / len(draws)
    # 40*200 or 30*200 Bernoulli draws: standard error <= 0.0065.
    assert abs(measured - rate) < 0.03, (tier, measured)
  # Deterministic, and available_clients agrees with is_available.
  for r in (0, 7):
    available = population.available_clients(r)
    assert available == population.available_clients(r)
    assert available == tuple(
      c for c in population.client_ids if population.is_available(c, r)
    )
    assert set(population.clients_in_tier("strong")) <= set(available)
  assert population.available_clients(0) != population.available_clients(1)


def test_a_clients_draws_do_not_depend_on_the_rest_of_the_population():
  tier = devices.TierSpec(
    "only", 1.0, capacity_params=1_000, availability=0.5, fluctuation=0.1
  )
  small = devices.assign_tiers(_ids(10), [tier], seed=9)
  big = devices.assign_tiers(_ids(50) + ["zzz"], [tier], seed=9)
  for client in small.client_ids:
    for r in range(10):
      assert big.capacity_at_round(client, r) == small.capacity_at_round(
        client, r
      )
      assert big.is_available(client, r) == small.is_available(client, r)


def test_bad_inputs_are_one_line_device_errors():
  tiers = _tiers()
  _one_line(lambda: devices.assign_tiers([], tiers, 0), "empty")
  _one_line(
    lambda: devices.assign_tiers(["a", "b", "a"], tiers, 0),
    "'a'",
    "more than once",
  )
  _one_line(lambda: devices.assign_tiers(["a", 3], tiers, 0), "strings")
  _one_line(lambda: devices.assign_tiers("abc", tiers, 0), "sequence")
  _one_line(lambda: devices.assign_tiers(["a"], tiers, -1), "seed")
  _one_line(lambda: devices.assign_tiers(["a"], (), 0), "tier")
  _one_line(
    lambda: devices.assign_tiers(["a"], tiers + tiers[:1], 0), "'weak'", "twice"
  )
  population = devices.assign_tiers(_ids(3), tiers, 0)
  _one_line(lambda: population.tier_of("nobody"), "'nobody'")
  _one_line(
    lambda: population.capacity_at_round("client_0000", -1), "round_num"
  )
  _one_line(lambda: population.is_available("client_0000", 1.5), "round_num")
  _one_line(lambda: population.clients_in_tier("huge"), "'huge'", "weak")


def test_population_is_frozen():
  population = devices.assign_tiers(_ids(3), _tiers(), 0)
  with pytest.raises(Exception):
    population.seed = 1
  with pytest.raises(TypeError):
    population.profiles["x"] = None
  assert math.isfinite(hash(population))
