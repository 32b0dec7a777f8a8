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

Deviations from HeteroFL's code (diaoenmao/HeteroFL-...) and from the
HeteroFL baseline of AdaptiveFL's reference code (mastlab-T3S/AdaptiveFL,
`Training_HeteroFL.py`), each with its reason:
* Clients are weighted by their number of examples (as AdaptiveFL's
  reference runs its HeteroFL baseline); HeteroFL's own combine counts each
  client once.
* Not implemented: the Scaler module (activations divided by the rate in
  training), the masking of logits of classes a client does not hold, and
  the "dynamic" mode that re-draws rates each round.
* The rate narrows every width unit by default (HeteroFL's cropping of
  each parameter matrix); `--heterofl_width_units` narrows only the named
  ones (InclusiveFL's baseline narrows the transformer's hidden size and
  keeps its MLP width, as that paper's 456 / 624 of 768 do).
* One fixed rate per device tier, from the device population's capacities
  (`--tier_capacities`, the same for every algorithm): by default a tier's
  rate is the largest rate in steps of 0.01 whose sub-model fits the tier's
  nominal capacity (in trainable parameters; a tier without a limit gets
  rate 1, a tier that holds no sub-model trains nothing); rates given with
  `--heterofl_rates` (in `--tiers` order) are checked against the
  capacities (one-line error). The server reads tiers and capacities
  (HeteroFL assigns widths by device class). AdaptiveFL's reference instead
  uses the rates 0.5, 0.71 and 1.0 and, for each of the m slots of a round,
  draws a rate uniformly and gives it to a client drawn among the tiers that
  can hold it (by tier, without a capacity check), so a strong client also
  trains the small rates and no client idles. We fit the rates to the
  capacities so that no device trains more than its capacity, as in every
  other width algorithm here.
* When a device's capacity fluctuates below its tier's sub-model in a
  round, it trains the largest sub-model that fits that round: the tiers'
  rates and, below the weakest tier's, fallback rates in steps of
  `FALLBACK_STEP` (0.05; one level per distinct set of widths), so that, as
  in the reference, a device idles only if even the 0.05 sub-model exceeds
  its capacity (`idle_clients`). The committed AdaptiveFL reproduction ran
  before the fallback rates existed: there 58 of the 300 client-rounds of
  `heterofl_iid_seed0` were idle (69 and 56 for seeds 1 and 2, the same at
  Dirichlet 0.3).

Evaluation: the sub-model of every tier's rate and the full model, widest
first (`accuracy` is the full model), and their mean; fallback sub-models
are trained, not evaluated.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import Optional

import attrs
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import models as models_lib
from tff_hetero.aggregators import masked_dp
from tff_hetero.aggregators import model_aggregators
from tff_hetero.algorithms import api
from tff_hetero.algorithms import task_devices
from tff_hetero.algorithms import width_process
from tff_hetero.algorithms import width_rounds
from tff_hetero.errors import UsageError
from tff_hetero.parsing import parse_number_list
from tff_hetero.settings import AlgorithmSettings
from tff_hetero.settings import setting
from tff_hetero.submodels import pools as pools_lib


class HeteroFL(api.FederatedAlgorithm):
  """HeteroFL with fixed rates per device tier."""

  name = "heterofl"

  def __init__(
    self,
    task: api.Task,
    tier_rates: Mapping[str, Optional[float]],
    *,
    scaled_units: Optional[frozenset] = None,
    client_lr: float,
    client_momentum: float = 0.0,
    server_lr: float = 1.0,
    prox_mu: float = 0.0,
    aggregation: masked_dp.MaskedAggregation = masked_dp.MaskedAggregation(),
    noise_seed: Optional[int] = None,
  ):
    self.tier_rates = dict(tier_rates)
    rates = sorted(
      {r for r in self.tier_rates.values() if r is not None} | {1.0}
    )
    fallback = [
      round(k * FALLBACK_STEP, 2)
      for k in range(1, int(round(1 / FALLBACK_STEP)))
      if round(k * FALLBACK_STEP, 2) < rates[0]
    ]
    self.pool = pools_lib.uniform_pool(
      task.width_units, fallback + rates, "ceil", scaled_units
    )
    # One level per distinct sub-model (the largest rate giving it).
    members = {}
    for member in self.pool.members:
      members[member.widths] = member
    self.catalog = width_rounds.LevelCatalog(
      task, [(m.level, m.widths) for m in members.values()]
    )
    self.rounds = width_rounds.HeterogeneousRounds(
      self.catalog,
      client_lr=client_lr,
      client_momentum=client_momentum,
      prox_mu=prox_mu,
      server_lr=server_lr,
      aggregation=aggregation,
      noise_seed=noise_seed,
    )
    by_widths = {level.widths: level for level in self.catalog.levels}
    self._level_of_rate = {
      m.ratio: by_widths[m.widths] for m in self.pool.members
    }
    self._evaluated = tuple(self._level_of_rate[r] for r in rates)

  def initialize(self) -> width_rounds.WidthState:
    return width_rounds.WidthState(
      model=self.catalog.initial_weights(self.catalog.outer),
      noise_seed=self.rounds.initial_noise_seed(),
    )

  def level_of(self, client: api.ClientRound) -> Optional[width_rounds.Level]:
    """The client's tier level, or the largest that fits this round."""
    rate = self.tier_rates.get(client.tier, 1.0)
    level = None if rate is None else self._level_of_rate[float(rate)]
    capacity = None if client.capacity is None else client.capacity.params
    if level is None or capacity is None or level.params <= capacity:
      return level
    fitting = [lv for lv in self.catalog.levels if lv.params <= capacity]
    return max(fitting, key=lambda lv: lv.params) if fitting else None

  def next(
    self,
    state: width_rounds.WidthState,
    round_num: int,
    clients: Sequence[api.ClientRound],
  ) -> api.RoundOutput:
    by_level = collections.OrderedDict()
    for client in clients:
      level = self.level_of(client)
      if level is not None:
        by_level.setdefault(level.index, []).append(client)
    levels = self.catalog.levels
    groups = [
      width_rounds.Group(levels[i], levels[i], tuple(members))
      for i, members in sorted(by_level.items())
    ]
    result = self.rounds.run(
      state.model,
      groups,
      round_num=round_num,
      noise_seed=state.noise_seed,
      cohort_size=len(clients),  # Idle clients too: one cardinality.
    )
    metrics = result.metrics
    metrics["idle_clients"] = float(
      len(clients) - sum(len(m) for m in by_level.values())
    )
    return api.RoundOutput(
      state=attrs.evolve(state, model=result.model),
      metrics=metrics,
      traffic=result.traffic,
    )

  def model_weights(self, state: width_rounds.WidthState):
    return state.model

  def report_extras(self):
    return collections.OrderedDict(
      tier_rates=self.tier_rates,
      level_params={lv.name: lv.params for lv in self.catalog.levels},
    )

  def evaluation_models(self, state: width_rounds.WidthState, data=None):
    return collections.OrderedDict(
      (level.name, self.rounds.evaluation_model(state.model, level, data))
      for level in reversed(self._evaluated)
    )


RATE_STEP = 0.01
FALLBACK_STEP = 0.05


@attrs.frozen(kw_only=True)
class HeteroFLSettings(AlgorithmSettings):
  heterofl_rates: str = setting(
    "",
    "HeteroFL width rate per tier of --tiers, colon-separated, each checked"
    " against the tier's capacity (default: per tier, the largest rate in"
    " steps of 0.01 whose sub-model fits the tier's capacity).",
  )
  heterofl_width_units: str = setting(
    "",
    "Width units the HeteroFL rate narrows, comma-separated (default: every"
    " unit); the others keep their full width. E.g. hidden for the"
    " transformer: InclusiveFL's HeteroFL baseline narrows the hidden size"
    " only.",
  )


def sub_model_params(
  task: api.Task, rate: float, cache=None, scaled_units=None
) -> int:
  """Trainable parameters of HeteroFL's sub-model at `rate` (narrowing
  `scaled_units`, None: every unit)."""
  widths = pools_lib.scaled_widths(task.width_units, rate, "ceil", scaled_units)
  cache = {} if cache is None else cache
  if widths not in cache:
    cache[widths] = models_lib.count_params(
      task.width_model_fn(widths)
    ).trainable
  return cache[widths]


def largest_fitting_rate(
  task: api.Task, capacity_params: Optional[int], cache=None, scaled_units=None
) -> Optional[float]:
  """The largest rate k x 0.01 whose sub-model fits; None if none does.

  Sizes grow with the rate, so a binary search over k = 1..100 suffices.
  """
  if capacity_params is None:
    return 1.0
  cache = {} if cache is None else cache

  def params(rate):
    return sub_model_params(task, rate, cache, scaled_units)

  if params(1.0) <= capacity_params:
    return 1.0
  if params(RATE_STEP) > capacity_params:
    return None
  lo, hi = 1, int(round(1 / RATE_STEP))  # k = lo fits, k = hi does not.
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if params(mid * RATE_STEP) <= capacity_params:
      lo = mid
    else:
      hi = mid
  return round(lo * RATE_STEP, 2)


def tier_rates_from_config(
  config, task: api.Task
) -> dict[str, Optional[float]]:
  """HeteroFL's rate per tier of `--tiers` (module docstring)."""
  tiers = task_devices.resolve_tiers(config, task)
  cache = {}
  scaled = scaled_units_from_config(config, task)
  if not config.settings.heterofl_rates:
    return {
      t.name: largest_fitting_rate(task, t.capacity_params, cache, scaled)
      for t in tiers
    }
  rates = parse_number_list("--heterofl_rates", config.settings.heterofl_rates)
  if len(rates) != len(tiers):
    raise UsageError(
      "--heterofl_rates",
      f"needs one rate per tier of --tiers={config.tiers}, got {len(rates)}",
    )
  if not all(0 < r <= 1 for r in rates):
    raise UsageError(
      "--heterofl_rates",
      f"rates must lie in (0, 1], got {config.settings.heterofl_rates}",
    )
  for tier, rate in zip(tiers, rates):
    if tier.capacity_params is None:
      continue
    params = sub_model_params(task, rate, cache, scaled)
    if params > tier.capacity_params:
      raise UsageError(
        "--heterofl_rates",
        f"rate {rate:g} of tier {tier.name} needs {params:,} parameters,"
        f" above its capacity {tier.capacity_params:,} (--tier_capacities);"
        f" the largest that fits is"
        f" {largest_fitting_rate(task, tier.capacity_params, cache, scaled)}",
      )
  return {t.name: r for t, r in zip(tiers, rates)}


def scaled_units_from_config(config, task: api.Task) -> Optional[frozenset]:
  """The unit names of `--heterofl_width_units` (None: every unit)."""
  text = config.settings.heterofl_width_units
  if not text:
    return None
  names = [n.strip() for n in text.split(",")]
  known = [u.name for u in task.width_units]
  unknown = [n for n in names if n not in known]
  if unknown or not names:
    raise UsageError(
      "--heterofl_width_units",
      f"{task.model_name} has no width unit {', '.join(unknown) or '(none)'};"
      f" its units: {', '.join(known)}",
    )
  return frozenset(names)


def build_heterofl(config, task: api.Task, client_ids=()) -> HeteroFL:
  del client_ids  # The server assigns widths by tier only.
  if not task.width_units:
    raise UsageError("--model", f"{task.model_name} has no width knobs")
  return HeteroFL(
    task,
    tier_rates_from_config(config, task),
    scaled_units=scaled_units_from_config(config, task),
    client_lr=config.client_lr,
    client_momentum=config.client_momentum,
    server_lr=config.server_lr,
    **model_aggregators.width_round_options(config),
  )


def build_heterofl_process(
  width_model_fn: Callable[[Sequence[int]], tf.keras.Model],
  *,
  full_widths: Sequence[int],
  rates: Sequence[float],
  input_spec: Any,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
  metrics_fn: Optional[Callable[[], list[tf.keras.metrics.Metric]]] = None,
  prox_mu: float = 0.0,
  server_lr: float = 1.0,
  model_aggregator: Optional[
    masked_dp.MaskedAggregation | width_process.MaskedSumsFactory
  ] = None,
  noise_seed: Optional[int] = None,
  client_weighting: Optional[tff.learning.ClientWeighting] = None,
) -> width_process.WidthProcess:
  """HeteroFL as a `width_process.WidthProcess`, keyed by width rate.

  `width_model_fn(widths)` builds your Keras model (logits out, seeded: the
  same initial values on every call) with one output width per width unit,
  the full model at `full_widths`; a narrower one must be its first
  channels (units) of every narrowed layer, the classifier whole (as
  `tff_hetero.models.width` describes). The rate r sub-model has widths
  ceil(r x full width) per unit (HeteroFL's rounding). The levels are
  `rates` and 1.0 (the server model); `next` takes `{rate: [datasets]}`.

  `client_optimizer_fn` is a TFF optimizer; `model_aggregator` a
  `tff_hetero.MaskedAggregation` (default: the example-weighted masked
  mean; `MaskedAggregation(clip_norm=C)` clips each update to L2 norm C;
  with `noise_multiplier=z` as well, clients are weighted uniformly, and
  Gaussian noise of std z C is added to every element's sum and of std z
  to each level's count (an element covered by L levels: z sqrt(L); see
  `masked_dp`), seeded by `(noise_seed, round)` (`noise_seed` None: a
  secret one); no privacy accounting is reported), or any
  `tff.aggregators.WeightedAggregationFactory` that forms `MaskedSums`:
  TFF's wrappers (zeroing, clipping) around a `tff_hetero.MaskedSumFactory`,
  whose inner sums may be `tff.aggregators.SecureSumFactory` (simulated,
  `tff_hetero.runtime.contexts`). `client_weighting` (a
  `tff.learning.ClientWeighting`; None: by examples, uniform when private)
  weighs each client's update. The server applies the masked mean update
  at `server_lr` (HeteroFL's server averages; no server optimizer). Type
  signatures: `width_process`'s module docstring.
  """
  rates = tuple(float(r) for r in rates)
  if not all(0 < r <= 1 for r in rates):
    raise ValueError(f"rates must lie in (0, 1], got {rates}")
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
  units = task.width_units
  pool = pools_lib.uniform_pool(units, sorted(set(rates) | {1.0}), "ceil")
  # widths -> level name (the largest rate giving them), smallest first.
  levels = collections.OrderedDict()
  for member in pool.members:
    levels[member.widths] = member.level
  catalog = width_rounds.LevelCatalog(
    task, [(name, widths) for widths, name in levels.items()]
  )
  rounds = width_rounds.HeterogeneousRounds(
    catalog,
    client_optimizer=client_optimizer_fn,
    prox_mu=prox_mu,
    server_lr=server_lr,
    aggregation=aggregation,
    noise_seed=noise_seed,
  )
  return width_process.WidthProcess(
    rounds,
    collections.OrderedDict(
      (m.ratio, catalog.by_name(levels[m.widths])) for m in pool.members
    ),
  )
