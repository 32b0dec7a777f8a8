"""Sub-model maps for every model of the zoo: round trips, coverage, views.

For each registered model, the full model F, AdaptiveFL's M and S members of
its default pool (the smallest start index, so that most units narrow) and
random weights:

* `extract` gives exactly the narrowed model's variable shapes;
* `scatter(extract(w)) == w * coverage` and `extract(scatter(s)) == s`;
* coverage counts the narrowed model's parameters;
* maps compose: full -> M -> S equals full -> S;
* the narrowed model computes what the full model computes with every
  weight outside the coverage set to zero (checked on the models whose
  slicing differs: a flatten view, residual stages, batch norm), at
  HeteroFL's uniform width. (At an AdaptiveFL width where a CIFAR ResNet
  stage is narrower than the one before it, the parameter-free shortcut
  drops input channels that the zeroed full model would carry on: the
  weights still map by prefix, the functions differ; see `resnet.py`.)
"""

from conftest import DEEPER_TWINS
from conftest import fast_tier_params
import numpy as np
import pytest
import tensorflow as tf

from tff_hetero import models
from tff_hetero.models import width as width_lib
from tff_hetero.submodels import pools
from tff_hetero.submodels.maps import SliceSpec
from tff_hetero.submodels.maps import SubModelMap

_SHAPES = {
  "mlp": (8, 8, 1),
  "small_cnn": (8, 8, 1),
  "mnist_2nn": (28, 28, 1),
  "mnist_cnn": (28, 28, 1),
  "mnist_cnn_feddst": (28, 28, 1),
  "cifar_cnn": (32, 32, 3),
  "resnet8": (8, 8, 3),
  "resnet20": (8, 8, 3),
  "resnet32": (8, 8, 3),
  "resnet56": (8, 8, 3),
  "resnet18": (8, 8, 3),
  "vgg11": (28, 28, 1),
  "vgg16": (28, 28, 1),
  "vgg16_eighth": (28, 28, 1),
  "fedgkt_edge_resnet4": (8, 8, 3),
  "fedgkt_edge_resnet6": (8, 8, 3),
  "fedgkt_edge_resnet8": (8, 8, 3),
  "fedgkt_server_resnet7": (8, 8, 3),
  "fedgkt_server_resnet19": (8, 8, 3),
  "fedgkt_server_resnet55": (8, 8, 3),
  "fedgkt_edge_resnet8_bottleneck": (8, 8, 3),
  "transformer": (8, 8, 1),
  "text_transformer": (8,),
  "depth_cnn": (8, 8, 1),
  "fedgkt_server_resnet55_bottleneck": (8, 8, 3),
  "resnet56_bottleneck": (8, 8, 3),
}
_CHECK_FUNCTION = (
  "mnist_cnn",
  "resnet8",
  "resnet18",
  "vgg16_eighth",
  "cifar_cnn",
)


def test_every_model_is_covered():
  assert sorted([*_SHAPES, *DEEPER_TWINS]) == sorted(models.model_names())


def _build(name, widths=None):
  return models.build_model(name, _SHAPES[name], 10, seed=0, widths=widths)


def _levels(name):
  units = models.width_units(name, _SHAPES[name], 10)
  starts = models.MODELS[name].default_start_indices
  if not starts:  # One width unit (mlp): narrow it, as HeteroFL would.
    return (
      models.widths_for(units, 0.66, 0, "floor"),
      models.widths_for(units, 0.4, 0, "floor"),
    )
  pool = pools.adaptivefl_pool(units, 0.66, 0.4, (starts[-1],))
  return pool.member("M1").widths, pool.member("S1").widths


def _random_weights(model, seed, scale=1.0):
  rng = np.random.default_rng(seed)
  return [
    scale * rng.normal(size=v.shape).astype(np.float32)
    for v in model.trainable_weights
  ]


