"""Sub-model pools: AdaptiveFL's levels and HeteroFL's rates, by hand."""

import pytest

from tff_hetero.models import ModelError
from tff_hetero.models.width import WidthUnit
from tff_hetero.models.width import contains
from tff_hetero.models.width import scaled_width
from tff_hetero.models.width import widths_for
from tff_hetero.submodels import pools

UNITS = (WidthUnit(1, "conv1", 64, ("conv1",)),
         WidthUnit(2, "conv2", 128, ("conv2",)),
         WidthUnit(3, "fc1", 100, ("fc1",)))


def test_widths_for_keeps_units_up_to_start_index():
  assert widths_for(UNITS, 0.66, 1) == (64, 84, 66)   # floor(84.48), 66
  assert widths_for(UNITS, 0.5, 0, "ceil") == (32, 64, 50)
  assert widths_for(UNITS, 0.4, 3) == (64, 128, 100)


def test_scaled_width_rounding():
  assert scaled_width(100, 0.66, "floor") == 66   # not 66.00000000000001 -> 67
  assert scaled_width(3, 0.5, "ceil") == 2
  assert scaled_width(3, 0.1, "floor") == 1       # never 0 channels
  with pytest.raises(ModelError, match="rounding"):
    scaled_width(3, 0.5, "nearest")


def test_adaptivefl_pool_members():
  pool = pools.adaptivefl_pool(UNITS, 0.66, 0.40, (2, 1))
  assert pool.levels() == ("S2", "S1", "M2", "M1", "L1")
  assert [m.size_class for m in pool.members] == ["S", "S", "M", "M", "L"]
  assert pool.member("M1").widths == (64, 128, 66)
  assert pool.member("S2").widths == (64, 51, 40)
  assert pool.full.widths == (64, 128, 100)
  assert [m.index for m in pool.members] == [0, 1, 2, 3, 4]
  assert contains(pool.member("M1").widths, pool.member("S1").widths)
  assert not contains(pool.member("S1").widths, pool.member("M2").widths)


@pytest.mark.parametrize("ratios, starts, message", [
    ((0.4, 0.66), (2, 1), "below the M-level"),
    ((0.66, 1.2), (2, 1), r"in \(0, 1\)"),
    ((0.66, 0.4), (1, 2), "decreasing"),
    ((0.66, 0.4), (3,), "0..2"),
    ((0.66, 0.4), (), "at least one"),
])
def test_adaptivefl_pool_errors(ratios, starts, message):
  with pytest.raises(ModelError, match=message):
    pools.adaptivefl_pool(UNITS, *ratios, starts)


def test_uniform_pool_is_heterofl():
  pool = pools.uniform_pool(UNITS, [0.25, 1.0, 0.5])
  assert pool.levels() == ("x0.25", "x0.5", "x1")
  assert pool.member("x0.25").widths == (16, 32, 25)
  assert [m.size_class for m in pool.members] == ["S", "M", "L"]
  with pytest.raises(ModelError, match="include 1"):
    pools.uniform_pool(UNITS, [0.5])
