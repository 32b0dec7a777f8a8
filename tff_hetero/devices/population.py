"""The client device population: a tier, capacity and availability per client.

`assign_tiers(client_ids, tiers, seed)` gives every client a tier:

* the number of clients per tier follows the proportions exactly, rounded by
  the largest-remainder (Hamilton) method: each tier first gets the floor of
  its quota n x p_i / sum(p), and the clients left over go one each to the
  tiers with the largest fractional remainders (ties: the tier listed first);
  4:3:3 gives 4/3/3 of 10 clients and 40/30/30 of 100;
* which client gets which tier is a permutation drawn from `seed` over the
  client ids in sorted order, so the result does not depend on the order in
  which ids are passed.

`DevicePopulation` then answers, as pure functions of (seed, client, round):

* `capacity_at_round`: the tier's nominal capacity times a multiplier drawn
  from a log-normal with mean 1 and relative standard deviation equal to the
  tier's `fluctuation` (sigma^2 = log(1 + fluctuation^2)); one multiplier per
  client and round scales both the parameter and the MAC budget (a device
  that is busy is short of memory and compute at once), rounded to an
  integer >= 1. A log-normal stays positive and, unlike the clipped Gaussian
  of AdaptiveFL's reference code, needs no clipping bounds. Fluctuation 0
  gives the nominal capacity in every round.
* `is_available`: a Bernoulli draw with the tier's availability.

Each draw uses its own generator, `np.random.default_rng([seed, stream,
key_hi, key_lo, round_num])`, where (key_hi, key_lo) are the first 8 bytes of
SHA-256(client_id): a client's trajectory depends only on the seed, its id
and the round, not on the population's size or order, and capacity and
availability draws are independent streams. Nothing is cached and nothing is
mutated, so a resumed run sees the same devices.

The server side of an algorithm must not read these profiles where its paper
says the server cannot know them (AdaptiveFL learns them from what clients
return); the program hands each sampled client its own capacity only.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from fractions import Fraction
import hashlib
import math
import numbers
import types
from typing import NamedTuple

import attrs
import numpy as np

from tff_hetero.devices.tiers import TierSpec
from tff_hetero.errors import DeviceError

_ASSIGN_STREAM = 0
_CAPACITY_STREAM = 1
_AVAILABILITY_STREAM = 2


class Capacity(NamedTuple):
  """A device's resource budget in one round (None: unlimited).

  Attributes:
    params: Largest trainable-parameter count it can train this round.
    flops: Largest forward MACs per example it can train this round.
  """

  params: int | None
  flops: int | None


@attrs.frozen
class DeviceProfile:
  """One client's device: its tier and the tier's nominal resources."""

  client_id: str
  tier: str
  capacity_params: int | None
  capacity_flops: int | None
  availability: float
  fluctuation: float


def _is_int(value: object) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_seed(seed: object) -> int:
  if not _is_int(seed) or seed < 0:
    raise DeviceError(f"seed must be a non-negative integer, got {seed!r}")
  return int(seed)


def _check_round(round_num: object) -> int:
  if not _is_int(round_num) or round_num < 0:
    raise DeviceError(
      f"round_num must be a non-negative integer, got {round_num!r}"
    )
  return int(round_num)


def _client_key(client_id: str) -> tuple[int, int]:
  digest = hashlib.sha256(client_id.encode("utf-8")).digest()
  return (int.from_bytes(digest[:4], "big"), int.from_bytes(digest[4:8], "big"))


def tier_sizes(num_clients: int, tiers: Sequence[TierSpec]) -> tuple[int, ...]:
  """Clients per tier by largest-remainder rounding (module docstring)."""
  if not _is_int(num_clients) or num_clients < 0:
    raise DeviceError(
      f"num_clients must be a non-negative integer, got {num_clients!r}"
    )
  if not tiers:
    raise DeviceError("at least one tier is needed")
  # Exact rationals: "0.4:0.3:0.3" must split 10 clients 4/3/3, not 3/3/4.
  shares = [Fraction(t.proportion).limit_denominator(10**9) for t in tiers]
  quotas = [num_clients * s / sum(shares) for s in shares]
  sizes = [math.floor(q) for q in quotas]
  leftover = num_clients - sum(sizes)
  by_remainder = sorted(
    range(len(tiers)), key=lambda i: (-(quotas[i] - sizes[i]), i)
  )
  for i in by_remainder[:leftover]:
    sizes[i] += 1
  return tuple(sizes)


def _check_tiers(tiers: Sequence[TierSpec]) -> tuple[TierSpec, ...]:
  tiers = tuple(tiers)
  if not tiers:
    raise DeviceError("at least one tier is needed")
  names = [t.name for t in tiers]
  for tier in tiers:
    if not isinstance(tier, TierSpec):
      raise DeviceError(f"tiers must be TierSpec values, got {tier!r}")
    if names.count(tier.name) > 1:
      raise DeviceError(
        f"tier {tier.name!r} appears twice; names must be unique"
      )
    if not tier.is_resolved:
      raise DeviceError(
        f"tier {tier.name!r} has capacity fraction {tier.capacity_fraction} "
        f"but no absolute capacity; call resolve_capacities(tiers, "
        f"full_params, full_flops) first"
      )
  return tiers


@attrs.frozen
class DevicePopulation:
  """Every client's device profile, and its per-round capacity and availability.

  Build with `assign_tiers`. All queries are deterministic functions of
  (seed, client id, round number).

  Attributes:
    seed: The seed of the assignment and of every per-round draw.
    tiers: The tier specs, in flag order.
    profiles: `DeviceProfile` by client id.
  """

  seed: int
  tiers: tuple[TierSpec, ...]
  profiles: Mapping[str, DeviceProfile] = attrs.field(
    converter=lambda m: types.MappingProxyType(dict(m)), hash=False
  )

  @property
  def client_ids(self) -> tuple[str, ...]:
    """All client ids, sorted."""
    return tuple(sorted(self.profiles))

  def profile(self, client_id: str) -> DeviceProfile:
    """The client's profile; DeviceError for an unknown client."""
    try:
      return self.profiles[client_id]
    except (KeyError, TypeError):
      raise DeviceError(
        f"unknown client id {client_id!r}: not in this device population "
        f"of {len(self.profiles)} clients"
      ) from None

  def tier_of(self, client_id: str) -> str:
    """The client's tier name."""
    return self.profile(client_id).tier

  def tier_counts(self) -> dict[str, int]:
    """Clients per tier, in tier order (tiers with no client included)."""
    counts = {tier.name: 0 for tier in self.tiers}
    for profile in self.profiles.values():
      counts[profile.tier] += 1
    return counts

  def clients_in_tier(self, tier: str) -> tuple[str, ...]:
    """The sorted client ids of one tier."""
    if tier not in {t.name for t in self.tiers}:
      raise DeviceError(
        f"unknown tier {tier!r}; tiers: {', '.join(t.name for t in self.tiers)}"
      )
    return tuple(sorted(c for c, p in self.profiles.items() if p.tier == tier))

  def _rng(
    self, stream: int, client_id: str, round_num: int
  ) -> np.random.Generator:
    return np.random.default_rng(
      [self.seed, stream, *_client_key(client_id), round_num]
    )

  def capacity_at_round(self, client_id: str, round_num: int) -> Capacity:
    """The client's capacity in this round (nominal x log-normal fluctuation)."""
    profile = self.profile(client_id)
    round_num = _check_round(round_num)
    if profile.fluctuation == 0:
      return Capacity(profile.capacity_params, profile.capacity_flops)
    sigma = math.sqrt(math.log1p(profile.fluctuation**2))
    z = self._rng(_CAPACITY_STREAM, client_id, round_num).standard_normal()
    multiplier = math.exp(sigma * z - sigma * sigma / 2)

    def scaled(nominal: int | None) -> int | None:
      if nominal is None:
        return None
      return max(1, math.floor(nominal * multiplier + 0.5))

    return Capacity(
      scaled(profile.capacity_params), scaled(profile.capacity_flops)
    )

  def is_available(self, client_id: str, round_num: int) -> bool:
    """Whether the client's device is available in this round."""
    profile = self.profile(client_id)
    round_num = _check_round(round_num)
    if profile.availability >= 1:
      return True
    u = self._rng(_AVAILABILITY_STREAM, client_id, round_num).random()
    return bool(u < profile.availability)

  def available_clients(self, round_num: int) -> tuple[str, ...]:
    """Sorted ids of the clients available in this round."""
    return tuple(c for c in self.client_ids if self.is_available(c, round_num))


