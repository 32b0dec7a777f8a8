r"""Train one federated experiment.

  python -m pipelines.train --algorithm=fedavg --dataset=mnist5k \
      --model=mnist_cnn --num_clients=20 --clients_per_round=5 --rounds=10

Writes `<root_output_dir>/<experiment_name>/` (metrics.csv, tensorboard/,
report.json, plots, checkpoints/). Bad flags exit with status 2 and one line
naming the flag; a diverged run exits with status 3 naming the round; an
interrupted run resumes with `--resume`.
"""

from __future__ import annotations

import sys

from absl import flags

from pipelines import _cli

_A = flags.DEFINE_string("algorithm", "fedavg", "Algorithm to run.")
_DATASET = flags.DEFINE_string(
  "dataset",
  "mnist5k",
  "Data set: mnist5k (offline default), digits, synthetic, TFDS mnist,"
  " emnist, cifar10, cifar100, or cinic10 (its release layout) (need"
  " --data_dir).",
)
_DATA_DIR = flags.DEFINE_string(
  "data_dir",
  None,
  "Root of prepared TFDS data, or the directory holding cinic10/.",
)
_MODEL = flags.DEFINE_string("model", "mnist_cnn", "Model registry name.")
_AUGMENT = flags.DEFINE_string(
  "augment",
  "none",
  "Augmentation of training batches: none, crop (4-pixel padding and a"
  " random crop), crop_flip (also a random horizontal flip; the papers'"
  " CIFAR setting). Seeded per client batch.",
)
_PARTITION = flags.DEFINE_string(
  "partition", "dirichlet", "Partition: iid, dirichlet, shards."
)
_ALPHA = flags.DEFINE_float("alpha", 0.5, "Dirichlet concentration (> 0).")
_SHARDS = flags.DEFINE_integer(
  "shards_per_client", 2, "Label shards per client (--partition=shards)."
)
_MIN_SAMPLES = flags.DEFINE_integer(
  "min_samples_per_client", 8, "Fewest training samples per client."
)
_VAL_FRACTION = flags.DEFINE_float(
  "val_fraction", 0.0, "Per-client validation fraction, in [0, 1)."
)
_NUM_CLIENTS = flags.DEFINE_integer("num_clients", 20, "Clients in all.")
_CPR = flags.DEFINE_integer("clients_per_round", 5, "Clients per round.")
_ROUNDS = flags.DEFINE_integer("rounds", 10, "Rounds to train.")
_EPOCHS = flags.DEFINE_integer("local_epochs", 1, "Local epochs per round.")
_BATCH = flags.DEFINE_integer("batch_size", 20, "Client batch size.")
_CLIENT_LR = flags.DEFINE_float("client_lr", 0.05, "Client learning rate.")
_SERVER_LR = flags.DEFINE_float("server_lr", 1.0, "Server learning rate.")
_PROX_MU = flags.DEFINE_float(
  "prox_mu",
  None,
  "Proximal strength (FedProx: default 0.01; FedDST/FedSGC: default 0).",
)
_ADAM_EPS = flags.DEFINE_float(
  "server_adam_epsilon", 1e-3, "FedAdam server epsilon (tau)."
)
flags.DEFINE_string(
  "aggregator",
  "mean",
  "Model aggregator (FedAvg, FedProx, FedAdam, and masked for AdaptiveFL,"
  " HeteroFL, All-Large, Decoupled): mean (example-weighted),"
  " clip (each update clipped to --clip_norm, then the mean), dp (DP-FedAvg"
  " Gaussian sum: clipped to --clip_norm, noise --noise_multiplier x"
  " --clip_norm, clients weighted uniformly; no epsilon is reported).",
)
flags.DEFINE_float(
  "clip_norm", None, "L2 bound of each client update (--aggregator=clip|dp)."
)
flags.DEFINE_float(
  "noise_multiplier",
  None,
  "Gaussian noise std over --clip_norm (--aggregator=dp), >= 0.",
)
_SEED = flags.DEFINE_integer(
  "seed", 0, "Seed of model init, partition, tiers, sampling and shuffles."
)
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 1, "Evaluate every N rounds.")
_CKPT_EVERY = flags.DEFINE_integer(
  "checkpoint_every", 5, "Checkpoint every N rounds (and the last)."
)
_ROOT = flags.DEFINE_string("root_output_dir", "runs", "Output root.")
_NAME = flags.DEFINE_string(
  "experiment_name", "experiment", "Run directory name under --root_output_dir."
)
_RESUME = flags.DEFINE_bool(
  "resume", False, "Continue from the newest checkpoint."
)
_EXECUTOR = flags.DEFINE_string(
  "executor", "local", "local (own TFF worker) or remote."
)
_WORKERS = flags.DEFINE_list(
  "workers", [], "host:port of TFF workers (--executor=remote)."
)
_WORKER_TIMEOUT = flags.DEFINE_float(
  "worker_timeout_s",
  60.0,
  "Seconds to wait for an unreachable or dead worker before failing.",
)
_TIERS = flags.DEFINE_string(
  "tiers", "weak,medium,strong", "Device tier names, comma-separated."
)
_TIER_PROPORTIONS = flags.DEFINE_string(
  "tier_proportions", "4:3:3", "Tier proportions, colon-separated."
)
_TIER_CAPACITIES = flags.DEFINE_string(
  "tier_capacities",
  "",
  "Tier capacities, one per tier, colon-separated: a fraction of the full"
  " model in (0, 1] or a whole number of trainable parameters > 1 (default"
  " 0.25:0.5:1 for weak:medium:strong). The same for every algorithm.",
)
_TIER_AVAILABILITY = flags.DEFINE_string(
  "tier_availability",
  "",
  "Per-tier probability of being available in a round (default 1).",
)
_FLUCTUATION = flags.DEFINE_string(
  "tier_fluctuation",
  "",
  "Relative std of seeded per-round capacity fluctuation: one value or one"
  " per tier, colon-separated (default 0).",
)
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
_CLIENT_MOMENTUM = flags.DEFINE_float(
  "client_momentum", 0.0, "Client SGD momentum, in [0, 1)."
)
_CLIENT_OPTIMIZER = flags.DEFINE_string(
  "client_optimizer",
  "sgd",
  "Client optimizer: sgd, or adam (FedAvg, FedProx and the sparse-training"
  " algorithms; FedSGC's CIFAR-10 setting).",
)
_POOL_RATIOS = flags.DEFINE_string(
  "pool_ratios",
  "0.66:0.4",
  "AdaptiveFL/Decoupled pool: width ratios of the M and S levels, M:S.",
)
_POOL_STARTS = flags.DEFINE_string(
  "pool_start_indices",
  "",
  "AdaptiveFL pool: start indices I_1:I_2:...:I_p, decreasing (default:"
  " the model's, e.g. 8:6:4 for vgg16); one index is the coarse pool.",
)
_SELECTION = flags.DEFINE_string(
  "adaptivefl_selection",
  "rl",
  "AdaptiveFL client selection: rl (the paper's), greedy, random,"
  " curiosity, resource.",
)
_MIN_START = flags.DEFINE_integer(
  "prune_min_start_index",
  1,
  "AdaptiveFL: tau, the smallest start index I of the pool (>= 1: the"
  " first layer is never pruned).",
)
_SPARSITY = flags.DEFINE_float(
  "sparsity", 0.8, "FedSGC/FedDST: fraction of kernel weights masked."
)
_READJUST_EVERY = flags.DEFINE_integer(
  "readjust_every",
  1,
  "FedSGC/FedDST: the server requests mask readjustment on rounds 1, 1+N,"
  " 1+2N, ... (0: never); requested clients readjust on their epoch"
  " schedule.",
)
_READJUST_END = flags.DEFINE_integer(
  "readjust_end_round",
  0,
  "FedSGC/FedDST: last round the server requests readjustment (0: no limit).",
)
_READJUST_DELTA = flags.DEFINE_integer(
  "readjust_delta_epochs",
  0,
  "FedSGC/FedDST: a client readjusts every N of its cumulative training"
  " epochs (0: --local_epochs).",
)
_READJUST_BEGIN = flags.DEFINE_integer(
  "readjust_begin_epoch",
  0,
  "FedSGC/FedDST: the first cumulative epoch after which a client"
  " readjusts (0: FedSGC ceil(E/2), mid-round; FedDST E, end of local"
  " training).",
)
_READJUST_END_EPOCH = flags.DEFINE_integer(
  "readjust_end_epoch",
  0,
  "FedSGC/FedDST: E_end, no readjustment from this cumulative epoch on; the"
  " cosine prune fraction reaches 0 there (0: a client's expected total"
  " epochs, local_epochs x rounds x clients_per_round / num_clients; give"
  " it explicitly to resume with another --rounds).",
)
_PRUNE_ALPHA = flags.DEFINE_float(
  "prune_alpha",
  0.2,
  "FedSGC/FedDST: initial prune fraction of the cosine schedule.",
)
_CONGRUITY_LAMBDA = flags.DEFINE_float(
  "congruity_lambda",
  0.5,
  "FedSGC: share of each prune/grow guided by gradient congruity.",
)
_SGC_MEMORY = flags.DEFINE_string(
  "sgc_memory",
  "models",
  "FedSGC: what the server remembers of clients absent this round: models"
  " (their last uploaded values and masks, the paper's literal reading),"
  " updates (their last change to the model they were sent), none (this"
  " round's uploads only, as FedDST).",
)
_PRUNEFL_EVERY = flags.DEFINE_integer(
  "prunefl_readjust_every",
  50,
  "PruneFL: the server reconfigures the mask from the clients' squared"
  " gradients every N rounds (0: never).",
)
_PRUNEFL_INITIAL = flags.DEFINE_integer(
  "prunefl_initial_rounds",
  1,
  "PruneFL: local rounds of the initial pruning on the first client.",
)
_PRUNEFL_INITIAL_EVERY = flags.DEFINE_integer(
  "prunefl_initial_readjust_every",
  1,
  "PruneFL: the initial pruning reconfigures the mask every N local"
  " rounds (and after the last).",
)
_UPLOAD_BUDGETS = flags.DEFINE_string(
  "upload_budgets_mib",
  "",
  "Report the best accuracy reached within these cumulative uploads (MiB,"
  " colon-separated); default 1/8, 1/4, 1/2 and all of the run's upload.",
)
_GKT_SERVER_MODEL = flags.DEFINE_string(
  "gkt_server_model",
  "fedgkt_server_resnet55",
  "FedGKT: the server model (fedgkt_server_resnet19 | _resnet55 |"
  " _resnet109 | _resnet55_bottleneck | _resnet109_bottleneck); --model is"
  " the edge model (fedgkt_edge_resnet4 | 6 | 8 | 8_bottleneck).",
)
_GKT_TEMPERATURE = flags.DEFINE_float(
  "gkt_temperature", 3.0, "FedGKT: distillation temperature T."
)
_GKT_CLIENT_KD = flags.DEFINE_float(
  "gkt_client_kd_weight",
  1.0,
  "FedGKT: weight of the server-to-edge KD term in the client loss.",
)
_GKT_SERVER_KD = flags.DEFINE_float(
  "gkt_server_kd_weight",
  1.0,
  "FedGKT: weight of the edge-to-server KD term in the server loss.",
)
_GKT_SERVER_EPOCHS = flags.DEFINE_integer(
  "gkt_server_epochs",
  1,
  "FedGKT: server epochs over each round's features (client epochs:"
  " --local_epochs).",
)
_GKT_SERVER_OPTIMIZER = flags.DEFINE_string(
  "gkt_server_optimizer",
  "adam",
  "FedGKT: server optimizer, adam | sgd (momentum 0.9).",
)
_GKT_SERVER_LR = flags.DEFINE_float(
  "gkt_server_lr", 1e-3, "FedGKT: server learning rate."
)
_GKT_TRANSFER = flags.DEFINE_string(
  "gkt_transfer",
  "both",
  "FedGKT: knowledge transfer, both | server_to_edge | none (Table 2).",
)
_GKT_MODE = flags.DEFINE_string(
  "gkt_mode",
  "sync",
  "FedGKT: sync (server waits for the cohort) | async (trains on each"
  " client's features as they arrive, in the order the device population's"
  " simulated clock says; --clients_per_round devices work at once).",
)
_GKT_KD_T_SQUARED = flags.DEFINE_bool(
  "gkt_kd_t_squared",
  True,
  "FedGKT: multiply the KL terms by T^2 (the official code; Eq. 6/7 have"
  " no T^2: --nogkt_kd_t_squared).",
)
_GKT_LR_PATIENCE = flags.DEFINE_integer(
  "gkt_lr_patience",
  10,
  "FedGKT: rounds without a new best server accuracy on fresh features"
  " before its learning rate is reduced (PyTorch ReduceLROnPlateau).",
)
_GKT_LR_FACTOR = flags.DEFINE_float(
  "gkt_lr_factor",
  0.1,
  "FedGKT: factor of each server learning-rate reduction, in (0, 1]"
  " (1: never reduce).",
)
_GKT_SERVER_ORDER = flags.DEFINE_string(
  "gkt_server_order",
  "shuffled",
  "FedGKT: the server's pass over a round's features, shuffled (over all"
  " clients, each epoch) | by_client (client after client in sample order,"
  " Algorithm 1 and the official code).",
)
_HETEROFL_RATES = flags.DEFINE_string(
  "heterofl_rates",
  "",
  "HeteroFL width rate per tier of --tiers, colon-separated, each checked"
  " against the tier's capacity (default: per tier, the largest rate in"
  " steps of 0.01 whose sub-model fits the tier's capacity).",
)


