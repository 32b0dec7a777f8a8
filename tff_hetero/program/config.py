"""`ExperimentConfig`: every setting of a run, typed, validated, serialisable.

Built from absl flags by `pipelines/train.py` (or directly by library users);
`validate()` raises `UsageError` naming the flag and what it accepts. Checks
that need the data (enough samples for the partition) live with the data.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
import json
import math
import os
import re
from typing import Any

import attrs

from tff_hetero.errors import UsageError
from tff_hetero.parsing import parse_number_list

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HOST_PORT_RE = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")

# Settings that may change when a run is resumed: they do not change results.
RESUMABLE_SETTINGS = frozenset(
  {
    "rounds",
    "resume",
    "executor",
    "workers",
    "worker_timeout_s",
    "root_output_dir",
    "progress",
    "checkpoint_every",
    "keep_checkpoints",
  }
)


@attrs.frozen(kw_only=True)
class ExperimentConfig:
  """All settings of one experiment (see `pipelines/train.py` for flags)."""

  algorithm: str = "fedavg"
  dataset: str = "mnist5k"
  data_dir: str | None = None
  model: str = "mnist_cnn"
  partition: str = "dirichlet"
  alpha: float = 0.5
  shards_per_client: int = 2
  min_samples_per_client: int = 8
  val_fraction: float = 0.0
  num_clients: int = 20
  clients_per_round: int = 5
  rounds: int = 10
  local_epochs: int = 1
  batch_size: int = 20
  augment: str = "none"
  client_lr: float = 0.05
  client_momentum: float = 0.0
  client_optimizer: str = "sgd"
  server_lr: float = 1.0
  prox_mu: float | None = None
  server_adam_epsilon: float = 1e-3
  # Model aggregator (`tff_hetero.aggregators.model_aggregators`).
  aggregator: str = "mean"
  clip_norm: float | None = None
  noise_multiplier: float | None = None
  seed: int = 0
  eval_every: int = 1
  checkpoint_every: int = 5
  keep_checkpoints: int = 2
  root_output_dir: str = "runs"
  experiment_name: str = "experiment"
  resume: bool = False
  executor: str = "local"
  workers: tuple[str, ...] = ()
  worker_timeout_s: float = 60.0
  # Device tiers, as the flag strings `tff_hetero.devices.parse_tiers` reads.
  tiers: str = "weak,medium,strong"
  tier_proportions: str = "4:3:3"
  tier_capacities: str = ""
  tier_availability: str = ""
  tier_fluctuation: str = ""
  # Width-heterogeneous algorithms (AdaptiveFL, HeteroFL, Decoupled).
  pool_ratios: str = "0.66:0.4"
  pool_start_indices: str = ""
  adaptivefl_selection: str = "rl"
  prune_min_start_index: int = 1
  heterofl_rates: str = ""
  # Sparse training (FedSGC, FedDST).
  sparsity: float = 0.8
  readjust_every: int = 1
  readjust_end_round: int = 0
  readjust_delta_epochs: int = 0
  readjust_begin_epoch: int = 0
  readjust_end_epoch: int = 0
  prune_alpha: float = 0.2
  congruity_lambda: float = 0.5
  sgc_memory: str = "models"
  prunefl_readjust_every: int = 50
  prunefl_initial_rounds: int = 1
  prunefl_initial_readjust_every: int = 1
  upload_budgets_mib: str = ""
  # FedGKT.
  gkt_server_model: str = "fedgkt_server_resnet55"
  gkt_temperature: float = 3.0
  gkt_client_kd_weight: float = 1.0
  gkt_server_kd_weight: float = 1.0
  gkt_server_epochs: int = 1
  gkt_server_optimizer: str = "adam"
  gkt_server_lr: float = 1e-3
  gkt_transfer: str = "both"
  gkt_mode: str = "sync"
  gkt_kd_t_squared: bool = True
  gkt_lr_patience: int = 10
  gkt_lr_factor: float = 0.1
  gkt_server_order: str = "shuffled"
  progress: bool = True

  @property
  def experiment_dir(self) -> str:
    return os.path.join(self.root_output_dir, self.experiment_name)

  def to_json_dict(self) -> collections.OrderedDict:
    out = collections.OrderedDict()
    for field in attrs.fields(type(self)):
      value = getattr(self, field.name)
      out[field.name] = list(value) if isinstance(value, tuple) else value
    return out

  def fingerprint(self) -> str:
    """The settings that determine results, for checking a resume."""
    settings = {
      k: v
      for k, v in self.to_json_dict().items()
      if k not in RESUMABLE_SETTINGS
    }
    return json.dumps(settings, sort_keys=True)

  def same_results_as(
    self, saved: Mapping[str, Any] | str, ignore: frozenset[str] = frozenset()
  ) -> bool:
    """Whether settings saved earlier (a `fingerprint()` or a report's
    `to_json_dict()`) determine the same results as these.

    `RESUMABLE_SETTINGS` and `ignore` (e.g. settings only other algorithms
    read: `tff_hetero.algorithms.registry.foreign_settings`) are not
    compared; a setting the saved ones lack (added to `ExperimentConfig`
    after they were written) matches when this config leaves it at its
    default.
    """
    if isinstance(saved, str):
      saved = json.loads(saved)
    current = json.loads(json.dumps(self.to_json_dict()))
    defaults = json.loads(json.dumps(type(self)().to_json_dict()))
    return all(
      saved[key] == value if key in saved else value == defaults[key]
      for key, value in current.items()
      if key not in RESUMABLE_SETTINGS and key not in ignore
    )

  def validate(
    self,
    *,
    algorithms,
    datasets,
    models,
    partitions,
    executors,
    augmentations=("none",),
  ) -> "ExperimentConfig":
    """Checks every setting; returns self or raises `UsageError`."""
    _one_of("--algorithm", self.algorithm, algorithms)
    _one_of("--dataset", self.dataset, datasets)
    _one_of("--model", self.model, models)
    _one_of("--partition", self.partition, partitions)
    _one_of("--executor", self.executor, executors)
    _one_of("--augment", self.augment, augmentations)
    for flag, value in (
      ("--num_clients", self.num_clients),
      ("--clients_per_round", self.clients_per_round),
      ("--rounds", self.rounds),
      ("--local_epochs", self.local_epochs),
      ("--batch_size", self.batch_size),
      ("--eval_every", self.eval_every),
      ("--checkpoint_every", self.checkpoint_every),
      ("--shards_per_client", self.shards_per_client),
      ("--min_samples_per_client", self.min_samples_per_client),
      ("--keep_checkpoints", self.keep_checkpoints),
    ):
      if value < 1:
        raise UsageError(flag, f"must be a positive integer, got {value}")
    if self.clients_per_round > self.num_clients:
      raise UsageError(
        "--clients_per_round",
        f"{self.clients_per_round} exceeds --num_clients={self.num_clients}",
      )
    for flag, value in (
      ("--alpha", self.alpha),
      ("--client_lr", self.client_lr),
      ("--server_lr", self.server_lr),
      ("--worker_timeout_s", self.worker_timeout_s),
      ("--server_adam_epsilon", self.server_adam_epsilon),
    ):
      if not (math.isfinite(value) and value > 0):
        raise UsageError(flag, f"must be a finite number > 0, got {value}")
    if not (
      math.isfinite(self.client_momentum) and 0 <= self.client_momentum < 1
    ):
      raise UsageError(
        "--client_momentum", f"must be in [0, 1), got {self.client_momentum}"
      )
    if self.client_optimizer != "sgd" and self.client_momentum:
      raise UsageError(
        "--client_momentum",
        f"only with --client_optimizer=sgd, got"
        f" --client_optimizer={self.client_optimizer}",
      )
    if self.prune_min_start_index < 1:
      raise UsageError(
        "--prune_min_start_index",
        f"must be >= 1 (tau: the first layer is never pruned),"
        f" got {self.prune_min_start_index}",
      )
    if self.prox_mu is not None and not (
      math.isfinite(self.prox_mu) and self.prox_mu >= 0
    ):
      raise UsageError("--prox_mu", f"must be >= 0, got {self.prox_mu}")
    if not (math.isfinite(self.sparsity) and 0 <= self.sparsity < 1):
      raise UsageError("--sparsity", f"must be in [0, 1), got {self.sparsity}")
    for flag, value, zero in (
      ("--readjust_every", self.readjust_every, "never"),
      ("--readjust_end_round", self.readjust_end_round, "no limit"),
      ("--readjust_delta_epochs", self.readjust_delta_epochs, "--local_epochs"),
      ("--readjust_begin_epoch", self.readjust_begin_epoch, "the algorithm's"),
      (
        "--readjust_end_epoch",
        self.readjust_end_epoch,
        "a client's expected total epochs",
      ),
    ):
      if value < 0:
        raise UsageError(flag, f"must be >= 0 (0: {zero}), got {value}")
    for flag, value in (
      ("--prunefl_initial_rounds", self.prunefl_initial_rounds),
      ("--prunefl_initial_readjust_every", self.prunefl_initial_readjust_every),
    ):
      if value < 1:
        raise UsageError(flag, f"must be a positive integer, got {value}")
    if self.prunefl_readjust_every < 0:
      raise UsageError(
        "--prunefl_readjust_every",
        f"must be >= 0 (0: never), got {self.prunefl_readjust_every}",
      )
    for flag, value in (
      ("--prune_alpha", self.prune_alpha),
      ("--congruity_lambda", self.congruity_lambda),
    ):
      if not (math.isfinite(value) and 0 <= value <= 1):
        raise UsageError(flag, f"must be in [0, 1], got {value}")
    for flag, value in (
      ("--gkt_temperature", self.gkt_temperature),
      ("--gkt_server_lr", self.gkt_server_lr),
    ):
      if not (math.isfinite(value) and value > 0):
        raise UsageError(flag, f"must be a finite number > 0, got {value}")
    for flag, value in (
      ("--gkt_client_kd_weight", self.gkt_client_kd_weight),
      ("--gkt_server_kd_weight", self.gkt_server_kd_weight),
    ):
      if not (math.isfinite(value) and value >= 0):
        raise UsageError(flag, f"must be a finite number >= 0, got {value}")
    if self.gkt_server_epochs < 1:
      raise UsageError(
        "--gkt_server_epochs",
        f"must be a positive integer, got {self.gkt_server_epochs}",
      )
    if self.gkt_lr_patience < 0:
      raise UsageError(
        "--gkt_lr_patience",
        f"must be an integer >= 0, got {self.gkt_lr_patience}",
      )
    if not (math.isfinite(self.gkt_lr_factor) and 0 < self.gkt_lr_factor <= 1):
      raise UsageError(
        "--gkt_lr_factor",
        f"must be in (0, 1] (1: never reduce), got {self.gkt_lr_factor}",
      )
    if not 0 <= self.val_fraction < 1:
      raise UsageError(
        "--val_fraction", f"must be in [0, 1), got {self.val_fraction}"
      )
    if self.seed < 0:
      raise UsageError("--seed", f"must be >= 0, got {self.seed}")
    if self.upload_budgets_mib:
      budgets = parse_number_list(
        "--upload_budgets_mib", self.upload_budgets_mib
      )
      if not all(b > 0 for b in budgets):
        raise UsageError(
          "--upload_budgets_mib",
          f"budgets must be > 0 MiB, got {self.upload_budgets_mib}",
        )
    if not _NAME_RE.match(self.experiment_name):
      raise UsageError(
        "--experiment_name",
        f"{self.experiment_name!r} is not a plain name (letters, digits,"
        " '.', '_', '-'; no path separators)",
      )
    if not self.root_output_dir:
      raise UsageError("--root_output_dir", "must not be empty")
    if self.executor == "remote" and not self.workers:
      raise UsageError(
        "--workers", "--executor=remote needs at least one host:port"
      )
    if self.executor == "local" and self.workers:
      raise UsageError("--workers", "only used with --executor=remote")
    for address in self.workers:
      if not _HOST_PORT_RE.match(address):
        raise UsageError("--workers", f"{address!r} is not host:port")
      port = int(address.rsplit(":", 1)[1])
      if not 0 < port < 65536:
        raise UsageError(
          "--workers", f"port {port} of {address!r} is not in 1..65535"
        )
    return self


def _one_of(flag: str, value: str, accepted) -> None:
  accepted = list(accepted)
  if value not in accepted:
    raise UsageError(
      flag, f"unknown value {value!r}; accepted: " + ", ".join(accepted)
    )
