"""Static batch normalisation (HeteroFL's sBN) as a federated statistics query.

HeteroFL (Diao et al., ICLR 2021, Section 3.2 "Static Batch Normalization")
trains with batch normalisation that tracks no running statistics: every
forward pass, in training and on the clients, normalises with the statistics
of its own batch. Before a model is evaluated, its running statistics are
computed once from the training data, each BN layer's mean and variance being
the cumulative average of the batch statistics it sees in a training-mode pass
(HeteroFL's code: `momentum=None`, `track_running_stats=True` on a copy, run
over the training set). AdaptiveFL's reference code also trains with
`track_running_stats=False`, so every width-heterogeneous algorithm here uses
this: the server never aggregates running statistics, and sub-models of any
width get statistics that match their own activations.

Deviation: HeteroFL's code reads the central training set on the server; here
the statistics come from the clients, as a federated computation over their
training data (the same examples), and only per-channel sums travel.

`build_statistics_query(keras_model_fn, element_spec)` returns, for a model
with batch normalisation, the federated computation

    (<W@SERVER, {D*}@CLIENTS> -> W@SERVER)

with `W` the model's `tff.learning.models.ModelWeights` and `D` one batch
`<x=float32[?,...], y=int32[?]>`: the weights with every BN layer's moving
mean and variance replaced by the example-weighted average, over all clients'
batches, of the batch mean and (biased) batch variance of that layer's input
in a training-mode forward pass. Its client step is the `tff.tensorflow
.computation`

    (<W, D*> -> <count=float32, mean_sums=<float32[c_1], ...>,
                 var_sums=<float32[c_1], ...>>)

(sums over batches of batch size x batch statistic; the batch variance is
the unbiased one over the batch's positions, as PyTorch accumulates it). For
a model without batch normalisation it returns None.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
import functools
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def batch_norm_layers(model: tf.keras.Model) -> list[tf.keras.layers.Layer]:
  """The model's BatchNormalization layers, in forward order."""
  return [
    layer
    for layer in model.layers
    if isinstance(layer, tf.keras.layers.BatchNormalization)
  ]


def _moving_indices(model: tf.keras.Model, layers) -> list[tuple[int, int]]:
  """(index of moving_mean, index of moving_variance) in non_trainable weights."""
  positions = {id(v): i for i, v in enumerate(model.non_trainable_weights)}
  return [
    (positions[id(layer.moving_mean)], positions[id(layer.moving_variance)])
    for layer in layers
  ]


def build_client_statistics_fn(model: tf.keras.Model):
  """Layer 1: a `tf.function(weights, dataset) -> sums` over a built model."""
  layers = batch_norm_layers(model)
  probe = tf.keras.Model(model.inputs, [layer.input for layer in layers])

  @tf.function
  def client_statistics(weights, dataset):
    tf.nest.map_structure(
      lambda v, t: v.assign(t),
      tff.learning.models.ModelWeights.from_model(model),
      weights,
      check_types=False,
    )
    # Tuples, not lists: tf.data would stack a list into one tensor.
    zeros = tuple(
      tf.zeros([layer.input.shape[-1]], tf.float32) for layer in layers
    )

    def accumulate(state, batch):
      count, mean_sums, var_sums = state
      activations = probe(batch["x"], training=True)
      if len(layers) == 1:
        activations = [activations]
      n = tf.cast(tf.shape(batch["x"])[0], tf.float32)
      new_means, new_vars = [], []
      for a, m_sum, v_sum in zip(activations, mean_sums, var_sums):
        axes = list(range(len(a.shape) - 1))
        mean, variance = tf.nn.moments(a, axes=axes)
        # Unbiased, as PyTorch's running variance in HeteroFL's code.
        positions = tf.cast(tf.reduce_prod(tf.shape(a)[:-1]), tf.float32)
        variance *= positions / tf.maximum(positions - 1.0, 1.0)
        new_means.append(m_sum + n * mean)
        new_vars.append(v_sum + n * variance)
      return count + n, tuple(new_means), tuple(new_vars)

    count, mean_sums, var_sums = dataset.reduce(
      (tf.constant(0.0), zeros, zeros), accumulate
    )
    return collections.OrderedDict(
      count=count, mean_sums=list(mean_sums), var_sums=list(var_sums)
    )

  return client_statistics


def set_statistics(weights, sums, indices):
  """`weights` with moving means/variances set from summed statistics."""
  non_trainable = list(weights.non_trainable)
  count = tf.maximum(sums["count"], 1.0)
  for (mean_i, var_i), mean_sum, var_sum in zip(
    indices, sums["mean_sums"], sums["var_sums"]
  ):
    non_trainable[mean_i] = mean_sum / count
    non_trainable[var_i] = var_sum / count
  return tff.learning.models.ModelWeights(
    trainable=list(weights.trainable), non_trainable=non_trainable
  )


def build_statistics_query(
  keras_model_fn: Callable[[], tf.keras.Model], element_spec
) -> Optional[tff.Computation]:
  """The sBN federated computation (module docstring), None without BN."""
  with tf.Graph().as_default():
    probe_model = keras_model_fn()
    layers = batch_norm_layers(probe_model)
    if not layers:
      return None
    indices = _moving_indices(probe_model, layers)
    weights_type = tff.types.tensorflow_to_type(
      tf.nest.map_structure(
        lambda v: tf.TensorSpec(v.shape, v.dtype),
        tff.learning.models.ModelWeights.from_model(probe_model),
      )
    )
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(element_spec))

  @tff.tensorflow.computation(weights_type, data_type)
  def client_statistics(weights, dataset):
    model = keras_model_fn()
    return build_client_statistics_fn(model)(weights, dataset)

  @tff.tensorflow.computation(
    weights_type, client_statistics.type_signature.result
  )
  def apply_statistics(weights, sums):
    return set_statistics(weights, sums, indices)

  @tff.federated_computation(
    tff.FederatedType(weights_type, tff.SERVER),
    tff.FederatedType(data_type, tff.CLIENTS),
  )
  def statistics_query(weights, client_data):
    sums = tff.federated_sum(
      tff.federated_map(
        client_statistics, (tff.federated_broadcast(weights), client_data)
      )
    )
    return tff.federated_map(apply_statistics, (weights, sums))

  return statistics_query


class StaticBatchNorm:
  """Calibrates one model's BN statistics before evaluation (built lazily).

  `calibrate(weights, data)` returns `weights` with every BN layer's moving
  statistics from the statistics query over `data.client_datasets()` (an
  `api.EvaluationData`); `weights` unchanged for a model without batch norm
  or when no client data is given.
  """

  def __init__(
    self, keras_model_fn: Callable[[], tf.keras.Model], element_spec
  ):
    self._keras_model_fn = keras_model_fn
    self._element_spec = element_spec

  @functools.cached_property
  def _query(self) -> Optional[tff.Computation]:
    return build_statistics_query(self._keras_model_fn, self._element_spec)

  def build(self) -> None:
    """Builds the query now (it traces Keras models in a graph)."""
    _ = self._query

  def calibrate(self, weights: tff.learning.models.ModelWeights, data):
    if data is None or self._query is None:
      return weights
    calibrated = self._query(weights, data.client_datasets())
    return tff.learning.models.ModelWeights(
      trainable=[np.asarray(w) for w in calibrated.trainable],
      non_trainable=[np.asarray(w) for w in calibrated.non_trainable],
    )
