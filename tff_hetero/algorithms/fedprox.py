"""FedProx (Li et al., 2020, "Federated Optimization in Heterogeneous
Networks", MLSys 2020, https://arxiv.org/abs/1812.06127).

Each client approximately minimises, from the global model `w_t` it received,

  h(w; w_t) = F_k(w) + prox_mu / 2 * ||w - w_t||^2

by local SGD, whose gradient is `grad F_k(w) + prox_mu * (w - w_t)`: the
proximal term pulls the client back towards `w_t`. The server then applies the
example-weighted mean of the client deltas, exactly as in FedAvg.

The process is assembled from TFF's own parts with
`tff.learning.templates.compose_learning_process`:

* initial weights: `tff.tensorflow.computation` `( -> W)` building the task's
  model, `W = tff.learning.models.ModelWeights` of the task.
* distributor: our measuring broadcast
  (`tff_measure.build_measured_broadcast_process`),
    next: (<()@SERVER, W@SERVER> -> <state=()@SERVER, result=W@CLIENTS,
           measurements=<bytes_down=int64, clients=int64>@SERVER>)
* client work: OURS, `build_proximal_client_work` (below), in the three layers
  of TFF's `model_delta_client_work.py`:
    1. `build_proximal_client_update(model_fn, prox_mu)`: a pure `tf.function`
       `client_update(optimizer, initial_weights, data, hparams)` ->
       `(ClientResult(update=w_t.trainable - w.trainable,
                      update_weight=float32 num_examples), unfinalized metrics)`;
    2. `client_update_computation`, a typed `tff.tensorflow.computation`
         (<H, W, D*> -> <ClientResult<update=T, update_weight=float32>, U>)
       with `H` the client optimizer's hyperparameters
       (`<learning_rate=float32>` for `build_sgdm` without momentum), `D` one
       batch `<x=float32[?,...], y=int32[?]>`, `T = W.trainable`, `U` the
       model's unfinalized metrics;
    3. a thin `tff.federated_computation`
         next: (<H@SERVER, W@CLIENTS, {D*}@CLIENTS> ->
                <state=H@SERVER, result=ClientResult<T, float32>@CLIENTS,
                 measurements=<train=<metrics=M, uploaded_bytes=int64>>@SERVER>)
       where `<metrics=M, uploaded_bytes=int64>` comes from
       `tff_measure.measured_metrics_aggregator()`.
     Its state is the client optimizer's hyperparameters, as in FedAvg's client
     work, so `process.get_hparams` / `set_hparams` behave as FedAvg's.
* aggregator: `tff_measure.MeasuredUploadFactory` around TFF's weighted mean
  (clients weighted by their number of examples),
    next: (<S_a@SERVER, T@CLIENTS, float32@CLIENTS> -> <state=S_a@SERVER,
           result=T@SERVER, measurements=<inner, bytes_up, clients>@SERVER>)
* finalizer: TFF's `build_apply_optimizer_finalizer` with server SGD at
  `server_lr`: `w_{t+1} = w_t - server_lr * mean(update)`, so `server_lr=1`
  makes the new global model the weighted mean of the client models.

`build_fedprox_process` therefore has exactly FedAvg's signature (see
`fedavg.py`):

  initialize: ( -> S@SERVER)
  next:       (<S@SERVER, {D*}@CLIENTS> -> <state=S@SERVER, metrics=M'@SERVER>)

with `M'` structurally identical to FedAvg's measured metrics
(`distributor`, `client_work.train.<metrics, uploaded_bytes>`, `aggregator`,
`finalizer`), which `learning_process.LearningProcessAlgorithm` reads.

Deviation from TFF 0.87's `tff.learning.algorithms.build_weighted_fed_prox`:
its client work (`templates/proximal_client_work.py`, both the VariableModel
path, ~l.88-94, and the FunctionalModel path, ~l.200-206) adds

  proximal_term = delta_l2_regularizer * (initial - current)

to the loss gradient, i.e. the gradient of `-mu/2 ||w - w_t||^2`: the opposite
sign of the paper's term. Each SGD step then computes
`w - lr * (g - mu * (w - w_t))`, multiplying the distance to the global model by
`(1 + lr * mu)` per step instead of `(1 - lr * mu)` (for a constant loss
gradient `g`, `w_k - w_t = (g / mu) * (1 - (1 + lr * mu)^k)` instead of
`-(g / mu) * (1 - (1 - lr * mu)^k)`): for any mu > 0 clients are pushed AWAY
from the global model, geometrically in the number of local steps (measured:
squared distance of the new global model to the old one 1853 with mu=2,
lr=0.1 and ten local epochs on a 16-parameter model, vs 1.18 with mu=0). This
module adds `+ prox_mu * (w - w_t)` instead, as in Li et al. (Algorithm 2).
Two smaller differences from TFF's FedProx client work, both to match TFF's
FedAvg client work (`model_delta_client_work.py`): its state is the client
optimizer's hyperparameters (TFF's FedProx has `()` and ignores `set_hparams`),
and a client with a non-finite delta also has its metrics reset. Everything
else (SGD client optimizer, delta convention `update = w_t - w`, non-finite
deltas zeroed with weight 0, example weighting, server optimizer step) is
TFF's FedAvg, so with `prox_mu=0` (the added term is then exactly zero) the
process computes TFF's FedAvg given the same client loop
(`LoopImplementation.DATASET_ITERATOR`, our `local_training.fold_batches`;
TFF's default loop, `Dataset.reduce`, computes the same steps with other
rounding on the worker).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms import api
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import local_training
from tff_hetero.settings import AlgorithmSettings
from tff_hetero.settings import non_negative_float
from tff_hetero.settings import optional
from tff_hetero.settings import setting

# `--prox_mu` when not given: FedProx's own default here; other algorithms
# that accept a proximal term (FedDST, FedSGC) default to none.
DEFAULT_PROX_MU = 0.01


def build_proximal_client_update(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  prox_mu: float,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
):
  """Layer 1: the pure `tf.function` FedProx client update.

  Builds the model (its variables) once; the returned
  `client_update(optimizer, initial_weights, data, optimizer_hparams=None)`
  loads `initial_weights` (= `w_t`), runs one `optimizer` step per batch of
  `data` on the gradient `grad loss(w) + prox_mu * (w - w_t)` of the trainable
  weights, and returns

    (ClientResult(update=w_t.trainable - w.trainable,
                  update_weight=float32(num_examples), or 1 with
                  `client_weighting=UNIFORM`),
     model.report_local_unfinalized_metrics())

  The update is zeroed, and its weight and the metrics reset, if any entry of
  it is not finite, like TFF's FedAvg client work.
  """
  model = model_fn()
  prox_mu = float(prox_mu)
  uniform = client_weighting is tff.learning.ClientWeighting.UNIFORM

  # Graph code throughout (its one branch on a tensor is a `tf.cond`), not
  # converted by AutoGraph; of what it calls only the model's `forward_pass`
  # converts itself (`local_training.sgd_step`).
  @tf.function(autograph=False)
  def client_update(optimizer, initial_weights, data, optimizer_hparams=None):
    model_weights = tff.learning.models.ModelWeights.from_model(model)
    # Lists in the model, tuples or lists in the argument: same values.
    tf.nest.map_structure(
      lambda v, t: v.assign(t),
      model_weights,
      initial_weights,
      check_types=False,
    )
    global_trainable = tuple(tf.nest.flatten(initial_weights.trainable))

    def reduce_fn(state, batch):
      num_examples_sum, optimizer_state = state
      # d/dw [mu/2 ||w - w_t||^2] = mu * (w - w_t): towards the global model.
      optimizer_state, _, count = local_training.sgd_step(
        model,
        tf.nest.flatten(model_weights.trainable),
        optimizer,
        optimizer_state,
        batch,
        anchor=global_trainable,
        prox_mu=prox_mu,
      )
      return num_examples_sum + count, optimizer_state

    specs = tuple(
      tf.TensorSpec(v.shape, v.dtype)
      for v in tf.nest.flatten(model_weights.trainable)
    )
    optimizer_state = optimizer.initialize(specs)
    if optimizer_hparams is not None:
      optimizer_state = optimizer.set_hparams(
        optimizer_state, optimizer_hparams
      )
    num_examples, _ = local_training.fold_batches(
      data, (tf.zeros([], tf.int64), optimizer_state), reduce_fn
    )

    # TFF's convention: update = initial - trained, which the server optimizer
    # applies as `w_t - server_lr * mean(update)`.
    update = tf.nest.map_structure(
      tf.subtract,
      initial_weights.trainable,
      model_weights.trainable,
      check_types=False,
    )
    update, non_finite = local_training.zero_all_if_any_non_finite(update)
    if uniform:  # A Python bool: chosen when the function is traced.
      finite_weight = tf.constant(1.0, tf.float32)
    else:
      finite_weight = tf.cast(num_examples, tf.float32)

    def dropped():
      model.reset_metrics()
      return tf.constant(0.0, tf.float32)

    weight = tf.cond(non_finite > 0, dropped, lambda: finite_weight)
    return (
      tff.learning.templates.ClientResult(update=update, update_weight=weight),
      model.report_local_unfinalized_metrics(),
    )

  return client_update


def build_proximal_client_work(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  optimizer: tff.learning.optimizers.Optimizer,
  prox_mu: float,
  metrics_aggregator=None,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
) -> tff.learning.templates.ClientWorkProcess:
  """Layers 2 and 3: the FedProx `ClientWorkProcess` (see module docstring).

  Clients are weighted by their number of examples, or each by 1 with
  `client_weighting=UNIFORM` (an unweighted aggregator, e.g. DP).
  `metrics_aggregator`
  defaults to `tff.learning.metrics.sum_then_finalize`.
  """
  prox_mu = float(prox_mu)
  if not np.isfinite(prox_mu) or prox_mu < 0.0:
    raise ValueError(f"prox_mu must be finite and >= 0, got {prox_mu}")
  return learning_process.build_hparams_client_work(
    model_fn,
    optimizer,
    lambda: build_proximal_client_update(model_fn, prox_mu, client_weighting),
    metrics_aggregator,
  )


def build_fedprox_process(
  model_fn: Callable[[], tf.keras.Model],
  *,
  input_spec: Any,
  prox_mu: float,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  model_aggregator=None,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
  metrics_fn: Optional[Callable[[], list]] = None,
) -> tff.learning.templates.LearningProcess:
  """FedProx as a measured `LearningProcess` (module docstring).

  Arguments as `fedavg.build_fedavg_process`'s, plus `prox_mu` (>= 0).
  """
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
  client_work = build_proximal_client_work(
    tff_model_fn,
    client_optimizer_fn,
    prox_mu,
    metrics_aggregator=parts.metrics_aggregator,
    client_weighting=client_weighting,
  )
  aggregator = parts.model_aggregator.create(
    weights_type.trainable, tff.TensorType(np.float32)
  )
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
    server_optimizer_fn, weights_type
  )
  return tff.learning.templates.compose_learning_process(
    initial_model_weights_fn,
    parts.model_distributor,
    client_work,
    aggregator,
    finalizer,
  )


def prox_mu_setting():
  """`--prox_mu`, read by FedProx and by the sparse-training algorithms."""
  return setting(
    None,
    "Proximal strength (FedProx: default 0.01; the sparse-training"
    " algorithms: default 0).",
    kind=float,
    check=optional(non_negative_float),
  )


@attrs.frozen(kw_only=True)
class FedProxSettings(AlgorithmSettings):
  prox_mu: float | None = prox_mu_setting()


def build_fedprox(
  config, task: api.Task, client_ids=()
) -> api.FederatedAlgorithm:
  del client_ids  # Every client is alike to fedprox.
  prox_mu = config.settings.prox_mu
  prox_mu = DEFAULT_PROX_MU if prox_mu is None else prox_mu
  options = learning_process.process_options(config)
  process = build_fedprox_process(
    task.model_fn,
    input_spec=task.element_spec,
    prox_mu=prox_mu,
    **options,
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(
      learning_rate=config.server_lr
    ),
  )
  return learning_process.LearningProcessAlgorithm.of_options(
    "fedprox", process, task, options
  )
