"""Tests reading real TFDS on-disk data through `load_dataset`.

The fixtures prepare tiny stand-ins for TFDS ``mnist`` and ``emnist/balanced``
with genuine `tfds.core.GeneratorBasedBuilder` subclasses (same names,
versions, configs and features as the real builders), written in TFDS's file
format into a temporary directory. Our loader then reads those files exactly
as it would read data prepared by ``tfds build``: nothing is mocked.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")
from tensorflow_datasets.core.utils import gcs_utils  # noqa: E402

from tff_hetero.data import DataError  # noqa: E402
from tff_hetero.data import load_dataset  # noqa: E402

_TRAIN_PER_CLASS = 3
_TEST_PER_CLASS = 1


def _pixel_value(label: int) -> int:
  """Each stand-in image's bright pixels encode its label."""
  return 5 * (label + 1)


class _FakeMnist(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """TFDS ``mnist`` 3.0.1 look-alike: image (28, 28, 1) uint8, 10 classes."""

  name = "mnist"
  VERSION = tfds.core.Version("3.0.1")
  NUM_CLASSES = 10

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      features=tfds.features.FeaturesDict(
        {
          "image": tfds.features.Image(shape=(28, 28, 1)),
          "label": tfds.features.ClassLabel(num_classes=self.NUM_CLASSES),
        }
      ),
      supervised_keys=("image", "label"),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {
      "train": self._generate_examples(_TRAIN_PER_CLASS),
      "test": self._generate_examples(_TEST_PER_CLASS),
    }

  def _generate_examples(self, per_class: int):
    for label in range(self.NUM_CLASSES):
      for copy in range(per_class):
        # Only the top row is lit, so a transposition is detectable.
        image = np.zeros((28, 28, 1), np.uint8)
        image[0, :, 0] = _pixel_value(label)
        yield f"{label}-{copy}", {"image": image, "label": label}


class _FakeEmnist(_FakeMnist, skip_registration=True):
  """TFDS ``emnist/balanced`` 3.0.0 look-alike: 47 classes."""

  name = "emnist"
  VERSION = tfds.core.Version("3.0.0")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="balanced")]
  NUM_CLASSES = 47


def _prepare(builder_cls: type, data_dir: pathlib.Path, **kwargs) -> str:
  """Writes `builder_cls`'s data under `data_dir`; returns its version dir."""
  # Without data on disk, TFDS builders probe Google Cloud Storage for
  # metadata when constructed; that only costs time offline, so skip it.
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(gcs_utils, "_is_gcs_disabled", True)
    builder = builder_cls(data_dir=os.fspath(data_dir), **kwargs)
    builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(
        compute_stats=tfds.download.ComputeStatsMode.SKIP
      )
    )
  return builder.data_dir


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("tfds")
  mnist_dir = _prepare(_FakeMnist, root)
  emnist_dir = _prepare(_FakeEmnist, root, config="balanced")
  assert mnist_dir == os.fspath(root / "mnist" / "3.0.1")
  assert emnist_dir == os.fspath(root / "emnist" / "balanced" / "3.0.0")
  # Leftovers that are not prepared versions must be ignored.
  (root / "mnist" / "9.9.9.incompleteABC123").mkdir()
  (root / "mnist" / "4.0.0").mkdir()  # No dataset_info.json.
  return root


def test_mnist_from_prepared_tfds_files(prepared_dir):
  splits = load_dataset("mnist", data_dir=os.fspath(prepared_dir))
  assert splits.name == "mnist"
  assert (len(splits.train), len(splits.test)) == (30, 10)
  assert splits.num_classes == 10
  assert splits.input_shape == (28, 28, 1)
  assert splits.train.x.dtype == np.float32 and splits.train.y.dtype == np.int32
  np.testing.assert_array_equal(np.bincount(splits.train.y), [3] * 10)
  np.testing.assert_array_equal(np.bincount(splits.test.y), [1] * 10)
  for split in (splits.train, splits.test):
    expected = np.array([_pixel_value(y) for y in split.y], np.float32) / 255
    np.testing.assert_allclose(split.x[:, 0, 5, 0], expected, rtol=1e-6)
    assert not split.x[:, 1:].any()  # Upright, as stored.


def test_emnist_reads_balanced_config_and_transposes(prepared_dir):
  splits = load_dataset("emnist", data_dir=os.fspath(prepared_dir))
  assert (len(splits.train), len(splits.test)) == (47 * 3, 47)
  assert splits.num_classes == 47
  assert splits.input_shape == (28, 28, 1)
  expected = np.array([_pixel_value(y) for y in splits.train.y]) / 255
  # The stored top row becomes the left column.
  np.testing.assert_allclose(splits.train.x[:, 5, 0, 0], expected, rtol=1e-6)
  assert not splits.train.x[:, :, 1:].any()


def test_absent_tfds_data_is_a_one_line_error(tmp_path):
  missing = tmp_path / "nothing_here"
  with pytest.raises(DataError) as error:
    load_dataset("cifar10", data_dir=os.fspath(missing))
  message = str(error.value)
  assert "\n" not in message
  assert "'cifar10'" in message
  assert os.fspath(missing / "cifar10") in message
  assert "tfds build cifar10 --data_dir=DIR" in message
  assert "--data_dir=DIR" in message


def test_default_data_dir_follows_tfds_data_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", os.fspath(tmp_path))
  with pytest.raises(DataError) as error:
    load_dataset("cifar100")
  assert os.fspath(tmp_path / "cifar100") in str(error.value)
  assert "\n" not in str(error.value)


def test_emnist_error_names_the_config_directory(tmp_path):
  with pytest.raises(DataError) as error:
    load_dataset("emnist", data_dir=os.fspath(tmp_path))
  assert os.fspath(tmp_path / "emnist" / "balanced") in str(error.value)
  assert "tfds build emnist/balanced" in str(error.value)


def test_corrupt_tfds_files_are_a_one_line_error(prepared_dir, tmp_path):
  copy = tmp_path / "mnist" / "3.0.1"
  shutil.copytree(prepared_dir / "mnist" / "3.0.1", copy)
  (train_file,) = copy.glob("mnist-train.tfrecord*")
  train_file.write_bytes(train_file.read_bytes()[:100])
  with pytest.raises(DataError) as error:
    load_dataset("mnist", data_dir=os.fspath(tmp_path))
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"could not read data set 'mnist' from {copy}: ")
