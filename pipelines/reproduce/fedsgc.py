r"""Reproduce FedSGC's MNIST table at reduced scale, with sparsity and Dirichlet sweeps.

  python -m pipelines.reproduce.fedsgc                     # offline default
  python -m pipelines.reproduce.fedsgc --dataset=mnist --data_dir=DIR \
      --rounds=400 --local_epochs=5 --batch_size=50 --upload_budgets_mib=100:200:400:800

Paper: "Gradient-Congruity Guided Federated Sparse Training" (FedSGC), Section
4.1: MNIST, 100 clients, 10 per round, 400 rounds of 5 local epochs, batch
50, the pathological non-IID split (200 label-sorted shards, two per
client), the FedDST MNIST CNN; the table reports the best accuracy reached
within cumulative uploads of 100, 200, 400 and 800 MiB.

Runs (every flag of `pipelines.train` applies to all of them):

* Table: FedAvg, FedProx, FedDST, FedDST (mu = 1), FedSGC, FedSGC (mu = 1)
  on the shard split at `--sparsity` (default 0.8);
* sparsity sweep: FedDST and FedSGC at sparsity 0.6, 0.7 and 0.8;
* Dirichlet sweep: FedAvg, FedProx, FedDST and FedSGC with alpha 0.1, 0.5
  and 1.0.

The offline default is the embedded 5,000-image MNIST subset (4,000 train
images: 200 shards of 20, two per client) with the MNIST CNN, 100 clients,
10 per round, 100 rounds of 5 local epochs, batch 20, SGD lr 0.05; the
upload budgets are 1/8, 1/4, 1/2 and all of what FedAvg uploads in the run
(`--upload_budgets_mib` sets them). Writes `tables.md`, `results.json` and
`accuracy_vs_upload.png` under `<root_output_dir>/<experiment_name>/`; an
interrupted reproduction continues where it stopped.
"""

from __future__ import annotations

import collections
import math
import os


from pipelines import _cli
from pipelines import train  # noqa: F401  (defines the shared flags)
from pipelines.reproduce import _common

# --parts: the table and the two sweeps.
PARTS = ("table", "sparsity", "dirichlet")
OFFLINE_DEFAULTS = collections.OrderedDict(
    dataset="mnist5k", model="mnist_cnn", num_clients=100,
    clients_per_round=10, rounds=100, local_epochs=5, batch_size=20,
    client_lr=0.05, partition="shards", shards_per_client=2,
    min_samples_per_client=1, eval_every=5, checkpoint_every=10,
    experiment_name="fedsgc_reproduction", progress=False)

TABLE_ROWS = collections.OrderedDict(
    [("FedAvg", dict(algorithm="fedavg")),
     ("FedProx", dict(algorithm="fedprox")),
     ("FedDST", dict(algorithm="feddst")),
     ("FedDST mu=1.0", dict(algorithm="feddst", prox_mu=1.0)),
     ("FedSGC", dict(algorithm="fedsgc")),
     ("FedSGC mu=1.0", dict(algorithm="fedsgc", prox_mu=1.0)),
     # Ablation (not in the paper): the congruity-guided readjustment
     # without the memory of absent clients' uploads.
     ("FedSGC no upload memory", dict(algorithm="fedsgc",
                                       sgc_remember_uploads=False))])
SPARSITIES = (0.6, 0.7, 0.8)
ALPHAS = (0.1, 0.5, 1.0)
# The paper's MNIST table (percent at 100 / 200 / 400 / 800 MiB).
PAPER_TABLE = {
    "FedAvg": (21.3, 45.2, 73.4, 81.3), "FedProx": (23.5, 58.3, 74.3, 82.0),
    "FedDST": (22.4, 55.4, 75.1, 79.9), "FedDST mu=1.0": (17.3, 43.7, 71.1, 78.1),
    "FedSGC": (19.2, 59.7, 77.7, 84.4), "FedSGC mu=1.0": (19.6, 46.9, 74.4, 83.3),
}


def _slug(text: str) -> str:
  return "".join(c if c.isalnum() else "_" for c in text).strip("_").lower()


# The sweeps: part -> (title, [(run name, row label, changes)]).
SWEEPS = collections.OrderedDict(
    sparsity=("Sparsity (shard split)", [
        (f"{algorithm}_shards_s{int(sparsity * 100)}",
         f"{algorithm} s={sparsity}",
         dict(algorithm=algorithm, sparsity=sparsity))
        for sparsity in SPARSITIES for algorithm in ("feddst", "fedsgc")]),
    dirichlet=("Dirichlet split", [
        (f"{algorithm}_dirichlet_{_slug(str(alpha))}",
         f"{algorithm} alpha={alpha}",
         dict(algorithm=algorithm, partition="dirichlet", alpha=alpha))
        for alpha in ALPHAS
        for algorithm in ("fedavg", "fedprox", "feddst", "fedsgc")]),
)


