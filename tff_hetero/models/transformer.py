"""Depth-scalable transformer encoder classifiers (InclusiveFL's tiers).

InclusiveFL (Liu et al., KDD 2022) trains 4-, 8- and 12-layer transformer
encoders (RoBERTa) that share their bottom layers (`depth.py`). These are
small encoders of the same shape for images and token sequences, in
`depth.py`'s layout: the embedding, then `block_1` ... `block_L`, then the
head. Layers, in order, with their Keras names:

* embedding, images (`image_transformer`; input `image`, (H, W, C)): the
  image cut into non-overlapping P x P patches (`patches`, a Reshape to
  (H/P, P, W/P, P, C); `patch_order`, a Permute; `patch_flatten`, a Reshape
  to (N, P*P*C) with N = HW/P^2 tokens in row-major patch order, each patch
  flattened in (row, column, channel) order), a Dense to d_model
  (`patch_embed`) and a learned position embedding added to it
  (`position_embed`, `PositionEmbedding`, N x d_model). No CLS token.
* embedding, tokens (`text_transformer`; input `tokens`, int32 (T,)): an
  Embedding(vocab_size, d_model) (`token_embed`) and `position_embed`.
* blocks `block_1` ... `block_L`, each ONE layer (`TransformerBlock`),
  pre-LayerNorm: x + MHA(LN(x)), then x + MLP(LN(x)), the MLP a Dense to
  mlp_dim, GELU (exact, erf form) and a Dense back to d_model. Attention has
  `num_heads` heads of key_dim = d_model / num_heads, scaled dot products
  (1/sqrt(key_dim)), softmax over the keys, no mask; its kernels are laid out
  as Keras's MultiHeadAttention's: query/key/value (d_model, heads,
  key_dim), output (heads, key_dim, d_model), biases (heads, key_dim) and
  (d_model,). Weights, in order: ln1_gamma, ln1_beta, query_kernel,
  query_bias, key_kernel, key_bias, value_kernel, value_bias,
  output_kernel, output_bias, ln2_gamma, ln2_beta, mlp_in_kernel,
  mlp_in_bias, mlp_out_kernel, mlp_out_bias.
* head: LayerNormalization (`final_norm`), mean over the tokens (`pool`,
  GlobalAveragePooling1D), Dense(d_model, tanh) (`pooler`, BERT's pooler),
  Dense(num_classes) (`logits`).

Layer norms use epsilon 1e-6. Defaults, small enough for a 2-core CPU:
d_model 64, 4 heads (key_dim 16), mlp_dim 128, depth 12. No dropout and no
batch norm: every weight is trainable. Every block of a model calls one traced
function (`_SharedBody`) with its own weights, so a graph of the model holds
the block's ops once per shape, not once per block (cheaper to trace and to
compile for TFF; Grappler inlines the calls, and results agree with the
blocks written out to float32 rounding, docs/performance.md).

Initialisation (seeded per part, `depth.DepthSeeds`: the embedding, block i
and the head start the same whatever the depth): Dense kernels and the
attention kernels Glorot-uniform over their (inputs, outputs) matrix view
(query kernel: d_model x heads*key_dim; output kernel: heads*key_dim x
d_model), biases 0, layer-norm gamma 1 and beta 0, position and token
embeddings truncated normal with stddev 0.02 (BERT's).

Patch size (`patch_size=None`): min(H, W) // 4, so a square image gives 4 x 4
= 16 tokens: 7 on 28x28 (MNIST), 8 on 32x32 (CIFAR), 2 on 8x8 (digits).
Height and width must be multiples of the patch size (`ModelError`
otherwise).

Widths (`width.py`), two units:

1. `hidden`: d_model, the residual stream. Every layer that reads or writes
   it is narrowed: `patch_embed` / `token_embed`, `position_embed`, every
   block (layer norms, the query/key/value kernels' input axis, the output
   kernel's output axis, the MLP's input and output), `final_norm` and
   `pooler` (both axes; BERT's pooler is hidden x hidden). The number of
   heads stays; key_dim follows: key_dim' = ceil(hidden' * key_dim /
   d_model), so the query/key/value kernels narrow in both d_model and
   key_dim (d_model', heads, key_dim'), the output kernel to (heads,
   key_dim', d_model'). Every narrowed variable is a prefix slice of the
   full one (`tff_hetero.submodels.maps`). Its layers: the embedding's
   weighted layers, the blocks, `final_norm` and `pooler`.
2. `mlp`: the MLP's hidden width inside every block (its layers are the
   blocks, whose output it does not change).

The logits keep num_classes. A narrowed model is NOT the full model with the
weights outside the prefix zeroed when `hidden` is narrowed: layer norms
average over the kept d_model' features (the full model over all d_model)
and attention scales by 1/sqrt(key_dim'). Narrowing `mlp` alone is exact (a
zeroed MLP unit contributes GELU(0) = 0). InclusiveFL's HeteroFL baseline
narrows the hidden size only ("reducing the hidden size from 768 to 456,
624" keeps 12 RoBERTa layers at the parameters of 4 and 8: with the 3,072
intermediate width kept, the counts match), which is `widths=(hidden', 128)`
here.

Exact figures (asserted in `tests/models/transformer_test.py`, derived by
hand there; MACs as in `counting.py`): `transformer` on 28x28x1 with 10
classes, defaults, has 9,162 + 33,472 L parameters (embedding 4,224, head
4,938, a block 33,472) and 55,936 + 559,104 L forward MACs: depth 4:
143,050 parameters, 2,292,352 MACs; depth 8: 276,938, 4,528,768; depth 12:
410,826, 6,765,184. `text_transformer` (registry name ``text_transformer``,
input (seq_len,)) has vocab_size x 64 + seq_len x 64 embedding parameters
(a lookup: no MACs) and the same blocks; on 64 tokens, 20,000 ids and 2
classes: 1,284,096 + 33,472 L + 4,418, i.e. 1,422,402 / 1,556,290 /
1,690,178 parameters at depth 4 / 8 / 12.
"""

