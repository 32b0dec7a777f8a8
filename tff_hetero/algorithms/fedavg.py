"""FedAvg (McMahan et al., 2017, "Communication-Efficient Learning of Deep
Networks from Decentralized Data") on TFF's own `build_weighted_fed_avg`.

`build_fedavg_process(model_fn, *, input_spec, client_optimizer_fn, ...)`
takes a no-arg Keras factory (logits out), the spec of one batch of client
data, and TFF's optimizers and aggregation factories, and returns the
`tff.learning.templates.LearningProcess`

  initialize: ( -> S@SERVER)
  next:       (<S@SERVER, {<x=float32[?,...], y=int32[?]>*}@CLIENTS> ->
               <state=S@SERVER, metrics=M@SERVER>)

with the measuring distributor / aggregator of
`tff_hetero.accounting.tff_measure` around `model_aggregator`, so M carries
the bytes that crossed the network:

  M.distributor = <bytes_down=int64, clients=int64>
  M.aggregator  = <inner=<model_aggregator's measurements>, bytes_up, clients>
  M.client_work.train = <metrics=<loss, accuracy, num_examples, ...>,
                         uploaded_bytes=int64>

The clients loop over their batches with TFF's `DATASET_ITERATOR` loop
instead of its default `Dataset.reduce`: the same steps, in a while loop
over the dataset's iterator instead of a tf.data function
(`local_training.fold_batches` says why; TFF's builder alone on
`mnist_cnn_feddst`, 10 clients x 20 steps: 4.78 s per round with `reduce`,
3.02 s with this loop, `tools/bench.py --suite=base` at 13c8b8f).

Server SGD at learning rate 1 (TFF's default server optimizer is SGD at 1.0)
makes the new global model the weighted mean of the client models: plain
FedAvg.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms import api
from tff_hetero.algorithms import learning_process


def build_fedavg_process(
  model_fn: Callable[[], tf.keras.Model],
  *,
  input_spec: Any,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  model_aggregator=None,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
  metrics_fn: Optional[Callable[[], list]] = None,
) -> tff.learning.templates.LearningProcess:
  """FedAvg as a measured `LearningProcess` (module docstring).

  Args:
    model_fn: No-arg callable returning a fresh `tf.keras.Model` (identically
      initialised on every call: seed it).
    input_spec: Spec of one batch of client data, e.g.
      `OrderedDict(x=tf.TensorSpec([None, 28, 28, 1]), y=tf.TensorSpec([None],
      tf.int32))`.
    client_optimizer_fn: The clients' `tff.learning.optimizers.Optimizer`.
    server_optimizer_fn: The server's; default SGD at learning rate 1.
    model_aggregator: A `tff.aggregators` factory for the updates (default
      `MeanFactory`); an unweighted one (e.g. DP) needs UNIFORM weighting.
    client_weighting: `tff.learning.ClientWeighting`.
    loss_fn: No-arg callable returning the Keras loss (default: sparse
      cross-entropy on logits).
    metrics_fn: No-arg callable returning a list of Keras metrics (default:
      sparse categorical accuracy).
  """
  tff_model_fn, server_optimizer_fn, parts = learning_process.builder_parts(
    model_fn,
    input_spec=input_spec,
    loss_fn=loss_fn,
    metrics_fn=metrics_fn,
    client_optimizer_fn=client_optimizer_fn,
    server_optimizer_fn=server_optimizer_fn,
    model_aggregator=model_aggregator,
    client_weighting=client_weighting,
  )
  return tff.learning.algorithms.build_weighted_fed_avg(
    tff_model_fn,
    client_optimizer_fn=client_optimizer_fn,
    server_optimizer_fn=server_optimizer_fn,
    client_weighting=client_weighting,
    model_distributor=parts.model_distributor,
    model_aggregator=parts.model_aggregator,
    metrics_aggregator=parts.metrics_aggregator,
    loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )


def build_fedavg(
  config, task: api.Task, client_ids=()
) -> api.FederatedAlgorithm:
  del client_ids  # Every client is alike to fedavg.
  options = learning_process.process_options(config)
  process = build_fedavg_process(
    task.model_fn,
    input_spec=task.element_spec,
    **options,
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(
      learning_rate=config.server_lr
    ),
  )
  return learning_process.LearningProcessAlgorithm.of_options(
    "fedavg", process, task, options
  )
