r"""Reproduce AdaptiveFL's Tables 2, 3, 4 and Figure 5 at reduced scale.

  python -m pipelines.reproduce.adaptivefl                 # offline default
  python -m pipelines.reproduce.adaptivefl --dataset=cifar10 \
      --data_dir=~/tensorflow_datasets --model=vgg16 --num_clients=100 \
      --rounds=1000 --local_epochs=5 --batch_size=50 --client_lr=0.01

Paper: Jia et al., "AdaptiveFL: Adaptive Heterogeneous Federated Learning for
Resource-Constrained AIoT Systems", DAC 2024 (CIFAR-10/100 and FEMNIST with
VGG-16 and ResNet-18, 100 clients, 10 per round, 5 local epochs, batch 50,
SGD lr 0.01 momentum 0.5, weak:medium:strong = 4:3:3).

Runs (every flag of `pipelines.train` is accepted and applies to all runs):

* Table 2: All-Large, Decoupled, HeteroFL and AdaptiveFL, IID and Dirichlet
  alpha = 0.6 and 0.3: "avg" (mean test accuracy of the L1, M1 and S1
  models; HeteroFL: of its rates) and "full" (the full model);
* Table 3: HeteroFL and AdaptiveFL with weak:medium:strong = 8:1:1, 1:8:1,
  1:1:8 (and 4:3:3 from Table 2), IID; All-Large ignores devices, so its
  Table 2 IID run stands for every proportion;
* Table 4: AdaptiveFL with a coarse pool (one start index, p = 1: the fine
  pool's largest, I_1, e.g. 8 for VGG-16) against the fine pool (p = 3) of
  Table 2;
* Figure 5: AdaptiveFL's selection variants (greedy, random, curiosity only,
  resource only, and the paper's curiosity x resource) on IID data: accuracy
  and communication waste rate, 1 - sum(returned bytes) / sum(sent bytes),
  over the whole run (measured).

The offline default is the embedded 5,000-image MNIST subset with the
FedSGC/FedDST MNIST CNN (three width units: the pool uses r = 0.66 / 0.40 and
I in {2, 1, 0}), 50 clients, 10 per round, 2 local epochs, batch 20, SGD lr
0.05 momentum 0.5, 100 rounds: a scale that runs on two CPU cores in about an
hour, stated in the output. `--model=vgg16_eighth` keeps VGG-16's 15 width
units and the paper's pool (I in {8, 6, 4}) at 1/8 width, about three times
slower per round, and needs more rounds than 100 to train. The paper's numbers
(CIFAR-10, VGG-16 and ResNet-18) are printed beside ours for reference, not
as a target at this scale.

Writes `<root_output_dir>/<experiment_name>/`: `tables.md`, `results.json`,
`table2_curves.png`, `figure5.png`, and every run under `runs/`. Interrupted,
it resumes: finished runs are reused, started ones resumed.
"""

from __future__ import annotations

import collections
import math
import os

from absl import flags

from pipelines import _cli
from pipelines import train  # noqa: F401  (defines the shared flags)
from pipelines.reproduce import _common

_TABLES = flags.DEFINE_list(
    "tables", ["2", "3", "4", "5"],
    "Which of Table 2, 3, 4 and Figure 5 (5) to run.")

OFFLINE_DEFAULTS = collections.OrderedDict(
    dataset="mnist5k", model="mnist_cnn", num_clients=50,
    clients_per_round=10, rounds=100, local_epochs=2, batch_size=20,
    client_lr=0.05, client_momentum=0.5, eval_every=10, checkpoint_every=10,
    min_samples_per_client=8, tier_proportions="4:3:3",
    experiment_name="adaptivefl_reproduction", progress=False)

DISTRIBUTIONS = collections.OrderedDict(
    [("IID", dict(partition="iid")),
     ("alpha=0.6", dict(partition="dirichlet", alpha=0.6)),
     ("alpha=0.3", dict(partition="dirichlet", alpha=0.3))])
