"""Heterogeneous rounds over width sub-models: one federated computation per group.

The shared mechanics of HeteroFL, AdaptiveFL, All-Large and Decoupled
(`heterofl.py`, `adaptivefl.py`, `all_large.py`, `decoupled.py`).

A TFF value `{T}@CLIENTS` gives every client the same type, but a weak device
must receive, and may only train, a narrower model than a strong one. A round
therefore groups its cohort by (sub-model sent, sub-model trained) and runs
one federated computation per group; the groups' aggregates are folded into
running per-element sums on the server, and one server step applies them.

Per group (sent level `s`, trained level `t`, both width sub-models of the
server model `O`, `t` part of `s`), `group_round` is

    (<S@SERVER, {D*}@CLIENTS> -> <MaskedSums<T, float32>@SERVER, M@SERVER>)

built from typed parts, each a `tff.tensorflow.computation` or a TFF process.
Before it, the driver slices the server model's trainable weights to level
`s` in NumPy (`SubModelMap.extract_arrays`), so only S travels to the TFF
worker, and the group's sums come back at the trained size T:

1. the measured broadcast of `tff_measure` sends S to each client and counts
   the bytes each received;
2. `prune` (client):  (S -> W_t)  slices what the client received to the
   level it trains (the same level unless the device prunes further) and
   adds the level's initial non-trainable values: with static batch norm
   (`static_batch_norm.py`) running statistics are never sent or trained;
3. local training: FedProx's client work (`fedprox.py`; with `prox_mu = 0`
   exactly TFF FedAvg's) on the level-`t` model, giving the update
   `w_received - w_trained` (T = W_t.trainable) weighted by the number of
   examples processed;
4. the upload: `tff_measure.MeasuredUploadFactory` around
   `tff_hetero.aggregators.MaskedSumFactory` sums n_c x update and n_c
   (with `aggregation`, a `masked_dp.MaskedAggregation`: each update
   clipped first, and with DP n_c = 1 and seeded Gaussian noise added to the
   round's sums and level counts before the server step).

The driver folds each group's sums into the round's running sums
`Sums = MaskedSums<weighted_sum=O.trainable, weight_sum=O.trainable>` in
NumPy (`SubModelMap.add_scattered`: the weighted sum into the level's
elements, the weight sum onto every element the level covers), and after the
last group runs the server step once, `apply_sums`

    (<O.trainable, Sums, float32> -> O.trainable)

computes `w - server_lr * masked_mean_or_zero(Sums)`: with `server_lr = 1`
every element some client trained becomes the example-weighted mean of the
trained values, every other element keeps its value (AdaptiveFL's Algorithm 2,
HeteroFL's aggregation of overlapping sub-matrices weighted by data size).
Computations are built once per group kind and cached. Per group only S
goes to the worker and T + 1 values (plus measurements) come back; the
server model and the two model-sized sums cross once per round, in
`apply_sums` (`tools/bench.py --suite=hetero` measures the bytes).

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

import collections
from collections.abc import Callable
from collections.abc import Sequence
import math
from typing import Any
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import devices as devices_lib
from tff_hetero import models as models_lib
from tff_hetero.accounting import ClientTraffic
from tff_hetero.accounting import payload
from tff_hetero.accounting import tff_measure
from tff_hetero.aggregators import MaskedSums
from tff_hetero.aggregators import masked_dp
from tff_hetero.aggregators import masked_mean_or_zero
from tff_hetero.algorithms import api
from tff_hetero.algorithms import fedprox
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import static_batch_norm
from tff_hetero.models import width as width_lib
from tff_hetero.submodels.maps import SubModelMap


@attrs.frozen
class Level:
  """One model width of a catalog.

  Attributes:
    index: Position in the catalog.
    name: e.g. `L1`, `M2`, `x0.5`.
    widths: Output width of every width unit.
    keras_fn: No-arg builder of this level's Keras model.
    params: Trainable parameters.
    forward_flops: Forward MACs per example.
    training_flops_per_example: Forward + backward MACs per example.
  """

  index: int
  name: str
  widths: tuple[int, ...]
  keras_fn: Callable[[], tf.keras.Model] = attrs.field(eq=False)
  params: int
  forward_flops: int
  training_flops_per_example: int

  def capacity(self) -> devices_lib.Capacity:
    """The device capacity that holds exactly this level."""
    return devices_lib.Capacity(params=self.params, flops=self.forward_flops)


def _numpy_weights(model: tf.keras.Model) -> tff.learning.models.ModelWeights:
  return tff.learning.models.ModelWeights(
    trainable=[np.asarray(v.numpy()) for v in model.trainable_weights],
    non_trainable=[np.asarray(v.numpy()) for v in model.non_trainable_weights],
  )


class LevelCatalog:
  """The widths a heterogeneous algorithm trains, with models, costs and maps.

  `levels` are (name, widths) pairs; `outer` names the server model's level
  (by default the last); every level must be part of it.
  """

  def __init__(
    self,
    task: api.Task,
    levels: Sequence[tuple[str, Sequence[int]]],
    outer: Optional[str] = None,
  ):
    if task.width_model_fn is None:
      raise models_lib.ModelError(
        f"model {task.model_name!r} has no width knobs"
      )
    self.task = task
    built = []
    for index, (name, widths) in enumerate(levels):
      widths = tuple(int(w) for w in widths)
      model = task.width_model_fn(widths)
      keras_fn = _level_builder(task, widths)
      built.append(
        (
          Level(
            index=index,
            name=name,
            widths=widths,
            keras_fn=keras_fn,
            params=models_lib.count_params(model).trainable,
            forward_flops=models_lib.count_flops(model),
            training_flops_per_example=models_lib.training_flops_per_example(
              model
            ),
          ),
          model,
        )
      )
    self.levels: tuple[Level, ...] = tuple(level for level, _ in built)
    self._models = [model for _, model in built]
    names = [level.name for level in self.levels]
    if len(set(names)) != len(names):
      raise ValueError(f"level names must be unique, got {names}")
    self.outer = self.by_name(outer) if outer else self.levels[-1]
    for level in self.levels:
      if not width_lib.contains(self.outer.widths, level.widths):
        raise ValueError(f"level {level.name} is not part of {self.outer.name}")
    self._maps: dict[tuple[int, int], SubModelMap] = {}

  def by_name(self, name: str) -> Level:
    for level in self.levels:
      if level.name == name:
        return level
    raise KeyError(name)

  def map(self, outer: Level, inner: Level) -> SubModelMap:
    """The map from level `outer` to its part `inner` (cached)."""
    key = (outer.index, inner.index)
    if key not in self._maps:
      if not width_lib.contains(outer.widths, inner.widths):
        raise ValueError(f"level {inner.name} is not part of {outer.name}")
      self._maps[key] = SubModelMap.between(
        self._models[outer.index], self._models[inner.index]
      )
    return self._maps[key]

  def initial_weights(self, level: Level) -> tff.learning.models.ModelWeights:
    """The seeded initial weights of `level`'s model, as NumPy arrays."""
    return _numpy_weights(self._models[level.index])