from __future__ import annotations

from collections.abc import Sequence
import math

import numpy as np
import tensorflow as tf

from tff_hetero.errors import ModelError
from tff_hetero.models import depth as depth_lib
from tff_hetero.models import width as width_lib
from tff_hetero.models.blocks import numbered_units
from tff_hetero.models.seeding import SeedStream

DEFAULT_DEPTH = 12
DEFAULT_TIERS = (4, 8, 12)
DEFAULT_VOCAB_SIZE = 20000
"""The registry's `text_transformer` vocabulary when none is given: the
GLUE loader's default cap (`tff_hetero.data.glue.load_glue`)."""
D_MODEL = 64
NUM_HEADS = 4
MLP_DIM = 128
LN_EPSILON = 1e-6
EMBEDDING_STDDEV = 0.02
TOKENS_PER_SIDE = 4
ACTIVATIONS = ("gelu", "relu")


def _matrix_initializer(seed: int, split: int):
  """Glorot-uniform over the (prod(shape[:split]), prod(shape[split:])) view."""
  glorot = tf.keras.initializers.GlorotUniform(seed=seed)

  def init(shape, dtype=None):
    shape = tuple(int(d) for d in shape)
    matrix = (math.prod(shape[:split]), math.prod(shape[split:]))
    return tf.reshape(glorot(matrix, dtype=dtype), shape)

  return init


class PositionEmbedding(tf.keras.layers.Layer):
  """Adds a learned (tokens, features) embedding to a (batch, tokens,
  features) input. Its one weight, `embeddings`, starts truncated normal with
  stddev `stddev` under `seed`."""

  def __init__(self, seed: int, stddev: float = EMBEDDING_STDDEV, **kwargs):
    super().__init__(**kwargs)
    self.seed = int(seed)
    self.stddev = float(stddev)

  def build(self, input_shape):
    tokens, features = int(input_shape[-2]), int(input_shape[-1])
    self.embeddings = self.add_weight(
      name="embeddings",
      shape=(tokens, features),
      initializer=tf.keras.initializers.TruncatedNormal(
        stddev=self.stddev, seed=self.seed
      ),
      trainable=True,
    )
    super().build(input_shape)

  # Plain TensorFlow without tensor-dependent Python: autograph has nothing
  # to convert, and converting costs time at every model build.
  @tf.autograph.experimental.do_not_convert
  def call(self, inputs: tf.Tensor, training=None) -> tf.Tensor:
    del training  # the same function in training and inference
    return inputs + tf.cast(self.embeddings, inputs.dtype)

  def compute_output_shape(self, input_shape):
    return tf.TensorShape(input_shape)

  def get_prunable_weights(self) -> list:
    """None: the table is added like a bias (tfmot's pruning wrappers ask)."""
    return []

  def get_config(self):
    config = super().get_config()
    config.update(seed=self.seed, stddev=self.stddev)
    return config


