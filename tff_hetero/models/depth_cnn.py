"""A depth-scalable residual CNN: a stem, same-shape blocks, a head.

The convolutional counterpart of `transformer.py` for InclusiveFL-style depth
tiers (`depth.py`): every block has the same weight shapes, so block i of a
shallow tier is block i of a deep one. Layers, in order, with their Keras
names:

* embedding: a 3x3 convolution, stride 2, same padding, to C channels, with
  bias, + ReLU (`stem_conv`);
* blocks `block_1` ... `block_L`, each ONE layer (`ResidualConvBlock`):
  x + conv3x3(relu(conv3x3(relu(x)))), C -> C channels, stride 1, same
  padding, with biases, no batch norm (weights: conv1_kernel, conv1_bias,
  conv2_kernel, conv2_bias);
* head: ReLU (`head_relu`), global average pooling (`pool`), Dense(C, ReLU)
  (`fc`), Dense(num_classes) (`logits`).

Defaults: C = 32, depth 12. No batch norm and no dropout: every weight is
trainable. Initialisation, seeded per part (`depth.DepthSeeds`: the stem,
block i and the head start the same whatever the depth): the stem and each
block's first convolution He-normal (Keras's truncated normal, stddev
sqrt(2 / fan_in)), each block's second convolution the same at 1/12 of the
variance (stddev sqrt(2 / (12 fan_in))), dense kernels Glorot-uniform,
biases 0. Without normalisation, a residual branch initialised like He's
doubles the stream's variance per block (2^12 at depth 12); at 1/12 of it
the variance grows about (1 + 1/12)^L, e at depth 12. The factor is fixed
(not 1/L), so that block i starts the same in every tier.

Widths (`width.py`): one unit, `channels` (C): the stem, every block (both
axes of both kernels) and `fc` (both axes). A narrowed model is the full
model with the weights outside the kept prefix zeroed (tested).

Exact figures (`tests/models/depth_test.py`, by hand there): on 28x28x1 (the
stem leaves 14x14x32) with 10 classes, 1,706 + 18,496 L parameters (stem 320,
a block 18,496, head 1,386) and 57,792 + 3,612,672 L forward MACs (stem
56,448, a block 3,612,672, head 1,344): depth 4: 75,690 parameters,
14,508,480 MACs; depth 8: 149,674, 28,959,168; depth 12: 223,658,
43,409,856.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tff_hetero.errors import ModelError
from tff_hetero.models import depth as depth_lib
from tff_hetero.models import width as width_lib
from tff_hetero.models.blocks import numbered_units
from tff_hetero.models.seeding import SeedStream

DEFAULT_DEPTH = 12
DEFAULT_TIERS = (4, 8, 12)
CHANNELS = 32
# The second convolution's initial variance relative to He's (module doc).
BRANCH_VARIANCE = 1.0 / 12.0


class ResidualConvBlock(tf.keras.layers.Layer):
  """x + conv3x3(relu(conv3x3(relu(x)))) as ONE Keras layer (C -> C).

  Args:
    seed: Seeds both kernels' initialisers (a `SeedStream`).
    branch_variance: The second kernel's initial variance relative to
      He-normal's.
  """

  def __init__(
    self, seed: int, branch_variance: float = BRANCH_VARIANCE, **kwargs
  ):
    super().__init__(**kwargs)
    self.seed = int(seed)
    self.branch_variance = float(branch_variance)

  def build(self, input_shape):
    c = int(input_shape[-1])
    seeds = SeedStream(self.seed)
    self.conv1_kernel = self.add_weight(
      name="conv1_kernel",
      shape=(3, 3, c, c),
      initializer=tf.keras.initializers.HeNormal(seed=seeds.next_seed()),
      trainable=True,
    )
    self.conv1_bias = self.add_weight(
      name="conv1_bias", shape=(c,), initializer="zeros", trainable=True
    )
    self.conv2_kernel = self.add_weight(
      name="conv2_kernel",
      shape=(3, 3, c, c),
      initializer=tf.keras.initializers.VarianceScaling(
        scale=2.0 * self.branch_variance,
        mode="fan_in",
        distribution="truncated_normal",
        seed=seeds.next_seed(),
      ),
      trainable=True,
    )
    self.conv2_bias = self.add_weight(
      name="conv2_bias", shape=(c,), initializer="zeros", trainable=True
    )
    super().build(input_shape)

  # Plain TensorFlow without tensor-dependent Python: autograph has nothing
  # to convert, and converting costs time at every model build.
  @tf.autograph.experimental.do_not_convert
  def call(self, inputs: tf.Tensor, training=None) -> tf.Tensor:
    del training  # the same function in training and inference
    y = tf.nn.relu(inputs)
    y = tf.nn.conv2d(y, self.conv1_kernel, 1, "SAME") + self.conv1_bias
    y = tf.nn.relu(y)
    y = tf.nn.conv2d(y, self.conv2_kernel, 1, "SAME") + self.conv2_bias
    return inputs + y

  def compute_output_shape(self, input_shape):
    return tf.TensorShape(input_shape)

  def get_prunable_weights(self) -> list:
    """The kernels (tfmot's pruning wrappers ask; sparse training)."""
    return [self.conv1_kernel, self.conv2_kernel]

  def get_config(self):
    config = super().get_config()
    config.update(seed=self.seed, branch_variance=self.branch_variance)
    return config


def _check(
  model_name: str, input_shape: tuple[int, ...], channels: object
) -> int:
  if len(input_shape) != 3:
    raise ModelError(
      f"model {model_name!r} takes images shaped (height, width, channels),"
      f" got input_shape {tuple(input_shape)}"
    )
  if (
    not isinstance(channels, (int, np.integer))
    or isinstance(channels, bool)
    or channels < 1
  ):
    raise ModelError(
      f"model {model_name!r}: channels must be an integer >= 1, got"
      f" {channels!r}"
    )
  return int(channels)


def _units(depth: int, channels: int) -> tuple[width_lib.WidthUnit, ...]:
  blocks = tuple(depth_lib.block_name(i) for i in range(1, depth + 1))
  return numbered_units(("channels", channels, ("stem_conv", *blocks, "fc")))


def _depth(model_name: str, depth: object) -> int:
  if depth is None:
    return DEFAULT_DEPTH
  return depth_lib.check_depth(model_name, depth)


def depth_cnn_units(
  input_shape: tuple[int, ...],
  num_classes: int,
  depth: int | None = None,
  *,
  channels: int = CHANNELS,
) -> tuple[width_lib.WidthUnit, ...]:
  """channels (C): the stem, the blocks and `fc`."""
  del num_classes
  name = "depth_cnn"
  channels = _check(name, tuple(input_shape), channels)
  return _units(_depth(name, depth), channels)


def depth_cnn(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
  depth: int | None = None,
  *,
  channels: int = CHANNELS,
  name: str = "depth_cnn",
) -> tf.keras.Model:
  """The depth-scalable residual CNN; see module doc.

  Args:
    input_shape: (height, width, channels) images, any size.
    num_classes: Logits out.
    seed: Seeds every initialiser (`depth.DepthSeeds`).
    widths: (channels,) in 1..C (None: C).
    depth: Number of blocks (None: 12).
    channels: C of the full model.
    name: The Keras model's name.
  """
  input_shape = tuple(int(d) for d in input_shape)
  channels = _check(name, input_shape, channels)
  depth = _depth(name, depth)
  (width,) = width_lib.check_widths(name, _units(depth, channels), widths)
  seeds = depth_lib.DepthSeeds(seed)
  stem = seeds.embedding()
  inputs = tf.keras.Input(shape=input_shape, name="image")
  x = tf.keras.layers.Conv2D(
    width,
    3,
    strides=2,
    padding="same",
    activation="relu",
    kernel_initializer=stem.he_normal(),
    bias_initializer="zeros",
    name="stem_conv",
  )(inputs)
  for i in range(1, depth + 1):
    x = ResidualConvBlock(seeds.block(i), name=depth_lib.block_name(i))(x)
  head = seeds.head()
  x = tf.keras.layers.ReLU(name="head_relu")(x)
  x = tf.keras.layers.GlobalAveragePooling2D(name="pool")(x)
  x = tf.keras.layers.Dense(
    width,
    activation="relu",
    kernel_initializer=head.glorot_uniform(),
    bias_initializer="zeros",
    name="fc",
  )(x)
  logits = tf.keras.layers.Dense(
    num_classes,
    kernel_initializer=head.glorot_uniform(),
    bias_initializer="zeros",
    name="logits",
  )(x)
  return tf.keras.Model(inputs, logits, name=name)
