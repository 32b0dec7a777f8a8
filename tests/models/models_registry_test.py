"""Tests of the model registry: names, seeding, logits, input-shape checks."""

from conftest import assert_one_line_error
from conftest import once_per_structure
import numpy as np
import pytest
import tensorflow as tf

from tff_hetero import models


def _one_line_model_error(call, *needles):
  return assert_one_line_error(models.ModelError, call, *needles)


# One input shape each model is meant for.
TYPICAL_SHAPES = {
  "mnist_cnn": (28, 28, 1),
  "mnist_cnn_feddst": (28, 28, 1),
  "cifar_cnn": (32, 32, 3),
  "small_cnn": (8, 8, 1),
  "mlp": (8, 8, 1),
  "mnist_2nn": (28, 28, 1),
  "resnet8": (32, 32, 3),
  "resnet20": (32, 32, 3),
  "resnet32": (32, 32, 3),
  "resnet56": (32, 32, 3),
  "resnet110": (32, 32, 3),
  "resnet18": (32, 32, 3),
  "vgg11": (32, 32, 3),
  "vgg16": (32, 32, 3),
  "vgg16_eighth": (28, 28, 1),
  "fedgkt_edge_resnet4": (32, 32, 3),
  "fedgkt_edge_resnet6": (32, 32, 3),
  "fedgkt_edge_resnet8": (32, 32, 3),
  "fedgkt_server_resnet7": (32, 32, 3),
  "fedgkt_server_resnet19": (32, 32, 3),
  "fedgkt_server_resnet55": (32, 32, 3),
  "fedgkt_server_resnet109": (32, 32, 3),
  "fedgkt_edge_resnet8_bottleneck": (32, 32, 3),
  "fedgkt_server_resnet55_bottleneck": (32, 32, 3),
  "fedgkt_server_resnet109_bottleneck": (32, 32, 3),
  "resnet56_bottleneck": (32, 32, 3),
  "resnet110_bottleneck": (32, 32, 3),
  "transformer": (28, 28, 1),
  "text_transformer": (16,),  # 16 token ids.
  "depth_cnn": (28, 28, 1),
}


def _weights_equal(a, b):
  wa, wb = a.get_weights(), b.get_weights()
  return len(wa) == len(wb) and all(
    np.array_equal(x, y) for x, y in zip(wa, wb)
  )


def test_every_registered_model_has_a_typical_shape_and_a_complete_spec():
  assert set(models.MODELS) == set(TYPICAL_SHAPES)
  assert models.model_names() == tuple(sorted(TYPICAL_SHAPES))
  for name, spec in models.MODELS.items():
    assert spec.name == name
    assert callable(spec.factory)
    assert spec.description and "\n" not in spec.description
    assert spec.paper
    assert callable(spec.width_units)
    assert (
      spec.default_start_indices
      or len(spec.width_units(TYPICAL_SHAPES[name], 10)) == 1
    )  # One width unit: no AdaptiveFL pool.


@pytest.mark.parametrize("name", once_per_structure(TYPICAL_SHAPES))
def test_models_output_logits_of_num_classes(name):
  shape = TYPICAL_SHAPES[name]
  model = models.build_model(name, shape, num_classes=7, seed=3)
  assert isinstance(model, tf.keras.Model)
  assert model.name == name
  rng = np.random.default_rng(0)
  size = (5,) + tuple(model.input.shape[1:])
  if models.MODELS[name].takes_tokens:
    x = rng.integers(0, 100, size=size).astype(np.int32)
  else:
    x = rng.normal(size=size).astype(np.float32)
  y = model(x).numpy()
  assert y.shape == (5, 7)
  # Logits, not probabilities: the last layer is linear and the rows do not
  # sum to 1.
  last = model.layers[-1]
  assert last.name == "logits"
  assert last.get_config()["activation"] == "linear"
  assert not np.allclose(y.sum(axis=1), 1.0)


@pytest.mark.parametrize("name", ["mnist_cnn", "cifar_cnn", "mlp"])
def test_same_seed_same_weights_other_seed_other_weights(name):
  shape = TYPICAL_SHAPES[name]
  first = models.build_model(name, shape, 10, seed=11)
  # Unrelated TF randomness in between must not matter (no global-seed use).
  tf.random.set_seed(12345)
  tf.random.uniform((3,))
  models.build_model("small_cnn", (8, 8, 1), 10, seed=11)
  again = models.build_model(name, shape, 10, seed=11)
  other = models.build_model(name, shape, 10, seed=12)
  assert _weights_equal(first, again)
  kernels_first = [w for w in first.get_weights() if w.ndim > 1]
  kernels_other = [w for w in other.get_weights() if w.ndim > 1]
  for a, b in zip(kernels_first, kernels_other):
    assert not np.array_equal(a, b)


