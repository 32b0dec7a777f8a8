"""CIFAR ResNets of Bottleneck blocks: FedGKT's official-code variants.

FedGKT's paper (He, Annavaram and Avestimehr, NeurIPS 2020) reports its
model sizes from its official code (FedML, `model/cv/resnet.py` and
`model/cv/resnet56_gkt/`), whose CIFAR "ResNet-56" and "ResNet-110" are
torchvision-style ResNets of Bottleneck blocks: a 3x3 stem convolution with
16 channels + BN + ReLU, then three stages of [6, 6, 6] (ResNet-56) or
[12, 12, 12] (ResNet-110) Bottleneck blocks with 16, 32 and 64 "planes"
(1x1 conv to the planes, 3x3 conv (stride 2 at the entry of stages 2 and 3),
1x1 conv to 4 x planes, each + BN, ReLU after the first two and after the
residual add), a 1x1 convolution + BN projection shortcut in the first block
of every stage (its input never has 4 x planes channels), global average
pooling and a dense layer from 256 features. Depth: 3 convolutions per block
+ the stem + the dense layer (56 = 18 x 3 + 2, 110 = 36 x 3 + 2).

`resnet56_bottleneck` / `resnet110_bottleneck` are those models (FedAvg's
in the paper). FedGKT's edge and server partitions of them are in
`fedgkt.py`. Layer names: `stem_conv`, `stem_bn`, `stem_relu`,
`stage{s}_block{b}_{conv1,bn1,relu1,conv2,bn2,relu2,conv3,bn3,shortcut,
shortcut_bn,add,out}` (stride-2 3x3 convolutions pad explicitly,
`<block>_pad`, as `resnet.py` explains), `pool`, `logits`. Initialisation
as `resnet.py` (He-normal convolutions, Glorot dense, one seed per layer).

Width units (`width.py`): the stem, then per stage two units, in forward
order: `stage{s}_mid` (the planes: conv1/bn1 and conv2/bn2 of every block)
and `stage{s}` (the residual stream of 4 x planes: conv3/bn3 of every block
and the projection shortcut), so every layer with an output width belongs
to exactly one unit. A narrowed model is the prefix of the full one (every
shortcut that changes width is a projection, which reads the kept input
channels only): tested with the other models in `tests/models/`.

Exact figures on 32x32x3 with 10 classes (parameters = trainable; MACs as in
`counting.py`), asserted in `tests/models/` against counts by hand:

| model | parameters | forward MACs |
|---|---|---|
| resnet56_bottleneck | 591,322 | 88,414,720 |
| resnet110_bottleneck | 1,147,738 | 169,662,976 |
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tff_hetero.models import width as width_lib
from tff_hetero.models.blocks import Factory
from tff_hetero.models.blocks import UnitsFn
from tff_hetero.models.blocks import batch_norm
from tff_hetero.models.blocks import numbered_units
from tff_hetero.models.cnn import check_image_input
from tff_hetero.models.resnet import _conv  # pylint: disable=protected-access
from tff_hetero.models.seeding import SeedStream

EXPANSION = 4
STEM_WIDTH = 16
PLANES = (16, 32, 64)
# name -> Bottleneck blocks per stage.
DEPTHS = {"resnet56_bottleneck": 6, "resnet110_bottleneck": 12}


def stage_units(blocks: int, planes: Sequence[int]) -> list[tuple]:
  """`(name, width, layers)` of each stage's mid and stream units."""
  groups = []
  for s, p in enumerate(planes, start=1):
    mid, stream = [], []
    for b in range(1, blocks + 1):
      prefix = f"stage{s}_block{b}"
      mid += [
        f"{prefix}_conv1",
        f"{prefix}_bn1",
        f"{prefix}_conv2",
        f"{prefix}_bn2",
      ]
      stream += [f"{prefix}_conv3", f"{prefix}_bn3"]
      if b == 1:
        stream += [f"{prefix}_shortcut", f"{prefix}_shortcut_bn"]
    groups.append((f"stage{s}_mid", p, tuple(mid)))
    groups.append((f"stage{s}", EXPANSION * p, tuple(stream)))
  return groups


def units(
  stem: int | None, blocks: int, planes: Sequence[int] = PLANES
) -> tuple[width_lib.WidthUnit, ...]:
  """The stem (unless None), then each stage's mid and stream units."""
  stem_unit = [("stem", stem, ("stem_conv", "stem_bn"))] if stem else []
  return numbered_units(*stem_unit, *stage_units(blocks, planes))


def build(
  name: str,
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  model_units: Sequence[width_lib.WidthUnit],
  blocks: int,
  widths: Sequence[int] | None,
  *,
  stem: bool = True,
  input_name: str = "image",
) -> tf.keras.Model:
  """[Stem +] stages of Bottleneck blocks + pool + dense logits.

  `widths` has one entry per unit of `model_units` (stem first if `stem`).
  Without `stem` the input enters stage 1 directly (FedGKT's server).
  """
  widths = width_lib.check_widths(name, model_units, widths)
  seeds = SeedStream(seed)
  inputs = tf.keras.Input(shape=input_shape, name=input_name)
  x = inputs
  rest = list(widths)
  if stem:
    x = _conv(x, rest.pop(0), 3, 1, seeds, "stem_conv", "stem_pad")
    x = batch_norm("stem_bn")(x)
    x = tf.keras.layers.ReLU(name="stem_relu")(x)
  stages = len(rest) // 2
  for s in range(1, stages + 1):
    mid, out = rest[2 * (s - 1)], rest[2 * (s - 1) + 1]
    for b in range(1, blocks + 1):
      p = f"stage{s}_block{b}"
      stride = 2 if s > 1 and b == 1 else 1
      y = _conv(x, mid, 1, 1, seeds, f"{p}_conv1", "")
      y = batch_norm(f"{p}_bn1")(y)
      y = tf.keras.layers.ReLU(name=f"{p}_relu1")(y)
      y = _conv(y, mid, 3, stride, seeds, f"{p}_conv2", f"{p}_pad")
      y = batch_norm(f"{p}_bn2")(y)
      y = tf.keras.layers.ReLU(name=f"{p}_relu2")(y)
      y = _conv(y, out, 1, 1, seeds, f"{p}_conv3", "")
      y = batch_norm(f"{p}_bn3")(y)
      if b == 1:
        shortcut = _conv(x, out, 1, stride, seeds, f"{p}_shortcut", "")
        shortcut = batch_norm(f"{p}_shortcut_bn")(shortcut)
      else:
        shortcut = x
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


def _units(
  name: str, input_shape: tuple[int, ...]
) -> tuple[width_lib.WidthUnit, ...]:
  check_image_input(name, input_shape)
  return units(STEM_WIDTH, DEPTHS[name])


def resnet_units(name: str) -> UnitsFn:
  """The `width_units` function of `name` (a key of `DEPTHS`)."""

  def fn(input_shape, num_classes):
    del num_classes
    return _units(name, input_shape)

  return fn


def resnet(name: str) -> Factory:
  """The factory of `name` (a key of `DEPTHS`)."""
  if name not in DEPTHS:
    raise KeyError(name)

  def factory(input_shape, num_classes, seed, widths=None) -> tf.keras.Model:
    return build(
      name,
      input_shape,
      num_classes,
      seed,
      _units(name, input_shape),
      DEPTHS[name],
      widths,
    )

  factory.__name__ = name
  return factory
