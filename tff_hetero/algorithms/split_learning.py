"""Split learning, FedGKT's communication baseline.

Gupta and Raskar, "Distributed learning of deep neural network over multiple
agents" (2018), and Vepakomma et al., "Split learning for health" (2018), as
FedGKT (He et al., NeurIPS 2020, Section 4.1) runs it: "we use the extractor
in ResNet-8 as the edge-sided partition of CNNs, while the server-side
partitions of CNN are also ResNet-55/109". The CNN is cut where FedGKT cuts
it: the device holds the extractor of the edge model (`--model`, up to its
registry `split_layer`: the stem), the server the server model
(`--gkt_server_model`); extractor + server is the full ResNet, the model
evaluated. Clients take turns (vanilla split learning, in the round's
sampled order); on its turn a client

1. receives the extractor's current weights (from the previous client,
   relayed by the server),
2. for each batch of its `--local_epochs` passes: runs the extractor and
   sends the activations and the labels; the server runs its partition
   forward and backward, updates it, and sends back the gradient of the
   loss with respect to the activations; the client backpropagates that
   gradient through the extractor and updates it,
3. sends the extractor's weights back for the next client.

Both partitions train with the clients' optimizer (`--client_lr`,
`--client_momentum`), as FedAvg trains the full model; the server keeps its
partition's optimizer state across turns, the client starts each turn with
a fresh one.

Accounting, measured on the tensors of the exchange: per batch the
activations and labels up and the activation gradients down; per turn the
extractor's weights down and up (trainable and batch-norm statistics).

Deviation, with the reason: the per-batch exchange runs inside one
TensorFlow computation per client turn (`build_turn`) holding both
partitions, with the cut explicit: the server side starts from a copy of
the activations under its own gradient tape, and the client side applies
the gradient it gets back (`output_gradients`); the messages are those
tensors and their sizes are what is counted. TFF has no per-batch exchange
between placements; one TFF round trip per batch would add its overhead
(and the server weights' transfer between driver and runtime) to every
batch, which is not split learning's cost.

Addition: a turn whose result is not finite (either partition, the server's
optimizer state or the loss) is undone on the driver, counted in
`non_finite_updates` and left out of the loss; its traffic stays. The
papers do not say; one NaN turn would otherwise poison every later one.

Typed computation, E = extractor <trainable, non_trainable>, S = server
<trainable, non_trainable>, O = its optimizer state, D = the client's
batches <x, y>:

    turn: (<E, S, O, D*> -> <E, S, O, bytes up, bytes down, metric sums>)
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Sequence
import functools
import math
from typing import Any
from typing import NamedTuple

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import models as models_lib
from tff_hetero.accounting import ClientTraffic
from tff_hetero.accounting import payload
from tff_hetero.algorithms import api
from tff_hetero.algorithms import client_state_process
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms.fedgkt import optimizer_initial
from tff_hetero.algorithms.fedgkt import server_model_setting
from tff_hetero.algorithms.fedgkt import weights_of
from tff_hetero.errors import UsageError
from tff_hetero.models import fedgkt as gkt_models
from tff_hetero.settings import AlgorithmSettings


class SplitState(NamedTuple):
  """The extractor (relayed between clients) and the server's partition."""

  extractor: Any
  server: Any
  server_optimizer_state: Any


def _assign(variables, values) -> None:
  for variable, value in zip(variables, values):
    variable.assign(value)


