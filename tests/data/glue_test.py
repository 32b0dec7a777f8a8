"""Tests of `tff_hetero.data.glue` on real TFDS-prepared GLUE files.

The fixture (`glue_fixture.prepare_glue`) runs TFDS's own ``glue`` builder
over a few sentences written in the layout of GLUE's source files, so
`load_glue` reads what ``tfds build`` produces with the real TFDS reading
code: nothing is mocked.

TFDS stores examples in an order of its own (hashed keys), so the tests
compare splits as multisets of (decoded text, label).
"""

from __future__ import annotations

import collections
import os
import pathlib
import shutil

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")
from data import glue_fixture  # noqa: E402
from tff_hetero.data import DataError  # noqa: E402
from tff_hetero.data import glue  # noqa: E402
from tff_hetero.data import partition  # noqa: E402
from tff_hetero.data import text_metrics  # noqa: E402


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  root = glue_fixture.prepare_glue(
    tmp_path_factory.mktemp("tfds"), tmp_path_factory.mktemp("glue_sources")
  )
  # Leftovers that are not prepared versions must be ignored.
  (root / "glue" / "sst2" / "9.9.9.incompleteABC123").mkdir()
  (root / "glue" / "sst2" / "3.0.0").mkdir()  # No dataset_info.json.
  return root


def _standardised(text: str) -> str:
  """What the loader's standardisation makes of our ASCII sentences."""
  return "".join(c for c in text.lower() if c.isalnum() or c.isspace())


def _pair(first: str, second: str) -> str:
  return f"{_standardised(first)} [SEP] {_standardised(second)}"


def _decoded(splits: glue.GlueSplits, split: glue.TextArrayDataset):
  """The split as a multiset of (text rebuilt from ids, label)."""
  rows = []
  for ids, label in zip(split.x, split.y):
    words = [splits.vocabulary[i] for i in ids if i != glue.PAD_ID]
    rows.append((" ".join(words), label.item()))
  return collections.Counter(rows)


def test_sst2_shapes_dtypes_labels_and_metadata(prepared_dir):
  splits = glue.load_glue("sst2", os.fspath(prepared_dir), seq_len=8)
  assert splits.name == "glue_sst2" and splits.task == "sst2"
  assert (len(splits.train), len(splits.test)) == (4, 2)
  assert splits.train.x.shape == (4, 8) and splits.test.x.shape == (2, 8)
  assert splits.train.x.dtype == np.int32 and splits.test.x.dtype == np.int32
  assert splits.train.y.dtype == np.int32 and splits.test.y.dtype == np.int32
  assert splits.input_shape == splits.train.input_shape == (8,)
  assert splits.seq_len == 8
  assert splits.num_classes == 2 and not splits.is_regression
  assert splits.metric == "accuracy"
  assert splits.test_split == "validation"
  # The TFDS test split (labels hidden as -1) is not used.
  assert sorted(splits.test.y.tolist()) == [0, 1]
  assert sorted(splits.train.y.tolist()) == [0, 0, 1, 1]
  assert not splits.train.x.flags.writeable


def test_vocabulary_is_fitted_on_train_only(prepared_dir):
  splits = glue.load_glue("sst2", os.fspath(prepared_dir), seq_len=8)
  # Train words by count (dull 3; a, and, film, funny 2; the rest 1), ties
  # in reverse string order; padding and OOV first.
  assert splits.vocabulary == (
    *("", "[UNK]", "dull", "funny", "film", "and", "a"),
    *("warm", "too", "the", "mess", "long", "is", "gripping", "far"),
  )
  assert splits.vocab_size == 15
  assert "zebra" not in splits.vocabulary
  ids = {word: i for i, word in enumerate(splits.vocabulary)}
  rows = {tuple(row) for row in splits.test.x.tolist()}
  # "A funny zebra." -> a funny [OOV]; "Dull film." -> dull film.
  assert (ids["a"], ids["funny"], glue.OOV_ID, 0, 0, 0, 0, 0) in rows
  assert (ids["dull"], ids["film"], 0, 0, 0, 0, 0, 0) in rows
  assert _decoded(splits, splits.train) == collections.Counter(
    (_standardised(text), label) for text, label in glue_fixture.SST2_TRAIN
  )


