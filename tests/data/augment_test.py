"""Seeded crop / flip of training batches (`tff_hetero.data.augment`) and
their use in the client datasets."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tff_hetero.data import AUGMENTATIONS
from tff_hetero.data import ArrayDataset
from tff_hetero.data import DataError
from tff_hetero.data import augment
from tff_hetero.data import make_client_dataset
from tff_hetero.data import make_indexed_client_dataset

_PAD = augment.CROP_PADDING


def _images(n=6, size=8):
  rng = np.random.default_rng(0)
  return rng.uniform(0.1, 1.0, size=(n, size, size, 2)).astype(np.float32)


def _windows(image):
  """Every crop (dy, dx) of the padded image, unflipped and flipped."""
  h, w, _ = image.shape
  padded = np.pad(image, [(_PAD, _PAD), (_PAD, _PAD), (0, 0)])
  out = {}
  for dy in range(2 * _PAD + 1):
    for dx in range(2 * _PAD + 1):
      window = padded[dy : dy + h, dx : dx + w]
      out[(dy, dx, False)] = window
      out[(dy, dx, True)] = window[:, ::-1]
  return out


def _which(image, augmented):
  return [k for k, v in _windows(image).items() if np.array_equal(v, augmented)]


def test_each_image_is_one_window_of_its_padded_self():
  images = _images(n=64)
  seed = tf.constant([7, 3], tf.int64)
  cropped = augment.crop(tf.constant(images), seed).numpy()
  both = augment.crop_flip(tf.constant(images), seed).numpy()
  offsets, flips = set(), []
  for image, c, b in zip(images, cropped, both):
    (crop_key,) = [k for k in _which(image, c) if not k[2]]
    (both_key,) = _which(image, b)
    offsets.add(crop_key[:2])
    flips.append(both_key[2])
  # Offsets and flips are per image, not per batch.
  assert len(offsets) > 10
  assert 10 < sum(flips) < 54
  # The same seed gives the same batch; another seed another one.
  np.testing.assert_array_equal(
    augment.crop_flip(tf.constant(images), seed).numpy(), both
  )
  assert not np.array_equal(
    augment.crop_flip(tf.constant(images), seed + 1).numpy(), both
  )


def test_client_batches_are_augmented_per_round_seed_and_labels_kept():
  arrays = ArrayDataset(x=_images(n=10), y=np.arange(10, dtype=np.int32))
  kwargs = dict(batch_size=4, local_epochs=2, shuffle_seed=5)
  plain = list(make_client_dataset(arrays, **kwargs))
  once = list(make_client_dataset(arrays, augment="crop_flip", **kwargs))
  again = list(make_client_dataset(arrays, augment="crop_flip", **kwargs))
  assert len(plain) == len(once) == 5
  for p, a, b in zip(plain, once, again):
    np.testing.assert_array_equal(p["y"], a["y"])
    np.testing.assert_array_equal(a["x"], b["x"])
    for image, augmented in zip(p["x"].numpy(), a["x"].numpy()):
      assert _which(image, augmented)
  assert not all(np.array_equal(p["x"], a["x"]) for p, a in zip(plain, once))


def test_each_batch_draws_its_own_crops():
  # One batch per epoch, so both batches hold the same four samples.
  arrays = ArrayDataset(x=_images(n=4), y=np.arange(4, dtype=np.int32))
  first, second = [
    b["x"].numpy()[np.argsort(b["y"].numpy())]
    for b in make_client_dataset(
      arrays, batch_size=4, local_epochs=2, shuffle_seed=5, augment="crop_flip"
    )
  ]
  assert not np.array_equal(first, second)


def test_indexed_dataset_augments_training_batches_only():
  arrays = ArrayDataset(x=_images(n=6), y=np.arange(6, dtype=np.int32))
  batches = list(
    make_indexed_client_dataset(
      arrays, batch_size=3, local_epochs=1, shuffle_seed=1, augment="crop"
    )
  )
  train = [b for b in batches if b["train"]]
  sent = [b for b in batches if not b["train"]]
  assert len(train) == len(sent) == 2
  x = np.concatenate([b["x"] for b in sent])
  np.testing.assert_array_equal(x, arrays.x)  # What is sent: as it is.
  for batch in train:
    for i, image in zip(batch["index"].numpy(), batch["x"].numpy()):
      assert _which(arrays.x[i], image)


def test_unknown_augmentation_or_no_seed_is_a_one_line_error():
  arrays = ArrayDataset(x=_images(n=4), y=np.zeros(4, np.int32))
  assert set(AUGMENTATIONS) == {"none", "crop", "crop_flip"}
  with pytest.raises(
    DataError,
    match=r"unknown --augment 'mixup'; accepted:"
    r" crop, crop_flip, none",
  ):
    make_client_dataset(
      arrays, batch_size=2, local_epochs=1, shuffle_seed=0, augment="mixup"
    )
  with pytest.raises(DataError, match=r"--augment=crop needs a shuffle"):
    make_client_dataset(
      arrays, batch_size=2, local_epochs=1, shuffle_seed=None, augment="crop"
    )