def build_turn(extractor_fn, server_fn, client_optimizer, server_optimizer):
  """One client's turn (module docstring) as a `tf.function`."""
  extractor, server = extractor_fn(), server_fn()
  specs = tuple(
    tf.TensorSpec(v.shape, v.dtype) for v in extractor.trainable_variables
  )

  @tf.function
  def turn(
    extractor_weights: tff.learning.models.ModelWeights,
    server_weights: tff.learning.models.ModelWeights,
    server_optimizer_state,
    data,
  ):
    _assign(extractor.trainable_variables, extractor_weights.trainable)
    _assign(extractor.non_trainable_variables, extractor_weights.non_trainable)
    _assign(server.trainable_variables, server_weights.trainable)
    _assign(server.non_trainable_variables, server_weights.non_trainable)
    client_vars = extractor.trainable_variables
    server_vars = server.trainable_variables

    def step(state, batch):
      client_state, server_state, sums = state
      labels = tf.cast(batch["y"], tf.int32)
      with tf.GradientTape() as client_tape:
        activations = extractor(batch["x"], training=True)
      # Up: the activations and the labels. The server starts from them.
      received = tf.identity(tf.stop_gradient(activations))
      with tf.GradientTape() as server_tape:
        server_tape.watch(received)
        logits = server(received, training=True)
        loss = tf.reduce_mean(
          tf.keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True
          )
        )
      gradients = server_tape.gradient(loss, list(server_vars) + [received])
      server_state, updated = server_optimizer.next(
        server_state, tuple(server_vars), tuple(gradients[:-1])
      )
      _assign(server_vars, updated)
      # Down: the gradient with respect to the activations.
      returned = gradients[-1]
      client_gradients = client_tape.gradient(
        activations, client_vars, output_gradients=returned
      )
      client_state, updated = client_optimizer.next(
        client_state, tuple(client_vars), tuple(client_gradients)
      )
      _assign(client_vars, updated)
      n = tf.cast(tf.shape(labels)[0], tf.float32)
      correct = tf.reduce_sum(
        tf.cast(
          tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels),
          tf.float32,
        )
      )
      sums = collections.OrderedDict(
        loss=sums["loss"] + loss * n,
        correct=sums["correct"] + correct,
        examples=sums["examples"] + n,
        bytes_up=sums["bytes_up"] + payload.tf_dense_nbytes([received, labels]),
        bytes_down=sums["bytes_down"] + payload.tf_dense_nbytes([returned]),
      )
      return client_state, server_state, sums

    zero = collections.OrderedDict(
      loss=tf.constant(0.0),
      correct=tf.constant(0.0),
      examples=tf.constant(0.0),
      bytes_up=tf.constant(0, tf.int64),
      bytes_down=tf.constant(0, tf.int64),
    )
    _, server_optimizer_state, sums = data.reduce(
      (client_optimizer.initialize(specs), server_optimizer_state, zero), step
    )
    return (
      tff.learning.models.ModelWeights(
        [tf.identity(v) for v in client_vars],
        [tf.identity(v) for v in extractor.non_trainable_variables],
      ),
      tff.learning.models.ModelWeights(
        [tf.identity(v) for v in server_vars],
        [tf.identity(v) for v in server.non_trainable_variables],
      ),
      server_optimizer_state,
      sums,
    )

  return turn