def config_from_flags():
  """An `ExperimentConfig` from the flags: every field of the same name."""
  import attrs  # pylint: disable=g-import-not-at-top

  from tff_hetero.program import ExperimentConfig  # pylint: disable=g-import-not-at-top

  values = {}
  for field in attrs.fields(ExperimentConfig):
    if field.name in flags.FLAGS:
      value = flags.FLAGS[field.name].value
      values[field.name] = tuple(value) if isinstance(value, list) else value
  return ExperimentConfig(**values)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  result = _cli.run_guarded(
    lambda: loop.run_experiment(config_from_flags()),
    resume_hint="continue with --resume",
  )
  report = result.report
  final = report["final_metrics"]
  average = (
    f" (mean over the evaluated sub-models {final['avg_accuracy']:.4f})"
    if "avg_accuracy" in final
    else ""
  )
  print(
    f"final accuracy: {final.get('accuracy'):.4f}{average} after"
    f" {report['rounds_completed']} rounds; uploaded"
    f" {report['bytes_up_total'] / 2**20:.2f} MiB"
  )
  print(f"report: {result.experiment_dir}/report.json")
  for path in report.get("plots", []):
    print(f"plot: {path}")
  sys.stdout.flush()


if __name__ == "__main__":
  _cli.run_main(main)
