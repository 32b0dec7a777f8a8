"""Convolutional networks of the papers, as seeded functional `tf.keras` models.

Every factory has the signature
`(input_shape, num_classes, seed, widths=None) -> Model`, takes images shaped
`(height, width, channels)` (channels last), outputs LOGITS (no softmax: train
with `from_logits=True`) and initialises every kernel with Glorot-uniform
under its own seed derived from `seed` (see `seeding.py`); biases start at
zero. Layers have stable names (`conv1`, `pool1`, ..., `fc1`, `logits`) that
the sub-model maps rely on.

Widths (`width.py`): every convolution and every hidden dense layer is a width
unit, convolutions first (`mnist_cnn`: conv1, conv2, fc1; `cifar_cnn`: conv1,
conv2, fc1, fc2; `small_cnn`: conv1, conv2). `widths` narrows them: the same
layers, names and variable order, each kernel narrowed on its output axis and
on the input axis that reads a narrowed unit; the dense layer after `flatten`
reads H*W*C' features (channels-last flatten of the narrowed feature map).
`*_units(input_shape, num_classes)` lists a model's units (and raises
`ModelError` for shapes the model cannot take).

Parameter and MAC figures below are exact and asserted in
`tests/models/models_counting_test.py` (MACs as defined in `counting.py`:
conv/dense multiply-accumulates per example).

`mnist_cnn`: the MNIST CNN of FedDST (Bibikar et al., "Federated Dynamic Sparse
  Training: Computing Less, Communicating Less, Yet Learning Better", AAAI
  2022) as described in FedSGC's Section 4.1: "two 5x5 convolution layers (the
  first with 10 channels, the second with 20), a fully connected layer with
  50 units and ReLU activation, and a final softmax output layer". Variant
  here: conv 5x5 (10, valid) + ReLU + max-pool 2x2/2, conv 5x5 (20, valid) +
  ReLU + max-pool 2x2/2, flatten, dense 50 + ReLU, dense `num_classes`: the
  classic PyTorch MNIST-example net, without its dropout layers. On 28x28x1
  with 10 classes: 21,840 parameters, 480,500 MACs. It needs images of at
  least 16x16 (the second convolution must see at least 5x5 and its output
  must survive a 2x2 pool); smaller inputs raise `ModelError`.

`mnist_cnn_feddst`: the same layers as FedDST's reference code
  (`bibikar/feddst`, `models.py`, `MNISTNet`) actually builds them: both
  convolutions valid, but each followed by a 3x3 max-pool with STRIDE 1, so
  the feature map only shrinks 28 -> 24 -> 22 -> 18 -> 16 and the flatten has
  20x16x16 = 5,120 features (5120 -> 50 -> 10). The reference applies the ReLU
  after the pool; max-pool and ReLU commute, so ReLU-then-pool here is the same
  function. The reference also applies a softmax (twice, with its loss); this
  model outputs logits. On 28x28x1 with 10 classes: 261,840 parameters (as the
  reference's own count), 2,020,500 MACs. Needs at least 13x13 input.

`cifar_cnn`: the CIFAR-10 CNN of FedAvg (McMahan et al., "Communication-
  Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017),
  which took it from the TensorFlow CIFAR-10 tutorial (`cifar10.inference`):
  conv 5x5 (64, same) + ReLU, max-pool 3x3/2 (same), conv 5x5 (64, same) +
  ReLU, max-pool 3x3/2 (same), flatten, dense 384 + ReLU, dense 192 + ReLU,
  linear `num_classes`. Deviations, by decision: (1) no local response
  normalisation (the tutorial's `norm1`/`norm2`): Keras has no LRN layer, most
  federated re-implementations drop it, and LRN's cross-channel window would
  make a width-sliced sub-model compute something other than a slice of the
  full model; (2) Glorot-uniform kernels and zero biases instead of the
  tutorial's truncated normals and 0.1 biases, and no weight decay (a training
  choice, not part of the model). The paper trains on 24x24 crops ("about
  10^6 parameters": 1,068,298 at 24x24x3); our data pipelines feed whole
  32x32x3 images, where the flatten has 8x8x64 = 4,096 features and the model
  has 1,756,426 parameters and 32,778,112 MACs (24x24x3: 18,470,784 MACs).
  Any input size works (same padding throughout).

`small_cnn`: our own small CNN for the 8x8x1 scikit-learn digits and the
  synthetic test data (not from a paper): conv 3x3 (16, same) + ReLU,
  max-pool 2x2/2, conv 3x3 (32, same) + ReLU, max-pool 2x2/2, flatten, linear
  `num_classes`. On 8x8x1 with 10 classes: 6,090 parameters, 84,224 MACs.
  Needs at least 4x4 input.

Not registered: FedSGC's CIFAR-10 description ("three 5x5 convolution layers
(32, 64, 64), a fully connected layer with 1024 units") matches neither the
FedAvg paper's network nor the TensorFlow tutorial it cites.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import NamedTuple

import tensorflow as tf

from tff_hetero.errors import ModelError
from tff_hetero.models import width as width_lib
from tff_hetero.models.blocks import numbered_units
from tff_hetero.models.seeding import SeedStream


class Stage(NamedTuple):
  """One spatial stage of a CNN: a convolution or a pooling window."""

  name: str
  window: int
  stride: int
  padding: str  # "valid" or "same"


def _stage_out(n: int, stage: Stage) -> int | None:
  """Output length of `stage` on an input of length n, None if it cannot run."""
  if stage.padding == "same":
    return math.ceil(n / stage.stride)
  if n < stage.window:
    return None
  return (n - stage.window) // stage.stride + 1


def _plan_out(n: int, plan: Sequence[Stage]) -> tuple[int | None, str]:
  """Runs the plan along one axis; returns (final length or None, failing stage)."""
  for stage in plan:
    out = _stage_out(n, stage)
    if out is None or out < 1:
      return None, stage.name
    n = out
  return n, ""


def _min_side(plan: Sequence[Stage]) -> int:
  n = 1
  while _plan_out(n, plan)[0] is None:
    n += 1
  return n


def _shape_text(shape: Sequence[int]) -> str:
  return "x".join(str(d) for d in shape)


def check_image_input(
  model_name: str,
  input_shape: tuple[int, ...],
  plan: Sequence[Stage] = (),
  hint: str = "",
) -> None:
  """Raises ModelError unless `input_shape` is (H, W, C) and `plan` fits it."""
  if len(input_shape) != 3:
    raise ModelError(
      f"model {model_name!r} takes images shaped (height, width, channels), "
      f"got input_shape {tuple(input_shape)}"
    )
  for side in input_shape[:2]:
    _, failing = _plan_out(side, plan)
    if failing:
      need = _min_side(plan)
      raise ModelError(
        f"model {model_name!r} needs images of at least {need}x{need}, got "
        f"{_shape_text(input_shape)} (layer {failing} has no room)"
        + (f"; {hint}" if hint else "")
      )


def _conv(
  filters: int, size: int, padding: str, seeds: SeedStream, name: str
) -> tf.keras.layers.Layer:
  return tf.keras.layers.Conv2D(
    filters,
    size,
    padding=padding,
    activation="relu",
    kernel_initializer=seeds.glorot_uniform(),
    bias_initializer="zeros",
    name=name,
  )


def _dense(
  units: int, seeds: SeedStream, name: str, activation: str | None = None
) -> tf.keras.layers.Layer:
  return tf.keras.layers.Dense(
    units,
    activation=activation,
    kernel_initializer=seeds.glorot_uniform(),
    bias_initializer="zeros",
    name=name,
  )


_SMALL_INPUT_HINT = "for small images use small_cnn or mlp"

_MNIST_CNN_PLAN = (
  Stage("conv1", 5, 1, "valid"),
  Stage("pool1", 2, 2, "valid"),
  Stage("conv2", 5, 1, "valid"),
  Stage("pool2", 2, 2, "valid"),
)


def _plain_units(
  *named_widths: tuple[str, int],
) -> tuple[width_lib.WidthUnit, ...]:
  """One unit per layer (conv or hidden dense), named after the layer."""
  return numbered_units(*((name, w, (name,)) for name, w in named_widths))


def _two_conv_mnist_units(
  name: str, plan: tuple[Stage, ...], input_shape: tuple[int, ...]
) -> tuple[width_lib.WidthUnit, ...]:
  check_image_input(name, input_shape, plan, _SMALL_INPUT_HINT)
  return _plain_units(("conv1", 10), ("conv2", 20), ("fc1", 50))


def _two_conv_mnist_net(
  name: str,
  plan: tuple[Stage, ...],
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None,
) -> tf.keras.Model:
  """conv(10) -> pool -> conv(20) -> pool -> fc50 -> fc, shaped by `plan`."""
  units = _two_conv_mnist_units(name, plan, input_shape)
  conv1, conv2, fc1 = width_lib.check_widths(name, units, widths)
  seeds = SeedStream(seed)
  inputs = tf.keras.Input(shape=input_shape, name="image")
  x = inputs
  for filters, conv, pool in (
    (conv1, plan[0], plan[1]),
    (conv2, plan[2], plan[3]),
  ):
    x = _conv(filters, conv.window, conv.padding, seeds, conv.name)(x)
    x = tf.keras.layers.MaxPooling2D(
      pool.window, pool.stride, padding=pool.padding, name=pool.name
    )(x)
  x = tf.keras.layers.Flatten(name="flatten")(x)
  x = _dense(fc1, seeds, "fc1", "relu")(x)
  logits = _dense(num_classes, seeds, "logits")(x)
  return tf.keras.Model(inputs, logits, name=name)


def mnist_cnn_units(
  input_shape: tuple[int, ...], num_classes: int
) -> tuple[width_lib.WidthUnit, ...]:
  """conv1 (10), conv2 (20), fc1 (50)."""
  del num_classes
  return _two_conv_mnist_units("mnist_cnn", _MNIST_CNN_PLAN, input_shape)


def mnist_cnn(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
) -> tf.keras.Model:
  """The 21,840-parameter MNIST CNN (FedDST/FedSGC description); see module doc."""
  return _two_conv_mnist_net(
    "mnist_cnn", _MNIST_CNN_PLAN, input_shape, num_classes, seed, widths
  )


_FEDDST_PLAN = (
  Stage("conv1", 5, 1, "valid"),
  Stage("pool1", 3, 1, "valid"),
  Stage("conv2", 5, 1, "valid"),
  Stage("pool2", 3, 1, "valid"),
)


def mnist_cnn_feddst_units(
  input_shape: tuple[int, ...], num_classes: int
) -> tuple[width_lib.WidthUnit, ...]:
  """conv1 (10), conv2 (20), fc1 (50)."""
  del num_classes
  return _two_conv_mnist_units("mnist_cnn_feddst", _FEDDST_PLAN, input_shape)


def mnist_cnn_feddst(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
) -> tf.keras.Model:
  """FedDST's reference `MNISTNet` (3x3 stride-1 pools, 261,840 parameters)."""
  return _two_conv_mnist_net(
    "mnist_cnn_feddst", _FEDDST_PLAN, input_shape, num_classes, seed, widths
  )


