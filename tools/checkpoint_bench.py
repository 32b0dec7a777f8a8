r"""Checkpoint save and load: one SavedModel variable per leaf against packed.

  python tools/checkpoint_bench.py [--algorithm=inclusivefl] [--repeats=3]

Builds `--algorithm`'s experiment with the pipeline's defaults (the dataset
`mnist5k`; `--model`, else the algorithm's own default), takes its initial
server state, and times, `--repeats` times each, on this machine's disk:

  * `per_leaf`: TFF's `FileProgramStateManager` saving and loading the
    state's flattened leaves as they are, one SavedModel variable each (the
    checkpoints' layout before leaves were packed);
  * `packed`: `checkpoint.CheckpointManager.save` / `load_latest`, the
    program's own checkpoints (leaves packed by dtype, sidecar, checksums).

Prints each time and, last, one JSON object with the leaf and array counts and
the median seconds of each.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow_federated as tff  # noqa: E402
import tree  # noqa: E402

from tff_hetero.accounting import CommLedger  # noqa: E402
from tff_hetero.program import checkpoint as checkpoint_lib  # noqa: E402
from tff_hetero.program import configs  # noqa: E402
from tff_hetero.program import loop  # noqa: E402

_ALGORITHM = flags.DEFINE_string("algorithm", "inclusivefl", "Algorithm.")
_MODEL = flags.DEFINE_string("model", None, "Model (default: the algorithm's).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Saves and loads of each kind.")


def main(argv):
  del argv
  kwargs = dict(algorithm=_ALGORITHM.value, dataset="mnist5k")
  if _MODEL.value:
    kwargs["model"] = _MODEL.value
  experiment = loop.build_experiment(configs.make_config(**kwargs))
  server_state = experiment.algorithm.initialize()
  leaves = [np.asarray(leaf) for leaf in tree.flatten(server_state)]
  results = collections.OrderedDict(
    algorithm=_ALGORITHM.value,
    leaves=len(leaves),
    arrays=len(checkpoint_lib._pack(leaves)[0]),  # pylint: disable=protected-access
    megabytes=round(sum(leaf.nbytes for leaf in leaves) / 2**20, 1),
  )
  times = collections.defaultdict(list)
  with tempfile.TemporaryDirectory() as root:
    per_leaf = tff.program.FileProgramStateManager(
      os.path.join(root, "per_leaf"), keep_total=1, keep_first=False
    )
    packed = checkpoint_lib.CheckpointManager(
      os.path.join(root, "packed"), keep_total=1
    )
    for version in range(1, _REPEATS.value + 1):
      start = time.perf_counter()
      asyncio.run(per_leaf.save(leaves, version))
      times["per_leaf_save_s"].append(time.perf_counter() - start)
      start = time.perf_counter()
      asyncio.run(per_leaf.load(version, [None] * len(leaves)))
      times["per_leaf_load_s"].append(time.perf_counter() - start)
      state = checkpoint_lib.ProgramState(
        round_num=version,
        server_state=server_state,
        client_states=collections.OrderedDict(),
        ledger=CommLedger(),
        rng_state={},
        elapsed_s=0.0,
        history=(),
        fingerprint="bench",
      )
      start = time.perf_counter()
      packed.save(state)
      times["packed_save_s"].append(time.perf_counter() - start)
      start = time.perf_counter()
      restored = packed.load_latest(server_state, None)
      times["packed_load_s"].append(time.perf_counter() - start)
      for got, want in zip(tree.flatten(restored.server_state), leaves):
        np.testing.assert_array_equal(got, want)
      print(
        f"repeat {version}: "
        + ", ".join(f"{k} {v[-1]:.3f}" for k, v in times.items()),
        flush=True,
      )
  for key, values in times.items():
    results[key] = round(statistics.median(values), 3)
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
