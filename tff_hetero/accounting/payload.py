"""Sizes of what crosses the network, measured on the values actually sent.

Three encodings cover every payload in this project:

* dense: every element is sent; its size is `num_elements * itemsize`.
* masked (sparse with a bit mask): only the elements whose mask bit is set are
  sent, plus the mask itself packed at one bit per element:
  `count_nonzero(mask) * itemsize + ceil(num_elements / 8)`.
* channel-indexed (SPATL's salient channels): a per-channel mask over a
  tensor's last axis selects whole output channels; the selected slices are
  sent with one int32 index each:
  `kept * (num_elements / channels) * itemsize + kept * 4`.

Each function exists twice: a NumPy version for values held by the Python
orchestration, and a TensorFlow version (`tf_*`) for use inside
`tff.tensorflow.computation`s, where it runs on the very tensors a client sends.
Both return int64 byte counts and agree on the same values (tested).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf
import tree


def _leaves(structure: Any) -> list[Any]:
  return [leaf for leaf in tree.flatten(structure) if leaf is not None]


def dense_nbytes(structure: Any) -> int:
  """Bytes of a structure of arrays sent densely."""
  total = 0
  for leaf in _leaves(structure):
    array = np.asarray(leaf)
    total += int(array.size) * int(array.dtype.itemsize)
  return total


def masked_nbytes(values: Any, masks: Any) -> int:
  """Bytes of `values` sent as (non-zero-mask values, one-bit-per-element mask).

  `values` and `masks` are structures of the same shape; a mask leaf of None
  means that tensor is sent densely.
  """
  total = 0
  for value, mask in zip(tree.flatten(values), tree.flatten(masks)):
    array = np.asarray(value)
    if mask is None:
      total += int(array.size) * int(array.dtype.itemsize)
      continue
    mask_array = np.asarray(mask)
    if mask_array.shape != array.shape:
      raise ValueError(
        f"mask shape {mask_array.shape} does not match value shape"
        f" {array.shape}"
      )
    kept = int(np.count_nonzero(mask_array))
    total += kept * int(array.dtype.itemsize) + math.ceil(array.size / 8)
  return total


def channel_indexed_nbytes(
  values: Any, channel_masks: Any, index_groups: Any = None
) -> int:
  """Bytes of `values` sent as their selected last-axis channels plus one
  int32 index per channel; a channel mask leaf of None sends that tensor
  densely. Each mask has the shape `[value.shape[-1]]`. Values with the same
  `index_groups` entry (an int >= 0 per value, e.g. a layer's kernel, bias
  and batch-norm scale) share one list of indices, sent once; default: each
  value its own."""
  flat_values, flat_masks = tree.flatten(values), tree.flatten(channel_masks)
  groups = (
    list(range(len(flat_values))) if index_groups is None else index_groups
  )
  total, indexed = 0, set()
  for value, mask, group in zip(flat_values, flat_masks, groups):
    array = np.asarray(value)
    if mask is None:
      total += int(array.size) * int(array.dtype.itemsize)
      continue
    mask_array = np.asarray(mask)
    if array.ndim == 0 or mask_array.shape != array.shape[-1:]:
      raise ValueError(
        f"channel mask shape {mask_array.shape} does not match the last"
        f" axis of value shape {array.shape}"
      )
    kept = int(np.count_nonzero(mask_array))
    per_channel = int(array.size) // max(int(array.shape[-1]), 1)
    total += kept * per_channel * int(array.dtype.itemsize)
    if group not in indexed:
      indexed.add(group)
      total += kept * 4
  return total


def tf_dense_nbytes(structure: Any) -> tf.Tensor:
  """`dense_nbytes` as a TF op: int64 scalar computed on the tensors' sizes.

  A leaf whose shape the graph knows in full adds its size as a constant
  (what `tf.size` of it folds to); only the others add a `tf.size` op.
  Three ops per leaf took 0.6 s of tracing for the 12-block transformer's
  round (docs/performance.md, "Cold start: tracing, and Grappler once")."""
  known = 0
  total = tf.constant(0, tf.int64)
  for leaf in tf.nest.flatten(structure):
    leaf = tf.convert_to_tensor(leaf)
    if leaf.shape.is_fully_defined():
      known += leaf.shape.num_elements() * leaf.dtype.size
    else:
      total += tf.size(leaf, out_type=tf.int64) * leaf.dtype.size
  return total + known


def tf_masked_nbytes(values: Any, masks: Any) -> tf.Tensor:
  """`masked_nbytes` as a TF op (int64 scalar)."""
  total = tf.constant(0, tf.int64)
  for value, mask in zip(tf.nest.flatten(values), tf.nest.flatten(masks)):
    value = tf.convert_to_tensor(value)
    size = tf.size(value, out_type=tf.int64)
    kept = tf.math.count_nonzero(mask, dtype=tf.int64)
    total += kept * value.dtype.size + (size + 7) // 8
  return total


def tf_channel_indexed_nbytes(
  values: Any, channel_masks: Any, index_groups: Any = None
) -> tf.Tensor:
  """`channel_indexed_nbytes` as a TF op (int64 scalar), measured on the
  encoded payload itself: the selected channels gathered from each value
  and their int32 indices (once per index group)."""
  values, channel_masks = list(values), list(channel_masks)
  groups = list(range(len(values))) if index_groups is None else index_groups
  total = tf.constant(0, tf.int64)
  indexed = set()
  for value, mask, group in zip(values, channel_masks, groups):
    value = tf.convert_to_tensor(value)
    if mask is None:
      total += tf.size(value, out_type=tf.int64) * value.dtype.size
      continue
    indices = tf.cast(tf.reshape(tf.where(mask > 0), [-1]), tf.int32)
    sent = tf.gather(value, indices, axis=value.shape.rank - 1)
    total += tf.size(sent, out_type=tf.int64) * value.dtype.size
    if group not in indexed:
      indexed.add(group)
      total += tf.size(indices, out_type=tf.int64) * indices.dtype.size
  return total