def _layer_norm(x, gamma, beta, epsilon):
  mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
  return (x - mean) * tf.math.rsqrt(variance + epsilon) * gamma + beta


BLOCK_WEIGHTS = (
  "ln1_gamma",
  "ln1_beta",
  "query_kernel",
  "query_bias",
  "key_kernel",
  "key_bias",
  "value_kernel",
  "value_bias",
  "output_kernel",
  "output_bias",
  "ln2_gamma",
  "ln2_beta",
  "mlp_in_kernel",
  "mlp_in_bias",
  "mlp_out_kernel",
  "mlp_out_bias",
)
"""A `TransformerBlock`'s weights, in the order of its `trainable_weights`."""


def _block_body(x, w, key_dim, epsilon, activation):
  """A block's forward pass (module docstring) from its weights `w`, a
  mapping of `BLOCK_WEIGHTS` names to tensors."""
  y = _layer_norm(x, w["ln1_gamma"], w["ln1_beta"], epsilon)
  q = tf.einsum("btd,dhk->bthk", y, w["query_kernel"]) + w["query_bias"]
  k = tf.einsum("btd,dhk->bthk", y, w["key_kernel"]) + w["key_bias"]
  v = tf.einsum("btd,dhk->bthk", y, w["value_kernel"]) + w["value_bias"]
  scores = tf.einsum("bthk,bshk->bhts", q, k) / math.sqrt(key_dim)
  attention = tf.nn.softmax(scores, axis=-1)
  context = tf.einsum("bhts,bshk->bthk", attention, v)
  x = x + (
    tf.einsum("bthk,hkd->btd", context, w["output_kernel"]) + w["output_bias"]
  )
  y = _layer_norm(x, w["ln2_gamma"], w["ln2_beta"], epsilon)
  y = tf.einsum("btd,dm->btm", y, w["mlp_in_kernel"]) + w["mlp_in_bias"]
  y = (
    tf.nn.gelu(y, approximate=False) if activation == "gelu" else tf.nn.relu(y)
  )
  y = tf.einsum("btm,md->btd", y, w["mlp_out_kernel"]) + w["mlp_out_bias"]
  return x + y


class _SharedBody:
  """One traced block function for the blocks of one model.

  A graph of the model then holds the block's body (and, under a gradient
  tape, its gradient) once per shape instead of once per block, which
  makes a deep model's graph several times cheaper to trace and to hand to
  TFF. Grappler inlines the calls back (TFF compiles with function
  inlining). The weights come in as read tensors: the gradient reaches each
  block's variables through its own reads. One function per model, not
  per module: its traces (keyed by the graph they were made in) go with the
  model. A plain object, so that Keras does not track the function.
  """

  def __init__(self):
    self.function = tf.function(_block_body, autograph=False)