def assign_tiers(
  client_ids: Sequence[str], tiers: Sequence[TierSpec], seed: int
) -> DevicePopulation:
  """Assigns every client a tier (exact proportions, seeded permutation).

  Args:
    client_ids: Unique client ids (strings, as in TFF's `ClientData`).
    tiers: Tier specs with resolved capacities (`resolve_capacities`), or
      with no capacities at all.
    seed: Non-negative integer seed of the assignment and of all per-round
      draws of the returned population.

  Raises:
    DeviceError: empty or duplicate ids, bad tiers, or a bad seed.
  """
  seed = _check_seed(seed)
  tiers = _check_tiers(tiers)
  if isinstance(client_ids, str):
    raise DeviceError(
      f"client_ids must be a sequence of ids, got {client_ids!r}"
    )
  ids = list(client_ids)
  if not ids:
    raise DeviceError("client_ids is empty; a device population needs clients")
  for client_id in ids:
    if not isinstance(client_id, str):
      raise DeviceError(f"client ids must be strings, got {client_id!r}")
  if len(set(ids)) != len(ids):
    duplicate = next(c for c in ids if ids.count(c) > 1)
    raise DeviceError(f"client id {duplicate!r} appears more than once")
  ids.sort()
  sizes = tier_sizes(len(ids), tiers)
  labels = np.repeat(np.arange(len(tiers)), sizes)
  order = np.random.default_rng([seed, _ASSIGN_STREAM]).permutation(len(ids))
  profiles = {}
  for client_id, slot in zip(ids, order):
    tier = tiers[int(labels[slot])]
    profiles[client_id] = DeviceProfile(
      client_id=client_id,
      tier=tier.name,
      capacity_params=tier.capacity_params,
      capacity_flops=tier.capacity_flops,
      availability=tier.availability,
      fluctuation=tier.fluctuation,
    )
  return DevicePopulation(seed=seed, tiers=tiers, profiles=profiles)