ALGORITHMS = collections.OrderedDict(
    [("All-Large", "all_large"), ("Decoupled", "decoupled"),
     ("HeteroFL", "heterofl"), ("AdaptiveFL", "adaptivefl")])
PROPORTIONS = ("4:3:3", "8:1:1", "1:8:1", "1:1:8")
VARIANTS = collections.OrderedDict(
    [("AdaptiveFL+Greed", "greedy"), ("AdaptiveFL+Random", "random"),
     ("AdaptiveFL+C", "curiosity"), ("AdaptiveFL+S", "resource"),
     ("AdaptiveFL+CS", "rl")])

# The paper's figures (percent), CIFAR-10. Table 2: (avg, full) per
# distribution; None where the paper prints "-".
PAPER_TABLE2 = {
    "VGG16": {
        "All-Large": [(None, 79.76), (None, 77.29), (None, 74.95)],
        "Decoupled": [(75.02, 69.80), (72.95, 67.58), (69.11, 62.91)],
        "HeteroFL": [(77.98, 74.96), (75.18, 72.69), (71.18, 67.59)],
        "AdaptiveFL": [(82.97, 83.14), (81.12, 81.31), (78.85, 78.99)],
    },
    "ResNet18": {
        "All-Large": [(None, 68.37), (None, 67.03), (None, 64.28)],
        "Decoupled": [(63.23, 55.56), (59.21, 52.59), (55.82, 49.65)],
        "HeteroFL": [(70.44, 65.37), (65.97, 60.33), (60.32, 55.83)],
        "AdaptiveFL": [(77.14, 77.20), (74.72, 74.89), (70.61, 70.97)],
    },
}
# Table 3 (CIFAR-10): (avg, full) per proportion 4:3:3, 8:1:1, 1:8:1, 1:1:8.
PAPER_TABLE3 = {
    "All-Large": [(None, 79.76)] * 4,
    "HeteroFL": [(77.98, 74.96), (72.43, 64.44), (75.94, 65.96),
                 (81.26, 81.12)],
    "AdaptiveFL": [(82.95, 83.14), (81.62, 81.93), (82.78, 82.89),
                   (82.82, 83.24)],
}
# Table 4 (CIFAR-10, full accuracy): coarse / fine per distribution.
PAPER_TABLE4 = {
    "VGG16": {"coarse": (80.1, 78.9, 74.27), "fine": (83.14, 81.31, 78.99)},
    "ResNet18": {"coarse": (72.43, 71.92, 66.07), "fine": (77.2, 74.89, 70.97)},
}


def _slug(text: str) -> str:
  return "".join(c if c.isalnum() else "_" for c in text).strip("_").lower()


def plan_runs(base, tables) -> list[_common.Run]:
  """Every run the chosen tables need, each once."""
  plan = _common.RunPlan(base)
  add = plan.add

  def main_run(label, dist):
    # The paper's 4:3:3 whatever --tier_proportions says: Table 3's 4:3:3
    # column and Table 4's fine row are these runs.
    return add(f"{_slug(label)}_{_slug(dist)}", algorithm=ALGORITHMS[label],
               tier_proportions="4:3:3", **DISTRIBUTIONS[dist])

  if "2" in tables:
    for dist in DISTRIBUTIONS:
      for label in ALGORITHMS:
        main_run(label, dist)
  if "3" in tables:
    for label in ("All-Large", "HeteroFL", "AdaptiveFL"):
      main_run(label, "IID")
  if "4" in tables:
    for dist in DISTRIBUTIONS:
      main_run("AdaptiveFL", dist)
  if "5" in tables:
    main_run("AdaptiveFL", "IID")
  if "3" in tables:
    for proportion in PROPORTIONS[1:]:
      for label in ("HeteroFL", "AdaptiveFL"):
        add(f"{_slug(label)}_iid_{proportion.replace(':', '')}",
            algorithm=ALGORITHMS[label], tier_proportions=proportion,
            **DISTRIBUTIONS["IID"])
  if "4" in tables:
    starts = _default_start_indices(base)
    if len(starts) < 2:
      from tff_hetero.program.errors import UsageError  # pylint: disable=g-import-not-at-top
      raise UsageError(
          "--pool_start_indices", "Table 4 compares the fine pool with the"
          f" coarse one; give at least two start indices, got {starts}")
    coarse = str(starts[0])
    for dist, dist_changes in DISTRIBUTIONS.items():
      add(f"adaptivefl_coarse_{_slug(dist)}", algorithm="adaptivefl",
          pool_start_indices=coarse, **dist_changes)
  if "5" in tables:
    for label, selection in VARIANTS.items():
      if selection != "rl":
        add(f"adaptivefl_{selection}_iid", algorithm="adaptivefl",
            adaptivefl_selection=selection, **DISTRIBUTIONS["IID"])
  return plan.runs()


