"""SCAFFOLD (Karimireddy et al., 2020, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020, https://arxiv.org/abs/1910.06378),
Algorithm 1 with option II.

The server keeps the global model x and a control variate c, each client i
its own control variate c_i (zero at the start: the paper's and the reported
pitfall's choice; SPATL's code starts them from a random network). In a
round, each sampled client receives (x, c) and, from y = x, runs K local
steps of SGD at learning rate eta_l on the corrected gradient

  y <- y - eta_l (g_i(y) - c_i + c),

K being its number of batches (local steps, all epochs). It then sets
(option II) c_i+ = c_i - c + (x - y) / (K eta_l), and uploads
Delta y_i = y - x (sent as x - y, TFF's sign) and Delta c_i = c_i+ - c_i. The server moves

  x <- x + eta_g * mean_i(Delta y_i),   c <- c + (1 / N) sum_{i in S} Delta c_i

with N the number of clients (`total_clients`). Here the server step is the
server optimizer's (SGD at `server_lr` = eta_g by default) applied to
mean_i(x - y_i), TFF's sign convention.

Departures, each on purpose:
* The model average is `model_aggregator`'s, example-weighted like every
  other algorithm here; the paper averages uniformly (pass
  `client_weighting=ClientWeighting.UNIFORM` for it). The control sum is the
  paper's, unweighted, over N.
* A client with no data (K = 0) or with a non-finite update sends zeros
  with weight 0 and keeps its c_i.
* The clients' optimizer is plain SGD (option II needs eta_l).
  `model_aggregator` aggregates the model changes only (the control changes
  are summed plainly, neither clipped nor noised), and its process is
  initialised afresh every round, so a stateful factory (adaptive clipping,
  tree-aggregated DP) would lose its state each round: pass a stateless
  one. The CLI offers the plain mean only: clipping or noising the model
  changes while the control changes, computed from the same steps, go
  unclipped and un-noised would bound or privatize half of what a client
  sends, which `--aggregator=clip|dp` would misstate.
* Batch-norm statistics are not aggregated (as in TFF's FedAvg here); the
  evaluated model's are computed from the clients' data
  (`static_batch_norm`).

Layers (as TFF's `model_delta_client_work.py`):

1. `build_scaffold_client_update(model_fn, client_weighting)`: a pure
   `tf.function` `client_update(optimizer, initial_weights, control,
   client_control, data)` -> `(ClientResult(update=x - y,
   update_weight), Delta c_i, c_i+, unfinalized metrics)`, on the corrected
   local pass and option-II update SPATL shares
   (`local_training.corrected_sgd_pass`, `option_two_control_delta`).
2. `ScaffoldProcess` traces, with W = `ModelWeights`, T = W.trainable (the
   control variates have T's type), O the server optimizer's state and
   U the model's unfinalized metrics:
     client_work: (<<W, T>, T, D*> -> <ClientResult<T, float32>, T, T, U>)
     server_update: (<W, O, T, T, T> -> <W, O, T>)
       (x, its optimizer state, the mean update, c, the control sum)
3. and the round, one federated computation:
     round: (<W@SERVER, O@SERVER, T@SERVER, T@CLIENTS, {D*}@CLIENTS,
              int32@CLIENTS (cohort position)> ->
             <W@SERVER, O@SERVER, T@SERVER,
              <rows=T[n], positions=int32[n]>@SERVER, metrics@SERVER>)
   returning each of the n clients' new c_i stacked at the server by cohort
   position (`cohort_positions.gather`: the simulation hands them to the
   caller, who keeps them for the client; not counted as traffic, since in
   the paper c_i never leaves the client), and measured bytes: the model and c down,
   Delta y (with its weight) and Delta c up.

`ScaffoldProcess.next(state, datasets, client_controls)` runs a round on the
given clients with their control variates (the caller keeps them; the CLI's
`Scaffold` keeps them in the program's client-state store, checkpointed)
and returns the new state, the metrics and the clients' new variates.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import tff_measure
from tff_hetero.algorithms import api
from tff_hetero.algorithms import cohort_positions
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import local_training
from tff_hetero.algorithms import static_batch_norm


class ScaffoldState(NamedTuple):
  """Server state: the global model, the server optimizer's state, c."""

  weights: Any
  optimizer_state: Any
  control: Any


