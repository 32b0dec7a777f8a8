"""Typed TFF computations of width rounds: one federated computation per group.

The computations that `width_rounds.HeterogeneousRounds` runs for HeteroFL,
AdaptiveFL, All-Large and Decoupled, built once per level or group kind over
a `width_levels.LevelCatalog` and cached by `WidthComputations`. O is the
server model's level, S a level sent to clients, T (= W_t.trainable) the
level they train (part of S), `Sums = MaskedSums<weighted_sum=O.trainable,
weight_sum=O.trainable>`, M the measurements.

`group_round(sent, trained)`

    (<S@SERVER, {D*}@CLIENTS> -> <MaskedSums<T, float32>@SERVER, M@SERVER>)

built from typed parts, each a `tff.tensorflow.computation` or a TFF process:

1. the measured broadcast of `tff_measure` sends S to each client and counts
   the bytes each received;
2. `prune` (client):  (S -> W_t)  slices what the client received to the
   level it trains (the same level unless the device prunes further) and
   adds the level's initial non-trainable values: with static batch norm
   (`static_batch_norm.py`) running statistics are never sent or trained;
3. local training: FedProx's client work (`fedprox.py`; with `prox_mu = 0`
   exactly TFF FedAvg's) on the level-`t` model, giving the update
   `w_received - w_trained` weighted by the number of examples processed;
4. the upload: `tff_measure.MeasuredUploadFactory` around
   `tff_hetero.aggregators.MaskedSumFactory` sums n_c x update and n_c
   (with `aggregation`, a `masked_dp.MaskedAggregation`: each update
   clipped first, and with DP n_c = 1 and seeded Gaussian noise added to the
   round's sums and level counts before the server step).

`delivery(sent)`: a client that received S but can train nothing of it:

    (<S@SERVER, {D*}@CLIENTS> -> <bytes_down=int64, clients=int64>@SERVER)

`apply_sums`, the server step once per round:

    (<O.trainable, Sums, float32> -> O.trainable)

computes `w - server_lr * masked_mean_or_zero(Sums)`: with `server_lr = 1`
every element some client trained becomes the example-weighted mean of the
trained values, every other element keeps its value (AdaptiveFL's Algorithm 2,
HeteroFL's aggregation of overlapping sub-matrices weighted by data size).
With a private aggregation, `apply_noised_sums`

    (<O.trainable, Sums, float32, int64[2]> -> O.trainable)

adds the seeded noise of `masked_dp` first (every catalog level's count
noised).

Local training is SGD with the client learning rate and momentum held
constant over rounds, no weight decay, over every batch of the client's
dataset: its E local epochs are one stream of E passes cut into batches, so
a batch may span two epochs and only the last batch of the last epoch may
be smaller (ceil(E n / B) steps; per-epoch batches with `drop_last`, as
the reference code trains, give E floor(n / B)). The AdaptiveFL reference code's
per-round decay 0.998, weight decay 1e-4 and `drop_last` are not applied;
the reason is stated once, in `adaptivefl.py` (Deviations).

Accounting is measured inside the computations on the tensors sent: each
client's download is the sent sub-model's trainable weights, its upload the
update of the level it trained, its weight and its metric sums; its compute is
the examples it processed times the trained level's training MACs per example.
"""

from __future__ import annotations

from typing import Any
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import tff_measure
from tff_hetero.aggregators import MaskedSums
from tff_hetero.aggregators import masked_dp
from tff_hetero.aggregators import masked_mean_or_zero
from tff_hetero.algorithms import fedprox
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms.width_levels import Level
from tff_hetero.algorithms.width_levels import LevelCatalog


