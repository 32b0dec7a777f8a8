"""Heterogeneous rounds over width sub-models: the driver of one round.

The shared mechanics of HeteroFL, AdaptiveFL, All-Large and Decoupled
(`heterofl.py`, `adaptivefl.py`, `all_large.py`, `decoupled.py`), in three
layers: `width_levels.py` (the levels and their maps: Keras and NumPy),
`width_computations.py` (the typed TFF computations, with their type
signatures) and this module, which runs them.

A TFF value `{T}@CLIENTS` gives every client the same type, but a weak device
must receive, and may only train, a narrower model than a strong one. A round
therefore groups its cohort by (sub-model sent, sub-model trained) and runs
one federated computation per group, `group_round`:

    (<S@SERVER, {D*}@CLIENTS> -> <MaskedSums<T, float32>@SERVER, M@SERVER>)

`HeterogeneousRounds.run` does, on the driver, which holds the server model
O as NumPy arrays between rounds:

1. per sent level, slices O's trainable weights to S in NumPy
   (`SubModelMap.extract_arrays`), so only S travels to the TFF worker;
2. per group, runs `group_round` and folds the group's sums, which come back
   at the trained size T, into the round's running sums
   `MaskedSums<O.trainable, O.trainable>` in place
   (`SubModelMap.add_scattered`: the weighted sum into the level's elements,
   the weight sum onto every element the level covers);
3. after the last group, runs the server step `apply_sums` once (with DP,
   `apply_noised_sums` with the seed `(noise_seed, round_num)`; the
   algorithm keeps `noise_seed` in its state, `masked_dp.initial_noise_seed`).

So per group the worker receives S and the group's client datasets (and
the computation, the first time), and T + 1 values plus the measurements
come back; O and the two O-sized sums go to the worker, and the new O comes
back, once per round (`tools/bench.py --suite=hetero` measures the bytes).

Every group's call holds as many clients as the whole round (the groups'
clients and the unserved ones): a group is padded with clients that have no
data (`cohort_positions.padded`). The TFF worker builds and keeps one
executor stack per CLIENTS cardinality it is sent, each with its own
compiled copy of every computation run on it, so groups of every size from
1 to the cohort kept adding copies for hundreds of rounds. Measured with
AdaptiveFL (default pool and tiers, mnist_cnn, cohort 10, RL selection, 200
rounds, a scratch run recording the worker's resident memory, medians of
rounds 10-14 and 196-200): unpadded 235 -> 354 MiB (15 (sent, trained,
size) triples, the last first seen at round 65); padded to powers of two
220 -> 254 MiB; padded to the cohort 176 -> 185 MiB. A padding client
weighs 0 (its weight is its example count, 0), so the sums, the metrics
and the examples are unchanged up to the order in which the worker adds
them (the known-answer tests pass; over 20 rounds the quickstart ends at
0.9440 with padding and with padding off alike); its
traffic is measured like the others' and left out of the ledger. With a
weighting under which an empty client weighs 1 (UNIFORM, as with DP noise)
groups run unpadded. The price: each padding client receives the group's
sub-model and sends back a zero update inside the worker (no data, no SGD
step).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import math
from typing import Any
from typing import Optional

import attrs
import numpy as np
import tensorflow_federated as tff

from tff_hetero.accounting import ClientTraffic
from tff_hetero.aggregators import MaskedSums
from tff_hetero.aggregators import masked_dp
from tff_hetero.algorithms import api
from tff_hetero.algorithms import cohort_positions
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import static_batch_norm
from tff_hetero.algorithms.width_computations import WidthComputations
from tff_hetero.algorithms.width_levels import Level
from tff_hetero.algorithms.width_levels import LevelCatalog

__all__ = [
  "Group",
  "GroupedRoundResult",
  "HeterogeneousRounds",
  "Level",
  "LevelCatalog",
  "WidthState",
]


@attrs.frozen
class Group:
  """Clients of one round that receive level `sent` and train level `trained`."""

  sent: Level
  trained: Level
  clients: tuple[api.ClientRound, ...]


@attrs.frozen
class GroupedRoundResult:
  """What a heterogeneous round produced (see `HeterogeneousRounds.run`).

  Attributes:
    model: The new server model (`ModelWeights`; non-trainable unchanged).
    metrics: `loss`, `train_accuracy` (example-weighted over all groups'
      finite updates; accuracy absent when the task's metrics hold none),
      `non_finite_updates` (clients whose update was zeroed).
    traffic: One measured `ClientTraffic` per client, in `groups` order.
    sent_model_bytes: Sum over clients of the sub-model bytes received.
    returned_model_bytes: Sum over clients of the update bytes returned
      (model values only: weight and metrics excluded).
    examples_expected / examples_processed: The cohort's examples, and
      those in the metrics (a zeroed client's are not).
  """

  model: Any
  metrics: collections.OrderedDict
  traffic: tuple[ClientTraffic, ...]
  sent_model_bytes: int
  returned_model_bytes: int
  examples_expected: int
  examples_processed: int


class HeterogeneousRounds:
  """Runs the group computations of one server model (module docstring).

  Attributes:
    catalog: The `LevelCatalog`.
    computations: Its `WidthComputations` (built and cached there).
  """

  def __init__(
    self,
    catalog: LevelCatalog,
    *,
    client_lr: Optional[float] = None,
    client_momentum: float = 0.0,
    client_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    prox_mu: float = 0.0,
    server_lr: float = 1.0,
    aggregation: masked_dp.MaskedAggregation = masked_dp.MaskedAggregation(),
    noise_seed: Optional[int] = None,
  ):
    self.catalog = catalog
    self.computations = WidthComputations(
      catalog,
      client_lr=client_lr,
      client_momentum=client_momentum,
      client_optimizer=client_optimizer,
      prox_mu=prox_mu,
      aggregation=aggregation,
    )
    self._noise_seed = noise_seed
    self._server_lr = float(server_lr)
    self._static_bn: dict[int, static_batch_norm.StaticBatchNorm] = {}
    self._padding_client = api.ClientRound(
      client_id="",
      dataset=cohort_positions.empty_dataset(catalog.task.element_spec),
      num_examples=0,
    )

  @property
  def aggregation(self) -> masked_dp.MaskedAggregation:
    return self.computations.aggregation

  def initial_noise_seed(self) -> np.int64:
    """The DP noise seed a new run keeps in its state: the given one, a
    secret one (private aggregation), or 0 (`masked_dp.initial_noise_seed`)."""
    return masked_dp.initial_noise_seed(self.aggregation, self._noise_seed)

  # -- running -----------------------------------------------------------

  def zero_sums(self) -> MaskedSums:
    shapes = [t.shape for t in self.computations.outer_trainable_type]
    return MaskedSums(
      [np.zeros(s, np.float32) for s in shapes],
      [np.zeros(s, np.float32) for s in shapes],
    )

  def run(
    self,
    weights: tff.learning.models.ModelWeights,
    groups: Sequence[Group],
    unserved: Sequence[tuple[Level, api.ClientRound]] = (),
    round_num: Optional[int] = None,
    noise_seed: Optional[int] = None,
    cohort_size: Optional[int] = None,
  ) -> GroupedRoundResult:
    """Runs every group on the server model `weights`, then the server step.

    `unserved` clients received a sub-model but could train nothing of it:
    their download is measured, they upload nothing. With a private
    aggregation the DP noise is drawn from `(noise_seed, round_num)`, so a
    resumed run draws what an uninterrupted one does; `round_num` is then
    required, and `noise_seed` (the state's; default: the constructor's).
    Each group's call is padded to `cohort_size` clients (module
    docstring; default: the groups' and the unserved clients).
    """
    noise_seed = self._noise_seed if noise_seed is None else noise_seed
    if self.computations.aggregation.private and (
      round_num is None or noise_seed is None
    ):
      raise ValueError(
        "a private aggregation needs the round number and the noise seed"
      )
    trainable = [np.asarray(w, np.float32) for w in weights.trainable]
    sums = self.zero_sums()
    sent_slices: dict[int, list[np.ndarray]] = {}

    def sent_slice(level: Level) -> list[np.ndarray]:
      if level.index not in sent_slices:
        sent_slices[level.index] = self.catalog.map(
          self.catalog.outer, level
        ).extract_arrays(trainable)
      return sent_slices[level.index]

    traffic = []
    loss_sum = accuracy_sum = 0.0
    has_accuracy = True
    processed = expected = non_finite = 0
    empties_weigh_zero = learning_process.weighs_empties_zero(
      self.computations.aggregation.client_weighting
    )
    sent_bytes = returned_bytes = 0
    # Module docstring: every call at the round's cardinality, when a
    # padding client weighs 0.
    if cohort_size is None:
      cohort_size = sum(len(g.clients) for g in groups) + len(unserved)
    for group in groups:
      clients = list(group.clients)
      if not clients:
        continue
      called = (
        cohort_positions.padded(clients, cohort_size, self._padding_client)
        if empties_weigh_zero
        else clients
      )
      computation = self.computations.group_round(group.sent, group.trained)
      group_sums, measured = computation(
        sent_slice(group.sent), [c.dataset for c in called]
      )
      weighted_sum, weight_sum = group_sums
      trained_map = self.catalog.map(self.catalog.outer, group.trained)
      trained_map.add_scattered(sums.weighted_sum, list(weighted_sum))
      trained_map.add_scattered(
        sums.weight_sum, [weight_sum] * len(sums.weight_sum)
      )
      train = measured["train"]
      group_traffic = learning_process.dense_cohort_traffic(
        f"group {group.sent.name}->{group.trained.name}",
        called,
        measured,
        group.trained.training_flops_per_example,
      )[: len(clients)]
      traffic.extend(group_traffic)
      sent_bytes += sum(t.bytes_down for t in group_traffic)
      returned_bytes += len(clients) * learning_process.per_client_bytes(
        measured["returned_model_bytes"], len(called), "returned model"
      )
      group_examples = int(train["metrics"]["num_examples"])
      processed += group_examples
      expected += sum(c.num_examples for c in clients)
      non_finite += learning_process.non_finite_count(
        measured["aggregator"], called, empties_weigh_zero
      )
      loss_sum += float(train["metrics"]["loss"]) * group_examples
      # Absent when the task's metrics do not include accuracy.
      accuracy = train["metrics"].get("sparse_categorical_accuracy")
      has_accuracy = has_accuracy and accuracy is not None
      if has_accuracy:
        accuracy_sum += float(accuracy) * group_examples
    for sent, client in unserved:
      measured = self.computations.delivery(sent)(
        sent_slice(sent), [client.dataset]
      )
      traffic.append(
        ClientTraffic(
          client_id=client.client_id,
          bytes_down=int(measured["bytes_down"]),
          bytes_up=0,
          flops=0,
          examples=0,
        )
      )
      sent_bytes += int(measured["bytes_down"])
    if self.computations.aggregation.private:
      new_trainable = self.computations.apply_noised_sums(
        trainable,
        sums,
        np.float32(self._server_lr),
        np.asarray([noise_seed, round_num], np.int64),
      )
    else:
      new_trainable = self.computations.apply_sums(
        trainable, sums, np.float32(self._server_lr)
      )
    # A client whose update was not finite was zeroed (weight 0) and its
    # metrics reset: the loss covers the others.
    learning_process.check_examples(processed, expected, non_finite)
    loss = loss_sum / processed if processed else math.nan
    metrics = collections.OrderedDict(loss=loss)
    if has_accuracy:
      metrics["train_accuracy"] = (
        accuracy_sum / processed if processed else math.nan
      )
    metrics["non_finite_updates"] = float(non_finite)
    return GroupedRoundResult(
      model=tff.learning.models.ModelWeights(
        trainable=[np.asarray(w) for w in new_trainable],
        non_trainable=list(weights.non_trainable),
      ),
      metrics=metrics,
      traffic=tuple(traffic),
      sent_model_bytes=sent_bytes,
      returned_model_bytes=returned_bytes,
      examples_expected=expected,
      examples_processed=processed,
    )

  # -- evaluation --------------------------------------------------------

  def _static_batch_norm(
    self, level: Level
  ) -> static_batch_norm.StaticBatchNorm:
    if level.index not in self._static_bn:
      self._static_bn[level.index] = static_batch_norm.StaticBatchNorm(
        level.keras_fn, self.catalog.task.element_spec
      )
    return self._static_bn[level.index]

  def build_evaluation(self, level: Level) -> None:
    """Builds `level`'s static batch-norm query now, not at its first use."""
    self._static_batch_norm(level).build()

  def evaluation_model(
    self,
    weights: tff.learning.models.ModelWeights,
    level: Level,
    data: Optional[api.EvaluationData],
  ) -> api.EvaluationModel:
    """Level `level` of the server model, with static BN statistics."""
    level_map = self.catalog.map(self.catalog.outer, level)
    extracted = tff.learning.models.ModelWeights(
      trainable=[
        np.asarray(w) for w in level_map.extract(list(weights.trainable))
      ],
      non_trainable=list(self.catalog.initial_weights(level).non_trainable),
    )
    return api.EvaluationModel(
      weights=self._static_batch_norm(level).calibrate(extracted, data),
      model_fn=level.keras_fn,
    )


@attrs.frozen
class WidthState:
  """Server state of a width-heterogeneous algorithm: the server model."""

  model: Any  # tff.learning.models.ModelWeights of the catalog's outer level
  # The DP noise seed (a secret by default; left out of the repr).
  noise_seed: Any = attrs.field(default=np.int64(0), repr=False)