def test_vocab_size_caps_the_vocabulary(prepared_dir):
  splits = glue.load_glue("sst2", os.fspath(prepared_dir), vocab_size=5)
  assert splits.vocabulary == ("", "[UNK]", "dull", "funny", "film")
  assert splits.train.x.max() == 4
  assert splits.train.x.shape == (4, 64)  # The default seq_len.
  # "Dull and far too long." keeps only "dull".
  assert (2, 1, 1, 1, 1) in {tuple(r[:5]) for r in splits.train.x.tolist()}


def test_mrpc_pairs_are_joined_around_sep(prepared_dir):
  splits = glue.load_glue("mrpc", os.fspath(prepared_dir), seq_len=16)
  assert (len(splits.train), len(splits.test)) == (3, 2)
  assert splits.metric == "f1"
  assert glue.SEP_TOKEN in splits.vocabulary
  sep = splits.vocabulary.index(glue.SEP_TOKEN)
  assert ((splits.train.x == sep).sum(axis=1) == 1).all()
  dev = {(r[1], r[2]) for r in glue_fixture.MRPC_ROWS} & set(
    glue_fixture.MRPC_DEV_IDS
  )
  assert len(dev) == 2
  train_rows = [r for r in glue_fixture.MRPC_ROWS if (r[1], r[2]) not in dev]
  assert _decoded(splits, splits.train) == collections.Counter(
    (_pair(s1, s2), quality) for quality, _, _, s1, s2 in train_rows
  )
  # "Quokka stocks rose." is dev-only: its unknown word maps to OOV.
  assert _decoded(splits, splits.test) == collections.Counter(
    [("[UNK] stocks [UNK] [SEP] the cat [UNK]", 0)]
    + [("he bought stocks [SEP] he purchased stocks", 1)]
  )


def test_long_first_sentence_crowds_out_the_second(prepared_dir):
  splits = glue.load_glue("mrpc", os.fspath(prepared_dir), seq_len=4)
  assert splits.train.x.shape == (3, 4)
  texts = set(_decoded(splits, splits.train))
  assert ("he bought a car", 1) in texts
  assert ("the cat sat on", 1) in texts


def test_sep_keeps_an_id_in_a_tiny_vocabulary(prepared_dir):
  # "the" (4 times) outnumbers [SEP] (once per pair, 3 times) in train.
  splits = glue.load_glue("mrpc", os.fspath(prepared_dir), vocab_size=3)
  assert splits.vocabulary == ("", "[UNK]", glue.SEP_TOKEN)
  assert ((splits.train.x == 2).sum(axis=1) == 1).all()


def test_stsb_is_a_regression_with_float_scores(prepared_dir):
  splits = glue.load_glue("stsb", os.fspath(prepared_dir), seq_len=12)
  assert splits.num_classes == 1 and splits.is_regression
  assert splits.metric == "pearson"
  assert splits.train.y.dtype == np.float32
  assert splits.train.x.shape == (3, 12) and splits.test.x.shape == (1, 12)
  np.testing.assert_allclose(sorted(splits.train.y), [0.4, 3.6, 4.8])
  assert _decoded(splits, splits.test) == collections.Counter(
    [("a man is playing a [UNK] [SEP] a man plays [UNK]", 2.5)]
  )
  assert _decoded(splits, splits.train) == collections.Counter(
    (_pair(s1, s2), np.float32(score).item())
    for s1, s2, score in glue_fixture.STSB_TRAIN
  )


def test_mnli_is_evaluated_on_validation_matched(prepared_dir):
  splits = glue.load_glue("mnli", os.fspath(prepared_dir), seq_len=10)
  assert splits.test_split == "validation_matched"
  assert splits.num_classes == 3
  assert splits.metric == "matched_accuracy"
  assert _decoded(splits, splits.test) == collections.Counter(
    [
      ("the dog walked home [SEP] a dog [UNK]", 0),
      ("a man slept [SEP] the man [UNK]", 2),
    ]
  )
  assert _decoded(splits, splits.train) == collections.Counter(
    (_pair(premise, hypothesis), glue_fixture.MNLI_LABELS.index(label))
    for premise, hypothesis, label in glue_fixture.MNLI_TRAIN
  )


