"""Depth-scalable models: the residual CNN, partitions, weight files, registry.

Counts are derived by hand in the comments (MACs as in counting.py). Weight
files are written by the tests themselves, as `save_depth_weights` .npz and
as Keras `save_weights("x.h5")` files.
"""

import re
import warnings

from conftest import assert_one_line_error
import numpy as np
import pytest
import tensorflow as tf

from tff_hetero import models
from tff_hetero.models import depth as depth_lib
from tff_hetero.models import depth_cnn
from tff_hetero.models import transformer


def _one_line_model_error(call, *needles):
  return assert_one_line_error(models.ModelError, call, *needles)


def _blocks(depth):
  return [f"block_{i}" for i in range(1, depth + 1)]


# --------------------------------------------------------------------------
# The residual CNN


def test_depth_cnn_layers():
  model = models.build_model("depth_cnn", (28, 28, 1), 10, 0, depth=3)
  assert [l.name for l in model.layers] == [
    "image",
    "stem_conv",
    *_blocks(3),
    "head_relu",
    "pool",
    "fc",
    "logits",
  ]
  assert model.get_layer("stem_conv").output_shape == (None, 14, 14, 32)
  assert model.get_layer("block_3").output_shape == (None, 14, 14, 32)
  assert not model.non_trainable_weights
  assert [v.name for v in model.get_layer("block_2").weights] == [
    "block_2/conv1_kernel:0",
    "block_2/conv1_bias:0",
    "block_2/conv2_kernel:0",
    "block_2/conv2_bias:0",
  ]


# 28x28x1, 10 classes, C = 32: the stride-2 stem leaves 14x14x32.
# stem: 3*3*1*32 + 32 = 320 params, 14*14*32*9 = 56,448 MACs.
# block: 2*(3*3*32*32 + 32) = 18,496 params; 2*14*14*32*(9*32) = 3,612,672.
# head: fc 32*32 + 32 = 1,056, logits 32*10 + 10 = 330 -> 1,386 params;
#   MACs 1,024 + 320 = 1,344.
@pytest.mark.parametrize(
  "depth, params, macs",
  [
    (4, 75_690, 14_508_480),
    (8, 149_674, 28_959_168),
    (12, 223_658, 43_409_856),
  ],
)
def test_depth_cnn_counts_by_hand(depth, params, macs):
  assert params == 320 + depth * 18_496 + 1_386
  assert macs == 56_448 + depth * 3_612_672 + 1_344
  model = models.build_model("depth_cnn", (28, 28, 1), 10, 0, depth=depth)
  assert models.count_params(model) == models.ParamCount(params, 0, params)
  assert models.count_flops(model) == macs
  assert model.count_params() == params  # Keras agrees
  rows = {r.name: (r.params, r.macs) for r in models.layer_costs(model)}
  assert rows[f"block_{depth}"] == (18_496, 3_612_672)


def test_residual_block_against_keras_convolutions():
  rng = np.random.default_rng(0)
  block = depth_cnn.ResidualConvBlock(seed=1)
  x = rng.normal(size=(2, 5, 5, 3)).astype(np.float32)
  block(x)
  values = [rng.normal(scale=0.3, size=v.shape) for v in block.weights]
  block.set_weights(values)
  conv1, conv2 = (tf.keras.layers.Conv2D(3, 3, padding="same") for _ in "12")
  conv1(x), conv2(x)
  conv1.set_weights(values[:2])
  conv2.set_weights(values[2:])
  expected = x + conv2(tf.nn.relu(conv1(tf.nn.relu(x)))).numpy()
  np.testing.assert_allclose(block(x).numpy(), expected, atol=1e-5)


