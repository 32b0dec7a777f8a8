"""AdaptiveFL (Jia et al., "AdaptiveFL: Adaptive Heterogeneous Federated Learning
for Resource-Constrained AIoT Systems", DAC 2024).

Each round (Algorithm 1):

1. the server draws K models uniformly, with replacement, from the pool
   R = {S_p, ..., S_1, M_p, ..., M_1, L1} (`tff_hetero.submodels.pools`; the
   pool must be valid: start indices I >= tau >= 1 and sizes increasing in
   pool order, else a one-line error naming the sizes);
2. for each drawn model m it picks a client with probability proportional to
   the reward R(m, c) = min(0.5, R_s(m, c)) x R_c(m, c) among the available
   clients not yet picked this round (the paper normalises over all clients;
   its reference code zeroes a client's reward once picked, so a client
   trains one model per round, and so do we), where
     R_s(m, c) = sum_{k in type(m)} sum_{t >= k} T_r[t][c]
                 / (|type(m)| x sum_t T_r[t][c])      (resource reward)
     R_c(m, c) = 1 / sqrt(T_c[type(m)][c])            (curiosity reward)
   with T_r the resource table (one row per pool member, in pool order) and
   T_c the curiosity table (one row per model type S, M, L), both 1 at the
   start;
3. phase one, on the devices: each client receives the index of the member
   it was sent and decides, from its own capacity, what it will train: the
   member itself if it fits, else the largest pool member that is part of it,
   fits and has I >= tau (Section 3.2), or nothing. This runs in a
   CLIENTS-placed computation (`DeviceDecision`,
   `<{int32}@CLIENTS, {float64}@CLIENTS, {int32}@CLIENTS (position)> ->
   {<int32, int32 (position)>}@CLIENTS`); the server
   learns only the member index each device answers (-1: nothing);
4. phase two: the groups (member sent, member trained) train and the server
   aggregates the returned sub-models per element, weighted by data size,
   keeping elements nobody returned (Algorithm 2, `width_rounds.py`);
5. the server updates the tables from (sent, returned) (`update_tables`):
     T_c[type(sent)][c] += 1;  T_c[type(returned)][c] += 1
     kept:   T_r[t][c] += 1 for every t >= sent;  T_r[L1][c] += p - 1
     pruned: T_r[returned][c] += p; then T_r[t][c] = max(T_r[t][c] - tau_t, 0)
             with tau_t = t - returned, for the members t known not to fit
             (see "Table updates" below).

The server never reads a device's capacity: `plan_round` and
`update_tables` see only the tables and the answers, and in `next` the
capacity goes, unread, from `ClientRound.capacity` through `device_budget`
(the device's own reading of it) into the client-placed decision (tested
with capacities that fail on any other use). Capacities belong to the device
population (`--tier_capacities`, the same for every algorithm); the device
measures a model's size in trainable parameters (`Capacity.params`; the
MAC budget is not used, as in the paper and its reference code).

Table updates. Algorithm 1 assumes size(returned) <= Gamma < size(m^), m^
the member right after `returned` in the pool, so every member after
`returned` is penalised. A device here can reach only the members that are
part of what it received (the paper's prune(W; r_w, I) of the received W),
so a member between `returned` and the smallest larger member it could reach
(e.g. S1 for a device sent M2: S1 keeps layers M2 narrows) may well fit.
`update_tables` therefore penalises only the members known not to fit: every
member from the smallest reachable member larger than `returned` on (pool
sizes increase, so all later ones are larger); members in between keep their
score. With nested pools (every smaller member part of every larger one)
this is Algorithm 1 exactly.

Deviations from the paper and from its reference code
(mastlab-T3S/AdaptiveFL), each with its reason:
* Local training (`width_computations.py`, shared by every width
  algorithm): SGD with a constant learning rate and momentum, no weight
  decay, and every batch trained (a client's last batch may be smaller).
  The paper states
  only "SGD with a learning rate of 0.01 and a momentum of 0.5 for all
  methods"; the reference code also multiplies the learning rate by 0.998
  each round, adds weight decay 1e-4 and drops each client's last incomplete
  batch (`drop_last`). The paper's text states neither, so we leave them
  out; over the offline reproduction's 30 rounds the decay would lower the
  learning rate by at most a factor 0.998^30 = 0.94.
* The kept branch follows Algorithm 1, lines 18-21: T_r[t][c] += 1 for
  every t from the member sent to L1, then T_r[L1][c] += p - 1 whatever was
  sent, so L1's entry gains p in every kept case. The reference adds 3 (its
  p) to T_r[L1] only when L1 itself was sent, on top of the loop's +1: L1's
  entry gains 4 (p + 1) when L1 was sent and kept, 1 when a smaller member
  was (p = 2 in the offline reproduction, so there L1's entry gains 2 in
  every kept case). Both credit the returned member in the pruned branch
  with p (the reference's fixed 3).
* A device chooses only among pool members, and only among those that are
  part of the member it received (`reachable`; the table update follows,
  see "Table updates" above). The paper's rule is an argmax over any
  (r_w, I) with I >= tau of prune(W; r_w, I); we restrict it to pool members
  because T_r has one row per pool member (Algorithm 1, line 23 credits
  T_r[returned]) and the server aggregates and evaluates pool members. The
  reference falls back to the largest pool member whose size fits, which
  need not be part of the member sent (its simulation trains the server's
  own copy of that member).
* A device that cannot hold even the smallest member it could reach
  receives the model and returns nothing (`NOTHING`, counted in `failed`);
  its tables are updated as a prune to S_p without the credit for S_p:
  T_c[type(sent)] += 1 and T_r[t] -= 0, 1, 2, ... from S_p up (floored at
  0), so T_r[S_p] keeps the client selectable should its capacity recover.
  The reference's fallback then returns S_p anyway: the device trains S_p
  beyond its resource and T_r[S_p] gains 3. The reproduction's Table 4
  reports these client-rounds per run (measured: the sum of `failed`); they
  arise mostly in the coarse pool, whose smallest member is S1.
* R_s of the L type divides by |type(L)| = 1 (the reference's `L =
  sum(T[6:]) / total`), which is the paper's formula with the type's size in
  place of p; for S and M both are p.
* If every available client has reward 0 for a model, the client is drawn
  uniformly among the available ones (the paper does not say).
* Section 3.3's "version reward" ("if the difference between the model
  version and the average version is high, the reward will be mainly
  determined by the version reward") is defined nowhere in the paper or its
  equations, and not implemented.
* Start indices I = 0 and pools whose sizes do not increase are rejected
  (the earlier defaults of the small models had both);
  `--prune_min_start_index` (tau) defaults to 1.
* Batch normalisation is static (`static_batch_norm.py`); the reference
  evaluates with test-batch statistics.

Ablation variants (Figure 5): `greedy` always sends L1 to uniformly chosen
clients; `random` draws models and clients uniformly; `curiosity` uses the
reward R_c only, `resource` R_s only (without the 0.5 cap, which only exists
to hand ties to curiosity). A pool with one start index (p = 1) is the
coarse-grained ablation of Table 4. `plan_selection` is the selection of
every variant; `adaptivefl_simulation.py` runs it with `update_tables` and
the device rule over many rounds without training.

Metrics each round: `waste_rate` = 1 - sum(bytes of returned models) /
sum(bytes of sent models), both measured on the tensors sent (and the two
sums, `sent_model_bytes` and `returned_model_bytes`, so that a run's rate can
be summed over rounds), `pruned` (clients that pruned) and `failed` (clients
that could train nothing).
Evaluation: the full model (L1) and M1 and S1, each with static BN
statistics, and their mean (`avg_accuracy`), the paper's "full" and "avg".

For TFF users, `build_adaptivefl_process` runs the same rounds over a width
factory of their own model (`AdaptiveFLProcess`); its selection draws from
`numpy.random.default_rng([selection_seed, round])` instead of the
program's checkpointed sampler, so its state is immutable and small.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from collections.abc import Sequence
import math
import types
from typing import Any
from typing import Optional

import attrs
import numpy as np

from tff_hetero import devices as devices_lib
from tff_hetero import models as models_lib
from tff_hetero.aggregators import masked_dp
from tff_hetero.aggregators import model_aggregators
from tff_hetero.algorithms import api
from tff_hetero.algorithms import cohort_positions
from tff_hetero.algorithms import width_process
from tff_hetero.algorithms import width_rounds
from tff_hetero.errors import UsageError
from tff_hetero.models import width as width_lib
from tff_hetero.parsing import parse_number_list
from tff_hetero.settings import AlgorithmSettings
from tff_hetero.settings import setting
from tff_hetero.submodels import pools as pools_lib

SELECTIONS = ("rl", "greedy", "random", "curiosity", "resource")


def _tau_at_least_one(instance, attribute, value):
  del instance
  if value < 1:
    raise UsageError(
      f"--{attribute.name}",
      f"must be >= 1 (tau: the first layer is never pruned), got {value}",
    )


@attrs.frozen(kw_only=True)
class PoolSettings(AlgorithmSettings):
  """The AdaptiveFL sub-model pool (AdaptiveFL, Decoupled)."""

  pool_ratios: str = setting(
    "0.66:0.4",
    "AdaptiveFL/Decoupled pool: width ratios of the M and S levels, M:S.",
  )
  pool_start_indices: str = setting(
    "",
    "AdaptiveFL pool: start indices I_1:I_2:...:I_p, decreasing (default:"
    " the model's, e.g. 8:6:4 for vgg16); one index is the coarse pool.",
  )
  prune_min_start_index: int = setting(
    1,
    "AdaptiveFL: tau, the smallest start index I of the pool (>= 1: the"
    " first layer is never pruned).",
    check=_tau_at_least_one,
  )


@attrs.frozen(kw_only=True)
class AdaptiveFLSettings(PoolSettings):
  adaptivefl_selection: str = setting(
    "rl",
    "AdaptiveFL client selection: rl (the paper's), greedy, random,"
    " curiosity, resource.",
    choices=SELECTIONS,
  )


_TYPE_ROWS = {c: i for i, c in enumerate(pools_lib.SIZE_CLASSES)}
NOTHING = -1  # A device's answer when no part of what it received fits.


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
  # The DP noise seed (a secret by default; left out of the repr).
  noise_seed: Any = attrs.field(default=np.int64(0), repr=False)


def initial_tables(pool_size: int, num_clients: int) -> SelectionTables:
  """Algorithm 1, lines 1-2: every entry 1."""
  return SelectionTables(
    curiosity=np.ones([len(pools_lib.SIZE_CLASSES), num_clients], np.int64),
    resource=np.ones([pool_size, num_clients], np.int64),
  )


def resource_reward(
  tables: SelectionTables,
  pool: pools_lib.SubModelPool,
  member: pools_lib.PoolMember,
) -> np.ndarray:
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


def curiosity_reward(
  tables: SelectionTables, member: pools_lib.PoolMember
) -> np.ndarray:
  """R_c(member, c) = 1 / sqrt(T_c[type(member)][c])."""
  return 1.0 / np.sqrt(
    tables.curiosity[_TYPE_ROWS[member.size_class]].astype(np.float64)
  )


def reward(
  tables: SelectionTables,
  pool: pools_lib.SubModelPool,
  member: pools_lib.PoolMember,
  selection: str,
) -> np.ndarray:
  """The selection reward of every client for `member` under `selection`."""
  if selection == "rl":
    return np.minimum(
      0.5, resource_reward(tables, pool, member)
    ) * curiosity_reward(tables, member)
  if selection == "curiosity":
    return curiosity_reward(tables, member)
  if selection == "resource":
    return resource_reward(tables, pool, member)
  raise ValueError(f"selection {selection!r} has no reward")


def select_clients(
  tables: SelectionTables,
  pool: pools_lib.SubModelPool,
  members: Sequence[pools_lib.PoolMember],
  candidates: np.ndarray,
  selection: str,
  rng: np.random.Generator,
) -> list[int]:
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


def plan_selection(
  tables: SelectionTables,
  pool: pools_lib.SubModelPool,
  candidates: np.ndarray,
  count: int,
  selection: str,
  rng: np.random.Generator,
) -> list[tuple[int, int]]:
  """The round's (client index, member index) pairs under `selection`.

  Steps 1-2 of the module docstring for `rl`, `curiosity` and `resource`;
  `greedy` sends L1 to `count` clients drawn uniformly, `random` draws the
  members as `rl` does and the clients uniformly (both without repeats).
  """
  candidates = np.asarray(candidates, bool)
  count = min(int(count), int(candidates.sum()))
  if selection == "greedy":
    drawn = [pool.full] * count
  else:
    drawn = [
      pool.members[int(i)]
      for i in rng.integers(0, len(pool.members), size=count)
    ]
  if selection in ("greedy", "random"):
    clients = rng.choice(np.flatnonzero(candidates), size=count, replace=False)
  else:
    clients = select_clients(tables, pool, drawn, candidates, selection, rng)
  return [(int(c), m.index) for c, m in zip(clients, drawn)]


def reachable(
  pool: pools_lib.SubModelPool, sent: int, min_start_index: int
) -> list[int]:
  """Indices of the members a device sent member `sent` can train.

  `sent` itself and every member that is part of it with I >= tau.
  """
  outer = pool.members[sent].widths
  return [
    m.index
    for m in pool.members
    if m.index == sent
    or (
      width_lib.contains(outer, m.widths) and m.start_index >= min_start_index
    )
  ]


def update_tables(
  tables: SelectionTables,
  pool: pools_lib.SubModelPool,
  client: int,
  sent: int,
  returned: Optional[int],
  p: int,
  min_start_index: int = 1,
) -> SelectionTables:
  """Algorithm 1, lines 12-28, for one client (module docstring).

  In the pruned case only the members known not to fit lose score: those
  from the smallest member larger than `returned` that the device could
  reach from `sent` on (pool sizes increase in pool order).
  """
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
    return SelectionTables(curiosity, resource)
  base = 0 if returned is None else returned
  if returned is None:
    first_unfit = 0  # Nothing fitted: S_p (part of every member) did not.
  else:
    resource[returned, client] += p
    first_unfit = min(
      i for i in reachable(pool, sent, min_start_index) if i > returned
    )
  for t in range(first_unfit, last + 1):
    resource[t, client] = max(resource[t, client] - (t - base), 0)
  return SelectionTables(curiosity, resource)


def choose_trained_member(
  pool: pools_lib.SubModelPool,
  params: Sequence[int],
  sent: int,
  capacity_params: Optional[float],
  min_start_index: int = 1,
) -> Optional[int]:
  """The device's rule (Section 3.2): what it trains of member `sent`.

  `params[i]` is member i's trainable parameter count. Returns `sent` if it
  fits `capacity_params` (None: no limit), else the largest member by
  parameters that `reachable` from `sent` and fits; None if nothing fits.
  `DeviceDecision` is the same rule as a client-placed TFF computation; this
  NumPy form is its specification (tested equal) and what the selection
  simulation runs.
  """
  if capacity_params is None or params[sent] <= capacity_params:
    return sent
  fitting = [
    i
    for i in reachable(pool, sent, min_start_index)
    if params[i] <= capacity_params
  ]
  if not fitting:
    return None
  return max(fitting, key=lambda i: (params[i], i))


def device_budget(capacity) -> np.float64:
  """The device's own reading of its capacity: parameters it can train.

  `capacity` is a `tff_hetero.devices.Capacity` or None (no limit: +inf).
  In `AdaptiveFL.next` this is the only reader of a capacity, and its value
  goes straight into the client-placed `DeviceDecision`.
  """
  if capacity is None or capacity.params is None:
    return np.float64(math.inf)
  return np.float64(capacity.params)


class DeviceDecision:
  """Phase one of a round: each device answers what it will train.

      (<{int32}@CLIENTS, {float64}@CLIENTS, {int32}@CLIENTS> ->
       {<int32, int32>}@CLIENTS)

  maps each client's sent member index and its own parameter budget to the
  member it will train (`choose_trained_member` in TensorFlow), or
  `NOTHING`, beside the client's position in the cohort (the third
  argument, echoed). On several TFF workers the mergeable execution context
  concatenates the workers' CLIENTS-placed results in the order the workers
  finish, not in the cohort's order; the driver puts the answers back by
  position. The pool's sizes and which members each member can reach are
  constants of the client computation.
  """

  def __init__(
    self,
    pool: pools_lib.SubModelPool,
    params: Sequence[int],
    min_start_index: int,
  ):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    n = len(pool.members)
    reach = np.zeros([n, n], bool)
    for sent in range(n):
      reach[sent, reachable(pool, sent, min_start_index)] = True
    sizes = np.asarray(params, np.float64)

    @tff.tensorflow.computation(np.int32, np.float64)
    def decide_one(sent, budget):
      fits = tf.logical_and(
        tf.gather(tf.constant(reach), sent), tf.constant(sizes) <= budget
      )
      best = tf.cast(
        tf.argmax(
          tf.where(fits, tf.constant(sizes), tf.constant(-1.0, tf.float64))
        ),
        tf.int32,
      )
      return tf.where(tf.reduce_any(fits), best, tf.constant(NOTHING))

    @tff.tensorflow.computation(np.int32, np.float64, np.int32)
    def decide_and_echo(sent, budget, position):
      return decide_one(sent, budget), tf.identity(position)

    @tff.federated_computation(
      tff.FederatedType(np.int32, tff.CLIENTS),
      tff.FederatedType(np.float64, tff.CLIENTS),
      cohort_positions.POSITIONS_AT_CLIENTS,
    )
    def decide(sent, budget, position):
      return tff.federated_map(decide_and_echo, (sent, budget, position))

    self.computation = decide

  def __call__(
    self, sent: Sequence[int], budgets: Sequence[np.float64]
  ) -> list[Optional[int]]:
    if not sent:
      return []
    results = self.computation(
      [np.int32(s) for s in sent],
      list(budgets),
      cohort_positions.positions(len(sent)),
    )
    order = cohort_positions.cohort_order(
      [position for _, position in results], len(sent), "AdaptiveFL"
    )
    answers = [
      int(answer) for answer, _ in cohort_positions.reorder(order, results)
    ]
    return [None if a == NOTHING else a for a in answers]


class AdaptiveFL(api.FederatedAlgorithm):
  """AdaptiveFL and its ablation variants as a `FederatedAlgorithm`."""

  name = "adaptivefl"

  def __init__(
    self,
    task: api.Task,
    pool: pools_lib.SubModelPool,
    client_ids: Sequence[str],
    *,
    client_lr: Optional[float] = None,
    client_momentum: float = 0.0,
    client_optimizer: Any = None,
    server_lr: float = 1.0,
    selection: str = "rl",
    min_start_index: int = 1,
    prox_mu: float = 0.0,
    aggregation: masked_dp.MaskedAggregation = masked_dp.MaskedAggregation(),
    noise_seed: Optional[int] = None,
  ):
    if selection not in SELECTIONS:
      raise ValueError(
        f"selection must be one of {SELECTIONS}, got {selection!r}"
      )
    self.pool = pool
    self.selection = selection
    self.min_start_index = int(min_start_index)
    self.client_ids = tuple(sorted(client_ids))
    self._client_index = {c: i for i, c in enumerate(self.client_ids)}
    self.catalog = width_rounds.LevelCatalog(
      task, [(m.level, m.widths) for m in pool.members]
    )
    self.params = tuple(level.params for level in self.catalog.levels)
    pools_lib.check_increasing_sizes(pool, self.params)
    self.rounds = width_rounds.HeterogeneousRounds(
      self.catalog,
      client_lr=client_lr,
      client_momentum=client_momentum,
      client_optimizer=client_optimizer,
      prox_mu=prox_mu,
      server_lr=server_lr,
      aggregation=aggregation,
      noise_seed=noise_seed,
    )
    # p: start indices per level (the pool's M members).
    self.p = max(1, len(pool.of_class("M")))
    self._decision = None

  def initialize(self) -> AdaptiveFLState:
    return AdaptiveFLState(
      model=self.catalog.initial_weights(self.catalog.outer),
      tables=initial_tables(len(self.pool.members), len(self.client_ids)),
      noise_seed=self.rounds.initial_noise_seed(),
    )

  def plan_round(
    self,
    state: AdaptiveFLState,
    round_num: int,
    available: Sequence[str],
    size: int,
    sampler: Any,
  ) -> list[api.Assignment]:
    del round_num
    candidates = np.zeros(len(self.client_ids), bool)
    candidates[[self._client_index[c] for c in available]] = True
    pairs = plan_selection(
      state.tables, self.pool, candidates, size, self.selection, sampler.rng
    )
    return [api.Assignment(self.client_ids[c], m) for c, m in pairs]

  def decide(
    self, sent: Sequence[int], capacities: Sequence[Any]
  ) -> list[Optional[int]]:
    """Phase one: the members the devices will train (None: nothing)."""
    return self.device_decision()(sent, [device_budget(c) for c in capacities])

  def device_decision(self) -> DeviceDecision:
    """Phase one's client-placed computation (built on first use)."""
    if self._decision is None:
      self._decision = DeviceDecision(
        self.pool, self.params, self.min_start_index
      )
    return self._decision

  def next(
    self,
    state: AdaptiveFLState,
    round_num: int,
    clients: Sequence[api.ClientRound],
  ) -> api.RoundOutput:
    levels = self.catalog.levels
    sent_members = [int(client.assignment) for client in clients]
    answers = self.decide(sent_members, [c.capacity for c in clients])
    by_group = collections.OrderedDict()
    unserved = []
    outcomes = []
    for client, sent, trained in zip(clients, sent_members, answers):
      outcomes.append((client.client_id, sent, trained))
      if trained is None:
        unserved.append((levels[sent], client))
      else:
        by_group.setdefault((sent, trained), []).append(client)
    groups = [
      width_rounds.Group(levels[s], levels[t], tuple(members))
      for (s, t), members in sorted(by_group.items())
    ]
    result = self.rounds.run(
      state.model,
      groups,
      unserved,
      round_num=round_num,
      noise_seed=state.noise_seed,
    )
    tables = state.tables
    for client_id, sent, trained in outcomes:
      tables = update_tables(
        tables,
        self.pool,
        self._client_index[client_id],
        sent,
        trained,
        self.p,
        self.min_start_index,
      )
    metrics = result.metrics
    metrics["waste_rate"] = (
      1.0 - result.returned_model_bytes / result.sent_model_bytes
      if result.sent_model_bytes
      else 0.0
    )
    metrics["sent_model_bytes"] = float(result.sent_model_bytes)
    metrics["returned_model_bytes"] = float(result.returned_model_bytes)
    metrics["pruned"] = float(
      sum(1 for _, s, t in outcomes if t is not None and t != s)
    )
    metrics["failed"] = float(len(unserved))
    return api.RoundOutput(
      state=AdaptiveFLState(
        model=result.model, tables=tables, noise_seed=state.noise_seed
      ),
      metrics=metrics,
      traffic=result.traffic,
    )

  def model_weights(self, state: AdaptiveFLState):
    return state.model

  def evaluation_models(self, state: AdaptiveFLState, data=None):
    names = ["L1"] + [n for n in ("M1", "S1") if n in self.pool.levels()]
    return collections.OrderedDict(
      (
        name,
        self.rounds.evaluation_model(
          state.model, self.catalog.by_name(name), data
        ),
      )
      for name in names
    )


