"""FedNova (Wang et al., 2020, "Tackling the Objective Inconsistency Problem
in Heterogeneous Federated Optimization", NeurIPS 2020,
https://arxiv.org/abs/2007.07481).

Clients that run more local steps move further, so FedAvg's average of their
models drifts toward the objectives of the busiest clients. FedNova divides
each client's change by its own step count before averaging, and rescales
the average by the cohort's effective step count. From the global model x, a
client i runs tau_i steps of SGD with heavy-ball momentum rho (TFF's
`build_sgdm`, as PyTorch's SGD: buf <- rho buf + g, w <- w - lr buf) over its
data and ends at y_i; with

  a_i = sum_{k=1}^{tau_i} c_k,   c_k = rho c_{k-1} + 1,   c_0 = 0

(a_i = tau_i without momentum; the paper's ||a_i||_1, its Appendix on
momentum, as the official code's `local_normalizing_vec` accumulates it)
the client uploads the normalised change d_i = (x - y_i) / a_i (which holds
the learning rate, as the code's `cum_grad` does) and a_i. The server, with
p_i = n_i / sum_j n_j over the round's clients (n_i: the examples the
client trained this round, its data size times its epochs, so the paper's
data ratio when every client runs the same epochs, as the CLI's do; a
caller whose clients run different epochs should weight uniformly or give
every client the same epochs; 1 / |S| with `ClientWeighting.UNIFORM`),

  tau_eff = sum_i p_i a_i,     x <- x - server_opt(tau_eff * sum_i p_i d_i)

and with server SGD at learning rate 1 (the default), x - tau_eff sum_i p_i
d_i: the paper's Eq. (7) with the FedAvg-like choice of tau_eff. With equal
tau_i and no momentum it is exactly FedAvg. The official code's server
momentum (`gmf`: buf <- gmf buf + Delta / lr, x <- x - lr buf) is, while the
client learning rate lr stays constant, server SGD at learning rate 1 with
momentum gmf: pass that as `server_optimizer_fn` (the CLI has no flag for
it; the official script's learning-rate decay would rescale its buffer).

The process is TFF's `compose_learning_process` of:

* distributor: our measuring broadcast (as FedAvg's), W = `ModelWeights`;
* client work (`build_fednova_client_work`), in the three layers of TFF's
  `model_delta_client_work.py` (layers 2 and 3 shared with FedProx,
  `learning_process.build_hparams_client_work`):
    1. `build_fednova_client_update`: a pure `tf.function`
       `client_update(optimizer, initial_weights, data, hparams)` ->
       `(ClientResult(update=NormalizedUpdate(d, a), update_weight=n_i),
         unfinalized metrics)`, the local SGD pass shared by every algorithm
       (`local_training.sgd_step`);
    2. a `tff.tensorflow.computation`
         (<H, W, D*> -> <ClientResult<update=N, update_weight=float32>, U>)
       with H the optimizer's hyperparameters (`<learning_rate=float32>` or
       `<learning_rate=float32,momentum=float32>`), N = `NormalizedUpdate`
       `<normalized=T, steps_norm=float32>`, T = W.trainable;
    3. next: (<H@SERVER, W@CLIENTS, {D*}@CLIENTS> ->
              <state=H@SERVER, result=ClientResult<N, float32>@CLIENTS,
               measurements=<train=<metrics, uploaded_bytes>>@SERVER>)
* aggregator: `model_aggregator` (default TFF's weighted mean) over N inside
  our measuring upload factory: the mean of N is <sum p_i d_i, tau_eff>;
* finalizer (`build_fednova_finalizer`): TFF's apply-optimizer finalizer on
  W, given tau_eff * sum p_i d_i,
    next: (<S_o@SERVER, W@SERVER, N@SERVER> -> <state=S_o@SERVER,
           result=W@SERVER, measurements=<>@SERVER>).

So `build_fednova_process` has FedAvg's signature but for the aggregator's
input (`initialize: ( -> S@SERVER)`, `next: (<S@SERVER, {D*}@CLIENTS> ->
<state=S@SERVER, metrics=M@SERVER>)`, M with `distributor`,
`client_work.train`, `aggregator`, `finalizer`).

Departures, each on purpose:
* No proximal term (the official code can add FedProx's mu and then
  normalises by a different a_i): FedNova here is the paper's vanilla
  and momentum SGD case. Weight decay is not applied (the code's 1e-4 by
  default): none of our algorithms uses it.
* a_i travels with d_i through `model_aggregator`, so a clipping or noising
  aggregator clips and noises it too; the CLI offers FedNova with the plain
  mean only.
* A client whose update is not finite (or that has no data) sends zeros
  with weight 0, as TFF's FedAvg client work does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms import api
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import local_training


def _check_sgd(optimizer) -> None:
  learning_process.check_sgd(
    optimizer, "FedNova normalises SGD steps", momentum=True
  )


class NormalizedUpdate(NamedTuple):
  """A client's upload: d_i = (x - y_i) / a_i per trainable tensor, and a_i."""

  normalized: Any
  steps_norm: Any


