"""The GLUE text tasks of InclusiveFL (Liu et al., KDD 2022) as token arrays.

`load_glue(task, data_dir)` reads one GLUE task prepared by TensorFlow
Datasets under `data_dir` (TFDS ``glue/<task>``), tokenises it with a
vocabulary fitted on its train split, and returns a `GlueSplits`: train and
test `TextArrayDataset`s (token ids int32 [n, seq_len]; labels int32 class
ids, float32 similarity scores for STS-B), the number of classes (1 for the
STS-B regression), the task's metric name, the vocabulary and `seq_len`.

Tasks (`GLUE_TASKS`; the paper's Table 2). "Text" names the TFDS features
that make up an example's text, in order; "test split" is the TFDS split
returned as `GlueSplits.test` (GLUE's own test labels are hidden: TFDS
stores them as -1), and the metric is the one the paper reports
(`tff_hetero.data.text_metrics.GLUE_METRICS`):

=====  ======================  =======  ==================  ===============
task   text                    classes  test split          metric
=====  ======================  =======  ==================  ===============
cola   sentence                2        validation          Matthews corr.
mnli   premise, hypothesis     3        validation_matched  matched acc.
mrpc   sentence1, sentence2    2        validation          F1 of class 1
qnli   question, sentence      2        validation          accuracy
qqp    question1, question2    2        validation          accuracy
rte    sentence1, sentence2    2        validation          accuracy
sst2   sentence                2        validation          accuracy
stsb   sentence1, sentence2    1        validation          Pearson r
=====  ======================  =======  ==================  ===============

Labels are TFDS's: cola 0 unacceptable / 1 acceptable; mnli 0 entailment /
1 neutral / 2 contradiction; mrpc 0 not_equivalent / 1 equivalent (the F1
positive class); qnli and rte 0 entailment / 1 not_entailment; qqp
0 not_duplicate / 1 duplicate; sst2 0 negative / 1 positive; stsb a float
similarity in [0, 5].

Text processing, in this order:

1. Each text feature is standardised like Keras's default
   ``lower_and_strip_punctuation``: lower-cased (UTF-8 aware), then every
   ASCII punctuation character in `PUNCTUATION_REGEX` is deleted (not
   replaced by a space: "don't" -> "dont").
2. Sentence pairs are joined as ``f"{first} [SEP] {second}"``: the two
   standardised sentences around the separator token `SEP_TOKEN`
   (``"[SEP]"``) with one space each side. Standardisation has removed
   brackets and upper case from the sentences, so ``[SEP]`` never comes from
   the text itself.
3. ``tf.keras.layers.TextVectorization(max_tokens=vocab_size,
   standardize=None, split="whitespace", output_sequence_length=seq_len)``,
   adapted on the train split only, maps the whitespace-separated tokens to
   ids: 0 (`PAD_ID`) pads, 1 (`OOV_ID`) stands for every token outside the
   vocabulary (words seen only in the test split included), 2.. are the
   vocabulary's words, most frequent first (ties in reverse string order:
   Keras's rule). Sequences longer than `seq_len` tokens lose their end, so
   a long first sentence can crowd out the second (RTE's and MNLI's
   premises are long: raise `seq_len` for them). For the pair tasks the
   separator always gets an id: if it missed the `vocab_size` cut (only
   possible for tiny vocabularies), it replaces the least frequent word.

TFDS data are opened like `tff_hetero.data.datasets.TfdsLoader` does:
`tfds.builder_from_directory` on the newest prepared version directory
``<data_dir>/glue/<task>/<x.y.z>/`` (one holding ``dataset_info.json``);
``data_dir=None`` means TFDS's default (``$TFDS_DATA_DIR`` or
``~/tensorflow_datasets``). Nothing is ever downloaded: if the files are
absent a one-line `DataError` names the directory looked in and the
``tfds build glue/<task>`` command that prepares them. The seed is accepted
for the `DatasetLoader` interface and checked, but not used: the official
splits are used as they are and the vocabulary is deterministic.

`GlueLoader` / `GLUE_LOADERS` wrap `load_glue` in the ``(data_dir, seed)``
shape of `tff_hetero.data.datasets.DatasetLoader`, under the names
``glue_<task>``; those of the classification tasks are registered data sets
(`tff_hetero.data.datasets.GLUE_DATASETS`: ``--dataset=glue_sst2`` etc.),
STS-B is not (the training program trains classifiers).
"""