def test_loader_and_registry_shape(prepared_dir):
  assert set(glue.GLUE_TASKS) == set(text_metrics.GLUE_METRICS)
  assert set(glue.GLUE_TASKS) == {
    *("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb")
  }
  assert set(glue.GLUE_LOADERS) == {f"glue_{t}" for t in glue.GLUE_TASKS}
  loader = glue.GLUE_LOADERS["glue_sst2"]
  splits = loader(os.fspath(prepared_dir), 0)
  assert splits.name == "glue_sst2" and splits.seq_len == 64


def test_glue_splits_partition_like_image_data(prepared_dir):
  splits = glue.load_glue("sst2", os.fspath(prepared_dir), seq_len=8)
  data = partition.build_federated_data(
    splits, num_clients=2, method="iid", seed=0
  )
  local = data.client_train(data.client_ids[0])
  assert isinstance(local, glue.TextArrayDataset) and len(local) == 2
  batch = next(
    iter(
      partition.make_client_dataset(
        local, batch_size=2, local_epochs=1, shuffle_seed=0
      )
    )
  )
  assert batch["x"].shape == (2, 8) and batch["x"].dtype.name == "int32"


def test_unknown_task_is_a_one_line_error(tmp_path):
  with pytest.raises(DataError) as error:
    glue.load_glue("sst-2", os.fspath(tmp_path))
  message = str(error.value)
  assert "\n" not in message
  assert message == (
    "unknown GLUE task 'sst-2'; accepted: cola, mnli, mrpc, qnli, qqp, "
    "rte, sst2, stsb"
  )


def test_absent_data_is_a_one_line_error(tmp_path):
  missing = tmp_path / "nothing_here"
  with pytest.raises(DataError) as error:
    glue.load_glue("cola", os.fspath(missing))
  message = str(error.value)
  assert "\n" not in message
  assert "GLUE task 'cola'" in message
  assert os.fspath(missing / "glue" / "cola") in message
  assert "tfds build glue/cola --data_dir=DIR" in message
  assert "pass --data_dir=DIR" in message


def test_default_data_dir_follows_tfds_data_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", os.fspath(tmp_path))
  with pytest.raises(DataError) as error:
    glue.load_glue("rte", None)
  assert os.fspath(tmp_path / "glue" / "rte") in str(error.value)


@pytest.mark.parametrize(
  "kwargs, flag",
  [
    (dict(seq_len=0), "--seq_len"),
    (dict(vocab_size=2), "--vocab_size"),
    (dict(seed=-1), "--seed"),
  ],
)
def test_bad_arguments_are_one_line_errors(tmp_path, kwargs, flag):
  with pytest.raises(DataError, match=flag) as error:
    glue.load_glue("sst2", os.fspath(tmp_path), **kwargs)
  assert "\n" not in str(error.value)


def test_corrupt_files_are_a_one_line_error(prepared_dir, tmp_path):
  copy = tmp_path / "glue" / "sst2" / "2.0.0"
  shutil.copytree(prepared_dir / "glue" / "sst2" / "2.0.0", copy)
  (train_file,) = copy.glob("glue-train.tfrecord*")
  train_file.write_bytes(train_file.read_bytes()[:60])
  with pytest.raises(DataError) as error:
    glue.load_glue("sst2", os.fspath(tmp_path))
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"could not read GLUE task 'sst2' from {copy}: ")


def test_text_array_dataset_checks_its_arrays():
  with pytest.raises(DataError, match="int32 \\[N, seq_len\\]"):
    glue.TextArrayDataset(
      x=np.zeros((2, 3), np.float32), y=np.zeros(2, np.int32)
    )
  with pytest.raises(DataError, match="2 texts but 3 labels"):
    glue.TextArrayDataset(x=np.zeros((2, 3), np.int32), y=np.zeros(3, np.int32))
  data = glue.TextArrayDataset(
    x=np.arange(6, dtype=np.int32).reshape(3, 2), y=np.arange(3, dtype=np.int32)
  )
  picked = data.subset(np.array([2, 0]))
  np.testing.assert_array_equal(picked.x, [[4, 5], [0, 1]])
  np.testing.assert_array_equal(picked.y, [2, 0])
