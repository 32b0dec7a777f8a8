r"""What the heap settings of a worker cost a training step.

  python tools/heap_bench.py [--model=mnist_cnn_feddst] [--batch=50]
      [--steps=40] [--repeats=3]

Each setting of `SETTINGS` runs in a fresh interpreter whose environment
is a worker's under that setting (`heap.environment_of`: glibc's tunables
`MALLOC_MMAP_THRESHOLD_` and `MALLOC_ARENA_MAX`, read at start-up, and
TensorFlow's `TF_CPU_ALLOCATOR_USE_BFC`, read when it creates its CPU
device, as in the TFF workers the runtime starts) and nothing else of
malloc's. The child builds `--model` (a registered model, MNIST-shaped
input, 10 classes, seed 0), runs one compiled `tf.function` of `--steps`
plain SGD steps on one random batch of `--batch` once to trace it, then
times a second call and reads its minor page faults (`getrusage`). The
settings run in turn, `--repeats` rounds; the tool prints, per setting, the
median milliseconds per step (fastest and slowest in brackets) and the
median minor page faults per step, then one JSON object with them.

Why: a fixed mmap threshold of 128 KiB (`heap.py`'s compact profile) maps
every tensor of 128 KiB or more on its own and unmaps it when freed, so a
step touches fresh pages for each activation and gradient, and each page
costs the kernel a fault. glibc's dynamic threshold (the throughput
profile) reuses most of them from its heap; TensorFlow's BFC pools, which
the throughput profile gives the workers, reuse all of them.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from tff_hetero.runtime import heap  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_MODEL = flags.DEFINE_string("model", "mnist_cnn_feddst", "Registered model.")
_BATCH = flags.DEFINE_integer("batch", 50, "Examples per batch.")
_STEPS = flags.DEFINE_integer("steps", 40, "Timed SGD steps per run.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Runs of each setting.")

# Setting name -> the allocator environment of the child: glibc and
# TensorFlow as they come, heap.py's profiles (a worker's environment), and
# the throughput profile without TensorFlow's pools.
SETTINGS = collections.OrderedDict(
  glibc_default={},
  throughput=heap.environment_of(heap.THROUGHPUT),
  throughput_without_tf_pools=heap.environment_of(
    heap.THROUGHPUT._replace(worker_tf_bfc=False)
  ),
  compact=heap.environment_of(heap.COMPACT),
)

_CHILD = textwrap.dedent("""
    import json, os, resource, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.path.insert(0, os.getcwd())
    import tensorflow as tf
    from tff_hetero.models import registry
    model_name, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    model = registry.build_model(model_name, (28, 28, 1), 10, 0)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x = tf.random.stateless_normal([batch, 28, 28, 1], seed=[0, 1])
    y = tf.random.stateless_uniform([batch], [0, 2], 0, 10, tf.int32)
    variables = model.trainable_variables

    @tf.function
    def train():
      for _ in tf.range(steps):
        with tf.GradientTape() as tape:
          loss = loss_fn(y, model(x, training=True))
        for v, g in zip(variables, tape.gradient(loss, variables)):
          v.assign_sub(0.01 * g)
      return loss

    train().numpy()  # Traces and warms up.
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    loss = float(train().numpy())
    elapsed = time.perf_counter() - start
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(json.dumps(dict(
        ms_per_step=1000 * elapsed / steps,
        faults_per_step=faults / steps,
        finite=loss == loss,
    )))
""")


def _child(setting: str, script: str) -> dict:
  env = heap.without_allocator_settings(os.environ)
  env.update(SETTINGS[setting])
  out = subprocess.run(
    [
      sys.executable,
      script,
      _MODEL.value,
      str(_BATCH.value),
      str(_STEPS.value),
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    check=True,
    timeout=1800,
  ).stdout
  result = json.loads(out.strip().splitlines()[-1])
  if not result["finite"]:
    raise AssertionError(f"{setting}: the loss is not finite")
  return result


def main(argv):
  del argv
  runs = collections.defaultdict(list)
  # A file, not `python -c`: AutoGraph reads the loop's source.
  with tempfile.TemporaryDirectory() as tmp:
    script = os.path.join(tmp, "heap_step.py")
    with open(script, "w") as f:
      f.write(_CHILD)
    for _ in range(_REPEATS.value):
      for setting in SETTINGS:
        runs[setting].append(_child(setting, script))
  results = collections.OrderedDict(
    model=_MODEL.value, batch=_BATCH.value, steps=_STEPS.value
  )
  for setting, readings in runs.items():
    ms = [r["ms_per_step"] for r in readings]
    faults = [r["faults_per_step"] for r in readings]
    results[f"{setting}_ms_per_step"] = round(statistics.median(ms), 2)
    results[f"{setting}_ms_per_step_min"] = round(min(ms), 2)
    results[f"{setting}_ms_per_step_max"] = round(max(ms), 2)
    results[f"{setting}_faults_per_step"] = round(statistics.median(faults))
    print(
      f"{setting}: {statistics.median(ms):.2f} ms/step"
      f" ({min(ms):.2f}-{max(ms):.2f}),"
      f" {statistics.median(faults):.0f} minor faults/step"
    )
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
