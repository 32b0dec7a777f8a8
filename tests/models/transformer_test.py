"""The depth-scalable transformers: layers, numerics, seeds, widths, counts.

Counts are derived by hand in the comments (MACs as in counting.py: one MAC
per multiply-add, layer norm one per output element, bias and position
additions free). The block's function is checked against Keras's own
MultiHeadAttention and LayerNormalization and a NumPy MLP.
"""

import math

from conftest import assert_one_line_error
import numpy as np
import pytest
import tensorflow as tf

from tff_hetero import models
from tff_hetero.models import transformer
from tff_hetero.submodels.maps import SubModelMap


def _one_line_model_error(call, *needles):
  return assert_one_line_error(models.ModelError, call, *needles)


def _blocks(depth):
  return [f"block_{i}" for i in range(1, depth + 1)]


def test_image_layers_in_order_with_their_names():
  model = transformer.image_transformer((28, 28, 1), 10, seed=0, depth=4)
  assert [l.name for l in model.layers] == [
    "image",
    "patches",
    "patch_order",
    "patch_flatten",
    "patch_embed",
    "position_embed",
    *_blocks(4),
    "final_norm",
    "pool",
    "pooler",
    "logits",
  ]
  # 28x28 in patches of 7: 4 x 4 = 16 tokens of 7*7*1 = 49 values
  assert model.get_layer("patch_flatten").output_shape == (None, 16, 49)
  assert model.get_layer("block_4").output_shape == (None, 16, 64)
  assert all(
    isinstance(model.get_layer(b), transformer.TransformerBlock)
    for b in _blocks(4)
  )
  assert model.get_layer("pooler").get_config()["activation"] == "tanh"
  assert not model.non_trainable_weights
  assert [v.name for v in model.get_layer("block_1").weights] == [
    f"block_1/{n}:0"
    for n in (
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
  ]


def test_default_depth_is_twelve_and_patch_size_follows_the_image():
  assert transformer.patch_size_for((28, 28, 1)) == 7
  assert transformer.patch_size_for((32, 32, 3)) == 8
  assert transformer.patch_size_for((8, 8, 1)) == 2
  model = models.build_model("transformer", (32, 32, 3), 10, seed=0)
  assert models.depth_of(model) == 12 == models.depth_tiers("transformer")[-1]
  # 32x32x3 in patches of 8: 16 tokens of 8*8*3 = 192 values
  assert model.get_layer("patch_flatten").output_shape == (None, 16, 192)
  model = transformer.image_transformer((8, 8, 1), 3, 0, depth=1, patch_size=4)
  assert model.get_layer("patch_flatten").output_shape == (None, 4, 16)


def test_patches_are_row_major_each_flattened_by_row_column_channel():
  model = transformer.image_transformer((8, 8, 3), 3, 0, depth=1, patch_size=4)
  patches = tf.keras.Model(model.input, model.get_layer("patch_flatten").output)
  x = np.arange(2 * 8 * 8 * 3, dtype=np.float32).reshape(2, 8, 8, 3)
  expected = np.stack(
    [
      np.stack(
        [
          x[b, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4, :].reshape(-1)
          for r in range(2)
          for c in range(2)
        ]
      )
      for b in range(2)
    ]
  )
  np.testing.assert_array_equal(patches(x).numpy(), expected)


def _gelu(x):
  return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _random_block_weights(block, rng):
  values = [rng.normal(scale=0.3, size=v.shape) for v in block.weights]
  block.set_weights(values)
  return dict(
    zip([v.name.split("/")[-1].split(":")[0] for v in block.weights], values)
  )


def test_block_is_pre_layer_norm_attention_then_mlp():
  # Reference: Keras's LayerNormalization and MultiHeadAttention given the
  # block's weights, the MLP in NumPy with the exact (erf) GELU.
  rng = np.random.default_rng(0)
  d, heads, key_dim, mlp, tokens = 8, 2, 4, 12, 5
  block = transformer.TransformerBlock(heads, key_dim, mlp, seed=1)
  x = rng.normal(size=(3, tokens, d)).astype(np.float32)
  block(x)
  w = _random_block_weights(block, rng)

  def norm(value, gamma, beta):
    layer = tf.keras.layers.LayerNormalization(epsilon=1e-6)
    layer(value)
    layer.set_weights([gamma, beta])
    return layer(value).numpy()

  attention = tf.keras.layers.MultiHeadAttention(heads, key_dim)
  y = norm(x, w["ln1_gamma"], w["ln1_beta"])
  attention(y, y)
  attention.set_weights(
    [
      w[k]
      for k in (
        "query_kernel",
        "query_bias",
        "key_kernel",
        "key_bias",
        "value_kernel",
        "value_bias",
        "output_kernel",
        "output_bias",
      )
    ]
  )
  h = x + attention(y, y).numpy()
  z = norm(h, w["ln2_gamma"], w["ln2_beta"])
  z = _gelu(z @ w["mlp_in_kernel"] + w["mlp_in_bias"])
  expected = h + z @ w["mlp_out_kernel"] + w["mlp_out_bias"]
  np.testing.assert_allclose(block(x).numpy(), expected, atol=2e-5)


def test_block_gradients_match_the_keras_reference():
  # The block's body is one traced function for all blocks, fed the
  # weights' reads: the gradient must still reach every weight, equal to
  # that of the same block written with Keras's LayerNormalization and
  # MultiHeadAttention (the reference above), eagerly and in a graph.
  rng = np.random.default_rng(3)
  d, heads, key_dim, mlp, tokens = 8, 2, 4, 12, 5
  block = transformer.TransformerBlock(heads, key_dim, mlp, seed=1)
  x = tf.constant(rng.normal(size=(3, tokens, d)).astype(np.float32))
  block(x)
  w = _random_block_weights(block, rng)
  ln1 = tf.keras.layers.LayerNormalization(epsilon=1e-6)
  ln2 = tf.keras.layers.LayerNormalization(epsilon=1e-6)
  attention = tf.keras.layers.MultiHeadAttention(heads, key_dim)
  ln1(x), ln2(x), attention(x, x)
  ln1.set_weights([w["ln1_gamma"], w["ln1_beta"]])
  ln2.set_weights([w["ln2_gamma"], w["ln2_beta"]])
  attention.set_weights(
    [w[n] for n in transformer.BLOCK_WEIGHTS[2:10]]  # query .. output bias
  )
  mlp_in = tf.Variable(w["mlp_in_kernel"], dtype=tf.float32)
  mlp_in_b = tf.Variable(w["mlp_in_bias"], dtype=tf.float32)
  mlp_out = tf.Variable(w["mlp_out_kernel"], dtype=tf.float32)
  mlp_out_b = tf.Variable(w["mlp_out_bias"], dtype=tf.float32)

  def reference(value):
    y = ln1(value)
    h = value + attention(y, y)
    z = tf.nn.gelu(ln2(h) @ mlp_in + mlp_in_b, approximate=False)
    return h + z @ mlp_out + mlp_out_b

  reference_weights = [
    *ln1.weights,
    *attention.weights,
    *ln2.weights,
    mlp_in,
    mlp_in_b,
    mlp_out,
    mlp_out_b,
  ]

  def gradients(fn, weights):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(fn(x)))
    return tape.gradient(loss, weights)

  expected = gradients(reference, reference_weights)
  for run in (lambda f: f(), tf.function(lambda f: f())):
    ours = run(lambda: gradients(block, block.trainable_weights))
    assert [v.name.split("/")[-1].split(":")[0] for v in block.weights] == (
      list(transformer.BLOCK_WEIGHTS)
    )
    for name, got, want in zip(transformer.BLOCK_WEIGHTS, ours, expected):
      assert got is not None, name
      np.testing.assert_allclose(
        got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4, err_msg=name
      )


