"""VGG-11 and VGG-16 with batch normalisation, as AdaptiveFL's reference builds them.

Simonyan and Zisserman, "Very Deep Convolutional Networks for Large-Scale
Image Recognition" (ICLR 2015), configurations A (VGG-11) and D (VGG-16),
with batch normalisation, in the CIFAR form of AdaptiveFL's reference code
(`mastlab-T3S/AdaptiveFL`, `models/vgg.py`, `vgg_16_bn`), which Jia et al.
("AdaptiveFL: Adaptive Heterogeneous Federated Learning for Resource-
Constrained AIoT Systems", DAC 2024) use for Table 1:

* every convolution is 3x3, stride 1, same padding, WITH bias, followed by
  batch normalisation (PyTorch defaults, `blocks.batch_norm`) and ReLU; "M"
  is a 2x2/2 max-pool. A: 64,M,128,M,256,256,M,512,512,M,512,512; D: 64,64,M,
  128,128,M,256,256,256,M,512,512,512,M,512,512,512.
* a fifth max-pool is appended for 3-channel input (32x32 -> 1x1x512) and
  not for other inputs (28x28x1: 28 -> 14 -> 7 -> 3 -> 1 after four pools);
* flatten, then dense D + ReLU + dropout 0.5, dense D + ReLU + dropout 0.5,
  dense `num_classes` (logits), with D = 4096 for 3-channel input and 256
  otherwise. The reference hard-codes the first dense input as 512; here it
  reads whatever the flatten gives (512 on 32x32x3 and 28x28x1).

Kernels are Glorot-uniform with per-layer seeds, biases zero, as in `cnn.py`
(the reference keeps PyTorch's default initialisers); dropout layers carry
their own seeds. The reference trains with `track_running_stats=False`
(batch statistics also at test time); ours keeps running statistics like any
Keras batch norm, and the algorithms decide how to use them.

Widths (`width.py`): the convolutions (13 for VGG-16, 8 for VGG-11) and then
the two hidden dense layers are the width units, AdaptiveFL's layer index k:
VGG-16 has 15 units (conv1..conv13, fc1, fc2). Unit `convK` sets `convK` and
`bnK`. AdaptiveFL's reference narrows exactly these layers (`slim_idx` counts
convolutions from 0, and the whole classifier MLP is scaled with them).

`vgg16_eighth`: VGG-16 at 1/8 width for fast offline runs (convolutions
8,8,M,16,16,M,32,32,32,M,64,64,64,M,64,64,64; D = 512 for 3-channel input,
32 otherwise), same 15 units.

Exact figures, asserted in `tests/models/` (parameters = trainable, i.e.
batch-norm gamma/beta counted and running statistics not; MACs as in
`counting.py`: batch norm 1 MAC per output element, bias adds not counted):

| model | input | classes | parameters | non-trainable | forward MACs |
|---|---|---|---|---|---|
| vgg16 | 32x32x3 | 10 | 33,646,666 | 8,448 | 332,388,352 |
| vgg16 | 28x28x1 | 10 | 14,921,674 | 8,448 | 205,523,200 |
| vgg11 | 32x32x3 | 10 | 28,149,514 | 5,504 | 171,831,296 |
| vgg16_eighth | 28x28x1 | 10 | 234,946 | 1,056 | 3,283,232 |
| vgg16_eighth | 32x32x3 | 10 | 532,690 | 1,056 | 5,421,824 |

(VGG-16 on 32x32x3: convolutions 313,196,544 MACs, batch norm 276,480, dense
18,915,328. The 14,728,266 often quoted for VGG-16-BN on CIFAR-10 is the
same convolutions with a single 512 -> 10 classifier.)

AdaptiveFL's Table 1 (VGG-16 on CIFAR-10, r_M = 0.66, r_S = 0.40, I in
{8, 6, 4}; `ADAPTIVEFL_VGG16_TABLE1`) against ours (`submodels.pools.
adaptivefl_pool` with floor rounding, as the reference's `int(l * scale)`):

| level | ours, params | paper | ours, MACs | paper FLOPs | ours + 3 x BN outputs |
|---|---|---|---|---|---|
| L1 | 33,646,666 | 33.65M | 332,388,352 | 333.22M | 333,217,792 |
| M1 | 16,814,977 | 16.81M | 271,366,174 | 272.17M | 272,172,514 |
| M2 | 15,410,557 | 15.41M | 239,167,550 | 239.95M | 239,948,594 |
| M3 | 14,839,789 | 14.84M | 202,660,926 | 203.41M | 203,408,178 |
| S1 | 8,397,106 | 8.39M | 238,211,768 | 239.00M | 239,000,552 |
| S2 | 6,483,040 | 6.48M | 190,562,936 | 191.31M | 191,307,368 |
| S3 | 5,667,148 | 5.67M | 138,385,272 | 139.07M | 139,070,568 |

Parameters agree with the table to 0.01M on every level (S1 is 8.397M: the
paper truncates to 8.39M). Our MACs are below the paper's FLOPs by 0.8M or
less; the whole difference is the batch norm: the paper's figures are
`thop.profile` counts, which charge a batch norm in training mode with affine
parameters 4 operations per output element where we charge 1 MAC. Adding 3 x
(batch-norm output elements) to our MACs reproduces every FLOPs entry of
Table 1 to the printed 0.01M (last column). We keep our convention (one MAC
per element, foldable into the preceding convolution at inference), shared
with every other model here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf

from tff_hetero.models import width as width_lib
from tff_hetero.models.blocks import batch_norm
from tff_hetero.models.blocks import numbered_units
from tff_hetero.models.cnn import Stage
from tff_hetero.models.cnn import check_image_input
from tff_hetero.models.seeding import SeedStream

POOL = "M"
CFG_A = (64, POOL, 128, POOL, 256, 256, POOL, 512, 512, POOL, 512, 512)
CFG_D = (
  64,
  64,
  POOL,
  128,
  128,
  POOL,
  256,
  256,
  256,
  POOL,
  512,
  512,
  512,
  POOL,
  512,
  512,
  512,
)
DROPOUT_RATE = 0.5


class PaperRow(NamedTuple):
  """One row of AdaptiveFL's Table 1, as printed (millions)."""

  level: str
  r_w: float
  start_index: int | None  # None: "N/A" (the full model)
  params_m: float
  flops_m: float