@pytest.mark.parametrize("name", fast_tier_params(sorted(_SHAPES)))
def test_round_trip_coverage_and_composition(name):
  medium_widths, small_widths = _levels(name)
  full, medium, small = (
    _build(name),
    _build(name, medium_widths),
    _build(name, small_widths),
  )
  to_small = SubModelMap.between(full, small)
  weights = _random_weights(full, 0)

  extracted = to_small.extract(weights)
  assert [tuple(e.shape) for e in extracted] == [
    tuple(v.shape) for v in small.trainable_weights
  ]
  coverage = to_small.coverage()
  for back, w, mask in zip(to_small.scatter(extracted), weights, coverage):
    np.testing.assert_array_equal(back, w * mask)
  small_values = _random_weights(small, 1)
  for again, s in zip(
    to_small.extract(to_small.scatter(small_values)), small_values
  ):
    np.testing.assert_array_equal(again, s)
  # The driver's NumPy forms agree with the TensorFlow ones.
  for a, b in zip(to_small.extract_arrays(weights), extracted):
    np.testing.assert_array_equal(a, b)
  targets = [w.copy() for w in weights]
  to_small.add_scattered(targets, small_values)
  for t, w, back in zip(
    targets, weights, to_small.scatter(small_values), strict=True
  ):
    np.testing.assert_array_equal(t, w + np.asarray(back))
  counts = [np.zeros_like(w) for w in weights]
  to_small.add_scattered(counts, [2.0] * len(counts))
  for c, mask in zip(counts, coverage, strict=True):
    np.testing.assert_array_equal(c, 2.0 * mask)
  small_params = models.count_params(small).trainable
  assert sum(m.sum() for m in coverage) == small_params
  assert to_small.num_elements() == small_params
  assert to_small.num_elements(trainable_only=False) == (
    models.count_params(small).total
  )

  if width_lib.contains(medium_widths, small_widths):
    composed = SubModelMap.between(medium, small).extract(
      SubModelMap.between(full, medium).extract(weights)
    )
    for a, b in zip(composed, extracted):
      np.testing.assert_array_equal(a, b)


def test_numpy_forms_on_a_flatten_view_by_hand():
  # A dense kernel reading a flattened (2, 2, 3) map, 4 units, narrowed to
  # 1 channel and 2 units: its rows are outer rows 0, 3, 6, 9 (h, w, c=0).
  spec = SliceSpec("k", (12, 4), (4, 2), (2, 2, 3, 4), (2, 2, 1, 2))
  kernel_map = SubModelMap((spec,), ())
  outer = np.arange(48, dtype=np.float32).reshape(12, 4)
  (inner,) = kernel_map.extract_arrays([outer])
  np.testing.assert_array_equal(inner, [[0, 1], [12, 13], [24, 25], [36, 37]])
  target = np.zeros((12, 4), np.float32)
  kernel_map.add_scattered([target], [np.ones((4, 2), np.float32)])
  kernel_map.add_scattered([target], [np.float32(0.5)])
  expected = np.zeros((12, 4), np.float32)
  expected[[0, 3, 6, 9], :2] = 1.5
  np.testing.assert_array_equal(target, expected)
  # A 0-d variable (a Keras `add_weight(shape=())`) is added in place too.
  scalar_map = SubModelMap((SliceSpec("s", (), (), (), ()),), ())
  target = np.zeros((), np.float32)
  scalar_map.add_scattered([target], [np.float32(3.0)])
  assert target == 3.0
  assert scalar_map.extract_arrays([target])[0] == 3.0


@pytest.mark.parametrize("name", fast_tier_params(_CHECK_FUNCTION))
def test_narrowed_model_equals_zeroed_full_model(name):
  small_widths = width_lib.widths_for(
    models.width_units(name, _SHAPES[name], 10), 0.5, 0, "ceil"
  )
  full, small = _build(name), _build(name, small_widths)
  to_small = SubModelMap.between(full, small)
  weights = tf.nest.map_structure(
    lambda v: v.numpy(),
    [list(full.trainable_weights), list(full.non_trainable_weights)],
  )
  rng = np.random.default_rng(2)
  # Positive running variances; random everything else.
  non_trainable = [
    np.abs(rng.normal(size=w.shape)).astype(np.float32) + 0.5
    for w in weights[1]
  ]
  trainable = _random_weights(full, 3, scale=0.2)  # Keeps logits O(1).
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  full_weights = tff.learning.models.ModelWeights(trainable, non_trainable)
  small_weights = to_small.extract(full_weights)
  zeroed = to_small.scatter(small_weights)
  # Running statistics outside the coverage: anything positive will do.
  zeroed = tff.learning.models.ModelWeights(
    trainable=list(zeroed.trainable),
    non_trainable=[
      np.where(m > 0, z, 1.0)
      for z, m in zip(
        zeroed.non_trainable, to_small.coverage(False).non_trainable
      )
    ],
  )
  zeroed.assign_weights_to(full)
  small_weights.assign_weights_to(small)
  x = rng.normal(size=(4, *_SHAPES[name])).astype(np.float32)
  has_dropout = any(
    isinstance(layer, tf.keras.layers.Dropout) for layer in full.layers
  )
  # Training mode: batch statistics; dropout masks would differ in shape.
  for training in (False,) if has_dropout else (False, True):
    np.testing.assert_allclose(
      small(x, training=training),
      full(x, training=training),
      atol=2e-4,
      rtol=1e-4,
    )


def test_not_a_sub_model_is_refused():
  medium_widths, small_widths = _levels("mnist_cnn")
  with pytest.raises(models.ModelError, match="not a prefix slice"):
    SubModelMap.between(_build("mnist_cnn", small_widths), _build("mnist_cnn"))
  with pytest.raises(models.ModelError, match="same factory"):
    SubModelMap.between(_build("mnist_cnn"), _build("mlp"))
  del medium_widths
