"""AdaptiveFL (Jia et al., "AdaptiveFL: Adaptive Heterogeneous Federated Learning
for Resource-Constrained AIoT Systems", DAC 2024).

Each round (Algorithm 1):

1. the server draws K models uniformly, with replacement, from the pool
   R = {S_p, ..., S_1, M_p, ..., M_1, L1} (`tff_hetero.submodels.pools`);
2. for each drawn model m it picks a client with probability proportional to
   the reward R(m, c) = min(0.5, R_s(m, c)) x R_c(m, c) among the available
   clients not yet picked this round (Section 3.3), where
     R_s(m, c) = sum_{k in type(m)} sum_{t >= k} T_r[t][c]
                 / (|type(m)| x sum_t T_r[t][c])      (resource reward)
     R_c(m, c) = 1 / sqrt(T_c[type(m)][c])            (curiosity reward)
   with T_r the resource table (one row per pool member, in pool order) and
   T_c the curiosity table (one row per model type S, M, L), both 1 at the
   start;
3. the client (its device, not the server) keeps the model if it fits its
   resource capacity, else prunes it to the largest pool member that is part
   of it, fits, and has I >= tau (Section 3.2), trains that, and returns it
   with its level;
4. the server aggregates the returned sub-models per element, weighted by
   data size, keeping elements nobody returned (Algorithm 2,
   `width_rounds.py`), and updates the tables from (sent, returned):
     T_c[type(sent)][c] += 1;  T_c[type(returned)][c] += 1
     kept:   T_r[t][c] += 1 for every t >= sent;  T_r[L1][c] += p - 1
     pruned: T_r[returned][c] += p; then T_r[t][c] = max(T_r[t][c] - tau, 0)
             for t = returned, returned+1, ..., L1 with tau = 0, 1, 2, ...

The server never reads a device's capacity: `plan_round` sees only the
tables, and the capacity reaches `choose_trained_member`, the device's own
decision, through the client's `ClientRound`. (`tier_capacities` only sets
up the simulated devices as Section 4.1 describes them: without
`--tier_capacities` a weak device holds exactly S1, a medium one M1, a strong
one L1.)

Decisions where the paper is silent or its reference code
(mastlab-T3S/AdaptiveFL) differs:
* R_s of the L type divides by |type(L)| = 1 (the reference's `L =
  sum(T[6:]) / total`), which is the paper's formula with the type's size in
  place of p; for S and M both are p.
* The kept branch adds p - 1 to T_r[L1] whatever was sent (Algorithm 1,
  line 21); the reference adds it only when L1 was sent.
* A client prunes only to members that are part of what it received (the
  paper's prune(W; r_w, I) of the received W); the reference falls back to
  the largest pool member that fits, which need not be a sub-model of it.
* A client that cannot hold even the smallest part receives the model and
  returns nothing; its tables are updated as a prune to S_p without the
  credit for S_p: T_c[type(sent)] += 1 and T_r[t] -= 0, 1, 2, ... from S_p
  up (floored at 0), so T_r[S_p] keeps the client selectable should its
  capacity recover.
* If every available client has reward 0 for a model, the client is drawn
  uniformly among the available ones.
* Batch normalisation is static (`static_batch_norm.py`); the reference
  evaluates with test-batch statistics.

Ablation variants (Figure 5): `greedy` always sends L1 to uniformly chosen
clients; `random` draws models and clients uniformly; `curiosity` uses the
reward R_c only, `resource` R_s only (without the 0.5 cap, which only exists
to hand ties to curiosity). A pool with one start index (p = 1) is the
coarse-grained ablation of Table 4.

Metrics each round: `waste_rate` = 1 - sum(bytes of returned models) /
sum(bytes of sent models), both measured on the tensors sent (and the two
sums, `sent_model_bytes` and `returned_model_bytes`, so that a run's rate can
be summed over rounds), `pruned` (clients that pruned) and `failed` (clients
that could train nothing).
Evaluation: the full model (L1) and M1 and S1, each with static BN
statistics, and their mean (`avg_accuracy`), the paper's "full" and "avg".
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any, Optional

import attrs
import numpy as np

from tff_hetero.algorithms import api
from tff_hetero.algorithms import width_rounds
from tff_hetero.models import width as width_lib
from tff_hetero.submodels import pools as pools_lib

SELECTIONS = ("rl", "greedy", "random", "curiosity", "resource")
# Section 4.1: "weak devices can only accommodate weak models, medium devices
# can train medium or small models, while strong devices can accommodate
# models of any type". Without --tier_capacities each such tier can hold
# exactly the largest model of its type.
TIER_LEVELS = {"weak": "S1", "medium": "M1", "strong": "L1"}
_TYPE_ROWS = {c: i for i, c in enumerate(pools_lib.SIZE_CLASSES)}


@attrs.frozen
class SelectionTables:
  """AdaptiveFL's RL tables (int64), one column per client id (sorted).

  Attributes:
    curiosity: T_c, shape [3, num_clients]: rows S, M, L.
    resource: T_r, shape [pool size, num_clients]: rows in pool order.
  """

  curiosity: np.ndarray
  resource: np.ndarray


@attrs.frozen
class AdaptiveFLState:
  """Server state: the global model and the selection tables."""

  model: Any  # tff.learning.models.ModelWeights of L1
  tables: SelectionTables


def initial_tables(pool_size: int, num_clients: int) -> SelectionTables:
  """Algorithm 1, lines 1-2: every entry 1."""
  return SelectionTables(
      curiosity=np.ones([len(pools_lib.SIZE_CLASSES), num_clients], np.int64),
      resource=np.ones([pool_size, num_clients], np.int64))


def resource_reward(tables: SelectionTables, pool: pools_lib.SubModelPool,
                    member: pools_lib.PoolMember) -> np.ndarray:
  """R_s(member, c) for every client c (module docstring)."""
  resource = tables.resource.astype(np.float64)
  # suffix[k] = sum_{t >= k} T_r[t]
  suffix = np.cumsum(resource[::-1], axis=0)[::-1]
  kin = [m.index for m in pool.of_class(member.size_class)]
  total = suffix[0]
  numerator = suffix[kin].sum(axis=0)
  with np.errstate(divide="ignore", invalid="ignore"):
    reward = numerator / (len(kin) * total)
  return np.where(total > 0, reward, 0.0)


def curiosity_reward(tables: SelectionTables,
                     member: pools_lib.PoolMember) -> np.ndarray:
  """R_c(member, c) = 1 / sqrt(T_c[type(member)][c])."""
  return 1.0 / np.sqrt(tables.curiosity[_TYPE_ROWS[member.size_class]].astype(
      np.float64))


def reward(tables: SelectionTables, pool: pools_lib.SubModelPool,
           member: pools_lib.PoolMember, selection: str) -> np.ndarray:
  """The selection reward of every client for `member` under `selection`."""
  if selection == "rl":
    return (np.minimum(0.5, resource_reward(tables, pool, member)) *
            curiosity_reward(tables, member))
  if selection == "curiosity":
    return curiosity_reward(tables, member)
  if selection == "resource":
    return resource_reward(tables, pool, member)
  raise ValueError(f"selection {selection!r} has no reward")


def select_clients(tables: SelectionTables, pool: pools_lib.SubModelPool,
                   members: Sequence[pools_lib.PoolMember],
                   candidates: np.ndarray, selection: str,
                   rng: np.random.Generator) -> list[int]:
  """One client index per member, proportional to reward, no repeats.

  `candidates`: boolean mask over clients (available this round).
  """
  open_ = np.asarray(candidates, bool).copy()
  chosen = []
  for member in members:
    if not open_.any():
      break
    weights = np.where(open_, reward(tables, pool, member, selection), 0.0)
    if not np.isfinite(weights).all() or weights.sum() <= 0:
      weights = open_.astype(np.float64)
    c = int(rng.choice(len(weights), p=weights / weights.sum()))
    chosen.append(c)
    open_[c] = False
  return chosen


def update_tables(tables: SelectionTables, pool: pools_lib.SubModelPool,
                  client: int, sent: int, returned: Optional[int],
                  p: int) -> SelectionTables:
  """Algorithm 1, lines 12-28, for one client (module docstring)."""
  curiosity = tables.curiosity.copy()
  resource = tables.resource.copy()
  members = pool.members
  curiosity[_TYPE_ROWS[members[sent].size_class], client] += 1
  if returned is not None:
    curiosity[_TYPE_ROWS[members[returned].size_class], client] += 1
  last = len(members) - 1
  if returned == sent:
    resource[sent:, client] += 1
    resource[last, client] += p - 1
  else:
    start = 0 if returned is None else returned
    if returned is not None:
      resource[returned, client] += p
    for tau, t in enumerate(range(start, last + 1)):
      resource[t, client] = max(resource[t, client] - tau, 0)
  return SelectionTables(curiosity, resource)


def choose_trained_member(pool: pools_lib.SubModelPool,
                          params: Sequence[int], sent: int,
                          capacity_params: Optional[int],
                          min_start_index: int = 0) -> Optional[int]:
  """The device's choice (Section 3.2): what it trains of member `sent`.

  `params[i]` is member i's trainable parameter count. Returns `sent` if it
  fits `capacity_params` (None: no limit), else the largest member by
  parameters that is part of `sent`, has I >= `min_start_index` and fits;
  None if nothing fits.
  """
  if capacity_params is None or params[sent] <= capacity_params:
    return sent
  outer = pool.members[sent].widths
  fitting = [m.index for m in pool.members
             if m.index != sent and width_lib.contains(outer, m.widths)
             and m.start_index >= min_start_index
             and params[m.index] <= capacity_params]
  if not fitting:
    return None
  return max(fitting, key=lambda i: (params[i], i))


class AdaptiveFL(api.FederatedAlgorithm):
  """AdaptiveFL and its ablation variants as a `FederatedAlgorithm`."""

  name = "adaptivefl"

  def __init__(self, task: api.Task, pool: pools_lib.SubModelPool,
               client_ids: Sequence[str], *, client_lr: float,
               client_momentum: float = 0.0, server_lr: float = 1.0,
               selection: str = "rl", min_start_index: int = 0,
               prox_mu: float = 0.0):
    if selection not in SELECTIONS:
      raise ValueError(f"selection must be one of {SELECTIONS}, got"
                       f" {selection!r}")
    self.pool = pool
    self.selection = selection
    self.min_start_index = int(min_start_index)
    self.client_ids = tuple(sorted(client_ids))
    self._client_index = {c: i for i, c in enumerate(self.client_ids)}
    self.catalog = width_rounds.LevelCatalog(
        task, [(m.level, m.widths) for m in pool.members])
    self.rounds = width_rounds.HeterogeneousRounds(
        self.catalog, client_lr=client_lr, client_momentum=client_momentum,
        prox_mu=prox_mu, server_lr=server_lr)
    self.params = tuple(level.params for level in self.catalog.levels)
    # p: start indices per level (the pool's M members).
    self.p = max(1, len(pool.of_class("M")))

  def tier_capacities(self, tier_names):
    return {t: self.catalog.by_name(TIER_LEVELS[t]).capacity()
            for t in tier_names if t in TIER_LEVELS}

  def initialize(self) -> AdaptiveFLState:
    return AdaptiveFLState(
        model=self.catalog.initial_weights(self.catalog.outer),
        tables=initial_tables(len(self.pool.members), len(self.client_ids)))

  def plan_round(self, state: AdaptiveFLState, round_num: int,
                 available: Sequence[str], size: int,
                 sampler: Any) -> list[api.Assignment]:
    del round_num
    rng = sampler.rng
    count = min(size, len(available))
    if self.selection == "greedy":
      full = self.pool.full.index
      return [api.Assignment(c, full) for c in sampler.sample(available, count)]
    drawn = [self.pool.members[int(i)]
             for i in rng.integers(0, len(self.pool.members), size=count)]
    if self.selection == "random":
      return [api.Assignment(c, m.index)
              for c, m in zip(sampler.sample(available, count), drawn)]
    candidates = np.zeros(len(self.client_ids), bool)
    candidates[[self._client_index[c] for c in available]] = True
    chosen = select_clients(state.tables, self.pool, drawn, candidates,
                            self.selection, rng)
    return [api.Assignment(self.client_ids[c], m.index)
            for c, m in zip(chosen, drawn)]

  def next(self, state: AdaptiveFLState, round_num: int,
           clients: Sequence[api.ClientRound]) -> api.RoundOutput:
    del round_num
    levels = self.catalog.levels
    by_group = collections.OrderedDict()
    unserved = []
    outcomes = []
    for client in clients:
      sent = int(client.assignment)
      capacity = None if client.capacity is None else client.capacity.params
      trained = choose_trained_member(self.pool, self.params, sent, capacity,
                                      self.min_start_index)
      outcomes.append((client.client_id, sent, trained))
      if trained is None:
        unserved.append((levels[sent], client))
      else:
        by_group.setdefault((sent, trained), []).append(client)
    groups = [width_rounds.Group(levels[s], levels[t], tuple(members))
              for (s, t), members in sorted(by_group.items())]
    result = self.rounds.run(state.model, groups, unserved)
    tables = state.tables
    for client_id, sent, trained in outcomes:
      tables = update_tables(tables, self.pool, self._client_index[client_id],
                             sent, trained, self.p)
    metrics = result.metrics
    metrics["waste_rate"] = (
        1.0 - result.returned_model_bytes / result.sent_model_bytes
        if result.sent_model_bytes else 0.0)
    metrics["sent_model_bytes"] = float(result.sent_model_bytes)
    metrics["returned_model_bytes"] = float(result.returned_model_bytes)
    metrics["pruned"] = float(sum(1 for _, s, t in outcomes
                                  if t is not None and t != s))
    metrics["failed"] = float(len(unserved))
    return api.RoundOutput(
        state=AdaptiveFLState(model=result.model, tables=tables),
        metrics=metrics, traffic=result.traffic)

  def model_weights(self, state: AdaptiveFLState):
    return state.model

  def evaluation_models(self, state: AdaptiveFLState, data=None):
    names = ["L1"] + [n for n in ("M1", "S1") if n in self.pool.levels()]
    return collections.OrderedDict(
        (name, self.rounds.evaluation_model(
            state.model, self.catalog.by_name(name), data)) for name in names)


def pool_from_config(config, task: api.Task) -> pools_lib.SubModelPool:
  """The AdaptiveFL pool of `--pool_ratios` and `--pool_start_indices`."""
  from tff_hetero import models as models_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero.program.config import parse_number_list  # pylint: disable=g-import-not-at-top
  from tff_hetero.program.errors import UsageError  # pylint: disable=g-import-not-at-top
  if not task.width_units:
    raise UsageError("--model", f"{task.model_name} has no width knobs")
  ratios = parse_number_list("--pool_ratios", config.pool_ratios)
  if len(ratios) != 2:
    raise UsageError("--pool_ratios",
                     f"needs two ratios M:S (e.g. 0.66:0.4), got"
                     f" {config.pool_ratios!r}")
  if config.pool_start_indices:
    starts = parse_number_list("--pool_start_indices",
                               config.pool_start_indices, int)
  else:
    starts = list(models_lib.MODELS[task.model_name].default_start_indices)
  if not 0 < ratios[1] < ratios[0] < 1:
    raise UsageError("--pool_ratios",
                     f"needs 0 < S < M < 1, got {config.pool_ratios!r}")
  try:
    return pools_lib.adaptivefl_pool(task.width_units, *ratios, starts)
  except models_lib.ModelError as e:
    raise UsageError("--pool_start_indices", str(e)) from None


def build_adaptivefl(config, task: api.Task,
                     client_ids: Sequence[str]) -> AdaptiveFL:
  from tff_hetero.program.errors import UsageError  # pylint: disable=g-import-not-at-top
  if config.adaptivefl_selection not in SELECTIONS:
    raise UsageError(
        "--adaptivefl_selection",
        f"unknown value {config.adaptivefl_selection!r}; accepted: "
        + ", ".join(SELECTIONS))
  return AdaptiveFL(
      task, pool_from_config(config, task), client_ids,
      client_lr=config.client_lr, client_momentum=config.client_momentum,
      server_lr=config.server_lr, selection=config.adaptivefl_selection,
      min_start_index=config.prune_min_start_index)