class SplitLearning(api.FederatedAlgorithm):
  """Split learning (module docstring) for the program."""

  name = "split_learning"

  def __init__(
    self,
    task: api.Task,
    server_fn: Callable[[], tf.keras.Model],
    *,
    split_layer: str,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    seed: int = 0,
    server_model_name: str = "server",
  ):
    """Split learning of the edge model `task.model_fn` cut at its layer
    `split_layer` (the device holds the part up to it) and the server model
    `server_fn` (no-arg factories of identically initialised Keras
    models)."""
    self.task = task
    self.seed = int(seed)
    self.split_layer = split_layer
    shape = task.input_shape
    self.server_fn = server_fn
    self.extractor_fn = lambda: gkt_models.extractor(
      task.model_fn(), self.split_layer
    )
    self.composed_fn = lambda: gkt_models.extractor_and_server(
      task.model_fn(), self.server_fn(), self.split_layer
    )
    extractor, server = self.extractor_fn(), self.server_fn()
    if tuple(extractor.output.shape[1:]) != tuple(server.input.shape[1:]):
      raise models_lib.ModelError(
        f"the edge model {task.model_name!r} sends activations of shape"
        f" {tuple(extractor.output.shape[1:])} but the server model"
        f" {server_model_name!r} takes {tuple(server.input.shape[1:])}"
      )
    self._extractor_initial = weights_of(extractor)
    self._server_initial = weights_of(server)
    self._extractor_training = models_lib.training_flops_per_example(extractor)
    self.profile = collections.OrderedDict(
      edge_model=task.model_name,
      split_layer=self.split_layer,
      extractor_params=models_lib.count_params(extractor).trainable,
      extractor_flops=models_lib.count_flops(extractor),
      server_model=server_model_name,
      server_params=models_lib.count_params(server).trainable,
    )
    self._client_optimizer = client_optimizer
    self._server_optimizer = server_optimizer
    self._server_optimizer_initial = optimizer_initial(
      self._server_optimizer, self._server_initial.trainable
    )
    self._element_spec = collections.OrderedDict(
      x=tf.TensorSpec([None, *shape], tf.float32),
      y=tf.TensorSpec([None], tf.int32),
    )

  @classmethod
  def of_registry(
    cls,
    task: api.Task,
    server_model: str,
    *,
    client_lr: float,
    client_momentum: float = 0.0,
    seed: int = 0,
  ) -> "SplitLearning":
    """Split learning of a registered edge model (cut at its registry
    `split_layer`) and registered server model, both partitions on the
    clients' SGD (`client_lr`, heavy-ball `client_momentum`), as FedAvg
    trains the full model: what `--algorithm=split_learning` runs."""
    gkt_models.check_server_model(server_model)
    shape, classes = task.input_shape, task.num_classes
    algorithm = cls(
      task,
      lambda: models_lib.build_model(server_model, shape, classes, seed=seed),
      split_layer=models_lib.split_layer(task.model_name),
      client_optimizer=learning_process.client_sgd(client_lr, client_momentum),
      server_optimizer=learning_process.client_sgd(client_lr, client_momentum),
      seed=seed,
      server_model_name=server_model,
    )
    algorithm.profile["full_model"] = gkt_models.FULL_MODEL_OF_SERVER[
      server_model
    ]
    return algorithm

  @functools.cached_property
  def turn(self):
    """The turn as a TFF computation (built on first use)."""
    extractor_type = learning_process.type_of(self._extractor_initial)
    server_type = learning_process.type_of(self._server_initial)
    optimizer_type = learning_process.type_of(self._server_optimizer_initial)
    data_type = tff.SequenceType(learning_process.type_of(self._element_spec))

    @tff.tensorflow.computation(
      extractor_type, server_type, optimizer_type, data_type
    )
    def turn(extractor, server, optimizer_state, data):
      step = build_turn(
        self.extractor_fn,
        self.server_fn,
        self._client_optimizer,
        self._server_optimizer,
      )
      return step(
        tff.learning.models.ModelWeights(*extractor),
        tff.learning.models.ModelWeights(*server),
        optimizer_state,
        data,
      )

    return turn

  def initialize(self) -> SplitState:
    return SplitState(
      self._extractor_initial,
      self._server_initial,
      self._server_optimizer_initial,
    )

  def next(
    self, state: SplitState, round_num: int, clients: Sequence[api.ClientRound]
  ) -> api.RoundOutput:
    del round_num
    extractor = tff.learning.models.ModelWeights(*state.extractor)
    server = tff.learning.models.ModelWeights(*state.server)
    optimizer_state = state.server_optimizer_state
    traffic, totals = [], collections.Counter()
    non_finite = 0
    for client in clients:
      weights_bytes = payload.dense_nbytes(list(extractor))
      before = (extractor, server, optimizer_state)
      extractor, server, optimizer_state, sums = self.turn(
        extractor, server, optimizer_state, client.dataset
      )
      extractor, server = (
        tff.learning.models.ModelWeights(*extractor),
        tff.learning.models.ModelWeights(*server),
      )
      sums = {k: float(v) for k, v in sums.items()}
      if api.all_finite((extractor, server, optimizer_state)) and math.isfinite(
        sums["loss"]
      ):
        totals.update(sums)
      else:
        # A turn that is not finite would poison both partitions for every
        # later client: it is undone, counted, and left out of the metrics
        # (its traffic happened, and stays).
        extractor, server, optimizer_state = before
        non_finite += 1
        totals.update(bytes_up=sums["bytes_up"], bytes_down=sums["bytes_down"])
      traffic.append(
        ClientTraffic(
          client_id=client.client_id,
          bytes_down=weights_bytes + int(sums["bytes_down"]),
          bytes_up=int(sums["bytes_up"])
          + payload.dense_nbytes(list(extractor)),
          flops=int(sums["examples"]) * self._extractor_training,
          examples=int(sums["examples"]),
        )
      )
    examples = totals["examples"]
    learning_process.check_examples(
      examples, sum(c.num_examples for c in clients), non_finite
    )
    metrics = collections.OrderedDict(
      loss=totals["loss"] / examples if examples else math.nan,
      train_accuracy=(totals["correct"] / examples if examples else math.nan),
      non_finite_updates=float(non_finite),
      activation_bytes=totals["bytes_up"],
      gradient_bytes=totals["bytes_down"],
    )
    return api.RoundOutput(
      state=SplitState(
        tff.learning.models.ModelWeights(
          *[[np.asarray(w) for w in part] for part in extractor]
        ),
        tff.learning.models.ModelWeights(
          *[[np.asarray(w) for w in part] for part in server]
        ),
        tf.nest.map_structure(np.asarray, optimizer_state),
      ),
      metrics=metrics,
      traffic=tuple(traffic),
    )

  def model_weights(self, state: SplitState):
    """The full model's weights: the extractor's, then the server's."""
    extractor, server = (
      tff.learning.models.ModelWeights(*state.extractor),
      tff.learning.models.ModelWeights(*state.server),
    )
    return tff.learning.models.ModelWeights(
      trainable=list(extractor.trainable) + list(server.trainable),
      non_trainable=(
        list(extractor.non_trainable) + list(server.non_trainable)
      ),
    )

  def evaluation_models(self, state: SplitState, data=None):
    del data
    return collections.OrderedDict(
      full_model=api.EvaluationModel(
        self.model_weights(state), model_fn=self.composed_fn
      )
    )

  def report_extras(self) -> collections.OrderedDict:
    return collections.OrderedDict(split_learning_models=self.profile)


