"""One local SGD step on a `tff.learning.models.VariableModel`, shared by every
algorithm of ours whose clients train the task's loss: FedProx and the width
algorithms (`fedprox.build_proximal_client_update`), FedNova
(`fednova.build_fednova_client_update`), SCAFFOLD
(`scaffold.build_scaffold_client_update`) and the sparse ones
(`sparse.client_update.MaskedTraining`, masks applied through `transform`
and `project`; PruneFL's and GraSP's one-client passes too). FedAvg and
FedAdam run TFF's own client work, with the same loop;
`fold_batches`, the loop those clients run `sgd_step` in;
`corrected_sgd_pass` and `option_two_control_delta`, SCAFFOLD's corrected
local pass and control-variate update (SCAFFOLD's and SPATL's clients); and
`zero_all_if_any_non_finite`, how those clients drop a diverged update (as
TFF's FedAvg client work does).

`sgd_step` is plain TensorFlow, to be called inside a `tf.function`:

    g_i = dL(batch)/dw_i + prox_mu * (w_i - anchor_i)     (prox_mu > 0 only)
    g_i = transform(i, g_i)                                (if given)
    optimizer_state, w = optimizer.next(optimizer_state, w, g)
    w_i = project(i, w_i)                                  (if given)

and returns the new optimizer state, the raw loss gradients (before the
proximal term and the transform: what FedSGC's and PruneFL's importance
scores read) and the batch's example count. The proximal term is FedProx's
(Li et al., MLSys 2020): the gradient of prox_mu / 2 * ||w - w_t||^2.
FedGKT and split learning train a distillation loss and a model cut in two;
they keep their own steps (`fedgkt_steps.py`, `split_learning.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff


@tf.autograph.experimental.do_not_convert
def sgd_step(
  model: tff.learning.models.VariableModel,
  trainable: Sequence[tf.Variable],
  optimizer: tff.learning.optimizers.Optimizer,
  optimizer_state,
  batch,
  *,
  anchor: Optional[Sequence[tf.Tensor]] = None,
  prox_mu: float = 0.0,
  transform: Optional[Callable[[int, tf.Tensor], tf.Tensor]] = None,
  project: Optional[Callable[[int, tf.Tensor], tf.Tensor]] = None,
):
  """One optimizer step on `batch` (module docstring).

  Args:
    model: the model whose `forward_pass(batch, training=True)` gives the loss.
    trainable: its trainable variables, flat, in the optimizer's order.
    optimizer: a `tff.learning.optimizers.Optimizer`.
    optimizer_state: its state.
    batch: one batch of the client's data.
    anchor: w_t, one tensor per trainable variable; needed when prox_mu is
      not 0.
    prox_mu: FedProx's mu (a Python float: 0 adds no term to the graph).
    transform: `(index, gradient) -> gradient`, applied last.
    project: `(index, new value) -> value`, applied to the optimizer's new
      values before they are assigned.

  Returns:
    (optimizer state, raw loss gradients (list), examples in the batch
    (int64)).

  Not converted by AutoGraph (nor is what it calls): `optimizer`,
  `transform` and `project` must be graph code, with `tf.cond` rather than
  a Python `if` on a tensor, as TFF's optimizers are. The model's
  `forward_pass` converts itself (a `tf.function` in TFF's Keras model, an
  AutoGraph-converted function in ours, `model_fns`).
  """
  trainable = list(trainable)
  if prox_mu and anchor is None:
    raise ValueError(
      "sgd_step: a prox_mu other than 0 needs the anchor weights"
    )
  with tf.GradientTape() as tape:
    output = model.forward_pass(batch, training=True)
  raw = tape.gradient(output.loss, trainable)
  gradients = []
  for i, (g, w) in enumerate(zip(raw, trainable)):
    if prox_mu:
      g = g + prox_mu * (w - anchor[i])
    if transform is not None:
      g = transform(i, g)
    gradients.append(g)
  optimizer_state, updated = optimizer.next(
    optimizer_state, tuple(trainable), tuple(gradients)
  )
  for i, (variable, value) in enumerate(zip(trainable, updated)):
    variable.assign(value if project is None else project(i, value))
  if output.num_examples is None:
    count = tf.shape(output.predictions, out_type=tf.int64)[0]
  else:
    count = tf.cast(output.num_examples, tf.int64)
  return optimizer_state, list(raw), count


@tf.autograph.experimental.do_not_convert
def fold_batches(data: tf.data.Dataset, initial_state, fn):
  """`data.reduce(initial_state, fn)`, as a loop over `iter(data)`.

  Call it inside a `tf.function`: a `tf.while_loop` whose loop variables
  are the state and the iterator's next element as an optional, the loop
  TFF's `LoopImplementation.DATASET_ITERATOR` gets from AutoGraph, with the
  body outside AutoGraph's `tf.cond` on `has_value` (the optional is the
  loop's condition instead). The same steps run; the traced graph nests
  one function less, so tracing it takes less time. The state must keep
  its structure, dtypes and shapes from one batch to the next. This
  function is not converted by AutoGraph: `fn` runs as it is given, so a
  `fn` defined inside a converted `tf.function` (every caller's here) is
  converted with it, and any other must be graph code (a Python `if` on a
  tensor raises `OperatorNotAllowedInGraphError` when traced).

  Why not `Dataset.reduce`: its `fn` runs as a tf.data function, and on
  the TFF worker (a TensorFlow session) a Keras model called there through
  a nested `tf.function` (TFF's own `VariableModel.forward_pass` is one;
  since 2026-11-29 ours is not, `model_fns`) trains much slower, with
  results further from eager TensorFlow's. Measured with
  `python tools/client_loop_ablation.py` (10 clients x 20 SGD steps of
  `mnist_cnn_feddst` on one worker, median of 5 rounds; 2026-11-26): 6.28 s
  with `reduce`, 3.29 s with this loop; client 0's weights within 7.2e-5
  and 1.9e-6 of eager TensorFlow's. (Calling the Keras model directly:
  2.18 s and 2.46 s.)
  """
  iterator = iter(data)

  def has_batch(batch, state):
    del state
    return batch.has_value()

  def step(batch, state):
    state = fn(state, batch.get_value())
    return iterator.get_next_as_optional(), state

  _, state = tf.while_loop(
    has_batch, step, (iterator.get_next_as_optional(), initial_state)
  )
  return state


def corrected_sgd_pass(
  model: tff.learning.models.VariableModel,
  trainable: Sequence[tf.Variable],
  optimizer: tff.learning.optimizers.Optimizer,
  data: tf.data.Dataset,
  correction: Mapping[int, tf.Tensor],
):
  """SCAFFOLD's local pass: SGD over `data` with g_i + correction[i].

  The gradient of trainable variable i is corrected by `correction[i]`
  (c - c_i for SCAFFOLD, c_g - c_l for SPATL's encoder, Eq. 9); variables
  without an entry train on their plain gradient. The optimizer starts from
  its initial state. Call inside a `tf.function`.

  Returns:
    (examples (int64), steps K (int64), the optimizer's learning rate eta_l
    (float32)): what `option_two_control_delta` needs.
  """
  trainable = list(trainable)
  optimizer_state = optimizer.initialize(
    tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
  )
  learning_rate = tf.cast(
    optimizer.get_hparams(optimizer_state)["learning_rate"], tf.float32
  )

  def corrected(i, g):
    return g + correction[i] if i in correction else g

  def step(state, batch):
    examples, steps, optimizer_state = state
    optimizer_state, _, count = sgd_step(
      model, trainable, optimizer, optimizer_state, batch, transform=corrected
    )
    return examples + count, steps + 1, optimizer_state

  examples, steps, _ = fold_batches(
    data,
    (tf.constant(0, tf.int64), tf.constant(0, tf.int64), optimizer_state),
    step,
  )
  return examples, steps, learning_rate


def option_two_control_delta(update, control, steps, learning_rate):
  """SCAFFOLD's option II, as the change c_i+ - c_i = (x - y) / (K eta_l) - c.

  `update` is x - y (TFF's sign: initial minus trained), `control` is c; a
  client with K = 0 steps keeps its variate (zero change).
  """
  scale = tf.math.divide_no_nan(1.0, tf.cast(steps, tf.float32) * learning_rate)
  return [
    tf.where(steps > 0, u * scale - c, tf.zeros_like(c))
    for u, c in zip(update, control)
  ]


@tf.autograph.experimental.do_not_convert
def all_finite(structure) -> tf.Tensor:
  """A bool scalar: whether every floating-point entry of `structure` is
  finite (integer leaves, e.g. optimizer step counts, are skipped)."""
  flat = [
    t for t in tf.nest.flatten(structure) if tf.as_dtype(t.dtype).is_floating
  ]
  if not flat:
    return tf.constant(True)
  return tf.reduce_all(
    tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in flat])
  )


@tf.autograph.experimental.do_not_convert
def zero_all_if_any_non_finite(structure):
  """`(structure, 0)` if all entries are finite, else `(zeros, 1)` (as TFF).

  Each leaf is selected on the one scalar (`tf.where`) rather than the
  whole structure passing through a `tf.cond`, as TFF's does: the values
  are the same, and a `tf.cond` over a model's hundreds of leaves took
  about 0.9 s to trace for the 12-block transformer (docs/performance.md,
  "Cold start: tracing, and Grappler once")."""
  if not tf.nest.flatten(structure):
    return structure, tf.constant(0)
  finite = all_finite(structure)
  # A scalar zero, broadcast: `zeros_like` would be a model-sized buffer
  # that the worker could fill before the client's loop and hold through it.
  return (
    tf.nest.map_structure(
      lambda t: tf.where(finite, t, tf.zeros([], t.dtype)), structure
    ),
    tf.where(finite, tf.constant(0), tf.constant(1)),
  )