def test_blocks_of_a_model_share_one_traced_body():
  # What makes a deep model cheap to trace: a graph of the 6-block model's
  # training step holds the block's body once (one function definition,
  # called 6 times), not 6 copies of its ops.
  model = transformer.image_transformer((8, 8, 1), 3, 0, depth=6)
  x = np.zeros((2, 8, 8, 1), np.float32)

  @tf.function
  def step(images):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(model(images))
    return tape.gradient(loss, model.trainable_weights)

  graph = step.get_concrete_function(
    tf.TensorSpec([None, 8, 8, 1], tf.float32)
  ).graph.as_graph_def()
  bodies = [f for f in graph.library.function if "_block" in f.signature.name]
  forward = [f for f in bodies if "backward" not in f.signature.name]
  einsums = sum(
    n.op == "Einsum" for f in graph.library.function for n in f.node_def
  )
  einsums += sum(n.op == "Einsum" for n in graph.node)
  # 6 einsums in a block's forward; the function-call machinery may hold a
  # forward body and its variant with intermediates, but not 6 of them.
  assert 1 <= len(forward) <= 2
  assert einsums <= 2 * 6 * 3  # vs 6 blocks x 6 forward + 12 backward
  assert all(g is not None for g in step(x))


def test_relu_variant_and_bad_activation():
  x = np.random.default_rng(1).normal(size=(2, 8, 8, 1)).astype(np.float32)
  gelu = transformer.image_transformer((8, 8, 1), 3, 0, depth=1)
  relu = transformer.image_transformer(
    (8, 8, 1), 3, 0, depth=1, activation="relu"
  )
  for a, b in zip(gelu.get_weights(), relu.get_weights()):
    np.testing.assert_array_equal(a, b)  # same weights, other function
  assert not np.allclose(gelu(x).numpy(), relu(x).numpy())
  _one_line_model_error(
    lambda: transformer.image_transformer(
      (8, 8, 1), 3, 0, depth=1, activation="tanh"
    ),
    "activation",
    "gelu, relu",
  )