@attrs.frozen(kw_only=True)
class SplitLearningSettings(AlgorithmSettings):
  gkt_server_model: str = server_model_setting()


def build_split_learning(
  config, task: api.Task, client_ids=()
) -> SplitLearning:
  """Registry builder: `--algorithm=split_learning`."""
  del client_ids
  spec = models_lib.MODELS.get(config.model)
  if spec is None or not spec.split_layer:
    edges = sorted(n for n, s in models_lib.MODELS.items() if s.split_layer)
    raise UsageError(
      "--model",
      f"split_learning cuts an edge model (a model"
      f" with a split point); accepted: {', '.join(edges)}",
    )
  try:
    return SplitLearning.of_registry(
      task,
      config.settings.gkt_server_model,
      client_lr=config.client_lr,
      client_momentum=config.client_momentum,
      seed=config.seed,
    )
  except models_lib.ModelError as e:
    raise UsageError("--gkt_server_model", str(e)) from None


def build_split_learning_process(
  edge_model_fn: Callable[[], tf.keras.Model],
  server_model_fn: Callable[[], tf.keras.Model],
  *,
  split_layer: str,
  client_ids: Sequence[Hashable],
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  server_optimizer_fn: tff.learning.optimizers.Optimizer,
  batch_size: int,
  local_epochs: int = 1,
  seed: int = 0,
) -> client_state_process.ClientStateProcess:
  """Split learning (module docstring) as a `ClientStateProcess`.

  The device holds `edge_model_fn()`'s model up to its layer `split_layer`
  (the extractor: its classifier is not used), the server
  `server_model_fn()`'s model, which takes the extractor's output. A round
  (`next(state, {client_id: arrays})`) gives the clients their turns in
  the cohort's order; `computations` holds `turn`. `get_model_weights`
  gives the full model's weights (the extractor's, then the server
  model's), as `evaluation_models` assigns them.

  Args:
    edge_model_fn, server_model_fn: No-arg callables returning fresh,
      identically initialised `tf.keras.Model`s (images in, logits out;
      the server model's input is the output of `split_layer`).
    split_layer: Name of the edge model's layer where the model is cut.
    client_ids: Every client that may take part (distinct, hashable).
    client_optimizer_fn: The extractor's `tff.learning.optimizers.Optimizer`
      (a client starts each turn with a fresh state).
    server_optimizer_fn: The server partition's (its state is kept across
      turns).
    batch_size, local_epochs: The clients' batches and passes per turn.
    seed: Seeds the clients' shuffles.

  No `model_aggregator` or `client_weighting`: nothing is averaged (one
  extractor is relayed from client to client, one server partition
  trains on every batch). The loss is cross-entropy on the server model's
  logits against integer labels, and the metrics its accuracy, as the
  CLI's and the papers' (a classification baseline of FedGKT).
  """
  task, ids = client_state_process.checked_edge_arguments(
    edge_model_fn,
    server_model_fn,
    split_layer,
    client_ids,
    client_optimizer_fn,
    server_optimizer_fn,
    batch_size,
    local_epochs,
  )
  algorithm = SplitLearning(
    task,
    server_model_fn,
    split_layer=split_layer,
    client_optimizer=client_optimizer_fn,
    server_optimizer=server_optimizer_fn,
    seed=seed,
    server_model_name=getattr(server_model_fn, "__name__", "server"),
  )
  return client_state_process.ClientStateProcess(
    algorithm,
    ids,
    collections.OrderedDict(turn=algorithm.turn),
    batch_size=batch_size,
    local_epochs=local_epochs,
    seed=seed,
  )
