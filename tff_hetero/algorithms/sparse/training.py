"""Dynamic sparse training, the driver: `SparseTraining`, the
`FederatedAlgorithm` that FedSGC and FedDST build (`fedsgc.py`,
`feddst.py`).

Each round it calls the cached round computation of `computations.py` (the
readjusting kind on rounds the `ReadjustSchedule` requests), keeps the
server state and returns the measured traffic:

* server state `SparseState`: the global `SparseModel`, its direction maps,
  and, with server memory, the running `MaskedSums` over every remembered
  upload and the `MemoryRows` themselves (one row per client id given to the
  builder; the driver takes the cohort's rows out of the running sums
  before the round and the rows that come back replace them, unpacked
  first after a round without readjustment, so the memory is part of
  every checkpoint);
* client state (the client-state store): the client's cumulative training
  epochs, an int64, read and returned by the client computation only.

Traffic per client, measured in the computation on the tensors sent: the
model download (kept kernel values + bit masks, dense biases and
statistics), the packed direction maps on requested rounds, the upload
(`client_update.upload_nbytes`) and its metrics. Client compute: the dense
model's training MACs per example (TensorFlow multiplies masked zeros too)
times the examples trained plus the examples whose gradient a readjustment
computed again.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import math
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import data
from tff_hetero.accounting import ClientTraffic
from tff_hetero.algorithms import api
from tff_hetero.algorithms import cohort_positions
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import static_batch_norm
from tff_hetero.algorithms.sparse import client_update as client_lib
from tff_hetero.algorithms.sparse import computations
from tff_hetero.algorithms.sparse import prune_grow
from tff_hetero.errors import UsageError
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel


class SparseState(NamedTuple):
  """Server state (module docstring)."""

  model: Any  # SparseModel
  directions: Any  # one int8 map per masked kernel
  sums: Any  # MaskedSums over the remembered uploads
  memory: Any  # computations.MemoryRows (zero rows without memory)


def erk_keep(layout: masks_lib.MaskLayout, sparsity: float) -> list[int]:
  """Weights each masked kernel keeps at `sparsity` (ERK densities)."""
  densities = masks_lib.erk_densities(layout.shapes, sparsity)
  return masks_lib.keep_counts(layout.shapes, densities)


def initial_sparse_model(
  layout: masks_lib.MaskLayout, wrapped: tf.keras.Model, kernel_masks
) -> SparseModel:
  """The `SparseModel` (NumPy) of a wrapped model's weights under
  `kernel_masks` (kernels zeroed off-mask)."""
  weights = tff.learning.models.ModelWeights.from_model(wrapped)
  weights = tf.nest.map_structure(lambda v: np.asarray(v.numpy()), weights)
  return tf.nest.map_structure(
    np.asarray,
    layout.to_sparse(
      tf.nest.map_structure(
        np.asarray, layout.with_masks(weights, kernel_masks)
      )
    ),
  )


def _ratio(numerator: float, denominator: float) -> float:
  return numerator / denominator if denominator else math.nan


class SparseTraining(api.FederatedAlgorithm):
  """Federated dynamic sparse training (module docstring).

  Args:
    name: The algorithm's name.
    task: The `api.Task` (its `model_fn` builds the dense Keras model).
    client_ids: Every client id (rows of the server memory).
    sparsity: Fraction of kernel weights masked (ERK over kernels).
    schedule: A `prune_grow.ReadjustSchedule`.
    congruity_lambda: Share of each prune/grow guided by gradient congruity
      (0: RigL/FedDST's magnitude and gradient rule).
    memory: A `computations.MEMORIES` key.
    client_optimizer: A `tff.learning.optimizers.Optimizer`.
    prox_mu: FedProx strength of the local objective.
    local_epochs: Epochs per round.
    seed: Seeds the initial random masks.
  """

  def __init__(
    self,
    name: str,
    task: api.Task,
    client_ids: Sequence[str],
    *,
    sparsity: float,
    schedule: prune_grow.ReadjustSchedule,
    congruity_lambda: float,
    memory: str,
    client_optimizer,
    prox_mu: float,
    local_epochs: int,
    seed: int,
    model_aggregator=None,
    reconfigure=None,
    growth_gradient: str = "accumulated",
  ):
    self.name = name
    self.sparsity = float(sparsity)
    self.schedule = schedule
    self.memory = check_memory(memory)
    self.local_epochs = int(local_epochs)
    self._rows = {c: i for i, c in enumerate(client_ids)}
    # What TensorFlow computes: dense kernels times 0/1 masks, so the dense
    # model's MACs (masked weights are not skipped on this hardware).
    self._flops_per_example = task.training_flops_per_example

    def keras_fn():
      return masks_lib.prune_wrap(task.model_fn())

    self.keras_fn = keras_fn
    self._static_bn = static_batch_norm.StaticBatchNorm(
      keras_fn, task.element_spec
    )
    wrapped = keras_fn()
    self.layout = masks_lib.MaskLayout.of(wrapped)
    self.keep = erk_keep(self.layout, self.sparsity)
    self._initial = initial_sparse_model(
      self.layout, wrapped, self.initial_masks(int(seed))
    )
    self.rounds = computations.SparseRounds(
      keras_fn,
      task.element_spec,
      self._initial,
      self.server_budgets(),
      client_optimizer,
      prox_mu=prox_mu,
      local_epochs=local_epochs,
      schedule=schedule,
      congruity_lambda=congruity_lambda,
      memory=memory,
      model_aggregator=model_aggregator,
      reconfigure=reconfigure,
      growth_gradient=growth_gradient,
      loss_fn=task.loss_fn,
      metrics_fn=task.metrics_fn,
    )

  def server_budgets(self) -> list[int]:
    """Weights per kernel the server's magnitude re-prune keeps: the ERK
    budgets (kernels whose masks are chosen otherwise: their sizes)."""
    return list(self.keep)

  def initial_masks(self, seed: int) -> list[np.ndarray]:
    """Masks of the initial model: random, at each kernel's ERK budget."""
    return masks_lib.random_masks(self.layout.shapes, self.keep, seed)

  def round_kind(self, round_num: int) -> tuple[bool, bool]:
    """(clients readjust, clients upload importance) in `round_num`."""
    return self.schedule.requested(round_num), False

  def round_kinds(self) -> list[tuple[bool, bool]]:
    """Every value `round_kind` may return (the round computations the
    algorithm may run)."""
    kinds = [(False, False)]
    if self.schedule.request_every > 0 and self.schedule.alpha > 0:
      kinds.append((True, False))
    return kinds

  def setup_computations(self) -> dict:
    """The computations `prepare_round` may run, by name (none)."""
    return {}

  def prepare_round(
    self, state: SparseState, round_num: int, clients: Sequence[api.ClientRound]
  ) -> tuple[SparseState, dict]:
    """Work before the round's training (e.g. pruning on one client): the
    new state and measured `ClientTraffic` by client id. Default: none."""
    del round_num, clients
    return state, {}

  def initialize(self) -> SparseState:
    rows = len(self._rows) if self.rounds.remembers else 0
    return SparseState(
      model=self._initial,
      directions=self.rounds.zero_directions(self._initial),
      sums=self.rounds.zero_sums(self._initial),
      memory=computations.empty_memory(self._initial, rows),
    )

  def initial_client_state(self) -> np.int64:
    """A client's cumulative training epochs (none yet)."""
    return np.int64(0)

  def client_dataset(
    self,
    arrays,
    *,
    batch_size: int,
    local_epochs: int,
    shuffle_seed: int,
    augment: str = "none",
    state=None,
  ):
    """Batches that never span two epochs (readjustment happens at epoch
    boundaries)."""
    del state
    return data.make_client_dataset(
      arrays,
      batch_size=batch_size,
      local_epochs=local_epochs,
      shuffle_seed=shuffle_seed,
      augment=augment,
      epoch_aligned=True,
    )

  @property
  def client_ids(self) -> tuple:
    """The client ids it was built with, in the order of the memory rows."""
    return tuple(self._rows)

  def row_indices(self, client_ids: Sequence) -> list[int]:
    """Each client's row (memory, per-client arrays); `ValueError` naming an
    id it was not built with."""
    try:
      return [self._rows[c] for c in client_ids]
    except KeyError as e:
      raise ValueError(
        f"{self.name}: client {e.args[0]!r} is not among the"
        " client ids the algorithm was built with"
      ) from None

  def next(
    self, state: SparseState, round_num: int, clients: Sequence[api.ClientRound]
  ) -> api.RoundOutput:
    state, extra = self.prepare_round(state, round_num, clients)
    requested, importance = self.round_kind(round_num)
    computation = self.rounds.round_computation(requested, importance)
    epochs = [np.int64(c.state if c.state is not None else 0) for c in clients]
    data = [c.dataset for c in clients]
    memory = state.memory
    n = len(clients)
    positions = cohort_positions.positions(n)
    if self.rounds.remembers:
      rows = self.row_indices([c.client_id for c in clients])
      forgotten = tf.nest.map_structure(lambda a: a[rows], memory)
      # A client with no data sends nothing and keeps its row (`_remember`,
      # given the same list): none of its contribution to the running sums
      # is forgotten either.
      sent = [c.num_examples > 0 for c in clients]
      forgotten = forgotten._replace(
        weight=np.where(sent, forgotten.weight, 0.0).astype(np.float32)
      )
      model, directions, sums, received, measured = computation(
        state.model,
        state.directions,
        computations.without_rows(
          self.layout, computations.MaskedSums(*state.sums), forgotten
        ),
        epochs,
        data,
        positions,
      )
      new_rows, reports = cohort_positions.in_cohort_order(
        received, n, self.name
      )
      if self.rounds.packs_rows(requested, importance):
        new_rows = computations.unpacked_rows(
          self.layout,
          SparseModel(*state.model),
          computations.PackedRow(*new_rows),
        )
      memory = self._remember(memory, rows, new_rows, sent)
      reports = cohort_positions.unstacked(reports, n)
    else:
      model, directions, received, measured = computation(
        state.model, state.directions, epochs, data, positions
      )
      reports = cohort_positions.unstack_rows(received, n, self.name)
      sums = state.sums
    reports = [client_lib.ClientReport(*r) for r in reports]
    down = int(measured["distributor"]["bytes_down"])
    if "directions_distributor" in measured:
      down += int(measured["directions_distributor"]["bytes_down"])
    bytes_down = learning_process.per_client_bytes(down, n, "download")
    train = measured["train"]
    metric_bytes = learning_process.per_client_bytes(
      int(train["uploaded_bytes"]), n, "metrics upload"
    )
    traffic = tuple(
      ClientTraffic(
        client_id=c.client_id,
        bytes_down=bytes_down,
        bytes_up=int(r.upload_bytes) + metric_bytes,
        flops=(c.num_examples + int(r.gradient_examples))
        * self._flops_per_example,
        examples=c.num_examples,
      )
      for c, r in zip(clients, reports)
    )
    # Plus each client's traffic in `prepare_round`.
    traffic = tuple(t.plus(extra.get(t.client_id)) for t in traffic)
    counts = prune_grow.ReadjustCounts(
      *[float(v) for v in measured["readjust"]]
    )
    metrics = learning_process.train_metrics(
      train, clients, int(measured["non_finite_updates"])
    )
    metrics.update(
      readjust_requested=float(requested),
      reconfigured=float(importance),
      readjusts=counts.readjusts,
      prune_fraction=_ratio(counts.prune_fraction, counts.readjusts),
      pruned=counts.pruned,
      pruned_incongruent=counts.pruned_incongruent,
      grown=counts.grown,
      grown_congruent=counts.grown_congruent,
      grown_new=counts.grown_new,
      grow_candidates_with_direction=_ratio(
        counts.candidates_with_direction, counts.grow_candidates
      ),
      direction_nonzero_inactive=float(measured["direction_informed"]),
    )
    densities = [float(d) for d in measured["density"]]
    sizes = [k.size for k in self.layout.kernels]
    metrics["sparsity"] = 1.0 - sum(
      d * s for d, s in zip(densities, sizes)
    ) / sum(sizes)
    for kernel, density in zip(self.layout.kernels, densities):
      metrics[f"sparsity/{kernel.name.split(':')[0]}"] = 1.0 - density
    client_states = {
      c.client_id: np.int64(r.epochs) for c, r in zip(clients, reports)
    }
    return api.RoundOutput(
      state=SparseState(
        model=model, directions=list(directions), sums=sums, memory=memory
      ),
      metrics=metrics,
      traffic=traffic,
      client_states=client_states,
    )

  @staticmethod
  def _remember(memory, rows: list[int], new_rows, sent: list[bool]) -> Any:
    """A copy of `memory` with the `rows` of clients that `sent` replaced by
    the received rows (`new_rows`: stacked, in the order of `rows`).

    A client that had no data sent nothing: its row stays, and `next` forgot
    none of it in the running sums (the same `sent`). Every other client's
    row is replaced, with weight 0 if the client zeroed a non-finite upload, as
    the running sums replaced its contribution.
    """
    kept = np.flatnonzero(sent)
    replaced = np.asarray(rows, np.int64)[kept]

    def replace(array, new):
      out = np.array(array, copy=True)
      out[replaced] = np.asarray(new)[kept]
      return out

    return tf.nest.map_structure(
      replace, memory, computations.MemoryRows(*new_rows), check_types=False
    )

  def model_weights(self, state: SparseState):
    weights = self.layout.to_model_weights(SparseModel(*state.model))
    return tf.nest.map_structure(np.asarray, weights)

  def evaluation_models(self, state: SparseState, data=None):
    """The global sparse model; with batch norm, statistics from the clients
    (the server aggregates kernels and biases only; `static_batch_norm`)."""
    return collections.OrderedDict(
      global_model=api.EvaluationModel(
        self._static_bn.calibrate(self.model_weights(state), data),
        model_fn=self.keras_fn,
      )
    )


def check_memory(memory: str) -> str:
  if memory not in computations.MEMORIES:
    raise UsageError(
      "--sgc_memory",
      f"unknown value {memory!r}; accepted: "
      + ", ".join(computations.MEMORIES),
    )
  return memory


def readjust_schedule(
  settings, local_epochs: int, begin_epoch: int, end_epoch: int
) -> prune_grow.ReadjustSchedule:
  """The `ReadjustSchedule` of `DynamicSparseSettings`: a setting of 0 takes
  the default given here (delta: `local_epochs`; begin: `begin_epoch`;
  E_end: `end_epoch`)."""
  return prune_grow.ReadjustSchedule(
    alpha=settings.prune_alpha,
    delta_epochs=settings.readjust_delta_epochs or local_epochs,
    begin_epoch=settings.readjust_begin_epoch or begin_epoch,
    end_epoch=settings.readjust_end_epoch or end_epoch,
    request_every=settings.readjust_every,
    request_end_round=settings.readjust_end_round,
  )


def build_sparse_training(
  name: str,
  config,
  task: api.Task,
  client_ids: Sequence[str],
  *,
  congruity_lambda: float,
  memory: str,
  begin_epoch: int,
  growth_gradient: str,
) -> SparseTraining:
  """A `SparseTraining` from the run's settings (shared by FedSGC, FedDST).

  `begin_epoch` is the algorithm's default first readjustment epoch, used
  when `--readjust_begin_epoch` is 0. E_end defaults to the clients'
  expected total epochs, which depends on `--rounds`: a run resumed with
  another `--rounds` then continues with another schedule (give
  `--readjust_end_epoch` to fix it).
  """
  epochs = config.local_epochs
  expected_epochs = max(
    1,
    math.ceil(
      epochs * config.rounds * config.clients_per_round / config.num_clients
    ),
  )
  settings = config.settings
  schedule = readjust_schedule(settings, epochs, begin_epoch, expected_epochs)
  return SparseTraining(
    name,
    task,
    client_ids,
    sparsity=settings.sparsity,
    schedule=schedule,
    congruity_lambda=congruity_lambda,
    memory=memory,
    client_optimizer=learning_process.client_optimizer(
      config.client_optimizer, config.client_lr, config.client_momentum
    ),
    prox_mu=settings.prox_mu or 0.0,
    local_epochs=epochs,
    seed=config.seed,
    growth_gradient=growth_gradient,
  )
