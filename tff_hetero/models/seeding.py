"""Explicit, per-layer seeds for Keras initialisers.

Every layer of the models in this package gets a kernel initialiser with its
own seed, drawn from a stream derived from the one `seed` given to the
factory. Two builds with the same seed therefore have identical weights and
different seeds give different weights, without touching TensorFlow's global
seed (`tf.random.set_seed`) or depending on how many models were built before
in the same process. Biases start at zero.

Keras 2.14 initialisers with a seed are stateless: the same initialiser object
returns the same values on every call, so each layer gets a fresh initialiser
with a seed of its own rather than a shared one.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# Distinguishes this stream from other uses of the same user seed.
_STREAM_TAG = 0x6D6F64  # "mod"
_MAX_SEED = 2**31 - 1


class SeedStream:
  """Deterministic sequence of int seeds derived from one user seed."""

  def __init__(self, seed: int):
    self._rng = np.random.default_rng([_STREAM_TAG, int(seed)])

  def next_seed(self) -> int:
    """The next seed, an int in [0, 2**31 - 1)."""
    return int(self._rng.integers(0, _MAX_SEED))

  def glorot_uniform(self) -> tf.keras.initializers.Initializer:
    """A fresh Glorot-uniform initialiser (the Keras default) with its own seed."""
    return tf.keras.initializers.GlorotUniform(seed=self.next_seed())

  def he_normal(self) -> tf.keras.initializers.Initializer:
    """A fresh He-normal initialiser (for ReLU networks) with its own seed."""
    return tf.keras.initializers.HeNormal(seed=self.next_seed())