from __future__ import annotations

from collections.abc import Mapping
import os
from types import MappingProxyType
from typing import TYPE_CHECKING

import attrs
import numpy as np

from tff_hetero.data import _checks

# `datasets` registers this module's loaders, so each imports the other: only
# the module object is bound here, and its names are looked up when called.
from tff_hetero.data import datasets as datasets_lib
from tff_hetero.data import text_metrics
from tff_hetero.errors import DataError

if TYPE_CHECKING:
  import tensorflow as tf
  import tensorflow_datasets as tfds

__all__ = [
  "GLUE_LOADERS",
  "GLUE_TASKS",
  "OOV_ID",
  "PAD_ID",
  "PUNCTUATION_REGEX",
  "SEP_TOKEN",
  "GlueLoader",
  "GlueSplits",
  "GlueTask",
  "TextArrayDataset",
  "load_glue",
]

SEP_TOKEN = "[SEP]"
"""The token between the two sentences of a pair task."""

PAD_ID = 0
"""The token id of padding (after the end of a shorter text)."""

OOV_ID = 1
"""The token id of every word outside the vocabulary."""

PUNCTUATION_REGEX = r'[!"#$%&()\*\+,-\./:;<=>?@\[\\\]^_`{|}~\']'
"""The characters standardisation deletes (Keras's ``DEFAULT_STRIP_REGEX``)."""

_BATCH = 8192
"""Texts tokenised per `TextVectorization` call."""


@attrs.frozen
class GlueTask:
  """How one GLUE task is read from TFDS ``glue/<name>``.

  Attributes:
    name: the TFDS config name, e.g. ``"sst2"``.
    text_features: the one or two text features, in the order they are
      joined.
    num_classes: the number of classes; 1 for a regression (STS-B).
    test_split: the labelled TFDS split returned as `GlueSplits.test`.
  """

  name: str
  text_features: tuple[str, ...]
  num_classes: int
  test_split: str = "validation"

  @property
  def tfds_name(self) -> str:
    """The TFDS name with config, e.g. ``"glue/sst2"``."""
    return f"glue/{self.name}"

  @property
  def metric(self) -> str:
    """The metric's name in `text_metrics.GLUE_METRICS`."""
    return text_metrics.GLUE_METRICS[self.name].name

  @property
  def is_regression(self) -> bool:
    return self.num_classes == 1


GLUE_TASKS: Mapping[str, GlueTask] = MappingProxyType(
  {
    "cola": GlueTask("cola", ("sentence",), 2),
    "mnli": GlueTask(
      "mnli", ("premise", "hypothesis"), 3, test_split="validation_matched"
    ),
    "mrpc": GlueTask("mrpc", ("sentence1", "sentence2"), 2),
    "qnli": GlueTask("qnli", ("question", "sentence"), 2),
    "qqp": GlueTask("qqp", ("question1", "question2"), 2),
    "rte": GlueTask("rte", ("sentence1", "sentence2"), 2),
    "sst2": GlueTask("sst2", ("sentence",), 2),
    "stsb": GlueTask("stsb", ("sentence1", "sentence2"), 1),
  }
)
"""The GLUE tasks of InclusiveFL: name -> `GlueTask`; see the module doc."""