def test_layers_of_one_model_get_distinct_seeds():
  model = models.build_model("mnist_2nn", (28, 28, 1), 10, seed=0)
  fc2 = model.get_layer("fc2").kernel.numpy()  # 200x200
  fc1 = model.get_layer("fc1").kernel.numpy()[:200, :200]
  assert not np.allclose(fc1 / np.abs(fc1).max(), fc2 / np.abs(fc2).max())


def test_biases_start_at_zero():
  model = models.build_model("cifar_cnn", (32, 32, 3), 10, seed=0)
  for layer in model.layers:
    if getattr(layer, "bias", None) is not None:
      assert not np.any(layer.bias.numpy())


def test_unknown_name_lists_accepted_names():
  _one_line_model_error(
    lambda: models.build_model("resnet9000", (28, 28, 1), 10, 0),
    "'resnet9000'",
    "accepted:",
    "mnist_cnn",
    "cifar_cnn",
    "mlp",
  )


def test_model_error_is_a_value_error():
  assert issubclass(models.ModelError, ValueError)


def test_mnist_cnn_rejects_8x8_digits_and_points_to_small_models():
  _one_line_model_error(
    lambda: models.build_model("mnist_cnn", (8, 8, 1), 10, 0),
    "'mnist_cnn'",
    "at least 16x16",
    "8x8x1",
    "small_cnn",
    "mlp",
  )
  # The smallest size it accepts.
  model = models.build_model("mnist_cnn", (16, 16, 1), 10, 0)
  assert model.output_shape == (None, 10)
  _one_line_model_error(
    lambda: models.build_model("mnist_cnn", (15, 28, 1), 10, 0), "16x16"
  )


def test_feddst_variant_needs_13x13():
  _one_line_model_error(
    lambda: models.build_model("mnist_cnn_feddst", (12, 12, 1), 10, 0),
    "at least 13x13",
  )
  assert models.build_model("mnist_cnn_feddst", (13, 13, 1), 10, 0)


def test_small_models_take_8x8_digits():
  for name in ("small_cnn", "mlp"):
    model = models.build_model(name, (8, 8, 1), 10, 0)
    assert model(np.zeros((2, 8, 8, 1), np.float32)).shape == (2, 10)
  _one_line_model_error(
    lambda: models.build_model("small_cnn", (3, 3, 1), 10, 0), "at least 4x4"
  )


def test_cifar_cnn_takes_24x24_crops_and_other_sizes():
  model = models.build_model("cifar_cnn", (24, 24, 3), 10, 0)
  assert model.get_layer("flatten").output_shape == (None, 6 * 6 * 64)
  model = models.build_model("cifar_cnn", (32, 32, 3), 10, 0)
  assert model.get_layer("flatten").output_shape == (None, 8 * 8 * 64)


def test_mlp_takes_any_input_rank():
  model = models.build_model("mlp", (64,), 3, 0)
  assert model.output_shape == (None, 3)


@pytest.mark.parametrize("shape", [(28, 28), (28, 28, 1, 1), (784,)])
def test_cnns_need_rank_3_images(shape):
  _one_line_model_error(
    lambda: models.build_model("mnist_cnn", shape, 10, 0),
    "(height, width, channels)",
  )


@pytest.mark.parametrize(
  "kwargs, needle",
  [
    (dict(input_shape=(0, 8, 1)), "input_shape"),
    (dict(input_shape="28x28"), "input_shape"),
    (dict(input_shape=()), "input_shape"),
    (dict(input_shape=(8.0, 8, 1)), "input_shape"),
    (dict(num_classes=1), "num_classes"),
    (dict(num_classes=2.5), "num_classes"),
    (dict(num_classes=True), "num_classes"),
    (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(seed=None), "seed"),
  ],
)
def test_bad_arguments_are_one_line_model_errors(kwargs, needle):
  args = dict(name="small_cnn", input_shape=(8, 8, 1), num_classes=10, seed=0)
  args.update(kwargs)
  _one_line_model_error(lambda: models.build_model(**args), needle)


def test_layer_names_are_stable():
  model = models.build_model("mnist_cnn", (28, 28, 1), 10, 0)
  assert [l.name for l in model.layers] == [
    "image",
    "conv1",
    "pool1",
    "conv2",
    "pool2",
    "flatten",
    "fc1",
    "logits",
  ]