def pool_from_config(config, task: api.Task) -> pools_lib.SubModelPool:
  """The AdaptiveFL pool of `--pool_ratios`, `--pool_start_indices` and tau.

  Only the start indices are checked here; `AdaptiveFL` checks that the
  sizes increase once the members are built.
  """
  settings = config.settings
  if not task.width_units:
    raise UsageError("--model", f"{task.model_name} has no width knobs")
  ratios = parse_number_list("--pool_ratios", settings.pool_ratios)
  if len(ratios) != 2:
    raise UsageError(
      "--pool_ratios",
      f"needs two ratios M:S (e.g. 0.66:0.4), got {settings.pool_ratios!r}",
    )
  if not 0 < ratios[1] < ratios[0] < 1:
    raise UsageError(
      "--pool_ratios", f"needs 0 < S < M < 1, got {settings.pool_ratios!r}"
    )
  if settings.pool_start_indices:
    starts = parse_number_list(
      "--pool_start_indices", settings.pool_start_indices, int
    )
  else:
    starts = list(models_lib.MODELS[task.model_name].default_start_indices)
    if not starts:
      raise UsageError(
        "--model",
        f"{task.model_name} has {len(task.width_units)} width"
        " unit(s): no AdaptiveFL pool keeps the first layer whole (I >= 1)"
        " and narrows a later one",
      )
  try:
    return pools_lib.adaptivefl_pool(
      task.width_units, *ratios, starts, settings.prune_min_start_index
    )
  except models_lib.ModelError as e:
    raise UsageError("--pool_start_indices", str(e)) from None


