"""Device tiers: what each class of client device can do, parsed from flags.

A tier (weak, medium, strong, ...) has a share of the population, a resource
capacity (the parameters and forward MACs of the largest model it can train,
see `tff_hetero.models.counting`), a per-round availability and a per-round
fluctuation of that capacity. The default setting is AdaptiveFL's (Jia et al.,
"AdaptiveFL: Adaptive Heterogeneous Federated Learning for Resource-
Constrained AIoT Systems", DAC 2024, Section 4.1): three device types, weak,
medium and strong, in proportion 4:3:3, where a weak device can only hold the
small models, a medium one medium or small models and a strong one any model.
AdaptiveFL's pool levels S/M/L have size ratios 0.25 / 0.5 / 1.0 of the full
model (its Table 1), hence the default capacity fractions below. AdaptiveFL's
reference code draws each round's resource from a clipped Gaussian with a
relative spread of a few percent (11+-1, 22+-1, 48+-2 million parameters);
`--tier_fluctuation` plays that role here (see `population.py`).

Flags (the pipelines define them; this module parses their strings and names
them in its errors):

    --tiers=weak,medium,strong          unique names, comma-separated
    --tier_proportions=4:3:3            positive numbers, one per tier
    --tier_capacities=0.25:0.5:1.0      one per tier: a fraction of the full
                                        model in (0, 1], or a whole number of
                                        trainable parameters > 1 (e.g.
                                        9742:15402:22714); defaults exist
                                        only for weak, medium and strong
    --tier_availability=0.9 | 1:0.9:0.8 in (0, 1]: one for all tiers or one
                                        per tier (default 1)
    --tier_fluctuation=0.1 | 0.2:0.1:0  relative std >= 0: one for all tiers or
                                        one per tier (default 0)

Capacities belong to the population: every algorithm run on it (AdaptiveFL,
HeteroFL, Decoupled; All-Large ignores them by design) trains within the same
budgets. A fraction is kept as `TierSpec.capacity_fraction` because the full
model is not known when flags are parsed; `resolve_capacities` turns it into
absolute parameter and MAC budgets once it is. A parameter count sets
`capacity_params` directly and leaves the MAC budget unlimited.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
import math
import numbers
import re
import types

import attrs

from tff_hetero.errors import DeviceError

TIERS_FLAG = "--tiers"
PROPORTIONS_FLAG = "--tier_proportions"
CAPACITIES_FLAG = "--tier_capacities"
AVAILABILITY_FLAG = "--tier_availability"
FLUCTUATION_FLAG = "--tier_fluctuation"

DEFAULT_TIERS = "weak,medium,strong"
DEFAULT_PROPORTIONS = "4:3:3"
DEFAULT_CAPACITY_FRACTIONS: Mapping[str, float] = types.MappingProxyType(
  {"weak": 0.25, "medium": 0.5, "strong": 1.0}
)

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _is_number(value: object) -> bool:
  return (
    isinstance(value, numbers.Real)
    and not isinstance(value, bool)
    and math.isfinite(value)
  )


def _is_count(value: object) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check(predicate: Callable[[object], bool], accepted: str):
  """An attrs validator raising a one-line DeviceError."""

  def validator(instance, attribute, value):
    if not predicate(value):
      raise DeviceError(
        f"tier {getattr(instance, 'name', '?')!r}: {attribute.name} must be "
        f"{accepted}, got {value!r}"
      )

  return validator


def _valid_name(value: object) -> bool:
  return isinstance(value, str) and bool(_NAME.match(value))


def _positive(value: object) -> bool:
  return _is_number(value) and value > 0


def _fraction_or_none(value: object) -> bool:
  return value is None or (_is_number(value) and 0 < value <= 1)


def _budget_or_none(value: object) -> bool:
  return value is None or (_is_count(value) and value >= 1)


def _probability(value: object) -> bool:
  return _is_number(value) and 0 < value <= 1


def _non_negative(value: object) -> bool:
  return _is_number(value) and value >= 0


@attrs.frozen
class TierSpec:
  """One device tier.

  Attributes:
    name: Tier name (letters, digits, `_`, `-`).
    proportion: Relative share of the population (any positive number; only
      ratios between tiers matter).
    capacity_params: Largest number of (trainable) parameters a device of
      this tier can train, or None for no limit.
    capacity_flops: Largest forward MACs per example it can train (the unit
      of `tff_hetero.models.count_flops`), or None for no limit.
    availability: Probability in (0, 1] that a device is available in a round.
    fluctuation: Relative standard deviation (>= 0) of the per-round capacity
      around its nominal value (0: constant).
    capacity_fraction: The capacity as a fraction of the full model, in
      (0, 1], when it was given that way; `resolve_capacities` fills the
      absolute budgets from it.
  """

  name: str = attrs.field(
    validator=_check(
      _valid_name, "a non-empty name of letters, digits, '_' or '-'"
    )
  )
  proportion: float = attrs.field(
    validator=_check(_positive, "a positive finite number")
  )
  capacity_params: int | None = attrs.field(
    default=None,
    validator=_check(_budget_or_none, "a positive integer or None"),
  )
  capacity_flops: int | None = attrs.field(
    default=None,
    validator=_check(_budget_or_none, "a positive integer or None"),
  )
  availability: float = attrs.field(
    default=1.0, validator=_check(_probability, "a number in (0, 1]")
  )
  fluctuation: float = attrs.field(
    default=0.0, validator=_check(_non_negative, "a finite number >= 0")
  )
  capacity_fraction: float | None = attrs.field(
    default=None,
    validator=_check(_fraction_or_none, "a number in (0, 1] or None"),
  )

  @property
  def is_resolved(self) -> bool:
    """False while a capacity fraction awaits `resolve_capacities`."""
    return (
      self.capacity_fraction is None
      or self.capacity_params is not None
      or self.capacity_flops is not None
    )


def _split(flag: str, text: object, sep: str, example: str) -> list[str]:
  if not isinstance(text, str) or not text.strip():
    raise DeviceError(f"{flag}: got {text!r}; expected e.g. {flag}={example}")
  return [part.strip() for part in text.split(sep)]


def _parse_names(tiers: str) -> list[str]:
  names = _split(TIERS_FLAG, tiers, ",", DEFAULT_TIERS)
  seen = set()
  for name in names:
    if not name:
      raise DeviceError(
        f"{TIERS_FLAG}: empty tier name in {tiers!r}; give comma-separated "
        f"names, e.g. {TIERS_FLAG}={DEFAULT_TIERS}"
      )
    if not _NAME.match(name):
      raise DeviceError(
        f"{TIERS_FLAG}: tier name {name!r} in {tiers!r} is not valid; give "
        f"comma-separated names of letters, digits, '_' or '-', e.g. "
        f"{TIERS_FLAG}={DEFAULT_TIERS}"
      )
    if name in seen:
      raise DeviceError(
        f"{TIERS_FLAG}: tier {name!r} is listed twice in {tiers!r}; tier "
        f"names must be unique"
      )
    seen.add(name)
  return names


def _parse_values(
  flag: str,
  text: str,
  names: Sequence[str],
  accept: Callable[[float], bool],
  accepted: str,
  example: str,
  broadcast: bool,
) -> list[float]:
  """One number per tier from `a:b:c` (or one for all tiers if `broadcast`)."""
  how = (
    "one value for all tiers or one per tier" if broadcast else "one per tier"
  )
  parts = _split(flag, text, ":", example)
  if broadcast and len(parts) == 1:
    parts = parts * len(names)
  if len(parts) != len(names):
    raise DeviceError(
      f"{flag}: got {len(parts)} value(s) {text!r} for {len(names)} tiers "
      f"({','.join(names)}); give {how}, each {accepted}, e.g. "
      f"{flag}={example}"
    )
  values = []
  for part in parts:
    try:
      value = float(part)
    except ValueError:
      value = math.nan
    if not math.isfinite(value) or not accept(value):
      raise DeviceError(
        f"{flag}: {part!r} in {text!r} is not {accepted}; give {how}, "
        f"e.g. {flag}={example}"
      )
    values.append(value)
  return values


def _default_fractions(names: Sequence[str]) -> list[float]:
  for name in names:
    if name not in DEFAULT_CAPACITY_FRACTIONS:
      defaults = ", ".join(
        f"{k}={v}" for k, v in DEFAULT_CAPACITY_FRACTIONS.items()
      )
      raise DeviceError(
        f"{CAPACITIES_FLAG}: no default capacity for tier {name!r} "
        f"(defaults: {defaults}); give one fraction of the full model per "
        f"tier, e.g. {CAPACITIES_FLAG}=0.25:0.5:1.0"
      )
  return [DEFAULT_CAPACITY_FRACTIONS[name] for name in names]


def parse_tiers(
  tiers: str = DEFAULT_TIERS,
  proportions: str = DEFAULT_PROPORTIONS,
  *,
  capacities: str | None = None,
  availability: str | None = None,
  fluctuation: str | None = None,
) -> tuple[TierSpec, ...]:
  """Tier specs from the command-line strings (module docstring).

  Args:
    tiers: `--tiers`, e.g. "weak,medium,strong".
    proportions: `--tier_proportions`, e.g. "4:3:3".
    capacities: `--tier_capacities`, fractions of the full model or
      parameter counts, e.g. "0.25:0.5:1.0" or "9742:0.5:1"; None uses the
      defaults of weak/medium/strong.
    availability: `--tier_availability`; None means always available.
    fluctuation: `--tier_fluctuation`; None means constant capacity.

  Returns:
    One `TierSpec` per tier, in flag order: a fraction in
    `capacity_fraction` with absolute capacities still None (see
    `resolve_capacities`), or a parameter count in `capacity_params`.

  Raises:
    DeviceError: a one-line message naming the flag at fault.
  """
  names = _parse_names(tiers)
  shares = _parse_values(
    PROPORTIONS_FLAG,
    proportions,
    names,
    lambda v: v > 0,
    "a positive number",
    "4:3:3",
    broadcast=False,
  )
  if capacities is None:
    fractions = _default_fractions(names)
  else:
    fractions = _parse_values(
      CAPACITIES_FLAG,
      capacities,
      names,
      lambda v: 0 < v <= 1 or (v > 1 and v == int(v)),
      "a fraction in (0, 1] or a whole number of parameters > 1",
      "0.25:0.5:1.0",
      broadcast=False,
    )
  budgets = [int(f) if f > 1 else None for f in fractions]
  fractions = [None if f > 1 else f for f in fractions]
  available = (
    [1.0] * len(names)
    if availability is None
    else _parse_values(
      AVAILABILITY_FLAG,
      availability,
      names,
      lambda v: 0 < v <= 1,
      "a probability in (0, 1]",
      "0.9",
      broadcast=True,
    )
  )
  spread = (
    [0.0] * len(names)
    if fluctuation is None
    else _parse_values(
      FLUCTUATION_FLAG,
      fluctuation,
      names,
      lambda v: v >= 0,
      "a relative standard deviation >= 0",
      "0.1",
      broadcast=True,
    )
  )
  return tuple(
    TierSpec(
      name=name,
      proportion=share,
      availability=avail,
      fluctuation=spr,
      capacity_fraction=fraction,
      capacity_params=budget,
    )
    for name, share, fraction, budget, avail, spr in zip(
      names, shares, fractions, budgets, available, spread
    )
  )


def _budget(fraction: float, full: int | None) -> int | None:
  if full is None:
    return None
  return max(1, math.floor(fraction * full + 0.5))


def resolve_capacities(
  tiers: Sequence[TierSpec], full_params: int | None, full_flops: int | None
) -> tuple[TierSpec, ...]:
  """Turns capacity fractions into absolute budgets of the full model.

  A tier with `capacity_fraction` f gets `capacity_params = round(f x
  full_params)` and `capacity_flops = round(f x full_flops)` (at least 1; a
  None full size leaves that budget None, i.e. unlimited). Tiers without a
  fraction keep the absolute capacities they have.

  Args:
    tiers: Specs from `parse_tiers` (or built by hand).
    full_params: Trainable parameters of the full model
      (`count_params(model).trainable`), or None.
    full_flops: Forward MACs per example of the full model
      (`count_flops(model)`), or None.
  """
  for label, full in (("full_params", full_params), ("full_flops", full_flops)):
    if full is not None and not (_is_count(full) and full >= 1):
      raise DeviceError(
        f"{label} must be a positive integer or None, got {full!r}"
      )
  return tuple(
    tier
    if tier.capacity_fraction is None
    else attrs.evolve(
      tier,
      capacity_params=_budget(tier.capacity_fraction, full_params),
      capacity_flops=_budget(tier.capacity_fraction, full_flops),
    )
    for tier in tiers
  )