# AdaptiveFL (DAC 2024) Table 1, "Split settings for VGG16" (CIFAR-10).
ADAPTIVEFL_VGG16_TABLE1 = (
  PaperRow("L1", 1.00, None, 33.65, 333.22),
  PaperRow("M1", 0.66, 8, 16.81, 272.17),
  PaperRow("M2", 0.66, 6, 15.41, 239.95),
  PaperRow("M3", 0.66, 4, 14.84, 203.41),
  PaperRow("S1", 0.40, 8, 8.39, 239.00),
  PaperRow("S2", 0.40, 6, 6.48, 191.31),
  PaperRow("S3", 0.40, 4, 5.67, 139.07),
)


class _Variant(NamedTuple):
  cfg: tuple[int | str, ...]
  hidden_rgb: int  # D for 3-channel input
  hidden_other: int  # D otherwise


_VARIANTS = {
  "vgg11": _Variant(CFG_A, 4096, 256),
  "vgg16": _Variant(CFG_D, 4096, 256),
  "vgg16_eighth": _Variant(
    tuple(c if c == POOL else c // 8 for c in CFG_D), 512, 32
  ),
}


def _layout(
  name: str, input_shape: tuple[int, ...]
) -> tuple[tuple[int | str, ...], int]:
  """(configuration with the 5th pool if 3-channel, D); checks the shape."""
  variant = _VARIANTS[name]
  rgb = len(input_shape) == 3 and input_shape[-1] == 3
  cfg = variant.cfg + ((POOL,) if rgb else ())
  plan, pools = [], 0
  for item in cfg:
    if item == POOL:
      pools += 1
      plan.append(Stage(f"pool{pools}", 2, 2, "valid"))
  check_image_input(name, input_shape, plan)
  return cfg, variant.hidden_rgb if rgb else variant.hidden_other


def _units(
  name: str, input_shape: tuple[int, ...]
) -> tuple[width_lib.WidthUnit, ...]:
  cfg, hidden = _layout(name, input_shape)
  convs = [c for c in cfg if c != POOL]
  return numbered_units(
    *(
      (f"conv{i}", c, (f"conv{i}", f"bn{i}"))
      for i, c in enumerate(convs, start=1)
    ),
    ("fc1", hidden, ("fc1",)),
    ("fc2", hidden, ("fc2",)),
  )


def _vgg(
  name: str,
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None,
) -> tf.keras.Model:
  cfg, _ = _layout(name, input_shape)
  widths = width_lib.check_widths(name, _units(name, input_shape), widths)
  seeds = SeedStream(seed)
  inputs = tf.keras.Input(shape=input_shape, name="image")
  x = inputs
  conv, pool = 0, 0
  for item in cfg:
    if item == POOL:
      pool += 1
      x = tf.keras.layers.MaxPooling2D(2, 2, name=f"pool{pool}")(x)
      continue
    conv += 1
    x = tf.keras.layers.Conv2D(
      widths[conv - 1],
      3,
      padding="same",
      kernel_initializer=seeds.glorot_uniform(),
      bias_initializer="zeros",
      name=f"conv{conv}",
    )(x)
    x = batch_norm(f"bn{conv}")(x)
    x = tf.keras.layers.ReLU(name=f"relu{conv}")(x)
  x = tf.keras.layers.Flatten(name="flatten")(x)
  for i, units in enumerate(widths[conv:], start=1):
    x = tf.keras.layers.Dense(
      units,
      activation="relu",
      kernel_initializer=seeds.glorot_uniform(),
      bias_initializer="zeros",
      name=f"fc{i}",
    )(x)
    x = tf.keras.layers.Dropout(
      DROPOUT_RATE, seed=seeds.next_seed(), name=f"drop{i}"
    )(x)
  logits = tf.keras.layers.Dense(
    num_classes,
    kernel_initializer=seeds.glorot_uniform(),
    bias_initializer="zeros",
    name="logits",
  )(x)
  return tf.keras.Model(inputs, logits, name=name)


def vgg11_units(
  input_shape: tuple[int, ...], num_classes: int
) -> tuple[width_lib.WidthUnit, ...]:
  """conv1..conv8, fc1, fc2 (10 units)."""
  del num_classes
  return _units("vgg11", input_shape)


def vgg11(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
) -> tf.keras.Model:
  """VGG-11 (configuration A) with batch norm; see module doc."""
  return _vgg("vgg11", input_shape, num_classes, seed, widths)


def vgg16_units(
  input_shape: tuple[int, ...], num_classes: int
) -> tuple[width_lib.WidthUnit, ...]:
  """conv1..conv13, fc1, fc2 (15 units)."""
  del num_classes
  return _units("vgg16", input_shape)


def vgg16(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
) -> tf.keras.Model:
  """VGG-16 (configuration D) with batch norm, AdaptiveFL's; see module doc."""
  return _vgg("vgg16", input_shape, num_classes, seed, widths)


def vgg16_eighth_units(
  input_shape: tuple[int, ...], num_classes: int
) -> tuple[width_lib.WidthUnit, ...]:
  """conv1..conv13, fc1, fc2 at 1/8 width (15 units)."""
  del num_classes
  return _units("vgg16_eighth", input_shape)


def vgg16_eighth(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
) -> tf.keras.Model:
  """VGG-16 at 1/8 width, for fast offline runs; see module doc."""
  return _vgg("vgg16_eighth", input_shape, num_classes, seed, widths)
