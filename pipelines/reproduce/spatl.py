r"""Reproduce SPATL's communication tables (reduced) on the offline data.

  python -m pipelines.reproduce.spatl                          # offline default
  python -m pipelines.reproduce.spatl --parts=table --seeds=0
  python -m pipelines.reproduce.spatl --dataset=cifar10 --data_dir=DIR \
      --model=resnet20 --augment=crop_flip ...

Paper: Yu et al., SPATL (`spatl.txt`), Section V. Table I: rounds and
communication (upload + download, per client and round, times the sampled
clients) until the average local validation accuracy reaches 80 %, 10
clients all sampled, CIFAR-10 split by Dirichlet(0.1), for FedAvg, FedNova,
FedProx, SCAFFOLD and SPATL on ResNet-20, ResNet-32 and VGG-11. Table II:
accuracy at convergence with 30 clients sampled at 0.4 (and 50 at 0.7,
100 at 0.4). Reduced here: two models (no VGG-11) and the 30-client
setting only; the ablations run on the base model (the paper's
gradient-control ablation is on VGG-11); the paper's MB and GB stand beside
our MiB. Every method is evaluated the same way: the mean over the
clients of their model's accuracy on their own validation split
(`--local_evaluation`; SPATL's model of a client is the global encoder with
its own predictor, the others' the global model). Each method keeps its own
CLI defaults otherwise: SPATL weights clients uniformly (Eq. 12's 1/|K|)
and averages batch-norm statistics; FedAvg, FedProx, FedNova and SCAFFOLD
weight by examples and compute the evaluated model's batch-norm statistics
from the clients' data (`static_batch_norm`).

Parts (`--parts`; every flag of `pipelines.train` applies to every run):

* `table`: Table I's five methods on the base model, each once per seed
  (`--seeds`, default 0, 1, 2): rounds and MiB until `TARGET` local
  accuracy, MiB per client and round, best local accuracy;
* `second_model`: the same five on `resnet20` (Table I's first model),
  SPATL and SCAFFOLD once per seed, the others on the first seed;
* `convergence`: Table II's 30 clients sampled at 0.4, the five methods,
  SPATL and SCAFFOLD once per seed, the others on the first seed: best and
  final local accuracy and total MiB;
* `ablation`: SPATL without selection, without transfer (a shared
  predictor) and without gradient control, and with Eq. 9's correction
  damped by 0.01 as in the official code, first seed, table setting.

The offline default is Table I's setting on the embedded 5,000-image MNIST
subset with a 2-layer CNN (`mnist_cnn`, FedDST's 21,840-parameter MNIST
CNN, standing in for the 2-layer CNN the paper trains on FEMNIST):
Dirichlet(0.1) over 10 clients, all sampled, 20 % of each client's data as
its validation split, batch 32, SGD lr 0.05 for every method (not tuned per
method), FedProx mu 0.01 (NIID-Bench's, the benchmark the paper follows),
2 local epochs (the paper: 10; a fifth of the cost), 60 rounds, evaluated
every second round. SPATL uses its agent as shipped (`--spatl_agent`
default) and the paper's agent settings.

When CIFAR-10 is prepared under `--data_dir` (TFDS layout; TFDS's default
directory when the flag is not given) and `--dataset` is not given, the
defaults are the paper's own setting instead (`CIFAR_DEFAULTS`): CIFAR-10
with crop and flip, ResNet-20 as the base model and ResNet-32 as the
second, 10 local epochs, batch 64, SGD lr 0.01 (NIID-Bench's), 300 rounds
(the paper's slowest method, FedProx, reached 80 % at 288); every other
default as above. Any flag given overrides either.

Writes `tables.md`, `results.json` (every run: settings, seed, final and best
metrics, the commits it ran at), `local_accuracy_vs_round.png`,
`local_accuracy_vs_mib.png`, `client_accuracy.png` (SPATL's and FedAvg's
per-client accuracies at the end, first seed) and each run's
`metrics/<run>.csv` under `<root_output_dir>/<experiment_name>/`; an
interrupted reproduction continues where it stopped.
"""