def _counts(model):
  return (
    models.count_params(model).trainable,
    models.count_flops(model),
    {r.name: (r.params, r.macs) for r in models.layer_costs(model)},
  )


def test_tiny_config_params_and_macs_by_hand():
  model = transformer.image_transformer(
    (8, 8, 1), 3, 0, depth=2, patch_size=4, d_model=8, num_heads=2, mlp_dim=16
  )
  params, macs, rows = _counts(model)
  # T = 4 tokens of 4*4*1 = 16 values; d = 8, H = 2 heads of k = 4, m = 16.
  # patch_embed: 16*8 + 8 = 136 params, 4*16*8 = 512 MACs.
  assert rows["patch_embed"] == (136, 512)
  # position_embed: a 4 x 8 table added, 32 params, 0 MACs.
  assert rows["position_embed"] == (32, 0)
  # block params: 2 layer norms 2*(8+8) = 32; Q, K, V 3*(8*2*4 + 2*4) = 216;
  # output 2*4*8 + 8 = 72; MLP 8*16 + 16 + 16*8 + 8 = 280; total 600.
  # block MACs: layer norms 2*4*8 = 64; Q, K, V 3*4*8*(2*4) = 768; scores
  # and weighted sum 2 heads * 4*4 * (4 + 4) = 256; output 4*(2*4)*8 = 256;
  # MLP 4*8*16 + 4*16*8 = 1,024; total 2,368.
  assert rows["block_1"] == rows["block_2"] == (600, 2_368)
  # final_norm 8+8 params, 4*8 = 32 MACs; pooler 8*8 + 8, 64 MACs; logits
  # 8*3 + 3, 24 MACs.
  assert rows["final_norm"] == (16, 32)
  assert rows["pooler"] == (72, 64)
  assert rows["logits"] == (27, 24)
  assert params == 136 + 32 + 2 * 600 + 16 + 72 + 27 == 1_483
  assert macs == 512 + 2 * 2_368 + 32 + 64 + 24 == 5_368
  assert model.count_params() == params  # Keras agrees


# 28x28x1, 10 classes, defaults (d = 64, 4 heads of 16, MLP 128, T = 16
# tokens of 49 values):
# embedding: patch_embed 49*64 + 64 = 3,200, position 16*64 = 1,024 -> 4,224;
#   MACs 16*49*64 = 50,176.
# block: layer norms 4*64 = 256; Q, K, V 3*(64*64 + 64) = 12,480; output
#   64*64 + 64 = 4,160; MLP 64*128 + 128 + 128*64 + 64 = 16,576 -> 33,472;
#   MACs: layer norms 2*16*64 = 2,048; Q, K, V 3*16*64*64 = 196,608; scores
#   and sum 4*16*16*(16+16) = 32,768; output 16*64*64 = 65,536; MLP
#   2*16*64*128 = 262,144 -> 559,104.
# head: final_norm 128, pooler 64*64 + 64 = 4,160, logits 64*10 + 10 = 650
#   -> 4,938; MACs 16*64 = 1,024 + 4,096 + 640 = 5,760.
EMBEDDING = (4_224, 50_176)
BLOCK = (33_472, 559_104)
HEAD = (4_938, 5_760)


