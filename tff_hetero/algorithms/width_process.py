"""Width-heterogeneous training as a process a TFF user drives: `WidthProcess`.

The clients of one round train sub-models of different widths of one server
model, so their values have different TFF types and no `{T}@CLIENTS` value
holds them all. A `WidthProcess` is therefore not a
`tff.templates.IterativeProcess`: as in FedJAX, it is an `initialize` /
`next` pair in plain Python over immutable state, and every step of a round
is a typed `tff.Computation` (`computations`), the ones the CLI's width
algorithms run (`width_computations.py`).

With O the server model's trainable weights, S_k those of the level (width
sub-model) keyed k, D one batch of client data, M the measurements and
Sums = `MaskedSums<weighted_sum=O, weight_sum=O>`:

    group_round/<k>:  (<S_k@SERVER, {D*}@CLIENTS> ->
                       <MaskedSums<S_k, float32>@SERVER, M@SERVER>)
    apply_sums:       (<O, Sums, float32> -> O)
    apply_noised_sums (private aggregation only):
                      (<O, Sums, float32, int64[2]> -> O)

`next(state, cohort)`, `cohort` mapping level keys to the datasets of the
clients that train that level (each dataset the client's whole local
training for the round: repeat it for several epochs):

1. per level, the driver slices O to S_k in NumPy and runs `group_round/<k>`
   (measured broadcast of S_k, local training with the client optimizer,
   FedProx's proximal term when `prox_mu` > 0, measured masked sum of the
   example-weighted updates: clipped, and noised, with a private
   aggregation);
2. it adds each level's sums into O-sized sums in NumPy;
3. `apply_sums` once: every element some client trained moves by
   `server_lr` times the weighted mean of the updates that hold it; every
   other element keeps its value (with a private aggregation every element
   gets noise, `masked_dp`).

A round needs at least one client (an empty cohort is refused: under DP the
noise alone would move the model). The metrics report the loss and, when
the model's metrics hold it, the accuracy; other metrics are computed and
uploaded but not reported. Static batch norm reads the inputs under key
`x` of each batch.

State is `WidthProcessState` (server model, round number, DP noise seed);
`next` returns a `WidthRoundOutput` with the new state, the round's metrics
and every client's measured `ClientTraffic` in `cohort` order.

The server step is SGD on the masked mean (`server_lr`), not a TFF server
optimizer: a stateful optimizer would also move the elements no client of
the round trained, which the width algorithms keep unchanged.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
import math
import operator
from typing import Any
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import ClientTraffic
from tff_hetero.aggregators import masked_dp
from tff_hetero.algorithms import api
from tff_hetero.algorithms import width_rounds
from tff_hetero.models import width as width_lib

__all__ = ["WidthProcess", "WidthProcessState", "WidthRoundOutput"]


@attrs.frozen
class WidthProcessState:
  """A `WidthProcess`'s server state.

  Attributes:
    model: The server model (`tff.learning.models.ModelWeights`, NumPy).
    round_num: Rounds completed.
    noise_seed: The DP noise seed (read only with a private aggregation;
      left out of the state's repr).
  """

  model: Any
  round_num: int = 0
  noise_seed: int = attrs.field(default=0, repr=False)  # A secret under DP.


@attrs.frozen
class WidthRoundOutput:
  """What `WidthProcess.next` returns.

  Attributes:
    state: The new state (`WidthProcessState`; an `AdaptiveFLProcess`'s
      own state type for AdaptiveFL).
    metrics: `loss` and `train_accuracy` (example-weighted over all clients;
      the accuracy only when the model's metrics hold it), `bytes_down`,
      `bytes_up` (summed over clients, as measured), `clients`, `examples`
      (given to the clients), and each algorithm's own (AdaptiveFL:
      `waste_rate`, `pruned`, `failed`, ...).
    clients: One measured `ClientTraffic` per client, in `cohort` order
      (client ids `<key>/<position>`).
  """

  state: Any
  metrics: collections.OrderedDict
  clients: tuple[ClientTraffic, ...]


def width_task(
  width_model_fn: Callable[[Sequence[int]], tf.keras.Model],
  full_widths: Sequence[int],
  input_spec: Any,
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
  metrics_fn: Optional[Callable[[], list]] = None,
) -> api.Task:
  """The internal `api.Task` of a user's width factory (checked).

  `width_model_fn(widths)` builds the Keras model with one output width per
  width unit (the full model at `full_widths`); the units are numbered in
  the order given.
  """
  if not callable(width_model_fn):
    raise TypeError(
      "width_model_fn must be a callable taking one width per width unit,"
      f" got {type(width_model_fn).__name__}"
    )
  try:
    full = tuple(operator.index(w) for w in full_widths)
  except TypeError:
    full = ()
  if not full or any(isinstance(w, bool) or w < 1 for w in full):
    raise ValueError(
      "full_widths must be positive integers, one per width unit, got"
      f" {tuple(full_widths)}"
    )
  probe = width_model_fn(full)
  if not isinstance(probe, tf.keras.Model):
    raise TypeError(
      f"width_model_fn must return a tf.keras.Model, got {type(probe).__name__}"
    )
  task = api.Task.of_keras(
    lambda: width_model_fn(full), input_spec, loss_fn, metrics_fn
  )
  return attrs.evolve(
    task,
    model_name=getattr(width_model_fn, "__name__", "model"),
    width_model_fn=lambda widths: width_model_fn(tuple(widths)),
    width_units=tuple(
      width_lib.WidthUnit(i + 1, f"unit{i + 1}", w, ())
      for i, w in enumerate(full)
    ),
  )


# A `tff.aggregators` factory forming `MaskedSums` (`masked_dp.MaskedAggregation`'s
# `factory`), accepted as a builder's `model_aggregator`.
MaskedSumsFactory = tff.aggregators.WeightedAggregationFactory
ClientWeighting = tff.learning.ClientWeighting


def checked_options(
  client_optimizer_fn,
  model_aggregator,
  server_lr: float,
  noise_seed,
  client_weighting=None,
) -> masked_dp.MaskedAggregation:
  """Checks the builders' common arguments; returns the aggregation
  (`model_aggregator`, None: the masked mean) with `client_weighting`
  (None: the aggregation's own)."""
  if not isinstance(client_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise TypeError(
      "client_optimizer_fn must be a tff.learning.optimizers.Optimizer"
      " (e.g. tff.learning.optimizers.build_sgdm(0.1)), got"
      f" {type(client_optimizer_fn).__name__}"
    )
  if model_aggregator is None:
    model_aggregator = masked_dp.MaskedAggregation()
  if isinstance(model_aggregator, tff.aggregators.WeightedAggregationFactory):
    model_aggregator = masked_dp.MaskedAggregation(factory=model_aggregator)
  if not isinstance(model_aggregator, masked_dp.MaskedAggregation):
    raise TypeError(
      "model_aggregator must be a tff_hetero.MaskedAggregation or a"
      " tff.aggregators.WeightedAggregationFactory forming MaskedSums, got"
      f" {type(model_aggregator).__name__}"
    )
  if client_weighting is not None:
    model_aggregator = attrs.evolve(
      model_aggregator, weighting=client_weighting
    )
  if not (math.isfinite(server_lr) and server_lr > 0):
    raise ValueError(f"server_lr must be finite and > 0, got {server_lr}")
  if noise_seed is not None and not model_aggregator.private:
    raise ValueError(
      "noise_seed is read only with a private aggregation"
      " (MaskedAggregation with noise_multiplier)"
    )
  return model_aggregator


def count_examples(dataset: tf.data.Dataset) -> int:
  """Examples in a batched dataset (the first dimension of each batch)."""
  return int(
    dataset.reduce(
      np.int64(0),
      lambda n, batch: (
        n + tf.cast(tf.shape(tf.nest.flatten(batch)[0])[0], tf.int64)
      ),
    )
  )


def check_cohort(cohort: Any) -> None:
  """`cohort` maps level keys to sequences of datasets, at least one."""
  if not isinstance(cohort, Mapping):
    raise TypeError(
      "the cohort must map each level key to a list of client datasets,"
      f" got {type(cohort).__name__}"
    )
  for key, datasets in cohort.items():
    if isinstance(datasets, tf.data.Dataset) or not isinstance(
      datasets, Sequence
    ):
      raise TypeError(
        f"the cohort's value for {key!r} must be a list of datasets, got"
        f" {type(datasets).__name__}"
      )
  if not any(cohort.values()):
    raise ValueError("a round needs at least one client dataset")


def with_traffic_totals(
  metrics: Mapping[str, Any], traffic: Sequence[ClientTraffic]
) -> collections.OrderedDict:
  """`metrics` and the round's measured totals: `bytes_down`, `bytes_up`,
  `clients` and `examples` (summed over the clients' `ClientTraffic`)."""
  metrics = collections.OrderedDict(metrics)
  metrics["bytes_down"] = sum(t.bytes_down for t in traffic)
  metrics["bytes_up"] = sum(t.bytes_up for t in traffic)
  metrics["clients"] = len(traffic)
  metrics["examples"] = sum(t.examples for t in traffic)
  return metrics


def with_server_steps(
  rounds: width_rounds.HeterogeneousRounds,
  steps: Mapping[str, Any],
  levels: Iterable[width_rounds.Level],
) -> collections.OrderedDict:
  """`steps` and the server step(s) of `rounds`, with the static batch-norm
  query of every level of `levels` built too: a process traces everything
  at build time, as TFF's builders do (tracing builds Keras models in a
  graph, which invalidates the Keras models a user made before it)."""
  parts = rounds.computations
  steps = collections.OrderedDict(steps)
  steps["apply_sums"] = parts.apply_sums
  if parts.apply_noised_sums is not None:
    steps["apply_noised_sums"] = parts.apply_noised_sums
  for level in levels:
    rounds.build_evaluation(level)
  return steps


def level_weights(
  rounds: width_rounds.HeterogeneousRounds,
  model: tff.learning.models.ModelWeights,
  level: width_rounds.Level,
  calibration_data: Optional[Sequence[tf.data.Dataset]],
) -> tff.learning.models.ModelWeights:
  """`level`'s part of the server `model`, its static batch-norm statistics
  from `calibration_data` when given (else the model's initial ones)."""
  data = (
    None
    if calibration_data is None
    else api.ClientDatasets(list(calibration_data))
  )
  return rounds.evaluation_model(model, level, data).weights


class WidthProcess:
  """`initialize` / `next` over width sub-models (module docstring).

  Built by an algorithm's builder (`heterofl.build_heterofl_process`) from
  its `width_rounds.HeterogeneousRounds` and the levels its clients train,
  keyed as the user names them (HeteroFL: the width rate).
  """

  def __init__(
    self,
    rounds: width_rounds.HeterogeneousRounds,
    levels: Mapping[Hashable, width_rounds.Level],
  ):
    self._rounds = rounds
    self._catalog = rounds.catalog
    self.levels = collections.OrderedDict(levels)
    # Everything is traced now (`with_server_steps`): nothing may build a
    # Keras model in a graph in `next` or `get_model_weights`.
    parts = rounds.computations
    self._computations = with_server_steps(
      rounds,
      collections.OrderedDict(
        (f"group_round/{key}", parts.group_round(level, level))
        for key, level in self.levels.items()
      ),
      self.levels.values(),
    )

  @property
  def computations(self) -> collections.OrderedDict:
    """Every typed step of a round by name (module docstring)."""
    return collections.OrderedDict(self._computations)

  def initialize(self) -> WidthProcessState:
    return WidthProcessState(
      model=self._catalog.initial_weights(self._catalog.outer),
      round_num=0,
      noise_seed=int(self._rounds.initial_noise_seed()),
    )

  def _level(self, key) -> width_rounds.Level:
    if key not in self.levels:
      raise KeyError(
        f"no level {key!r}; the levels are {', '.join(map(repr, self.levels))}"
      )
    return self.levels[key]

  def next(
    self,
    state: WidthProcessState,
    cohort: Mapping[Hashable, Sequence[tf.data.Dataset]],
  ) -> WidthRoundOutput:
    """One round: each key's datasets train that level (module docstring).

    Each dataset must be finite: the driver counts its examples (for each
    client's `ClientTraffic`) before the round.
    """
    check_cohort(cohort)
    groups = []
    for key, datasets in cohort.items():
      level = self._level(key)
      clients = tuple(
        api.ClientRound(
          client_id=f"{key}/{i}",
          dataset=dataset,
          num_examples=count_examples(dataset),
        )
        for i, dataset in enumerate(datasets)
      )
      if clients:
        groups.append(width_rounds.Group(level, level, clients))
    round_num = state.round_num + 1
    result = self._rounds.run(
      state.model,
      groups,
      round_num=round_num,
      noise_seed=state.noise_seed,
    )
    return WidthRoundOutput(
      state=attrs.evolve(state, model=result.model, round_num=round_num),
      metrics=with_traffic_totals(result.metrics, result.traffic),
      clients=result.traffic,
    )

  def model_fn(self, key=None) -> Callable[[], tf.keras.Model]:
    """No-arg builder of the Keras model of level `key` (None: the server's)."""
    return (self._catalog.outer if key is None else self._level(key)).keras_fn

  def get_model_weights(
    self,
    state: WidthProcessState,
    key=None,
    calibration_data: Optional[Sequence[tf.data.Dataset]] = None,
  ) -> tff.learning.models.ModelWeights:
    """The weights of level `key`'s model (None: the server model's).

    The trainable weights are the level's part of the server model. With
    batch normalisation, static (sBN, `static_batch_norm.py`): its
    statistics are those of `calibration_data` (batched datasets, e.g. the
    clients' training data) when given, else the model's initial ones.
    """
    level = self._catalog.outer if key is None else self._level(key)
    return level_weights(self._rounds, state.model, level, calibration_data)