from __future__ import annotations

import collections
import json
import math
import os

from absl import flags

from pipelines import _cli
from pipelines import train  # noqa: F401  (defines the shared flags)
from pipelines.reproduce import _common

PARTS = ("table", "second_model", "convergence", "ablation")
DEFAULT_SEEDS = (0, 1, 2)
TARGET = 0.8
SECOND_MODEL = "resnet20"
# The paper's Table I setting, used when CIFAR-10 is prepared (module
# docstring); on it the second model is ResNet-32.
CIFAR_CHANGES = collections.OrderedDict(
  dataset="cifar10",
  model="resnet20",
  augment="crop_flip",
  local_epochs=10,
  batch_size=64,
  client_lr=0.01,
  rounds=300,
)
CIFAR_SECOND_MODEL = "resnet32"
OFFLINE_DEFAULTS = collections.OrderedDict(
  algorithm="spatl",
  dataset="mnist5k",
  model="mnist_cnn",
  partition="dirichlet",
  alpha=0.1,
  num_clients=10,
  clients_per_round=10,
  val_fraction=0.2,
  local_evaluation=True,
  rounds=60,
  local_epochs=2,
  batch_size=32,
  client_lr=0.05,
  eval_every=2,
  checkpoint_every=10,
  experiment_name="spatl_reproduction",
  progress=False,
)
METHODS = collections.OrderedDict(
  [
    ("FedAvg", dict(algorithm="fedavg")),
    ("FedNova", dict(algorithm="fednova")),
    ("FedProx", dict(algorithm="fedprox", prox_mu=0.01)),
    ("SCAFFOLD", dict(algorithm="scaffold")),
    ("SPATL", dict(algorithm="spatl")),
  ]
)
# Methods repeated over every seed outside the main table (the issue's
# budget: SPATL and its closest baseline).
ALL_SEEDS = ("SPATL", "SCAFFOLD")
ABLATIONS = collections.OrderedDict(
  [
    ("SPATL w/o selection", dict(algorithm="spatl", spatl_selection=False)),
    ("SPATL w/o transfer", dict(algorithm="spatl", spatl_transfer=False)),
    (
      "SPATL w/o gradient control",
      dict(algorithm="spatl", spatl_gradient_control=False),
    ),
    # The official code damps Eq. 9's correction by 1/100 (module docstring
    # of tff_hetero.algorithms.spatl.spatl).
    (
      "SPATL with correction x 0.01",
      dict(algorithm="spatl", spatl_control_scale=0.01),
    ),
  ]
)
CONVERGENCE = dict(num_clients=30, clients_per_round=12)
# The paper's rows (ResNet-20): Table I (rounds to 80 %, MB per client and
# round, GB in all) and Table II, 30 clients at 0.4 (converged accuracy %).
PAPER_TABLE_I = {
  "FedAvg": (203, 2.1, 4.16),
  "FedNova": (198, 4.2, 8.12),
  "FedProx": (288, 2.1, 5.91),
  "SCAFFOLD": (49, 4.3, 2.10),
  "SPATL": (52, 2.1, 1.10),
}
PAPER_TABLE_II = {
  "FedAvg": 60.58,
  "FedNova": 64.50,
  "FedProx": 60.20,
  "SCAFFOLD": 10.00,
  "SPATL": 66.49,
}


def _run_name(part: str, label: str) -> str:
  prefix = {"table": "", "ablation": ""}.get(part, f"{part}_")
  return prefix + _common.slug(label)


def _seeds_of(part: str, label: str, seeds):
  if part == "table" or label in ALL_SEEDS:
    return list(seeds)
  return list(seeds[:1])


def _rows(part: str):
  return ABLATIONS if part == "ablation" else METHODS


def second_model(base) -> str:
  """Table I's second model: ResNet-32 beside a ResNet-20 base, else
  ResNet-20."""
  return CIFAR_SECOND_MODEL if base.model == "resnet20" else SECOND_MODEL