def _default_start_indices(base):
  from tff_hetero import models  # pylint: disable=g-import-not-at-top
  if base.pool_start_indices:
    return [int(i) for i in base.pool_start_indices.split(":")]
  return list(models.MODELS[base.model].default_start_indices)


def _pair(report):
  return (_common.final_metric(report, "avg_accuracy"),
          _common.final_metric(report, "accuracy"))


def _paper_pair(pair):
  avg, full = pair
  return ("-" if avg is None else f"{avg:.2f}", f"{full:.2f}")


def _waste_rate(report) -> float:
  sent = _common.history_sum(report, "sent_model_bytes")
  returned = _common.history_sum(report, "returned_model_bytes")
  return 1.0 - returned / sent if sent else math.nan


def build_tables(base, reports, tables) -> tuple[str, dict]:
  """Markdown tables (ours beside the paper's) and the numbers as a dict."""
  scale = (f"Ours: {base.dataset}, {base.model}, {base.num_clients} clients,"
           f" {base.clients_per_round} per round, {base.rounds} rounds,"
           f" {base.local_epochs} local epochs, batch {base.batch_size}, SGD lr"
           f" {base.client_lr} momentum {base.client_momentum}, seed"
           f" {base.seed}. Paper: CIFAR-10, 100 clients, 10 per round, 5 local"
           " epochs, batch 50, lr 0.01 momentum 0.5. Accuracy in %.")
  parts = [f"# AdaptiveFL reproduction\n\n{scale}\n"]
  results = collections.OrderedDict(scale=scale)
  dists = list(DISTRIBUTIONS)
  if "2" in tables:
    rows, numbers = [], collections.OrderedDict()
    for label, algorithm in ALGORITHMS.items():
      ours = [_pair(reports[f"{_slug(label)}_{_slug(d)}"]) for d in dists]
      numbers[label] = dict(zip(dists, ours))
      row = [label]
      for (avg, full), paper_vgg in zip(ours, PAPER_TABLE2["VGG16"][label]):
        row += [("-" if algorithm == "all_large" else _common.percent(avg)),
                _common.percent(full), "/".join(_paper_pair(paper_vgg))]
      rows.append(row)
    headers = ["Algorithm"]
    for d in dists:
      headers += [f"{d} avg", f"{d} full", f"{d} paper VGG16 avg/full"]
    parts.append("## Table 2: avg / full test accuracy\n\n"
                 + _common.markdown_table(headers, rows) + "\n")
    results["table2"] = numbers
  if "3" in tables:
    rows, numbers = [], collections.OrderedDict()
    for label in ("All-Large", "HeteroFL", "AdaptiveFL"):
      row, numbers[label] = [label], collections.OrderedDict()
      for j, proportion in enumerate(PROPORTIONS):
        if label == "All-Large" or proportion == "4:3:3":
          name = f"{_slug(label)}_iid"
        else:
          name = f"{_slug(label)}_iid_{proportion.replace(':', '')}"
        avg, full = _pair(reports[name])
        numbers[label][proportion] = (avg, full)
        row += [("-" if label == "All-Large" else _common.percent(avg)),
                _common.percent(full),
                "/".join(_paper_pair(PAPER_TABLE3[label][j]))]
      rows.append(row)
    headers = ["Algorithm"]
    for p in PROPORTIONS:
      headers += [f"{p} avg", f"{p} full", f"{p} paper"]
    parts.append("## Table 3: weak:medium:strong proportions (IID)\n\n"
                 + _common.markdown_table(headers, rows) + "\n")
    results["table3"] = numbers
  if "4" in tables:
    rows, numbers = [], collections.OrderedDict()
    for grain in ("coarse", "fine"):
      names = [(f"adaptivefl_coarse_{_slug(d)}" if grain == "coarse" else
                f"adaptivefl_{_slug(d)}") for d in dists]
      fulls = [_pair(reports[n])[1] for n in names]
      numbers[grain] = dict(zip(dists, fulls))
      rows.append([grain] + [_common.percent(f) for f in fulls] + [
          "/".join(f"{v:.2f}" for v in PAPER_TABLE4["VGG16"][grain])])
    parts.append("## Table 4: coarse (p = 1) vs fine (p = 3) pool, full"
                 " accuracy\n\n" + _common.markdown_table(
                     ["Pool"] + dists + ["paper VGG16 (IID/0.6/0.3)"], rows)
                 + "\n")
    results["table4"] = numbers
  if "5" in tables:
    rows, numbers = [], collections.OrderedDict()
    for label, selection in VARIANTS.items():
      name = ("adaptivefl_iid" if selection == "rl" else
              f"adaptivefl_{selection}_iid")
      report = reports[name]
      waste = _waste_rate(report)
      avg, full = _pair(report)
      numbers[label] = dict(waste_rate=waste, avg=avg, full=full)
      rows.append([label, _common.percent(waste), _common.percent(avg),
                   _common.percent(full)])
    parts.append("## Figure 5: selection strategies (IID)\n\n"
                 + _common.markdown_table(
                     ["Variant", "waste rate", "avg", "full"], rows) + "\n"
                 "The paper (CIFAR-100, ResNet-18) shows AdaptiveFL+CS with"
                 " the highest accuracy at a low waste rate; it prints no"
                 " numbers.\n")
    results["figure5"] = numbers
  return "\n".join(parts), results