class ScaffoldOutput(NamedTuple):
  """`ScaffoldProcess.next`'s result: the new state, the round's measured
  metrics, and each given client's new control variate, in cohort order."""

  state: ScaffoldState
  metrics: Any
  client_controls: list


def build_scaffold_client_update(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
):
  """Layer 1: the pure `tf.function` SCAFFOLD client update (module
  docstring)."""
  model = model_fn()
  uniform = client_weighting is tff.learning.ClientWeighting.UNIFORM

  @tf.function
  def client_update(optimizer, initial_weights, control, client_control, data):
    model_weights = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(
      lambda v, t: v.assign(t),
      model_weights,
      initial_weights,
      check_types=False,
    )
    trainable = tf.nest.flatten(model_weights.trainable)
    examples, steps, learning_rate = local_training.corrected_sgd_pass(
      model,
      trainable,
      optimizer,
      data,
      {i: c - ci for i, (c, ci) in enumerate(zip(control, client_control))},
    )
    update = [
      x - y
      for x, y in zip(tf.nest.flatten(initial_weights.trainable), trainable)
    ]
    # Option II: c_i+ = c_i - c + (x - y) / (K eta_l); K = 0 keeps c_i.
    control_delta = local_training.option_two_control_delta(
      update, control, steps, learning_rate
    )
    (update, control_delta), non_finite = (
      local_training.zero_all_if_any_non_finite((update, control_delta))
    )
    weight = (
      tf.constant(1.0, tf.float32) if uniform else tf.cast(examples, tf.float32)
    )
    if non_finite > 0 or steps == 0:
      weight = tf.constant(0.0, tf.float32)
      model.reset_metrics()
    new_control = [ci + d for ci, d in zip(client_control, control_delta)]
    return (
      tff.learning.templates.ClientResult(update=update, update_weight=weight),
      control_delta,
      new_control,
      model.report_local_unfinalized_metrics(),
    )

  return client_update