def default_settings(dataset_given: bool, data_dir) -> dict:
  """`OFFLINE_DEFAULTS`, with `CIFAR_CHANGES` when CIFAR-10 is prepared
  under `data_dir` and no data set was asked for."""
  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top

  defaults = collections.OrderedDict(OFFLINE_DEFAULTS)
  if not dataset_given and data_lib.is_prepared("cifar10", data_dir or None):
    defaults.update(CIFAR_CHANGES)
  return defaults


def _changes(base, part: str, changes: dict) -> dict:
  if part == "second_model":
    return dict(changes, model=second_model(base))
  if part == "convergence":
    return dict(changes, **CONVERGENCE)
  return dict(changes)


def plan_runs(base, parts, seeds=DEFAULT_SEEDS):
  """The main table seed by seed first, then the other parts."""
  plan = _common.RunPlan(base)
  for part in PARTS:
    if part not in parts:
      continue
    for seed in seeds:
      for label, changes in _rows(part).items():
        if seed in _seeds_of(part, label, seeds) and (
          part != "ablation" or seed == seeds[0]
        ):
          plan.add(
            _common.seed_name(_run_name(part, label), seed),
            seed=seed,
            **_changes(base, part, changes),
          )
  return plan.runs()


def _evaluated(report):
  return [
    r
    for r in report["history"]
    if r.get("local_accuracy") is not None
    and not math.isnan(r["local_accuracy"])
  ]


def to_target(report, target=TARGET):
  """(round, MiB up + down in all) at the first evaluation reaching
  `target` local accuracy; (None, None) if none did."""
  for row in _evaluated(report):
    if row["local_accuracy"] >= target:
      mib = (row["bytes_up_cumulative"] + row["bytes_down_cumulative"]) / (
        _common.MIB
      )
      return row["round"], mib
  return None, None


def per_client_round_mib(report) -> float:
  """Mean (upload + download) per client and round, MiB, measured."""
  history = report["history"]
  traffic = sum(r["bytes_up"] + r["bytes_down"] for r in history)
  client_rounds = sum(r["clients"] for r in history)
  return traffic / client_rounds / _common.MIB if client_rounds else math.nan


def best_local(report) -> float:
  values = [r["local_accuracy"] for r in _evaluated(report)]
  return max(values) if values else math.nan


def final_local(report) -> float:
  """The last evaluation's local accuracy; NaN for a run that diverged."""
  values = [r["local_accuracy"] for r in _evaluated(report)]
  if report.get("diverged_at_round") or not values:
    return math.nan
  return values[-1]


def diverged(runs) -> str:
  """The rounds at which runs diverged ('round 19, round 23'), or '-'."""
  rounds = [r["diverged_at_round"] for r in runs if r.get("diverged_at_round")]
  return ", ".join(f"round {n}" for n in rounds) or "-"


def _mean(values):
  kept = [v for v in values if v is not None and not math.isnan(v)]
  return sum(kept) / len(kept) if kept else math.nan


def _fmt(value, digits=1):
  return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _row_reports(reports, part, label, seeds):
  names = [
    _common.seed_name(_run_name(part, label), s)
    for s in _seeds_of(part, label, seeds)
  ]
  return [reports[n] for n in names if n in reports]


def _target_summary(runs):
  """Rounds and MiB to target over seeds: mean over the seeds that reached
  it, and how many did."""
  hits = [to_target(r) for r in runs]
  reached = [h for h in hits if h[0] is not None]
  return (
    _mean([h[0] for h in reached]),
    _mean([h[1] for h in reached]),
    f"{len(reached)}/{len(hits)}",
  )


