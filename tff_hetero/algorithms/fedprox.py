"""FedProx (Li et al., 2020, "Federated Optimization in Heterogeneous
Networks") on TFF's own `build_weighted_fed_prox`.

`build_fedprox_process(task, client_lr, server_lr, prox_mu)` returns a
`tff.learning.templates.LearningProcess` with the signature of FedAvg's
(see `fedavg.py`); each client minimises its loss plus
`prox_mu / 2 * ||w - w_global||^2`.
"""

from __future__ import annotations

import tensorflow_federated as tff

from tff_hetero.algorithms import api
from tff_hetero.algorithms import learning_process


def build_fedprox_process(task: api.Task, *, client_lr: float,
                          server_lr: float, prox_mu: float):
  parts = learning_process.measured_parts(task)
  return tff.learning.algorithms.build_weighted_fed_prox(
      task.tff_model_fn(),
      proximal_strength=prox_mu,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(
          learning_rate=client_lr),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(
          learning_rate=server_lr),
      model_distributor=parts.model_distributor,
      model_aggregator=parts.model_aggregator,
      metrics_aggregator=parts.metrics_aggregator,
  )


def build_fedprox(config, task: api.Task) -> api.FederatedAlgorithm:
  process = build_fedprox_process(
      task, client_lr=config.client_lr, server_lr=config.server_lr,
      prox_mu=config.prox_mu)
  return learning_process.LearningProcessAlgorithm("fedprox", process, task)
