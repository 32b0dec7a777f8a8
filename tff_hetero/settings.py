"""Typed settings: attrs fields that carry their own flag, help and checks.

Every setting of a run is an attrs field made by `setting(...)`: its
default, its help text, its kind (the absl flag type) and its checks, in one
place. `ExperimentConfig` (`tff_hetero.program.config`) holds the settings
every algorithm reads; each algorithm declares the settings only it reads in
one frozen `AlgorithmSettings` subclass in its own module and registers it
(`tff_hetero.algorithms.registry`). The CLI's absl flags and their
`--helpfull` text are generated from these fields (`define_flags`), so a new
algorithm adds its flags by declaring its settings class.

A check raises `UsageError` naming the flag (`--<field name>`) and what it
accepts, when the settings object is built.

This module imports neither TensorFlow nor TFF.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
import math
import numbers
from typing import Any

from absl import flags
import attrs

from tff_hetero.errors import UsageError

# `setting(kind=...)` -> absl's DEFINE_* of that kind.
_FLAG_KINDS = {
  bool: "bool",
  int: "integer",
  float: "float",
  str: "string",
  tuple: "list",
}


def flag_name(attribute: attrs.Attribute) -> str:
  return f"--{attribute.name}"


def setting(
  default: Any,
  help: str,  # noqa: A002 (absl's own parameter name)
  *,
  kind: type | None = None,
  choices: Iterable[str] | None = None,
  check: Callable[[Any, attrs.Attribute, Any], None] | None = None,
):
  """An attrs field that is also a CLI flag.

  Args:
    default: The default value (also the flag's default).
    help: The flag's help text.
    kind: bool, int, float, str or tuple (a comma-separated list flag);
      `type(default)` when not given (give it when the default is None).
    choices: The accepted values of a string setting (an enum flag).
    check: An attrs validator; raise `UsageError` via the helpers below.
  """
  kind = kind or type(default)
  if kind not in _FLAG_KINDS:
    raise TypeError(f"setting kind {kind!r} is not one of {list(_FLAG_KINDS)}")
  choices = tuple(choices) if choices is not None else None
  validators = []
  if choices is not None:
    validators.append(one_of(choices))
  if check is not None:
    validators.append(check)
  return attrs.field(
    default=default,
    # A list flag's value (or a list from JSON) is kept as a tuple.
    converter=tuple if kind is tuple else None,
    validator=validators or None,
    metadata={"help": help, "kind": kind, "choices": choices},
  )


# Checks (attrs validators) with the project's one-line messages. Those built
# from parameters are frozen attrs callables, so two settings with the same
# check compare equal (`flag_specs` compares definitions).


@attrs.frozen
class _OneOf:
  choices: tuple[str, ...]

  def __call__(self, instance, attribute, value):
    del instance
    if value not in self.choices:
      raise UsageError(
        flag_name(attribute),
        f"unknown value {value!r}; accepted: " + ", ".join(self.choices),
      )


def one_of(choices: Iterable[str]) -> _OneOf:
  return _OneOf(tuple(choices))


def _not_integer(value) -> bool:
  return isinstance(value, bool) or not isinstance(value, numbers.Integral)


def positive_int(instance, attribute, value):
  del instance
  if _not_integer(value) or value < 1:
    raise UsageError(
      flag_name(attribute), f"must be a positive integer, got {value}"
    )


@attrs.frozen
class _NonNegativeInt:
  zero_means: str

  def __call__(self, instance, attribute, value):
    del instance
    if _not_integer(value) or value < 0:
      meaning = f" (0: {self.zero_means})" if self.zero_means else ""
      raise UsageError(
        flag_name(attribute), f"must be >= 0{meaning}, got {value}"
      )


def non_negative_int(zero_means: str = "") -> _NonNegativeInt:
  """An integer >= 0; `zero_means` explains 0 in the message if given."""
  return _NonNegativeInt(zero_means)


def positive_float(instance, attribute, value):
  del instance
  if not (math.isfinite(value) and value > 0):
    raise UsageError(
      flag_name(attribute), f"must be a finite number > 0, got {value}"
    )


def non_negative_float(instance, attribute, value):
  del instance
  if not (math.isfinite(value) and value >= 0):
    raise UsageError(
      flag_name(attribute), f"must be a finite number >= 0, got {value}"
    )


@attrs.frozen
class _InInterval:
  low: float
  high: float
  closed_high: bool
  closed_low: bool
  note: str

  def __call__(self, instance, attribute, value):
    del instance
    above = self.low <= value if self.closed_low else self.low < value
    below = value <= self.high if self.closed_high else value < self.high
    if not (math.isfinite(value) and above and below):
      shown = (
        f"{'[' if self.closed_low else '('}{self.low:g}, {self.high:g}"
        f"{']' if self.closed_high else ')'}{self.note}"
      )
      raise UsageError(flag_name(attribute), f"must be in {shown}, got {value}")


def in_interval(
  low: float, high: float, *, closed_high: bool, closed_low=True, note=""
) -> _InInterval:
  """Finite and between `low` and `high`, each end included if closed;
  `note` follows the interval in the message."""
  return _InInterval(low, high, closed_high, closed_low, note)


@attrs.frozen
class _Optional:
  check: Callable[[Any, attrs.Attribute, Any], None]

  def __call__(self, instance, attribute, value):
    if value is not None:
      self.check(instance, attribute, value)


def optional(check) -> _Optional:
  """`check`, skipped when the value is None (the algorithm's default)."""
  return _Optional(check)


@attrs.frozen(kw_only=True)
class AlgorithmSettings:
  """The settings of an algorithm that reads none beyond the common ones
  (FedAvg, All-Large); the base of every algorithm's settings class."""

  def to_json_dict(self) -> collections.OrderedDict:
    return collections.OrderedDict(
      (field.name, getattr(self, field.name))
      for field in attrs.fields(type(self))
    )


def field_names(cls: type) -> tuple[str, ...]:
  return tuple(field.name for field in attrs.fields(cls))


@attrs.frozen
class FlagSpec:
  """One flag: the field it is made from and the algorithms that read it
  (empty: a common setting, read by every algorithm)."""

  field: attrs.Attribute
  readers: tuple[str, ...] = ()


def flag_specs(
  common: type, algorithms: Mapping[str, type]
) -> "collections.OrderedDict[str, FlagSpec]":
  """Every flag of `common`'s fields and of each algorithm's settings class.

  A setting several algorithms read (e.g. `sparsity`) is one flag; its
  definitions must agree (same default, kind, choices, help and checks), and no
  algorithm setting may reuse a common setting's name.

  Raises:
    ValueError: two definitions of one name disagree.
  """
  specs = collections.OrderedDict()
  for field in attrs.fields(common):
    if "help" in field.metadata:
      specs[field.name] = FlagSpec(field)
  for algorithm, cls in algorithms.items():
    for field in attrs.fields(cls):
      if "help" not in field.metadata:
        raise ValueError(
          f"{cls.__name__}.{field.name} of {algorithm!r} is not a setting()"
        )
      known = specs.get(field.name)
      if known is None:
        specs[field.name] = FlagSpec(field, (algorithm,))
        continue
      if not known.readers:
        raise ValueError(
          f"{cls.__name__}.{field.name} of {algorithm!r} shadows the common"
          f" setting {field.name!r}"
        )
      differing = [
        part
        for part, a, b in zip(
          _DEFINITION_PARTS, _definition(known.field), _definition(field)
        )
        if a != b
      ]
      if differing:
        raise ValueError(
          f"{cls.__name__}.{field.name} of {algorithm!r} disagrees with the"
          f" definition read by {', '.join(known.readers)}:"
          f" {', '.join(differing)} differ"
        )
      specs[field.name] = FlagSpec(known.field, known.readers + (algorithm,))
  return specs


_DEFINITION_PARTS = ("default", "kind", "choices", "help", "checks")


def _definition(field: attrs.Attribute):
  meta = field.metadata
  return (
    field.default,
    meta["kind"],
    meta["choices"],
    meta["help"],
    field.validator,
  )


def define_flags(
  specs: Mapping[str, FlagSpec], flag_values, module_name: str
) -> None:
  """Defines one absl flag per spec in `flag_values`, owned by
  `module_name` (so that `--help` of that program lists them)."""
  for name, spec in specs.items():
    meta = spec.field.metadata
    help_text = meta["help"]
    if spec.readers:
      help_text += f" [{', '.join(spec.readers)}]"
    default = spec.field.default
    common = dict(flag_values=flag_values, module_name=module_name)
    if meta["choices"] is not None:
      flags.DEFINE_enum(
        name, default, list(meta["choices"]), help_text, **common
      )
      continue
    kind = _FLAG_KINDS[meta["kind"]]
    if kind == "list":
      default = list(default) if default is not None else None
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, **common)


def values_from_flags(flag_values, specs: Mapping[str, FlagSpec]):
  """(values of every flag in `specs`, names of the flags given).

  List flags become tuples.
  """
  values = collections.OrderedDict()
  given = set()
  for name in specs:
    flag = flag_values[name]
    values[name] = (
      tuple(flag.value) if isinstance(flag.value, list) else (flag.value)
    )
    if flag.present:
      given.add(name)
  return values, frozenset(given)
