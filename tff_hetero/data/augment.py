"""Training-time image augmentation of client batches, seeded and stateless.

The CIFAR/CINIC experiments of the papers train with random crops (zero
padding of 4 pixels, then a crop of the original size) and random horizontal
flips (FedGKT Section 4.1: "random crop, random horizontal flip, and
normalization"; we scale to [0, 1] and leave normalization to the model's
first batch norm). `AUGMENTATIONS` maps `--augment` names to batch functions
``(images float32[b, H, W, C], seed int64[2]) -> images``; "none" is the
identity. Only training batches are augmented: evaluation data and the
passes whose outputs are sent (FedGKT's features) see the images as they are.

Randomness comes only from the seed, through TensorFlow's stateless random
ops: `make_client_dataset` seeds batch k of a client's round with
(the client's shuffle seed, k), so a resumed run augments exactly as the
uninterrupted one and TensorFlow's global seed plays no part.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from types import MappingProxyType

CROP_PADDING = 4


def crop(images, seed):
  """Per image, a random crop of the image zero-padded by CROP_PADDING.

  Each image gets its own offset (dy, dx) in [0, 2 * CROP_PADDING], drawn
  from `seed`.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  pad = CROP_PADDING
  shape = tf.shape(images)
  batch, height, width = shape[0], shape[1], shape[2]
  offsets = tf.random.stateless_uniform(
    [batch, 2], seed, minval=0, maxval=2 * pad + 1, dtype=tf.int32
  )
  padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
  rows = offsets[:, :1] + tf.range(height)[tf.newaxis]  # [b, H]
  cols = offsets[:, 1:] + tf.range(width)[tf.newaxis]  # [b, W]
  cropped = tf.gather(padded, rows, axis=1, batch_dims=1)
  return tf.gather(cropped, cols, axis=2, batch_dims=1)


def flip(images, seed):
  """Per image, a left-right flip with probability 1/2, drawn from `seed`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  flipped = tf.random.stateless_uniform([tf.shape(images)[0]], seed) < 0.5
  return tf.where(
    flipped[:, tf.newaxis, tf.newaxis, tf.newaxis],
    tf.reverse(images, axis=[2]),
    images,
  )


def crop_flip(images, seed):
  """`crop`, then `flip`, from two seeds split off `seed`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  crop_seed, flip_seed = tf.unstack(
    tf.random.experimental.stateless_split(seed, 2)
  )
  return flip(crop(images, crop_seed), flip_seed)


AUGMENTATIONS: Mapping[str, Callable | None] = MappingProxyType(
  {
    "none": None,
    "crop": crop,  # For digits and other images a flip would change.
    "crop_flip": crop_flip,
  }
)
"""`--augment` names -> batch function (None: no augmentation)."""