class WidthComputations:
  """The typed computations over one catalog (module docstring), cached.

  Attributes:
    catalog: The `LevelCatalog`.
    aggregation: The `masked_dp.MaskedAggregation` of every upload.
    outer_trainable_type / sums_type: O.trainable and Sums.
    apply_sums: The server step.
    apply_noised_sums: The private server step (None without DP).
  """

  def __init__(
    self,
    catalog: LevelCatalog,
    *,
    client_lr: Optional[float] = None,
    client_momentum: float = 0.0,
    client_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    prox_mu: float = 0.0,
    aggregation: masked_dp.MaskedAggregation = masked_dp.MaskedAggregation(),
  ):
    if (client_lr is None) == (client_optimizer is None):
      raise TypeError("give exactly one of client_lr and client_optimizer")
    self.catalog = catalog
    self.aggregation = aggregation
    # The clients' optimizer: the given TFF optimizer, or SGD with the
    # learning rate and momentum.
    self._client_optimizer = client_optimizer or learning_process.client_sgd(
      client_lr, client_momentum
    )
    self._prox_mu = float(prox_mu)
    self.outer_trainable_type = self.trainable_type(catalog.outer)
    self.sums_type = tff.types.to_type(
      MaskedSums(self.outer_trainable_type, self.outer_trainable_type)
    )
    self._groups: dict[tuple[int, int], tff.Computation] = {}
    self._parts: dict[tuple[str, int], Any] = {}
    self.apply_sums = self._build_apply()
    self.apply_noised_sums = (
      self._build_apply_noised() if aggregation.private else None
    )

  def trainable_type(self, level: Level):
    return tff.types.tensorflow_to_type(
      [
        tf.TensorSpec(w.shape, tf.float32)
        for w in self.catalog.initial_weights(level).trainable
      ]
    )

  def _build_apply(self) -> tff.Computation:
    outer_type = self.outer_trainable_type

    @tff.tensorflow.computation(outer_type, self.sums_type, np.float32)
    def apply_sums(trainable, sums, server_lr):
      update = masked_mean_or_zero(MaskedSums(*sums))
      return [w - server_lr * u for w, u in zip(trainable, update)]

    return apply_sums

  def _build_apply_noised(self) -> tff.Computation:
    """`apply_sums` with the DP noise of `masked_dp` (every catalog level's
    count noised):

    (<O.trainable, Sums, float32, int64[2]> -> O.trainable)
    """
    outer_type = self.outer_trainable_type
    maps = [
      self.catalog.map(self.catalog.outer, level)
      for level in self.catalog.levels
    ]
    aggregation = self.aggregation

    @tff.tensorflow.computation(
      outer_type,
      self.sums_type,
      np.float32,
      tff.TensorType(np.int64, [2]),
    )
    def apply_noised_sums(trainable, sums, server_lr, seed):
      coverages = [
        m.scatter([tf.ones(s.inner_shape) for s in m.trainable]) for m in maps
      ]
      noised = masked_dp.add_gaussian_noise(
        MaskedSums(*sums), coverages, aggregation, seed
      )
      update = masked_dp.clamped_masked_mean(noised)
      return [w - server_lr * u for w, u in zip(trainable, update)]

    return apply_noised_sums

  def _cached(self, kind: str, level: Level, build):
    key = (kind, level.index)
    if key not in self._parts:
      self._parts[key] = build()
    return self._parts[key]

  def _data_type(self):
    return tff.SequenceType(
      tff.types.tensorflow_to_type(self.catalog.task.element_spec)
    )

  def _sender(self, sent: Level):
    """The measured broadcast of level `sent` (per level)."""
    return self._cached(
      "sender",
      sent,
      lambda: tff_measure.build_measured_broadcast_process(
        self.trainable_type(sent)
      ),
    )

  def _trainer(self, trained: Level):
    """Client work and measured upload for `trained` (per level)."""

    def build():
      trained_type = self.trainable_type(trained)
      client_work = fedprox.build_proximal_client_work(
        self.catalog.task.tff_model_fn(trained.keras_fn),
        self._client_optimizer,
        self._prox_mu,
        metrics_aggregator=tff_measure.measured_metrics_aggregator(),
        client_weighting=self.aggregation.client_weighting,
      )
      aggregator = tff_measure.MeasuredUploadFactory(
        self.aggregation.sum_factory()
      ).create(trained_type, tff.TensorType(np.float32))
      masked_dp.check_masked_sums(aggregator)
      return client_work, aggregator

    return self._cached("trainer", trained, build)

  def group_round(self, sent: Level, trained: Level) -> tff.Computation:
    """`group_round` of the module docstring for (sent, trained), cached.

    Its parts are built once per level; only `prune` and the composition are
    per (sent, trained) pair.
    """
    key = (sent.index, trained.index)
    if key in self._groups:
      return self._groups[key]
    client_work, aggregator = self._trainer(trained)
    prune_map = self.catalog.map(sent, trained)
    trained_non_trainable = self.catalog.initial_weights(trained).non_trainable

    @tff.tensorflow.computation(self.trainable_type(sent))
    def prune(received):
      return tff.learning.models.ModelWeights(
        trainable=prune_map.extract(received),
        non_trainable=[tf.constant(v) for v in trained_non_trainable],
      )

    group_round = learning_process.compose_cohort_round(
      self.trainable_type(sent),
      self._data_type(),
      self._sender(sent),
      prune,
      client_work,
      aggregator,
    )
    self._groups[key] = group_round
    return group_round

  def delivery(self, sent: Level) -> tff.Computation:
    """Sends level `sent` to clients that then train nothing (measured).

    (<S@SERVER, {D*}@CLIENTS> -> <bytes_down=int64, clients=int64>@SERVER)
    """

    def build():
      distributor = self._sender(sent)

      @tff.federated_computation(
        tff.FederatedType(self.trainable_type(sent), tff.SERVER),
        tff.FederatedType(self._data_type(), tff.CLIENTS),
      )
      def deliver(sent_weights, client_data):
        del client_data  # Only sets the number of clients.
        delivered = distributor.next(distributor.initialize(), sent_weights)
        return delivered.measurements

      return deliver

    return self._cached("delivery", sent, build)
