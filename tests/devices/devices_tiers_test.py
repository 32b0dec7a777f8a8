"""Tests of tier parsing from flag strings and capacity resolution."""

from conftest import assert_one_line_error
import pytest

from tff_hetero import devices


def _one_line(call, *needles):
  return assert_one_line_error(devices.DeviceError, call, *needles)


def test_defaults_are_adaptivefl_4_3_3_with_quarter_half_full_capacities():
  tiers = devices.parse_tiers()
  assert [t.name for t in tiers] == ["weak", "medium", "strong"]
  assert [t.proportion for t in tiers] == [4.0, 3.0, 3.0]
  assert [t.capacity_fraction for t in tiers] == [0.25, 0.5, 1.0]
  assert all(
    t.capacity_params is None and t.capacity_flops is None for t in tiers
  )
  assert all(t.availability == 1.0 and t.fluctuation == 0.0 for t in tiers)
  assert tiers == devices.parse_tiers(
    devices.DEFAULT_TIERS, devices.DEFAULT_PROPORTIONS
  )


def test_custom_tiers_capacities_availability_fluctuation():
  tiers = devices.parse_tiers(
    " tiny, big ",
    "8:2",
    capacities="0.1:1",
    availability="0.5:1",
    fluctuation="0.2",
  )
  assert [t.name for t in tiers] == ["tiny", "big"]
  assert [t.proportion for t in tiers] == [8.0, 2.0]
  assert [t.capacity_fraction for t in tiers] == [0.1, 1.0]
  assert [t.availability for t in tiers] == [0.5, 1.0]
  assert [t.fluctuation for t in tiers] == [0.2, 0.2]


def test_resolve_capacities_turns_fractions_into_budgets():
  tiers = devices.resolve_capacities(devices.parse_tiers(), 21_840, 480_500)
  assert [(t.capacity_params, t.capacity_flops) for t in tiers] == [
    (5_460, 120_125),
    (10_920, 240_250),
    (21_840, 480_500),
  ]
  assert all(t.is_resolved for t in tiers)
  # A missing full size leaves that budget unlimited.
  tiers = devices.resolve_capacities(devices.parse_tiers(), 1_000, None)
  assert [(t.capacity_params, t.capacity_flops) for t in tiers] == [
    (250, None),
    (500, None),
    (1_000, None),
  ]
  # Exact decimal arithmetic where it matters: 0.29 of 100 is 29, not 28.
  tiers = devices.parse_tiers("a", "1", capacities="0.29")
  assert devices.resolve_capacities(tiers, 100, 100)[0].capacity_params == 29
  # Tiers given absolute budgets by hand are kept.
  hand = devices.TierSpec("x", 1.0, capacity_params=7, capacity_flops=9)
  assert devices.resolve_capacities([hand], 100, 100) == (hand,)


@pytest.mark.parametrize(
  "tiers, proportions, kwargs, needles",
  [
    ("", "4:3:3", {}, ["--tiers", "''"]),
    ("weak,,strong", "4:3", {}, ["--tiers", "empty tier name"]),
    ("weak,we ak", "1:1", {}, ["--tiers", "'we ak'"]),
    ("weak,weak", "1:1", {}, ["--tiers", "'weak'", "unique"]),
    (
      "weak,medium,strong",
      "4:3",
      {},
      ["--tier_proportions", "2 value(s)", "3 tiers"],
    ),
    ("weak,medium,strong", "4:3:3:1", {}, ["--tier_proportions", "4 value"]),
    (
      "weak,medium,strong",
      "4:x:3",
      {},
      ["--tier_proportions", "'x'", "positive number"],
    ),
    ("weak,medium,strong", "4:0:3", {}, ["--tier_proportions", "'0'"]),
    ("weak,medium,strong", "4:-3:3", {}, ["--tier_proportions", "'-3'"]),
    ("weak,medium,strong", "4:inf:3", {}, ["--tier_proportions", "'inf'"]),
    ("weak,medium,strong", "4,3,3", {}, ["--tier_proportions", "1 value"]),
    ("weak,medium,strong", "", {}, ["--tier_proportions"]),
    ("tiny,big", "1:1", {}, ["--tier_capacities", "'tiny'", "weak=0.25"]),
    (
      "weak,medium,strong",
      "4:3:3",
      dict(capacities="0.2:1.5:1"),
      ["--tier_capacities", "'1.5'", "(0, 1]"],
    ),
    (
      "weak,medium,strong",
      "4:3:3",
      dict(capacities="0.5"),
      ["--tier_capacities", "1 value"],
    ),
    (
      "weak,medium,strong",
      "4:3:3",
      dict(availability="0"),
      ["--tier_availability", "'0'"],
    ),
    (
      "weak,medium,strong",
      "4:3:3",
      dict(availability="1:1"),
      ["--tier_availability", "2 value"],
    ),
    (
      "weak,medium,strong",
      "4:3:3",
      dict(fluctuation="-0.1"),
      ["--tier_fluctuation", "'-0.1'"],
    ),
    (
      "weak,medium,strong",
      "4:3:3",
      dict(fluctuation="nan"),
      ["--tier_fluctuation", "'nan'"],
    ),
  ],
)
def test_bad_flags_raise_one_line_naming_the_flag(
  tiers, proportions, kwargs, needles
):
  _one_line(lambda: devices.parse_tiers(tiers, proportions, **kwargs), *needles)


def test_device_error_is_a_value_error():
  assert issubclass(devices.DeviceError, ValueError)


@pytest.mark.parametrize(
  "kwargs, needle",
  [
    (dict(name="", proportion=1.0), "name"),
    (dict(name="a", proportion=0.0), "proportion"),
    (dict(name="a", proportion=1.0, availability=1.5), "availability"),
    (dict(name="a", proportion=1.0, availability=0.0), "availability"),
    (dict(name="a", proportion=1.0, fluctuation=-1.0), "fluctuation"),
    (dict(name="a", proportion=1.0, capacity_params=0), "capacity_params"),
    (dict(name="a", proportion=1.0, capacity_flops=2.5), "capacity_flops"),
    (
      dict(name="a", proportion=1.0, capacity_fraction=2.0),
      "capacity_fraction",
    ),
  ],
)
def test_tier_spec_validates_its_fields(kwargs, needle):
  _one_line(lambda: devices.TierSpec(**kwargs), needle)


def test_resolve_capacities_rejects_bad_sizes():
  _one_line(
    lambda: devices.resolve_capacities(devices.parse_tiers(), 0, None),
    "full_params",
  )
  _one_line(
    lambda: devices.resolve_capacities(devices.parse_tiers(), 10, 1.5),
    "full_flops",
  )


def test_capacities_as_parameter_counts():
  # A value > 1 is a number of parameters: kept as given, MACs unlimited;
  # fractions resolve against the full model: floor(f x 1000 + 0.5).
  tiers = devices.parse_tiers(
    "weak,medium,strong", "4:3:3", capacities="250:0.5:1"
  )
  assert [(t.capacity_params, t.capacity_fraction) for t in tiers] == [
    (250, None),
    (None, 0.5),
    (None, 1.0),
  ]
  resolved = devices.resolve_capacities(tiers, 1000, 80)
  assert [(t.capacity_params, t.capacity_flops) for t in resolved] == [
    (250, None),
    (500, 40),
    (1000, 80),
  ]
  _one_line(
    lambda: devices.parse_tiers(
      "weak,medium,strong", "4:3:3", capacities="250.5:0.5:1"
    ),
    "--tier_capacities",
    "'250.5'",
    "whole number of parameters",
  )
