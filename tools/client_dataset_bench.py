r"""Time to build one client's training dataset in the driver.

  python tools/client_dataset_bench.py [--samples=200] [--repeats=500]

The program builds one dataset per sampled client per round
(`data.make_client_dataset`, FedGKT's `make_indexed_client_dataset`), in
the driver, before TFF's call. Builds datasets of `--samples` random
MNIST-sized samples (float32 28x28x1, int32 labels) with batch 20, for 1
and 5 local epochs (and epoch-aligned) and the indexed variant with its
per-batch values and per-sample rows, `--repeats` times each after one
warm-up, and prints the median milliseconds of a build, then one JSON
object with them. Every dataset is checked to hold all its samples.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

from tff_hetero import data as data_lib  # noqa: E402

_SAMPLES = flags.DEFINE_integer("samples", 200, "Samples of the client.")
_REPEATS = flags.DEFINE_integer("repeats", 500, "Timed builds of each kind.")


def main(argv):
  del argv
  rng = np.random.default_rng(0)
  n = _SAMPLES.value
  arrays = data_lib.ArrayDataset(
    rng.random((n, 28, 28, 1), dtype=np.float32),
    rng.integers(0, 10, n).astype(np.int32),
  )
  logits = rng.random((n, 10), dtype=np.float32)
  builds = collections.OrderedDict(
    epochs_1=(
      1,
      lambda: data_lib.make_client_dataset(
        arrays, batch_size=20, local_epochs=1, shuffle_seed=3
      ),
    ),
    epochs_5=(
      5,
      lambda: data_lib.make_client_dataset(
        arrays, batch_size=20, local_epochs=5, shuffle_seed=3
      ),
    ),
    epochs_5_aligned=(
      5,
      lambda: data_lib.make_client_dataset(
        arrays,
        batch_size=20,
        local_epochs=5,
        shuffle_seed=3,
        epoch_aligned=True,
      ),
    ),
    indexed=(
      2,  # One training epoch, then every sample once.
      lambda: data_lib.make_indexed_client_dataset(
        arrays,
        batch_size=20,
        local_epochs=1,
        shuffle_seed=3,
        batch_values={"temperature": np.float32(3.0)},
        sample_rows={"server_logits": logits},
      ),
    ),
  )
  results = collections.OrderedDict(samples=n)
  for name, (passes, build) in builds.items():
    held = sum(int(b["y"].shape[0]) for b in build())
    if held != passes * n:
      raise SystemExit(f"error: {name} holds {held} samples, not {passes * n}")
    times = []
    for _ in range(_REPEATS.value):
      start = time.perf_counter()
      build()
      times.append(time.perf_counter() - start)
    results[f"{name}_ms"] = round(1e3 * statistics.median(times), 3)
    print(f"{name}: {results[f'{name}_ms']} ms", flush=True)
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