def test_depth_cnn_initial_scales_and_seeds():
  shallow = depth_cnn.depth_cnn((8, 8, 1), 10, seed=2, depth=2)
  deep = depth_cnn.depth_cnn((8, 8, 1), 10, seed=2, depth=12)
  for name in ("stem_conv", "block_1", "block_2", "fc", "logits"):
    for a, b in zip(
      shallow.get_layer(name).get_weights(), deep.get_layer(name).get_weights()
    ):
      np.testing.assert_array_equal(a, b)
  conv1 = deep.get_layer("block_1").conv1_kernel.numpy()
  conv2 = deep.get_layer("block_1").conv2_kernel.numpy()
  # He-normal (truncated) on fan_in 3*3*32 = 288: stddev sqrt(2/288) = 0.083;
  # the second convolution at 1/12 of the variance: 0.024. Keras's truncated
  # normal keeps the stddev after truncation; 9,216 samples each.
  assert conv1.std() == pytest.approx((2 / 288) ** 0.5, rel=0.05)
  assert conv2.std() == pytest.approx((2 / 288 / 12) ** 0.5, rel=0.05)
  assert not np.array_equal(
    conv1, deep.get_layer("block_2").conv1_kernel.numpy()
  )
  # The residual stream stays bounded at depth 12 (no 2^12 growth).
  x = np.random.default_rng(0).normal(size=(8, 8, 8, 1)).astype(np.float32)
  stream = tf.keras.Model(deep.input, deep.get_layer("block_12").output)
  stem = tf.keras.Model(deep.input, deep.get_layer("stem_conv").output)
  ratio = np.std(stream(x).numpy()) / np.std(stem(x).numpy())
  assert 1 < ratio < 4


@pytest.mark.parametrize("name", ["depth_cnn", "transformer"])
def test_no_depth_builds_the_deepest_registered_depth(name):
  """The program counts (and hands InclusiveFL) its probe of the full model
  as the deepest tier's model (`task_devices.adopt_full_model`)."""
  deepest = max(models.MODELS[name].depths)
  full = models.build_model(name, (8, 8, 1), 10, seed=4)
  tier = models.build_model(name, (8, 8, 1), 10, seed=4, depth=deepest)
  assert [w.name for w in full.weights] == [w.name for w in tier.weights]
  for a, b in zip(full.get_weights(), tier.get_weights(), strict=True):
    np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------
# Partitions


def test_partition_by_hand():
  model = transformer.image_transformer((8, 8, 1), 10, 0, depth=3)
  part = models.depth_partition(model)
  # embedding: patch_embed kernel, bias, position table (0..2); three
  # blocks of 16 weights (3..18, 19..34, 35..50); head: final_norm gamma,
  # beta, pooler kernel, bias, logits kernel, bias (51..56).
  assert part == models.DepthPartition(
    embedding=(0, 1, 2),
    blocks=(
      tuple(range(3, 19)),
      tuple(range(19, 35)),
      tuple(range(35, 51)),
    ),
    head=tuple(range(51, 57)),
  )
  assert part.depth == models.depth_of(model) == 3
  names = [v.name for v in model.trainable_weights]
  assert names[part.blocks[2][0]] == "block_3/ln1_gamma:0"
  assert names[part.head[-1]] == "logits/bias:0"
  cnn = depth_cnn.depth_cnn((8, 8, 1), 10, 0, depth=2)
  assert models.depth_partition(cnn) == models.DepthPartition(
    embedding=(0, 1), blocks=((2, 3, 4, 5), (6, 7, 8, 9)), head=(10, 11, 12, 13)
  )


def _functional(*layers, inputs=(4,)):
  x = inputs = tf.keras.Input(inputs)
  for layer in layers:
    x = layer(x)
  return tf.keras.Model(inputs, x, name="toy")


D = tf.keras.layers.Dense


@pytest.mark.parametrize(
  "build, needles",
  [
    (
      lambda: models.build_model("mlp", (8, 8, 1), 10, 0),
      ("model 'mlp' has no layer block_1", "not a depth-scalable model"),
    ),
    (
      lambda: _functional(
        D(4, name="block_1"), D(4, name="block_3"), D(2, name="logits")
      ),
      ("blocks numbered 1, 3", "block_2 missing"),
    ),
    (
      lambda: _functional(
        D(4, name="block_1"), D(5, name="block_2"), D(2, name="logits")
      ),
      ("block_2's weight shapes", "differ from block_1's"),
    ),
    (
      lambda: _functional(
        D(4, name="block_1"),
        D(4, name="mixer"),
        D(4, name="block_2"),
        D(2, name="logits"),
      ),
      ("weighted layers between its blocks", "mixer"),
    ),
    (
      lambda: _functional(
        D(4, name="block_1"),
        tf.keras.layers.BatchNormalization(name="bn"),
        D(2, name="logits"),
      ),
      ("2 non-trainable weights", "bn/moving_mean"),
    ),
  ],
)
def test_models_that_are_not_depth_scalable(build, needles):
  model = build()
  _one_line_model_error(lambda: models.depth_partition(model), *needles)
  _one_line_model_error(lambda: models.depth_of(model), needles[0])


