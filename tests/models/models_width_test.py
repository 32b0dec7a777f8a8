"""Width-capable models: units, narrowed variables, and prefix sub-models.

The central check (`test_narrowed_model_is_the_prefix_of_the_full_model`):
a model built with narrower widths computes exactly what the full model
computes once every weight outside the kept prefix is zeroed, when it is
given the prefix slices of the full model's weights. Small inputs keep the
big models cheap; the structure does not depend on the input size, except
for VGG's fifth pool and classifier width (3-channel input), which
`vgg16_eighth` covers on 32x32x3.
"""

from conftest import assert_one_line_error
from conftest import once_per_structure
import numpy as np
import pytest
import tensorflow as tf

from tff_hetero import models
from tff_hetero.submodels import pools


def _one_line_model_error(call, *needles):
  return assert_one_line_error(models.ModelError, call, *needles)


# Small input shapes each model takes (structure tests, not counts).
SMALL_SHAPES = {
  "mnist_cnn": (16, 16, 1),
  "mnist_cnn_feddst": (13, 13, 1),
  "cifar_cnn": (8, 8, 3),
  "small_cnn": (8, 8, 1),
  "mlp": (8, 8, 1),
  "mnist_2nn": (6, 6, 1),
  "resnet8": (8, 8, 3),
  "resnet20": (8, 8, 3),
  "resnet32": (8, 8, 3),
  "resnet56": (8, 8, 3),
  "resnet110": (8, 8, 3),
  "resnet18": (16, 16, 3),
  "vgg11": (16, 16, 1),
  "vgg16": (16, 16, 1),
  "vgg16_eighth": (32, 32, 3),
  "fedgkt_edge_resnet4": (8, 8, 3),
  "fedgkt_edge_resnet6": (8, 8, 3),
  "fedgkt_edge_resnet8": (8, 8, 3),
  "fedgkt_server_resnet7": (8, 8, 3),
  "fedgkt_server_resnet19": (8, 8, 3),
  "fedgkt_server_resnet55": (8, 8, 3),
  "fedgkt_server_resnet109": (8, 8, 3),
  "fedgkt_edge_resnet8_bottleneck": (8, 8, 3),
  "fedgkt_server_resnet55_bottleneck": (8, 8, 3),
  "fedgkt_server_resnet109_bottleneck": (8, 8, 3),
  "resnet56_bottleneck": (8, 8, 3),
  "resnet110_bottleneck": (8, 8, 3),
  "transformer": (8, 8, 1),
  "text_transformer": (8,),  # 8 token ids.
  "depth_cnn": (8, 8, 1),
}
CLASSES = 5

UNIT_NAMES = {
  "mnist_cnn": ("conv1", "conv2", "fc1"),
  "mnist_cnn_feddst": ("conv1", "conv2", "fc1"),
  "cifar_cnn": ("conv1", "conv2", "fc1", "fc2"),
  "small_cnn": ("conv1", "conv2"),
  "mlp": ("fc1",),
  "mnist_2nn": ("fc1", "fc2"),
  **{
    name: ("stem", "stage1", "stage2", "stage3")
    for name in ("resnet8", "resnet20", "resnet32", "resnet56", "resnet110")
  },
  "resnet18": ("stem", "stage1", "stage2", "stage3", "stage4"),
  "vgg11": tuple(f"conv{i}" for i in range(1, 9)) + ("fc1", "fc2"),
  "vgg16": tuple(f"conv{i}" for i in range(1, 14)) + ("fc1", "fc2"),
  "vgg16_eighth": tuple(f"conv{i}" for i in range(1, 14)) + ("fc1", "fc2"),
  **{f"fedgkt_edge_resnet{d}": ("stem", "stage1") for d in (4, 6, 8)},
  **{
    f"fedgkt_server_resnet{d}": ("stage1", "stage2", "stage3")
    for d in (7, 19, 55, 109)
  },
  # Bottleneck ResNets: each stage's planes, then its 4x residual stream.
  "fedgkt_edge_resnet8_bottleneck": ("stem", "stage1_mid", "stage1"),
  **{
    f"fedgkt_server_resnet{d}_bottleneck": (
      "stage1_mid",
      "stage1",
      "stage2_mid",
      "stage2",
      "stage3_mid",
      "stage3",
    )
    for d in (55, 109)
  },
  **{
    f"resnet{d}_bottleneck": (
      "stem",
      "stage1_mid",
      "stage1",
      "stage2_mid",
      "stage2",
      "stage3_mid",
      "stage3",
    )
    for d in (56, 110)
  },
  "transformer": ("hidden", "mlp"),
  "text_transformer": ("hidden", "mlp"),
  "depth_cnn": ("channels",),
}