def build_tables(base, reports, parts, seeds=DEFAULT_SEEDS):
  scale = (
    f"Ours: {base.dataset}, {base.partition} (alpha {base.alpha}),"
    f" {base.num_clients} clients, {base.clients_per_round} per round,"
    f" {base.rounds} rounds of {base.local_epochs} local epochs, batch"
    f" {base.batch_size}, SGD lr {base.client_lr}, validation fraction"
    f" {base.val_fraction}; metric: mean local validation accuracy over the"
    f" clients; target {100 * TARGET:.0f} %; seeds"
    f" {', '.join(str(s) for s in seeds)}. MiB are measured (upload +"
    " download, all clients)."
  )
  md = [f"# SPATL reproduction\n\n{scale}\n"]
  results = collections.OrderedDict(scale=scale, target=TARGET)
  numbers = collections.OrderedDict()
  for part, title, model in (
    ("table", "Table I (reduced)", base.model),
    ("second_model", "Table I (reduced), second model", second_model(base)),
  ):
    if part not in parts:
      continue
    lines, part_numbers = [], collections.OrderedDict()
    for label in METHODS:
      runs = _row_reports(reports, part, label, seeds)
      rounds, mib, reached = _target_summary(runs)
      per_round = _mean([per_client_round_mib(r) for r in runs])
      best = [best_local(r) for r in runs]
      part_numbers[label] = dict(
        rounds_to_target=rounds,
        mib_to_target=mib,
        reached=reached,
        mib_per_client_round=per_round,
        best_local_accuracy=best,
        diverged=diverged(runs),
      )
      paper = PAPER_TABLE_I.get(label)
      lines.append(
        [
          label,
          _fmt(rounds),
          reached,
          _fmt(per_round, 3),
          _fmt(mib),
          _common.mean_std_percent(best),
          diverged(runs),
          f"{paper[0]} / {paper[1]} MB / {paper[2]} GB" if paper else "-",
        ]
      )
    numbers[part] = part_numbers
    md.append(
      f"## {title}: {model}\n\n"
      + _common.markdown_table(
        [
          "Method",
          "rounds to target",
          "seeds reaching it",
          "MiB / client / round",
          "MiB to target",
          "best local acc. (%)",
          "diverged",
          "paper, ResNet-20 (rounds / per client / total)",
        ],
        lines,
      )
      + "\n"
    )
  inference = _inference_section(base, reports, parts, seeds)
  if inference:
    text, numbers["inference"] = inference
    md.append(text)
  if "convergence" in parts:
    lines, part_numbers = [], collections.OrderedDict()
    for label in METHODS:
      runs = _row_reports(reports, "convergence", label, seeds)
      best = [best_local(r) for r in runs]
      final = [final_local(r) for r in runs]
      total = _mean(
        [
          (r["history"][-1]["bytes_up_cumulative"]) / _common.MIB
          + r["history"][-1]["bytes_down_cumulative"] / _common.MIB
          for r in runs
        ]
      )
      part_numbers[label] = dict(
        best=best, final=final, total_mib=total, diverged=diverged(runs)
      )
      lines.append(
        [
          label,
          _common.mean_std_percent(best),
          _common.mean_std_percent(final),
          diverged(runs),
          _fmt(total),
          _fmt(PAPER_TABLE_II.get(label, math.nan), 2),
        ]
      )
    numbers["convergence"] = part_numbers
    md.append(
      "## Table II (reduced): 30 clients, 12 per round\n\n"
      + _common.markdown_table(
        [
          "Method",
          "best local acc. (%)",
          "final local acc. (%)",
          "diverged",
          "MiB in all",
          "paper, ResNet-20 (%)",
        ],
        lines,
      )
      + "\n"
    )
  if any(
    r.get("diverged_at_round") for r in reports.values() if isinstance(r, dict)
  ):
    md.append(
      "A run that diverged (non-finite loss or weights) is kept as a result:"
      " its best accuracy and rounds to target count the rounds before it;"
      " its final accuracy is none (the paper's SCAFFOLD diverges too and"
      " is reported at chance).\n"
    )
  if "ablation" in parts:
    lines = []
    part_numbers = collections.OrderedDict()
    spatl = _row_reports(reports, "table", "SPATL", seeds)[:1]
    for label in ["SPATL"] + list(ABLATIONS):
      runs = (
        spatl
        if label == "SPATL"
        else _row_reports(reports, "ablation", label, seeds)
      )
      rounds, mib, reached = _target_summary(runs)
      best = [best_local(r) for r in runs]
      per_round = _mean([per_client_round_mib(r) for r in runs])
      part_numbers[label] = dict(
        best=best,
        rounds_to_target=rounds,
        mib_per_client_round=per_round,
        diverged=diverged(runs),
      )
      lines.append(
        [
          label,
          _common.mean_std_percent(best),
          _fmt(rounds),
          _fmt(per_round, 3),
          diverged(runs),
        ]
      )
    numbers["ablation"] = part_numbers
    md.append(
      f"## Ablations (seed {seeds[0]}, table setting)\n\n"
      + _common.markdown_table(
        [
          "Run",
          "best local acc. (%)",
          "rounds to target",
          "MiB / client / round",
          "diverged",
        ],
        lines,
      )
      + "\n"
    )
  claims = _claims(numbers)
  if claims:
    md.append(
      "## Claims\n\n"
      + _common.markdown_table(
        ["Claim", "setting", "ours", "baseline", "verdict"], claims
      )
      + '\n\n"within noise": the difference of the means is not larger'
      " than the larger standard deviation over seeds; rounds and MiB:"
      " fewer is better.\n"
    )
    results["claims"] = [
      dict(zip(("claim", "setting", "ours", "baseline", "verdict"), c))
      for c in claims
    ]
  results.update(numbers)
  results["runs"] = [
    _common.run_record(run, reports[run.name])
    for run in plan_runs(base, parts, seeds)
    if run.name in reports
  ]
  return "\n".join(md), results


