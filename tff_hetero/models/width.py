"""Width knobs of the models: which layer groups can be narrowed, and to what.

Width-heterogeneous federated learning (HeteroFL, Diao et al. ICLR 2021;
AdaptiveFL, Jia et al. DAC 2024) trains sub-models that keep the FIRST k
output channels (or units) of some layers of the full model, and the matching
input channels of the layers that read them. A model supports this when its
factory accepts a `widths` argument: one output width per *width unit*.

A width unit is a group of layers whose output width is set together,
numbered from 1 in forward order (AdaptiveFL's layer index k, Section 3.2):

* in plain networks (VGG, the MNIST/CIFAR CNNs, MLPs) every convolution and
  every hidden dense layer is its own unit, convolutions first, then hidden
  dense layers, as AdaptiveFL counts them;
* in residual networks a unit is the stem convolution or a whole stage: the
  blocks of a stage add into one residual stream, so their outputs must share
  a width (AdaptiveFL's reference code prunes ResNet-18 stage by stage, "block
  as unit").

The classifier (the logits layer) is never a unit: its output is always the
number of classes; only its input follows the last unit.

`widths=None` (or the full widths) builds the full model, identical to the
model built without the argument, initial weights included.
"""

from __future__ import annotations

from collections.abc import Sequence
import math

import attrs

from tff_hetero.errors import ModelError

ROUNDINGS = ("floor", "ceil")


@attrs.frozen
class WidthUnit:
  """One group of layers narrowed together.

  Attributes:
    index: Position, from 1, in forward order (AdaptiveFL's layer index).
    name: What it is, e.g. `conv3`, `fc1` or `stage2`.
    full_width: Output channels (or units) in the full model.
    layers: Names of the Keras layers whose output width this unit sets.
  """

  index: int
  name: str
  full_width: int
  layers: tuple[str, ...]


def full_widths(units: Sequence[WidthUnit]) -> tuple[int, ...]:
  """The widths of the full model."""
  return tuple(u.full_width for u in units)


def scaled_width(full_width: int, ratio: float, rounding: str) -> int:
  """`full_width * ratio` rounded down (AdaptiveFL) or up (HeteroFL), >= 1."""
  if rounding not in ROUNDINGS:
    raise ModelError(
      f"rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}"
    )
  if not (math.isfinite(ratio) and 0 < ratio <= 1):
    raise ModelError(f"width ratio must be in (0, 1], got {ratio!r}")
  # Guard against 0.66 * 100 = 66.00000000000001 rounding up to 67.
  exact = full_width * ratio
  nearest = round(exact)
  if abs(exact - nearest) < 1e-9:
    return max(1, int(nearest))
  value = math.floor(exact) if rounding == "floor" else math.ceil(exact)
  return max(1, int(value))


def widths_for(
  units: Sequence[WidthUnit],
  ratio: float,
  start_index: int = 0,
  rounding: str = "floor",
) -> tuple[int, ...]:
  """AdaptiveFL's (r_w, I) pruning: units k <= I whole, units k > I scaled.

  With `start_index=0` every unit is scaled, which is HeteroFL's uniform
  width rate (with `rounding="ceil"`, as HeteroFL's code rounds).
  """
  if not isinstance(start_index, int) or start_index < 0:
    raise ModelError(
      f"start index I must be an integer >= 0, got {start_index!r}"
    )
  if start_index > len(units):
    raise ModelError(
      f"start index I={start_index} exceeds the model's {len(units)} width"
      f" units"
    )
  return tuple(
    u.full_width
    if u.index <= start_index
    else scaled_width(u.full_width, ratio, rounding)
    for u in units
  )


def check_widths(
  model_name: str, units: Sequence[WidthUnit], widths: Sequence[int] | None
) -> tuple[int, ...]:
  """`widths` validated against `units` (None: the full widths)."""
  if widths is None:
    return full_widths(units)
  widths = tuple(widths)
  if len(widths) != len(units):
    raise ModelError(
      f"model {model_name!r} has {len(units)} width units"
      f" ({', '.join(u.name for u in units)}), got {len(widths)} widths"
    )
  for unit, width in zip(units, widths):
    if (
      not isinstance(width, int)
      or isinstance(width, bool)
      or not 1 <= width <= unit.full_width
    ):
      raise ModelError(
        f"model {model_name!r}: width of {unit.name} must be an integer in"
        f" 1..{unit.full_width}, got {width!r}"
      )
  return widths


def contains(outer: Sequence[int], inner: Sequence[int]) -> bool:
  """Whether the sub-model of widths `inner` is part of the one of `outer`."""
  return len(outer) == len(inner) and all(i <= o for o, i in zip(outer, inner))