def test_input_shape_may_be_a_list_numpy_shape_or_tensor_shape():
  for shape in (
    [8, 8, 1],
    np.zeros((8, 8, 1)).shape,
    tf.TensorShape([8, 8, 1]),
    (np.int64(8), 8, 1),
  ):
    model = models.build_model("small_cnn", shape, 10, 0)
    assert model.input_shape == (None, 8, 8, 1)


# --------------------------------------------------------------------------
# Models on token ids


def test_only_text_transformer_takes_tokens():
  assert {n for n, s in models.MODELS.items() if s.takes_tokens} == {
    "text_transformer"
  }
  spec = models.MODELS["text_transformer"]
  assert spec.images == "text"
  assert spec.depths == models.MODELS["transformer"].depths == (4, 8, 12)
  assert spec.default_start_indices == (1,)


def test_text_transformer_is_built_with_the_vocabulary_size():
  model = models.build_model(
    "text_transformer", (12,), 3, seed=0, depth=2, vocab_size=57
  )
  assert model.input.dtype == tf.int32 and model.input_shape == (None, 12)
  assert model.get_layer("token_embed").get_weights()[0].shape == (57, 64)
  assert models.depth_of(model) == 2
  logits = model(np.array([[0, 56] + [1] * 10], np.int32))
  assert logits.shape == (1, 3)
  # No vocab_size: the default (the GLUE loader's cap).
  default = models.build_model("text_transformer", (12,), 3, seed=0, depth=1)
  assert default.get_layer("token_embed").input_dim == 20000
  # The registry's description counts: 64 tokens, 20,000 ids, 2 classes.
  for depth, count in zip((4, 8, 12), (1_422_402, 1_556_290, 1_690_178)):
    assert f"{count:,}" in models.MODELS["text_transformer"].description
    built = models.build_model("text_transformer", (64,), 2, 0, depth=depth)
    assert models.count_params(built).trainable == count


def test_text_transformer_has_the_image_transformers_blocks_and_units():
  text = models.build_model(
    "text_transformer", (16,), 10, seed=4, depth=3, vocab_size=30
  )
  image = models.build_model("transformer", (8, 8, 1), 10, seed=4, depth=3)
  for name in ("block_1", "block_2", "block_3", "final_norm", "pooler"):
    shapes = [w.shape for w in text.get_layer(name).get_weights()]
    assert shapes == [w.shape for w in image.get_layer(name).get_weights()]
  text_units = models.width_units("text_transformer", (16,), 10, depth=3)
  image_units = models.width_units("transformer", (8, 8, 1), 10, depth=3)
  assert [(u.name, u.full_width) for u in text_units] == [
    (u.name, u.full_width) for u in image_units
  ]
  assert text_units[0].layers[0] == "token_embed"
  narrow = models.build_model(
    "text_transformer", (16,), 10, seed=4, widths=(32, 64), vocab_size=30
  )
  assert narrow.get_layer("token_embed").get_weights()[0].shape == (30, 32)


def test_token_and_image_models_reject_each_others_inputs():
  _one_line_model_error(
    lambda: models.build_model("text_transformer", (28, 28, 1), 10, 0),
    "'text_transformer' takes token ids shaped (seq_len,)",
    "(28, 28, 1)",
  )
  _one_line_model_error(
    lambda: models.width_units("text_transformer", (8, 8, 1), 10),
    "takes token ids",
  )
  _one_line_model_error(
    lambda: models.build_model("transformer", (64,), 2, 0),
    "(height, width, channels)",
  )
  _one_line_model_error(
    lambda: models.build_model("mlp", (64,), 2, 0, vocab_size=100),
    "'mlp' takes images, not token ids",
    "vocab_size=100",
    "text_transformer",
  )
  for bad in (0, -3, 2.5, True, "100"):
    _one_line_model_error(
      lambda: models.build_model(
        "text_transformer", (8,), 2, 0, vocab_size=bad
      ),
      "vocab_size must be an integer >= 1",
    )


def test_depth_matched_widths_of_the_text_transformer():
  # Hidden width of the 12-block model with about the 4-block's parameters;
  # with a tiny vocabulary the blocks dominate.
  widths = models.depth_matched_widths(
    "text_transformer", (16,), 2, 4, vocab_size=10
  )
  deep = models.build_model(
    "text_transformer", (16,), 2, 0, widths=widths, vocab_size=10
  )
  shallow = models.build_model(
    "text_transformer", (16,), 2, 0, depth=4, vocab_size=10
  )
  assert widths[1] == 128 and widths[0] < 64
  ratio = (
    models.count_params(deep).trainable / models.count_params(shallow).trainable
  )
  assert 0.9 < ratio < 1.1
