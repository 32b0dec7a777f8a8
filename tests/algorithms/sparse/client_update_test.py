"""Masked local training and packed memory rows, by hand.

`MaskedTraining` keeps off-mask kernel values at zero itself (masked
gradients and masked new values), so the tfmot wrappers need not assign
kernel * mask before each forward pass: a weight pruned in the middle of
local training, whose momentum still pushes it, stays exactly zero. The
rows of a round without readjustment travel packed (the values at the sent
model's masks) and unpack to the dense rows.
"""

from conftest import sparse_toy_model
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms.sparse import client_update
from tff_hetero.algorithms.sparse import computations
from tff_hetero.submodels import masks as masks_lib
from tff_hetero.submodels.masks import SparseModel


def _two_logit_model():
  """One Dense 2 -> 2 kernel of ones, no bias."""
  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        2, use_bias=False, kernel_initializer="ones", input_shape=(2,)
      )
    ]
  )


def _softmax(z):
  e = np.exp(z - np.max(z))
  return e / e.sum()


def test_a_weight_pruned_mid_training_stays_zero_under_momentum():
  keras_model = masks_lib.prune_wrap(_two_logit_model())
  masks_lib.apply_masks_in_call(keras_model, False)
  layout = masks_lib.MaskLayout.of(keras_model)
  model = tff.learning.models.from_keras_model(
    keras_model,
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    input_spec=(
      tf.TensorSpec([None, 2], tf.float32),
      tf.TensorSpec([None], tf.int32),
    ),
  )
  trainer = client_update.MaskedTraining(model, layout, prox_mu=0.0)
  optimizer = tff.learning.optimizers.build_sgdm(
    learning_rate=0.1, momentum=0.9
  )
  batch = (tf.constant([[1.0, 1.0]]), tf.constant([0]))
  start = SparseModel(
    trainable=[np.ones((2, 2), np.float32)],
    masks=[np.ones((2, 2), np.float32)],
    statistics=[],
  )
  prune = np.array([[0.0, 1.0], [1.0, 1.0]], np.float32)

  @tf.function
  def two_steps():
    received = trainer.load(start)
    state = trainer.initial_state(optimizer)
    state, _, _ = trainer.step(optimizer, state, batch, received)
    # What a readjustment does between steps: the mask drops (0, 0) and
    # the weight is zeroed; its velocity stays in the optimizer state.
    kernel = trainer.weights.trainable[0]
    trainer.mask_vars[0].assign(prune)
    kernel.assign(kernel * prune)
    trainer.step(optimizer, state, batch, received)
    return tf.identity(kernel)

  kernel = two_steps().numpy()
  # By hand: x = (1, 1), label 0, loss = cross-entropy of softmax(x K).
  x, onehot = np.ones(2), np.array([1.0, 0.0])
  k1 = np.ones((2, 2))
  g1 = np.outer(x, _softmax(x @ k1) - onehot)  # [[-.5, .5], [-.5, .5]]
  k1 = k1 - 0.1 * g1  # Momentum's first velocity is the gradient.
  k1 = k1 * prune
  g2 = np.outer(x, _softmax(x @ k1) - onehot) * prune
  velocity = 0.9 * g1 + g2
  expected = (k1 - 0.1 * velocity) * prune
  # Without masking the new values, (0, 0) would be 0.1 * 0.9 * 0.5 = 0.045.
  assert kernel[0, 0] == 0.0
  np.testing.assert_allclose(kernel, expected, rtol=1e-6, atol=1e-7)


def test_packed_rows_unpack_to_the_dense_rows():
  layout = masks_lib.MaskLayout.of(masks_lib.prune_wrap(sparse_toy_model()))
  shapes = [(4, 8), (8,), (8, 2), (2,)]
  rng = np.random.default_rng(0)
  kernel_masks = [
    (rng.random((4, 8)) < 0.4).astype(np.float32),
    (rng.random((8, 2)) < 0.6).astype(np.float32),
  ]
  full = [kernel_masks[0], np.ones(8), kernel_masks[1], np.ones(2)]
  rows = [
    [(rng.normal(size=s) * m).astype(np.float32) for s, m in zip(shapes, full)]
    for _ in range(3)
  ]
  packed = np.stack(
    [
      computations.packed_values(layout, row, kernel_masks).numpy()
      for row in rows
    ]
  )
  # By hand: each tensor's kept elements in row-major order, concatenated.
  for row, flat in zip(rows, packed):
    expected = np.concatenate([v[m > 0] for v, m in zip(row, full)])
    np.testing.assert_array_equal(flat, expected)
  assert packed.shape == (3, int(sum(m.sum() for m in full)))
  sent = SparseModel(
    trainable=[np.zeros(s, np.float32) for s in shapes],
    masks=kernel_masks,
    statistics=[],
  )
  weight = np.array([5.0, 0.0, 7.0], np.float32)
  unpacked = computations.unpacked_rows(
    layout, sent, computations.PackedRow(values=packed, weight=weight)
  )
  for i in range(4):
    np.testing.assert_array_equal(
      unpacked.values[i], np.stack([row[i] for row in rows])
    )
  for j in range(2):
    assert unpacked.masks[j].dtype == np.uint8
    np.testing.assert_array_equal(
      unpacked.masks[j], np.stack([kernel_masks[j]] * 3)
    )
  np.testing.assert_array_equal(unpacked.weight, weight)