class TransformerBlock(tf.keras.layers.Layer):
  """A pre-LayerNorm transformer encoder layer as ONE Keras layer.

  x + MHA(LN1(x)), then x + MLP(LN2(x)); see the module docstring for the
  weights and their layout. d_model is the input's last dimension.

  Args:
    num_heads: Attention heads.
    key_dim: Size of each head (query, key and value).
    mlp_dim: The MLP's hidden width.
    seed: Seeds every initialiser of the block (a `SeedStream`).
    activation: "gelu" (exact) or "relu".
    epsilon: The layer norms' epsilon.
  """

  def __init__(
    self,
    num_heads: int,
    key_dim: int,
    mlp_dim: int,
    seed: int,
    activation: str = "gelu",
    epsilon: float = LN_EPSILON,
    **kwargs,
  ):
    super().__init__(**kwargs)
    if activation not in ACTIVATIONS:
      raise ModelError(
        f"activation must be one of {', '.join(ACTIVATIONS)}, got"
        f" {activation!r}"
      )
    self.num_heads = int(num_heads)
    self.key_dim = int(key_dim)
    self.mlp_dim = int(mlp_dim)
    self.seed = int(seed)
    self.activation = activation
    self.epsilon = float(epsilon)
    self._body = _SharedBody()  # `_blocks_and_head` shares one per model.

  def build(self, input_shape):
    d = int(input_shape[-1])
    h, k, m = self.num_heads, self.key_dim, self.mlp_dim
    seeds = SeedStream(self.seed)

    def weight(name, shape, initializer):
      return self.add_weight(
        name=name, shape=shape, initializer=initializer, trainable=True
      )

    self.ln1_gamma = weight("ln1_gamma", (d,), "ones")
    self.ln1_beta = weight("ln1_beta", (d,), "zeros")
    for name in ("query", "key", "value"):
      setattr(
        self,
        f"{name}_kernel",
        weight(
          f"{name}_kernel", (d, h, k), _matrix_initializer(seeds.next_seed(), 1)
        ),
      )
      setattr(self, f"{name}_bias", weight(f"{name}_bias", (h, k), "zeros"))
    self.output_kernel = weight(
      "output_kernel", (h, k, d), _matrix_initializer(seeds.next_seed(), 2)
    )
    self.output_bias = weight("output_bias", (d,), "zeros")
    self.ln2_gamma = weight("ln2_gamma", (d,), "ones")
    self.ln2_beta = weight("ln2_beta", (d,), "zeros")
    self.mlp_in_kernel = weight(
      "mlp_in_kernel", (d, m), _matrix_initializer(seeds.next_seed(), 1)
    )
    self.mlp_in_bias = weight("mlp_in_bias", (m,), "zeros")
    self.mlp_out_kernel = weight(
      "mlp_out_kernel", (m, d), _matrix_initializer(seeds.next_seed(), 1)
    )
    self.mlp_out_bias = weight("mlp_out_bias", (d,), "zeros")
    super().build(input_shape)

  # Plain TensorFlow without tensor-dependent Python: autograph has nothing
  # to convert, and converting costs time at every model build.
  @tf.autograph.experimental.do_not_convert
  def call(self, inputs: tf.Tensor, training=None) -> tf.Tensor:
    del training  # the same function in training and inference
    weights = {n: tf.convert_to_tensor(getattr(self, n)) for n in BLOCK_WEIGHTS}
    return self._body.function(
      inputs,
      weights,
      key_dim=self.key_dim,
      epsilon=self.epsilon,
      activation=self.activation,
    )

  def compute_output_shape(self, input_shape):
    return tf.TensorShape(input_shape)

  def get_prunable_weights(self) -> list:
    """The kernels (tfmot's pruning wrappers ask; sparse training)."""
    return [
      self.query_kernel,
      self.key_kernel,
      self.value_kernel,
      self.output_kernel,
      self.mlp_in_kernel,
      self.mlp_out_kernel,
    ]

  def get_config(self):
    config = super().get_config()
    config.update(
      num_heads=self.num_heads,
      key_dim=self.key_dim,
      mlp_dim=self.mlp_dim,
      seed=self.seed,
      activation=self.activation,
      epsilon=self.epsilon,
    )
    return config


# --------------------------------------------------------------------------
# Configuration checks and width units


def _positive(model_name: str, what: str, value: object) -> int:
  if (
    not isinstance(value, (int, np.integer))
    or isinstance(value, bool)
    or value < 1
  ):
    raise ModelError(
      f"model {model_name!r}: {what} must be an integer >= 1, got {value!r}"
    )
  return int(value)


def _check_dims(
  model_name: str, d_model: int, num_heads: int, mlp_dim: int
) -> tuple[int, int, int]:
  d_model = _positive(model_name, "d_model", d_model)
  num_heads = _positive(model_name, "num_heads", num_heads)
  mlp_dim = _positive(model_name, "mlp_dim", mlp_dim)
  if d_model % num_heads:
    raise ModelError(
      f"model {model_name!r}: d_model {d_model} is not a multiple of"
      f" num_heads {num_heads}"
    )
  return d_model, num_heads, mlp_dim


def _depth(model_name: str, depth: object) -> int:
  return (
    DEFAULT_DEPTH if depth is None else depth_lib.check_depth(model_name, depth)
  )


def patch_size_for(input_shape: Sequence[int]) -> int:
  """The default patch size: min(height, width) // 4 (at least 1)."""
  return max(
    1, min(int(input_shape[0]), int(input_shape[1])) // TOKENS_PER_SIDE
  )


