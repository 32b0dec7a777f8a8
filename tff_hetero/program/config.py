"""`ExperimentConfig`: every setting of a run, typed, validated, serialisable.

The settings every algorithm reads are its fields; the chosen algorithm's
own are its `settings` (the algorithm's `AlgorithmSettings` class, which
checks them when built). `tff_hetero.program.make_config`
builds one from flat settings, `pipelines/train.py` from the flags generated
from these fields. `validate()` raises `UsageError` naming the flag and what
it accepts. Checks that need the data (enough samples for the partition)
live with the data.
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
from tff_hetero.runtime import tls as tls_lib
from tff_hetero.settings import AlgorithmSettings
from tff_hetero.settings import non_negative_int
from tff_hetero.settings import optional
from tff_hetero.settings import setting

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
    "on_worker_loss",
    "tls_cert",
    "tls_key",
    "tls_ca",
    "root_output_dir",
    "progress",
    "checkpoint_every",
    "keep_checkpoints",
    "profile_rounds",
    "client_data",
    "client_data_dir",
  }
)

CLIENT_DATA_MODES = ("sent", "files")


@attrs.frozen(kw_only=True)
class ExperimentConfig:
  """The settings every algorithm reads, plus the chosen algorithm's own
  (`settings`, an instance of the class the algorithm registers; build it
  with `tff_hetero.program.make_config`).

  Each field is a `tff_hetero.settings.setting`: the CLI flag of the same
  name and its help are generated from it.
  """

  algorithm: str = setting("fedavg", "Algorithm to run.")
  dataset: str = setting(
    "mnist5k",
    "Data set: mnist5k (offline default), digits, synthetic, TFDS mnist,"
    " emnist, cifar10, cifar100, glue_cola, glue_mnli, glue_mrpc, glue_qnli,"
    " glue_qqp, glue_rte, glue_sst2, or cinic10 (its release layout) (need"
    " --data_dir).",
  )
  data_dir: str | None = setting(
    None,
    "Root of prepared TFDS data, or the directory holding cinic10/.",
    kind=str,
  )
  model: str = setting("mnist_cnn", "Model registry name.")
  partition: str = setting("dirichlet", "Partition: iid, dirichlet, shards.")
  alpha: float = setting(0.5, "Dirichlet concentration (> 0).")
  shards_per_client: int = setting(
    2, "Label shards per client (--partition=shards)."
  )
  min_samples_per_client: int = setting(
    8, "Fewest training samples per client."
  )
  val_fraction: float = setting(
    0.0, "Per-client validation fraction, in [0, 1)."
  )
  num_clients: int = setting(20, "Clients in all.")
  clients_per_round: int = setting(5, "Clients per round.")
  rounds: int = setting(10, "Rounds to train.")
  local_epochs: int = setting(1, "Local epochs per round.")
  batch_size: int = setting(20, "Client batch size.")
  augment: str = setting(
    "none",
    "Augmentation of training batches: none, crop (4-pixel padding and a"
    " random crop), crop_flip (also a random horizontal flip; the papers'"
    " CIFAR setting). Seeded per client batch.",
  )
  client_lr: float = setting(0.05, "Client learning rate.")
  client_momentum: float = setting(0.0, "Client SGD momentum, in [0, 1).")
  client_optimizer: str = setting(
    "sgd",
    "Client optimizer: sgd, or adam (FedAvg, FedProx and the sparse-training"
    " algorithms; FedSGC's CIFAR-10 setting).",
  )
  server_lr: float = setting(1.0, "Server learning rate.")
  # Model aggregator (`tff_hetero.aggregators.model_aggregators`).
  aggregator: str = setting(
    "mean",
    "Model aggregator (FedAvg, FedProx, FedAdam, and masked for AdaptiveFL,"
    " HeteroFL, All-Large, Decoupled): mean (example-weighted),"
    " clip (each update clipped to --clip_norm, then the mean), dp (DP-FedAvg"
    " Gaussian sum: clipped to --clip_norm, noise --noise_multiplier x"
    " --clip_norm, clients weighted uniformly; no epsilon is reported).",
  )
  clip_norm: float | None = setting(
    None, "L2 bound of each client update (--aggregator=clip|dp).", kind=float
  )
  noise_multiplier: float | None = setting(
    None,
    "Gaussian noise std over --clip_norm (--aggregator=dp), >= 0.",
    kind=float,
  )
  dp_noise_seed: int | None = setting(
    None,
    "Seed of the DP noise of the width algorithms (--aggregator=dp). Unset:"
    " a secret seed drawn from the OS when the run starts, kept only in its"
    " checkpoints (none in the report); set it for a reproducible simulation"
    " whose noise anyone with the report can recompute. (FedAvg, FedProx and"
    " FedAdam use TFF's DP factory, whose noise is unseeded.)",
    kind=int,
    check=optional(non_negative_int()),
  )
  seed: int = setting(
    0, "Seed of model init, partition, tiers, sampling and shuffles."
  )
  eval_every: int = setting(1, "Evaluate every N rounds.")
  local_evaluation: bool = setting(
    False,
    "Also evaluate the first evaluated model on every client's validation"
    " split (--val_fraction) and report the mean as local_accuracy (SPATL's"
    " metric, which SPATL always reports); the per-client values go to"
    " client_accuracy.json.",
  )
  checkpoint_every: int = setting(
    5, "Checkpoint every N rounds (and the last)."
  )
  keep_checkpoints: int = setting(2, "Newest checkpoints kept.")
  root_output_dir: str = setting("runs", "Output root.")
  experiment_name: str = setting(
    "experiment", "Run directory name under --root_output_dir."
  )
  resume: bool = setting(False, "Continue from the newest checkpoint.")
  executor: str = setting("local", "local (own TFF worker) or remote.")
  workers: tuple[str, ...] = setting(
    (), "host:port of TFF workers (--executor=remote)."
  )
  worker_timeout_s: float = setting(
    60.0, "Seconds to wait for an unreachable or dead worker before failing."
  )
  on_worker_loss: str = setting(
    "stop",
    "What a remote run does when a worker is lost: stop (one line; continue"
    " with --resume from the last checkpoint) or redistribute (run the round"
    " again on the workers that answer; a worker that answers again is used"
    " again).",
  )
  client_data: str = setting(
    "sent",
    "How the sampled clients' samples reach the workers: sent (each round's"
    " datasets carry their samples) or files (each client's training arrays"
    " written once, under --client_data_dir, for the workers to read; a"
    " round sends each client's sample order). Results are the same."
    " Always sent: batches augmented with --augment, FedGKT's indexed"
    " batches and validation splits.",
  )
  client_data_dir: str = setting(
    "",
    "Directory under which --client_data=files writes the clients' arrays"
    " (a subdirectory, removed at the end): the system's temporary directory"
    " by default; with remote workers, one every worker reads at the same"
    " path.",
  )
  tls_cert: str = setting(
    "",
    "PEM certificate this driver presents to its workers (mutual TLS, with"
    " --tls_key and --tls_ca; --executor=remote).",
  )
  tls_key: str = setting("", "PEM private key of --tls_cert.")
  tls_ca: str = setting(
    "", "PEM CA certificate(s) that signed the workers' certificates."
  )
  # Device tiers, as the flag strings `tff_hetero.devices.parse_tiers` reads.
  tiers: str = setting(
    "weak,medium,strong", "Device tier names, comma-separated."
  )
  tier_proportions: str = setting("4:3:3", "Tier proportions, colon-separated.")
  tier_capacities: str = setting(
    "",
    "Tier capacities, one per tier, colon-separated: a fraction of the full"
    " model in (0, 1] or a whole number of trainable parameters > 1 (default"
    " 0.25:0.5:1 for weak:medium:strong). The same for every algorithm.",
  )
  tier_availability: str = setting(
    "", "Per-tier probability of being available in a round (default 1)."
  )
  tier_fluctuation: str = setting(
    "",
    "Relative std of seeded per-round capacity fluctuation: one value or one"
    " per tier, colon-separated (default 0).",
  )
  upload_budgets_mib: str = setting(
    "",
    "Report the best accuracy reached within these cumulative uploads (MiB,"
    " colon-separated); default 1/8, 1/4, 1/2 and all of the run's upload.",
  )
  progress: bool = setting(True, "Show a progress bar.")
  profile_rounds: int = setting(
    0,
    "Write a TensorBoard profiler trace of this many rounds, from the second"
    " round the run executes, to <experiment>/tensorboard (the driver"
    " process: the TFF worker's share is the wait in TFF's call).",
    check=non_negative_int("no trace"),
  )
  # The chosen algorithm's own settings (not a flag: its fields are).
  settings: AlgorithmSettings = attrs.field(factory=AlgorithmSettings)

  @property
  def experiment_dir(self) -> str:
    return os.path.join(self.root_output_dir, self.experiment_name)

  def to_json_dict(self) -> collections.OrderedDict:
    """Every setting by flag name: the common ones, then the algorithm's."""
    out = collections.OrderedDict()
    for field in attrs.fields(type(self)):
      if field.name != "settings":
        out[field.name] = getattr(self, field.name)
    out.update(self.settings.to_json_dict())
    return collections.OrderedDict(
      (k, list(v) if isinstance(v, tuple) else v) for k, v in out.items()
    )

  def fingerprint(self) -> str:
    """The settings that determine results, for checking a resume."""
    settings = {
      k: v
      for k, v in self.to_json_dict().items()
      if k not in RESUMABLE_SETTINGS
    }
    return json.dumps(settings, sort_keys=True)

  def same_results_as(self, saved: Mapping[str, Any] | str) -> bool:
    """Whether settings saved earlier (a `fingerprint()` or a report's
    `to_json_dict()`) determine the same results as these.

    Only this config's settings are compared (the common ones and its
    algorithm's), less `RESUMABLE_SETTINGS`; settings the saved ones hold
    beyond those (another algorithm's, as written before each algorithm
    had its own settings class) do not change this algorithm's results. A
    setting the saved ones lack (added after they were written) matches
    when this config leaves it at its default.
    """
    if isinstance(saved, str):
      saved = json.loads(saved)
    current = json.loads(json.dumps(self.to_json_dict()))
    defaults = type(self)(settings=type(self.settings)()).to_json_dict()
    defaults = json.loads(json.dumps(defaults))
    return all(
      saved[key] == value if key in saved else value == defaults[key]
      for key, value in current.items()
      if key not in RESUMABLE_SETTINGS
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
    _one_of("--on_worker_loss", self.on_worker_loss, ("stop", "redistribute"))
    _one_of("--augment", self.augment, augmentations)
    _one_of("--client_data", self.client_data, CLIENT_DATA_MODES)
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
    if not 0 <= self.val_fraction < 1:
      raise UsageError(
        "--val_fraction", f"must be in [0, 1), got {self.val_fraction}"
      )
    if self.local_evaluation and self.val_fraction <= 0:
      raise UsageError(
        "--local_evaluation",
        "needs client validation splits: give --val_fraction in (0, 1)",
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
    if self.client_data_dir and self.client_data != "files":
      raise UsageError(
        "--client_data_dir", "only used with --client_data=files"
      )
    if self.client_data_dir and not (
      os.path.isdir(self.client_data_dir)
      and os.access(self.client_data_dir, os.W_OK)
    ):
      raise UsageError(
        "--client_data_dir",
        f"{self.client_data_dir!r} is not a directory this user can write to",
      )
    if (
      self.client_data == "files" and self.workers and not self.client_data_dir
    ):
      raise UsageError(
        "--client_data_dir",
        "--client_data=files with --workers needs a directory every worker"
        " reads at the same path",
      )
    given = [
      f"--{name}"
      for name in ("tls_cert", "tls_key", "tls_ca")
      if getattr(self, name)
    ]
    if given and not self.workers:
      raise UsageError(
        given[0], "mutual TLS is for --executor=remote --workers=..."
      )
    self.tls()  # Checks the files.
    return self

  def tls(self):
    """The driver's `runtime.tls.TlsConfig`, or None without the flags."""
    try:
      return tls_lib.TlsConfig.from_flags(
        self.tls_cert, self.tls_key, self.tls_ca
      )
    except ValueError as e:
      flag, _, message = str(e).partition(": ")
      raise UsageError(flag, message) from None


def _one_of(flag: str, value: str, accepted) -> None:
  accepted = list(accepted)
  if value not in accepted:
    raise UsageError(
      flag, f"unknown value {value!r}; accepted: " + ", ".join(accepted)
    )
