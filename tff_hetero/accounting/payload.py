"""Sizes of what crosses the network, measured on the values actually sent.

Two encodings cover every payload in this project:

* dense: every element is sent; its size is `num_elements * itemsize`.
* masked (sparse with a bit mask): only the elements whose mask bit is set are
  sent, plus the mask itself packed at one bit per element:
  `count_nonzero(mask) * itemsize + ceil(num_elements / 8)`.

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


def tf_dense_nbytes(structure: Any) -> tf.Tensor:
  """`dense_nbytes` as a TF op: int64 scalar computed on the tensors' sizes."""
  total = tf.constant(0, tf.int64)
  for leaf in tf.nest.flatten(structure):
    leaf = tf.convert_to_tensor(leaf)
    total += tf.size(leaf, out_type=tf.int64) * leaf.dtype.size
  return total


def tf_masked_nbytes(values: Any, masks: Any) -> tf.Tensor:
  """`masked_nbytes` as a TF op (int64 scalar)."""
  total = tf.constant(0, tf.int64)
  for value, mask in zip(tf.nest.flatten(values), tf.nest.flatten(masks)):
    value = tf.convert_to_tensor(value)
    size = tf.size(value, out_type=tf.int64)
    kept = tf.math.count_nonzero(mask, dtype=tf.int64)
    total += kept * value.dtype.size + (size + 7) // 8
  return total
