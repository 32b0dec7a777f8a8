"""Registry of algorithms the program and CLI can run.

Each entry names a builder `(config, task, client_ids) -> FederatedAlgorithm`; a new
algorithm registers itself here instead of growing an if/elif chain.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import attrs

from tff_hetero.aggregators import model_aggregators
from tff_hetero.algorithms import adaptivefl
from tff_hetero.algorithms import all_large
from tff_hetero.algorithms import decoupled
from tff_hetero.algorithms import fedadam
from tff_hetero.algorithms import fedavg
from tff_hetero.algorithms import fedgkt
from tff_hetero.algorithms import fedprox
from tff_hetero.algorithms import heterofl
from tff_hetero.algorithms import split_learning
from tff_hetero.algorithms.sparse import feddst
from tff_hetero.algorithms.sparse import fedsgc
from tff_hetero.algorithms.sparse import grasp
from tff_hetero.algorithms.sparse import prunefl


@attrs.frozen
class AlgorithmEntry:
  name: str
  builder: Callable
  paper: str
  # `--client_optimizer` values the builder honours.
  client_optimizers: tuple[str, ...] = ("sgd",)
  # `ExperimentConfig` fields only some algorithms read, declared by each
  # algorithm that reads them (undeclared fields count for every algorithm).
  settings: frozenset[str] = frozenset()
  # `--aggregator` values the builder honours.
  aggregators: tuple[str, ...] = ("mean",)


ALGORITHMS: "collections.OrderedDict[str, AlgorithmEntry]" = (
  collections.OrderedDict()
)


def register(
  name: str,
  builder: Callable,
  paper: str,
  client_optimizers: tuple[str, ...] = ("sgd",),
  settings: tuple[str, ...] = (),
  aggregators: tuple[str, ...] = ("mean",),
) -> None:
  if name in ALGORITHMS:
    raise ValueError(f"algorithm {name!r} is already registered")
  ALGORITHMS[name] = AlgorithmEntry(
    name,
    builder,
    paper,
    tuple(client_optimizers),
    frozenset(settings),
    tuple(aggregators),
  )


def foreign_settings(name: str) -> frozenset[str]:
  """Settings other algorithms declare and `name` does not read: they do not
  change its results (resume and reuse of runs ignore them)."""
  declared = frozenset().union(*(e.settings for e in ALGORITHMS.values()))
  return declared - ALGORITHMS[name].settings


_SGD_OR_ADAM = ("sgd", "adam")
# `--aggregator` choices (`tff_hetero.aggregators.model_aggregators`): TFF's
# factories for the homogeneous algorithms, their masked counterparts
# (`masked_dp`) for the width ones; the sparse and FedGKT families have only
# their own aggregation (`mean`).
_TFF_AGGREGATORS = tuple(model_aggregators.MODEL_AGGREGATORS)
register(
  "fedavg",
  fedavg.build_fedavg,
  "McMahan et al. 2017",
  _SGD_OR_ADAM,
  aggregators=_TFF_AGGREGATORS,
)
register(
  "fedprox",
  fedprox.build_fedprox,
  "Li et al. 2020",
  _SGD_OR_ADAM,
  aggregators=_TFF_AGGREGATORS,
)
register(
  "fedadam",
  fedadam.build_fedadam,
  "Reddi et al. 2021",
  aggregators=_TFF_AGGREGATORS,
)
register(
  "adaptivefl",
  adaptivefl.build_adaptivefl,
  "Jia et al. 2024",
  aggregators=_TFF_AGGREGATORS,
)
register(
  "heterofl",
  heterofl.build_heterofl,
  "Diao et al. 2021",
  aggregators=_TFF_AGGREGATORS,
)
register(
  "all_large",
  all_large.build_all_large,
  "McMahan et al. 2017, as AdaptiveFL's All-Large baseline",
  aggregators=_TFF_AGGREGATORS,
)
register(
  "decoupled",
  decoupled.build_decoupled,
  "AdaptiveFL's Decoupled baseline (Jia et al. 2024)",
  aggregators=_TFF_AGGREGATORS,
)
_SPARSITY = ("sparsity",)
_READJUST = (
  "readjust_every",
  "readjust_end_round",
  "readjust_delta_epochs",
  "readjust_begin_epoch",
  "readjust_end_epoch",
  "prune_alpha",
)
register(
  "fedsgc",
  fedsgc.build_fedsgc,
  "Gradient-Congruity Guided Federated Sparse Training",
  _SGD_OR_ADAM,
  _SPARSITY + _READJUST + ("congruity_lambda", "sgc_memory"),
)
register(
  "feddst",
  feddst.build_feddst,
  "Bibikar et al. 2022",
  _SGD_OR_ADAM,
  _SPARSITY + _READJUST,
)
register(
  "prunefl",
  prunefl.build_prunefl,
  "Jiang et al. 2022 (PruneFL), as FedSGC's baseline",
  _SGD_OR_ADAM,
  _SPARSITY
  + (
    "prunefl_readjust_every",
    "prunefl_initial_rounds",
    "prunefl_initial_readjust_every",
  ),
)
register(
  "grasp",
  grasp.build_grasp,
  "Wang et al. 2020 (GraSP) on one client, as FedSGC's baseline",
  _SGD_OR_ADAM,
  _SPARSITY,
)
register("fedgkt", fedgkt.build_fedgkt, "He et al. 2020 (FedGKT)")
register(
  "split_learning",
  split_learning.build_split_learning,
  "Gupta & Raskar 2018, FedGKT's communication baseline",
)