def plan_runs(base, parts):
  plan = _common.RunPlan(base)
  if "table" in parts:
    for label, changes in TABLE_ROWS.items():
      plan.add(f"{_slug(label)}_shards", **changes)
  for part, (_, runs) in SWEEPS.items():
    if part in parts:
      for name, _, changes in runs:
        plan.add(name, **changes)
  return plan.runs()


def _budgets(base, reports) -> list[float]:
  if base.upload_budgets_mib:
    return [float(b) for b in base.upload_budgets_mib.split(":")]
  reference = [r for name, r in reports.items() if name.startswith("fedavg")]
  total = (max(r["bytes_up_total"] for r in reference) if reference else
           max(r["bytes_up_total"] for r in reports.values()))
  return [round(total / _common.MIB * f, 1) for f in (0.125, 0.25, 0.5, 1.0)]


def _best_within(report, budgets) -> list[float]:
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top
  evaluated = [r for r in report["history"]
               if r.get("accuracy") is not None and
               not math.isnan(r["accuracy"])]
  best = loop.best_accuracy_by_upload(evaluated, budgets)
  return [math.nan if v is None else v for v in best.values()]


def build_tables(base, reports, parts):
  budgets = _budgets(base, reports)
  scale = (f"Ours: {base.dataset}, {base.model}, {base.num_clients} clients,"
           f" {base.clients_per_round} per round, {base.rounds} rounds of"
           f" {base.local_epochs} local epochs, batch {base.batch_size}, SGD lr"
           f" {base.client_lr}, readjust every {base.readjust_every} rounds"
           f" up to round {base.readjust_end_round or base.rounds // 2},"
           f" prune alpha {base.prune_alpha}, congruity lambda"
           f" {base.congruity_lambda}, seed {base.seed}. Paper: MNIST, 400"
           " rounds, 5 local epochs, batch 50. Accuracy in % at cumulative"
           " upload (all clients, measured) within each budget.")
  parts_md = [f"# FedSGC reproduction\n\n{scale}\n"]
  results = collections.OrderedDict(scale=scale, budgets_mib=budgets)
  headers_for = lambda first: [first] + [f"<= {b:g} MiB" for b in budgets]
  if "table" in parts:
    rows, numbers = [], collections.OrderedDict()
    for label in TABLE_ROWS:
      best = _best_within(reports[f"{_slug(label)}_shards"], budgets)
      numbers[label] = best
      rows.append([label] + [_common.percent(b) for b in best] + [
          " / ".join(f"{v:.1f}" for v in PAPER_TABLE[label])
          if label in PAPER_TABLE else "-"])
    parts_md.append(
        f"## Shard split, sparsity {base.sparsity}\n\n" + _common.markdown_table(
            headers_for("Method") + ["paper (100/200/400/800 MiB)"], rows) + "\n")
    results["table"] = numbers
  for part, (title, runs) in SWEEPS.items():
    if part not in parts:
      continue
    rows, numbers = [], collections.OrderedDict()
    for name, label, _ in runs:
      best = _best_within(reports[name], budgets)
      numbers[label] = best
      rows.append([label] + [_common.percent(b) for b in best])
    parts_md.append(f"## {title}\n\n" + _common.markdown_table(
        headers_for("Run"), rows) + "\n")
    results[part] = numbers
  return "\n".join(parts_md), results


def plot(out_dir, reports, parts) -> list[str]:
  if "table" not in parts:
    return []
  return [_common.plot_curves(
      os.path.join(out_dir, "accuracy_vs_upload.png"),
      {label: _common.curve(reports[f"{_slug(label)}_shards"],
                            "bytes_up_cumulative", x_scale=_common.MIB)
       for label in TABLE_ROWS},
      xlabel="cumulative upload (MiB, all clients)")]


def main(argv):
  _common.reproduce_main(
      argv, flag="--parts", selected=_common.PARTS_FLAG.value or PARTS,
      accepted=PARTS,
      defaults=OFFLINE_DEFAULTS, plan_runs=plan_runs,
      build_tables=build_tables, plot=plot)


if __name__ == "__main__":
  _cli.run_main(main)
