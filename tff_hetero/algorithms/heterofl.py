"""HeteroFL (Diao, Ding and Tarokh, "HeteroFL: Computation and Communication
Efficient Federated Learning for Heterogeneous Clients", ICLR 2021).

Every device class trains a fixed-width sub-model of the one global model:
each hidden layer keeps its first ceil(width x rate) channels (rates such as
1, 1/2, 1/4; `tff_hetero.submodels.pools.uniform_pool`), the classifier keeps
every class. The server knows each client's class (HeteroFL's "fixed"
assignment), sends it the sub-model of its rate, and aggregates the
overlapping sub-matrices per element: every element becomes the average of
the values the clients that hold it returned, elements no client holds keep
their value (`width_rounds.py`). Batch normalisation is static (sBN,
`static_batch_norm.py`): trained with batch statistics only, its statistics
computed from the clients' data before evaluation.

Decisions (HeteroFL's code, diaoenmao/HeteroFL-...):
* Clients are weighted by their number of examples (as AdaptiveFL's
  reference runs its HeteroFL baseline); HeteroFL's own combine counts each
  client once.
* Not implemented: the Scaler module (activations divided by the rate in
  training), the masking of logits of classes a client does not hold, and
  the "dynamic" mode that re-draws rates each round.

Rates come one per device tier (`--heterofl_rates`, in `--tiers` order;
default 0.25 / 0.5 / 1 for weak / medium / strong). Evaluation: every rate's
sub-model, widest first (`accuracy` is the full model), and their mean.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from tff_hetero.algorithms import api
from tff_hetero.algorithms import width_rounds
from tff_hetero.submodels import pools as pools_lib


class HeteroFL(api.FederatedAlgorithm):
  """HeteroFL with fixed rates per device tier."""

  name = "heterofl"

  def __init__(self, task: api.Task, tier_rates: Mapping[str, float], *,
               client_lr: float, client_momentum: float = 0.0,
               server_lr: float = 1.0, prox_mu: float = 0.0):
    self.tier_rates = dict(tier_rates)
    self.pool = pools_lib.uniform_pool(
        task.width_units, list(self.tier_rates.values()) + [1.0], "ceil")
    self.catalog = width_rounds.LevelCatalog(
        task, [(m.level, m.widths) for m in self.pool.members])
    self.rounds = width_rounds.HeterogeneousRounds(
        self.catalog, client_lr=client_lr, client_momentum=client_momentum,
        prox_mu=prox_mu, server_lr=server_lr)
    self._level_of_rate = {m.ratio: self.catalog.levels[m.index]
                           for m in self.pool.members}

  def tier_capacities(self, tier_names):
    """Each tier holds exactly the sub-model of its rate."""
    return {t: self._level_of_rate[float(self.tier_rates[t])].capacity()
            for t in tier_names if t in self.tier_rates}

  def initialize(self) -> width_rounds.WidthState:
    return width_rounds.WidthState(
        model=self.catalog.initial_weights(self.catalog.outer))

  def level_of(self, client: api.ClientRound) -> width_rounds.Level:
    return self._level_of_rate[float(self.tier_rates[client.tier])]

  def next(self, state: width_rounds.WidthState, round_num: int,
           clients: Sequence[api.ClientRound]) -> api.RoundOutput:
    del round_num
    by_level = collections.OrderedDict()
    for client in clients:
      by_level.setdefault(self.level_of(client).index, []).append(client)
    levels = self.catalog.levels
    groups = [width_rounds.Group(levels[i], levels[i], tuple(members))
              for i, members in sorted(by_level.items())]
    result = self.rounds.run(state.model, groups)
    return api.RoundOutput(state=width_rounds.WidthState(model=result.model),
                           metrics=result.metrics, traffic=result.traffic)

  def model_weights(self, state: width_rounds.WidthState):
    return state.model

  def evaluation_models(self, state: width_rounds.WidthState, data=None):
    return collections.OrderedDict(
        (level.name, self.rounds.evaluation_model(state.model, level, data))
        for level in reversed(self.catalog.levels))


DEFAULT_TIER_RATES = {"weak": 0.25, "medium": 0.5, "strong": 1.0}


def tier_rates_from_config(config) -> dict[str, float]:
  """`--heterofl_rates`, one per tier of `--tiers` (defaults for weak/medium/strong)."""
  from tff_hetero.program.config import parse_number_list  # pylint: disable=g-import-not-at-top
  from tff_hetero.program.errors import UsageError  # pylint: disable=g-import-not-at-top
  tiers = [t.strip() for t in config.tiers.split(",")]
  if not config.heterofl_rates:
    missing = [t for t in tiers if t not in DEFAULT_TIER_RATES]
    if missing:
      raise UsageError(
          "--heterofl_rates",
          f"no default rate for tier(s) {', '.join(missing)}; give one rate"
          f" per tier of --tiers={config.tiers}")
    return {t: DEFAULT_TIER_RATES[t] for t in tiers}
  rates = parse_number_list("--heterofl_rates", config.heterofl_rates)
  if len(rates) != len(tiers):
    raise UsageError(
        "--heterofl_rates",
        f"needs one rate per tier of --tiers={config.tiers}, got"
        f" {len(rates)}")
  if not all(0 < r <= 1 for r in rates):
    raise UsageError("--heterofl_rates",
                     f"rates must lie in (0, 1], got {config.heterofl_rates}")
  return dict(zip(tiers, rates))


def build_heterofl(config, task: api.Task, client_ids=()) -> HeteroFL:
  del client_ids  # The server assigns widths by tier only.
  from tff_hetero.program.errors import UsageError  # pylint: disable=g-import-not-at-top
  if not task.width_units:
    raise UsageError("--model", f"{task.model_name} has no width knobs")
  return HeteroFL(task, tier_rates_from_config(config),
                  client_lr=config.client_lr,
                  client_momentum=config.client_momentum,
                  server_lr=config.server_lr)
