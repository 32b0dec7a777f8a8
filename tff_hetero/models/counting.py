"""Exact parameter and compute counts of `tf.keras` models.

Parameters (`count_params`)
  Every weight of the model counts once (shared layers once). Trainable
  weights are what an optimiser updates: kernels, biases, and batch-norm
  gamma/beta. Non-trainable weights are the rest: batch-norm running mean and
  variance, tfmot pruning masks/thresholds/steps, frozen layers. The reference
  figures FL papers quote ("batch-norm gamma/beta counted, running statistics
  not", e.g. CIFAR ResNet-20 = 269,722) are `ParamCount.trainable`.

Compute (`count_flops`, `layer_costs`)
  The unit is the multiply-accumulate (MAC) per example of one forward pass,
  which is what federated-learning papers' "FLOPs" tables report (AdaptiveFL's
  Table 1, HeteroFL, FedGKT); one MAC is one multiply plus one add, so strict
  floating-point operations are about 2 x MACs. Every figure in this module,
  `training_flops_per_example` included, is in MACs. Per layer, read from the
  layer's configuration and the shapes of its built inputs and outputs:

  * Conv1D/2D/3D: out_positions x C_out x (k_h x k_w x C_in / groups).
  * Conv*Transpose: in_positions x C_in x k_h x k_w x C_out (each input
    position scatters a full kernel).
  * DepthwiseConv1D/2D: out_positions x C_in x depth_multiplier x k_h x k_w.
  * SeparableConv1D/2D: the depthwise part plus the pointwise 1x1 part
    out_positions x (C_in x depth_multiplier) x C_out.
  * Dense: (product of the input's non-batch dims) x units, so a Dense on a
    sequence counts once per position.
  * MultiHeadAttention (rank-3 inputs, attention over axis 1): the Q, K, V and
    output projections, plus heads x T x S x (key_dim + value_dim) for the
    scores and the weighted sum; the softmax is not counted.
  * This package's depth-scalable blocks (`transformer.py`,
    `depth_cnn.py`): a `TransformerBlock` on (T, d) tokens with H heads of
    size k and an MLP of width m costs its two layer norms (T x d each), the
    Q, K, V projections (3 x T x d x H x k), the scores and the weighted sum
    (H x T x T x (k + k)), the output projection (T x H x k x d) and the MLP
    (2 x T x d x m); a `ResidualConvBlock` on H x W x C its two 3x3
    convolutions (2 x H x W x C x 9 C). A `PositionEmbedding` is an addition
    (0 MACs; its T x d table counts as parameters).
  * Bias additions are NOT counted (they are adds, not multiply-adds).
  * Batch, layer and group normalisation: elementwise, ONE MAC per output
    element (at inference the normalisation folds into y = a * x + b per
    channel); statistics computed in training are not counted.
  * Parameter-free layers count 0: activations, pooling (comparisons or adds),
    Add/Concatenate/Multiply and other merges, Flatten/Reshape/padding/
    cropping/upsampling, dropout and noise, Lambda layers and TensorFlow ops
    called directly in a functional model (except matrix products and
    convolutions, which raise), and this package's own `ChannelShortcut`
    (subsampling and zero-padding, `blocks.py`). Embedding lookups count 0
    (no arithmetic).
  * Any other layer type raises `ModelError` naming it: a parametrised layer
    never silently costs 0. Each rule also predicts the layer's parameter
    count and raises if the layer holds a different number (a subclass with
    extra weights needs its own rule).
  * A Keras model used as a layer is counted recursively, its rows prefixed
    `outer/inner`; a layer called several times is counted once per call (the
    later calls as `name#2`, ... with 0 parameters, so the parameter column
    sums to the model's count). tfmot `PruneLowMagnitude` wrappers cost what
    the layer they wrap costs dense: masks are not exploited.

  Shapes must be fully known: build models with a fixed input shape.

Training (`training_flops_per_example`)
  forward MACs x 3: the backward pass costs about twice the forward pass (one
  product for the gradient with respect to the activations, one for the
  weights), the convention behind "6 x params FLOPs per token" in Kaplan et
  al., "Scaling Laws for Neural Language Models" (2020). It slightly
  over-counts the first layer, whose input gradient is never needed. The
  caller multiplies by the number of examples a client actually processed
  (all local epochs).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
import math
from typing import Any
from typing import NamedTuple

import tensorflow as tf

from tff_hetero.errors import ModelError
from tff_hetero.models.blocks import ChannelShortcut
from tff_hetero.models.depth_cnn import ResidualConvBlock
from tff_hetero.models.transformer import PositionEmbedding
from tff_hetero.models.transformer import TransformerBlock

TRAINING_MACS_MULTIPLIER = 3

Shape = tuple[Any, ...]


class ParamCount(NamedTuple):
  """Parameters of a model: trainable, non-trainable and their sum."""

  trainable: int
  non_trainable: int
  total: int


class LayerCost(NamedTuple):
  """One layer call of a model, for tables.

  Attributes:
    name: Layer name, prefixed `outer/` inside nested models and suffixed
      `#k` for the k-th call of a shared layer.
    kind: The Keras class name, e.g. `Conv2D` (a tfmot wrapper:
      `PruneLowMagnitude(Conv2D)`).
    params: Trainable parameters (0 for repeated calls of a shared layer).
    non_trainable: Non-trainable weights (running statistics, masks).
    macs: Forward multiply-accumulates per example (module docstring).
  """

  name: str
  kind: str
  params: int
  non_trainable: int
  macs: int


class _Cost(NamedTuple):
  macs: int
  expected_params: int  # all weights of the layer the rule understood


_Rule = Callable[[Any, str, list, list], _Cost]


def _size(weights: Sequence[tf.Variable]) -> int:
  return sum(math.prod(int(d) for d in w.shape) for w in weights)


def count_params(model: tf.keras.Model) -> ParamCount:
  """Trainable, non-trainable and total parameters of a built model."""
  if not model.built:
    raise ModelError(
      f"model {model.name!r} is not built; build it on an input shape first"
    )
  trainable = _size(model.trainable_weights)
  non_trainable = _size(model.non_trainable_weights)
  return ParamCount(trainable, non_trainable, trainable + non_trainable)


# --------------------------------------------------------------------------
# Shapes


def _shape_list(structure: Any) -> list[Shape]:
  """Flattens a node's input/output shape structure into a list of shapes."""
  if isinstance(structure, tf.TensorShape):
    return [tuple(structure.as_list())]
  if isinstance(structure, tuple) and all(
    d is None or isinstance(d, int) for d in structure
  ):
    return [structure]
  if isinstance(structure, Mapping):
    items = list(structure.values())
  elif isinstance(structure, (list, tuple)):
    items = list(structure)
  else:
    raise ModelError(f"unexpected shape structure {structure!r}")
  return [shape for item in items for shape in _shape_list(item)]