def final_flops_saved(report) -> tuple[float, float]:
  """The last round's share of the model's MACs the clients' selections
  saved: (mean over its clients, largest); NaN without selection."""
  row = report["history"][-1]
  return (
    float(row.get("model_flops_saved", math.nan)),
    float(row.get("model_flops_saved_max", math.nan)),
  )


def _inference_section(base, reports, parts, seeds):
  """Section V-D (inference acceleration): the compute of each client's
  selected sub-network at the end, per model; None without SPATL runs."""
  lines, numbers = [], collections.OrderedDict()
  for part, model in (
    ("table", base.model),
    ("second_model", second_model(base)),
  ):
    if part not in parts:
      continue
    runs = _row_reports(reports, part, "SPATL", seeds)
    if not runs:
      continue
    saved = [final_flops_saved(r) for r in runs]
    mean, largest = [m for m, _ in saved], [x for _, x in saved]
    numbers[model] = dict(mean=mean, max=largest)
    lines.append(
      [model, _common.mean_std_percent(mean), _fmt(100 * max(largest))]
    )
  if not lines:
    return None
  text = (
    "## Inference (Section V-D): FLOPs the final round's selections save\n\n"
    + _common.markdown_table(
      ["Model", "mean over clients (%)", "largest (%, over seeds)"], lines
    )
    + "\nPaper (text of Section V-D): ResNet-32, 10 clients: 29.6 % mean,"
    " 38.4 % largest; VGG-11: up to 39.7 %. Ours: the whole model's MACs,"
    " each client's sub-network counted layer by layer"
    " (`tff_hetero/algorithms/spatl/subnetwork.py`).\n"
  )
  return text, numbers


def _fewer(text, setting, ours, theirs):
  """A claim that `ours` is smaller than `theirs` (single numbers)."""
  if ours is None or theirs is None or math.isnan(ours) or math.isnan(theirs):
    verdict = "not measured"
  else:
    verdict = "supported" if ours < theirs else "not supported"
  return [text, setting, _fmt(ours, 2), _fmt(theirs, 2), verdict]


