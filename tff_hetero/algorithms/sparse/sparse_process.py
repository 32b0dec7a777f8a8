"""Federated sparse training as a process a TFF user drives: `SparseProcess`.

FedSGC's server remembers each client's last upload and each client counts
its own training epochs (its readjust schedule), and PruneFL and GraSP prune
on one chosen client first, so a round needs to know *which* clients take
part: a `tff.learning.templates.LearningProcess`'s `next(state,
{D*}@CLIENTS)` has anonymous clients. As in FedJAX, a `SparseProcess` is an
`initialize` / `next` pair in plain Python over immutable state, and every
TensorFlow step of a round is a typed `tff.Computation` (the driver only
keeps the memory rows and epochs, and takes the cohort's rows out of the
running sums), the ones
`--algorithm=fedsgc|prunefl|grasp` run (`computations.SparseRounds`). With
S = `SparseModel`, G the int8 direction maps, R = `MaskedSums` of the
trainable weights, M = `MemoryRows` (in `round`: `computations.PackedRow`,
stacked float32[K, ?] values and float32[K] weights), U = `ClientReport`,
D one batch:

    round (a round without readjustment) and readjust_round (one the
    server requests):
      (<S@SERVER, G@SERVER, R@SERVER, int64@CLIENTS, {D*}@CLIENTS,
        int32@CLIENTS> ->
       <S@SERVER, G@SERVER, R@SERVER,
        <rows=<M[K], U[K]>, positions=int32[K]>@SERVER, metrics@SERVER>)
    (R in: the running sums less the cohort's remembered rows, which the
    driver subtracts, `computations.without_rows`; R out: the new running
    sums; in `round`, M is a `computations.PackedRow`, the values at the
    sent model's masks, which the driver unpacks) without server memory
    (`sgc_memory="none"`): no R, rows=U[K].

    reconfigure_round (PruneFL's rounds whose clients also upload their
    squared gradients): as `round` without memory.
    initial_pruning (PruneFL, GraSP, before round 1's training):
      (<S@SERVER, {D*}@CLIENTS> -> <S@SERVER, int64@SERVER, int64@SERVER>)
      (one client: the pruned model, its bytes down and up)

(the module docstring of `computations.py` has the steps and the server
update inside them; `initial_pruning.py` the pruning). `next(state,
cohort)`, `cohort` mapping client ids (among those the process was built
for) to datasets, runs one of the rounds (PruneFL's and GraSP's round 1
runs `initial_pruning` on the cohort's first client with data first): the driver
takes the cohort's memory rows out of the running sums, passes those and
the cohort's cumulative epochs in, and keeps what comes back in the new
state.

The builders take no server optimizer and no client weighting: these
algorithms' servers take the union average weighted by each upload's
examples (FedSGC's Eq. 5, FedDST's and PruneFL's code) and then re-prune,
so the new model is that average, not a step along it.

State is `SparseProcessState`: `server` (`training.SparseState`: the global
`SparseModel`, its direction maps, the running sums and the memory rows,
one row per client id in the order given to the builder), `client_epochs`
(int64, one per client id: the client's cumulative training epochs, which
a TFF client cannot keep) and `round_num`. `next` returns a
`SparseRoundOutput` with the new state, the round's metrics and every
client's measured `ClientTraffic` in `cohort` order.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import ClientTraffic
from tff_hetero.algorithms import api
from tff_hetero.algorithms import client_state_process
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import width_process
from tff_hetero.algorithms.sparse import training

__all__ = ["SparseProcess", "SparseProcessState", "SparseRoundOutput"]


# Names of the round computations by (clients readjust, clients upload
# importance): `training.SparseTraining.round_kind`.
_KIND_NAMES = {
  (False, False): "round",
  (True, False): "readjust_round",
  (False, True): "reconfigure_round",
}


def checked_task(
  model_fn,
  input_spec,
  client_optimizer_fn,
  client_ids,
  local_epochs,
  loss_fn=None,
  metrics_fn=None,
) -> tuple[api.Task, list]:
  """Checks the sparse builders' common arguments; returns the task of
  `model_fn` (with its loss and metrics) and the client ids as a list."""
  learning_process.check_optimizer("client_optimizer_fn", client_optimizer_fn)
  ids = list(client_state_process.checked_client_ids(client_ids))
  learning_process.check_positive("local_epochs", local_epochs)
  return api.Task.of_keras(model_fn, input_spec, loss_fn, metrics_fn), ids


@attrs.frozen
class SparseProcessState:
  """A `SparseProcess`'s state (module docstring).

  Attributes:
    server: The `training.SparseState` (model, direction maps, running
      sums, memory rows).
    client_epochs: int64 [clients]: each client's cumulative epochs.
    round_num: Rounds completed.
  """

  server: Any
  client_epochs: Any
  round_num: int = 0


@attrs.frozen
class SparseRoundOutput:
  """What `SparseProcess.next` returns.

  Attributes:
    state: The new `SparseProcessState`.
    metrics: The round's metrics (`training.SparseTraining.next`: loss,
      train_accuracy, the readjust counts, sparsity per kernel, ...) and
      the measured totals `bytes_down`, `bytes_up`, `clients`, `examples`.
    clients: One measured `ClientTraffic` per client, in `cohort` order.
  """

  state: SparseProcessState
  metrics: collections.OrderedDict
  clients: tuple[ClientTraffic, ...]


class SparseProcess:
  """`initialize` / `next` over sparse training (module docstring).

  Built by `build_fedsgc_process`, `build_prunefl_process` and
  `build_grasp_process` from a `training.SparseTraining` and the client ids
  it was built with. `computations` holds `round`, and `readjust_round`
  (FedSGC) or `reconfigure_round` (PruneFL) when the settings request them,
  and `initial_pruning` (PruneFL, GraSP: round 1 first prunes on the first
  client of its cohort, `initial_pruning.OneClientPruning`).
  """

  def __init__(self, algorithm: training.SparseTraining):
    self._algorithm = algorithm
    rounds = algorithm.rounds
    # Traced now, as TFF's builders do (tracing builds Keras models in a
    # graph, which would invalidate the Keras models a user made later).
    self._computations = collections.OrderedDict(
      (_KIND_NAMES[kind], rounds.round_computation(*kind))
      for kind in algorithm.round_kinds()
    )
    self._computations.update(algorithm.setup_computations())

  @property
  def computations(self) -> collections.OrderedDict:
    """Every typed round computation by name (module docstring)."""
    return collections.OrderedDict(self._computations)

  @property
  def client_ids(self) -> tuple[Hashable, ...]:
    return self._algorithm.client_ids

  def initialize(self) -> SparseProcessState:
    return SparseProcessState(
      server=self._algorithm.initialize(),
      client_epochs=np.zeros(len(self.client_ids), np.int64),
      round_num=0,
    )

  def next(
    self,
    state: SparseProcessState,
    cohort: Mapping[Hashable, tf.data.Dataset],
  ) -> SparseRoundOutput:
    """One round of the clients in `cohort` (client id -> dataset).

    Each dataset is the client's whole local training for the round: the
    process's `local_epochs` passes over its data, batched so that no batch
    spans two passes (e.g. `data.batch(b).repeat(local_epochs)`, or one
    `batch` per pass concatenated), since a client readjusts at the end of
    a pass. Each must be finite: the driver counts its examples first.
    """
    if not isinstance(cohort, Mapping):
      raise TypeError(
        "the cohort must map client ids to datasets, got"
        f" {type(cohort).__name__}"
      )
    if not cohort:
      raise ValueError("a round needs at least one client")
    unknown = [c for c in cohort if c not in self.client_ids]
    if unknown:
      raise KeyError(
        f"clients {unknown!r} are not among the client ids the process was"
        " built with"
      )
    rows = self._algorithm.row_indices(list(cohort))
    for client_id, dataset in cohort.items():
      if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
          f"the dataset of client {client_id!r} must be a tf.data.Dataset,"
          f" got {type(dataset).__name__}"
        )
    clients = [
      api.ClientRound(
        client_id=client_id,
        dataset=dataset,
        num_examples=width_process.count_examples(dataset),
        state=np.int64(state.client_epochs[row]),
      )
      for (client_id, dataset), row in zip(cohort.items(), rows)
    ]
    round_num = state.round_num + 1
    output = self._algorithm.next(state.server, round_num, clients)
    epochs = np.array(state.client_epochs, np.int64, copy=True)
    changed = list(output.client_states)
    for row, client_id in zip(self._algorithm.row_indices(changed), changed):
      epochs[row] = output.client_states[client_id]
    return SparseRoundOutput(
      state=SparseProcessState(
        server=output.state, client_epochs=epochs, round_num=round_num
      ),
      metrics=width_process.with_traffic_totals(output.metrics, output.traffic),
      clients=output.traffic,
    )

  def get_model_weights(
    self, state: SparseProcessState
  ) -> tff.learning.models.ModelWeights:
    """The global model as the weights of `model_fn()`'s plain Keras model:
    masked kernels (zero off their masks), dense biases, and the batch-norm
    statistics of `model_fn()` (the server does not aggregate them)."""
    model = state.server.model
    return tff.learning.models.ModelWeights(
      trainable=[np.asarray(w) for w in model.trainable],
      non_trainable=[np.asarray(s) for s in model.statistics],
    )

  def masks(self, state: SparseProcessState) -> list[np.ndarray]:
    """The global model's kernel masks (float32 0/1), in layer order."""
    return [np.asarray(m, np.float32) for m in state.server.model.masks]
