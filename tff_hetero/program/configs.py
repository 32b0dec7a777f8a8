"""Building an `ExperimentConfig` from flat settings, and the CLI's flags.

A run's settings are flat (`--sparsity`, `--rounds`, ...) on the command
line, in `report.json` and in a reproduction's plan; in an `ExperimentConfig`
they are the common fields plus the chosen algorithm's settings class
(`tff_hetero.algorithms.registry`). This module maps one onto the other:

- `make_config(**settings)`: a config from flat settings; a setting the
  algorithm does not read is a `UsageError` naming it and its readers. A
  common setting not given takes the algorithm's own default if its
  registry entry has one (`AlgorithmEntry.defaults`, e.g. InclusiveFL's
  model), else `ExperimentConfig`'s.
- `evolve_config(config, **changes)`: another config from this one; when the
  algorithm changes, the settings the two algorithms share carry over.
- `config_from_values(values, given)`: a config from every flag's value,
  where only the flags in `given` (set on the command line) must be read by
  the algorithm.
- `define_flags` / `config_from_flags`: the absl flags generated from every
  setting's field, and a config from their values.
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Mapping
import functools
from typing import Any

from absl import flags

from tff_hetero import settings as settings_lib
from tff_hetero.algorithms.registry import ALGORITHMS
from tff_hetero.errors import UsageError
from tff_hetero.program.config import ExperimentConfig

COMMON_SETTINGS = frozenset(
  name
  for name in settings_lib.field_names(ExperimentConfig)
  if name != "settings"
)


def flag_specs():
  """`tff_hetero.settings.FlagSpec` of every setting, by flag name."""
  return _flag_specs(tuple(ALGORITHMS))


@functools.lru_cache(maxsize=4)
def _flag_specs(names: tuple[str, ...]):
  return settings_lib.flag_specs(
    ExperimentConfig, {name: ALGORITHMS[name].settings for name in names}
  )


def algorithm_settings(algorithm: str) -> tuple[str, ...]:
  """The names of the settings only `algorithm` (and others) read."""
  return settings_lib.field_names(_entry(algorithm).settings)


def _entry(algorithm: str):
  if algorithm not in ALGORITHMS:
    raise UsageError(
      "--algorithm",
      f"unknown value {algorithm!r}; accepted: " + ", ".join(ALGORITHMS),
    )
  return ALGORITHMS[algorithm]


def _not_read(name: str, algorithm: str) -> UsageError:
  spec = flag_specs().get(name)
  if spec is None:
    return UsageError(f"--{name}", "is not a setting of any algorithm")
  return UsageError(
    f"--{name}",
    f"is not a setting of --algorithm={algorithm}; it is read by"
    f" {', '.join(spec.readers)}",
  )


def make_config(**values: Any) -> ExperimentConfig:
  """An `ExperimentConfig` from flat settings (flag names).

  Settings not given take their defaults (the common ones
  `ExperimentConfig`'s, the algorithm's its settings class's).

  Raises:
    UsageError: unknown `algorithm`, a setting the algorithm does not read,
      or a value its settings class rejects.
  """
  algorithm = values.pop("algorithm", "fedavg")
  entry = _entry(algorithm)
  settings_cls = entry.settings
  own = settings_lib.field_names(settings_cls)
  values = {**entry.defaults, **values}
  for name in values:
    if name not in COMMON_SETTINGS and name not in own:
      raise _not_read(name, algorithm)
  settings = settings_cls(**{k: v for k, v in values.items() if k in own})
  return ExperimentConfig(
    algorithm=algorithm,
    settings=settings,
    **{k: v for k, v in values.items() if k in COMMON_SETTINGS},
  )


def evolve_config(config: ExperimentConfig, **changes: Any) -> ExperimentConfig:
  """`config` with `changes` (flat settings). With another `algorithm`,
  the settings both algorithms read carry over; the others take the new
  algorithm's defaults."""
  algorithm = changes.get("algorithm", config.algorithm)
  own = settings_lib.field_names(_entry(algorithm).settings)
  values = {
    name: getattr(config, name)
    for name in COMMON_SETTINGS
    if name != "algorithm"
  }
  values.update(
    (name, value)
    for name, value in config.settings.to_json_dict().items()
    if name in own
  )
  values.update(changes)
  values["algorithm"] = algorithm
  return make_config(**values)


def config_from_values(
  values: Mapping[str, Any], given: Collection[str] = ()
) -> ExperimentConfig:
  """A config from the values of every flag (`values["algorithm"]` chooses
  the algorithm): its algorithm's settings are taken, the others dropped,
  unless they were `given` explicitly (then `UsageError`)."""
  algorithm = values.get("algorithm", "fedavg")
  entry = _entry(algorithm)
  own = settings_lib.field_names(entry.settings)
  for name in given:
    if name not in COMMON_SETTINGS and name not in own:
      raise _not_read(name, algorithm)
  return make_config(
    **{
      k: v
      for k, v in values.items()
      if (k in COMMON_SETTINGS or k in own)
      # A flag left at its default takes the algorithm's own default.
      and not (k in entry.defaults and k not in given)
    }
  )


def define_flags(flag_values=flags.FLAGS, module_name: str | None = None):
  """Defines a flag for every setting (see `tff_hetero.settings`)."""
  settings_lib.define_flags(flag_specs(), flag_values, module_name)


def config_from_flags(flag_values=flags.FLAGS) -> ExperimentConfig:
  """The config the parsed flags describe (`config_from_values`)."""
  values, given = settings_lib.values_from_flags(flag_values, flag_specs())
  return config_from_values(values, given)