# --------------------------------------------------------------------------
# Weight files


@pytest.fixture(scope="module")
def deep_and_shallow():
  """A 12-block and a 4-block transformer on 8x8x1 of different seeds."""
  deep = transformer.image_transformer((8, 8, 1), 10, seed=1, depth=12)
  shallow = transformer.image_transformer((8, 8, 1), 10, seed=2, depth=4)
  rng = np.random.default_rng(3)  # trained-looking: no zero biases
  deep.set_weights([rng.normal(size=w.shape) for w in deep.get_weights()])
  return deep, shallow


def _assert_shallow_holds_the_deep_bottom(deep, shallow):
  d, s = models.depth_partition(deep), models.depth_partition(shallow)
  dw, sw = deep.get_weights(), shallow.get_weights()
  for a, b in zip(s.embedding, d.embedding):
    np.testing.assert_array_equal(sw[a], dw[b])
  for block in range(4):
    for a, b in zip(s.blocks[block], d.blocks[block]):
      np.testing.assert_array_equal(sw[a], dw[b])
  for a, b in zip(s.head, d.head):
    np.testing.assert_array_equal(sw[a], dw[b])


def test_npz_keys_and_a_deeper_file_into_a_shallower_model(
  deep_and_shallow, tmp_path
):
  deep, shallow = deep_and_shallow
  path = tmp_path / "deep.weights"  # written as named, no suffix added
  assert models.save_depth_weights(deep, path) == str(path)
  with np.load(path) as data:
    keys = set(data.files)
    np.testing.assert_array_equal(
      data["block_12/query_kernel"], deep.get_layer("block_12").query_kernel
    )
  # 3 embedding + 12 x 16 block + 6 head variables
  assert len(keys) == 3 + 12 * 16 + 6
  assert {
    "embedding/patch_embed/kernel",
    "embedding/position_embed/embeddings",
    "block_1/ln1_gamma",
    "block_12/mlp_out_bias",
    "head/final_norm/gamma",
    "head/logits/bias",
  } <= keys
  summary = models.load_depth_weights(shallow, path)
  assert summary == models.LoadedDepthWeights(
    path=str(path),
    file_format="npz",
    file_depth=12,
    depth=4,
    embedding=3,
    head=6,
    ignored_blocks=tuple(f"block_{i}" for i in range(5, 13)),
  )
  _assert_shallow_holds_the_deep_bottom(deep, shallow)


def test_keras_h5_file_into_a_shallower_model(deep_and_shallow, tmp_path):
  deep, shallow = deep_and_shallow
  shallow.set_weights([np.zeros_like(w) for w in shallow.get_weights()])
  path = str(tmp_path / "deep.h5")
  deep.save_weights(path)
  summary = models.load_depth_weights(shallow, path)
  assert (summary.file_format, summary.file_depth, summary.depth) == (
    "h5",
    12,
    4,
  )
  _assert_shallow_holds_the_deep_bottom(deep, shallow)
  # A whole-model HDF5 file holds the same weights under model_weights.
  cnn_path = str(tmp_path / "cnn.h5")
  cnn = depth_cnn.depth_cnn((8, 8, 1), 10, seed=1, depth=3)
  with warnings.catch_warnings():  # HDF5 is Keras's "legacy" format
    warnings.simplefilter("ignore", UserWarning)
    cnn.save(cnn_path)
  target = depth_cnn.depth_cnn((8, 8, 1), 10, seed=2, depth=2)
  assert models.load_depth_weights(target, cnn_path).ignored_blocks == (
    "block_3",
  )
  for name in ("stem_conv", "block_1", "block_2", "fc", "logits"):
    for a, b in zip(
      cnn.get_layer(name).get_weights(), target.get_layer(name).get_weights()
    ):
      np.testing.assert_array_equal(a, b)


