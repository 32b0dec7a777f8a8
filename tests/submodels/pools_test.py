"""Sub-model pools: AdaptiveFL's levels and HeteroFL's rates, by hand."""

from conftest import once_per_structure
import pytest

from tff_hetero import models
from tff_hetero.models import ModelError
from tff_hetero.models.width import WidthUnit
from tff_hetero.models.width import contains
from tff_hetero.models.width import scaled_width
from tff_hetero.models.width import widths_for
from tff_hetero.submodels import pools

UNITS = (
  WidthUnit(1, "conv1", 64, ("conv1",)),
  WidthUnit(2, "conv2", 128, ("conv2",)),
  WidthUnit(3, "fc1", 100, ("fc1",)),
)


def test_widths_for_keeps_units_up_to_start_index():
  assert widths_for(UNITS, 0.66, 1) == (64, 84, 66)  # floor(84.48), 66
  assert widths_for(UNITS, 0.5, 0, "ceil") == (32, 64, 50)
  assert widths_for(UNITS, 0.4, 3) == (64, 128, 100)


def test_scaled_width_rounding():
  assert scaled_width(100, 0.66, "floor") == 66  # not 66.00000000000001 -> 67
  assert scaled_width(3, 0.5, "ceil") == 2
  assert scaled_width(3, 0.1, "floor") == 1  # never 0 channels
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


@pytest.mark.parametrize(
  "ratios, starts, message",
  [
    ((0.4, 0.66), (2, 1), "below the M-level"),
    ((0.66, 1.2), (2, 1), r"in \(0, 1\)"),
    ((0.66, 0.4), (1, 2), "decreasing"),
    ((0.66, 0.4), (3,), "1..2"),
    ((0.66, 0.4), (1, 0), r"1..2 \(I >= tau=1"),  # I = 0 prunes layer 1.
    ((0.66, 0.4), (), "at least one"),
  ],
)
def test_adaptivefl_pool_errors(ratios, starts, message):
  with pytest.raises(ModelError, match=message) as info:
    pools.adaptivefl_pool(UNITS, *ratios, starts)
  assert "\n" not in str(info.value)


def test_tau_above_one():
  with pytest.raises(ModelError, match=r"2..2 \(I >= tau=2"):
    pools.adaptivefl_pool(UNITS, 0.66, 0.4, (2, 1), min_start_index=2)
  assert len(pools.adaptivefl_pool(UNITS, 0.66, 0.4, (2,), 2).members) == 3
  with pytest.raises(ModelError, match="tau must be an integer >= 1"):
    pools.adaptivefl_pool(UNITS, 0.66, 0.4, (2, 1), min_start_index=0)


def test_sizes_must_increase_in_pool_order():
  pool = pools.adaptivefl_pool(UNITS, 0.66, 0.40, (2, 1))
  pools.check_increasing_sizes(pool, [1, 2, 3, 4, 5])
  with pytest.raises(ModelError) as info:
    pools.check_increasing_sizes(pool, [3702, 11910, 10760, 10760, 21840])
  assert str(info.value) == (
    "pool sizes must increase in pool order (S1 >= M2; M2 >= M1): S2 3,702,"
    " S1 11,910, M2 10,760, M1 10,760, L1 21,840 parameters; choose other"
    " start indices or width ratios"
  )


# The inputs of each kind of model: images, or for "text" 64 token ids.
_IMAGES = {"mnist": (28, 28, 1), "cifar": (32, 32, 3), "text": (64,)}


@pytest.mark.parametrize("name", once_per_structure(models.MODELS))
def test_default_pool_of_every_model_grows_in_pool_order(name):
  """Sizes increase in pool order for every model's default start indices.

  Every neighbour in pool order but (S_1, M_p) is a strict part of the next
  member (same ratio and a larger I, or the same I and a larger ratio, or
  L1): checked on the widths. Only S_1 < M_p needs the parameter counts
  (two builds per model, so deep models stay cheap).
  """
  spec = models.MODELS[name]
  shape = _IMAGES[spec.images]
  units = models.width_units(name, shape, 10)
  if not spec.default_start_indices:
    assert len(units) == 1  # Nothing after the first unit to narrow.
    return
  pool = pools.adaptivefl_pool(units, 0.66, 0.40, spec.default_start_indices)
  members = pool.members
  s1 = pool.member("S1")
  mp = pool.of_class("M")[0]
  for a, b in zip(members, members[1:]):
    if (a, b) != (s1, mp):
      assert contains(b.widths, a.widths) and a.widths != b.widths, (a, b)
  s1_params, mp_params = (
    models.count_params(
      models.build_model(name, shape, 10, seed=0, widths=m.widths)
    ).trainable
    for m in (s1, mp)
  )
  assert s1_params < mp_params, (name, s1_params, mp_params)