@attrs.frozen(eq=False)
class TextArrayDataset:
  """Tokenised examples held in memory: token ids `x` and labels `y`.

  The text counterpart of `tff_hetero.data.datasets.ArrayDataset`, with the
  same `__len__`, `input_shape` and `subset`.

  Attributes:
    x: int32 array of shape [N, seq_len]: token ids, `PAD_ID`-padded.
    y: array of shape [N]: int32 class ids, or float32 regression targets.

  Both arrays are stored as read-only views. Equality is identity.
  """

  x: np.ndarray = attrs.field(converter=_checks.read_only_view)
  y: np.ndarray = attrs.field(converter=_checks.read_only_view)

  def __attrs_post_init__(self) -> None:
    if self.x.dtype != np.int32 or self.x.ndim != 2:
      raise DataError(
        f"TextArrayDataset.x must be int32 [N, seq_len], got {self.x.dtype} "
        f"with shape {self.x.shape}"
      )
    if self.y.dtype not in (np.int32, np.float32) or self.y.ndim != 1:
      raise DataError(
        f"TextArrayDataset.y must be int32 or float32 [N], got "
        f"{self.y.dtype} with shape {self.y.shape}"
      )
    if len(self.x) != len(self.y):
      raise DataError(
        f"TextArrayDataset has {len(self.x)} texts but {len(self.y)} labels"
      )

  def __len__(self) -> int:
    return int(self.y.shape[0])

  @property
  def input_shape(self) -> tuple[int, ...]:
    """The shape of one example, (seq_len,)."""
    return tuple(int(d) for d in self.x.shape[1:])

  def subset(self, indices: np.ndarray) -> TextArrayDataset:
    """Returns the examples at `indices` (a copy), in that order."""
    indices = np.asarray(indices, dtype=np.int64)
    return TextArrayDataset(x=self.x[indices], y=self.y[indices])


@attrs.frozen(eq=False)
class GlueSplits:
  """A tokenised GLUE task with its train and test splits.

  Has the attributes of `tff_hetero.data.datasets.DatasetSplits` (`name`,
  `train`, `test`, `num_classes`, `input_shape`) and the text ones.

  Attributes:
    name: ``glue_<task>``, the name `GLUE_LOADERS` registers it under.
    task: the key of `GLUE_TASKS`, e.g. ``"sst2"``.
    train: the TFDS ``train`` split (what federated partitioning splits up).
    test: the TFDS split named by `test_split` (centralised evaluation).
    test_split: ``validation`` (``validation_matched`` for MNLI).
    num_classes: labels lie in [0, num_classes); 1 for STS-B, whose labels
      are float32 scores.
    metric: the task's metric name (`text_metrics.GLUE_METRICS`).
    vocabulary: the tokens by id: ``""`` (padding), ``"[UNK]"`` (out of
      vocabulary), then the words fitted on the train split.
    seq_len: the length of every token sequence.
  """

  name: str
  task: str
  train: TextArrayDataset
  test: TextArrayDataset
  test_split: str
  num_classes: int
  metric: str
  vocabulary: tuple[str, ...] = attrs.field(converter=tuple, repr=False)
  seq_len: int

  def __attrs_post_init__(self) -> None:
    for split_name, split in (("train", self.train), ("test", self.test)):
      if split.input_shape != self.input_shape:
        raise DataError(
          f"{self.name} {split_name} token sequences have shape "
          f"{split.input_shape}, expected {self.input_shape}"
        )
      if len(split) and (split.x.min() < 0 or split.x.max() >= self.vocab_size):
        raise DataError(
          f"{self.name} {split_name} token ids must lie in "
          f"[0, {self.vocab_size}), got [{split.x.min()}, {split.x.max()}]"
        )
      expected = np.float32 if self.is_regression else np.int32
      if split.y.dtype != expected:
        raise DataError(
          f"{self.name} {split_name} labels must be {np.dtype(expected)}, "
          f"got {split.y.dtype}"
        )
      if (
        not self.is_regression
        and len(split)
        and (split.y.min() < 0 or split.y.max() >= self.num_classes)
      ):
        raise DataError(
          f"{self.name} {split_name} labels must lie in "
          f"[0, {self.num_classes}), got [{split.y.min()}, {split.y.max()}]"
        )

  @property
  def input_shape(self) -> tuple[int, ...]:
    """The shape of one example, (seq_len,)."""
    return (self.seq_len,)

  @property
  def vocab_size(self) -> int:
    """The number of token ids in use (padding and OOV included)."""
    return len(self.vocabulary)

  @property
  def is_regression(self) -> bool:
    return self.num_classes == 1


