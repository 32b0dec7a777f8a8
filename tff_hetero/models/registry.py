"""The model registry: names the CLI accepts, mapped to seeded Keras factories.

`build_model(name, input_shape, num_classes, seed, widths=None,
depth=None)` validates its arguments, looks the name up in `MODELS` and
calls the factory. Every model outputs logits, and two builds with the same
arguments have identical initial weights (each layer's initialiser carries an
explicit seed derived from `seed`; the TensorFlow global seed plays no part).
The variants, their papers and their exact parameter and MAC counts are
documented in `cnn.py`, `mlp.py`, `vgg.py`, `resnet.py`, `bottleneck.py`,
`fedgkt.py`, `transformer.py` and `depth_cnn.py`.

Depth-scalable models (`depth.py`; InclusiveFL's tiers) have a depth knob:
`ModelSpec.depths` lists their default tier depths (`depth_tiers(name)`),
`build_model(..., depth=L)` builds L blocks (None: the deepest tier), and
block i, the embedding and the head start from the same weights at every
depth. `transformer` (a ViT-style encoder on image patches; the patch side
is min(H, W) // 4: 7 on 28x28, 8 on 32x32, 2 on 8x8, so 16 tokens on square
images) and `depth_cnn` (a residual CNN of same-shape blocks) have tiers
(4, 8, 12), InclusiveFL's 4-, 8- and 12-layer models. `depth_matched_widths`
gives the widths at which the deepest tier has about the parameters of a
shallower one (InclusiveFL's HeteroFL baseline narrows the hidden size so).

Every model is width-capable (`width.py`): `width_units(name, input_shape,
num_classes)` lists its width units, and `build_model(..., widths=...)`
builds the sub-model keeping the first `widths[k]` channels of unit k (same
layers, names and variable order as the full model, narrower variables).
`ModelSpec.default_start_indices` are the start indices I of AdaptiveFL's
pool for the model (decreasing, each >= 1: the first unit stays whole): the
paper's (8, 6, 4) for VGG-16, the official code's ResNet-18 setting (its
`depth_saved` 2, 3, 4 keep the stem and the first 1, 2, 3 stages whole: 4, 3,
2 here), and for the other models the largest indices (up to three) whose
pool, with the default ratios 0.66 / 0.4 on the model's images, has sizes
increasing in pool order (tested for every model); a model with one width
unit has none. For `transformer` (units hidden, mlp) that is I = 1: the
hidden size whole, the MLP narrowed.

Models take images (float32 (H, W, C)) or token ids (int32 (seq_len,)):
`ModelSpec.images` says which (``"text"`` for token models, whose
`takes_tokens` is true). `text_transformer` is `transformer`'s encoder on
token ids (`transformer.text_transformer`: a token embedding in place of
the patches, the same blocks `block_1..block_L`, head, depth tiers (4, 8,
12) and width units hidden, mlp); its input shape is ``(seq_len,)`` and its
embedding has `vocab_size` rows, which `build_model(..., vocab_size=...)`
passes (the training program passes the loaded vocabulary's size; None
means `transformer.DEFAULT_VOCAB_SIZE`, 20,000, the GLUE loader's cap, for
sizes without data such as `pipelines.describe`). An image model given a
token shape or a `vocab_size`, or a token model given an image shape, is a
one-line `ModelError`.

A new model is added by appending its `ModelSpec` to `_SPECS`.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
import numbers
import types

import attrs
import tensorflow as tf

from tff_hetero.errors import ModelError
from tff_hetero.models import bottleneck
from tff_hetero.models import cnn
from tff_hetero.models import depth_cnn
from tff_hetero.models import fedgkt
from tff_hetero.models import mlp
from tff_hetero.models import resnet
from tff_hetero.models import transformer
from tff_hetero.models import vgg
from tff_hetero.models import width as width_lib

ModelFactory = Callable[..., tf.keras.Model]
WidthUnitsFn = Callable[..., tuple[width_lib.WidthUnit, ...]]


@attrs.frozen
class ModelSpec:
  """A registered model.

  Attributes:
    name: Registry name (the `--model` flag value).
    factory: `(input_shape, num_classes, seed, widths=None) ->
      tf.keras.Model` (logits); `widths=None` builds the full model. A model
      with `depths` takes `depth=None` too (None: its deepest tier).
    description: One line: the variant, as precisely as it matters.
    paper: Where the architecture comes from.
    width_units: `(input_shape, num_classes) -> tuple[WidthUnit, ...]`; may
      raise `ModelError` for shapes the model cannot take. A model with
      `depths` takes `depth=None` too (its units name the blocks).
    default_start_indices: AdaptiveFL's start indices I for this model's pool,
      decreasing, each in 1..(number of units - 1), such that the pool's
      sizes increase in pool order; empty when no such pool exists.
    images: The kind of input the model is meant for ("cifar": 32x32x3
      images, "mnist": 28x28x1 images, "text": int32 token ids of shape
      (seq_len,), GLUE's), e.g. for `pipelines.describe`'s default shape.
      A "text" model's factory and width units take (seq_len,) shapes and
      its factory a `vocab_size` keyword too.
    split_layer: For a model that is cut between a device and a server
      (FedGKT's edge models; split learning), the layer whose output the
      device sends: the extractor is the model up to it. None otherwise.
    depths: For a depth-scalable model (`depth.py`), its default tier
      depths, increasing (InclusiveFL's 4, 8, 12); the factory's default
      depth is the last. Empty for models without a depth knob.
    predictor_layers: The layers of the model's predictor head, SPATL's
      private P(w_p, e): every other layer is the shared encoder E(w_e, x).
      The classifier (`logits`) for every registered model: the paper's
      encoder takes the input x, so the stem belongs to it.
  """

  name: str
  factory: ModelFactory
  description: str
  paper: str
  width_units: WidthUnitsFn
  default_start_indices: tuple[int, ...]
  images: str = "mnist"
  split_layer: str | None = None
  depths: tuple[int, ...] = ()
  predictor_layers: tuple[str, ...] = ("logits",)

  @property
  def takes_tokens(self) -> bool:
    """Whether the model reads int32 token ids rather than images."""
    return self.images == TEXT


TEXT = "text"
"""`ModelSpec.images` of the models that read token ids."""


def _token_shape(name: str, input_shape: tuple[int, ...]) -> int:
  """seq_len of a token model's (seq_len,) input; `ModelError` otherwise."""
  if len(input_shape) != 1:
    raise ModelError(
      f"model {name!r} takes token ids shaped (seq_len,), got input_shape"
      f" {tuple(input_shape)} (an image shape: use an image model)"
    )
  return input_shape[0]


def _text_transformer(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
  depth: int | None = None,
  vocab_size: int | None = None,
) -> tf.keras.Model:
  """`transformer.text_transformer` in the registry's factory shape."""
  seq_len = _token_shape("text_transformer", input_shape)
  return transformer.text_transformer(
    seq_len,
    transformer.DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size,
    num_classes,
    seed,
    widths,
    depth,
  )


def _text_transformer_units(
  input_shape: tuple[int, ...], num_classes: int, depth: int | None = None
) -> tuple[width_lib.WidthUnit, ...]:
  """`transformer.text_transformer_units` after checking the shape."""
  del num_classes
  _token_shape("text_transformer", input_shape)
  return transformer.text_transformer_units(depth)


_SPECS = (
  ModelSpec(
    name="mnist_cnn",
    factory=cnn.mnist_cnn,
    description=(
      "conv5x5(10,valid)-pool2-conv5x5(20,valid)-pool2-fc50-fc; "
      "21,840 params on 28x28x1/10 classes; needs >= 16x16"
    ),
    paper="Bibikar et al. 2022 (FedDST), as used by FedSGC",
    width_units=cnn.mnist_cnn_units,
    default_start_indices=(2,),
  ),
  ModelSpec(
    name="mnist_cnn_feddst",
    factory=cnn.mnist_cnn_feddst,
    description=(
      "FedDST reference MNISTNet: conv5x5(10)-pool3/1-conv5x5(20)"
      "-pool3/1-fc50-fc; 261,840 params on 28x28x1/10 classes"
    ),
    paper="Bibikar et al. 2022 (FedDST), code bibikar/feddst models.py",
    width_units=cnn.mnist_cnn_feddst_units,
    default_start_indices=(2, 1),
  ),
  ModelSpec(
    name="cifar_cnn",
    factory=cnn.cifar_cnn,
    description=(
      "TF CIFAR-10 tutorial CNN without LRN: conv5x5(64)-pool3/2-"
      "conv5x5(64)-pool3/2-fc384-fc192-fc; 1,756,426 params on "
      "32x32x3/10 classes"
    ),
    paper="McMahan et al. 2017 (FedAvg), from the TensorFlow CIFAR-10 tutorial",
    width_units=cnn.cifar_cnn_units,
    default_start_indices=(2, 1),
    images="cifar",
  ),
  ModelSpec(
    name="small_cnn",
    factory=cnn.small_cnn,
    description=(
      "conv3x3(16,same)-pool2-conv3x3(32,same)-pool2-fc; 6,090 "
      "params on 8x8x1/10 classes; for tiny images"
    ),
    paper="none (this project's test model)",
    width_units=cnn.small_cnn_units,
    default_start_indices=(1,),
  ),
  ModelSpec(
    name="mlp",
    factory=mlp.mlp,
    description="flatten-fc64-fc; 4,810 params on 8x8x1/10 classes",
    paper="none (this project's test model)",
    width_units=mlp.mlp_units,
    default_start_indices=(),
  ),
  ModelSpec(
    name="mnist_2nn",
    factory=mlp.mnist_2nn,
    description="flatten-fc200-fc200-fc; 199,210 params on 28x28x1/10 classes",
    paper="McMahan et al. 2017 (FedAvg), the 2NN",
    width_units=mlp.mnist_2nn_units,
    default_start_indices=(1,),
  ),
  *(
    ModelSpec(
      name=name,
      factory=resnet.cifar_resnet(name),
      description=(
        f"CIFAR ResNet-{6 * n + 2}: conv3x3(16)-BN-ReLU, 3 stages x {n}"
        f" BasicBlock(16/32/64), option-A shortcuts zero-padded at the end,"
        f" GAP-fc; {params} params on 32x32x3/10 classes"
      ),
      paper="He et al. 2016 (ResNet), Section 4.2 (CIFAR-10)",
      width_units=resnet.cifar_resnet_units(name),
      default_start_indices=(3, 2, 1),
      images="cifar",
    )
    for name, n, params in (
      ("resnet8", 1, "75,290"),
      ("resnet20", 3, "269,722"),
      ("resnet32", 5, "464,154"),
      ("resnet56", 9, "853,018"),
      ("resnet110", 18, "1,727,962"),
    )
  ),
  *(
    ModelSpec(
      name=name,
      factory=fedgkt.edge_model(name),
      description=(
        f"FedGKT edge ResNet-{2 * blocks + 2}: conv3x3(16)-BN-ReLU (the"
        f" feature extractor: H is its output, 16 channels at full"
        f" resolution), {blocks} BasicBlock(16), GAP-fc; {params} params"
        f" on 32x32x3/10 classes"
      ),
      paper="He et al. 2020 (FedGKT), Figure 1(b) and Table 5",
      width_units=fedgkt.edge_units(name),
      default_start_indices=(1,),
      images="cifar",
      split_layer=fedgkt.SPLIT_LAYER,
    )
    for name, blocks, params in (
      ("fedgkt_edge_resnet4", 1, "5,306"),
      ("fedgkt_edge_resnet6", 2, "9,978"),
      ("fedgkt_edge_resnet8", 3, "14,650"),
    )
  ),
  ModelSpec(
    name="fedgkt_edge_resnet8_bottleneck",
    factory=fedgkt.edge_model("fedgkt_edge_resnet8_bottleneck"),
    description=(
      "FedGKT edge ResNet-8 of the official code (FedML resnet8_56):"
      " conv3x3(16)-BN-ReLU (the feature extractor), 2 Bottleneck(16,"
      " x4), GAP-fc; 10,586 params on 32x32x3/10 classes"
    ),
    paper="He et al. 2020 (FedGKT), Section 4.3 (11K parameters)",
    width_units=fedgkt.edge_units("fedgkt_edge_resnet8_bottleneck"),
    default_start_indices=(2,),
    images="cifar",
    split_layer=fedgkt.SPLIT_LAYER,
  ),
  *(
    ModelSpec(
      name=name,
      factory=fedgkt.server_model(name),
      description=(
        f"FedGKT server ResNet-{6 * n + 1}: CIFAR ResNet-{6 * n + 2}"
        f" without its stem conv, taking the edge's 16-channel features"
        f" (H x W x 16 for H x W images), 3 stages x {n} BasicBlock"
        f"(16/32/64), GAP-fc; {params} params for 10 classes"
      ),
      paper=(
        "He et al. 2020 (FedGKT), Figure 1(b), Appendix B.3 (ResNet-19 and"
        " ResNet-7: this project's small variants)"
      ),
      width_units=fedgkt.server_units(name),
      default_start_indices=(2, 1),
      images="cifar",
    )
    for name, n, params in (
      ("fedgkt_server_resnet7", 1, "74,826"),
      ("fedgkt_server_resnet19", 3, "269,258"),
      ("fedgkt_server_resnet55", 9, "852,554"),
      ("fedgkt_server_resnet109", 18, "1,727,498"),
    )
  ),
  *(
    ModelSpec(
      name=name,
      factory=fedgkt.server_model(name),
      description=(
        f"FedGKT server ResNet-{9 * n + 1} of the official code"
        f" (FedML resnet56_server): {full} without its stem conv, taking"
        f" the edge's 16-channel features, 3 stages x {n}"
        f" Bottleneck(16/32/64, x4), GAP-fc; {params} params for 10"
        f" classes"
      ),
      paper="He et al. 2020 (FedGKT), official code (FedML)",
      width_units=fedgkt.server_units(name),
      default_start_indices=(4, 2, 1),
      images="cifar",
    )
    for name, full, n, params in (
      (
        "fedgkt_server_resnet55_bottleneck",
        "resnet56_bottleneck",
        6,
        "590,858",
      ),
      (
        "fedgkt_server_resnet109_bottleneck",
        "resnet110_bottleneck",
        12,
        "1,147,274",
      ),
    )
  ),
  *(
    ModelSpec(
      name=name,
      factory=bottleneck.resnet(name),
      description=(
        f"CIFAR ResNet-{9 * n + 2} of Bottleneck blocks (FedGKT's"
        f" official code, FedML resnet{9 * n + 2}): conv3x3(16)-BN-ReLU,"
        f" 3 stages x {n} Bottleneck(16/32/64, x4), 1x1 projection"
        f" shortcuts, GAP-fc; {params} params on 32x32x3/10 classes"
      ),
      paper="He et al. 2020 (FedGKT), FedAvg's model in its official code",
      width_units=bottleneck.resnet_units(name),
      default_start_indices=(5, 3, 1),
      images="cifar",
    )
    for name, n, params in (
      ("resnet56_bottleneck", 6, "591,322"),
      ("resnet110_bottleneck", 12, "1,147,738"),
    )
  ),
  ModelSpec(
    name="resnet18",
    factory=resnet.resnet18,
    description=(
      "CIFAR ResNet-18 (kuangliu): conv3x3(64)-BN-ReLU, 4 stages"
      " x 2 BasicBlock(64/128/256/512), 1x1 projection shortcuts,"
      " GAP-fc; 11,173,962 params on 32x32x3/10 classes"
    ),
    paper=(
      "He et al. 2016 (ResNet); CIFAR form of kuangliu/pytorch-cifar,"
      " as used by AdaptiveFL (whose code has 96 channels in stage 1)"
    ),
    width_units=resnet.resnet18_units,
    default_start_indices=(4, 3, 2),
    images="cifar",
  ),
  ModelSpec(
    name="vgg11",
    factory=vgg.vgg11,
    description=(
      "VGG-11-BN (cfg A, conv3x3 with bias-BN-ReLU), 5th pool"
      " and fc 4096-4096 for 3-channel input (else 4 pools, fc"
      " 256-256), dropout 0.5; 28,149,514 params on 32x32x3/10"
      " classes"
    ),
    paper=(
      "Simonyan & Zisserman 2015 (VGG), as AdaptiveFL's code"
      " mastlab-T3S/AdaptiveFL models/vgg.py"
    ),
    width_units=vgg.vgg11_units,
    default_start_indices=(6, 4, 2),
    images="cifar",
  ),
  ModelSpec(
    name="vgg16",
    factory=vgg.vgg16,
    description=(
      "VGG-16-BN (cfg D, conv3x3 with bias-BN-ReLU), 5th pool"
      " and fc 4096-4096 for 3-channel input (else 4 pools, fc"
      " 256-256), dropout 0.5; 33,646,666 params on 32x32x3/10"
      " classes (AdaptiveFL Table 1: 33.65M)"
    ),
    paper=(
      "Simonyan & Zisserman 2015 (VGG), as AdaptiveFL (Jia et al."
      " 2024) Table 1 and its code mastlab-T3S/AdaptiveFL models/vgg.py"
    ),
    width_units=vgg.vgg16_units,
    default_start_indices=(8, 6, 4),
    images="cifar",
  ),
  ModelSpec(
    name="vgg16_eighth",
    factory=vgg.vgg16_eighth,
    description=(
      "vgg16 at 1/8 width (convs 8..64, fc 512-512 for 3-channel"
      " input, else 32-32); 234,946 params on 28x28x1/10"
      " classes; for fast offline runs"
    ),
    paper="none (this project's scaled-down AdaptiveFL VGG-16)",
    width_units=vgg.vgg16_eighth_units,
    default_start_indices=(8, 6, 4),
    images="cifar",
  ),
  ModelSpec(
    name="transformer",
    factory=transformer.image_transformer,
    description=(
      "ViT-style encoder: patches of side min(H,W)/4 (7 on 28x28; 16"
      " tokens)-dense 64 + position embedding, block_1..block_L pre-LN"
      " (4 heads x 16, MLP 128, GELU), LN-mean pool-fc64 tanh-fc; depth"
      " 4/8/12: 143,050/276,938/410,826 params on 28x28x1/10 classes"
    ),
    paper=(
      "Liu et al. 2022 (InclusiveFL): 4/8/12-layer transformer tiers"
      " sharing the bottom layers; this project's small image variant"
    ),
    width_units=transformer.image_transformer_units,
    default_start_indices=(1,),
    depths=transformer.DEFAULT_TIERS,
  ),
  ModelSpec(
    name="text_transformer",
    factory=_text_transformer,
    description=(
      "transformer on token ids: token embedding (vocab_size x 64) +"
      " position embedding, block_1..block_L pre-LN (4 heads x 16, MLP 128,"
      " GELU), LN-mean pool-fc64 tanh-fc; depth 4/8/12:"
      " 1,422,402/1,556,290/1,690,178 params on 64 tokens, a 20,000-id"
      " vocabulary and 2 classes (the embedding: 1,280,000)"
    ),
    paper=(
      "Liu et al. 2022 (InclusiveFL): 4/8/12-layer transformer tiers on"
      " GLUE; this project's small text variant (RoBERTa-shaped, not"
      " pretrained)"
    ),
    width_units=_text_transformer_units,
    default_start_indices=(1,),
    images=TEXT,
    depths=transformer.DEFAULT_TIERS,
  ),
  ModelSpec(
    name="depth_cnn",
    factory=depth_cnn.depth_cnn,
    description=(
      "conv3x3(32,stride 2)-ReLU, block_1..block_L residual"
      " x+conv3x3(relu(conv3x3(relu(x)))) (32), no BN, ReLU-GAP-fc32-fc;"
      " depth 4/8/12: 75,690/149,674/223,658 params on 28x28x1/10 classes"
    ),
    paper=(
      "none (this project's convolutional counterpart of InclusiveFL's"
      " depth tiers)"
    ),
    width_units=depth_cnn.depth_cnn_units,
    default_start_indices=(),
    depths=depth_cnn.DEFAULT_TIERS,
  ),
)

MODELS: Mapping[str, ModelSpec] = types.MappingProxyType(
  {spec.name: spec for spec in _SPECS}
)
assert len(MODELS) == len(_SPECS), "duplicate model name in _SPECS"


def model_names() -> tuple[str, ...]:
  """The registered names, sorted."""
  return tuple(sorted(MODELS))


def _is_int(value: object) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_input_shape(input_shape: object) -> tuple[int, ...]:
  """A tuple of positive ints (lists, numpy shapes and TensorShapes too)."""
  dims: tuple = ()
  if not isinstance(input_shape, (str, bytes)):
    try:
      dims = tuple(input_shape)  # type: ignore[arg-type]
    except TypeError:
      dims = ()
  if not dims or not all(_is_int(d) and d >= 1 for d in dims):
    raise ModelError(
      f"input_shape must be a non-empty sequence of positive integers "
      f"(one example, no batch dimension), got {input_shape!r}"
    )
  return tuple(int(d) for d in dims)


def get_spec(name: str) -> ModelSpec:
  """The spec of registered model `name`; `ModelError` listing names if none."""
  spec = MODELS.get(name) if isinstance(name, str) else None
  if spec is None:
    raise ModelError(
      f"unknown model {name!r}; accepted: {', '.join(model_names())}"
    )
  return spec


def split_layer(name: str) -> str:
  """The layer after which model `name` is cut (`ModelSpec.split_layer`).

  Raises:
    ModelError: unknown name, or a model with no split point (the message
      lists those that have one).
  """
  spec = get_spec(name)
  if spec.split_layer is None:
    splittable = sorted(n for n, s in MODELS.items() if s.split_layer)
    raise ModelError(
      f"model {name!r} has no split point; models with one:"
      f" {', '.join(splittable)}"
    )
  return spec.split_layer


def encoder_predictor_split(
  name: str, model: tf.keras.Model
) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(encoder layer names, predictor layer names) of `model`, a build of
  registered model `name`, in layer order (`ModelSpec.predictor_layers`).

  Raises:
    ModelError: unknown name, or a predictor layer `model` does not have.
  """
  predictor = get_spec(name).predictor_layers
  names = tuple(layer.name for layer in model.layers)
  missing = [p for p in predictor if p not in names]
  if missing:
    raise ModelError(
      f"model {name!r} has no predictor layer(s) {', '.join(missing)}"
    )
  encoder = tuple(n for n in names if n not in predictor)
  return encoder, tuple(n for n in names if n in predictor)


def depth_tiers(name: str) -> tuple[int, ...]:
  """The default tier depths of model `name` (`ModelSpec.depths`).

  Raises:
    ModelError: unknown name, or a model without a depth knob (the message
      lists those with one).
  """
  spec = get_spec(name)
  if not spec.depths:
    raise ModelError(
      f"model {name!r} has no depth knob; models with one:"
      f" {', '.join(_depth_models())}"
    )
  return spec.depths


def _depth_models() -> list[str]:
  return sorted(n for n, s in MODELS.items() if s.depths)


def _check_depth(spec: ModelSpec, depth: object) -> dict:
  """The factory's depth keyword arguments (none for models without)."""
  if depth is None:
    return {"depth": None} if spec.depths else {}
  if not spec.depths:
    raise ModelError(
      f"model {spec.name!r} has no depth knob (got depth={depth!r}); models"
      f" with one: {', '.join(_depth_models())}"
    )
  if not _is_int(depth) or depth < 1:
    raise ModelError(
      f"model {spec.name!r}: depth must be an integer >= 1, got {depth!r}"
    )
  return {"depth": int(depth)}


def _check_shape_and_classes(
  input_shape: object, num_classes: object
) -> tuple[tuple[int, ...], int]:
  shape = _check_input_shape(input_shape)
  if not _is_int(num_classes) or num_classes < 2:
    raise ModelError(
      f"num_classes must be an integer >= 2, got {num_classes!r}"
    )
  return shape, int(num_classes)


def width_units(
  name: str,
  input_shape: Sequence[int],
  num_classes: int,
  depth: int | None = None,
) -> tuple[width_lib.WidthUnit, ...]:
  """The width units of model `name` on this input (see `width.py`).

  `depth` (models with a depth knob only; None: the deepest tier) changes
  only which blocks the units' `layers` name, not the widths.

  Raises:
    ModelError: unknown name, malformed arguments, a depth for a model
      without a depth knob, or an input shape the model cannot take.
  """
  spec = get_spec(name)
  shape, classes = _check_shape_and_classes(input_shape, num_classes)
  return spec.width_units(shape, classes, **_check_depth(spec, depth))


def _check_vocab_size(spec: ModelSpec, vocab_size: object) -> dict:
  """The factory's vocab_size keyword arguments (none for image models)."""
  if not spec.takes_tokens:
    if vocab_size is not None:
      raise ModelError(
        f"model {spec.name!r} takes images, not token ids (got"
        f" vocab_size={vocab_size!r}); models for token ids:"
        f" {', '.join(_token_models())}"
      )
    return {}
  if vocab_size is not None and (not _is_int(vocab_size) or vocab_size < 1):
    raise ModelError(
      f"model {spec.name!r}: vocab_size must be an integer >= 1, got"
      f" {vocab_size!r}"
    )
  return {"vocab_size": None if vocab_size is None else int(vocab_size)}


def _token_models() -> list[str]:
  return sorted(n for n, s in MODELS.items() if s.takes_tokens)


def build_model(
  name: str,
  input_shape: Sequence[int],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
  depth: int | None = None,
  vocab_size: int | None = None,
) -> tf.keras.Model:
  """Builds registered model `name` (logits out, seeded initial weights).

  Args:
    name: A key of `MODELS`.
    input_shape: Shape of one example without the batch dimension, e.g.
      `(28, 28, 1)`.
    num_classes: Number of labels (>= 2): the width of the logits.
    seed: Non-negative integer; every layer's initialiser seed derives from it.
    widths: One output width per width unit (`width_units`), each in
      1..full width; None (or the full widths) builds the full model.
    depth: For a model with a depth knob (`ModelSpec.depths`), the number of
      blocks, an integer >= 1; None builds the deepest tier. Must be None
      for other models.
    vocab_size: For a model on token ids (`ModelSpec.takes_tokens`), the
      rows of its token embedding: the ids run over 0..vocab_size - 1
      (None: `transformer.DEFAULT_VOCAB_SIZE`). Must be None for image
      models.

  Raises:
    ModelError: unknown name, malformed arguments, widths that do not fit the
      model's units, a depth for a model without a depth knob, a vocab_size
      for an image model, or an input shape the model cannot take (e.g.
      `mnist_cnn` on 8x8 images, an image model on token ids or the other
      way round).
  """
  spec = get_spec(name)
  shape, classes = _check_shape_and_classes(input_shape, num_classes)
  if not _is_int(seed) or seed < 0:
    raise ModelError(f"seed must be a non-negative integer, got {seed!r}")
  vocab_kwargs = _check_vocab_size(spec, vocab_size)
  depth_kwargs = _check_depth(spec, depth)
  units = spec.width_units(shape, classes, **depth_kwargs)
  if widths is not None:
    if isinstance(widths, (str, bytes)):
      raise ModelError(f"widths must be a sequence of integers, got {widths!r}")
    try:
      widths = tuple(int(w) if _is_int(w) else w for w in widths)
    except TypeError:
      raise ModelError(
        f"widths must be a sequence of integers, got {widths!r}"
      ) from None
  checked = width_lib.check_widths(name, units, widths)
  return spec.factory(
    shape, classes, int(seed), checked, **depth_kwargs, **vocab_kwargs
  )


def _depth_params(
  spec: ModelSpec,
  shape: tuple[int, ...],
  classes: int,
  widths: tuple[int, ...],
  depth: int,
  vocab_kwargs: dict,
) -> int:
  """Trainable parameters at `depth`, from a build of depth 1 (every block
  has the same shapes, so each adds block_1's count)."""
  model = spec.factory(shape, classes, 0, widths, depth=1, **vocab_kwargs)
  block = model.get_layer("block_1").count_params()
  return model.count_params() + (depth - 1) * block


def depth_matched_widths(
  name: str,
  input_shape: Sequence[int],
  num_classes: int,
  depth: int,
  full_depth: int | None = None,
  vocab_size: int | None = None,
) -> tuple[int, ...]:
  """Widths at which the `full_depth` model has about the parameters of the
  `depth` one: InclusiveFL's HeteroFL baseline (Section 4: "reducing the
  hidden size from 768 to 456, 624" for the 4- and 8-layer tiers).

  Only width unit 1 (the transformer's hidden size, the CNN's channels) is
  narrowed, the other units stay whole; of its widths the one whose
  parameter count is closest to the `depth` model's at full width (ties:
  the narrower).

  Args:
    name: A model with a depth knob.
    input_shape, num_classes: As `build_model`.
    depth: The tier whose parameter count to match.
    full_depth: The depth of the narrowed model (None: the deepest tier).
    vocab_size: As `build_model` (token models only).

  Raises:
    ModelError: as `build_model`, or `depth` deeper than `full_depth`.
  """
  tiers = depth_tiers(name)
  spec = get_spec(name)
  shape, classes = _check_shape_and_classes(input_shape, num_classes)
  vocab_kwargs = _check_vocab_size(spec, vocab_size)
  if depth is None:
    raise ModelError(f"model {name!r}: depth must be an integer >= 1, got None")
  depth = _check_depth(spec, depth)["depth"]
  full_depth = _check_depth(spec, full_depth)["depth"] or tiers[-1]
  if depth > full_depth:
    raise ModelError(
      f"model {name!r}: depth {depth} is deeper than the narrowed model's"
      f" {full_depth}"
    )
  full = width_lib.full_widths(spec.width_units(shape, classes, depth=depth))
  if depth == full_depth:
    return full
  target = _depth_params(spec, shape, classes, full, depth, vocab_kwargs)

  def params(first: int) -> int:
    return _depth_params(
      spec, shape, classes, (first, *full[1:]), full_depth, vocab_kwargs
    )

  low, high = 1, full[0]  # the largest width whose count is <= target
  if params(low) > target:
    return (low, *full[1:])
  while low < high:
    middle = (low + high + 1) // 2
    if params(middle) <= target:
      low = middle
    else:
      high = middle - 1
  best = low
  if low < full[0] and params(low + 1) - target < target - params(low):
    best = low + 1
  return (best, *full[1:])
