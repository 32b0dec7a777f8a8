"""Child process for runtime_lifecycle_test.py.

    python lifecycle_child.py MODE

Enters `local_execution()` inside `handle_termination()`, runs a federated mean, prints `READY <worker pid> <result>`,
waits for a line on stdin, then ends according to MODE:

  normal   leaves the `with` blocks and exits 0
  raise    raises RuntimeError inside the blocks
  wait*    prints WAITING, sleeps until the test signals it
  compute* prints COMPUTING, runs long computations until the test signals it
"""

import sys
import time

import numpy as np


def main(mode: str) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def mean(x):
    return tff.federated_mean(x)

  @tff.tensorflow.computation(np.float32)
  def spin(x):
    return tf.while_loop(
      lambda i, a: i < 3_000_000, lambda i, a: (i + 1, a * 0.5 + 1.0), (0, x)
    )[1]

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def slow(x):
    return tff.federated_mean(tff.federated_map(spin, x))

  with runtime.handle_termination():
    with runtime.local_execution(worker_timeout_s=10) as handle:
      result = mean([1.0, 2.0, 6.0])
      print(f"READY {handle.workers[0].pid} {result}", flush=True)
      sys.stdin.readline()  # The test inspects the worker, then says go.
      if mode == "raise":
        raise RuntimeError("boom")
      if mode.startswith("wait"):
        print("WAITING", flush=True)
        while True:
          time.sleep(0.1)
      if mode.startswith("compute"):
        print("COMPUTING", flush=True)
        while True:  # Signalled in the middle of a long TFF call.
          slow([1.0, 2.0])


if __name__ == "__main__":
  main(sys.argv[1])
