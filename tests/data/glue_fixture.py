"""A real, tiny TFDS-prepared GLUE for tests (`prepare_glue`).

Writes a few sentences in the layout of GLUE's original source files (SST-2's,
STS-B's and MNLI's TSVs, MRPC's Microsoft release files) and runs TFDS's own
``glue`` builder over them: a subclass of
`tensorflow_datasets.text.glue.Glue` whose only change is that its splits come
from those local files instead of downloads. So the features, configs
(``glue/sst2``, ``glue/mrpc``, ``glue/stsb``, ``glue/mnli``), version and file
format are exactly those ``tfds build`` produces, and readers read them with
the real TFDS reading code: nothing is mocked.

Import it as ``from data import glue_fixture`` (``tests/`` is on the path of
every test, as for ``conftest``); it needs `tensorflow_datasets`.
"""

from __future__ import annotations

from collections.abc import Sequence
import os
import pathlib

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.utils import gcs_utils
from tensorflow_datasets.text import glue as tfds_glue

# SST-2: (sentence, label); "zebra" occurs only in validation.
SST2_TRAIN = [
  ("A gripping, funny film.", 1),
  ("Dull and far too long.", 0),
  ("The film is funny and warm!", 1),
  ("A dull, dull mess.", 0),
]
SST2_VALIDATION = [("A funny zebra.", 1), ("Dull film.", 0)]
SST2_TEST = ["An unlabelled test sentence."]  # GLUE hides test labels.

# MRPC: (quality, id1, id2, sentence1, sentence2); the Microsoft release has
# train and dev in one file, dev picked by its id pairs.
MRPC_ROWS = [
  (1, 101, 102, "The cat sat on the mat.", "A cat was sitting on the mat."),
  (0, 103, 104, "Stocks fell sharply today.", "The weather was sunny."),
  (1, 105, 106, "He bought a car.", "He purchased a car."),
  (0, 107, 108, "Quokka stocks rose.", "The cat slept."),
  (1, 109, 110, "He bought stocks.", "He purchased stocks."),
]
MRPC_DEV_IDS = [(107, 108), (109, 110)]

# STS-B: (sentence1, sentence2, score).
STSB_TRAIN = [
  ("A man is playing a guitar.", "A man plays the guitar.", 4.8),
  ("A woman is slicing onions.", "A dog runs.", 0.4),
  ("Kids play soccer.", "Children are playing football.", 3.6),
]
STSB_VALIDATION = [("A man is playing a flute.", "A man plays music.", 2.5)]

# MNLI: (premise, hypothesis, gold label); test uses validation_matched.
MNLI_TRAIN = [
  ("The dog barked loudly.", "A dog made noise.", "entailment"),
  ("The dog slept.", "The dog barked.", "contradiction"),
  ("A man walked home.", "The man was tired.", "neutral"),
]
MNLI_MATCHED = [
  ("The dog walked home.", "A dog moved.", "entailment"),
  ("A man slept.", "The man ran.", "contradiction"),
]
MNLI_MISMATCHED = [("A cat sat.", "A cat stood.", "contradiction")]
MNLI_LABELS = ["entailment", "neutral", "contradiction"]

CONFIGS = ("sst2", "mrpc", "stsb", "mnli")
"""The GLUE configs `prepare_glue` can write."""


