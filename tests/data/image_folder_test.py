"""CINIC-10's release layout (`<split>/<class>/*.png`), read by the real
loader from PNG files the test writes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tff_hetero.data import DataError
from tff_hetero.data import load_dataset

_CLASSES = ("airplane", "automobile", "bird")  # Sorted: labels 0, 1, 2.


def _write_png(path, image):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(tf.io.encode_png(image).numpy())


def _layout(root, per_class=(3, 2), grey_file=None, odd_size_file=None):
  """Writes train/ and test/; pixel value 10*label + index in the split."""
  for split, count in zip(("train", "test"), per_class):
    for label, name in enumerate(_CLASSES):
      for i in range(count):
        value = 10 * label + i
        path = root / "cinic10" / split / name / f"img_{i}.png"
        if path.name == grey_file and split == "train" and label == 0:
          _write_png(path, np.full((32, 32, 1), value, np.uint8))
        elif path.name == odd_size_file and split == "test":
          _write_png(path, np.full((30, 32, 3), value, np.uint8))
        else:
          _write_png(path, np.full((32, 32, 3), value, np.uint8))
  (root / "cinic10" / "valid").mkdir()  # Present in the release, unused.


def test_reads_the_release_layout_in_sorted_order(tmp_path):
  _layout(tmp_path, grey_file="img_1.png")
  splits = load_dataset("cinic10", data_dir=str(tmp_path), seed=3)
  assert (splits.num_classes, splits.input_shape) == (3, (32, 32, 3))
  assert (len(splits.train), len(splits.test)) == (9, 6)
  np.testing.assert_array_equal(splits.train.y, [0, 0, 0, 1, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(splits.test.y, [0, 0, 1, 1, 2, 2])
  # Every pixel of image i of class c is 10c + i, scaled to [0, 1]; the grey
  # image comes back as RGB with the same value in each channel.
  expected = np.array([0, 1, 2, 10, 11, 12, 20, 21, 22], np.float32) / 255
  np.testing.assert_allclose(splits.train.x.reshape(9, -1).min(1), expected)
  np.testing.assert_allclose(splits.train.x.reshape(9, -1).max(1), expected)
  assert splits.train.x.dtype == np.float32


def test_missing_data_dir_or_layout_is_one_line(tmp_path):
  with pytest.raises(DataError, match=r"needs --data_dir") as e:
    load_dataset("cinic10", data_dir=None)
  assert "\n" not in str(e.value)
  with pytest.raises(DataError, match=r"no train/ directory") as e:
    load_dataset("cinic10", data_dir=str(tmp_path))
  assert str(tmp_path / "cinic10") in str(e.value)


def test_mismatched_classes_and_bad_images_are_one_line(tmp_path):
  _layout(tmp_path, odd_size_file="img_1.png")
  with pytest.raises(DataError, match=r"img_1.png is not 32x32") as e:
    load_dataset("cinic10", data_dir=str(tmp_path))
  assert "\n" not in str(e.value)

  (tmp_path / "cinic10" / "test" / "bird" / "img_1.png").unlink()
  for png in (tmp_path / "cinic10" / "test").glob("*/img_1.png"):
    png.unlink()
  (tmp_path / "cinic10" / "test" / "zebra").mkdir()
  with pytest.raises(DataError, match=r"they must be the same") as e:
    load_dataset("cinic10", data_dir=str(tmp_path))
  assert "\n" not in str(e.value)