def test_load_errors_name_the_file_and_leave_the_model_unchanged(tmp_path):
  model = transformer.image_transformer((8, 8, 1), 10, seed=0, depth=4)
  before = model.get_weights()

  def fails(path, *needles):
    _one_line_model_error(
      lambda: models.load_depth_weights(model, path), str(path), *needles
    )
    for a, b in zip(before, model.get_weights()):
      np.testing.assert_array_equal(a, b)

  fails(tmp_path / "missing.npz", "no such file")
  garbage = tmp_path / "garbage.bin"
  garbage.write_bytes(b"not weights at all")
  fails(garbage, "neither an .npz nor a Keras HDF5 weights file")
  broken = tmp_path / "broken.npz"
  broken.write_bytes(b"PK\x03\x04 truncated zip")
  fails(broken, "unreadable")
  shallow = tmp_path / "shallow.npz"
  models.save_depth_weights(
    transformer.image_transformer((8, 8, 1), 10, seed=1, depth=2), shallow
  )
  fails(shallow, "the file has 2 blocks, the model 'transformer' 4")
  other_classes = tmp_path / "classes.npz"
  models.save_depth_weights(
    transformer.image_transformer((8, 8, 1), 3, seed=1, depth=4), other_classes
  )
  fails(
    other_classes, "variable head/logits/kernel has shape (64, 3) in the file,"
  )
  narrower = tmp_path / "narrow.h5"
  transformer.image_transformer(
    (8, 8, 1), 10, seed=1, widths=(32, 128), depth=4
  ).save_weights(str(narrower))
  fails(narrower, "embedding/patch_embed/kernel has shape (4, 32)", "(4, 64)")
  cnn = tmp_path / "cnn.npz"
  models.save_depth_weights(depth_cnn.depth_cnn((8, 8, 1), 10, 0, depth=4), cnn)
  fails(cnn, "no variable embedding/patch_embed/kernel")
  keras3 = tmp_path / "model.weights.h5"
  model.save_weights(str(keras3))  # Keras's newer layout: layers by class
  fails(keras3, "layer_names")


def test_a_file_with_variables_the_model_lacks(tmp_path):
  model = depth_cnn.depth_cnn((8, 8, 1), 10, seed=0, depth=2)
  path = tmp_path / "extra.npz"
  models.save_depth_weights(model, path)
  with np.load(path) as data:
    arrays = dict(data)
  arrays["head/extra/kernel"] = np.zeros(3)
  with open(path, "wb") as f:
    np.savez(f, **arrays)
  _one_line_model_error(
    lambda: models.load_depth_weights(model, path),
    "has no variable head/extra/kernel",
  )


def test_saving_needs_a_depth_scalable_model(tmp_path):
  _one_line_model_error(
    lambda: models.save_depth_weights(
      models.build_model("mlp", (8, 8, 1), 10, 0), tmp_path / "x.npz"
    ),
    "no layer block_1",
  )


# --------------------------------------------------------------------------
# Registry


def test_depth_tiers_and_the_depth_argument():
  assert models.depth_tiers("transformer") == (4, 8, 12)
  assert models.depth_tiers("depth_cnn") == (4, 8, 12)
  assert {n for n, s in models.MODELS.items() if s.depths} == {
    "transformer",
    "text_transformer",
    "depth_cnn",
  }
  _one_line_model_error(
    lambda: models.depth_tiers("resnet20"),
    "'resnet20' has no depth knob",
    "depth_cnn, text_transformer, transformer",
  )
  _one_line_model_error(
    lambda: models.build_model("mlp", (8, 8, 1), 10, 0, depth=4),
    "'mlp' has no depth knob (got depth=4)",
    "depth_cnn, text_transformer, transformer",
  )
  for bad in (0, -1, 2.0, "4", True):
    _one_line_model_error(
      lambda: models.build_model("depth_cnn", (8, 8, 1), 10, 0, depth=bad),
      "depth must be an integer >= 1",
    )
  _one_line_model_error(
    lambda: models.width_units("mlp", (8, 8, 1), 10, depth=2), "no depth knob"
  )
  model = models.build_model("depth_cnn", (8, 8, 1), 10, 0, depth=np.int64(2))
  assert models.depth_of(model) == 2
  assert (
    models.depth_of(models.build_model("depth_cnn", (8, 8, 1), 10, 0)) == 12
  )


