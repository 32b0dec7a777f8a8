"""Registry of algorithms the program and CLI can run.

Each entry names a builder `(config, task, client_ids) -> FederatedAlgorithm`
and the algorithm's settings class (whose fields become its flags); a new
algorithm adds one `register(...)` line here instead of growing an if/elif
chain.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Mapping
import types
from typing import Any

import attrs

from tff_hetero.aggregators import model_aggregators
from tff_hetero.algorithms import adaptivefl
from tff_hetero.algorithms import all_large
from tff_hetero.algorithms import decoupled
from tff_hetero.algorithms import fedadam
from tff_hetero.algorithms import fedavg
from tff_hetero.algorithms import fedgkt
from tff_hetero.algorithms import fednova
from tff_hetero.algorithms import fedprox
from tff_hetero.algorithms import heterofl
from tff_hetero.algorithms import inclusivefl
from tff_hetero.algorithms import scaffold
from tff_hetero.algorithms import split_learning
from tff_hetero.algorithms.sparse import feddst
from tff_hetero.algorithms.sparse import fedsgc
from tff_hetero.algorithms.sparse import grasp
from tff_hetero.algorithms.sparse import prunefl
from tff_hetero.algorithms.sparse.settings import DynamicSparseSettings
from tff_hetero.algorithms.sparse.settings import SparseSettings
from tff_hetero.algorithms.spatl import spatl
from tff_hetero.settings import AlgorithmSettings


@attrs.frozen
class AlgorithmEntry:
  name: str
  builder: Callable
  paper: str
  # `--client_optimizer` values the builder honours.
  client_optimizers: tuple[str, ...] = ("sgd",)
  # The algorithm's own settings (`tff_hetero.settings.AlgorithmSettings`
  # subclass); its fields become flags and `ExperimentConfig.settings`.
  settings: type = AlgorithmSettings
  # `--aggregator` values the builder honours.
  aggregators: tuple[str, ...] = ("mean",)
  # Whether the builder honours `--client_momentum` > 0.
  client_momentum: bool = True
  # Common settings whose default differs for this algorithm (e.g. its
  # default model); a value given explicitly always wins.
  defaults: Mapping[str, Any] = attrs.field(
    factory=dict, converter=lambda d: types.MappingProxyType(dict(d))
  )


ALGORITHMS: "collections.OrderedDict[str, AlgorithmEntry]" = (
  collections.OrderedDict()
)


def register(
  name: str,
  builder: Callable,
  paper: str,
  client_optimizers: tuple[str, ...] = ("sgd",),
  settings: type = AlgorithmSettings,
  aggregators: tuple[str, ...] = ("mean",),
  client_momentum: bool = True,
  defaults: Mapping[str, Any] = (),
) -> None:
  if name in ALGORITHMS:
    raise ValueError(f"algorithm {name!r} is already registered")
  if not (
    isinstance(settings, type) and issubclass(settings, AlgorithmSettings)
  ):
    raise TypeError(
      f"settings of {name!r} must be an AlgorithmSettings subclass,"
      f" got {settings!r}"
    )
  ALGORITHMS[name] = AlgorithmEntry(
    name,
    builder,
    paper,
    tuple(client_optimizers),
    settings,
    tuple(aggregators),
    bool(client_momentum),
    dict(defaults),
  )


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
  settings=fedprox.FedProxSettings,
  aggregators=_TFF_AGGREGATORS,
)
register(
  "fedadam",
  fedadam.build_fedadam,
  "Reddi et al. 2021",
  settings=fedadam.FedAdamSettings,
  aggregators=_TFF_AGGREGATORS,
)
# a_i travels with the normalised update: a clipping or noising aggregator
# would change it too (`fednova.py`).
register("fednova", fednova.build_fednova, "Wang et al. 2020")
# Option II's control variate divides by K eta_l: plain SGD only.
register(
  "scaffold",
  scaffold.build_scaffold,
  "Karimireddy et al. 2020",
  client_momentum=False,
)
register(
  "adaptivefl",
  adaptivefl.build_adaptivefl,
  "Jia et al. 2024",
  settings=adaptivefl.AdaptiveFLSettings,
  aggregators=_TFF_AGGREGATORS,
)
register(
  "heterofl",
  heterofl.build_heterofl,
  "Diao et al. 2021",
  settings=heterofl.HeteroFLSettings,
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
  settings=adaptivefl.PoolSettings,
  aggregators=_TFF_AGGREGATORS,
)
register(
  "fedsgc",
  fedsgc.build_fedsgc,
  "Gradient-Congruity Guided Federated Sparse Training",
  _SGD_OR_ADAM,
  settings=fedsgc.FedSGCSettings,
)
register(
  "feddst",
  feddst.build_feddst,
  "Bibikar et al. 2022",
  _SGD_OR_ADAM,
  settings=DynamicSparseSettings,
)
register(
  "prunefl",
  prunefl.build_prunefl,
  "Jiang et al. 2022 (PruneFL), as FedSGC's baseline",
  _SGD_OR_ADAM,
  settings=prunefl.PruneFLSettings,
)
register(
  "grasp",
  grasp.build_grasp,
  "Wang et al. 2020 (GraSP) on one client, as FedSGC's baseline",
  _SGD_OR_ADAM,
  settings=SparseSettings,
)
register(
  "fedgkt",
  fedgkt.build_fedgkt,
  "He et al. 2020 (FedGKT)",
  settings=fedgkt.FedGKTSettings,
)
register(
  "split_learning",
  split_learning.build_split_learning,
  "Gupta & Raskar 2018, FedGKT's communication baseline",
  settings=split_learning.SplitLearningSettings,
)

# Eq. 10 divides by the clients' learning rate: plain SGD only.
register(
  "spatl",
  spatl.build_spatl,
  "Yu et al. 2022 (SPATL)",
  settings=spatl.SpatlSettings,
  client_momentum=False,
  defaults=spatl.DEFAULTS,
)

# InclusiveFL and the baselines of its Table 2 (one builder, `VARIANTS`), on
# the depth-scalable transformer unless --model says otherwise.
for _variant, _paper in (
  ("inclusivefl", "Liu et al. 2022 (InclusiveFL)"),
  (
    "inclusivefl_all_large",
    "InclusiveFL's AllLarge baseline (Liu et al. 2022)",
  ),
  (
    "inclusivefl_all_small",
    "InclusiveFL's AllSmall baseline (Liu et al. 2022)",
  ),
  ("exclusivefl", "InclusiveFL's ExclusiveFL baseline (Liu et al. 2022)"),
  ("inclusivefl_local", "InclusiveFL's Local baseline (Liu et al. 2022)"),
):
  register(
    _variant,
    inclusivefl.build_inclusivefl,
    _paper,
    settings=(
      inclusivefl.InclusiveFLSettings
      if inclusivefl.VARIANTS[_variant].distil
      else inclusivefl.DepthSettings
    ),
    defaults=inclusivefl.DEFAULTS,
  )
