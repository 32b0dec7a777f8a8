"""Pruning on one client before federated sparse training (GraSP, PruneFL).

PruneFL (Jiang et al. 2022) prunes the initial model on one client before
training starts; GraSP (Wang et al. 2020), a pruning-at-initialisation
method, is brought to FL the same way (FedDST's code runs it on one client's
data). `OneClientPruning` is the `SparseTraining` whose first round starts
with that step on the first client of the cohort that has data (the
program's seeded sampling picks it; a round 1 whose clients have none is
refused, `ValueError`: there is nothing to prune on):

    prune: (<S@SERVER, {D*}@CLIENTS> -> <S@SERVER, int64@SERVER, int64@SERVER>)

over a cohort of one: the server sends the dense initial model (measured:
every trainable value and statistic, 4 bytes each), the client returns the
pruned model (`client_fn`: its masks, and its values when it trained them;
measured: bit masks, plus the kept values and dense tensors when sent), and
the two byte counts. The round then trains every cohort client on the pruned
model as usual; the first client's traffic and compute include the step.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import ClientTraffic
from tff_hetero.accounting import payload
from tff_hetero.algorithms import api
from tff_hetero.algorithms.sparse import computations
from tff_hetero.algorithms.sparse import prune_grow
from tff_hetero.algorithms.sparse import training
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel


def load(model, layout: masks_lib.MaskLayout, received: SparseModel) -> None:
  """Assigns `received` to a wrapped `VariableModel`'s weights (TF)."""
  weights = tff.learning.models.ModelWeights.from_model(model)
  tf.nest.map_structure(
    lambda v, t: v.assign(t),
    weights,
    layout.to_model_weights(received),
    check_types=False,
  )


def global_top_k_masks(scores: Sequence[tf.Tensor], count) -> list:
  """0/1 masks of the `count` largest scores over all kernels together."""
  flat = tf.concat([tf.reshape(s, [-1]) for s in scores], axis=0)
  chosen = masks_lib.top_k_mask(flat, count, tf.ones_like(flat, tf.bool))
  sizes = [int(np.prod(s.shape)) for s in scores]
  return [
    tf.reshape(part, s.shape)
    for part, s in zip(tf.split(chosen, sizes), scores)
  ]


class OneClientPruning(training.SparseTraining, abc.ABC):
  """`SparseTraining` whose round 1 first prunes on one client (module doc).

  Subclasses give `client_fn` and whether the client sends values.
  """

  send_values: bool = False

  @classmethod
  def from_settings(
    cls,
    name: str,
    task: api.Task,
    client_ids: Sequence,
    settings,
    client_optimizer,
    local_epochs: int,
    seed: int,
    **extra,
  ):
    """The algorithm from its `SparseSettings` (and `extra` keyword
    arguments of its own): clients never readjust and the server remembers
    nothing."""
    return cls(
      name,
      task,
      client_ids,
      sparsity=settings.sparsity,
      schedule=prune_grow.ReadjustSchedule(
        alpha=0.0, delta_epochs=1, begin_epoch=1, end_epoch=1, request_every=0
      ),
      congruity_lambda=0.0,
      memory="none",
      client_optimizer=client_optimizer,
      prox_mu=settings.prox_mu or 0.0,
      local_epochs=local_epochs,
      seed=seed,
      **extra,
    )

  def server_budgets(self) -> list[int]:
    """No per-kernel re-prune: the masks are the pruning's, allotted over
    kernels by its scores (the union of identical masks is that mask)."""
    return [kernel.size for kernel in self.layout.kernels]

  def initial_masks(self, seed: int) -> list[np.ndarray]:
    """Dense until the first client prunes."""
    del seed
    return [np.ones(shape, np.float32) for shape in self.layout.shapes]

  @abc.abstractmethod
  def client_fn(self, model_fn, received: SparseModel, data):
    """TF: (trainable values, kernel masks) the pruning client returns;
    `model_fn` builds the wrapped `tff.learning.models.VariableModel`
    (`computations.SparseRounds.model_fn`)."""

  def setup_computations(self) -> dict:
    return {"initial_pruning": self.pruning_computation()}

  def pruning_computation(self) -> tff.Computation:
    if getattr(self, "_pruning", None) is not None:
      return self._pruning
    rounds, layout = self.rounds, self.layout
    model_fn, send_values = rounds.model_fn, self.send_values

    @tff.tensorflow.computation(rounds.model_type, rounds.data_type)
    def client_work(received, data):
      received = SparseModel(*received)
      trainable, masks = self.client_fn(model_fn, received, data)
      masks = [tf.cast(m, tf.float32) for m in masks]
      for j, kernel in enumerate(layout.kernels):
        trainable[kernel.trainable_index] = (
          trainable[kernel.trainable_index] * masks[j]
        )
      nbytes = tf.add_n(
        [tf.constant(0, tf.int64)]
        + [tf.constant((k.size + 7) // 8, tf.int64) for k in layout.kernels]
      )
      if send_values:
        masked = {k.trainable_index for k in layout.kernels}
        nbytes += tf.add_n(
          [tf.constant(0, tf.int64)]
          + [tf.math.count_nonzero(m, dtype=tf.int64) * 4 for m in masks]
        )
        nbytes += payload.tf_dense_nbytes(
          [v for i, v in enumerate(trainable) if i not in masked]
        )
      else:
        trainable = [
          t * m
          for t, m in zip(
            received.trainable,
            computations.full_masks(layout, received.trainable, masks),
          )
        ]
      return (SparseModel(trainable, masks, list(received.statistics)), nbytes)

    @tff.tensorflow.computation(rounds.model_type)
    def dense_nbytes(model):
      model = SparseModel(*model)
      return payload.tf_dense_nbytes(
        [list(model.trainable), list(model.statistics)]
      )

    @tff.federated_computation(
      tff.FederatedType(rounds.model_type, tff.SERVER),
      tff.FederatedType(rounds.data_type, tff.CLIENTS),
    )
    def prune(model, data):
      received = tff.federated_broadcast(model)
      pruned, nbytes = tff.federated_map(client_work, (received, data))
      # One client: the sum over the cohort is its model and its bytes.
      return (
        tff.federated_sum(pruned),
        tff.federated_sum(tff.federated_map(dense_nbytes, received)),
        tff.federated_sum(nbytes),
      )

    self._pruning = prune
    return prune

  def prepare_round(
    self, state, round_num: int, clients: Sequence[api.ClientRound]
  ):
    if round_num != 1:
      return state, {}
    with_data = [c for c in clients if c.num_examples > 0]
    if not with_data:
      raise ValueError(
        f"{self.name}: round 1 prunes the model on a client's data, and"
        f" none of its {len(clients)} clients has any"
      )
    first = with_data[0]
    model, down, up = self.pruning_computation()(state.model, [first.dataset])
    model = SparseModel(*model)
    extra = ClientTraffic(
      client_id=first.client_id,
      bytes_down=int(down),
      bytes_up=int(up),
      flops=self.pruning_flops(first),
      examples=self.pruning_examples(first),
    )
    return state._replace(model=model), {first.client_id: extra}

  def pruning_examples(self, client: api.ClientRound) -> int:
    """Examples the pruning client processes."""
    return client.num_examples

  def pruning_flops(self, client: api.ClientRound) -> int:
    return self.pruning_examples(client) * self._flops_per_example