def cifar_cnn_units(
  input_shape: tuple[int, ...], num_classes: int
) -> tuple[width_lib.WidthUnit, ...]:
  """conv1 (64), conv2 (64), fc1 (384), fc2 (192)."""
  del num_classes
  check_image_input("cifar_cnn", input_shape)
  return _plain_units(("conv1", 64), ("conv2", 64), ("fc1", 384), ("fc2", 192))


def cifar_cnn(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
) -> tf.keras.Model:
  """FedAvg's CIFAR-10 CNN (TensorFlow tutorial, without LRN); see module doc."""
  units = cifar_cnn_units(input_shape, num_classes)
  conv1, conv2, fc1, fc2 = width_lib.check_widths("cifar_cnn", units, widths)
  seeds = SeedStream(seed)
  inputs = tf.keras.Input(shape=input_shape, name="image")
  x = _conv(conv1, 5, "same", seeds, "conv1")(inputs)
  x = tf.keras.layers.MaxPooling2D(3, 2, padding="same", name="pool1")(x)
  x = _conv(conv2, 5, "same", seeds, "conv2")(x)
  x = tf.keras.layers.MaxPooling2D(3, 2, padding="same", name="pool2")(x)
  x = tf.keras.layers.Flatten(name="flatten")(x)
  x = _dense(fc1, seeds, "fc1", "relu")(x)
  x = _dense(fc2, seeds, "fc2", "relu")(x)
  logits = _dense(num_classes, seeds, "logits")(x)
  return tf.keras.Model(inputs, logits, name="cifar_cnn")