def _check_image(
  model_name: str, input_shape: tuple[int, ...], patch_size: int | None
) -> int:
  """The patch size for these images; `ModelError` if they cannot be cut."""
  if len(input_shape) != 3:
    raise ModelError(
      f"model {model_name!r} takes images shaped (height, width, channels),"
      f" got input_shape {tuple(input_shape)}"
    )
  patch = (
    patch_size_for(input_shape)
    if patch_size is None
    else _positive(model_name, "patch_size", patch_size)
  )
  height, width = input_shape[:2]
  if height % patch or width % patch:
    raise ModelError(
      f"model {model_name!r}: image height and width must be multiples of"
      f" the patch size {patch}, got {'x'.join(map(str, input_shape))}"
    )
  return patch


def _units(
  embedding_layers: Sequence[str], depth: int, d_model: int, mlp_dim: int
) -> tuple[width_lib.WidthUnit, ...]:
  blocks = tuple(depth_lib.block_name(i) for i in range(1, depth + 1))
  return numbered_units(
    (
      "hidden",
      d_model,
      (*embedding_layers, "position_embed", *blocks, "final_norm", "pooler"),
    ),
    ("mlp", mlp_dim, blocks),
  )


def image_transformer_units(
  input_shape: tuple[int, ...],
  num_classes: int,
  depth: int | None = None,
  *,
  patch_size: int | None = None,
  d_model: int = D_MODEL,
  num_heads: int = NUM_HEADS,
  mlp_dim: int = MLP_DIM,
) -> tuple[width_lib.WidthUnit, ...]:
  """hidden (d_model), mlp (mlp_dim); `ModelError` for images it cannot cut."""
  del num_classes
  name = "transformer"
  _check_image(name, tuple(input_shape), patch_size)
  d_model, _, mlp_dim = _check_dims(name, d_model, num_heads, mlp_dim)
  return _units(("patch_embed",), _depth(name, depth), d_model, mlp_dim)


def text_transformer_units(
  depth: int | None = None,
  *,
  d_model: int = D_MODEL,
  num_heads: int = NUM_HEADS,
  mlp_dim: int = MLP_DIM,
) -> tuple[width_lib.WidthUnit, ...]:
  """hidden (d_model), mlp (mlp_dim) of `text_transformer`."""
  name = "text_transformer"
  d_model, _, mlp_dim = _check_dims(name, d_model, num_heads, mlp_dim)
  return _units(("token_embed",), _depth(name, depth), d_model, mlp_dim)


