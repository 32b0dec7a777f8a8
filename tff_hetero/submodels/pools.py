"""Sub-model pools: the width profiles a width-heterogeneous algorithm sends.

AdaptiveFL (Jia et al., "AdaptiveFL: Adaptive Heterogeneous Federated Learning
for Resource-Constrained AIoT Systems", DAC 2024, Section 3.1 and Table 1)
splits the global model M into the pool

    R = {m_Sp, ..., m_S1, m_Mp, ..., m_M1, m_L1}

from two width ratios (r_M for the M level, r_S for the S level) and p start
indices I_1 > I_2 > ... > I_p: `M_j` keeps width units k <= I_j whole and the
first floor(width * r_M) channels of units k > I_j (`tff_hetero.models.width`),
`S_j` likewise with r_S, and `L1` is the full model. Table 1 (VGG-16):
r_M = 0.66, r_S = 0.40, I in {8, 6, 4}. With p = 1 the pool is the paper's
coarse-grained ablation (Table 4).

HeteroFL (Diao et al., "HeteroFL: Computation and Communication Efficient
Federated Learning for Heterogeneous Clients", ICLR 2021) uses one uniform
width rate per device class (1, 1/2, 1/4, ...): every unit keeps
ceil(width * rate) channels, as HeteroFL's code rounds.

Members are listed in the paper's order (S_p first, L1 last); `index` is a
member's position in that order, which the selection tables of AdaptiveFL
are indexed by. An AdaptiveFL pool is valid when (1) every start index I is
at least tau >= 1 (Section 3.2: the pruning "does not prune shallow layers",
I >= tau; I = 0 would narrow the first layer) and (2) the members' sizes
increase strictly in pool order, S_p < ... < S_1 < M_p < ... < M_1 < L1: the
resource table and the resource reward read "a member and every member after
it" as "this size or larger" (Algorithm 1, lines 18 and 25), which holds only
then. `adaptivefl_pool` checks (1); `check_increasing_sizes` checks (2) once
the members' parameter counts are known.
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Sequence
from typing import Optional

import attrs

from tff_hetero.errors import ModelError
from tff_hetero.models import width as width_lib

SIZE_CLASSES = ("S", "M", "L")


@attrs.frozen
class PoolMember:
  """One sub-model of a pool.

  Attributes:
    index: Position in the pool (0 = smallest in the paper's order).
    level: Name, e.g. `L1`, `M2`, `S3` (AdaptiveFL) or `x0.50` (HeteroFL).
    size_class: `S`, `M` or `L` (AdaptiveFL's model type; the curiosity
      table has one row per class).
    ratio: Width ratio r_w of the pruned units (1.0 for the full model).
    start_index: AdaptiveFL's I (units k <= I stay whole); 0 when every unit
      is scaled.
    widths: Output width of every width unit.
  """

  index: int
  level: str
  size_class: str
  ratio: float
  start_index: int
  widths: tuple[int, ...]


@attrs.frozen
class SubModelPool:
  """The members of a pool, smallest first, and the units they narrow."""

  units: tuple[width_lib.WidthUnit, ...]
  members: tuple[PoolMember, ...]

  @property
  def full(self) -> PoolMember:
    return self.members[-1]

  def member(self, level: str) -> PoolMember:
    for m in self.members:
      if m.level == level:
        return m
    raise ModelError(
      f"no pool member {level!r}; members: "
      + ", ".join(m.level for m in self.members)
    )

  def levels(self) -> tuple[str, ...]:
    return tuple(m.level for m in self.members)

  def of_class(self, size_class: str) -> tuple[PoolMember, ...]:
    return tuple(m for m in self.members if m.size_class == size_class)


def _check_ratio(name: str, ratio: float) -> float:
  ratio = float(ratio)
  if not 0 < ratio < 1:
    raise ModelError(f"{name} must be in (0, 1), got {ratio}")
  return ratio


def adaptivefl_pool(
  units: Sequence[width_lib.WidthUnit],
  medium_ratio: float = 0.66,
  small_ratio: float = 0.40,
  start_indices: Sequence[int] = (8, 6, 4),
  min_start_index: int = 1,
) -> SubModelPool:
  """AdaptiveFL's pool L1, M1..Mp, S1..Sp (module docstring).

  `min_start_index` is the paper's tau (>= 1): every start index must reach
  it.
  """
  units = tuple(units)
  medium_ratio = _check_ratio("the M-level width ratio", medium_ratio)
  small_ratio = _check_ratio("the S-level width ratio", small_ratio)
  if not small_ratio < medium_ratio:
    raise ModelError(
      f"the S-level width ratio ({small_ratio}) must be below the M-level"
      f" one ({medium_ratio})"
    )
  starts = tuple(start_indices)
  if not starts:
    raise ModelError("at least one start index I is needed")
  if any(not isinstance(i, int) or isinstance(i, bool) for i in starts):
    raise ModelError(f"start indices must be integers, got {starts}")
  if list(starts) != sorted(set(starts), reverse=True):
    raise ModelError(
      f"start indices must be distinct and decreasing (I_1 > I_2 > ...),"
      f" got {':'.join(map(str, starts))}"
    )
  if (
    isinstance(min_start_index, bool)
    or not isinstance(min_start_index, int)
    or min_start_index < 1
  ):
    raise ModelError(
      f"the minimum start index tau must be an integer >= 1 (the first"
      f" layer is never pruned), got {min_start_index!r}"
    )
  if starts[0] >= len(units) or starts[-1] < min_start_index:
    if min_start_index >= len(units):
      raise ModelError(
        f"the model has {len(units)} width unit(s): no start index I can be"
        f" >= tau={min_start_index} and prune a unit after it"
      )
    raise ModelError(
      f"start indices must lie in {min_start_index}..{len(units) - 1} (I >="
      f" tau={min_start_index} keeps the shallow layers whole; the model has"
      f" {len(units)} width units), got {':'.join(map(str, starts))}"
    )
  members = []
  for size_class, ratio in (("S", small_ratio), ("M", medium_ratio)):
    # S_p .. S_1, then M_p .. M_1: smallest start index first.
    for j in range(len(starts), 0, -1):
      members.append(
        (
          f"{size_class}{j}",
          size_class,
          ratio,
          starts[j - 1],
          width_lib.widths_for(units, ratio, starts[j - 1], "floor"),
        )
      )
  members.append(("L1", "L", 1.0, len(units), width_lib.full_widths(units)))
  return SubModelPool(
    units, tuple(PoolMember(i, *m) for i, m in enumerate(members))
  )


def check_increasing_sizes(pool: SubModelPool, sizes: Sequence[int]) -> None:
  """`ModelError` (one line, naming every size) unless `sizes` increase.

  `sizes[i]` is member i's size (trainable parameters), in pool order.
  """
  sizes = [int(s) for s in sizes]
  if len(sizes) != len(pool.members):
    raise ValueError(f"{len(sizes)} sizes for {len(pool.members)} members")
  bad = [
    (a, b)
    for a, b, x, y in zip(pool.members, pool.members[1:], sizes, sizes[1:])
    if not x < y
  ]
  if bad:
    listed = ", ".join(f"{m.level} {s:,}" for m, s in zip(pool.members, sizes))
    broken = "; ".join(f"{a.level} >= {b.level}" for a, b in bad)
    raise ModelError(
      f"pool sizes must increase in pool order ({broken}): {listed}"
      " parameters; choose other start indices or width ratios"
    )


def scaled_widths(
  units: Sequence[width_lib.WidthUnit],
  rate: float,
  rounding: str = "ceil",
  scaled_units: Optional[Collection[str]] = None,
) -> tuple[int, ...]:
  """`widths_for(units, rate)` on the units named in `scaled_units` (None:
  every unit), full width on the others."""
  widths = width_lib.widths_for(units, rate, 0, rounding)
  if scaled_units is None:
    return widths
  return tuple(
    w if u.name in scaled_units else u.full_width for u, w in zip(units, widths)
  )


def uniform_pool(
  units: Sequence[width_lib.WidthUnit],
  rates: Sequence[float],
  rounding: str = "ceil",
  scaled_units: Optional[Collection[str]] = None,
) -> SubModelPool:
  """HeteroFL's pool: one uniform width rate per member, smallest first.

  The rate narrows the units named in `scaled_units` (None: every unit);
  the others keep their full width."""
  units = tuple(units)
  rates = sorted({float(r) for r in rates})
  if not rates or rates[-1] != 1.0 or rates[0] <= 0:
    raise ModelError(
      f"width rates must lie in (0, 1] and include 1, got {rates}"
    )
  members = []
  for i, rate in enumerate(rates):
    widths = scaled_widths(units, rate, rounding, scaled_units)
    size_class = "L" if rate == 1.0 else ("M" if i == len(rates) - 2 else "S")
    members.append(PoolMember(i, f"x{rate:g}", size_class, rate, 0, widths))
  return SubModelPool(units, tuple(members))
