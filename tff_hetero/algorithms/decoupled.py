"""Decoupled: a separate FedAvg model per size level, trained by the clients
that can hold it.

The baseline of AdaptiveFL (Jia et al., DAC 2024, Section 4.2: "we trained
separate models (i.e., L1, M1, S1 models) for each level using the available
data of affordable clients"): three independent models, shaped like the
AdaptiveFL pool's L1, M1 and S1, that never share weights. The server knows
what each device can hold (it is not AdaptiveFL's setting).

Cohorts (`plan_round`), as the reference code (mastlab-T3S/AdaptiveFL,
`Training_Decoupled.py`) runs it: three FedAvg processes, each sampling its
own `--clients_per_round` clients a round among the clients that can afford
its model, so every model trains on a full cohort every round and S1 also on
the weak devices' data. The reference samples by tier without a capacity
check; here "affordable" is the device population's capacity this round
(the same for every algorithm), so no device trains more than it holds and
none idles. A device drawn for several models trains each of them, from
that model's global weights. Budget, stated because it differs on purpose
from the other methods of a comparison (which train `--clients_per_round`
clients a round): Decoupled trains up to three times as many client-models
a round; the measured traffic and MACs of each client are the sums over
the models it trained (one `ClientTraffic` per client and round). For the
paper's VGG-16 pool M1 and S1 keep 0.82 and 0.72 of L1's MACs (0.50 and
0.25 of its parameters: the pool prunes the deep layers, which hold the
parameters). Each model is its own `width_rounds` server model, so its
accounting and static batch normalisation are those of the other width
algorithms.

Called without a plan (`ClientRound.assignment` None, e.g. by code that
samples its own cohort), a client trains every model that fits its capacity
that round.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf

from tff_hetero.accounting import ClientTraffic
from tff_hetero.aggregators import masked_dp
from tff_hetero.aggregators import model_aggregators
from tff_hetero.algorithms import adaptivefl
from tff_hetero.algorithms import all_large
from tff_hetero.algorithms import api
from tff_hetero.algorithms import width_process
from tff_hetero.algorithms import width_rounds
from tff_hetero.submodels import pools as pools_lib

DECOUPLED_LEVELS = ("L1", "M1", "S1")


@attrs.frozen
class DecoupledState:
  """One `ModelWeights` per level, in `DECOUPLED_LEVELS` order, and the DP
  noise seed (a secret by default; model i draws from seed x 3 + i)."""

  models: tuple[Any, ...]
  noise_seed: Any = np.int64(0)


class Decoupled(api.FederatedAlgorithm):
  """Independent FedAvg models L1, M1, S1; clients train every one that fits."""

  name = "decoupled"

  def __init__(
    self,
    task: api.Task,
    pool: pools_lib.SubModelPool,
    *,
    client_lr: float,
    client_momentum: float = 0.0,
    server_lr: float = 1.0,
    prox_mu: float = 0.0,
    aggregation: masked_dp.MaskedAggregation = masked_dp.MaskedAggregation(),
    noise_seed: Optional[int] = None,
  ):
    self.members = tuple(pool.member(level) for level in DECOUPLED_LEVELS)
    self._population = None
    self.runners = []
    for member in self.members:
      catalog = width_rounds.LevelCatalog(task, [(member.level, member.widths)])
      self.runners.append(
        width_rounds.HeterogeneousRounds(
          catalog,
          client_lr=client_lr,
          client_momentum=client_momentum,
          prox_mu=prox_mu,
          server_lr=server_lr,
          aggregation=aggregation,
        )
      )
    self._aggregation = aggregation
    self._noise_seed = noise_seed

  def initialize(self) -> DecoupledState:
    return DecoupledState(
      models=tuple(
        r.catalog.initial_weights(r.catalog.outer) for r in self.runners
      ),
      noise_seed=masked_dp.initial_noise_seed(
        self._aggregation, self._noise_seed
      ),
    )

  def attach(self, population: Any, client_sizes) -> None:
    del client_sizes
    self._population = population

  def _fitting(self, capacity) -> list[int]:
    params = None if capacity is None else capacity.params
    return [
      i
      for i, runner in enumerate(self.runners)
      if params is None or runner.catalog.outer.params <= params
    ]

  def levels_for(self, client: api.ClientRound) -> list[int]:
    """Indices of the models the client trains this round: the one it was
    drawn for if it holds it, else (no plan) every model it can hold."""
    fitting = self._fitting(client.capacity)
    if client.assignment is None:
      return fitting
    return [client.assignment] if client.assignment in fitting else []

  def plan_round(
    self,
    state: DecoupledState,
    round_num: int,
    available: Sequence[str],
    size: int,
    sampler: Any,
  ) -> list[api.Assignment]:
    """Per model, `size` clients among those that hold it this round."""
    del state
    if self._population is None:
      raise RuntimeError(
        "Decoupled.plan_round: attach() the device population first"
      )
    fitting = {
      c: self._fitting(self._population.capacity_at_round(c, round_num))
      for c in available
    }
    plan = []
    for i in range(len(self.runners)):
      affordable = [c for c in available if i in fitting[c]]
      plan.extend(
        api.Assignment(c, payload=i) for c in sampler.sample(affordable, size)
      )
    return plan

  def next(
    self,
    state: DecoupledState,
    round_num: int,
    clients: Sequence[api.ClientRound],
  ) -> api.RoundOutput:
    by_level = collections.defaultdict(list)
    for client in clients:
      for level in self.levels_for(client):
        by_level[level].append(client)
    models = list(state.models)
    traffic = []
    processed = loss_sum = accuracy_sum = non_finite = 0.0
    starved = False  # A model whose every update with examples was zeroed.
    for i, runner in enumerate(self.runners):
      if not by_level[i]:
        continue
      level = runner.catalog.outer
      result = runner.run(
        models[i],
        [width_rounds.Group(level, level, tuple(by_level[i]))],
        round_num=round_num,
        # One noise stream per model.
        noise_seed=int(state.noise_seed) * len(self.runners) + i,
      )
      models[i] = result.model
      traffic.extend(result.traffic)
      # A client that trains several models counts once per model whose
      # update it sent non-finite (zeroed; the others' loss is kept).
      non_finite += result.metrics["non_finite_updates"]
      n = result.examples_processed
      starved |= n == 0 and result.metrics["non_finite_updates"] > 0
      if n:
        processed += n
        loss_sum += result.metrics["loss"] * n
        accuracy_sum += result.metrics["train_accuracy"] * n
    nan = float("nan")
    metrics = collections.OrderedDict(
      # NaN (the round diverged) if a model had clients with examples but
      # no finite update: it could not train.
      loss=loss_sum / processed if processed and not starved else nan,
      train_accuracy=accuracy_sum / processed if processed else nan,
      non_finite_updates=non_finite,
    )
    for i, member in enumerate(self.members):
      metrics[f"{member.level}_clients"] = float(len(by_level[i]))
    return api.RoundOutput(
      state=attrs.evolve(state, models=tuple(models)),
      metrics=metrics,
      traffic=_per_client(traffic),
    )

  def model_weights(self, state: DecoupledState):
    return state.models[0]

  def evaluation_models(self, state: DecoupledState, data=None):
    return collections.OrderedDict(
      (member.level, runner.evaluation_model(model, runner.catalog.outer, data))
      for member, runner, model in zip(self.members, self.runners, state.models)
    )


def _per_client(traffic) -> tuple[ClientTraffic, ...]:
  """One `ClientTraffic` per client: the sums over the models it trained."""
  merged = collections.OrderedDict()
  for item in traffic:
    merged[item.client_id] = item.plus(merged.get(item.client_id))
  return tuple(merged.values())


def build_decoupled(config, task: api.Task, client_ids=()) -> Decoupled:
  del client_ids  # Clients are assigned by capacity only.
  return Decoupled(
    task,
    adaptivefl.pool_from_config(config, task),
    client_lr=config.client_lr,
    client_momentum=config.client_momentum,
    server_lr=config.server_lr,
    **model_aggregators.width_round_options(config),
  )


@attrs.frozen
class DecoupledProcessState:
  """One `width_process.WidthProcessState` per model, in the builder's
  order of `member_widths`."""

  members: tuple[Any, ...]


@attrs.frozen
class DecoupledRoundOutput:
  """What `DecoupledProcess.next` returns: the new state, each trained
  model's metrics by name, and every client's measured traffic by model
  (a device that trained two models appears under each)."""

  state: DecoupledProcessState
  metrics: collections.OrderedDict
  clients: collections.OrderedDict


class DecoupledProcess:
  """Decoupled (module docstring) for TFF users: independent single-level
  `width_process.WidthProcess`es, one per model, that never share weights.

  `next(state, {name: [datasets]})` runs a round of each named model on its
  own clients; the caller draws each model's cohort among the clients that
  can hold it (`Decoupled.plan_round` is the CLI's: `--clients_per_round`
  per model among the devices whose capacity that round fits it). Each
  model's `computations` are its process's (`processes[name]`).
  """

  def __init__(
    self, processes: collections.OrderedDict[str, width_process.WidthProcess]
  ):
    self.processes = collections.OrderedDict(processes)

  def initialize(self) -> DecoupledProcessState:
    return DecoupledProcessState(
      tuple(p.initialize() for p in self.processes.values())
    )

  def next(
    self, state: DecoupledProcessState, cohorts: Mapping[str, Sequence]
  ) -> DecoupledRoundOutput:
    if not isinstance(cohorts, Mapping):
      raise TypeError(
        "the cohorts must map model names to lists of datasets, got"
        f" {type(cohorts).__name__}"
      )
    unknown = [name for name in cohorts if name not in self.processes]
    if unknown:
      raise KeyError(
        f"no model {unknown[0]!r}; the models are {', '.join(self.processes)}"
      )
    members = list(state.members)
    metrics, clients = collections.OrderedDict(), collections.OrderedDict()
    for i, (name, process) in enumerate(self.processes.items()):
      if not cohorts.get(name):
        continue  # Not trained this round: keeps its model.
      output = process.next(members[i], {1.0: list(cohorts[name])})
      members[i] = output.state
      metrics[name], clients[name] = output.metrics, output.clients
    return DecoupledRoundOutput(
      DecoupledProcessState(tuple(members)), metrics, clients
    )

  def get_model_weights(
    self, state: DecoupledProcessState, name: str, calibration_data=None
  ):
    """Model `name`'s weights (static batch norm from `calibration_data`,
    as `WidthProcess.get_model_weights`)."""
    names = list(self.processes)
    if name not in names:
      raise KeyError(f"no model {name!r}; the models are {', '.join(names)}")
    return self.processes[name].get_model_weights(
      state.members[names.index(name)], 1.0, calibration_data
    )


def build_decoupled_process(
  width_model_fn: Callable[[Sequence[int]], tf.keras.Model],
  *,
  member_widths: Mapping[str, Sequence[int]],
  **options,
) -> DecoupledProcess:
  """Decoupled as a `DecoupledProcess`: one All-Large process
  (`all_large.build_all_large_process`) per entry of `member_widths`
  (name -> widths of `width_model_fn`, e.g. the AdaptiveFL pool's L1, M1
  and S1), each starting from `width_model_fn(widths)`'s own initial
  weights. `options` are `build_heterofl_process`'s; with a private
  aggregation each model draws its own noise: a secret seed each, or, with
  `noise_seed` s, model i draws from s x (number of models) + i, as the
  CLI's; a client that trains k models in a round takes part in k
  mechanisms.
  """
  if not isinstance(member_widths, Mapping) or not member_widths:
    raise TypeError(
      "member_widths must map model names to widths, e.g."
      " {'L1': (64, 128), 'S1': (32, 64)}"
    )
  seed = options.pop("noise_seed", None)
  processes = collections.OrderedDict()
  for i, (name, widths) in enumerate(member_widths.items()):
    processes[str(name)] = all_large.build_all_large_process(
      width_model_fn,
      full_widths=tuple(widths),
      noise_seed=None if seed is None else seed * len(member_widths) + i,
      **options,
    )
  return DecoupledProcess(processes)