def build_adaptivefl(
  config, task: api.Task, client_ids: Sequence[str]
) -> AdaptiveFL:
  settings = config.settings
  pool = pool_from_config(config, task)
  try:
    return AdaptiveFL(
      task,
      pool,
      client_ids,
      client_lr=config.client_lr,
      client_momentum=config.client_momentum,
      server_lr=config.server_lr,
      **model_aggregators.width_round_options(config),
      selection=settings.adaptivefl_selection,
      min_start_index=settings.prune_min_start_index,
    )
  except models_lib.ModelError as e:
    raise UsageError(
      "--pool_start_indices",
      f"{e} (--pool_ratios={settings.pool_ratios}, --pool_start_indices="
      f"{settings.pool_start_indices or 'the model default'})",
    ) from None


# -- The public process -------------------------------------------------------


@attrs.frozen
class AvailableClient:
  """A client a `AdaptiveFLProcess` round may choose.

  Attributes:
    dataset: Its whole local training for the round if chosen (batched;
      repeat it for several epochs). Not read unless chosen.
    capacity_params: The trainable parameters the device can hold (None: no
      limit). Only the client-placed decision reads it (phase one).
  """

  dataset: Any
  capacity_params: Optional[int] = None


@attrs.frozen
class AdaptiveFLProcessState:
  """An `AdaptiveFLProcess`'s state: the server's (model, RL tables, DP
  noise seed), the rounds completed and the seed of the client selection."""

  server: AdaptiveFLState
  round_num: int = 0
  selection_seed: int = 0