def _claims(numbers):
  claims = []
  for part in ("table", "second_model"):
    rows = numbers.get(part)
    if not rows:
      continue
    spatl = rows["SPATL"]
    for other in ("FedAvg", "SCAFFOLD"):
      claims.append(
        _fewer(
          f"SPATL reaches the target in fewer rounds than {other}",
          part,
          spatl["rounds_to_target"],
          rows[other]["rounds_to_target"],
        )
      )
      claims.append(
        _fewer(
          f"SPATL needs less communication to the target than {other}",
          part,
          spatl["mib_to_target"],
          rows[other]["mib_to_target"],
        )
      )
    claims.append(
      _fewer(
        "SPATL's round costs a client less than SCAFFOLD's",
        part,
        spatl["mib_per_client_round"],
        rows["SCAFFOLD"]["mib_per_client_round"],
      )
    )
    for other in ("FedAvg", "SCAFFOLD"):
      ours, theirs = (
        spatl["best_local_accuracy"],
        rows[other]["best_local_accuracy"],
      )
      claims.append(
        [
          f"SPATL's best local accuracy > {other}'s",
          part,
          _common.mean_std_percent(ours),
          _common.mean_std_percent(theirs),
          _common.claim_verdict(ours, theirs),
        ]
      )
  rows = numbers.get("convergence")
  if rows:
    for other in ("FedAvg", "FedNova", "FedProx", "SCAFFOLD"):
      ours, theirs = rows["SPATL"]["best"], rows[other]["best"]
      claims.append(
        [
          f"SPATL converges higher than {other} (Table II)",
          "convergence",
          _common.mean_std_percent(ours),
          _common.mean_std_percent(theirs),
          _common.claim_verdict(ours, theirs),
        ]
      )
  return claims


def _client_accuracies(out_dir, name):
  path = os.path.join(out_dir, "runs", name, "client_accuracy.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    groups = json.load(f)["groups"]
  return sorted(groups.get("local", {}).values())


def plot(out_dir, reports, parts, seeds=DEFAULT_SEEDS) -> list[str]:
  _common.copy_run_metrics(out_dir, reports)
  if "table" not in parts:
    return []
  first = {
    label: reports.get(_common.seed_name(_run_name("table", label), seeds[0]))
    for label in METHODS
  }
  first = {k: v for k, v in first.items() if v is not None}
  paths = [
    _common.plot_curves(
      os.path.join(out_dir, "local_accuracy_vs_round.png"),
      {
        f"{label} (seed {seeds[0]})": _common.curve(
          report, "round", "local_accuracy"
        )
        for label, report in first.items()
      },
      xlabel="round",
      ylabel="mean local validation accuracy",
    ),
    _common.plot_curves(
      os.path.join(out_dir, "local_accuracy_vs_mib.png"),
      {
        f"{label} (seed {seeds[0]})": _common.curve(
          report,
          "bytes_up_cumulative",
          "local_accuracy",
          x_scale=_common.MIB,
        )
        for label, report in first.items()
      },
      xlabel="cumulative upload (MiB, all clients)",
      ylabel="mean local validation accuracy",
    ),
  ]
  distributions = {}
  for label in ("SPATL", "FedAvg", "SCAFFOLD"):
    values = _client_accuracies(
      out_dir, _common.seed_name(_run_name("table", label), seeds[0])
    )
    if values:
      distributions[f"{label} (seed {seeds[0]})"] = list(
        enumerate(values, start=1)
      )
  if distributions:
    paths.append(
      _common.plot_curves(
        os.path.join(out_dir, "client_accuracy.png"),
        distributions,
        xlabel="client (sorted by accuracy)",
        ylabel="final local validation accuracy",
      )
    )
  return paths


def main(argv):
  seeds = _common.seeds_from_flag(DEFAULT_SEEDS)
  _common.reproduce_main(
    argv,
    flag="--parts",
    selected=_common.PARTS_FLAG.value or PARTS,
    accepted=PARTS,
    defaults=default_settings(
      flags.FLAGS["dataset"].present, flags.FLAGS.data_dir
    ),
    plan_runs=lambda base, parts: plan_runs(base, parts, seeds),
    build_tables=lambda base, reports, parts: build_tables(
      base, reports, parts, seeds
    ),
    plot=lambda out_dir, reports, parts: plot(out_dir, reports, parts, seeds),
    check=_check,
  )


def _check(base) -> None:
  if base.val_fraction <= 0:
    _cli.fail(
      "--val_fraction: every method is evaluated on the clients' validation"
      " splits; give a value in (0, 1)"
    )


if __name__ == "__main__":
  _cli.run_main(main)
