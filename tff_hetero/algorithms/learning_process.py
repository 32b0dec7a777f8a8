"""Runs any measured `tff.learning.templates.LearningProcess` as a `FederatedAlgorithm`.

TFF's own builders (`build_weighted_fed_avg`, `build_weighted_fed_prox`, ...)
take a distributor, an aggregator and a metrics aggregator; `measured_parts`
supplies the measuring ones from `tff_hetero.accounting.tff_measure`, so the
process's metrics carry the bytes that crossed the network:

  metrics['distributor']  = <bytes_down, clients>
  metrics['aggregator']   = <inner, bytes_up, clients>
  metrics['client_work']['train'] = <metrics, uploaded_bytes>

`LearningProcessAlgorithm` reads them back into per-client `ClientTraffic`.
Every payload of these processes is dense and the same type for every client,
so each client's share of a measured sum is the sum divided by the number of
clients; the division is checked to be exact.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Sequence
import contextlib
import math
import numbers
from typing import Any

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import ClientTraffic
from tff_hetero.accounting import tff_measure
from tff_hetero.aggregators import model_aggregators
from tff_hetero.algorithms import api
from tff_hetero.algorithms import model_fns
from tff_hetero.algorithms import static_batch_norm


def check_optimizer(name: str, optimizer) -> None:
  if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError(
      f"{name} must be a tff.learning.optimizers.Optimizer"
      f" (e.g. build_sgdm(0.1)), got {type(optimizer).__name__}"
    )


def check_positive(name: str, value) -> None:
  """A one-line `ValueError` unless `value` is an integer >= 1."""
  if (
    isinstance(value, bool)
    or not isinstance(value, numbers.Integral)
    or value < 1
  ):
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def check_sgd(optimizer, why: str, *, momentum: bool) -> None:
  """Raises `TypeError` (starting with `why`) unless `optimizer` is TFF's
  `build_sgdm`, with momentum only if `momentum`."""
  check_optimizer("client_optimizer_fn", optimizer)
  hparams = tuple(
    optimizer.get_hparams(optimizer.initialize(tf.TensorSpec([], tf.float32)))
  )
  allowed = [("learning_rate",)] + (
    [("learning_rate", "momentum")] if momentum else []
  )
  if hparams not in allowed:
    form = "learning_rate[, momentum]" if momentum else "learning_rate"
    raise TypeError(
      f"{why}: client_optimizer_fn must be"
      f" tff.learning.optimizers.build_sgdm({form}), got one with"
      f" hyperparameters {list(hparams)}"
    )


def weighted_model_aggregator(model_aggregator, client_weighting):
  """`model_aggregator` as a weighted factory, checked against the weighting.

  None means TFF's `MeanFactory`. An unweighted factory (e.g.
  `DifferentiallyPrivateFactory`) ignores the weights, so it needs
  `ClientWeighting.UNIFORM`; TFF's `as_weighted_aggregator` wraps it.
  """
  if not isinstance(client_weighting, tff.learning.ClientWeighting):
    raise TypeError(
      "client_weighting must be a tff.learning.ClientWeighting"
      f" (NUM_EXAMPLES or UNIFORM), got {client_weighting!r}"
    )
  if model_aggregator is None:
    return tff.aggregators.MeanFactory()
  if isinstance(model_aggregator, tff.aggregators.WeightedAggregationFactory):
    return model_aggregator
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    if client_weighting is not tff.learning.ClientWeighting.UNIFORM:
      raise TypeError(
        f"model_aggregator {type(model_aggregator).__name__} is unweighted:"
        " it needs client_weighting=tff.learning.ClientWeighting.UNIFORM,"
        f" got {client_weighting}"
      )
    return tff.aggregators.as_weighted_aggregator(model_aggregator)
  raise TypeError(
    "model_aggregator must be a tff.aggregators factory, got"
    f" {type(model_aggregator).__name__}"
  )


@attrs.frozen
class MeasuredParts:
  model_distributor: Any
  model_aggregator: Any
  metrics_aggregator: Any


def measured_parts(
  tff_model_fn,
  model_aggregator=None,
  client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
) -> MeasuredParts:
  """Distributor, aggregator and metrics aggregator that measure traffic,
  around `model_aggregator` (`weighted_model_aggregator`)."""
  weights_type = tff.learning.models.weights_type_from_model(tff_model_fn)
  return MeasuredParts(
    model_distributor=tff_measure.build_measured_broadcast_process(
      weights_type
    ),
    model_aggregator=tff_measure.MeasuredUploadFactory(
      weighted_model_aggregator(model_aggregator, client_weighting)
    ),
    metrics_aggregator=tff_measure.measured_metrics_aggregator(),
  )


def build_hparams_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  optimizer: tff.learning.optimizers.Optimizer,
  client_update_fn: Callable[[], Callable],
  metrics_aggregator=None,
) -> tff.learning.templates.ClientWorkProcess:
  """Layers 2 and 3 of a client work in the form of TFF's
  `model_delta_client_work.py`, around a layer-1 `tf.function`.

  `client_update_fn()` builds (inside the typed computation) the function
  `client_update(optimizer, initial_weights, data, optimizer_hparams) ->
  (ClientResult, unfinalized metrics)`. The process's state is the client
  optimizer's hyperparameters, broadcast to the clients, so `get_hparams` /
  `set_hparams` behave as in TFF's FedAvg:

    next: (<H@SERVER, W@CLIENTS, {D*}@CLIENTS> ->
           <state=H@SERVER, result=ClientResult<...>@CLIENTS,
            measurements=<train=...>@SERVER>)

  `metrics_aggregator` defaults to `tff.learning.metrics.sum_then_finalize`.
  """
  if metrics_aggregator is None:
    metrics_aggregator = tff.learning.metrics.sum_then_finalize
  # A model built for its types only: eagerly when the program runs eagerly
  # (its variables are freed with it; a transformer builds in a third of
  # the time a `tf.Graph` takes, docs/performance.md), else in a graph of
  # its own, so that its variables never join the caller's graph.
  with tf.init_scope():
    eager = tf.executing_eagerly()
  with contextlib.nullcontext() if eager else tf.Graph().as_default():
    model = model_fn()
    metrics_aggregation_fn = metrics_aggregator(model.metric_finalizers())
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
  weights_type = tff.learning.models.weights_type_from_model(model)
  # The state is the optimizer's hyperparameters, read off a whimsy state.
  initial_hparams = optimizer.get_hparams(
    optimizer.initialize(tf.TensorSpec([], tf.float32))
  )

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(initial_hparams, tff.SERVER)

  hparams_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(hparams_type)
  def get_hparams_fn(state):
    return state

  @tff.tensorflow.computation(hparams_type, hparams_type)
  def set_hparams_fn(state, new_hparams):
    del state
    return new_hparams

  @tff.tensorflow.computation(hparams_type, weights_type, data_type)
  def client_update_computation(optimizer_hparams, initial_weights, dataset):
    client_update = client_update_fn()
    return client_update(optimizer, initial_weights, dataset, optimizer_hparams)

  @tff.federated_computation(
    init_fn.type_signature.result,
    tff.FederatedType(weights_type, tff.CLIENTS),
    tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    result, unfinalized_metrics = tff.federated_map(
      client_update_computation,
      (tff.federated_broadcast(state), weights, client_data),
    )
    measurements = tff.federated_zip(
      collections.OrderedDict(train=metrics_aggregation_fn(unfinalized_metrics))
    )
    return tff.templates.MeasuredProcessOutput(state, result, measurements)

  return tff.learning.templates.ClientWorkProcess(
    init_fn,
    next_fn,
    get_hparams_fn=get_hparams_fn,
    set_hparams_fn=set_hparams_fn,
  )


def builder_parts(
  model_fn,
  *,
  input_spec,
  loss_fn,
  metrics_fn,
  client_optimizer_fn,
  server_optimizer_fn,
  model_aggregator,
  client_weighting,
):
  """What every homogeneous builder starts from, its arguments checked:
  `(tff_model_fn, server_optimizer_fn, MeasuredParts)`, the TFF model of the
  Keras factory (`model_fns.variable_model_fn`), the server optimizer (SGD at
  learning rate 1 when None: the new global model is the mean of the
  clients'), and the measuring parts around `model_aggregator`."""
  tff_model_fn = model_fns.variable_model_fn(
    model_fn, input_spec, loss_fn, metrics_fn
  )
  check_optimizer("client_optimizer_fn", client_optimizer_fn)
  if server_optimizer_fn is None:
    server_optimizer_fn = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  check_optimizer("server_optimizer_fn", server_optimizer_fn)
  parts = measured_parts(tff_model_fn, model_aggregator, client_weighting)
  return tff_model_fn, server_optimizer_fn, parts


def tensor_spec(value) -> tf.TensorSpec:
  """`value`'s spec: a `tf.TensorSpec` as it is, else the array's."""
  if isinstance(value, tf.TensorSpec):
    return value
  value = np.asarray(value)
  return tf.TensorSpec(value.shape, tf.as_dtype(value.dtype))


def type_of(structure) -> tff.Type:
  """The TFF type of a structure of arrays and specs (None dims stay None)."""
  return tff.types.tensorflow_to_type(
    tf.nest.map_structure(tensor_spec, structure)
  )


def client_sgd(learning_rate: float, momentum: float = 0.0):
  """The clients' optimizer: SGD, with heavy-ball momentum if `momentum` > 0.

  Each client starts every round with fresh optimizer state (TFF's client
  work initialises it per call), as in FedAvg and AdaptiveFL.
  """
  return tff.learning.optimizers.build_sgdm(
    learning_rate=learning_rate, momentum=float(momentum) or None
  )


# `--client_optimizer`: name -> (learning rate, momentum) -> TFF optimizer.
CLIENT_OPTIMIZERS = collections.OrderedDict(
  sgd=client_sgd,
  adam=lambda learning_rate, momentum=0.0: tff.learning.optimizers.build_adam(
    learning_rate=learning_rate
  ),
)


def client_optimizer(name: str, learning_rate: float, momentum: float = 0.0):
  """The clients' optimizer by `--client_optimizer` name (fresh state each
  round, as `client_sgd`)."""
  return CLIENT_OPTIMIZERS[name](learning_rate, momentum)


def process_options(config) -> dict[str, Any]:
  """The builders' options a run's settings choose: the clients' optimizer
  (`--client_optimizer`, `--client_lr`, `--client_momentum`) and the model
  aggregator with its client weighting (`--aggregator`, `--clip_norm`,
  `--noise_multiplier`, the cohort size `--clients_per_round`)."""
  aggregator, weighting = model_aggregators.build_model_aggregator(
    config.aggregator,
    clip_norm=config.clip_norm,
    noise_multiplier=config.noise_multiplier,
    clients_per_round=config.clients_per_round,
  )
  return dict(
    client_optimizer_fn=client_optimizer(
      config.client_optimizer, config.client_lr, config.client_momentum
    ),
    model_aggregator=aggregator,
    client_weighting=weighting,
  )


def compose_cohort_round(
  sent_type, data_type, distributor, start, client_work, aggregator
) -> tff.Computation:
  """One measured round of a cohort whose clients all receive and train one
  model type (a width level, a depth group):

      (<S@SERVER, {D*}@CLIENTS> -> <aggregate@SERVER, M@SERVER>)

  `distributor` (a `tff_measure` broadcast of S) sends S, `start` (S -> the
  client work's `ModelWeights`) turns what each client received into its
  starting model, `client_work` trains, `aggregator` (a
  `tff_measure.MeasuredUploadFactory` process) aggregates the weighted
  updates. M = <distributor, train, aggregator, returned_model_bytes> (the
  updates' dense bytes summed over clients), what `dense_cohort_traffic`
  reads.
  """
  update_type = aggregator.next.type_signature.parameter[1].member

  @tff.tensorflow.computation(update_type)
  def update_nbytes(update):
    return tff_measure.dense_nbytes(update)

  @tff.federated_computation(
    tff.FederatedType(sent_type, tff.SERVER),
    tff.FederatedType(data_type, tff.CLIENTS),
  )
  def cohort_round(sent, client_data):
    delivered = distributor.next(distributor.initialize(), sent)
    work = client_work.next(
      client_work.initialize(),
      tff.federated_map(start, delivered.result),
      client_data,
    )
    uploaded = aggregator.next(
      aggregator.initialize(), work.result.update, work.result.update_weight
    )
    measurements = tff.federated_zip(
      collections.OrderedDict(
        distributor=delivered.measurements,
        train=work.measurements.train,
        aggregator=uploaded.measurements,
        returned_model_bytes=tff.federated_sum(
          tff.federated_map(update_nbytes, work.result.update)
        ),
      )
    )
    return uploaded.result, measurements

  return cohort_round


def dense_cohort_traffic(
  what: str,
  clients: Sequence[api.ClientRound],
  measurements,
  training_flops_per_example: int,
) -> tuple[ClientTraffic, ...]:
  """Each client's `ClientTraffic` from a cohort's measured sums.

  `measurements` holds `distributor` (`bytes_down`, `clients`), `aggregator`
  (`bytes_up`, `clients`) and `train.uploaded_bytes` as the measuring parts
  of `tff_measure` report them. Every client of the cohort received and sent
  payloads of one dense type, so each one's share is the sum over the number
  of clients (checked to be exact, and the counts to match the cohort).
  """
  down = measurements["distributor"]
  up = measurements["aggregator"]
  train = measurements["train"]
  n = len(clients)
  if int(down["clients"]) != n or int(up["clients"]) != n:
    raise RuntimeError(
      f"{what}: {n} clients but {int(down['clients'])} downloads and"
      f" {int(up['clients'])} uploads measured"
    )
  bytes_down = per_client_bytes(down["bytes_down"], n, "download")
  bytes_up = per_client_bytes(
    int(up["bytes_up"]) + int(train["uploaded_bytes"]), n, "upload"
  )
  return tuple(
    ClientTraffic(
      client_id=c.client_id,
      bytes_down=bytes_down,
      bytes_up=bytes_up,
      flops=c.num_examples * training_flops_per_example,
      examples=c.num_examples,
    )
    for c in clients
  )


def per_client_bytes(total: int, num_clients: int, what: str) -> int:
  if num_clients <= 0:
    return 0
  share, remainder = divmod(int(total), int(num_clients))
  if remainder:
    raise ValueError(
      f"{what}: {total} bytes over {num_clients} clients is not a dense,"
      " equal-size payload"
    )
  return share


def weighs_empties_zero(weighting: tff.learning.ClientWeighting) -> bool:
  """Whether TFF's client work gives an empty client weight 0 under
  `weighting` (by examples: yes; uniform: it weighs 1)."""
  return weighting is tff.learning.ClientWeighting.NUM_EXAMPLES


def non_finite_count(
  aggregator_measurements,
  clients: Sequence[api.ClientRound],
  empties_weigh_zero: bool,
) -> int:
  """How many clients' updates were not finite, from a `MeasuredUploadFactory`
  measurement (`<..., zero_weight_clients>`).

  TFF's client work (and ours, in its form) zeroes a non-finite update and
  gives it weight 0, as TFF's zeroing factory does. The only other client of
  weight 0 is an empty one when the weight is its example count
  (`empties_weigh_zero`), so the count is exact.
  """
  zeroed = int(aggregator_measurements["zero_weight_clients"])
  if empties_weigh_zero:
    zeroed -= sum(1 for c in clients if c.num_examples == 0)
  if zeroed < 0:
    raise RuntimeError(
      f"{int(aggregator_measurements['zero_weight_clients'])} clients of"
      " weight 0, fewer than the empty clients in the cohort"
    )
  return zeroed


def check_examples(processed: int, expected: int, non_finite_updates: int):
  """`RuntimeError` unless the training metrics miss examples exactly when
  some client's update was non-finite (its metrics were reset)."""
  if (processed == expected) != (non_finite_updates == 0):
    raise RuntimeError(
      f"{processed} of {expected} examples in the training metrics, but"
      f" {non_finite_updates} non-finite client updates"
    )


def train_metrics(
  train, clients: Sequence[api.ClientRound], non_finite_updates: int
) -> collections.OrderedDict:
  """The round's `loss`, `train_accuracy` and `non_finite_updates` from
  measured training metrics (`<metrics=<loss, sparse_categorical_accuracy,
  num_examples, ...>, ...>`).

  A client whose update was not finite was zeroed and reset its metrics
  (TFF's `model_delta_client_work`), so the loss covers the finite updates.
  It is NaN only when none is left (no client with examples had a finite
  update): the program then stops, naming the round. That the example count
  falls short exactly when some update was zeroed is checked.
  """
  examples = int(train["metrics"]["num_examples"])
  check_examples(
    examples, sum(c.num_examples for c in clients), non_finite_updates
  )
  nan_if_none = lambda v: float(v) if examples else math.nan
  return collections.OrderedDict(
    loss=nan_if_none(train["metrics"]["loss"]),
    train_accuracy=nan_if_none(train["metrics"]["sparse_categorical_accuracy"]),
    non_finite_updates=float(non_finite_updates),
  )


class LearningProcessAlgorithm(api.FederatedAlgorithm):
  """Adapts a measured TFF `LearningProcess` to the program."""

  def __init__(
    self,
    name: str,
    process: tff.learning.templates.LearningProcess,
    task: api.Task,
    *,
    empties_weigh_zero: bool,
  ):
    """`empties_weigh_zero`: the client work gives an empty client weight 0
    (TFF's, when weighting by examples), so it is no non-finite update."""
    self.name = name
    self.process = process
    self._empties_weigh_zero = empties_weigh_zero
    self._task = task
    self._static_bn = static_batch_norm.StaticBatchNorm(
      task.model_fn, task.element_spec
    )

  @classmethod
  def of_options(cls, name: str, process, task: api.Task, options):
    """For a process built from `process_options(config)` = `options`: TFF's
    client work weighs an empty client 0 when it weighs by examples."""
    return cls(
      name,
      process,
      task,
      empties_weigh_zero=weighs_empties_zero(options["client_weighting"]),
    )

  def initialize(self):
    return self.process.initialize()

  def next(
    self, state, round_num: int, clients: Sequence[api.ClientRound]
  ) -> api.RoundOutput:
    del round_num  # The process is stateless across rounds but for `state`.
    output = self.process.next(state, [c.dataset for c in clients])
    metrics = output.metrics
    train = metrics["client_work"]["train"]
    traffic = dense_cohort_traffic(
      self.name,
      clients,
      dict(
        distributor=metrics["distributor"],
        aggregator=metrics["aggregator"],
        train=train,
      ),
      self._task.training_flops_per_example,
    )
    return api.RoundOutput(
      state=output.state,
      metrics=train_metrics(
        train,
        clients,
        non_finite_count(
          metrics["aggregator"], clients, self._empties_weigh_zero
        ),
      ),
      traffic=traffic,
    )

  def model_weights(self, state):
    """The global model's weights. A composed process's state holds them
    (`LearningAlgorithmState.global_model_weights`), read here without
    `get_model_weights`, a TFF call that sends the whole state to the
    worker and back (10 ms of each round of the overhead-bound benchmark,
    where the program checks the weights are finite: docs/performance.md)."""
    weights = getattr(state, "global_model_weights", None)
    if isinstance(weights, tff.learning.models.ModelWeights):
      return weights
    return self.process.get_model_weights(state)

  def evaluation_models(self, state, data=None):
    """The global model; with batch norm, its statistics from the clients.

    TFF's algorithms aggregate trainable weights only: the moving statistics
    of BN layers keep their initial values. They are computed for evaluation
    (and the saved model) from the clients' training data, as the width
    algorithms do (`static_batch_norm`).
    """
    return collections.OrderedDict(
      global_model=api.EvaluationModel(
        self._static_bn.calibrate(self.model_weights(state), data)
      )
    )
