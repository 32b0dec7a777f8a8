"""HeteroFL narrowing only the width units `--heterofl_width_units` names."""

import functools
import math

import attrs
import pytest

from tff_hetero import data as data_lib
from tff_hetero import models as models_lib
from tff_hetero.algorithms import heterofl
from tff_hetero.errors import UsageError
from tff_hetero.program import loop
from tff_hetero.program import make_config
from tff_hetero.submodels import pools as pools_lib


def _config(**changes):
  return make_config(
    algorithm="heterofl",
    dataset="synthetic",
    model="transformer",
    tier_proportions="1:1:1",
    **changes,
  )


@functools.cache
def _task():
  """The transformer's task on the synthetic data (the same for every
  `_config`), its width and depth models built once per argument: a
  transformer takes seconds to build, and the test counts the parameters of
  models the rate search and the tiers count too."""
  splits = data_lib.load_dataset("synthetic", None, seed=0)
  task = loop.build_task(_config(), splits)
  width_model = functools.cache(task.width_model_fn)
  return attrs.evolve(
    task,
    width_model_fn=lambda widths: width_model(tuple(widths)),
    depth_model_fn=functools.cache(task.depth_model_fn),
  )


def _task_and_config(**changes):
  return _task(), _config(**changes)


def test_hidden_only_rates_keep_the_mlp_width_and_fit_the_depth_tiers():
  task, config = _task_and_config(heterofl_width_units="hidden")
  rates = heterofl.tier_rates_from_config(config, task)
  pool = pools_lib.uniform_pool(
    task.width_units, sorted(set(rates.values())), "ceil", {"hidden"}
  )
  # The transformer on 8x8 images: 64 hidden, MLP 128; unit order (hidden,
  # mlp). Every member keeps the MLP at 128, the hidden size ceil(64 r).
  assert [u.name for u in task.width_units] == ["hidden", "mlp"]
  for member in pool.members:
    assert member.widths == (math.ceil(64 * member.ratio - 1e-9), 128)
  # Each tier's sub-model fits its depth tier's parameter count (the
  # population's default capacities on a depth-scalable model), and the
  # next rate step (0.01 more) would not.
  for tier, depth in zip(("weak", "medium"), (4, 8)):
    capacity = models_lib.count_params(task.depth_model_fn(depth)).trainable
    fits = heterofl.sub_model_params(
      task, rates[tier], scaled_units=frozenset({"hidden"})
    )
    over = heterofl.sub_model_params(
      task, round(rates[tier] + 0.01, 2), scaled_units=frozenset({"hidden"})
    )
    assert fits <= capacity < over
  assert rates["strong"] == 1.0


def test_an_unknown_width_unit_is_a_one_line_error():
  task, config = _task_and_config(heterofl_width_units="hidden,heads")
  with pytest.raises(
    UsageError, match="--heterofl_width_units: transformer has no width unit"
  ):
    heterofl.build_heterofl(config, task)
