"""FedAdam (Reddi et al., 2021, "Adaptive Federated Optimization"): FedAvg's
client step with Adam as the server optimizer, on TFF's own
`build_weighted_fed_avg`.

`build_fedadam_process(task, client_lr, server_lr, beta_1, beta_2, epsilon)`
returns a `tff.learning.templates.LearningProcess` with the signature of
FedAvg's (see `fedavg.py`); the server state additionally holds Adam's moments.
The paper's `tau` (adaptivity) is Adam's `epsilon` here.
"""

from __future__ import annotations

import tensorflow_federated as tff

from tff_hetero.algorithms import api
from tff_hetero.algorithms import fedavg
from tff_hetero.algorithms import learning_process


def build_fedadam_process(task: api.Task, *, client_lr: float,
                          server_lr: float, client_momentum: float = 0.0, beta_1: float = 0.9,
                          beta_2: float = 0.99, epsilon: float = 1e-3):
  return fedavg.build_fedavg_process(
      task, client_lr=client_lr, client_momentum=client_momentum,
      server_optimizer=tff.learning.optimizers.build_adam(
          learning_rate=server_lr, beta_1=beta_1, beta_2=beta_2,
          epsilon=epsilon))


def build_fedadam(config, task: api.Task,
                  client_ids=()) -> api.FederatedAlgorithm:
  del client_ids  # Every client is alike to fedadam.
  process = build_fedadam_process(
      task, client_lr=config.client_lr, server_lr=config.server_lr,
      client_momentum=config.client_momentum, epsilon=config.server_adam_epsilon)
  return learning_process.LearningProcessAlgorithm("fedadam", process, task)
