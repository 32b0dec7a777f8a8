r"""Client work on the TFF worker: `Dataset.reduce` against an iterator loop.

  python tools/client_loop_ablation.py [--rounds=5]

Builds the compute-bound cohort of `tools/bench.py --suite=base` (mnist5k,
`mnist_cnn_feddst`, 10 IID clients of 200 examples, 5 epochs, batch 50: 20
SGD steps each) and times, on one local TFF worker, a federated computation
that broadcasts the initial weights and runs every client's local SGD (0.05)
in one of four ways:

  * loop `reduce` (`Dataset.reduce`, TFF's default client loop) or
    `iterator` (`local_training.fold_batches`, TFF's `DATASET_ITERATOR`);
  * step `variable_model` (`local_training.sgd_step` on TFF's own
    `tff.learning.models.VariableModel` of the task's model, whose
    `forward_pass` calls the Keras model through a nested `tf.function`,
    with TFF's SGD), `plain_variable_model` (the same on our
    `VariableModel`, whose `forward_pass` is traced into the step,
    `model_fns`) or `keras` (the Keras model and loss called directly,
    `v.assign_sub(lr * g)`).

For each it prints the median, fastest and slowest of `--rounds` rounds
after one warm-up, and `max_abs_diff`: the largest difference between
client 0's trained weights and the same 20 steps run in eager TensorFlow in
this process. The last line is one JSON object with all of them.
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
from tff_hetero.runtime import heap  # noqa: E402

heap.configure_process_heap()
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds per variant.")

LR = 0.05
LOOPS = ("reduce", "iterator")
STEPS = ("variable_model", "plain_variable_model", "keras")


def _cohort():
  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import make_config  # pylint: disable=g-import-not-at-top

  config = make_config(
    algorithm="fedavg",
    dataset="mnist5k",
    model="mnist_cnn_feddst",
    partition="iid",
    num_clients=20,
    clients_per_round=10,
    local_epochs=5,
    batch_size=50,
    client_lr=LR,
    seed=0,
    rounds=1,
    progress=False,
  )
  experiment = loop.build_experiment(config)
  fed, task = experiment.federated_data, experiment.task
  datasets = [
    data_lib.make_client_dataset(
      fed.client_train(cid), batch_size=50, local_epochs=5, shuffle_seed=i
    )
    for i, cid in enumerate(list(fed.client_ids)[:10])
  ]
  return task, datasets


def _round_computation(task, datasets, loop: str, step: str):
  from tff_hetero.algorithms import local_training  # pylint: disable=g-import-not-at-top

  # The broadcast weights are the trainable ones: the model's only ones
  # (mnist_cnn_feddst has no non-trainable weights).
  initial = [v.numpy() for v in task.model_fn().trainable_variables]
  weights_type = [tff.TensorType(w.dtype, w.shape) for w in initial]
  data_type = tff.SequenceType(
    tff.types.tensorflow_to_type(datasets[0].element_spec)
  )
  tff_model_fn = task.tff_model_fn(
    plain_graph_methods=step == "plain_variable_model"
  )
  sgd = tff.learning.optimizers.build_sgdm(LR)

  @tff.tensorflow.computation(weights_type, data_type)
  def client(weights, data):
    if step.endswith("variable_model"):
      model = tff_model_fn()
    else:
      model = task.model_fn()  # The Keras model itself.
    trainable = model.trainable_variables
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)

    @tf.function
    def train(weights, data):
      for v, w in zip(trainable, weights):
        v.assign(w)

      def fn(optimizer_state, batch):
        if step.endswith("variable_model"):
          optimizer_state, _, _ = local_training.sgd_step(
            model, trainable, sgd, optimizer_state, batch
          )
          return optimizer_state
        with tf.GradientTape() as tape:
          loss = loss_fn(batch["y"], model(batch["x"], training=True))
        for v, g in zip(trainable, tape.gradient(loss, trainable)):
          v.assign_sub(LR * g)
        return optimizer_state

      if loop == "reduce":
        data.reduce(sgd.initialize(specs), fn)
      else:
        local_training.fold_batches(data, sgd.initialize(specs), fn)
      return [v.read_value() for v in trainable]

    return train(weights, data)

  @tff.federated_computation(
    tff.FederatedType(weights_type, tff.SERVER),
    tff.FederatedType(data_type, tff.CLIENTS),
  )
  def round_fn(weights, data):
    return tff.federated_map(client, (tff.federated_broadcast(weights), data))

  return round_fn, initial


def _eager_reference(task, initial, dataset):
  model = task.model_fn()
  for v, w in zip(model.trainable_variables, initial):
    v.assign(w)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  for batch in dataset:
    with tf.GradientTape() as tape:
      loss = loss_fn(batch["y"], model(batch["x"], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    for v, g in zip(model.trainable_variables, grads):
      v.assign_sub(LR * g)
  return [v.numpy() for v in model.trainable_variables]


def main(argv):
  del argv
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top

  task, datasets = _cohort()
  results = collections.OrderedDict()
  with runtime.local_execution():
    for loop in LOOPS:
      for step in STEPS:
        round_fn, initial = _round_computation(task, datasets, loop, step)
        trained = round_fn(initial, datasets)  # Warm-up.
        times = []
        for _ in range(_ROUNDS.value):
          start = time.perf_counter()
          round_fn(initial, datasets)
          times.append(time.perf_counter() - start)
        reference = _eager_reference(task, initial, datasets[0])
        name = f"{loop}_{step}"
        results[f"{name}_round_s"] = round(statistics.median(times), 3)
        results[f"{name}_round_s_min"] = round(min(times), 3)
        results[f"{name}_round_s_max"] = round(max(times), 3)
        results[f"{name}_max_abs_diff"] = float(
          max(
            np.max(np.abs(np.asarray(a) - b))
            for a, b in zip(trained[0], reference)
          )
        )
        print(name, {k: v for k, v in results.items() if k.startswith(name)})
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