def mrpc_rows(num_rows: int, num_dev: int, seed: int = 0):
  """`num_rows` generated MRPC rows (about half paraphrases: the same
  sentence with synonyms; the others two unrelated sentences) and the id
  pairs of the last `num_dev` of them (dev); for larger runs than
  `MRPC_ROWS` allows."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  subjects = ["the cat", "a dog", "my friend", "the bank", "he", "she"]
  verbs = [("bought", "purchased"), ("saw", "noticed"), ("sold", "traded")]
  objects = ["a car", "the stocks", "a house", "the paper", "fresh bread"]
  rows = []
  for i in range(num_rows):
    subject, (verb, synonym), thing = (
      subjects[rng.integers(len(subjects))],
      verbs[rng.integers(len(verbs))],
      objects[rng.integers(len(objects))],
    )
    first = f"{subject.capitalize()} {verb} {thing}."
    if i % 2 == 0:
      second, quality = f"{subject.capitalize()} {synonym} {thing}.", 1
    else:
      other = objects[(objects.index(thing) + 1) % len(objects)]
      second, quality = f"The weather was {other.split()[-1]}.", 0
    rows.append((quality, 1000 + 2 * i, 1001 + 2 * i, first, second))
  dev = [(a, b) for _, a, b, _, _ in rows[num_rows - num_dev :]]
  return rows, dev


def _write_tsv(path: pathlib.Path, header, rows, bom: bool = False) -> None:
  lines = ["\t".join(header)] + ["\t".join(str(v) for v in r) for r in rows]
  text = "\n".join(lines) + "\n"
  path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())


def write_sources(
  root: pathlib.Path,
  *,
  mrpc: tuple[Sequence[tuple], Sequence[tuple]] = (MRPC_ROWS, MRPC_DEV_IDS),
) -> None:
  """GLUE's source files, as their download archives hold them; `mrpc` is
  (rows, dev id pairs)."""
  sst2 = root / "sst2"
  sst2.mkdir(parents=True)
  _write_tsv(sst2 / "train.tsv", ["sentence", "label"], SST2_TRAIN)
  _write_tsv(sst2 / "dev.tsv", ["sentence", "label"], SST2_VALIDATION)
  _write_tsv(sst2 / "test.tsv", ["index", "sentence"], enumerate(SST2_TEST))

  rows, dev_ids = mrpc
  mrpc_dir = root / "mrpc"
  mrpc_dir.mkdir()
  header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
  # The release's train file starts with a UTF-8 byte order mark.
  _write_tsv(mrpc_dir / "msr_paraphrase_train.txt", header, rows, bom=True)
  _write_tsv(mrpc_dir / "msr_paraphrase_test.txt", header, rows[:1])
  (mrpc_dir / "mrpc_dev_ids.tsv").write_text(
    "".join(f"{a}\t{b}\n" for a, b in dev_ids)
  )

  stsb = root / "stsb"
  stsb.mkdir()
  header = ["index", "genre", "sentence1", "sentence2", "score"]
  for name, rows in (("train", STSB_TRAIN), ("dev", STSB_VALIDATION)):
    rows = [(i, "main-captions", *row) for i, row in enumerate(rows)]
    _write_tsv(stsb / f"{name}.tsv", header, rows)

  mnli = root / "mnli"
  mnli.mkdir()
  header = ["index", "genre", "sentence1", "sentence2", "gold_label"]
  for name, rows in (
    ("train", MNLI_TRAIN),
    ("dev_matched", MNLI_MATCHED),
    ("dev_mismatched", MNLI_MISMATCHED),
  ):
    rows = [(i, "fiction", *row) for i, row in enumerate(rows)]
    _write_tsv(mnli / f"{name}.tsv", header, rows)


class LocalGlue(tfds_glue.Glue, skip_registration=True):
  """TFDS's GLUE builder with its sources read from `SOURCE_DIR`."""

  name = "glue"
  SOURCE_DIR = ""

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    config = self.builder_config.name
    source = os.path.join(self.SOURCE_DIR, config)

    def split(tsv: str, name: str, mrpc_files=None):
      return self._generate_examples(
        data_file=os.path.join(source, tsv), split=name, mrpc_files=mrpc_files
      )

    if config == "mrpc":
      files = {
        "dev_ids": os.path.join(source, "mrpc_dev_ids.tsv"),
        "train": os.path.join(source, "msr_paraphrase_train.txt"),
        "test": os.path.join(source, "msr_paraphrase_test.txt"),
      }
      return {
        name: split("", role, files)
        for name, role in (
          ("train", "train"),
          ("validation", "dev"),
          ("test", "test"),
        )
      }
    if config == "mnli":
      return {
        "train": split("train.tsv", "train"),
        "validation_matched": split("dev_matched.tsv", "dev"),
        "validation_mismatched": split("dev_mismatched.tsv", "dev"),
      }
    generators = {
      "train": split("train.tsv", "train"),
      "validation": split("dev.tsv", "dev"),
    }
    if os.path.exists(os.path.join(source, "test.tsv")):
      generators["test"] = split("test.tsv", "test")
    return generators


def prepare_glue(
  root: pathlib.Path,
  sources: pathlib.Path,
  configs: Sequence[str] = CONFIGS,
  **source_options,
) -> pathlib.Path:
  """Writes the sources under `sources` (`write_sources(**source_options)`)
  and prepares each of `configs` with TFDS under the data root `root`
  (``root/glue/<config>/2.0.0/``, as ``tfds build glue/<config>
  --data_dir=root`` would); returns `root`."""
  write_sources(sources, **source_options)
  with pytest.MonkeyPatch.context() as patch:
    # Without data on disk, TFDS builders probe Google Cloud Storage for
    # metadata when constructed; that only costs time offline, so skip it.
    patch.setattr(gcs_utils, "_is_gcs_disabled", True)
    patch.setattr(LocalGlue, "SOURCE_DIR", os.fspath(sources))
    for config in configs:
      builder = LocalGlue(data_dir=os.fspath(root), config=config)
      builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(
          compute_stats=tfds.download.ComputeStatsMode.SKIP
        )
      )
      assert builder.data_dir == os.fspath(root / "glue" / config / "2.0.0")
  return root
