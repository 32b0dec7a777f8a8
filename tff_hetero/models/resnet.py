"""Residual networks for 32x32 images: the CIFAR ResNets and a CIFAR ResNet-18.

`resnet8`, `resnet20`, `resnet32`, `resnet56`, `resnet110`: He et al., "Deep
Residual Learning for Image Recognition" (CVPR 2016), Section 4.2: depth
6n + 2 (n = 1, 3, 5, 9, 18); a 3x3 stem convolution with 16 channels + batch
norm + ReLU; three stages of n BasicBlocks (3x3 conv, BN, ReLU, 3x3 conv, BN,
add the shortcut, ReLU) with 16, 32 and 64 channels, the first convolution
of stages 2 and 3 with stride 2; global average pooling; a dense layer to
`num_classes` logits. Shortcuts are the parameter-free "option A"
(`blocks.ChannelShortcut`): subsample x[:, ::2, ::2, :] and zero-pad the new
channels AT THE END, not on both sides as the original does, so that prefix
sub-models stay consistent (see `blocks.py`); a narrowed block whose output
is narrower than its input truncates to the first channels instead. Every
stage's first block carries this shortcut layer (in the full model of stage
1 it is the identity), so that all widths have the same layers. "ResNet-8"
names different models in different codes: ours is this family with n = 1
(one block per stage, 16/32/64 channels), not FedGKT's edge model (a 3x3
convolution and three 16-channel blocks).

`resnet18`: the CIFAR ResNet-18 of `kuangliu/pytorch-cifar` that federated
papers use: a 3x3 stem convolution with 64 channels, stride 1, + BN + ReLU
(no max-pool); four stages of two BasicBlocks with 64, 128, 256 and 512
channels, stride 2 at the entry of stages 2-4; a projection shortcut (1x1
convolution with the block's stride + BN) wherever the stride is not 1 or the
FULL model's input and output widths differ (stages 2-4), the identity
elsewhere (a `ChannelShortcut` layer at the entry of stage 1, which adapts
the width when the stem and stage 1 are narrowed differently); global average
pooling (the reference's 4x4 average pool on 32x32 input); dense logits.
AdaptiveFL's reference code (`mastlab-T3S/AdaptiveFL`, `models/resnet.py`,
`ResNet18_cifar`) uses 96 channels in stage 1 (and hence a projection in its
first block); we keep the standard 64.

Common to all: convolutions without bias, each followed by batch norm with
PyTorch's defaults (`blocks.batch_norm`); convolution kernels He-normal
(Keras's truncated variant, stddev sqrt(2 / fan_in)), as He et al. initialise
and the usual CIFAR ResNet code does (`kaiming_normal_`), the dense layer
Glorot-uniform; every layer with its own seed (`seeding.py`). Stride-2 3x3
convolutions pad one pixel on each side explicitly (a `ZeroPadding2D` layer
`<block>_pad`, then a valid convolution) as PyTorch's `padding=1` does:
Keras's "same" padding at stride 2 pads only at the bottom/right on even
sizes, which would sample positions one pixel away from the shortcut's
x[:, ::2, ::2, :]. Layer names: `stem_conv`, `stem_bn`, `stem_relu`,
`stage{s}_block{b}_{conv1,bn1,relu1,conv2,bn2,shortcut,shortcut_bn,add,out}`,
`pool`, `logits`.

Widths (`width.py`): unit 1 is the stem and units 2.. are the stages (the
blocks of a stage add into one residual stream, so every convolution of a
stage, its inner ones included, follows the stage's width): 4 units for the
CIFAR ResNets (16, 16, 32, 64), 5 for ResNet-18 (64, 64, 128, 256, 512).

A narrowed model equals the full model with every weight outside the kept
prefix zeroed (tested) with one exception, inherent in parameter-free
shortcuts: in a CIFAR ResNet, a stage narrower than the unit before it
truncates its identity shortcut, while the full model carries the dropped
channels on through the identity paths of every later stage (no weight to
zero there); if a later stage is wider than the truncated one, its kept
channels include them, and the two differ. Exactly: the narrowed model is the
prefix of the full one unless some unit k >= 2 has w_k < w_(k-1) and a later
unit is wider than w_k. Of AdaptiveFL's pool with r = 0.66 / 0.40 and
I = 3, 2, 1 this concerns M3 (16, 10, 21, 42), S3 (16, 6, 12, 25) and S2
(16, 16, 12, 25); uniform HeteroFL widths never truncate (stem and stage 1
have the same width). ResNet-18 is not affected: its stage-2 projection and
convolutions read only the kept channels of stage 1.

Exact figures on 32x32x3 with 10 classes, asserted in `tests/models/`
(parameters = trainable: batch-norm gamma/beta counted, running statistics
not; MACs as in `counting.py`, batch norm 1 MAC per output element):

| model | parameters | non-trainable | forward MACs |
|---|---|---|---|
| resnet8 | 75,290 | 480 | 12,313,216 |
| resnet20 | 269,722 | 1,376 | 40,739,456 |
| resnet32 | 464,154 | 2,272 | 69,165,696 |
| resnet56 | 853,018 | 4,064 | 126,018,176 |
| resnet110 | 1,727,962 | 8,096 | 253,936,256 |
| resnet18 | 11,173,962 | 9,600 | 556,037,120 |

The CIFAR ResNet counts are the reference figures (269,722 ... 1,727,962);
11,173,962 is kuangliu's ResNet-18 count.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tff_hetero.models import width as width_lib
from tff_hetero.models.blocks import ChannelShortcut
from tff_hetero.models.blocks import Factory
from tff_hetero.models.blocks import UnitsFn
from tff_hetero.models.blocks import batch_norm
from tff_hetero.models.blocks import numbered_units
from tff_hetero.models.cnn import check_image_input
from tff_hetero.models.seeding import SeedStream

CIFAR_STAGE_WIDTHS = (16, 32, 64)
CIFAR_STEM_WIDTH = 16
RESNET18_STAGE_WIDTHS = (64, 128, 256, 512)
RESNET18_STEM_WIDTH = 64
RESNET18_BLOCKS_PER_STAGE = 2

# name -> n (blocks per stage); depth = 6n + 2
CIFAR_DEPTHS = {
  "resnet8": 1,
  "resnet20": 3,
  "resnet32": 5,
  "resnet56": 9,
  "resnet110": 18,
}


def _conv(
  x: tf.Tensor,
  filters: int,
  size: int,
  stride: int,
  seeds: SeedStream,
  name: str,
  pad_name: str,
) -> tf.Tensor:
  """A bias-free convolution, padded as PyTorch's `padding=size // 2`."""
  if size > 1 and stride > 1:
    x = tf.keras.layers.ZeroPadding2D(size // 2, name=pad_name)(x)
    padding = "valid"
  else:
    padding = "same"
  return tf.keras.layers.Conv2D(
    filters,
    size,
    strides=stride,
    padding=padding,
    use_bias=False,
    kernel_initializer=seeds.he_normal(),
    name=name,
  )(x)


def _stage_layers(stage: int, blocks: int, projection: bool) -> tuple[str, ...]:
  names = []
  for b in range(1, blocks + 1):
    p = f"stage{stage}_block{b}"
    names += [f"{p}_conv1", f"{p}_bn1", f"{p}_conv2", f"{p}_bn2"]
    if b == 1:
      names += (
        [f"{p}_shortcut", f"{p}_shortcut_bn"]
        if projection
        else [f"{p}_shortcut"]
      )
  return tuple(names)


def _resnet_units(
  stem: int | None,
  stages: Sequence[int],
  blocks: int,
  projections: Sequence[bool],
) -> tuple[width_lib.WidthUnit, ...]:
  """Width units: the stem (unless `stem` is None), then each stage."""
  stem_unit = (("stem", stem, ("stem_conv", "stem_bn")),) if stem else ()
  return numbered_units(
    *stem_unit,
    *(
      (f"stage{s}", w, _stage_layers(s, blocks, proj))
      for s, (w, proj) in enumerate(zip(stages, projections), start=1)
    ),
  )


def _projections(stem: int, stages: Sequence[int]) -> tuple[bool, ...]:
  """Per stage: whether its first block has a projection (ResNet-18 rule)."""
  ins = (stem,) + tuple(stages[:-1])
  return tuple(
    s > 1 or c_in != c_out
    for s, (c_in, c_out) in enumerate(zip(ins, stages), start=1)
  )


def _resnet(
  name: str,
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  units: Sequence[width_lib.WidthUnit],
  blocks: int,
  projections: Sequence[bool],
  widths: Sequence[int] | None,
  *,
  stem: bool = True,
  input_name: str = "image",
) -> tf.keras.Model:
  """[Stem +] stages of BasicBlocks + global average pool + dense logits.

  Without `stem`, the input (e.g. FedGKT's edge feature maps) enters stage 1
  directly and the units are the stages only.
  """
  widths = width_lib.check_widths(name, units, widths)
  seeds = SeedStream(seed)
  inputs = tf.keras.Input(shape=input_shape, name=input_name)
  x = inputs
  stage_widths = widths
  if stem:
    x = _conv(inputs, widths[0], 3, 1, seeds, "stem_conv", "stem_pad")
    x = batch_norm("stem_bn")(x)
    x = tf.keras.layers.ReLU(name="stem_relu")(x)
    stage_widths = widths[1:]
  for s, (width, projection) in enumerate(
    zip(stage_widths, projections), start=1
  ):
    for b in range(1, blocks + 1):
      p = f"stage{s}_block{b}"
      stride = 2 if s > 1 and b == 1 else 1
      y = _conv(x, width, 3, stride, seeds, f"{p}_conv1", f"{p}_pad")
      y = batch_norm(f"{p}_bn1")(y)
      y = tf.keras.layers.ReLU(name=f"{p}_relu1")(y)
      y = _conv(y, width, 3, 1, seeds, f"{p}_conv2", f"{p}_pad2")
      y = batch_norm(f"{p}_bn2")(y)
      if b > 1:
        shortcut = x
      elif projection:
        shortcut = _conv(x, width, 1, stride, seeds, f"{p}_shortcut", "")
        shortcut = batch_norm(f"{p}_shortcut_bn")(shortcut)
      else:
        shortcut = ChannelShortcut(stride, width, name=f"{p}_shortcut")(x)
      x = tf.keras.layers.Add(name=f"{p}_add")([y, shortcut])
      x = tf.keras.layers.ReLU(name=f"{p}_out")(x)
  x = tf.keras.layers.GlobalAveragePooling2D(name="pool")(x)
  logits = tf.keras.layers.Dense(
    num_classes,
    kernel_initializer=seeds.glorot_uniform(),
    bias_initializer="zeros",
    name="logits",
  )(x)
  return tf.keras.Model(inputs, logits, name=name)


def _cifar_units(
  name: str, input_shape: tuple[int, ...]
) -> tuple[width_lib.WidthUnit, ...]:
  check_image_input(name, input_shape)
  return _resnet_units(
    CIFAR_STEM_WIDTH,
    CIFAR_STAGE_WIDTHS,
    CIFAR_DEPTHS[name],
    (False,) * len(CIFAR_STAGE_WIDTHS),
  )


def _cifar_resnet(
  name: str,
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None,
) -> tf.keras.Model:
  return _resnet(
    name,
    input_shape,
    num_classes,
    seed,
    _cifar_units(name, input_shape),
    CIFAR_DEPTHS[name],
    (False,) * len(CIFAR_STAGE_WIDTHS),
    widths,
  )


def cifar_resnet_units(name: str) -> UnitsFn:
  """The `width_units` function of CIFAR ResNet `name`: stem, stage1..3."""

  def units(
    input_shape: tuple[int, ...], num_classes: int
  ) -> tuple[width_lib.WidthUnit, ...]:
    del num_classes
    return _cifar_units(name, input_shape)

  return units


def cifar_resnet(name: str) -> Factory:
  """The factory of CIFAR ResNet `name` (a key of `CIFAR_DEPTHS`)."""
  if name not in CIFAR_DEPTHS:
    raise KeyError(name)

  def factory(
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    widths: Sequence[int] | None = None,
  ) -> tf.keras.Model:
    return _cifar_resnet(name, input_shape, num_classes, seed, widths)

  factory.__name__ = name
  factory.__doc__ = (
    f"CIFAR {name[:6].capitalize()}-{name[6:]}"
    f" (He et al. 2016, n = {CIFAR_DEPTHS[name]}); see"
    f" module doc."
  )
  return factory


_RESNET18_PROJECTIONS = _projections(RESNET18_STEM_WIDTH, RESNET18_STAGE_WIDTHS)


def resnet18_units(
  input_shape: tuple[int, ...], num_classes: int
) -> tuple[width_lib.WidthUnit, ...]:
  """stem (64), stage1..stage4 (64, 128, 256, 512)."""
  del num_classes
  check_image_input("resnet18", input_shape)
  return _resnet_units(
    RESNET18_STEM_WIDTH,
    RESNET18_STAGE_WIDTHS,
    RESNET18_BLOCKS_PER_STAGE,
    _RESNET18_PROJECTIONS,
  )


def resnet18(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
) -> tf.keras.Model:
  """CIFAR ResNet-18 (kuangliu/pytorch-cifar); see module doc."""
  return _resnet(
    "resnet18",
    input_shape,
    num_classes,
    seed,
    resnet18_units(input_shape, num_classes),
    RESNET18_BLOCKS_PER_STAGE,
    _RESNET18_PROJECTIONS,
    widths,
  )