class AdaptiveFLProcess:
  """AdaptiveFL as `initialize` / `next` over typed computations.

  Like `width_process.WidthProcess` (whose module docstring gives the
  group computations' signatures), with AdaptiveFL's two phases: `next`
  draws the round's (client, member) pairs from the RL tables
  (`plan_selection`, randomness from `(selection_seed, round)`), runs the
  client-placed decision

      decide: (<{int32}@CLIENTS, {float64}@CLIENTS, {int32}@CLIENTS> ->
               {<int32, int32>}@CLIENTS)

  (member sent, the device's own budget, cohort position -> member it will
  train or -1, position), then one `group_round/<sent>-><trained>` per
  group, `delivery/<sent>` for devices that can train nothing, the server
  step, and the table update (`update_tables`), all as `AdaptiveFL.next`.
  """

  def __init__(
    self, algorithm: AdaptiveFL, clients_per_round: int, selection_seed: int
  ):
    self._algorithm = algorithm
    self._clients_per_round = int(clients_per_round)
    self._selection_seed = int(selection_seed)
    self.levels = tuple(level.name for level in algorithm.catalog.levels)
    # Traced now, as TFF's builders do (see `WidthProcess`).
    self._computations = self._build_computations()

  def _build_computations(self) -> collections.OrderedDict:
    algorithm = self._algorithm
    parts = algorithm.rounds.computations
    levels = algorithm.catalog.levels
    steps = collections.OrderedDict(
      decide=algorithm.device_decision().computation
    )
    for sent in range(len(levels)):
      for trained in reachable(algorithm.pool, sent, algorithm.min_start_index):
        name = f"group_round/{levels[sent].name}->{levels[trained].name}"
        steps[name] = parts.group_round(levels[sent], levels[trained])
      steps[f"delivery/{levels[sent].name}"] = parts.delivery(levels[sent])
    return width_process.with_server_steps(algorithm.rounds, steps, levels)

  @property
  def computations(self) -> collections.OrderedDict:
    """Every typed step of a round by name."""
    return collections.OrderedDict(self._computations)

  def initialize(self) -> AdaptiveFLProcessState:
    return AdaptiveFLProcessState(
      server=self._algorithm.initialize(),
      round_num=0,
      selection_seed=self._selection_seed,
    )

  def next(
    self,
    state: AdaptiveFLProcessState,
    available: Mapping[str, AvailableClient],
  ) -> width_process.WidthRoundOutput:
    """One round among the `available` clients (ids given at build time)."""
    algorithm = self._algorithm
    if not isinstance(available, Mapping) or not all(
      isinstance(c, AvailableClient) for c in available.values()
    ):
      raise TypeError(
        "available must map client ids to tff_hetero.AvailableClient, got"
        f" {type(available).__name__}"
      )
    unknown = sorted(set(available) - set(algorithm.client_ids))
    if unknown:
      raise KeyError(
        f"clients {unknown} were not given to build_adaptivefl_process"
      )
    if not available:
      raise ValueError("a round needs at least one available client")
    round_num = state.round_num + 1
    # `plan_round`'s only randomness is its sampler's generator.
    draws = types.SimpleNamespace(
      rng=np.random.default_rng([state.selection_seed, round_num])
    )
    clients = []
    for assignment in algorithm.plan_round(
      state.server, round_num, list(available), self._clients_per_round, draws
    ):
      client = available[assignment.client_id]
      clients.append(
        api.ClientRound(
          client_id=assignment.client_id,
          dataset=client.dataset,
          num_examples=width_process.count_examples(client.dataset),
          capacity=devices_lib.Capacity(client.capacity_params, None),
          assignment=assignment.payload,
        )
      )
    output = algorithm.next(state.server, round_num, clients)
    return width_process.WidthRoundOutput(
      state=attrs.evolve(state, server=output.state, round_num=round_num),
      metrics=width_process.with_traffic_totals(output.metrics, output.traffic),
      clients=output.traffic,
    )

  def model_fn(self, level: Optional[str] = None):
    """No-arg builder of the Keras model of pool member `level` (None: L1)."""
    catalog = self._algorithm.catalog
    return catalog.by_name(level or catalog.outer.name).keras_fn

  def get_model_weights(
    self,
    state: AdaptiveFLProcessState,
    level: Optional[str] = None,
    calibration_data=None,
  ):
    """The weights of pool member `level` (None: L1, the server model), with
    static batch-norm statistics from `calibration_data` when given (as
    `WidthProcess.get_model_weights`)."""
    catalog = self._algorithm.catalog
    return width_process.level_weights(
      self._algorithm.rounds,
      state.server.model,
      catalog.by_name(level or catalog.outer.name),
      calibration_data,
    )


