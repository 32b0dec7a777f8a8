"""All-Large: FedAvg of the full model on every client, resource limits ignored.

The upper-reference baseline of AdaptiveFL (Jia et al., DAC 2024, Section
4.2, "we trained the L1 model with all clients under the classic FedAvg"):
every sampled client, whatever its device, trains the whole model. It runs
on the same machinery as the width-heterogeneous algorithms
(`width_rounds.py` with a single level), so its accounting, static batch
normalisation and evaluation are those of AdaptiveFL and HeteroFL; with one
level the round is exactly TFF's FedAvg (tested).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Sequence
from typing import Optional

import attrs
import tensorflow as tf

from tff_hetero.aggregators import masked_dp
from tff_hetero.aggregators import model_aggregators
from tff_hetero.algorithms import api
from tff_hetero.algorithms import heterofl
from tff_hetero.algorithms import width_process
from tff_hetero.algorithms import width_rounds
from tff_hetero.errors import UsageError
from tff_hetero.models import width as width_lib


class AllLarge(api.FederatedAlgorithm):
  """FedAvg of the full model through `width_rounds` (one group per round)."""

  name = "all_large"

  def __init__(
    self,
    task: api.Task,
    *,
    client_lr: float,
    client_momentum: float = 0.0,
    server_lr: float = 1.0,
    prox_mu: float = 0.0,
    aggregation: masked_dp.MaskedAggregation = masked_dp.MaskedAggregation(),
    noise_seed: Optional[int] = None,
  ):
    self.catalog = width_rounds.LevelCatalog(
      task, [("L1", width_lib.full_widths(task.width_units))]
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

  def initialize(self) -> width_rounds.WidthState:
    return width_rounds.WidthState(
      model=self.catalog.initial_weights(self.catalog.outer),
      noise_seed=self.rounds.initial_noise_seed(),
    )

  def next(
    self,
    state: width_rounds.WidthState,
    round_num: int,
    clients: Sequence[api.ClientRound],
  ) -> api.RoundOutput:
    full = self.catalog.outer
    result = self.rounds.run(
      state.model,
      [width_rounds.Group(full, full, tuple(clients))],
      round_num=round_num,
      noise_seed=state.noise_seed,
    )
    return api.RoundOutput(
      state=attrs.evolve(state, model=result.model),
      metrics=result.metrics,
      traffic=result.traffic,
    )

  def model_weights(self, state: width_rounds.WidthState):
    return state.model

  def evaluation_models(self, state: width_rounds.WidthState, data=None):
    return collections.OrderedDict(
      L1=self.rounds.evaluation_model(state.model, self.catalog.outer, data)
    )


def build_all_large(config, task: api.Task, client_ids=()) -> AllLarge:
  del client_ids  # Every client trains the same model.
  if not task.width_units:
    raise UsageError("--model", f"{task.model_name} has no width knobs")
  return AllLarge(
    task,
    client_lr=config.client_lr,
    client_momentum=config.client_momentum,
    server_lr=config.server_lr,
    **model_aggregators.width_round_options(config),
  )


def build_all_large_process(
  width_model_fn: Callable[[Sequence[int]], tf.keras.Model],
  *,
  full_widths: Sequence[int],
  **options,
) -> width_process.WidthProcess:
  """All-Large as a `width_process.WidthProcess` with the one level 1.0.

  What `--algorithm=all_large` runs: every client the caller samples trains
  the full model `width_model_fn(full_widths)` whatever its device, through
  the width machinery (masked sums of one level: the example-weighted
  FedAvg mean; `get_model_weights(state, 1.0, calibration_data)` sets
  static batch-norm statistics as the CLI's evaluation does). `next` takes
  `{1.0: [datasets]}`. `options` are `build_heterofl_process`'s
  (`input_spec`, `client_optimizer_fn`, `loss_fn`, `metrics_fn`, `prox_mu`,
  `server_lr`, `model_aggregator`, `noise_seed`, `client_weighting`), so a
  private All-Large is the CLI's masked DP, not TFF's. All-Small, a
  reference of AdaptiveFL's paper without a CLI name, is the same process
  at the smallest member's widths: `build_all_large_process(width_model_fn,
  full_widths=small_widths, ...)`.
  """
  if "rates" in options:
    raise TypeError("All-Large has one level: no rates")
  return heterofl.build_heterofl_process(
    width_model_fn, full_widths=full_widths, rates=(), **options
  )
