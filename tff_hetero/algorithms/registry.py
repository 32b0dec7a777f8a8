"""Registry of algorithms the program and CLI can run.

Each entry names a builder `(config, task) -> FederatedAlgorithm`; a new
algorithm registers itself here instead of growing an if/elif chain.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import attrs

from tff_hetero.algorithms import fedadam
from tff_hetero.algorithms import fedavg
from tff_hetero.algorithms import fedprox


@attrs.frozen
class AlgorithmEntry:
  name: str
  builder: Callable
  paper: str


ALGORITHMS: "collections.OrderedDict[str, AlgorithmEntry]" = collections.OrderedDict()


def register(name: str, builder: Callable, paper: str) -> None:
  if name in ALGORITHMS:
    raise ValueError(f"algorithm {name!r} is already registered")
  ALGORITHMS[name] = AlgorithmEntry(name, builder, paper)


register("fedavg", fedavg.build_fedavg, "McMahan et al. 2017")
register("fedprox", fedprox.build_fedprox, "Li et al. 2020")
register("fedadam", fedadam.build_fedadam, "Reddi et al. 2021")
