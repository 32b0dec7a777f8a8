"""FedDST (Bibikar et al., "Federated Dynamic Sparse Training: Computing Less,
Communicating Less, Yet Learning Better", AAAI 2022).

The machinery of this package with congruity_lambda = 0 (prune the smallest
magnitudes, grow the largest loss gradients: RigL's rule) and FedDST's
aggregation: this round's uploads only, masks OR-ed (its `--min-votes 0`),
then a per-layer magnitude re-prune to the target sparsity.

Timing as in FedDST's code (bibikar/feddst, `dst.py`): a client readjusts at
the end of an epoch whose cumulative index falls on its schedule
(`pruning_begin = 9`, `pruning_interval = 10` with 10 local epochs: the last
epoch of each round), i.e. at the end of local training, with the loss
gradient of the last batch recomputed after its step; here the default first
epoch is E and the interval E, so the grown weights go up at zero. It never
reads a direction map, and none is sent to it.

Decisions against FedDST's code, each so that FedDST and FedSGC differ only
in what FedSGC adds (criterion, readjust point, growth gradient, memory):

* RigL's ERK densities (`masks.erk_densities`) instead of its linearly
  scaled sparsities (which also count biases);
* the cosine prune fraction is applied, keyed on the client's cumulative
  epochs like FedSGC's (its code computes a per-round cosine value but
  prunes with the raw ratio);
* growth only among weights inactive after the pruning (its top-|gradient|
  can pick active weights and zero them); a just-pruned weight may come back
  and keeps its value, so dense layers stay dense;
* the server requests readjustment on the same rounds as for FedSGC
  (`--readjust_every`, default every round, no end): its code requests on
  0-based rounds with (r - 1) % 10 == 0 (1-based 2, 12, 22, ...) and stops at
  half the rounds;
* random initial masks at the ERK budgets (its code magnitude-prunes the
  random initial weights);
* clients weighted by examples trained (its code: two per batch), sampled
  without replacement; local SGD without momentum or L2 unless the run's
  `--client_momentum` says otherwise, for every method (its code: momentum
  0.9, L2 0.001; FedSGC's paper: vanilla SGD).

`build_feddst_process(model_fn, ...)` is the same algorithm as a
`tff.learning.templates.LearningProcess` for use in your own TFF code (its
docstring gives the type signatures and how its schedule differs: TFF's
clients are stateless, so alpha is keyed on the round).
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
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms.sparse import computations
from tff_hetero.algorithms.sparse import prune_grow
from tff_hetero.algorithms.sparse import training
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel


def build_feddst(
  config, task: api.Task, client_ids: Sequence[str] = ()
) -> training.SparseTraining:
  return training.build_sparse_training(
    "feddst",
    config,
    task,
    client_ids,
    congruity_lambda=0.0,
    memory="none",
    begin_epoch=config.local_epochs,
    growth_gradient="last_batch",
  )


class FedDSTState(NamedTuple):
  """`build_feddst_process`'s server state.

  Attributes:
    model: The global `SparseModel` (masked values, kernel masks, statistics).
    round_num: int64 rounds finished (the next round is `round_num` + 1).
  """

  model: Any
  round_num: Any


def build_feddst_process(
  model_fn: Callable[[], tf.keras.Model],
  *,
  input_spec: Any,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  total_rounds: int,
  sparsity: float = 0.8,
  prune_alpha: float = 0.2,
  readjust_every: int = 1,
  readjust_end_round: int = 0,
  prox_mu: float = 0.0,
  mask_seed: int = 0,
  model_aggregator=None,
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
  metrics_fn: Optional[Callable[[], list[tf.keras.metrics.Metric]]] = None,
) -> tff.learning.templates.LearningProcess:
  """FedDST as a `tff.learning.templates.LearningProcess`.

  The same client and server steps as `--algorithm=feddst` (the module
  docstring above), with TFF's stateless clients: each client's dataset is
  its whole local training for the round (repeat it for several epochs),
  and it readjusts its masks at the end of it in the rounds the server
  requests (1, 1 + `readjust_every`, ... up to `readjust_end_round`, 0: no
  end, and before `total_rounds`), pruning alpha_r = `prune_alpha` / 2
  (1 + cos(pi r / `total_rounds`)) of each kernel's active weights. The
  decision is made in the graph from the round counter in the state, and
  alpha is keyed on the round, as in FedDST's code; the CLI's FedDST keys
  alpha on each client's own cumulative epochs (client state, which a
  `LearningProcess` has not).

  No server optimizer and no client weighting: the server takes the union
  average weighted by each upload's examples and re-prunes, as FedDST's
  code does.

  With S = `FedDSTState` and D one batch of `input_spec`:

    initialize:        ( -> S@SERVER)
    next:              (<S@SERVER, {D*}@CLIENTS> ->
                        <state=S@SERVER, metrics=M@SERVER>)
    get_model_weights: (S -> ModelWeights of `model_fn()`)
    set_model_weights: (<S, ModelWeights> -> S)  (kernels re-masked)

  M = <round=<bytes_down, clients> (the round number sent), sparse=<
  distributor=<bytes_down, clients>, train=<metrics=<
  sparse_categorical_accuracy, loss, num_examples, num_batches>,
  uploaded_bytes>, readjust=`prune_grow.ReadjustCounts` summed over
  clients, upload_bytes=int64, density=<float32 per kernel> after the
  server's re-prune, direction_informed=float32>>, every byte count
  measured on the tensors sent (`train`'s metrics are `metrics_fn`'s). A
  round in which no client sends anything keeps the
  model. Batch-norm statistics stay those of `model_fn()` (the server does
  not aggregate them; the CLI recalibrates them for evaluation): use a
  model without batch norm, or recalibrate before evaluating.

  Args:
    model_fn: No-arg callable returning a fresh, identically initialised
      `tf.keras.Model` (logits out); its Dense and Conv kernels are masked.
    input_spec: Spec of one batch of client data.
    client_optimizer_fn: The clients' `tff.learning.optimizers.Optimizer`.
    total_rounds: The rounds the run will have (the cosine's end).
    sparsity: Fraction of kernel weights masked (ERK over the kernels).
    prune_alpha: alpha of the cosine schedule (0: masks never change).
    readjust_every: Rounds between two requests (0: never).
    readjust_end_round: The last round the server requests (0: no limit).
    prox_mu: FedProx strength of the local objective (FedDST mu = 1: 1.0).
    mask_seed: Seeds the random initial masks.
    model_aggregator: An unweighted-sum-based factory forming the masked
      sums (default `tff_hetero.aggregators.MaskedSumFactory()`).
    loss_fn / metrics_fn: No-arg factories of the training loss (which the
      growth gradients use too) and the metrics (None: cross-entropy on
      logits against integer labels, and accuracy).
  """
  learning_process.check_optimizer("client_optimizer_fn", client_optimizer_fn)
  if not callable(model_fn):
    raise TypeError(
      "model_fn must be a no-arg callable returning a tf.keras.Model,"
      f" got {type(model_fn).__name__}"
    )
  if int(total_rounds) < 1:
    raise ValueError(f"total_rounds must be >= 1, got {total_rounds}")

  def keras_fn():
    return masks_lib.prune_wrap(model_fn())

  wrapped = keras_fn()
  layout = masks_lib.MaskLayout.of(wrapped)
  keep = training.erk_keep(layout, sparsity)
  initial = training.initial_sparse_model(
    layout, wrapped, masks_lib.random_masks(layout.shapes, keep, mask_seed)
  )
  schedule = prune_grow.ReadjustSchedule(
    alpha=prune_alpha,
    delta_epochs=1,
    begin_epoch=1,
    end_epoch=int(total_rounds),
    request_every=readjust_every,
    request_end_round=readjust_end_round,
  )
  rounds = computations.SparseRounds(
    keras_fn,
    input_spec,
    initial,
    keep,
    client_optimizer_fn,
    prox_mu=prox_mu,
    local_epochs=1,
    schedule=schedule,
    congruity_lambda=0.0,
    memory="none",
    model_aggregator=model_aggregator,
    growth_gradient="last_batch",
    loss_fn=loss_fn,
    metrics_fn=metrics_fn,
  )
  body = rounds.round_body(computations.BY_ROUND)
  model_type = rounds.model_type
  state_type = learning_process.type_of(
    FedDSTState(initial, tf.TensorSpec([], tf.int64))
  )
  plain_weights_type = learning_process.type_of(
    tff.learning.models.ModelWeights(
      trainable=list(initial.trainable),
      non_trainable=list(initial.statistics),
    )
  )
  round_distributor = tff_measure.build_measured_broadcast_process(
    tff.TensorType(np.int64)
  )

  @tff.tensorflow.computation
  def initial_state():
    return FedDSTState(
      model=tf.nest.map_structure(tf.constant, initial),
      round_num=tf.constant(0, tf.int64),
    )

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_eval(initial_state, tff.SERVER)

  @tff.tensorflow.computation(state_type)
  def model_of(state):
    return state.model

  @tff.tensorflow.computation(state_type)
  def next_round_of(state):
    return state.round_num + 1

  @tff.tensorflow.computation(model_type, np.int64)
  def make_state(model, round_num):
    return FedDSTState(model=model, round_num=round_num)

  @tff.federated_computation(
    tff.FederatedType(state_type, tff.SERVER),
    tff.FederatedType(rounds.data_type, tff.CLIENTS),
  )
  def next_fn(state, data):
    model = tff.federated_map(model_of, state)
    round_num = tff.federated_map(next_round_of, state)
    sent = round_distributor.next(round_distributor.initialize(), round_num)
    new_model, _, _, _, measurements = body(
      model, None, None, sent.result, data, None
    )
    metrics = tff.federated_zip(
      collections.OrderedDict(round=sent.measurements, sparse=measurements)
    )
    return tff.learning.templates.LearningProcessOutput(
      state=tff.federated_map(make_state, (new_model, round_num)),
      metrics=metrics,
    )

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return tff.learning.models.ModelWeights(
      trainable=list(state.model.trainable),
      non_trainable=list(state.model.statistics),
    )

  @tff.tensorflow.computation(state_type, plain_weights_type)
  def set_model_weights(state, weights):
    trainable = list(weights.trainable)
    for j, kernel in enumerate(layout.kernels):
      i = kernel.trainable_index
      trainable[i] = trainable[i] * state.model.masks[j]
    return FedDSTState(
      model=SparseModel(
        trainable=trainable,
        masks=list(state.model.masks),
        statistics=list(weights.non_trainable),
      ),
      round_num=state.round_num,
    )

  return tff.learning.templates.LearningProcess(
    initialize_fn, next_fn, get_model_weights, set_model_weights
  )
