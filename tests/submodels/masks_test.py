"""Element masks: RigL's ERK densities by hand and on real models, tfmot
wrappers as mask holders, top-k selection."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tff_hetero import models
from tff_hetero.submodels import masks


def test_erk_by_hand():
  # Raw densities (sum / prod of dims): 4/4 = 1 and 20/100 = 0.2. At 50%:
  # eps = 52 / 24 makes the first layer's density > 1, so it goes dense and
  # eps is re-solved on the second alone: (100 - 4) * 0.5 / 20 = 2.4.
  densities = masks.erk_densities([(2, 2), (10, 10)], 0.5)
  assert densities == pytest.approx([1.0, 0.48])
  assert masks.keep_counts([(2, 2), (10, 10)], densities) == [4, 48]


@pytest.mark.parametrize(
  "name, shape",
  [
    ("mnist_cnn", (28, 28, 1)),
    ("cifar_cnn", (32, 32, 3)),
    ("resnet20", (32, 32, 3)),
  ],
)
@pytest.mark.parametrize("sparsity", [0.5, 0.8, 0.95])
def test_whole_model_meets_the_target(name, shape, sparsity):
  wrapped = masks.prune_wrap(models.build_model(name, shape, 10, seed=0))
  layout = masks.MaskLayout.of(wrapped)
  shapes = layout.shapes
  densities = masks.erk_densities(shapes, sparsity)
  counts = masks.keep_counts(shapes, densities)
  total = sum(math.prod(s) for s in shapes)
  # Rounding each layer's count moves the total by at most half a weight each.
  assert abs(sum(counts) - (1 - sparsity) * total) <= len(shapes) / 2 + 1
  assert all(0 < d <= 1 for d in densities)
  # Non-dense layers follow (sum of dims) / (product of dims).
  sparse = [i for i, d in enumerate(densities) if d < 1]
  raw = [sum(s) / math.prod(s) for s in shapes]
  for i in sparse:
    assert densities[i] / raw[i] == pytest.approx(
      densities[sparse[0]] / raw[sparse[0]]
    )
  # Dense layers are the ones with the largest raw density.
  for i, d in enumerate(densities):
    if d == 1.0 and sparse:
      assert raw[i] >= max(raw[j] for j in sparse)


def test_mnist_cnn_layout_and_densities():
  wrapped = masks.prune_wrap(
    models.build_model("mnist_cnn", (28, 28, 1), 10, seed=0)
  )
  layout = masks.MaskLayout.of(wrapped)
  assert [k.name for k in layout.kernels] == [
    "conv1/kernel:0",
    "conv2/kernel:0",
    "fc1/kernel:0",
    "logits/kernel:0",
  ]
  assert [k.trainable_index for k in layout.kernels] == [0, 2, 4, 6]
  # Only the four kernel layers are wrapped: four masks, four step counters.
  assert layout.kinds.count("mask") == 4 and layout.kinds.count("step") == 4
  counts = masks.keep_counts(
    layout.shapes, masks.erk_densities(layout.shapes, 0.8)
  )
  assert counts == [188, 357, 3305, 500]  # 4,350 of 21,750 kernel weights.


def test_sparse_model_round_trip():
  wrapped = masks.prune_wrap(
    models.build_model("small_cnn", (8, 8, 1), 10, seed=0)
  )
  layout = masks.MaskLayout.of(wrapped)
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  weights = tf.nest.map_structure(
    lambda v: v.numpy(), tff.learning.models.ModelWeights.from_model(wrapped)
  )
  chosen = masks.random_masks(layout.shapes, [5] * len(layout.kernels), 1)
  masked = layout.with_masks(weights, chosen)
  sparse = layout.to_sparse(masked)
  assert [int(np.sum(m)) for m in sparse.masks] == [5] * len(layout.kernels)
  back = layout.to_model_weights(sparse)
  for k, mask in zip(layout.kernels, chosen):
    kernel = np.asarray(back.trainable[k.trainable_index])
    assert np.all(kernel[mask == 0] == 0)
    np.testing.assert_array_equal(back.non_trainable[k.mask_index], mask)
  for i in layout.step_indices:
    assert int(back.non_trainable[i]) == 0  # Ready for a training call.


def test_random_masks_are_exact_and_seeded():
  a = masks.random_masks([(4, 5), (3,)], [7, 2], seed=3)
  b = masks.random_masks([(4, 5), (3,)], [7, 2], seed=3)
  c = masks.random_masks([(4, 5), (3,)], [7, 2], seed=4)
  assert [int(m.sum()) for m in a] == [7, 2]
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not np.array_equal(a[0], c[0])


def test_top_k_mask_respects_candidates_and_ties():
  scores = tf.constant([5.0, 1.0, 5.0, 3.0, 9.0])
  candidates = tf.constant([True, True, True, True, False])
  np.testing.assert_array_equal(
    masks.top_k_mask(scores, 2, candidates), [1, 0, 1, 0, 0]
  )
  np.testing.assert_array_equal(
    masks.top_k_mask(scores, 1, candidates), [1, 0, 0, 0, 0]
  )  # Lower index.
  np.testing.assert_array_equal(  # More asked than there are candidates.
    masks.top_k_mask(scores, 9, [False, True, False, False, False]),
    [0, 1, 0, 0, 0],
  )
  np.testing.assert_array_equal(
    masks.top_k_mask(scores, 0, candidates), [0, 0, 0, 0, 0]
  )


def test_apply_masks_in_call_switches_the_wrappers_own_masking():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  wrapped = masks.prune_wrap(
    tf.keras.Sequential(
      [
        tf.keras.layers.Dense(
          2, use_bias=False, kernel_initializer="ones", input_shape=(2,)
        )
      ]
    )
  )
  (kernel_at,) = masks.MaskLayout.of(wrapped).kernels
  weights = tff.learning.models.ModelWeights.from_model(wrapped)
  kernel = weights.trainable[kernel_at.trainable_index]
  weights.non_trainable[kernel_at.mask_index].assign([[0.0, 1.0], [1.0, 1.0]])
  x = tf.constant([[1.0, 2.0]])
  masks.apply_masks_in_call(wrapped, False)
  # The kernel as it is: x @ ones.
  np.testing.assert_array_equal(wrapped(x, training=True), [[3.0, 3.0]])
  np.testing.assert_array_equal(kernel, np.ones((2, 2)))
  masks.apply_masks_in_call(wrapped, True)
  # tfmot's kernel := kernel * mask first: x @ [[0, 1], [1, 1]].
  np.testing.assert_array_equal(wrapped(x, training=True), [[2.0, 3.0]])
  np.testing.assert_array_equal(kernel, [[0.0, 1.0], [1.0, 1.0]])
