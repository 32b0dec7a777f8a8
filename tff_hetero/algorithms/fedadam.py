"""FedAdam (Reddi et al., 2021, "Adaptive Federated Optimization"): FedAvg's
client step with Adam as the server optimizer, on TFF's own
`build_weighted_fed_avg`.

`build_fedadam_process(model_fn, *, input_spec, client_optimizer_fn,
server_learning_rate, beta_1, beta_2, epsilon, ...)` returns a
`tff.learning.templates.LearningProcess` with the signature of FedAvg's (see
`fedavg.py`); the server state additionally holds Adam's moments. The paper's
`tau` (adaptivity) is Adam's `epsilon` here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms import api
from tff_hetero.algorithms import fedavg
from tff_hetero.algorithms import learning_process
from tff_hetero.settings import AlgorithmSettings
from tff_hetero.settings import positive_float
from tff_hetero.settings import setting


def build_fedadam_process(
  model_fn: Callable[[], tf.keras.Model],
  *,
  input_spec: Any,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  server_learning_rate: float,
  beta_1: float = 0.9,
  beta_2: float = 0.99,
  epsilon: float = 1e-3,
  **fedavg_options,
) -> tff.learning.templates.LearningProcess:
  """FedAvg with server Adam; `fedavg_options` are `build_fedavg_process`'s
  (`model_aggregator`, `client_weighting`, `loss_fn`, `metrics_fn`)."""
  if "server_optimizer_fn" in fedavg_options:
    raise TypeError(
      "build_fedadam_process builds its server optimizer (Adam);"
      " pass server_learning_rate, beta_1, beta_2, epsilon"
    )
  return fedavg.build_fedavg_process(
    model_fn,
    input_spec=input_spec,
    client_optimizer_fn=client_optimizer_fn,
    server_optimizer_fn=tff.learning.optimizers.build_adam(
      learning_rate=server_learning_rate,
      beta_1=beta_1,
      beta_2=beta_2,
      epsilon=epsilon,
    ),
    **fedavg_options,
  )


@attrs.frozen(kw_only=True)
class FedAdamSettings(AlgorithmSettings):
  server_adam_epsilon: float = setting(
    1e-3, "FedAdam server epsilon (tau).", check=positive_float
  )


def build_fedadam(
  config, task: api.Task, client_ids=()
) -> api.FederatedAlgorithm:
  del client_ids  # Every client is alike to fedadam.
  options = learning_process.process_options(config)
  process = build_fedadam_process(
    task.model_fn,
    input_spec=task.element_spec,
    **options,
    server_learning_rate=config.server_lr,
    epsilon=config.settings.server_adam_epsilon,
  )
  return learning_process.LearningProcessAlgorithm.of_options(
    "fedadam", process, task, options
  )