def build_adaptivefl_process(
  width_model_fn,
  *,
  full_widths: Sequence[int],
  start_indices: Sequence[int],
  client_ids: Sequence[str],
  clients_per_round: int,
  input_spec: Any,
  client_optimizer_fn,
  pool_ratios: tuple[float, float] = (0.66, 0.4),
  min_start_index: int = 1,
  selection: str = "rl",
  loss_fn=None,
  metrics_fn=None,
  prox_mu: float = 0.0,
  server_lr: float = 1.0,
  model_aggregator: Optional[
    masked_dp.MaskedAggregation | width_process.MaskedSumsFactory
  ] = None,
  noise_seed: Optional[int] = None,
  client_weighting: Optional[width_process.ClientWeighting] = None,
  selection_seed: int = 0,
) -> AdaptiveFLProcess:
  """AdaptiveFL as an `AdaptiveFLProcess` (module docstring: the rounds).

  `width_model_fn(widths)` builds your Keras model with one output width
  per width unit (as for `heterofl.build_heterofl_process`). The pool is
  L1, M1..Mp and S1..Sp: M and S scale every unit after the start index I
  by `pool_ratios` (rounded down), one M and one S per I of
  `start_indices` (decreasing, each >= `min_start_index`, tau). The RL
  tables have one column per id of `client_ids`; `next(state, available)`
  chooses `clients_per_round` of the available ones (`selection`: "rl" or
  the ablations "greedy", "random", "curiosity", "resource").

  `client_optimizer_fn` is a TFF optimizer, `model_aggregator` a
  `tff_hetero.MaskedAggregation` or a masked-sum `tff.aggregators` factory,
  `client_weighting` a `tff.learning.ClientWeighting` (all as for HeteroFL;
  the server applies the masked mean update at `server_lr`, AdaptiveFL's
  Algorithm 2, no server optimizer).
  """
  if selection not in SELECTIONS:
    raise ValueError(
      f"selection must be one of {SELECTIONS}, got {selection!r}"
    )
  if int(clients_per_round) < 1:
    raise ValueError(f"clients_per_round must be >= 1, got {clients_per_round}")
  ids = [str(c) for c in client_ids]
  if not ids or len(set(ids)) != len(ids):
    raise ValueError("client_ids must be distinct and not empty")
  ratios = tuple(float(r) for r in pool_ratios)
  if len(ratios) != 2:
    raise ValueError(f"pool_ratios must be (M, S), got {pool_ratios}")
  aggregation = width_process.checked_options(
    client_optimizer_fn,
    model_aggregator,
    server_lr,
    noise_seed,
    client_weighting,
  )
  task = width_process.width_task(
    width_model_fn, full_widths, input_spec, loss_fn, metrics_fn
  )
  pool = pools_lib.adaptivefl_pool(
    task.width_units, *ratios, tuple(start_indices), min_start_index
  )
  algorithm = AdaptiveFL(
    task,
    pool,
    ids,
    client_optimizer=client_optimizer_fn,
    server_lr=server_lr,
    selection=selection,
    min_start_index=min_start_index,
    prox_mu=prox_mu,
    aggregation=aggregation,
    noise_seed=noise_seed,
  )
  return AdaptiveFLProcess(algorithm, clients_per_round, selection_seed)