def _standardize(text: tf.Tensor) -> tf.Tensor:
  """Lower-cases and deletes punctuation; see the module doc."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  lowered = tf.strings.lower(text, encoding="utf-8")
  return tf.strings.regex_replace(lowered, PUNCTUATION_REGEX, "")


def _joined_text(spec: GlueTask, example: Mapping[str, tf.Tensor]):
  """The standardised text of a split, pairs joined around `SEP_TOKEN`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  parts = [_standardize(example[name]) for name in spec.text_features]
  if len(parts) == 1:
    return parts[0]
  return tf.strings.join(parts, separator=f" {SEP_TOKEN} ")


def _check_features(spec: GlueTask, builder: tfds.core.DatasetBuilder) -> None:
  """Raises `DataError` unless the TFDS features are those of the task."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  features = builder.info.features
  missing = [f for f in (*spec.text_features, "label") if f not in features]
  if missing:
    raise DataError(
      f"GLUE task {spec.name!r} in {builder.data_dir} lacks the features "
      f"{', '.join(missing)}; it has {', '.join(sorted(features))}"
    )
  label = features["label"]
  if spec.is_regression:
    fits = not isinstance(label, tfds.features.ClassLabel)
    fits = fits and np.dtype(label.np_dtype) == np.float32
    wanted = "float32 scores"
  else:
    fits = isinstance(label, tfds.features.ClassLabel)
    fits = fits and label.num_classes == spec.num_classes
    wanted = f"{spec.num_classes} classes"
  if not fits:
    raise DataError(
      f"GLUE task {spec.name!r} in {builder.data_dir} has labels {label!r}, "
      f"expected {wanted}"
    )


def _read_split(
  spec: GlueTask, builder: tfds.core.DatasetBuilder, split: str
) -> tuple[tf.Tensor, np.ndarray]:
  """A whole split: its joined texts (tf.string [n]) and labels [n]."""
  if split not in builder.info.splits:
    raise DataError(
      f"GLUE task {spec.name!r} in {builder.data_dir} has no {split!r} split"
    )
  # With batch_size=-1 TFDS returns the whole split as one dict of tensors.
  example = builder.as_dataset(split=split, batch_size=-1)
  labels = example["label"].numpy()
  if spec.is_regression:
    labels = labels.astype(np.float32)
  else:
    if len(labels) and labels.min() < 0:
      raise DataError(
        f"GLUE task {spec.name!r} split {split!r} in {builder.data_dir} has "
        f"unlabelled examples (label {labels.min()})"
      )
    labels = labels.astype(np.int32)
  return _joined_text(spec, example), labels


def _fit_vectorizer(
  spec: GlueTask, train_text: tf.Tensor, seq_len: int, vocab_size: int
):
  """A `TextVectorization` layer adapted on the train texts only."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  layer = tf.keras.layers.TextVectorization(
    max_tokens=vocab_size,
    standardize=None,
    split="whitespace",
    output_mode="int",
    output_sequence_length=seq_len,
  )
  layer.adapt(tf.data.Dataset.from_tensor_slices(train_text).batch(_BATCH))
  vocabulary = layer.get_vocabulary()
  if len(spec.text_features) > 1 and SEP_TOKEN not in vocabulary:
    # Missing only when the vocabulary is full (every pair holds it), so
    # the last entry is a word: the least frequent one.
    vocabulary[-1] = SEP_TOKEN
    layer.set_vocabulary(vocabulary)
  return layer


def _token_ids(layer, text: tf.Tensor, seq_len: int) -> np.ndarray:
  """The int32 [n, seq_len] token ids of `text`, in batches."""
  n = int(text.shape[0])
  parts = [layer(text[i : i + _BATCH]).numpy() for i in range(0, n, _BATCH)]
  if not parts:
    return np.zeros((0, seq_len), np.int32)
  return np.concatenate(parts).astype(np.int32)


def _check_task(task: object) -> GlueTask:
  return GLUE_TASKS[_checks.check_choice("GLUE task", task, GLUE_TASKS)]


