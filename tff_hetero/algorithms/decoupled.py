"""Decoupled: a separate FedAvg model per size level, trained by the clients
that can hold it.

The baseline of AdaptiveFL (Jia et al., DAC 2024, Section 4.2: "we trained
separate models (i.e., L1, M1, S1 models) for each level using the available
data of affordable clients"): three independent models, shaped like the
AdaptiveFL pool's L1, M1 and S1, that never share weights. The server knows
what each device can hold (it is not AdaptiveFL's setting): every sampled
client trains the largest of the three that fits its capacity this round;
a client that can hold none trains nothing and receives nothing.

Decision: the reference code (mastlab-T3S/AdaptiveFL,
`Training_Decoupled.py`) runs three FedAvg processes that each sample m
clients among the eligible ones, i.e. three times the cohort; here one cohort
of `--clients_per_round` clients is shared, so every method of a comparison
trains the same number of clients per round. Each model is its own
`width_rounds` server model, so its accounting and static batch
normalisation are those of the other width algorithms.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import attrs

from tff_hetero.algorithms import api
from tff_hetero.algorithms import width_rounds
from tff_hetero.submodels import pools as pools_lib

DECOUPLED_LEVELS = ("L1", "M1", "S1")


@attrs.frozen
class DecoupledState:
  """One `ModelWeights` per level, in `DECOUPLED_LEVELS` order."""

  models: tuple[Any, ...]


class Decoupled(api.FederatedAlgorithm):
  """Independent FedAvg models L1, M1, S1; clients train the largest that fits."""

  name = "decoupled"

  def __init__(self, task: api.Task, pool: pools_lib.SubModelPool, *,
               client_lr: float, client_momentum: float = 0.0,
               server_lr: float = 1.0, prox_mu: float = 0.0):
    self.members = tuple(pool.member(level) for level in DECOUPLED_LEVELS)
    self.runners = []
    for member in self.members:
      catalog = width_rounds.LevelCatalog(task, [(member.level,
                                                  member.widths)])
      self.runners.append(width_rounds.HeterogeneousRounds(
          catalog, client_lr=client_lr, client_momentum=client_momentum,
          prox_mu=prox_mu, server_lr=server_lr))

  def tier_capacities(self, tier_names):
    from tff_hetero.algorithms.adaptivefl import TIER_LEVELS  # pylint: disable=g-import-not-at-top
    outers = {r.catalog.outer.name: r.catalog.outer for r in self.runners}
    return {t: outers[TIER_LEVELS[t]].capacity()
            for t in tier_names if t in TIER_LEVELS}

  def initialize(self) -> DecoupledState:
    return DecoupledState(models=tuple(
        r.catalog.initial_weights(r.catalog.outer) for r in self.runners))

  def level_for(self, client: api.ClientRound):
    """Index of the largest model the client can hold, or None."""
    capacity = None if client.capacity is None else client.capacity.params
    for i, runner in enumerate(self.runners):  # Largest first.
      if capacity is None or runner.catalog.outer.params <= capacity:
        return i
    return None

  def next(self, state: DecoupledState, round_num: int,
           clients: Sequence[api.ClientRound]) -> api.RoundOutput:
    del round_num
    by_level = collections.defaultdict(list)
    for client in clients:
      level = self.level_for(client)
      if level is not None:
        by_level[level].append(client)
    models = list(state.models)
    traffic = []
    processed = loss_sum = accuracy_sum = 0.0
    diverged = False
    for i, runner in enumerate(self.runners):
      if not by_level[i]:
        continue
      level = runner.catalog.outer
      result = runner.run(models[i], [width_rounds.Group(
          level, level, tuple(by_level[i]))])
      models[i] = result.model
      traffic.extend(result.traffic)
      n = result.examples_processed
      diverged |= n != result.examples_expected
      processed += n
      loss_sum += result.metrics["loss"] * n
      accuracy_sum += result.metrics["train_accuracy"] * n
    nan = float("nan")
    metrics = collections.OrderedDict(
        loss=nan if diverged or not processed else loss_sum / processed,
        train_accuracy=accuracy_sum / processed if processed else nan)
    for i, member in enumerate(self.members):
      metrics[f"{member.level}_clients"] = float(len(by_level[i]))
    return api.RoundOutput(state=DecoupledState(models=tuple(models)),
                           metrics=metrics, traffic=tuple(traffic))

  def model_weights(self, state: DecoupledState):
    return state.models[0]

  def evaluation_models(self, state: DecoupledState, data=None):
    return collections.OrderedDict(
        (member.level, runner.evaluation_model(
            model, runner.catalog.outer, data))
        for member, runner, model in zip(self.members, self.runners,
                                         state.models))


def build_decoupled(config, task: api.Task, client_ids=()) -> Decoupled:
  del client_ids  # Clients are assigned by capacity only.
  from tff_hetero.algorithms import adaptivefl  # pylint: disable=g-import-not-at-top
  return Decoupled(task, adaptivefl.pool_from_config(config, task),
                   client_lr=config.client_lr,
                   client_momentum=config.client_momentum,
                   server_lr=config.server_lr)