_SMALL_CNN_PLAN = (
  Stage("conv1", 3, 1, "same"),
  Stage("pool1", 2, 2, "valid"),
  Stage("conv2", 3, 1, "same"),
  Stage("pool2", 2, 2, "valid"),
)


def small_cnn_units(
  input_shape: tuple[int, ...], num_classes: int
) -> tuple[width_lib.WidthUnit, ...]:
  """conv1 (16), conv2 (32)."""
  del num_classes
  check_image_input("small_cnn", input_shape, _SMALL_CNN_PLAN, "use mlp")
  return _plain_units(("conv1", 16), ("conv2", 32))


def small_cnn(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
) -> tf.keras.Model:
  """A small two-convolution CNN for 8x8 digits and test data; see module doc."""
  units = small_cnn_units(input_shape, num_classes)
  conv1, conv2 = width_lib.check_widths("small_cnn", units, widths)
  seeds = SeedStream(seed)
  inputs = tf.keras.Input(shape=input_shape, name="image")
  x = _conv(conv1, 3, "same", seeds, "conv1")(inputs)
  x = tf.keras.layers.MaxPooling2D(2, 2, padding="valid", name="pool1")(x)
  x = _conv(conv2, 3, "same", seeds, "conv2")(x)
  x = tf.keras.layers.MaxPooling2D(2, 2, padding="valid", name="pool2")(x)
  x = tf.keras.layers.Flatten(name="flatten")(x)
  logits = _dense(num_classes, seeds, "logits")(x)
  return tf.keras.Model(inputs, logits, name="small_cnn")