def narrowed_key_dim(hidden: int, d_model: int, num_heads: int) -> int:
  """key_dim of a model whose `hidden` unit is narrowed to `hidden`:
  ceil(hidden * (d_model / num_heads) / d_model)."""
  return max(1, math.ceil(hidden * (d_model // num_heads) / d_model))


# --------------------------------------------------------------------------
# Models


def _blocks_and_head(
  x: tf.Tensor,
  name: str,
  inputs: tf.Tensor,
  num_classes: int,
  seeds: depth_lib.DepthSeeds,
  depth: int,
  hidden: int,
  num_heads: int,
  key_dim: int,
  mlp_dim: int,
  activation: str,
) -> tf.keras.Model:
  body = _SharedBody()
  for i in range(1, depth + 1):
    block = TransformerBlock(
      num_heads,
      key_dim,
      mlp_dim,
      seeds.block(i),
      activation=activation,
      name=depth_lib.block_name(i),
    )
    block._body = body  # pylint: disable=protected-access
    x = block(x)
  head = seeds.head()
  x = tf.keras.layers.LayerNormalization(epsilon=LN_EPSILON, name="final_norm")(
    x
  )
  x = tf.keras.layers.GlobalAveragePooling1D(name="pool")(x)
  x = tf.keras.layers.Dense(
    hidden,
    activation="tanh",
    kernel_initializer=head.glorot_uniform(),
    bias_initializer="zeros",
    name="pooler",
  )(x)
  logits = tf.keras.layers.Dense(
    num_classes,
    kernel_initializer=head.glorot_uniform(),
    bias_initializer="zeros",
    name="logits",
  )(x)
  return tf.keras.Model(inputs, logits, name=name)


def image_transformer(
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
  depth: int | None = None,
  *,
  patch_size: int | None = None,
  d_model: int = D_MODEL,
  num_heads: int = NUM_HEADS,
  mlp_dim: int = MLP_DIM,
  activation: str = "gelu",
  name: str = "transformer",
) -> tf.keras.Model:
  """A transformer encoder classifier on image patches; see module doc.

  Args:
    input_shape: (height, width, channels), multiples of the patch size.
    num_classes: Logits out.
    seed: Seeds every initialiser (`depth.DepthSeeds`).
    widths: (hidden, mlp) widths, each in 1..full (None: full).
    depth: Number of blocks (None: 12).
    patch_size: Side of the square patches (None: min(H, W) // 4).
    d_model: Hidden size (the residual stream) of the full model.
    num_heads: Attention heads (d_model must be a multiple).
    mlp_dim: The MLP's hidden width of the full model.
    activation: The MLP's activation, "gelu" or "relu".
    name: The Keras model's name.
  """
  input_shape = tuple(int(d) for d in input_shape)
  patch = _check_image(name, input_shape, patch_size)
  d_model, num_heads, mlp_dim = _check_dims(name, d_model, num_heads, mlp_dim)
  depth = _depth(name, depth)
  units = _units(("patch_embed",), depth, d_model, mlp_dim)
  hidden, mlp = width_lib.check_widths(name, units, widths)
  key_dim = narrowed_key_dim(hidden, d_model, num_heads)
  seeds = depth_lib.DepthSeeds(seed)
  embed = seeds.embedding()
  height, width, channels = input_shape
  rows, cols = height // patch, width // patch
  inputs = tf.keras.Input(shape=input_shape, name="image")
  x = tf.keras.layers.Reshape(
    (rows, patch, cols, patch, channels), name="patches"
  )(inputs)
  x = tf.keras.layers.Permute((1, 3, 2, 4, 5), name="patch_order")(x)
  x = tf.keras.layers.Reshape(
    (rows * cols, patch * patch * channels), name="patch_flatten"
  )(x)
  x = tf.keras.layers.Dense(
    hidden,
    kernel_initializer=embed.glorot_uniform(),
    bias_initializer="zeros",
    name="patch_embed",
  )(x)
  x = PositionEmbedding(embed.next_seed(), name="position_embed")(x)
  return _blocks_and_head(
    x,
    name,
    inputs,
    num_classes,
    seeds,
    depth,
    hidden,
    num_heads,
    key_dim,
    mlp,
    activation,
  )


def text_transformer(
  seq_len: int,
  vocab_size: int,
  num_classes: int,
  seed: int,
  widths: Sequence[int] | None = None,
  depth: int | None = None,
  *,
  d_model: int = D_MODEL,
  num_heads: int = NUM_HEADS,
  mlp_dim: int = MLP_DIM,
  activation: str = "gelu",
  name: str = "text_transformer",
) -> tf.keras.Model:
  """A transformer encoder classifier on token ids; see module doc.

  Args:
    seq_len: Tokens per example (int32 ids in 0..vocab_size - 1).
    vocab_size: Rows of the token embedding.
    num_classes: Logits out.
    seed, widths, depth, d_model, num_heads, mlp_dim, activation, name: As
      `image_transformer`.
  """
  seq_len = _positive(name, "seq_len", seq_len)
  vocab_size = _positive(name, "vocab_size", vocab_size)
  d_model, num_heads, mlp_dim = _check_dims(name, d_model, num_heads, mlp_dim)
  depth = _depth(name, depth)
  units = _units(("token_embed",), depth, d_model, mlp_dim)
  hidden, mlp = width_lib.check_widths(name, units, widths)
  key_dim = narrowed_key_dim(hidden, d_model, num_heads)
  seeds = depth_lib.DepthSeeds(seed)
  embed = seeds.embedding()
  inputs = tf.keras.Input(shape=(seq_len,), dtype=tf.int32, name="tokens")
  x = tf.keras.layers.Embedding(
    vocab_size,
    hidden,
    embeddings_initializer=tf.keras.initializers.TruncatedNormal(
      stddev=EMBEDDING_STDDEV, seed=embed.next_seed()
    ),
    name="token_embed",
  )(inputs)
  x = PositionEmbedding(embed.next_seed(), name="position_embed")(x)
  return _blocks_and_head(
    x,
    name,
    inputs,
    num_classes,
    seeds,
    depth,
    hidden,
    num_heads,
    key_dim,
    mlp,
    activation,
  )
