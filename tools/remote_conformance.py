r"""Every registered algorithm on the local runtime, one worker and three workers.

    .venv/bin/python tools/remote_conformance.py                 # all
    .venv/bin/python tools/remote_conformance.py --algorithms=fedavg,fedgkt

Starts three workers as an operator would (`python -m pipelines.worker`, on
loopback), then runs each algorithm for two rounds on the synthetic data set
three times: `--executor=local`, `--executor=remote` on the first worker, and
on all three (TFF's mergeable context, the cohort split 2 + 2 + 2). Each
remote run must end with the local run's final weights (absolute tolerance
`--atol`: the order of summation differs), its measured bytes and its final
accuracy. Prints one row per algorithm and writes them to `--output` (JSON);
exit status 1 if any algorithm differs or fails.

`tests/program/remote_conformance_test.py` runs the same check
(`tff_hetero.program.conformance.conform`) for one algorithm of each family
in CI; this tool covers them all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback

from absl import app
from absl import flags

# Before `app.run` parses the flags: TensorFlow imported after that builds
# Keras layers that fail (`Flatten` on a None dimension, TF 2.14).
import tensorflow  # noqa: F401  pylint: disable=unused-import

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_ALGORITHMS = flags.DEFINE_list(
  "algorithms", [], "Algorithms to check (default: every registered one)."
)
_ATOL = flags.DEFINE_float("atol", 1e-4, "Absolute tolerance on weights.")
_OUTPUT = flags.DEFINE_string(
  "output", "", "JSON file for the rows (default: none)."
)


def main(argv) -> None:
  del argv
  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import registry
  from tff_hetero.program import conformance
  from tff_hetero.runtime import testing as proc_testing

  names = _ALGORITHMS.value or list(registry.ALGORITHMS)
  unknown = [n for n in names if n not in registry.ALGORITHMS]
  if unknown:
    sys.exit(f"error: --algorithms: unknown {', '.join(unknown)}")
  rows = []
  with proc_testing.cli_workers(3, stderr=subprocess.DEVNULL) as workers:
    addresses = [w.address for w in workers]
    with tempfile.TemporaryDirectory() as root:
      for name in names:
        try:
          row = conformance.conform(name, addresses, root, _ATOL.value)
        except Exception as e:  # pylint: disable=broad-except
          traceback.print_exc()
          row = dict(
            algorithm=name, ok=False, error=" ".join(str(e).split())[:300]
          )
        rows.append(row)
        print(json.dumps(row), flush=True)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(rows, f, indent=1)
  failed = [r["algorithm"] for r in rows if not r["ok"]]
  print(
    f"{len(rows) - len(failed)}/{len(rows)} agree"
    + (f"; differ or fail: {', '.join(failed)}" if failed else "")
  )
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  app.run(main)
