r"""Resident memory kept by building client datasets in one eager process.

  python tools/dataset_memory.py --datasets=1600

The training program builds one `tf.data` dataset per sampled client per
round. This builds `--datasets` datasets of 250 MNIST-sized samples three
ways and prints the process's resident memory growth for each (MiB, one
JSON line per way):

  * `slices`: `from_tensor_slices(...).batch(...)`, no dataset function;
  * `map`: the same plus one `Dataset.map` (the identity);
  * `client_dataset`: `tff_hetero.data.make_client_dataset`;
  * `stored`: the same on arrays stored with `tff_hetero.data.ClientFiles`
    (a dataset whose graph reads the samples from files:
    `--client_data=files`), each serialized as TFF serializes a dataset it
    sends a worker.

Each way runs in a fresh subprocess so that one's memory does not hide
another's.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys

from absl import app
from absl import flags

_DATASETS = flags.DEFINE_integer("datasets", 1600, "Datasets to build.")
_WAY = flags.DEFINE_enum(
  "way",
  None,
  ["slices", "map", "client_dataset", "stored"],
  "Run one way in this process (internal).",
)
_SAMPLES = 250


def _measure(way: str, count: int) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top
  import psutil  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tff_hetero import data  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  arrays = data.ArrayDataset(
    rng.random((_SAMPLES, 28, 28, 1), dtype=np.float32),
    rng.integers(0, 10, _SAMPLES).astype(np.int32),
  )

  files = data.ClientFiles() if way == "stored" else None

  def build(i):
    order = rng.permutation(_SAMPLES)
    if way == "stored":
      dataset = data.make_client_dataset(
        files.store("client", arrays),
        batch_size=20,
        local_epochs=1,
        shuffle_seed=i,
      )
      return tf.raw_ops.DatasetToGraphV2(
        input_dataset=tf.data.experimental.to_variant(dataset)
      ).numpy()
    if way == "client_dataset":
      return data.make_client_dataset(
        arrays, batch_size=20, local_epochs=1, shuffle_seed=i
      )
    dataset = tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=arrays.x[order], y=arrays.y[order])
    ).batch(20)
    return dataset.map(lambda batch: batch) if way == "map" else dataset

  process = psutil.Process()
  warm = max(count // 10, 1)
  try:
    for i in range(warm):  # TensorFlow's one-time allocations.
      build(i)
    before = process.memory_info().rss
    for i in range(count):
      build(warm + i)
    after = process.memory_info().rss
  finally:
    if files is not None:
      files.close()
  return collections.OrderedDict(
    way=way,
    datasets=count,
    growth_mib=round((after - before) / 2**20, 1),
    kib_per_dataset=round((after - before) / 1024 / count, 1),
  )


def main(argv):
  del argv
  if _WAY.value:
    print(json.dumps(_measure(_WAY.value, _DATASETS.value)))
    return
  for way in ("slices", "map", "client_dataset", "stored"):
    out = subprocess.run(
      [
        sys.executable,
        __file__,
        f"--way={way}",
        f"--datasets={_DATASETS.value}",
      ],
      check=True,
      capture_output=True,
      text=True,
    ).stdout
    print(out.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
  app.run(main)
