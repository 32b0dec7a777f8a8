"""Fully connected networks, as seeded functional `tf.keras` models.

Same contract as `cnn.py`: `(input_shape, num_classes, seed, widths=None)
-> Model`, logits out, Glorot-uniform kernels with per-layer seeds, zero
biases. The input may have any shape; it is flattened first. Every hidden
dense layer is a width unit (`fc1`, `fc2`, ...; `width.py`); the input
features are never narrowed.

`mlp`: flatten, dense 64 + ReLU, linear `num_classes`. Our own tiny model for
  the 8x8x1 digits and synthetic test data. On 8x8x1 with 10 classes: 4,810
  parameters, 4,736 MACs (on 28x28x1: 50,890 parameters).

`mnist_2nn`: the "2NN" of FedAvg (McMahan et al., AISTATS 2017): "a simple
  multilayer-perceptron with 2-hidden layers with 200 units each using ReLu
  activations (199,210 total parameters)". On 28x28x1 with 10 classes:
  199,210 parameters, as the paper says, and 198,800 MACs.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tff_hetero.models import width as width_lib
from tff_hetero.models.blocks import numbered_units
from tff_hetero.models.seeding import SeedStream

MLP_HIDDEN_UNITS = 64


def _hidden_units(hidden: Sequence[int]) -> tuple[width_lib.WidthUnit, ...]:
  return numbered_units(
    *((f"fc{i}", units, (f"fc{i}",)) for i, units in enumerate(hidden, start=1))
  )


def _dense_stack(
  name: str,
  input_shape: tuple[int, ...],
  hidden: Sequence[int],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None,
) -> tf.keras.Model:
  hidden = width_lib.check_widths(name, _hidden_units(hidden), widths)
  seeds = SeedStream(seed)
  inputs = tf.keras.Input(shape=input_shape, name="features")
  x = tf.keras.layers.Flatten(name="flatten")(inputs)
  for i, units in enumerate(hidden, start=1):
    x = tf.keras.layers.Dense(
      units,
      activation="relu",
      kernel_initializer=seeds.glorot_uniform(),
      bias_initializer="zeros",
      name=f"fc{i}",
    )(x)
  logits = tf.keras.layers.Dense(
    num_classes,
    kernel_initializer=seeds.glorot_uniform(),
    bias_initializer="zeros",
    name="logits",
  )(x)
  return tf.keras.Model(inputs, logits, name=name)


def mlp_units(
  input_shape: tuple[int, ...], num_classes: int
) -> tuple[width_lib.WidthUnit, ...]:
  """fc1 (64)."""
  del input_shape, num_classes
  return _hidden_units((MLP_HIDDEN_UNITS,))


def mlp(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
) -> tf.keras.Model:
  """One hidden layer of 64 ReLU units; see module doc."""
  return _dense_stack(
    "mlp", input_shape, (MLP_HIDDEN_UNITS,), num_classes, seed, widths
  )


def mnist_2nn_units(
  input_shape: tuple[int, ...], num_classes: int
) -> tuple[width_lib.WidthUnit, ...]:
  """fc1 (200), fc2 (200)."""
  del input_shape, num_classes
  return _hidden_units((200, 200))


def mnist_2nn(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
) -> tf.keras.Model:
  """FedAvg's 2NN: two hidden layers of 200 ReLU units; see module doc."""
  return _dense_stack(
    "mnist_2nn", input_shape, (200, 200), num_classes, seed, widths
  )