class ScaffoldProcess:
  """SCAFFOLD's typed computations and a FedJAX-like `initialize` / `next`
  over them (module docstring). Build with `build_scaffold_process`."""

  def __init__(
    self,
    tff_model_fn,
    *,
    client_optimizer_fn,
    server_optimizer_fn,
    total_clients: int,
    parts: learning_process.MeasuredParts,
    client_weighting,
  ):
    self._total_clients = int(total_clients)
    with tf.Graph().as_default():  # The model's variables must not leak out.
      model = tff_model_fn()
      metrics_aggregate = parts.metrics_aggregator(model.metric_finalizers())
      self._initial = tff.learning.models.ModelWeights.from_model(model)
      trainable_specs = [
        tf.TensorSpec(v.shape, v.dtype) for v in self._initial.trainable
      ]
    self._trainable_specs = trainable_specs
    weights_type = tff.learning.models.weights_type_from_model(model)
    control_type = weights_type.trainable
    data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
    server_optimizer = server_optimizer_fn
    client_optimizer = client_optimizer_fn

    @tff.tensorflow.computation
    def initial_state():
      weights = tff.learning.models.ModelWeights.from_model(tff_model_fn())
      return ScaffoldState(
        weights=weights,
        optimizer_state=server_optimizer.initialize(tuple(trainable_specs)),
        control=[tf.zeros(s.shape, s.dtype) for s in trainable_specs],
      )

    self.initial_state = initial_state
    state_type = initial_state.type_signature.result
    sent_type = tff.StructType([weights_type, control_type])

    @tff.tensorflow.computation(sent_type, control_type, data_type)
    def client_work(sent, client_control, data):
      weights = tff.learning.models.ModelWeights(
        trainable=list(sent[0].trainable),
        non_trainable=list(sent[0].non_trainable),
      )
      control = list(sent[1])
      update = build_scaffold_client_update(tff_model_fn, client_weighting)
      return update(client_optimizer, weights, control, client_control, data)

    total = float(self._total_clients)

    @tff.tensorflow.computation(
      weights_type,
      state_type.optimizer_state,
      control_type,
      control_type,
      control_type,
    )
    def server_update(weights, optimizer_state, mean_update, control, summed):
      optimizer_state, trainable = server_optimizer.next(
        optimizer_state, tuple(weights.trainable), tuple(mean_update)
      )
      weights = tff.learning.models.ModelWeights(
        trainable=list(trainable), non_trainable=list(weights.non_trainable)
      )
      control = [c + s / total for c, s in zip(control, summed)]
      return weights, optimizer_state, control

    self.client_work, self.server_update = client_work, server_update
    distributor = tff_measure.build_measured_broadcast_process(sent_type)
    aggregator = parts.model_aggregator.create(
      control_type, tff.TensorType(np.float32)
    )
    # The control deltas are summed (the paper's 1/N outside); their upload
    # is measured without the weight, which travels with the model update.
    control_aggregator = tff_measure.MeasuredUploadFactory(
      tff.aggregators.as_weighted_aggregator(tff.aggregators.SumFactory()),
      nbytes_fn=lambda value, weight: tff_measure.dense_nbytes(value),
    ).create(control_type, tff.TensorType(np.float32))

    @tff.federated_computation(
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(state_type.optimizer_state, tff.SERVER),
      tff.FederatedType(control_type, tff.SERVER),
      tff.FederatedType(control_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
      cohort_positions.POSITIONS_AT_CLIENTS,
    )
    def scaffold_round(
      weights, optimizer_state, control, client_controls, data, positions
    ):
      sent = distributor.next(
        distributor.initialize(), tff.federated_zip([weights, control])
      )
      result, control_delta, new_controls, metrics = tff.federated_map(
        client_work, (sent.result, client_controls, data)
      )
      mean = aggregator.next(
        aggregator.initialize(), result.update, result.update_weight
      )
      summed = control_aggregator.next(
        control_aggregator.initialize(), control_delta, result.update_weight
      )
      new_weights, new_optimizer_state, new_control = tff.federated_map(
        server_update,
        (weights, optimizer_state, mean.result, control, summed.result),
      )
      measurements = tff.federated_zip(
        collections.OrderedDict(
          distributor=sent.measurements,
          train=metrics_aggregate(metrics),
          aggregator=mean.measurements,
          control_aggregator=summed.measurements,
        )
      )
      return (
        new_weights,
        new_optimizer_state,
        new_control,
        cohort_positions.gather(new_controls, positions),
        measurements,
      )

    self.round = scaffold_round

  def initialize(self) -> ScaffoldState:
    return ScaffoldState(*self.initial_state())

  def initial_client_control(self) -> list:
    """c_i before a client's first round: zeros."""
    return [
      np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in self._trainable_specs
    ]

  def next(
    self,
    state: ScaffoldState,
    datasets: Sequence[tf.data.Dataset],
    client_controls: Sequence[Any],
  ) -> ScaffoldOutput:
    if len(datasets) != len(client_controls):
      raise ValueError(
        f"SCAFFOLD: {len(datasets)} datasets but {len(client_controls)}"
        " client control variates"
      )
    n = len(datasets)
    weights, optimizer_state, control, gathered, metrics = self.round(
      state.weights,
      state.optimizer_state,
      state.control,
      [list(c) for c in client_controls],
      list(datasets),
      cohort_positions.positions(n),
    )
    return ScaffoldOutput(
      state=ScaffoldState(weights, optimizer_state, control),
      metrics=metrics,
      client_controls=[
        list(c) for c in cohort_positions.unstack_rows(gathered, n, "SCAFFOLD")
      ],
    )

  def get_model_weights(self, state: ScaffoldState):
    weights = state.weights
    return tff.learning.models.ModelWeights(
      trainable=[np.asarray(w) for w in weights.trainable],
      non_trainable=[np.asarray(w) for w in weights.non_trainable],
    )


def build_scaffold_process(
  model_fn: Callable[[], tf.keras.Model],
  *,
  input_spec: Any,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  total_clients: int,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  model_aggregator=None,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
  metrics_fn: Optional[Callable[[], list]] = None,
) -> ScaffoldProcess:
  """SCAFFOLD (module docstring). Arguments as
  `fedavg.build_fedavg_process`'s, plus `total_clients` (N, > 0);
  `client_optimizer_fn` must be `build_sgdm(learning_rate)` without
  momentum, and `server_optimizer_fn` (default SGD at 1) applies eta_g."""
  learning_process.check_sgd(
    client_optimizer_fn, "SCAFFOLD (option II needs eta_l)", momentum=False
  )
  if int(total_clients) != total_clients or total_clients <= 0:
    raise ValueError(
      f"total_clients must be a positive integer, got {total_clients!r}"
    )
  tff_model_fn, server_optimizer_fn, parts = learning_process.builder_parts(
    model_fn,
    input_spec=input_spec,
    loss_fn=loss_fn,
    metrics_fn=metrics_fn,
    client_optimizer_fn=client_optimizer_fn,
    server_optimizer_fn=server_optimizer_fn,
    model_aggregator=model_aggregator,
    client_weighting=client_weighting,
  )
  return ScaffoldProcess(
    tff_model_fn,
    client_optimizer_fn=client_optimizer_fn,
    server_optimizer_fn=server_optimizer_fn,
    total_clients=total_clients,
    parts=parts,
    client_weighting=client_weighting,
  )


class Scaffold(api.FederatedAlgorithm):
  """`--algorithm=scaffold`: a `ScaffoldProcess` whose clients' control
  variates live in the program's client-state store (checkpointed)."""

  name = "scaffold"

  def __init__(self, process: ScaffoldProcess, task: api.Task):
    self.process, self.task = process, task
    self._static_bn = static_batch_norm.StaticBatchNorm(
      task.model_fn, task.element_spec
    )

  def initialize(self) -> ScaffoldState:
    return self.process.initialize()

  def initial_client_state(self):
    return self.process.initial_client_control()

  def next(
    self, state, round_num: int, clients: Sequence[api.ClientRound]
  ) -> api.RoundOutput:
    del round_num
    output = self.process.next(
      state,
      [c.dataset for c in clients],
      [
        c.state if c.state is not None else self.initial_client_state()
        for c in clients
      ],
    )
    measured = output.metrics
    up, control_up = measured["aggregator"], measured["control_aggregator"]
    traffic = learning_process.dense_cohort_traffic(
      self.name,
      clients,
      dict(
        distributor=measured["distributor"],
        aggregator=dict(
          bytes_up=int(up["bytes_up"]) + int(control_up["bytes_up"]),
          clients=up["clients"],
        ),
        train=measured["train"],
      ),
      self.task.training_flops_per_example,
    )
    return api.RoundOutput(
      state=output.state,
      # An empty client takes no step and weighs 0 (`client_update`).
      metrics=learning_process.train_metrics(
        measured["train"],
        clients,
        learning_process.non_finite_count(up, clients, empties_weigh_zero=True),
      ),
      traffic=traffic,
      client_states={
        c.client_id: control
        for c, control in zip(clients, output.client_controls)
      },
    )

  def model_weights(self, state):
    return self.process.get_model_weights(state)

  def evaluation_models(self, state, data=None):
    return collections.OrderedDict(
      global_model=api.EvaluationModel(
        self._static_bn.calibrate(self.model_weights(state), data)
      )
    )


def build_scaffold(
  config, task: api.Task, client_ids=()
) -> api.FederatedAlgorithm:
  options = learning_process.process_options(config)
  process = build_scaffold_process(
    task.model_fn,
    input_spec=task.element_spec,
    total_clients=len(client_ids) or config.num_clients,
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(
      learning_rate=config.server_lr
    ),
    **options,
  )
  return Scaffold(process, task)
