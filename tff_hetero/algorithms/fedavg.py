"""FedAvg (McMahan et al., 2017, "Communication-Efficient Learning of Deep
Networks from Decentralized Data") on TFF's own `build_weighted_fed_avg`.

`build_fedavg_process(task, client_lr, server_lr)` returns the
`tff.learning.templates.LearningProcess`

  initialize: ( -> S@SERVER)
  next:       (<S@SERVER, {<x=float32[?,...], y=int32[?]>*}@CLIENTS> ->
               <state=S@SERVER, metrics=M@SERVER>)

with client SGD at `client_lr`, server SGD at `server_lr` (1.0 is plain
FedAvg), example-weighted mean, and the measuring distributor / aggregator of
`tff_hetero.accounting.tff_measure` (M carries bytes down and up).
"""

from __future__ import annotations

import tensorflow_federated as tff

from tff_hetero.algorithms import api
from tff_hetero.algorithms import learning_process


def build_fedavg_process(task: api.Task, *, client_lr: float,
                         client_momentum: float = 0.0,
                         server_lr: float = 1.0,
                         server_optimizer=None,
                         model_aggregator=None,
                         client_optimizer: str = "sgd"):
  parts = learning_process.measured_parts(task, model_aggregator)
  return tff.learning.algorithms.build_weighted_fed_avg(
      task.tff_model_fn(),
      client_optimizer_fn=learning_process.client_optimizer(
          client_optimizer, client_lr, client_momentum),
      server_optimizer_fn=(server_optimizer or
                           tff.learning.optimizers.build_sgdm(
                               learning_rate=server_lr)),
      model_distributor=parts.model_distributor,
      model_aggregator=parts.model_aggregator,
      metrics_aggregator=parts.metrics_aggregator,
  )


def build_fedavg(config, task: api.Task,
                client_ids=()) -> api.FederatedAlgorithm:
  del client_ids  # Every client is alike to fedavg.
  process = build_fedavg_process(
      task, client_lr=config.client_lr,
      client_momentum=config.client_momentum, server_lr=config.server_lr,
      client_optimizer=config.client_optimizer)
  return learning_process.LearningProcessAlgorithm("fedavg", process, task)
