"""The device population of a task: tier capacities resolved on its model.

Capacities belong to the population, not to an algorithm: every algorithm of
a comparison sees the same budgets (fractions of the full model, or parameter
counts, from `--tier_capacities`; by default 0.25 / 0.5 / 1 of the full model
for weak / medium / strong, and for a depth-scalable model with one
registered depth per tier the parameter counts of those depths,
`depth_capacities`). The program builds the population from here, and
the algorithms whose paper lets the server know each tier (HeteroFL) read the
same tiers from here.
"""

from __future__ import annotations

from typing import Any
from typing import Optional
import weakref

from tff_hetero import devices as devices_lib
from tff_hetero import models as models_lib
from tff_hetero.algorithms import api


def resolve_tiers(
  settings: Any, task: api.Task
) -> tuple[devices_lib.TierSpec, ...]:
  """The device tiers of the settings, capacities resolved on the task's model.

  `settings` has the `ExperimentConfig` fields `tiers`, `tier_proportions`,
  `tier_capacities`, `tier_availability` and `tier_fluctuation` (flag strings;
  empty means the default).
  """
  tiers = devices_lib.parse_tiers(
    settings.tiers,
    settings.tier_proportions,
    capacities=settings.tier_capacities or depth_capacities(settings, task),
    availability=settings.tier_availability or None,
    fluctuation=settings.tier_fluctuation or None,
  )
  return devices_lib.resolve_capacities(tiers, *model_size(task))


# id(task) -> {depth (None: the full model): (trainable parameters, MACs)},
# dropped with the task (a `Task` holds dicts: it is not hashable).
_SIZES: dict[int, dict] = {}
# id(task) -> {depth: the model `model_size` built, until `take_built_model`}.
_BUILT: dict[int, dict] = {}


def _task_entries(task: api.Task) -> tuple[dict, dict]:
  key = id(task)
  if key not in _SIZES:
    _SIZES[key] = {}
    _BUILT[key] = {}
    weakref.finalize(task, _SIZES.pop, key, None)
    weakref.finalize(task, _BUILT.pop, key, None)
  return _SIZES[key], _BUILT[key]


def _count(model) -> tuple[int, int]:
  return models_lib.count_params(model).trainable, models_lib.count_flops(model)


def model_size(task: api.Task, depth: Optional[int] = None) -> tuple[int, int]:
  """(trainable parameters, forward MACs per example) of the task's model,
  or of its `depth`-block model; each built once per task (a transformer
  takes seconds to build, and the program asks for these several times).
  The model built for a depth is kept for `take_built_model`."""
  sizes, built = _task_entries(task)
  if depth not in sizes:
    model = task.model_fn() if depth is None else task.depth_model_fn(depth)
    sizes[depth] = _count(model)
    if depth is not None:
      built[depth] = model
  return sizes[depth]


def adopt_full_model(task: api.Task, model) -> None:
  """Takes `model`, a fresh `task.model_fn()` build, as the full model
  `model_size` counts, and for a task with depths as its deepest one's
  (`models.build_model` builds the deepest registered depth when given
  none), kept for `take_built_model`: two builds of a transformer fewer
  while the program is built."""
  sizes, built = _task_entries(task)
  sizes[None] = _count(model)
  if task.depths:
    deepest = max(task.depths)
    sizes[deepest] = sizes[None]
    built[deepest] = model


def release_built_models(task: api.Task) -> None:
  """Drops the models `model_size` kept that nobody took."""
  _BUILT.get(id(task), {}).clear()


def take_built_model(task: api.Task, depth: int):
  """The task's `depth`-block model as `task.depth_model_fn(depth)` builds
  it (seeded), handed over once: the one `model_size` built and counted if
  it has not been taken, else a new one."""
  built = _BUILT.get(id(task), {}).pop(depth, None)
  return task.depth_model_fn(depth) if built is None else built


def depth_capacities(settings: Any, task: api.Task) -> str | None:
  """The default `--tier_capacities` of a depth-scalable model: tier k holds
  the model of the k-th registered depth (e.g. 4 / 8 / 12 encoder blocks,
  InclusiveFL's weak / medium / strong devices), as trainable parameter
  counts; None (the fractions' default) for other models, or when the
  number of tiers differs from the number of registered depths."""
  names = [n for n in str(settings.tiers).split(",") if n.strip()]
  if not task.depths or len(names) != len(task.depths):
    return None
  return ":".join(str(model_size(task, d)[0]) for d in task.depths)


def build_population(
  settings: Any, client_ids, task: api.Task
) -> devices_lib.DevicePopulation:
  """The device population of the settings (`resolve_tiers`), seeded by
  `settings.seed`."""
  return devices_lib.assign_tiers(
    client_ids, resolve_tiers(settings, task), seed=settings.seed
  )