def plot(out_dir, reports, tables) -> list[str]:
  """Learning curves of Table 2 and the bars of Figure 5."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  paths = []
  if "2" in tables:
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5), dpi=100, sharey=True)
    for ax, dist in zip(axes, DISTRIBUTIONS):
      for label, algorithm in ALGORITHMS.items():
        history = reports[f"{_slug(label)}_{_slug(dist)}"]["history"]
        key = "accuracy" if algorithm == "all_large" else "avg_accuracy"
        points = [(r["round"], r[key]) for r in history
                  if r.get(key) is not None and not math.isnan(r[key])]
        ax.plot(*zip(*points), marker="o", markersize=3, label=label)
      ax.set_title(dist)
      ax.set_xlabel("round")
      ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("avg test accuracy (All-Large: full)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "table2_curves.png"))
    fig.savefig(paths[-1])
    plt.close(fig)
  if "5" in tables:
    labels = list(VARIANTS)
    names = [("adaptivefl_iid" if s == "rl" else f"adaptivefl_{s}_iid")
             for s in VARIANTS.values()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5), dpi=100)
    left.bar(range(len(labels)), [_waste_rate(reports[n]) for n in names])
    left.set_title("communication waste rate")
    right.bar(range(len(labels)),
              [_pair(reports[n])[0] for n in names])
    right.set_title("avg test accuracy")
    for ax in (left, right):
      ax.set_xticks(range(len(labels)))
      ax.set_xticklabels([l.replace("AdaptiveFL", "") for l in labels])
      ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "figure5.png"))
    fig.savefig(paths[-1])
    plt.close(fig)
  return paths


def main(argv):
  _common.reproduce_main(
      argv, flag="--tables", selected=_TABLES.value, accepted=("2", "3", "4", "5"),
      defaults=OFFLINE_DEFAULTS, plan_runs=plan_runs,
      build_tables=build_tables, plot=plot)


if __name__ == "__main__":
  _cli.run_main(main)