def _level_builder(task: api.Task, widths: tuple[int, ...]):
  def build():
    return task.width_model_fn(widths)

  return build


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
    metrics: `loss`, `train_accuracy` (example-weighted over all groups).
    traffic: One measured `ClientTraffic` per client, in `groups` order.
    sent_model_bytes: Sum over clients of the sub-model bytes received.
    returned_model_bytes: Sum over clients of the update bytes returned
      (model values only: weight and metrics excluded).
    examples_expected / examples_processed: For divergence detection: TFF's
      client work zeroes a client whose update is not finite.
  """

  model: Any
  metrics: collections.OrderedDict
  traffic: tuple[ClientTraffic, ...]
  sent_model_bytes: int
  returned_model_bytes: int
  examples_expected: int
  examples_processed: int


class HeterogeneousRounds:
  """Builds, caches and runs the group computations of one server model."""

  def __init__(
    self,
    catalog: LevelCatalog,
    *,
    client_lr: float,
    client_momentum: float = 0.0,
    prox_mu: float = 0.0,
    server_lr: float = 1.0,
    aggregation: masked_dp.MaskedAggregation = masked_dp.MaskedAggregation(),
    noise_seed: int = 0,
  ):
    self.catalog = catalog
    self.aggregation = aggregation
    self._noise_seed = int(noise_seed)
    self._client_lr = float(client_lr)
    self._client_momentum = float(client_momentum)
    self._prox_mu = float(prox_mu)
    self._server_lr = float(server_lr)
    outer = catalog.outer
    self._outer_trainable_type = tff.types.tensorflow_to_type(
      [
        tf.TensorSpec(w.shape, tf.float32)
        for w in catalog.initial_weights(outer).trainable
      ]
    )
    self._sums_type = tff.types.to_type(
      MaskedSums(self._outer_trainable_type, self._outer_trainable_type)
    )
    self._groups: dict[tuple[int, int], tff.Computation] = {}
    self._parts: dict[tuple[str, int], Any] = {}
    self._static_bn: dict[int, static_batch_norm.StaticBatchNorm] = {}
    self._apply = self._build_apply()
    self._apply_noised = (
      self._build_apply_noised() if aggregation.private else None
    )

  # -- computations ------------------------------------------------------

  def _trainable_type(self, level: Level):
    return tff.types.tensorflow_to_type(
      [
        tf.TensorSpec(w.shape, tf.float32)
        for w in self.catalog.initial_weights(level).trainable
      ]
    )

  def _build_apply(self) -> tff.Computation:
    outer_type = self._outer_trainable_type

    @tff.tensorflow.computation(outer_type, self._sums_type, np.float32)
    def apply_sums(trainable, sums, server_lr):
      update = masked_mean_or_zero(MaskedSums(*sums))
      return [w - server_lr * u for w, u in zip(trainable, update)]

    return apply_sums

  def _build_apply_noised(self) -> tff.Computation:
    """`apply_sums` with the DP noise of `masked_dp` (every catalog level's
    count noised):

    (<O.trainable, Sums, float32, int64[2]> -> O.trainable)
    """
    outer_type = self._outer_trainable_type
    maps = [
      self.catalog.map(self.catalog.outer, level)
      for level in self.catalog.levels
    ]
    aggregation = self.aggregation

    @tff.tensorflow.computation(
      outer_type,
      self._sums_type,
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
        self._trainable_type(sent)
      ),
    )

  def _trainer(self, trained: Level):
    """Client work and measured upload for `trained` (per level)."""

    def build():
      trained_type = self._trainable_type(trained)
      client_work = fedprox.build_proximal_client_work(
        self.catalog.task.tff_model_fn(trained.keras_fn),
        learning_process.client_sgd(self._client_lr, self._client_momentum),
        self._prox_mu,
        metrics_aggregator=tff_measure.measured_metrics_aggregator(),
        client_weighting=self.aggregation.client_weighting,
      )
      aggregator = tff_measure.MeasuredUploadFactory(
        self.aggregation.sum_factory()
      ).create(trained_type, tff.TensorType(np.float32))

      @tff.tensorflow.computation(trained_type)
      def update_nbytes(update):
        return payload.tf_dense_nbytes(update)

      return client_work, aggregator, update_nbytes

    return self._cached("trainer", trained, build)

  def group_computation(self, sent: Level, trained: Level) -> tff.Computation:
    """`group_round` of the module docstring for (sent, trained), cached.

    Its parts are built once per level; only `prune` and the composition are
    per (sent, trained) pair.
    """
    key = (sent.index, trained.index)
    if key in self._groups:
      return self._groups[key]
    distributor = self._sender(sent)
    client_work, aggregator, update_nbytes = self._trainer(trained)
    prune_map = self.catalog.map(sent, trained)
    trained_non_trainable = self.catalog.initial_weights(trained).non_trainable

    @tff.tensorflow.computation(self._trainable_type(sent))
    def prune(received):
      return tff.learning.models.ModelWeights(
        trainable=prune_map.extract(received),
        non_trainable=[tf.constant(v) for v in trained_non_trainable],
      )

    @tff.federated_computation(
      tff.FederatedType(self._trainable_type(sent), tff.SERVER),
      tff.FederatedType(self._data_type(), tff.CLIENTS),
    )
    def group_round(sent_weights, client_data):
      delivered = distributor.next(distributor.initialize(), sent_weights)
      start = tff.federated_map(prune, delivered.result)
      work = client_work.next(client_work.initialize(), start, client_data)
      returned = tff.federated_sum(
        tff.federated_map(update_nbytes, work.result.update)
      )
      uploaded = aggregator.next(
        aggregator.initialize(), work.result.update, work.result.update_weight
      )
      measurements = tff.federated_zip(
        collections.OrderedDict(
          distributor=delivered.measurements,
          train=work.measurements.train,
          aggregator=uploaded.measurements,
          returned_model_bytes=returned,
        )
      )
      return uploaded.result, measurements

    self._groups[key] = group_round
    return group_round

  def delivery_computation(self, sent: Level) -> tff.Computation:
    """Sends level `sent` to clients that then train nothing (measured).

    (<S@SERVER, {D*}@CLIENTS> -> <bytes_down=int64, clients=int64>@SERVER)
    """

    def build():
      distributor = self._sender(sent)

      @tff.federated_computation(
        tff.FederatedType(self._trainable_type(sent), tff.SERVER),
        tff.FederatedType(self._data_type(), tff.CLIENTS),
      )
      def deliver(sent_weights, client_data):
        del client_data  # Only sets the number of clients.
        delivered = distributor.next(distributor.initialize(), sent_weights)
        return delivered.measurements

      return deliver

    return self._cached("delivery", sent, build)

  # -- running -----------------------------------------------------------

  def zero_sums(self) -> MaskedSums:
    shapes = [
      w.shape
      for w in self.catalog.initial_weights(self.catalog.outer).trainable
    ]
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
  ) -> GroupedRoundResult:
    """Runs every group on the server model `weights`, then the server step.

    `unserved` clients received a sub-model but could train nothing of it:
    their download is measured, they upload nothing. With a private
    aggregation the DP noise is drawn from `(noise_seed, round_num)`, so a
    resumed run draws what an uninterrupted one does; `round_num` is then
    required.
    """
    if self.aggregation.private and round_num is None:
      raise ValueError("a private aggregation needs the round number")
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
    processed = expected = 0
    sent_bytes = returned_bytes = 0
    for group in groups:
      clients = list(group.clients)
      if not clients:
        continue
      computation = self.group_computation(group.sent, group.trained)
      group_sums, measured = computation(
        sent_slice(group.sent), [c.dataset for c in clients]
      )
      weighted_sum, weight_sum = group_sums
      trained_map = self.catalog.map(self.catalog.outer, group.trained)
      trained_map.add_scattered(sums.weighted_sum, list(weighted_sum))
      trained_map.add_scattered(
        sums.weight_sum, [weight_sum] * len(sums.weight_sum)
      )
      train = measured["train"]
      traffic.extend(
        learning_process.dense_cohort_traffic(
          f"group {group.sent.name}->{group.trained.name}",
          clients,
          measured,
          group.trained.training_flops_per_example,
        )
      )
      sent_bytes += int(measured["distributor"]["bytes_down"])
      returned_bytes += int(measured["returned_model_bytes"])
      group_examples = int(train["metrics"]["num_examples"])
      processed += group_examples
      expected += sum(c.num_examples for c in clients)
      loss_sum += float(train["metrics"]["loss"]) * group_examples
      accuracy_sum += (
        float(train["metrics"]["sparse_categorical_accuracy"]) * group_examples
      )
    for sent, client in unserved:
      measured = self.delivery_computation(sent)(
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
    if self.aggregation.private:
      new_trainable = self._apply_noised(
        trainable,
        sums,
        np.float32(self._server_lr),
        np.asarray([self._noise_seed, round_num], np.int64),
      )
    else:
      new_trainable = self._apply(trainable, sums, np.float32(self._server_lr))
    loss = loss_sum / processed if processed else math.nan
    if processed != expected:
      loss = math.nan  # A client diverged: TFF zeroed its update.
    metrics = collections.OrderedDict(
      loss=loss,
      train_accuracy=accuracy_sum / processed if processed else math.nan,
    )
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
    if level.index not in self._static_bn:
      self._static_bn[level.index] = static_batch_norm.StaticBatchNorm(
        level.keras_fn, self.catalog.task.element_spec
      )
    return api.EvaluationModel(
      weights=self._static_bn[level.index].calibrate(extracted, data),
      model_fn=level.keras_fn,
    )


@attrs.frozen
class WidthState:
  """Server state of a width-heterogeneous algorithm: the server model."""

  model: Any  # tff.learning.models.ModelWeights of the catalog's outer level
