r"""Where a FedSGC round's time goes beyond FedAvg's: the round's parts alone.

  python tools/sparse_ablation.py --rounds=30

On the `--suite=sparse` setting of `tools/bench.py` (mnist5k, mnist_cnn,
100 iid clients, cohort 10, batch 20, 1 epoch, sparsity 0.8, no
readjustment), calls each of the TFF computations below on the same cohort
and data (one call of each in turn, the order rotating, `--rounds` times
after two warm-up calls; `--rounds` is `tools/bench.py`'s flag, and the
suite's flags `--dataset` / `--model` apply too) and prints each one's median and fastest seconds:

  * `fedavg`: our FedAvg's round (`FederatedAlgorithm.next`: the TFF
    process and the traffic records);
  * `fedsgc_next`: FedSGC's round as the program runs it
    (`FederatedAlgorithm.next`, memory `models`: the driver's work on the
    memory rows included, the state carried from call to call);
  * `fedsgc`: FedSGC's round computation alone, from the initial state;
  * `fedsgc_memory_none`: FedSGC's round without server memory;
  * `sparse_client_work`: the sparse client computation alone (broadcast,
    masked local training, the examples summed);
  * `plain_client_work`: the same clients training the unwrapped model with
    the shared SGD step (`local_training.sgd_step`), alone.

The differences between rows are the cost of each part at this scale
(the README's benchmark section quotes them).
"""

from __future__ import annotations

import collections
import functools
import statistics
import time

from absl import app
import bench  # tools/bench.py: the suites' shared settings.
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def main(argv):
  del argv
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import api  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import cohort_positions  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms import local_training  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.sparse import client_update  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.sparse import fedsgc  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import evolve_config  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top
  from tff_hetero.submodels.masks import SparseModel  # pylint: disable=g-import-not-at-top

  config = bench._config(  # pylint: disable=protected-access
    rounds=1, num_clients=100, min_samples_per_client=1, clients_per_round=10
  )
  experiment = loop.build_experiment(config)
  fed, task = experiment.federated_data, experiment.task
  ids = list(fed.client_ids)
  cohort = ids[:10]
  sparse = evolve_config(
    config,
    algorithm="fedsgc",
    sparsity=0.8,
    readjust_every=0,
    readjust_begin_epoch=1,
    readjust_end_epoch=10**6,
  )
  with runtime.local_execution():
    sgc = fedsgc.build_fedsgc(sparse, task, ids)
    none = fedsgc.build_fedsgc(
      evolve_config(sparse, sgc_memory="none"), task, ids
    )
    state = sgc.initialize()
    data = [
      sgc.client_dataset(
        fed.client_train(c), batch_size=20, local_epochs=1, shuffle_seed=i
      )
      for i, c in enumerate(cohort)
    ]
    epochs = [np.int64(0)] * len(cohort)
    positions = cohort_positions.positions(len(cohort))
    rounds = sgc.rounds
    model_at = tff.FederatedType(rounds.model_type, tff.SERVER)
    epochs_at = tff.FederatedType(np.int64, tff.CLIENTS)
    data_at = tff.FederatedType(rounds.data_type, tff.CLIENTS)

    optimizer = rounds.client_optimizer
    update_fn = client_update.build_client_update
    settings = dict(
      rounds._client_settings,  # pylint: disable=protected-access
      readjust=False,
    )

    @tff.tensorflow.computation(rounds.model_type, np.int64, rounds.data_type)
    def sparse_work(received, clock, client_data):
      update = update_fn(
        functools.partial(rounds.model_fn, masks_in_call=False),
        rounds.layout,
        **settings,
      )
      directions = [tf.zeros(k.shape, tf.int8) for k in rounds.layout.kernels]
      upload, _, _, _ = update(
        optimizer, SparseModel(*received), directions, clock, client_data
      )
      return upload.weight

    @tff.tensorflow.computation(rounds.model_type, np.int64, rounds.data_type)
    def plain_work(received, clock, client_data):
      del clock
      model = task.tff_model_fn()()
      weights = tff.learning.models.ModelWeights.from_model(model)

      @tf.function
      def train(received, client_data):
        for variable, value in zip(weights.trainable, received.trainable):
          variable.assign(value)
        specs = tuple(
          tf.TensorSpec(v.shape, v.dtype) for v in weights.trainable
        )

        def step(carried, batch):
          optimizer_state, examples = carried
          optimizer_state, _, count = local_training.sgd_step(
            model, weights.trainable, optimizer, optimizer_state, batch
          )
          return optimizer_state, examples + count

        _, examples = client_data.reduce(
          (optimizer.initialize(specs), tf.constant(0, tf.int64)), step
        )
        return tf.cast(examples, tf.float32)

      return train(SparseModel(*received), client_data)

    def client_only(work):
      @tff.federated_computation(model_at, epochs_at, data_at)
      def comp(model, client_epochs, client_data):
        return tff.federated_sum(
          tff.federated_map(
            work,
            (tff.federated_broadcast(model), client_epochs, client_data),
          )
        )

      return comp

    sparse_only, plain_only = client_only(sparse_work), client_only(plain_work)
    full, no_memory = (
      sgc.rounds.round_computation(False),
      none.rounds.round_computation(False),
    )
    fedavg = experiment.algorithm
    fedavg_state = fedavg.initialize()
    fedavg_clients = [
      api.ClientRound(
        client_id=c,
        dataset=d,
        num_examples=len(fed.client_train(c)),
        state=None,
      )
      for c, d in zip(cohort, data)
    ]
    carried = {"state": state, "round": 0}

    def fedsgc_next():
      carried["round"] += 1
      clients = [
        api.ClientRound(
          client_id=c,
          dataset=d,
          num_examples=len(fed.client_train(c)),
          state=np.int64(carried["round"] - 1),
        )
        for c, d in zip(cohort, data)
      ]
      carried["state"] = sgc.next(
        carried["state"], carried["round"], clients
      ).state

    parts = collections.OrderedDict(
      fedavg=lambda: fedavg.next(fedavg_state, 1, fedavg_clients),
      fedsgc_next=fedsgc_next,
      fedsgc=lambda: full(
        state.model, state.directions, state.sums, epochs, data, positions
      ),
      fedsgc_memory_none=lambda: no_memory(
        state.model, state.directions, epochs, data, positions
      ),
      sparse_client_work=lambda: sparse_only(state.model, epochs, data),
      plain_client_work=lambda: plain_only(state.model, epochs, data),
    )
    for call in parts.values():
      call()
      call()
    seconds = {name: [] for name in parts}
    names = list(parts)
    for cycle in range(bench._ROUNDS.value):  # pylint: disable=protected-access
      shift = cycle % len(names)
      for name in names[shift:] + names[:shift]:
        start = time.perf_counter()
        parts[name]()
        seconds[name].append(time.perf_counter() - start)
  for name, values in seconds.items():
    print(
      f"{name}: median {statistics.median(values):.4f} s,"
      f" fastest {min(values):.4f} s"
    )


if __name__ == "__main__":
  app.run(main)
