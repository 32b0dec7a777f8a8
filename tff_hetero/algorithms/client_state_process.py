"""Algorithms whose clients keep state by id, as processes a TFF user drives.

FedGKT's clients each keep their own edge model, its optimizer state and the
server's logits of their samples between rounds, and its server answers each
sample of each client; split learning's clients take turns in order. Neither
fits a `tff.learning.templates.LearningProcess`, whose `next(state,
{D*}@CLIENTS)` has anonymous clients with identical types and no state. As
in FedJAX, a `ClientStateProcess` is an `initialize` / `next` pair in plain
Python over immutable state, every TensorFlow step of a round being a typed
`tff.Computation` built (traced) by the builder (`computations`, with their
type signatures in the algorithm's module: `fedgkt_computations`,
`split_learning`); the driver keeps each client's state between rounds, as
the CLI's client-state store does, and hands it to the client computation
as a CLIENTS-placed value.

Client data are arrays (`tff_hetero.data.ArrayDataset`, or a pair of float32
images [N, H, W, C] and int32 labels [N]), not `tf.data` datasets: FedGKT's
batches carry each sample's index and the server's logits for it
(`fedgkt_steps.client_dataset_with_teacher`), which the process builds from
the arrays and the client's state every round, shuffled from (`seed`,
round, cohort position).

`next(state, cohort)`, `cohort` mapping client ids (among those the process
was built with) to arrays, runs one round of those clients and returns a
`ClientStateRoundOutput`: the new state, the round's metrics with the
measured totals (`bytes_down`, `bytes_up`, `clients`, `examples`) and one
measured `ClientTraffic` per client, in `cohort` order.

State is `ClientStateProcessState`: `server` (the algorithm's server state),
`clients` (one state per client id, in the order given to the builder) and
`round_num`.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import data as data_lib
from tff_hetero.accounting import ClientTraffic
from tff_hetero.algorithms import api
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import width_process

__all__ = [
  "ClientStateProcess",
  "ClientStateProcessState",
  "ClientStateRoundOutput",
  "checked_client_ids",
  "checked_edge_arguments",
  "edge_task",
]


def checked_edge_arguments(
  edge_model_fn,
  server_model_fn,
  split_layer: str,
  client_ids,
  client_optimizer_fn,
  server_optimizer_fn,
  batch_size,
  local_epochs,
) -> tuple[api.Task, tuple[Hashable, ...]]:
  """The FedGKT and split-learning builders' common arguments checked
  (one-line errors naming the argument); returns the edge task and the
  client ids."""
  learning_process.check_optimizer("client_optimizer_fn", client_optimizer_fn)
  learning_process.check_optimizer("server_optimizer_fn", server_optimizer_fn)
  ids = checked_client_ids(client_ids)
  learning_process.check_positive("batch_size", batch_size)
  learning_process.check_positive("local_epochs", local_epochs)
  return edge_task(edge_model_fn, server_model_fn, split_layer), ids


def edge_task(edge_model_fn, server_model_fn, split_layer: str) -> api.Task:
  """The task of an edge model cut at `split_layer` for a server model
  (FedGKT, split learning): both factories and the layer checked, one-line
  errors naming the argument."""
  edge = api.keras_model_of("edge_model_fn", edge_model_fn)
  api.keras_model_of("server_model_fn", server_model_fn)
  if split_layer not in [layer.name for layer in edge.layers]:
    raise ValueError(
      f"split_layer {split_layer!r} is not a layer of the edge model; its"
      f" layers: {', '.join(layer.name for layer in edge.layers)}"
    )
  shape = tuple(int(d) for d in edge.input_shape[1:])
  return api.Task.of_keras(
    edge_model_fn,
    collections.OrderedDict(
      x=tf.TensorSpec([None, *shape], tf.float32),
      y=tf.TensorSpec([None], tf.int32),
    ),
  )


def checked_client_ids(client_ids) -> tuple[Hashable, ...]:
  """The builders' `client_ids` as a tuple (distinct, hashable, at least
  one), or a one-line `TypeError` / `ValueError`."""
  if isinstance(client_ids, (str, bytes)) or not isinstance(
    client_ids, Iterable
  ):
    raise TypeError(
      "client_ids must be a sequence of client ids, got"
      f" {type(client_ids).__name__}"
    )
  ids = tuple(client_ids)
  try:
    distinct = len(set(ids))
  except TypeError as e:
    raise TypeError(f"client ids must be hashable: {e}") from None
  if not ids or distinct != len(ids):
    raise ValueError(
      f"client_ids must be distinct and at least one, got {len(ids)} ids"
      f" of which {distinct} distinct"
    )
  return ids


def _arrays_of(client_id, value) -> data_lib.ArrayDataset:
  if isinstance(value, data_lib.ArrayDataset):
    return value
  if isinstance(value, tuple) and len(value) == 2:
    try:
      return data_lib.ArrayDataset(
        np.asarray(value[0], np.float32), np.asarray(value[1], np.int32)
      )
    except (ValueError, TypeError) as e:
      raise TypeError(f"the data of client {client_id!r}: {e}") from None
  raise TypeError(
    f"the data of client {client_id!r} must be a"
    " tff_hetero.data.ArrayDataset or an (images, labels) pair of arrays, got"
    f" {type(value).__name__}"
  )


@attrs.frozen
class ClientStateProcessState:
  """A `ClientStateProcess`'s state (module docstring).

  Attributes:
    server: The algorithm's server state.
    clients: One state per client id, in the builder's order.
    round_num: Rounds completed.
    sampled: The ids of the clients that have taken part in a round.
  """

  server: Any
  clients: tuple[Any, ...]
  round_num: int = 0
  sampled: frozenset = frozenset()


@attrs.frozen
class ClientStateRoundOutput:
  """What `ClientStateProcess.next` returns.

  Attributes:
    state: The new `ClientStateProcessState`.
    metrics: The round's metrics (the algorithm's: loss, train_accuracy,
      ...) and the measured totals `bytes_down`, `bytes_up`, `clients`,
      `examples`.
    clients: One measured `ClientTraffic` per client, in `cohort` order.
  """

  state: ClientStateProcessState
  metrics: collections.OrderedDict
  clients: tuple[ClientTraffic, ...]


class ClientStateProcess:
  """`initialize` / `next` over an `api.FederatedAlgorithm` whose clients
  keep state (module docstring).

  Args:
    algorithm: The algorithm, built by the builder.
    client_ids: Every client that may take part.
    computations: The algorithm's typed computations by name, traced.
    batch_size: Batch size of the clients' data.
    local_epochs: Passes over its data a client makes per round.
    seed: Seeds the clients' shuffles (with the round and cohort position).
  """

  def __init__(
    self,
    algorithm: api.FederatedAlgorithm,
    client_ids: Iterable[Hashable],
    computations: Mapping[str, tff.Computation],
    *,
    batch_size: int,
    local_epochs: int,
    seed: int,
  ):
    self._algorithm = algorithm
    self._client_ids = checked_client_ids(client_ids)
    self._rows = {c: i for i, c in enumerate(self._client_ids)}
    self._computations = collections.OrderedDict(computations)
    self._batch_size = int(batch_size)
    self._local_epochs = int(local_epochs)
    self._seed = int(seed)

  @property
  def computations(self) -> collections.OrderedDict:
    """Every typed computation of a round, by name (module docstring)."""
    return collections.OrderedDict(self._computations)

  @property
  def client_ids(self) -> tuple[Hashable, ...]:
    return self._client_ids

  def initialize(self) -> ClientStateProcessState:
    initial = self._algorithm.initial_client_state()
    return ClientStateProcessState(
      server=self._algorithm.initialize(),
      clients=(initial,) * len(self._client_ids),
      round_num=0,
    )

  def next(
    self, state: ClientStateProcessState, cohort: Mapping[Hashable, Any]
  ) -> ClientStateRoundOutput:
    """One round of the clients in `cohort` (client id -> arrays)."""
    if not isinstance(cohort, Mapping):
      raise TypeError(
        f"the cohort must map client ids to arrays, got {type(cohort).__name__}"
      )
    if not cohort:
      raise ValueError("a round needs at least one client")
    unknown = [c for c in cohort if c not in self._rows]
    if unknown:
      raise KeyError(
        f"clients {unknown!r} are not among the client ids the process was"
        " built with"
      )
    arrays = {c: _arrays_of(c, value) for c, value in cohort.items()}
    round_num = state.round_num + 1
    self._algorithm.attach(None, {c: len(a) for c, a in arrays.items()})
    # A stream of their own: FedGKT's server draws from (seed, round).
    seeds = np.random.default_rng([self._seed, round_num, 1]).integers(
      0, 2**31 - 1, size=len(arrays)
    )
    clients = []
    for (client_id, client_arrays), shuffle_seed in zip(arrays.items(), seeds):
      client_state = state.clients[self._rows[client_id]]
      clients.append(
        api.ClientRound(
          client_id=client_id,
          dataset=self._algorithm.client_dataset(
            client_arrays,
            batch_size=self._batch_size,
            local_epochs=self._local_epochs,
            shuffle_seed=int(shuffle_seed),
            state=client_state,
          ),
          num_examples=len(client_arrays) * self._local_epochs,
          state=client_state,
        )
      )
    output = self._algorithm.next(state.server, round_num, clients)
    new_clients = list(state.clients)
    for client_id, client_state in output.client_states.items():
      new_clients[self._rows[client_id]] = client_state
    return ClientStateRoundOutput(
      state=ClientStateProcessState(
        server=output.state,
        clients=tuple(new_clients),
        round_num=round_num,
        sampled=state.sampled | frozenset(arrays),
      ),
      metrics=width_process.with_traffic_totals(output.metrics, output.traffic),
      clients=output.traffic,
    )

  def get_model_weights(
    self, state: ClientStateProcessState
  ) -> tff.learning.models.ModelWeights:
    """The server-side model's weights (the algorithm's `model_weights`)."""
    return self._algorithm.model_weights(state.server)

  def client_state(self, state: ClientStateProcessState, client_id) -> Any:
    """The state `client_id` keeps (its initial state if never sampled)."""
    if client_id not in self._rows:
      raise KeyError(f"no client {client_id!r} in the process")
    return state.clients[self._rows[client_id]]

  def evaluation_models(
    self, state: ClientStateProcessState
  ) -> collections.OrderedDict:
    """The models to evaluate, by name: `(model_fn, ModelWeights)` pairs,
    assignable to a fresh `model_fn()` (FedGKT: each sampled client's
    extractor with the server model, and its edge model alone, or the
    initial edge model's while no client has been sampled; split learning:
    the full model)."""
    seen = {
      c: s
      for c, s in zip(self._client_ids, state.clients)
      if c in state.sampled
    }
    models = self._algorithm.evaluation_models(
      state.server, api.ClientDatasets([], seen)
    )
    return collections.OrderedDict(
      (name, (m.model_fn or self._algorithm.task.model_fn, m.weights))
      for name, m in models.items()
    )