@pytest.mark.parametrize(
  "depth, params, macs",
  [(4, 143_050, 2_292_352), (8, 276_938, 4_528_768), (12, 410_826, 6_765_184)],
)
def test_registered_transformer_counts_by_hand(depth, params, macs):
  assert params == EMBEDDING[0] + depth * BLOCK[0] + HEAD[0]
  assert macs == EMBEDDING[1] + depth * BLOCK[1] + HEAD[1]
  model = models.build_model("transformer", (28, 28, 1), 10, 0, depth=depth)
  got_params, got_macs, rows = _counts(model)
  assert (got_params, got_macs) == (params, macs)
  assert rows[f"block_{depth}"] == BLOCK


def _by_part(model):
  part = models.depth_partition(model)
  weights = model.get_weights()
  return (
    [weights[i] for i in part.embedding],
    [[weights[i] for i in block] for block in part.blocks],
    [weights[i] for i in part.head],
  )


def _same(a, b):
  return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_block_i_starts_the_same_at_every_depth():
  shallow = transformer.image_transformer((8, 8, 1), 10, seed=3, depth=4)
  deep = transformer.image_transformer((8, 8, 1), 10, seed=3, depth=12)
  s_embedding, s_blocks, s_head = _by_part(shallow)
  d_embedding, d_blocks, d_head = _by_part(deep)
  assert _same(s_embedding, d_embedding)
  assert _same(s_head, d_head)
  for s, d in zip(s_blocks, d_blocks[:4]):
    assert _same(s, d)
  # Blocks differ from each other, and so do Q, K and V within a block
  # (Keras's MultiHeadAttention would clone one seeded initialiser).
  assert not np.array_equal(d_blocks[0][2], d_blocks[1][2])
  query, key, value = (d_blocks[0][i] for i in (2, 4, 6))
  assert not np.array_equal(query, key) and not np.array_equal(key, value)
  # Another seed, other weights everywhere.
  other = transformer.image_transformer((8, 8, 1), 10, seed=4, depth=4)
  o_embedding, o_blocks, o_head = _by_part(other)
  assert not np.array_equal(o_embedding[0], s_embedding[0])
  assert not np.array_equal(o_blocks[3][2], s_blocks[3][2])
  assert not np.array_equal(o_head[2], s_head[2])


def test_initial_scales():
  model = transformer.image_transformer((28, 28, 1), 10, seed=0, depth=1)
  block = model.get_layer("block_1")
  # Glorot-uniform over the 64 x (4*16) matrix view: limit sqrt(6/128)
  limit = math.sqrt(6 / (64 + 64))
  query = block.query_kernel.numpy()
  assert np.abs(query).max() <= limit and np.abs(query).max() > 0.9 * limit
  # mlp_in 64 x 128: limit sqrt(6/192)
  mlp_in = block.mlp_in_kernel.numpy()
  assert np.abs(mlp_in).max() <= math.sqrt(6 / 192)
  position = model.get_layer("position_embed").embeddings.numpy()
  assert np.abs(position).max() <= 2 * 0.02  # truncated at 2 stddev
  assert 0.01 < position.std() < 0.02
  for name in ("ln1_gamma", "ln2_gamma"):
    np.testing.assert_array_equal(getattr(block, name).numpy(), 1.0)
  for name in ("query_bias", "output_bias", "ln1_beta", "mlp_out_bias"):
    np.testing.assert_array_equal(getattr(block, name).numpy(), 0.0)


def test_every_weight_gets_a_gradient():
  model = transformer.image_transformer((8, 8, 1), 3, seed=0, depth=2)
  x = np.random.default_rng(0).normal(size=(4, 8, 8, 1)).astype(np.float32)
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(
      tf.keras.losses.sparse_categorical_crossentropy(
        [0, 1, 2, 0], model(x), from_logits=True
      )
    )
  grads = tape.gradient(loss, model.trainable_weights)
  for v, g in zip(model.trainable_weights, grads):
    assert g is not None and np.abs(g.numpy()).max() > 0, v.name
  # Graph mode (as TFF traces models) computes the same.
  np.testing.assert_allclose(
    tf.function(model)(x).numpy(), model(x).numpy(), atol=1e-5
  )


def test_width_units():
  units = models.width_units("transformer", (28, 28, 1), 10, depth=2)
  assert units == (
    models.WidthUnit(
      1,
      "hidden",
      64,
      (
        "patch_embed",
        "position_embed",
        "block_1",
        "block_2",
        "final_norm",
        "pooler",
      ),
    ),
    models.WidthUnit(2, "mlp", 128, ("block_1", "block_2")),
  )
  assert len(models.width_units("transformer", (28, 28, 1), 10)[1].layers) == 12
  assert [u.name for u in transformer.text_transformer_units(3)] == [
    "hidden",
    "mlp",
  ]
  assert transformer.text_transformer_units(3)[0].layers[0] == "token_embed"