def build_fednova_client_update(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
):
  """Layer 1: the pure `tf.function` FedNova client update.

  `client_update(optimizer, initial_weights, data, optimizer_hparams=None)`
  loads `initial_weights` (x), runs one `optimizer` step per batch of `data`
  (momentum rho from the hyperparameters, 0 without), and returns
  `(ClientResult(update=NormalizedUpdate((x - y) / a, a), update_weight),
  unfinalized metrics)` (module docstring). The update is zeros with weight
  0, and the metrics reset, if it is not finite or the client had no data.
  """
  model = model_fn()
  uniform = client_weighting is tff.learning.ClientWeighting.UNIFORM

  @tf.function
  def client_update(optimizer, initial_weights, data, optimizer_hparams=None):
    model_weights = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(
      lambda v, t: v.assign(t),
      model_weights,
      initial_weights,
      check_types=False,
    )
    trainable = tf.nest.flatten(model_weights.trainable)
    optimizer_state = optimizer.initialize(
      tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
    )
    if optimizer_hparams is not None:
      optimizer_state = optimizer.set_hparams(
        optimizer_state, optimizer_hparams
      )
    hparams = optimizer.get_hparams(optimizer_state)
    momentum = tf.cast(hparams.get("momentum", 0.0), tf.float32)

    def reduce_fn(state, batch):
      examples, counter, steps_norm, optimizer_state = state
      optimizer_state, _, count = local_training.sgd_step(
        model, trainable, optimizer, optimizer_state, batch
      )
      counter = momentum * counter + 1.0
      return examples + count, counter, steps_norm + counter, optimizer_state

    zero = tf.constant(0.0, tf.float32)
    examples, _, steps_norm, _ = local_training.fold_batches(
      data, (tf.constant(0, tf.int64), zero, zero, optimizer_state), reduce_fn
    )
    # TFF's convention: update = initial - trained, applied by the server
    # optimizer as a descent direction.
    normalized = tf.nest.map_structure(
      lambda x, y: tf.math.divide_no_nan(x - y, steps_norm),
      initial_weights.trainable,
      model_weights.trainable,
      check_types=False,
    )
    update = NormalizedUpdate(list(normalized), steps_norm)
    update, non_finite = local_training.zero_all_if_any_non_finite(update)
    weight = (
      tf.constant(1.0, tf.float32) if uniform else tf.cast(examples, tf.float32)
    )
    if non_finite > 0 or examples == 0:
      weight = zero
      model.reset_metrics()
    return (
      tff.learning.templates.ClientResult(update=update, update_weight=weight),
      model.report_local_unfinalized_metrics(),
    )

  return client_update


def build_fednova_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  optimizer: tff.learning.optimizers.Optimizer,
  metrics_aggregator=None,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
) -> tff.learning.templates.ClientWorkProcess:
  """Layers 2 and 3: FedNova's `ClientWorkProcess` (module docstring); its
  state is the client optimizer's hyperparameters, as in TFF's FedAvg."""
  _check_sgd(optimizer)
  return learning_process.build_hparams_client_work(
    model_fn,
    optimizer,
    lambda: build_fednova_client_update(model_fn, client_weighting),
    metrics_aggregator,
  )


def build_fednova_finalizer(
  optimizer: tff.learning.optimizers.Optimizer,
  weights_type: tff.Type,
) -> tff.learning.templates.FinalizerProcess:
  """FedNova's finalizer (module docstring): TFF's apply-optimizer
  finalizer given tau_eff * (sum_i p_i d_i)."""
  inner = tff.learning.templates.build_apply_optimizer_finalizer(
    optimizer, weights_type
  )
  update_type = NormalizedUpdate(
    normalized=weights_type.trainable, steps_norm=tff.TensorType(np.float32)
  )

  @tff.tensorflow.computation(update_type)
  def rescaled(mean):
    # mean = <sum_i p_i d_i, sum_i p_i a_i = tau_eff>.
    return tf.nest.map_structure(lambda d: mean.steps_norm * d, mean.normalized)

  state_type = inner.initialize.type_signature.result

  @tff.federated_computation(
    state_type,
    tff.FederatedType(weights_type, tff.SERVER),
    tff.FederatedType(update_type, tff.SERVER),
  )
  def next_fn(state, weights, mean):
    return inner.next(state, weights, tff.federated_map(rescaled, mean))

  return tff.learning.templates.FinalizerProcess(
    inner.initialize,
    next_fn,
    get_hparams_fn=inner.get_hparams,
    set_hparams_fn=inner.set_hparams,
  )


def build_fednova_process(
  model_fn: Callable[[], tf.keras.Model],
  *,
  input_spec: Any,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  model_aggregator=None,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
  metrics_fn: Optional[Callable[[], list]] = None,
) -> tff.learning.templates.LearningProcess:
  """FedNova as a measured `LearningProcess` (module docstring).

  Arguments as `fedavg.build_fedavg_process`'s; `client_optimizer_fn` must
  be `tff.learning.optimizers.build_sgdm` (with or without momentum).
  """
  _check_sgd(client_optimizer_fn)
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

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(tff_model_fn())

  weights_type = initial_model_weights_fn.type_signature.result
  client_work = build_fednova_client_work(
    tff_model_fn,
    client_optimizer_fn,
    metrics_aggregator=parts.metrics_aggregator,
    client_weighting=client_weighting,
  )
  update_type = client_work.next.type_signature.result.result.member.update
  aggregator = parts.model_aggregator.create(
    update_type, tff.TensorType(np.float32)
  )
  return tff.learning.templates.compose_learning_process(
    initial_model_weights_fn,
    parts.model_distributor,
    client_work,
    aggregator,
    build_fednova_finalizer(server_optimizer_fn, weights_type),
  )


def build_fednova(
  config, task: api.Task, client_ids=()
) -> api.FederatedAlgorithm:
  del client_ids  # Every client is alike to FedNova.
  process = build_fednova_process(
    task.model_fn,
    input_spec=task.element_spec,
    **learning_process.process_options(config),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(
      learning_rate=config.server_lr
    ),
  )
  # FedNova's client work weighs an empty client 0 (no steps to normalize).
  return learning_process.LearningProcessAlgorithm(
    "fednova", process, task, empties_weigh_zero=True
  )