DEFAULT_START_INDICES = {
  "mnist_cnn": (2,),
  "mnist_cnn_feddst": (2, 1),
  "cifar_cnn": (2, 1),
  "small_cnn": (1,),
  "mlp": (),
  "mnist_2nn": (1,),
  "resnet8": (3, 2, 1),
  "resnet20": (3, 2, 1),
  "resnet32": (3, 2, 1),
  "resnet56": (3, 2, 1),
  "resnet110": (3, 2, 1),
  "resnet18": (4, 3, 2),
  "vgg11": (6, 4, 2),
  "vgg16": (8, 6, 4),
  "vgg16_eighth": (8, 6, 4),
  **{f"fedgkt_edge_resnet{d}": (1,) for d in (4, 6, 8)},
  **{f"fedgkt_server_resnet{d}": (2, 1) for d in (7, 19, 55, 109)},
  "fedgkt_edge_resnet8_bottleneck": (2,),
  **{f"fedgkt_server_resnet{d}_bottleneck": (4, 2, 1) for d in (55, 109)},
  **{f"resnet{d}_bottleneck": (5, 3, 1) for d in (56, 110)},
  "transformer": (1,),
  "text_transformer": (1,),
  "depth_cnn": (),
}

_CIFAR_RESNETS = ("resnet8", "resnet20", "resnet32", "resnet56", "resnet110")