def _known(name: str, shape: Shape) -> tuple[int, ...]:
  """The shape with its batch dimension replaced by 1, all dims known."""
  dims = tuple(shape)
  if not dims or any(d is None for d in dims[1:]):
    raise ModelError(
      f"layer {name!r} has shape {dims} with unknown dimensions; build the "
      f"model with a fixed input shape to count its MACs"
    )
  return (1,) + tuple(int(d) for d in dims[1:])


def _one(name: str, shapes: list[Shape]) -> tuple[int, ...]:
  if len(shapes) != 1:
    raise ModelError(f"layer {name!r} has {len(shapes)} inputs, expected 1")
  return _known(name, shapes[0])


def _channels_last(layer: Any) -> bool:
  return getattr(layer, "data_format", "channels_last") != "channels_first"


def _split(layer: Any, shape: tuple[int, ...]) -> tuple[int, int]:
  """(spatial positions, channels) of a conv-style activation shape."""
  if _channels_last(layer):
    return math.prod(shape[1:-1]), shape[-1]
  return math.prod(shape[2:]), shape[1]


# --------------------------------------------------------------------------
# Rules: (layer, name, input shapes, output shapes) -> _Cost


def _free(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  del layer, name, ins, outs
  return _Cost(0, 0)


def _conv(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  in_pos, c_in = _split(layer, _one(name, ins))
  out_pos, c_out = _split(layer, _one(name, outs))
  del in_pos
  groups = int(getattr(layer, "groups", 1))
  per_output = math.prod(layer.kernel_size) * (c_in // groups)
  bias = c_out if layer.use_bias else 0
  return _Cost(out_pos * c_out * per_output, per_output * c_out + bias)


def _conv_transpose(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  in_pos, c_in = _split(layer, _one(name, ins))
  _, c_out = _split(layer, _one(name, outs))
  k = math.prod(layer.kernel_size)
  bias = c_out if layer.use_bias else 0
  return _Cost(in_pos * c_in * k * c_out, k * c_in * c_out + bias)


def _depthwise(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  _, c_in = _split(layer, _one(name, ins))
  out_pos, _ = _split(layer, _one(name, outs))
  k = math.prod(layer.kernel_size)
  mid = c_in * layer.depth_multiplier
  bias = mid if layer.use_bias else 0
  return _Cost(out_pos * mid * k, k * mid + bias)


def _separable(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  _, c_in = _split(layer, _one(name, ins))
  out_pos, c_out = _split(layer, _one(name, outs))
  k = math.prod(layer.kernel_size)
  mid = c_in * layer.depth_multiplier
  bias = c_out if layer.use_bias else 0
  return _Cost(out_pos * mid * (k + c_out), k * mid + mid * c_out + bias)


def _dense(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  shape = _one(name, ins)
  units = int(layer.units)
  bias = units if layer.use_bias else 0
  return _Cost(math.prod(shape[1:]) * units, shape[-1] * units + bias)


def _axes(layer: Any, rank: int) -> list[int]:
  axis = layer.axis
  axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
  return [a % rank for a in axes]


def _batch_norm(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  shape = _one(name, ins)
  channels = math.prod(shape[a] for a in _axes(layer, len(shape)))
  per_channel = 2 + int(layer.scale) + int(layer.center)  # + mean, variance
  return _Cost(math.prod(_one(name, outs)[1:]), channels * per_channel)


def _layer_norm(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  shape = _one(name, ins)
  normalised = math.prod(shape[a] for a in _axes(layer, len(shape)))
  per_element = int(layer.scale) + int(layer.center)
  return _Cost(math.prod(_one(name, outs)[1:]), normalised * per_element)


def _group_norm(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  shape = _one(name, ins)
  channels = shape[layer.axis % len(shape)]
  per_channel = int(layer.scale) + int(layer.center)
  return _Cost(math.prod(_one(name, outs)[1:]), channels * per_channel)


def _embedding(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  del name, ins, outs
  return _Cost(0, int(layer.input_dim) * int(layer.output_dim))


def _attention(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  del ins, outs
  config = layer.get_config()
  shapes = [config.get(k) for k in ("query_shape", "key_shape", "value_shape")]
  if any(s is None for s in shapes):
    raise ModelError(f"layer {name!r} (MultiHeadAttention) is not built")
  query, key, value = (
    _known(name, tuple(tf.TensorShape(s).as_list())) for s in shapes
  )
  axes = config.get("attention_axes")
  if len(query) != 3 or (axes is not None and tuple(axes) not in ((1,), (-2,))):
    raise ModelError(
      f"layer {name!r} (MultiHeadAttention): only rank-3 inputs attending "
      f"over axis 1 can be counted, got query shape {query} and "
      f"attention_axes {axes}"
    )
  heads, kd = int(config["num_heads"]), int(config["key_dim"])
  vd = int(config["value_dim"]) if config.get("value_dim") else kd
  t, d_q = query[1], query[2]
  s, d_k, d_v = key[1], key[2], value[2]
  out_shape = config.get("output_shape")
  d_out = (
    math.prod(
      out_shape if isinstance(out_shape, (list, tuple)) else [out_shape]
    )
    if out_shape
    else d_q
  )
  b = 1 if config["use_bias"] else 0
  proj_params = (
    d_q * heads * kd
    + heads * kd * b
    + d_k * heads * kd
    + heads * kd * b
    + d_v * heads * vd
    + heads * vd * b
    + heads * vd * d_out
    + d_out * b
  )
  macs = (
    t * d_q * heads * kd
    + s * d_k * heads * kd
    + s * d_v * heads * vd
    + heads * t * s * (kd + vd)
    + t * heads * vd * d_out
  )
  return _Cost(macs, proj_params)


def _transformer_block(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  del outs
  shape = _one(name, ins)
  if len(shape) != 3:
    raise ModelError(
      f"layer {name!r} (TransformerBlock) takes (tokens, features) inputs,"
      f" got shape {shape}"
    )
  t, d = shape[1], shape[2]
  h, k, m = int(layer.num_heads), int(layer.key_dim), int(layer.mlp_dim)
  params = (
    2 * 2 * d  # two layer norms, gamma and beta
    + 3 * (d * h * k + h * k)  # query, key, value
    + (h * k * d + d)  # output projection
    + (d * m + m)
    + (m * d + d)  # MLP
  )
  macs = (
    2 * t * d
    + 3 * t * d * h * k
    + h * t * t * (k + k)
    + t * h * k * d
    + 2 * t * d * m
  )
  return _Cost(macs, params)


def _residual_conv_block(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  del outs
  positions, c = _split(layer, _one(name, ins))
  return _Cost(2 * positions * c * 9 * c, 2 * (9 * c * c + c))


def _position_embedding(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  del layer, outs
  shape = _one(name, ins)
  return _Cost(0, math.prod(shape[1:]))


_DENIED_OPS = ("matmul", "einsum", "conv", "tensordot", "linalg")


def _tf_op(layer: Any, name: str, ins: list, outs: list) -> _Cost:
  symbol = str(getattr(layer, "symbol", name))
  if any(word in symbol for word in _DENIED_OPS):
    raise ModelError(
      f"layer {name!r} calls TensorFlow op {symbol!r} directly; its MACs "
      f"cannot be counted: wrap it in a Keras layer with a counting rule"
    )
  return _free(layer, name, ins, outs)


def _classes(*names: str) -> list[type]:
  """The tf.keras.layers classes of these names that exist in this Keras."""
  found = []
  for class_name in names:
    cls = getattr(tf.keras.layers, class_name, None)
    if cls is None:
      cls = getattr(tf.keras.layers.experimental, class_name, None)
    if cls is not None:
      found.append(cls)
  return found


_FREE_LAYERS = (
  "InputLayer",
  "Activation",
  "ReLU",
  "LeakyReLU",
  "ELU",
  "ThresholdedReLU",
  "Softmax",
  "MaxPooling1D",
  "MaxPooling2D",
  "MaxPooling3D",
  "AveragePooling1D",
  "AveragePooling2D",
  "AveragePooling3D",
  "GlobalMaxPooling1D",
  "GlobalMaxPooling2D",
  "GlobalMaxPooling3D",
  "GlobalAveragePooling1D",
  "GlobalAveragePooling2D",
  "GlobalAveragePooling3D",
  "Flatten",
  "Reshape",
  "Permute",
  "RepeatVector",
  "Dropout",
  "SpatialDropout1D",
  "SpatialDropout2D",
  "SpatialDropout3D",
  "GaussianNoise",
  "GaussianDropout",
  "AlphaDropout",
  "ActivityRegularization",
  "Masking",
  "Add",
  "Subtract",
  "Multiply",
  "Average",
  "Maximum",
  "Minimum",
  "Concatenate",
  "ZeroPadding1D",
  "ZeroPadding2D",
  "ZeroPadding3D",
  "Cropping1D",
  "Cropping2D",
  "Cropping3D",
  "UpSampling1D",
  "UpSampling2D",
  "UpSampling3D",
  "Lambda",
  "Identity",
  "Rescaling",
)

_RULES_BY_CLASS: dict[type, _Rule] = {}
for _cls in _classes(*_FREE_LAYERS):
  _RULES_BY_CLASS[_cls] = _free
# This package's parameter-free layers (the rule checks they hold no weights).
_RULES_BY_CLASS[ChannelShortcut] = _free
# This package's depth-scalable blocks and position embedding.
_RULES_BY_CLASS[TransformerBlock] = _transformer_block
_RULES_BY_CLASS[ResidualConvBlock] = _residual_conv_block
_RULES_BY_CLASS[PositionEmbedding] = _position_embedding
for _names, _rule in (
  (("Conv1D", "Conv2D", "Conv3D"), _conv),
  (("Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose"), _conv_transpose),
  (("DepthwiseConv1D", "DepthwiseConv2D"), _depthwise),
  (("SeparableConv1D", "SeparableConv2D"), _separable),
  (("Dense",), _dense),
  (("BatchNormalization", "SyncBatchNormalization"), _batch_norm),
  (("LayerNormalization",), _layer_norm),
  (("GroupNormalization",), _group_norm),
  (("Embedding",), _embedding),
  (("MultiHeadAttention",), _attention),
):
  for _cls in _classes(*_names):
    _RULES_BY_CLASS[_cls] = _rule

# Keras-internal classes, matched by exact class name.
_RULES_BY_NAME: dict[str, _Rule] = {
  "TFOpLambda": _tf_op,
  "SlicingOpLambda": _tf_op,
}

# Wrappers (and their subclasses) costing what the layer they wrap costs
# (attribute `.layer`).
_DELEGATING_WRAPPERS = frozenset({"PruneLowMagnitude"})


def _rule_for(layer: Any) -> _Rule:
  by_name = _RULES_BY_NAME.get(type(layer).__name__)
  if by_name is not None:
    return by_name
  for cls in type(layer).__mro__:
    rule = _RULES_BY_CLASS.get(cls)
    if rule is not None:
      return rule
  weighted = sorted(
    c.__name__ for c, rule in _RULES_BY_CLASS.items() if rule is not _free
  )
  raise ModelError(
    f"cannot count layer {layer.name!r}: layer type {type(layer).__name__} "
    f"has no counting rule (supported: {', '.join(weighted)}, and "
    f"parameter-free activation, pooling, merge, reshape and dropout layers)"
  )


# --------------------------------------------------------------------------
# Walking the graph


def _graph_nodes(model: tf.keras.Model) -> list[Any]:
  """The nodes of a functional/Sequential model, inputs first."""
  if not model.built or not getattr(model, "_is_graph_network", False):
    raise ModelError(
      f"cannot count model {model.name!r} ({type(model).__name__}) layer by "
      f"layer: only functional or Sequential models built on a known input "
      f"shape are supported"
    )
  by_depth = model._nodes_by_depth  # pylint: disable=protected-access
  return [
    node for depth in sorted(by_depth, reverse=True) for node in by_depth[depth]
  ]


def _walk(
  model: tf.keras.Model,
  prefix: str,
  calls: dict[int, int],
  rows: list[LayerCost],
) -> None:
  for node in _graph_nodes(model):
    layer = node.layer
    if isinstance(layer, tf.keras.layers.InputLayer):
      continue
    if isinstance(layer, tf.keras.Model):
      _walk(layer, f"{prefix}{layer.name}/", calls, rows)
      continue
    call = calls.get(id(layer), 0) + 1
    calls[id(layer)] = call
    name = prefix + layer.name + (f"#{call}" if call > 1 else "")
    target, kind = layer, type(layer).__name__
    if any(c.__name__ in _DELEGATING_WRAPPERS for c in type(layer).__mro__):
      target = layer.layer
      kind = f"{kind}({type(target).__name__})"
    rule = _rule_for(target)
    ins = _shape_list(node.input_shapes)
    outs = _shape_list(node.output_shapes)
    cost = rule(target, name, ins, outs)
    actual = target.count_params()
    if actual != cost.expected_params:
      raise ModelError(
        f"layer {name!r} ({type(target).__name__}) has {actual} parameters "
        f"but its counting rule accounts for {cost.expected_params}; give "
        f"this layer type its own rule in tff_hetero/models/counting.py"
      )
    first = call == 1
    rows.append(
      LayerCost(
        name=name,
        kind=kind,
        params=_size(layer.trainable_weights) if first else 0,
        non_trainable=_size(layer.non_trainable_weights) if first else 0,
        macs=int(cost.macs),
      )
    )


def layer_costs(model: tf.keras.Model) -> list[LayerCost]:
  """One `LayerCost` per layer call, inputs first (see module docstring)."""
  rows: list[LayerCost] = []
  _walk(model, "", {}, rows)
  return rows


def count_flops(model: tf.keras.Model) -> int:
  """Forward multiply-accumulates per example (MACs; module docstring)."""
  return sum(row.macs for row in layer_costs(model))


def training_flops_per_example(model: tf.keras.Model) -> int:
  """Forward + backward MACs per training example: 3 x `count_flops`."""
  return TRAINING_MACS_MULTIPLIER * count_flops(model)