@pytest.mark.parametrize(
  "widths, key_dim",
  [((32, 128), 8), ((30, 100), 8), ((33, 64), 9), ((1, 1), 1)],
)
def test_narrowed_variables_are_prefix_slices(widths, key_dim):
  # key_dim' = ceil(hidden' * 16 / 64): 30 -> ceil(7.5) = 8, 33 -> 9.
  assert transformer.narrowed_key_dim(widths[0], 64, 4) == key_dim
  full = models.build_model("transformer", (8, 8, 1), 10, 0, depth=2)
  narrow = models.build_model(
    "transformer", (8, 8, 1), 10, 0, widths=widths, depth=2
  )
  hidden, mlp = widths
  shapes = {v.name: tuple(v.shape) for v in narrow.trainable_weights}
  assert shapes["patch_embed/kernel:0"] == (4, hidden)  # 2x2 patches
  assert shapes["position_embed/embeddings:0"] == (16, hidden)
  assert shapes["block_2/query_kernel:0"] == (hidden, 4, key_dim)
  assert shapes["block_2/value_bias:0"] == (4, key_dim)
  assert shapes["block_2/output_kernel:0"] == (4, key_dim, hidden)
  assert shapes["block_2/mlp_in_kernel:0"] == (hidden, mlp)
  assert shapes["block_2/mlp_out_kernel:0"] == (mlp, hidden)
  assert shapes["final_norm/gamma:0"] == (hidden,)
  assert shapes["pooler/kernel:0"] == (hidden, hidden)
  assert shapes["logits/kernel:0"] == (hidden, 10)
  # The sub-model map accepts every variable as a prefix slice, in order.
  to_narrow = SubModelMap.between(full, narrow)
  assert [s.name for s in to_narrow.trainable] == [
    v.name for v in full.trainable_weights
  ]
  extracted = to_narrow.extract(full.get_weights())
  for e, v, w in zip(extracted, narrow.trainable_weights, full.get_weights()):
    assert tuple(e.shape) == tuple(v.shape)
    np.testing.assert_array_equal(
      e.numpy(), w[tuple(slice(0, d) for d in v.shape)]
    )
  assert to_narrow.num_elements() == models.count_params(narrow).trainable


def _zeroed_prefix(full, narrow):
  """Gives `narrow` the prefix of `full`'s (random) weights and zeroes the
  rest in `full`."""
  rng = np.random.default_rng(5)
  drawn = [
    rng.normal(scale=0.2, size=v.shape).astype(np.float32)
    for v in full.trainable_weights
  ]
  to_narrow = SubModelMap.between(full, narrow)
  narrow.set_weights([w.numpy() for w in to_narrow.extract(drawn)])
  full.set_weights(
    [w.numpy() for w in to_narrow.scatter(to_narrow.extract(drawn))]
  )


def test_narrowing_the_mlp_alone_is_the_zeroed_full_model():
  full = transformer.image_transformer((8, 8, 1), 5, 0, depth=2)
  narrow = transformer.image_transformer((8, 8, 1), 5, 0, (64, 50), depth=2)
  _zeroed_prefix(full, narrow)
  x = np.random.default_rng(6).normal(size=(4, 8, 8, 1)).astype(np.float32)
  np.testing.assert_allclose(narrow(x).numpy(), full(x).numpy(), atol=1e-5)


def test_narrowing_the_hidden_size_is_not_the_zeroed_full_model():
  # Documented: layer norms over d' features, attention scaled by key_dim'.
  full = transformer.image_transformer((8, 8, 1), 5, 0, depth=2)
  narrow = transformer.image_transformer((8, 8, 1), 5, 0, (32, 128), depth=2)
  _zeroed_prefix(full, narrow)
  x = np.random.default_rng(6).normal(size=(4, 8, 8, 1)).astype(np.float32)
  assert np.abs(narrow(x).numpy() - full(x).numpy()).max() > 1e-3