def test_registered_tiers_share_their_initial_weights():
  deep = models.build_model("transformer", (8, 8, 1), 10, 7)
  shallow = models.build_model("transformer", (8, 8, 1), 10, 7, depth=4)
  _assert_shallow_holds_the_deep_bottom(deep, shallow)


def _description_counts(name):
  match = re.search(
    r"depth ([\d/]+): ([\d,/]+) params on (\d+)x(\d+)x(\d+)/(\d+) classes",
    models.MODELS[name].description,
  )
  depths = tuple(int(d) for d in match.group(1).split("/"))
  counts = tuple(int(c.replace(",", "")) for c in match.group(2).split("/"))
  shape = tuple(int(match.group(i)) for i in (3, 4, 5))
  return depths, counts, shape, int(match.group(6))


@pytest.mark.parametrize(
  "name, counts",
  [
    # transformer.py and the counts tests of transformer_test.py:
    # 9,162 + 33,472 L; depth_cnn: 1,706 + 18,496 L (above).
    ("transformer", (143_050, 276_938, 410_826)),
    ("depth_cnn", (75_690, 149_674, 223_658)),
  ],
)
def test_descriptions_state_the_tiers_parameter_counts(name, counts):
  depths, described, shape, classes = _description_counts(name)
  assert depths == models.depth_tiers(name)
  assert described == counts
  assert (shape, classes) == ((28, 28, 1), 10)
  assert models.MODELS[name].images == "mnist"
  for depth, count in zip(depths, counts):
    model = models.build_model(name, shape, classes, 0, depth=depth)
    assert models.count_params(model).trainable == count


def test_depth_matched_widths_by_hand():
  # depth_cnn at 12 blocks and C channels: stem 10C, blocks 12(18C^2 + 2C),
  # fc C^2 + C, logits 10C + 10: 217C^2 + 45C + 10. Depth 4 has 75,690:
  # C = 19 gives 79,202 (+3,512), C = 18 71,128 (-4,562). Depth 8 has
  # 149,674: C = 26 gives 147,872 (-1,802), C = 27 159,418.
  assert models.depth_matched_widths("depth_cnn", (28, 28, 1), 10, 4) == (19,)
  assert models.depth_matched_widths("depth_cnn", (28, 28, 1), 10, 8) == (26,)
  assert models.depth_matched_widths("depth_cnn", (28, 28, 1), 10, 12) == (32,)
  _one_line_model_error(
    lambda: models.depth_matched_widths(
      "depth_cnn", (28, 28, 1), 10, 8, full_depth=4
    ),
    "depth 8 is deeper than the narrowed model's 4",
  )


def test_transformer_hidden_sizes_matching_the_shallower_tiers_by_hand():
  # transformer at 12 blocks, hidden d (key_dim k = ceil(d/4)), MLP 128:
  # embedding 49d + d + 16d; blocks 12(4d + 3(4dk + 4k) + 4kd + d + 128d
  # + 128 + 128d + d); head 2d + d^2 + d + 10d + 10; together
  # d^2 + 3,223d + 192dk + 144k + 1,546 (410,826 at d = 64, k = 16).
  # Depth 4 has 143,050: d = 29 (k = 8) gives 141,550 (-1,500), d = 30
  # (k = 8) 146,368 (+3,318). Depth 8 has 276,938: d = 48 (k = 12) gives
  # 270,874 (-6,064), d = 49 (k = 13) 286,050 (+9,112).
  for depth, hidden in ((4, 29), (8, 48)):
    assert models.depth_matched_widths(
      "transformer", (28, 28, 1), 10, depth
    ) == (hidden, 128)
  _one_line_model_error(
    lambda: models.depth_matched_widths("transformer", (28, 28, 1), 10, None),
    "depth must be an integer >= 1, got None",
  )


def test_depth_seeds_are_per_part():
  seeds = depth_lib.DepthSeeds(5)
  assert seeds.block(3) == depth_lib.DepthSeeds(5).block(3)
  assert len({seeds.block(i) for i in range(1, 13)}) == 12
  assert seeds.block(3) != depth_lib.DepthSeeds(6).block(3)
  assert seeds.embedding().next_seed() != seeds.head().next_seed()