def load_glue(
  task: str,
  data_dir: str | None,
  *,
  seq_len: int = 64,
  vocab_size: int = 20000,
  seed: int = 0,
) -> GlueSplits:
  """Loads and tokenises one GLUE task prepared by TFDS.

  Args:
    task: a key of `GLUE_TASKS` (``cola``, ``mnli``, ``mrpc``, ``qnli``,
      ``qqp``, ``rte``, ``sst2``, ``stsb``).
    data_dir: the TFDS data root holding ``glue/<task>/<version>/``;
      ``None`` means TFDS's default (``$TFDS_DATA_DIR`` or
      ``~/tensorflow_datasets``).
    seq_len: tokens per example (truncated or padded to it), >= 1.
    vocab_size: the most token ids, padding and OOV included, >= 3; the
      vocabulary is smaller when the train split has fewer distinct words.
    seed: checked (an integer >= 0) but unused; see the module doc.

  Returns:
    The `GlueSplits`: the train split and the labelled evaluation split
    (``validation``; ``validation_matched`` for MNLI) as token ids.

  Raises:
    DataError: (one line) unknown `task`, a bad `seq_len`, `vocab_size` or
      `seed`, data not prepared under `data_dir`, or unreadable files.
  """
  spec = _check_task(task)
  seq_len = _checks.check_int("--seq_len", seq_len, minimum=1)
  vocab_size = _checks.check_int("--vocab_size", vocab_size, minimum=3)
  _checks.check_seed(seed)
  root = (
    os.path.expanduser(data_dir)
    if data_dir
    else datasets_lib.default_tfds_data_dir()
  )
  builder_dir = os.path.join(root, "glue", spec.name)
  version_dir = datasets_lib._prepared_version_dir(builder_dir)
  if version_dir is None:
    raise DataError(
      f"GLUE task {spec.name!r} (TFDS {spec.tfds_name}) is not prepared "
      f"under {builder_dir} (no <version>/dataset_info.json there); prepare "
      f"it with `tfds build {spec.tfds_name} --data_dir=DIR` on a machine "
      f"with internet, copy DIR here, and pass --data_dir=DIR"
    )
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    builder = tfds.builder_from_directory(version_dir)
    _check_features(spec, builder)
    train_text, train_y = _read_split(spec, builder, "train")
    test_text, test_y = _read_split(spec, builder, spec.test_split)
  except DataError:
    raise
  except (tf.errors.OpError, ValueError, KeyError, TypeError) as e:
    raise DataError(
      f"could not read GLUE task {spec.name!r} from {version_dir}: "
      f"{datasets_lib._first_line(e)}"
    ) from e
  if not len(train_y):
    raise DataError(
      f"GLUE task {spec.name!r} in {version_dir} has an empty train split"
    )
  layer = _fit_vectorizer(spec, train_text, seq_len, vocab_size)
  return GlueSplits(
    name=f"glue_{spec.name}",
    task=spec.name,
    train=TextArrayDataset(x=_token_ids(layer, train_text, seq_len), y=train_y),
    test=TextArrayDataset(x=_token_ids(layer, test_text, seq_len), y=test_y),
    test_split=spec.test_split,
    num_classes=spec.num_classes,
    metric=spec.metric,
    vocabulary=layer.get_vocabulary(),
    seq_len=seq_len,
  )


@attrs.frozen
class GlueLoader:
  """`load_glue` for one task in the ``(data_dir, seed)`` loader shape.

  Attributes:
    task: a key of `GLUE_TASKS`.
    seq_len: tokens per example.
    vocab_size: the most token ids.
  """

  task: str
  seq_len: int = 64
  vocab_size: int = 20000

  def __call__(self, data_dir: str | None, seed: int) -> GlueSplits:
    return load_glue(
      self.task,
      data_dir,
      seq_len=self.seq_len,
      vocab_size=self.vocab_size,
      seed=seed,
    )


GLUE_LOADERS: Mapping[str, GlueLoader] = MappingProxyType(
  {f"glue_{task}": GlueLoader(task) for task in GLUE_TASKS}
)
"""``glue_<task>`` -> `GlueLoader` with the default `seq_len` and vocabulary."""