def test_text_transformer_by_hand():
  model = transformer.text_transformer(10, 50, 3, seed=0, depth=2)
  assert [l.name for l in model.layers] == [
    "tokens",
    "token_embed",
    "position_embed",
    *_blocks(2),
    "final_norm",
    "pool",
    "pooler",
    "logits",
  ]
  assert model.input.dtype == tf.int32
  params, macs, rows = _counts(model)
  # token_embed 50*64 = 3,200 (a lookup: 0 MACs); position 10*64 = 640.
  assert rows["token_embed"] == (3_200, 0)
  assert rows["position_embed"] == (640, 0)
  # A block on T = 10 tokens: 33,472 params (as on images); MACs: layer
  # norms 2*10*64 = 1,280; Q, K, V 3*10*64*64 = 122,880; scores and sum
  # 4*10*10*32 = 12,800; output 10*64*64 = 40,960; MLP 2*10*64*128 =
  # 163,840 -> 341,760.
  assert rows["block_1"] == (33_472, 341_760)
  # head: 128 + 4,160 + 64*3 + 3 = 4,483; MACs 640 + 4,096 + 192.
  assert params == 3_200 + 640 + 2 * 33_472 + 4_483 == 75_267
  assert macs == 2 * 341_760 + 640 + 4_096 + 192 == 688_448
  tokens = np.random.default_rng(0).integers(0, 50, (4, 10)).astype(np.int32)
  assert model(tokens).shape == (4, 3)


def test_text_transformer_depths_share_their_initial_weights_and_narrow():
  shallow = transformer.text_transformer(6, 20, 2, seed=1, depth=2)
  deep = transformer.text_transformer(6, 20, 2, seed=1, depth=5)
  s, d = _by_part(shallow), _by_part(deep)
  assert _same(s[0], d[0]) and _same(s[2], d[2])
  assert all(_same(a, b) for a, b in zip(s[1], d[1][:2]))
  assert models.depth_of(deep) == 5
  narrow = transformer.text_transformer(
    6, 20, 2, seed=1, widths=(16, 32), depth=2
  )
  assert narrow.get_layer("token_embed").embeddings.shape == (20, 16)
  assert narrow.get_layer("block_1").query_kernel.shape == (16, 4, 4)
  SubModelMap.between(shallow, narrow)  # prefix slices


@pytest.mark.parametrize(
  "call, needles",
  [
    (
      lambda: transformer.image_transformer((28, 28, 1), 10, 0, patch_size=5),
      ("multiples of the patch size 5", "28x28x1"),
    ),
    (
      lambda: transformer.image_transformer((28, 28), 10, 0),
      ("(height, width, channels)",),
    ),
    (
      lambda: transformer.image_transformer((8, 8, 1), 10, 0, d_model=30),
      ("d_model 30", "num_heads 4"),
    ),
    (
      lambda: transformer.image_transformer((8, 8, 1), 10, 0, depth=0),
      ("depth must be an integer >= 1", "got 0"),
    ),
    (
      lambda: transformer.image_transformer((8, 8, 1), 10, 0, depth=True),
      ("depth must be an integer >= 1",),
    ),
    (
      lambda: transformer.image_transformer((8, 8, 1), 10, 0, widths=(65, 1)),
      ("hidden", "1..64", "got 65"),
    ),
    (
      lambda: transformer.text_transformer(0, 10, 2, 0),
      ("seq_len must be an integer >= 1",),
    ),
    (
      lambda: models.build_model("transformer", (30, 30, 1), 10, 0),
      ("multiples of the patch size 7",),
    ),
  ],
)
def test_bad_configurations_are_one_line_model_errors(call, needles):
  _one_line_model_error(call, *needles)


def test_pruning_wrappers_prune_the_kernels():
  tfmot = pytest.importorskip("tensorflow_model_optimization")
  model = transformer.image_transformer((8, 8, 1), 3, 0, depth=2)
  pruned = tfmot.sparsity.keras.prune_low_magnitude(
    model, pruning_schedule=tfmot.sparsity.keras.ConstantSparsity(0.5, 0)
  )
  assert models.count_flops(pruned) == models.count_flops(model)
  masks = [v for v in pruned.non_trainable_weights if "mask" in v.name]
  # patch_embed 4*64 (2x2 patches); per block Q, K, V, output 4*64*64 and
  # the MLP 2*64*128; pooler 64*64; logits 64*3. The position table and the
  # layer norms are not pruned.
  assert sum(int(np.prod(m.shape)) for m in masks) == (
    256 + 2 * (4 * 4_096 + 2 * 8_192) + 4_096 + 192
  )
