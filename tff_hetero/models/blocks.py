"""Building blocks shared by the width-capable models.

`numbered_units` turns `(name, full_width, layers)` triples into the
`WidthUnit`s of `width.py`, numbered from 1 in forward order.

`batch_norm` is a Keras batch normalisation with PyTorch's defaults
(`nn.BatchNorm2d`: momentum 0.1 on the new statistics, which is Keras's
momentum 0.9 on the old ones, and epsilon 1e-5), as the reference codes of
the ResNets and VGGs use them.

`ChannelShortcut` is the parameter-free shortcut of a residual block whose
input and output widths may differ: it keeps every `stride`-th row and column
(`x[:, ::s, ::s, :]`, the rows a stride-s 3x3 convolution with padding 1 or a
stride-s 1x1 convolution centres on) and then zero-pads the channels AT THE
END up to `channels`, or truncates them to the first `channels`. This is He et
al.'s (CVPR 2016) shortcut "option A", except that the original pads zeros on
both sides of the channel axis; padding at the end keeps the block consistent
with prefix sub-models: the first k channels of the full model's shortcut are
the shortcut of the model narrowed to k channels (channels beyond a narrowed
input are zero in the full model too). Truncation arises only in narrowed
models whose block output is narrower than its input (`resnet.py` says when
that makes a sub-model differ from the zero-padded full model). It has no
weights and costs 0 MACs (`counting.py` has a rule for it).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence

import tensorflow as tf

from tff_hetero.models.width import WidthUnit

# `(input_shape, num_classes, seed, widths=None) -> tf.keras.Model` (logits).
Factory = Callable[..., tf.keras.Model]
# `(input_shape, num_classes) -> the model's width units`.
UnitsFn = Callable[[tuple[int, ...], int], tuple[WidthUnit, ...]]

BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


def numbered_units(
  *groups: tuple[str, int, Sequence[str]],
) -> tuple[WidthUnit, ...]:
  """`WidthUnit`s numbered from 1 from `(name, full_width, layers)` triples."""
  return tuple(
    WidthUnit(index, name, int(full_width), tuple(layers))
    for index, (name, full_width, layers) in enumerate(groups, start=1)
  )


def batch_norm(name: str) -> tf.keras.layers.Layer:
  """Batch normalisation with PyTorch's defaults (module docstring)."""
  return tf.keras.layers.BatchNormalization(
    momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=name
  )


class ChannelShortcut(tf.keras.layers.Layer):
  """Subsample by `stride`, then zero-pad or truncate to `channels` (no weights)."""

  def __init__(self, stride: int, channels: int, **kwargs):
    super().__init__(**kwargs)
    self.stride = int(stride)
    self.channels = int(channels)

  def call(self, inputs: tf.Tensor) -> tf.Tensor:
    x = inputs
    if self.stride != 1:
      x = x[:, :: self.stride, :: self.stride, :]
    have = x.shape[-1]
    if have > self.channels:
      return x[..., : self.channels]
    if have < self.channels:
      return tf.pad(x, [[0, 0], [0, 0], [0, 0], [0, self.channels - have]])
    return tf.identity(x)

  def compute_output_shape(self, input_shape):
    shape = tf.TensorShape(input_shape).as_list()
    for axis in (1, 2):
      if shape[axis] is not None:
        shape[axis] = -(-shape[axis] // self.stride)
    shape[-1] = self.channels
    return tf.TensorShape(shape)

  def get_prunable_weights(self) -> list:
    """Nothing to prune (tfmot's pruning wrappers ask; sparse training)."""
    return []

  def get_config(self):
    config = super().get_config()
    config.update(stride=self.stride, channels=self.channels)
    return config