def _profiles(name, units):
  """Two width profiles per model (see the prefix test for what they cover)."""
  full = models.full_widths(units)
  if name in _CIFAR_RESNETS:
    # Stem and stage 1 narrowed alike, the rest wider (zero-padded
    # shortcuts); and every unit narrowed unevenly with truncation only at
    # the last stage (see resnet.py on truncation before a wider stage).
    return ((5, 5, 16, 64), (13, 11, 7, 6))
  if name.startswith("fedgkt_server") and not name.endswith("_bottleneck"):
    # Its input has 16 channels: a narrower stage 1 would truncate them
    # before wider stages (resnet.py); narrow the later stages instead.
    return ((16, 16, 21), (16, 32, 20))
  if name == "resnet18":
    # AdaptiveFL's M3 (stem whole, stage 1 truncates its identity
    # shortcut); and uneven widths with a zero-padded stage-1 shortcut.
    return (models.widths_for(units, 0.66, 1), (21, 64, 42, 256, 170))
  first = models.widths_for(units, 0.5, 1 if len(units) > 1 else 0)
  # Every other unit at a third of its width, the others whole: inputs
  # both narrower and wider than the layers reading them.
  second = tuple(
    max(1, w // 3) if i % 2 == 0 else w for i, w in enumerate(full)
  )
  return (first, second)


def _unit_width(layer, unit):
  """The width `unit` sets in `layer`: its output's, except for the
  transformer's `mlp` unit, the MLP width inside its blocks."""
  if unit.name == "mlp" and hasattr(layer, "mlp_dim"):
    return layer.mlp_dim
  return layer.output_shape[-1]


def _weight_kind(variable):
  return variable.name.split("/")[-1].split(":")[0]


def _flatten_dense(model):
  """(dense layer name, (H, W, C)) for a dense layer reading a feature map."""
  names = [layer.name for layer in model.layers]
  if "flatten" not in names:
    return None, None
  flatten = model.get_layer("flatten")
  if len(flatten.input_shape) != 4:
    return None, None
  for layer in model.layers:
    if (
      isinstance(layer, tf.keras.layers.Dense) and layer.input is flatten.output
    ):
      return layer.name, flatten.input_shape[1:]
  raise AssertionError("no dense layer reads the flatten")


def _randomised(model, rng):
  """Random values for every variable: kernels as initialised, the rest drawn."""
  values = []
  for v in model.weights:
    kind = _weight_kind(v)
    value = v.numpy()
    if kind in ("bias", "beta", "moving_mean"):
      value = rng.uniform(-0.1, 0.1, value.shape)
    elif kind in ("gamma", "moving_variance"):
      value = rng.uniform(0.5, 1.5, value.shape)
    values.append(value.astype(np.float32))
  return values


def _load_prefix(full, narrow, full_values):
  """Copies prefix slices of `full_values` into `narrow`; zeroes the rest in `full`.

  Returns nothing; `full` holds `full_values` with every kernel, bias and
  batch-norm gamma/beta entry outside the prefix set to 0 (running
  statistics are left as drawn).
  """
  dense_name, feature_map = _flatten_dense(full)
  assert [l.name for l in full.layers] == [l.name for l in narrow.layers]
  by_var = {id(v): value for v, value in zip(full.weights, full_values)}
  for lf, ln in zip(full.layers, narrow.layers):
    assert len(lf.weights) == len(ln.weights), lf.name
    for vf, vn in zip(lf.weights, ln.weights):
      value = by_var[id(vf)]
      kind = _weight_kind(vf)
      if (
        lf.name == dense_name
        and kind == "kernel"
        and vn.shape[0] != value.shape[0]
      ):
        # Channels-last flatten of (H, W, C): view the rows as (H, W, C).
        h, w, c = feature_map
        view = value.reshape(h, w, c, value.shape[1])
        keep = (
          slice(None),
          slice(None),
          slice(0, vn.shape[0] // (h * w)),
          slice(0, vn.shape[1]),
        )
        mask = np.zeros_like(view)
        mask[keep] = 1
        vn.assign(view[keep].reshape(vn.shape))
        vf.assign((view * mask).reshape(value.shape))
        continue
      keep = tuple(slice(0, d) for d in vn.shape)
      vn.assign(value[keep])
      if kind in ("moving_mean", "moving_variance"):
        vf.assign(value)
      else:
        mask = np.zeros_like(value)
        mask[keep] = 1
        vf.assign(value * mask)


def _without_dropout(model):
  # Dropout draws its mask per tensor shape, so a narrowed model cannot draw
  # the full model's mask; the training-mode check is about batch norm.
  for layer in model.layers:
    if isinstance(layer, tf.keras.layers.Dropout):
      layer.rate = 0.0


def _assert_close(narrow_out, full_out, tolerance=1e-5):
  scale = max(1.0, float(np.abs(full_out).max()))
  np.testing.assert_allclose(
    narrow_out, full_out, rtol=0, atol=tolerance * scale
  )


# The deep Bottleneck ResNets (54 and 108 layers with batch norm on random
# statistics, batch statistics of 8 small images in training mode) amplify
# float32 reordering: 1e-3 of the scale (a structural error is of order 1).
def _tolerance(name):
  return 1e-3 if name.endswith("_bottleneck") else 1e-5


@pytest.fixture(scope="module")
def zoo():
  """`zoo(name, widths=None)`: the model on its small shape, built once."""
  built = {}

  def get(name, widths=None):
    key = (name, None if widths is None else tuple(widths))
    if key not in built:
      built[key] = models.build_model(
        name, SMALL_SHAPES[name], CLASSES, seed=0, widths=widths
      )
    return built[key]

  return get


def test_every_model_has_units_and_start_indices():
  assert set(models.MODELS) == set(SMALL_SHAPES) == set(UNIT_NAMES)
  for name, spec in models.MODELS.items():
    units = models.width_units(name, SMALL_SHAPES[name], CLASSES)
    assert tuple(u.name for u in units) == UNIT_NAMES[name], name
    assert tuple(u.index for u in units) == tuple(range(1, len(units) + 1))
    assert spec.default_start_indices == DEFAULT_START_INDICES[name]
    if not spec.default_start_indices:  # One width unit: no pool keeps it.
      assert len(units) == 1, name
      continue
    # Start indices in 1..units-1, decreasing (sizes: submodels/pools_test.py).
    pool = pools.adaptivefl_pool(units, 0.66, 0.40, spec.default_start_indices)
    assert len(pool.members) == 2 * len(spec.default_start_indices) + 1


@pytest.mark.parametrize("name", once_per_structure(SMALL_SHAPES))
def test_units_name_real_layers_of_their_full_width(name, zoo):
  model = zoo(name)
  units = models.width_units(name, SMALL_SHAPES[name], CLASSES)
  for unit in units:
    for layer_name in unit.layers:
      layer = model.get_layer(layer_name)
      assert _unit_width(layer, unit) == unit.full_width, (unit, layer_name)
  named = {n for u in units for n in u.layers}
  # Every layer with an output-width knob belongs to a unit, except logits.
  for layer in model.layers:
    knob = getattr(layer, "filters", None) or getattr(layer, "units", None)
    if knob and layer.name != "logits":
      assert layer.name in named, layer.name


def test_unit_tables_of_the_big_models():
  units = models.width_units("vgg16", (32, 32, 3), 10)
  assert models.full_widths(units) == (
    64,
    64,
    128,
    128,
    256,
    256,
    256,
    512,
    512,
    512,
    512,
    512,
    512,
    4096,
    4096,
  )
  assert units[0] == models.WidthUnit(1, "conv1", 64, ("conv1", "bn1"))
  assert units[13] == models.WidthUnit(14, "fc1", 4096, ("fc1",))
  assert models.full_widths(models.width_units("vgg16", (28, 28, 1), 10))[
    -2:
  ] == (256, 256)
  assert models.full_widths(models.width_units("vgg11", (32, 32, 3), 10)) == (
    64,
    128,
    256,
    256,
    512,
    512,
    512,
    512,
    4096,
    4096,
  )
  assert models.full_widths(
    models.width_units("vgg16_eighth", (28, 28, 1), 10)
  ) == (8, 8, 16, 16, 32, 32, 32, 64, 64, 64, 64, 64, 64, 32, 32)
  assert models.full_widths(
    models.width_units("vgg16_eighth", (32, 32, 3), 10)
  )[-2:] == (512, 512)
  resnet18 = models.width_units("resnet18", (32, 32, 3), 10)
  assert models.full_widths(resnet18) == (64, 64, 128, 256, 512)
  assert resnet18[0].layers == ("stem_conv", "stem_bn")
  # Stage 2: two blocks of conv/bn pairs plus the projection shortcut.
  assert resnet18[2].layers == (
    "stage2_block1_conv1",
    "stage2_block1_bn1",
    "stage2_block1_conv2",
    "stage2_block1_bn2",
    "stage2_block1_shortcut",
    "stage2_block1_shortcut_bn",
    "stage2_block2_conv1",
    "stage2_block2_bn1",
    "stage2_block2_conv2",
    "stage2_block2_bn2",
  )
  resnet56 = models.width_units("resnet56", (32, 32, 3), 10)
  assert models.full_widths(resnet56) == (16, 16, 32, 64)
  # 9 blocks x (conv1, bn1, conv2, bn2) + the option-A shortcut layer
  assert len(resnet56[3].layers) == 9 * 4 + 1


@pytest.mark.parametrize(
  "name", ["mnist_cnn", "cifar_cnn", "mnist_2nn", "resnet20", "vgg16_eighth"]
)
def test_full_widths_build_the_model_built_without_widths(name):
  shape = SMALL_SHAPES[name]
  plain = models.build_model(name, shape, CLASSES, seed=4)
  units = models.width_units(name, shape, CLASSES)
  explicit = models.build_model(
    name, shape, CLASSES, seed=4, widths=models.full_widths(units)
  )
  assert [l.name for l in plain.layers] == [l.name for l in explicit.layers]
  assert [v.name for v in plain.weights] == [v.name for v in explicit.weights]
  for a, b in zip(plain.get_weights(), explicit.get_weights()):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", once_per_structure(SMALL_SHAPES))
def test_narrowed_variables_keep_order_and_shrink(name, zoo):
  full = zoo(name)
  units = models.width_units(name, SMALL_SHAPES[name], CLASSES)
  for widths in _profiles(name, units):
    narrow = zoo(name, widths)
    assert [l.name for l in narrow.layers] == [l.name for l in full.layers]
    for attr in ("trainable_weights", "non_trainable_weights"):
      fv, nv = getattr(full, attr), getattr(narrow, attr)
      assert [v.name for v in fv] == [v.name for v in nv]
      for f, n in zip(fv, nv):
        assert len(f.shape) == len(n.shape)
        assert all(b <= a for a, b in zip(f.shape, n.shape)), (f.name, n.shape)
    # Each unit's layers output exactly the unit's width.
    for unit, width in zip(units, widths):
      for layer_name in unit.layers:
        assert _unit_width(narrow.get_layer(layer_name), unit) == width
    assert narrow.output_shape == (None, CLASSES)


# The transformer's narrowed hidden size changes what its layer norms
# average over and its attention scale (transformer.py): its variables are
# prefix slices (test_narrowed_variables_keep_order_and_shrink,
# transformer_test.py), its function is not the zeroed full model's.
_NOT_A_FUNCTIONAL_PREFIX = ("transformer", "text_transformer")


@pytest.mark.parametrize(
  "name",
  once_per_structure(
    n for n in SMALL_SHAPES if n not in _NOT_A_FUNCTIONAL_PREFIX
  ),
)
def test_narrowed_model_is_the_prefix_of_the_full_model(name, zoo):
  shape = SMALL_SHAPES[name]
  full = zoo(name)
  units = models.width_units(name, shape, CLASSES)
  rng = np.random.default_rng(7)
  drawn = _randomised(full, rng)
  x = rng.normal(size=(8,) + tuple(full.input.shape[1:])).astype(np.float32)
  for widths in _profiles(name, units):
    assert widths != models.full_widths(units)
    narrow = zoo(name, widths)
    _load_prefix(full, narrow, drawn)
    # Inference: batch norm with its (sliced) running statistics.
    _assert_close(
      narrow(x, training=False).numpy(),
      full(x, training=False).numpy(),
      _tolerance(name),
    )
    # Training: batch statistics; dropped channels are exactly 0 in the full
    # model, so its kept channels see the narrowed model's statistics.
    _without_dropout(full)
    _without_dropout(narrow)
    _assert_close(
      narrow(x, training=True).numpy(),
      full(x, training=True).numpy(),
      _tolerance(name),
    )
  full.set_weights(drawn)  # other tests may reuse the module fixture


def test_cifar_resnet_truncation_before_a_wider_stage_is_not_a_prefix(zoo):
  # Documented limitation (resnet.py): stage 1 narrower than the stem
  # truncates the identity shortcut, but the full model carries the stem's
  # channels 10..15 through stage 1's identity path into stage 2, whose 21
  # kept channels include them.
  shape = SMALL_SHAPES["resnet8"]
  full = zoo("resnet8")
  rng = np.random.default_rng(7)
  drawn = _randomised(full, rng)
  x = rng.normal(size=(8,) + shape).astype(np.float32)
  narrow = zoo("resnet8", (16, 10, 21, 42))  # AdaptiveFL's M3
  _load_prefix(full, narrow, drawn)
  gap = np.abs(
    narrow(x, training=False).numpy() - full(x, training=False).numpy()
  ).max()
  assert gap > 1e-2
  full.set_weights(drawn)


@pytest.mark.parametrize(
  "widths, needles",
  [
    ((10, 20), ("'mnist_cnn'", "3 width units", "conv1, conv2, fc1", "got 2")),
    ((10, 20, 50, 1), ("3 width units", "got 4")),
    ((0, 20, 50), ("conv1", "1..10", "got 0")),
    ((10, 21, 50), ("conv2", "1..20", "got 21")),
    ((10, 20, 2.5), ("fc1", "2.5")),
    ((10, 20, True), ("fc1", "True")),
  ],
)
def test_bad_widths_are_one_line_model_errors(widths, needles):
  _one_line_model_error(
    lambda: models.build_model("mnist_cnn", (28, 28, 1), 10, 0, widths),
    *needles,
  )


def test_widths_may_be_numpy_integers_and_lists():
  model = models.build_model("mlp", (8, 8, 1), 10, 0, np.array([7]))
  assert model.get_layer("fc1").kernel.shape == (64, 7)
  model = models.build_model("mnist_2nn", (6, 6, 1), 10, 0, [3, 4])
  assert model.get_layer("fc2").kernel.shape == (3, 4)
  _one_line_model_error(
    lambda: models.build_model("mlp", (8, 8, 1), 10, 0, "7"), "widths"
  )
  _one_line_model_error(
    lambda: models.build_model("mlp", (8, 8, 1), 10, 0, 7), "widths"
  )


def test_width_units_checks_its_arguments():
  _one_line_model_error(
    lambda: models.width_units("nope", (8, 8, 1), 10), "'nope'", "accepted:"
  )
  _one_line_model_error(
    lambda: models.width_units("vgg16", (16, 16, 3), 10),
    "'vgg16'",
    "at least 32x32",
  )
  _one_line_model_error(
    lambda: models.width_units("vgg16", (8, 8, 1), 10), "at least 16x16"
  )
  _one_line_model_error(
    lambda: models.width_units("resnet20", (32, 32), 10),
    "(height, width, channels)",
  )
  _one_line_model_error(
    lambda: models.width_units("mlp", (8, 8, 1), 1), "num_classes"
  )


def test_narrowed_flatten_dense_reads_h_w_c_prime_features():
  model = models.build_model(
    "cifar_cnn", (32, 32, 3), 10, 0, widths=(64, 21, 384, 192)
  )
  # pool2 leaves 8x8x21 -> fc1 reads 8*8*21 = 1,344 features
  assert model.get_layer("fc1").kernel.shape == (1_344, 384)
  assert models.count_params(model).trainable == (
    5 * 5 * 3 * 64
    + 64
    + 5 * 5 * 64 * 21
    + 21
    + 1_344 * 384
    + 384
    + 384 * 192
    + 192
    + 192 * 10
    + 10
  )


def test_dropout_layers_are_seeded_and_differ_between_layers():
  model = models.build_model("vgg16_eighth", (28, 28, 1), 10, 3)
  seeds = [model.get_layer(n).seed for n in ("drop1", "drop2")]
  assert all(isinstance(s, int) for s in seeds) and seeds[0] != seeds[1]
  again = models.build_model("vgg16_eighth", (28, 28, 1), 10, 3)
  assert [again.get_layer(n).seed for n in ("drop1", "drop2")] == seeds
