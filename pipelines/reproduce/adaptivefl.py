r"""Reproduce AdaptiveFL's Tables 2, 3, 4 and Figure 5 at reduced scale.

  python -m pipelines.reproduce.adaptivefl                 # offline default
  python -m pipelines.reproduce.adaptivefl --parts=sim     # selection only
  python -m pipelines.reproduce.adaptivefl --dataset=cifar10 \
      --data_dir=~/tensorflow_datasets --model=vgg16 --num_clients=100 \
      --rounds=1000 --local_epochs=5 --batch_size=50 --client_lr=0.01 \
      --pool_ratios=0.66:0.4 --pool_start_indices=8:6:4

Paper: Jia et al., "AdaptiveFL: Adaptive Heterogeneous Federated Learning for
Resource-Constrained AIoT Systems", DAC 2024 (CIFAR-10/100 and FEMNIST with
VGG-16 and ResNet-18, 100 clients, 10 per round, 5 local epochs, batch 50,
SGD lr 0.01 momentum 0.5, weak:medium:strong = 4:3:3).

Every method of a comparison runs on the same data partition, the same
device population (capacities, tiers, fluctuation) and the same seeds
(`--seeds`, default 0, 1, 2): a run's seed sets all of them. The
FedAvg-style baselines (All-Large, Decoupled, HeteroFL) draw their cohorts
from the cohort sampler with that seed (Decoupled one per model); AdaptiveFL selects its own clients
by its tables (with the sampler's random generator), so its cohorts differ.
Capacities belong to the population: unless `--tier_capacities` is given,
they follow the reference code's VGG-16 devices relative to its pool
(8, 16 and 35 million parameters against S1 8.39M, M1 16.81M and L1 33.65M):
weak 0.95 x S1, medium 0.95 x M1, strong 1.04 x L1 of the pool in use, each
fluctuating from round to round (`--tier_fluctuation`, default 1/8, 1/16,
2/35: the reference's relative spreads), so devices straddle the pool's
members as in the paper. HeteroFL's rate per tier is then the largest whose
sub-model fits the tier's capacity; All-Large ignores capacities (it is the
upper reference); Decoupled draws a cohort per model among the devices
that hold it that round (the reference code's sampling; up to three times
the client trainings of the other methods).

Not reproduced: ScaleFL (a baseline of Tables 2 and 3; not implemented),
Table 2's CIFAR-100, FEMNIST and ResNet-18 results, Table 4's ResNet-18 and
CIFAR-100 rows, and Figure 4 (K = 50 to 500 clients, ResNet-18).

Parts (`--parts`, default all):

* `2` (Table 2): All-Large, Decoupled, HeteroFL and AdaptiveFL on IID data
  and Dirichlet alpha = 0.6 and 0.3, every seed: "avg" (mean test accuracy of the L1, M1 and S1
  models; HeteroFL: of its rates) and "full" (the full model);
* `3` (Table 3): HeteroFL and AdaptiveFL at weak:medium:strong = 8:1:1,
  1:8:1 and 1:1:8, IID, first seed only (secondary rows); 4:3:3 is Table
  2's, and so is All-Large's row (it ignores the devices: one run);
* `4` (Table 4): AdaptiveFL with the coarse pool (one start index, p = 1:
  the fine pool's largest, so the coarse pool is the fine pool's S1, M1 and
  L1, the members the paper's p = 1 keeps) against the fine pool of Table 2,
  every seed, on the same device population; the table counts the
  client-rounds in which a device could train no member of its pool;
* `5` (Figure 5): AdaptiveFL's selection variants on IID data: greedy and
  random every seed, curiosity-only and resource-only first seed; waste
  rate 1 - sum(returned bytes) / sum(sent bytes) over the whole run
  (measured), and accuracy;
* `sim`: the selection alone (`tff_hetero.algorithms.adaptivefl_simulation`)
  over 1,000 rounds per seed on the paper's VGG-16 pool (Table 1 sizes) with
  the reference code's VGG-16 devices, 100 clients, 10 per round: waste of
  RL, random, greedy, curiosity-only and resource-only selection.

The offline default is the embedded 5,000-image MNIST subset with the
FedSGC/FedDST MNIST CNN and the pool r = 0.66 / 0.3, I in {2, 1} (p = 2: with
three width units and I >= 1 this is the finest valid pool; r_S = 0.4 would
make S1 larger than M2), 50 clients, 10 per round, 30 rounds of 2 local
epochs, batch 20, SGD lr 0.05 momentum 0.5, evaluated every 5 rounds. The
paper's numbers (CIFAR-10, VGG-16) are printed beside ours for reference,
not as a target at this scale. Why these values, where they differ from the
paper's (100 clients, 10 per round, 5 epochs, batch 50, lr 0.01): the
subset's 4,000 training images over 100 clients would leave 40 per client,
less than one batch of 50, so 50 clients hold 80 each and 10 of them
(20 %, the paper's 10 %) train per round; batch 20 and 2 epochs give a
client 8 steps a round, and 30 rounds keep the 59 runs within a few hours
of two CPU cores; lr 0.05, five times the paper's, for the fewer local
steps. Every method uses the same values.
Dirichlet partitions are redrawn (seeded) until every client holds at
least 8 images (`--min_samples_per_client`), so no client trains on an
empty or one-image set.

Writes `<root_output_dir>/<experiment_name>/`: `tables.md` (with the claims
table), `results.json` (every run's settings, seed, final and best metrics
and the commits it ran at), `metrics/<run>.csv` (each run's metrics),
`table2_curves.png`, `figure5.png`, `selection_waste.png`, and every run
under `runs/`. Interrupted, it resumes: finished runs are reused, started
ones resumed.
"""

from __future__ import annotations

import collections
import math
import os

from pipelines import _cli
from pipelines import train  # noqa: F401  (defines the shared flags)
from pipelines.reproduce import _common
from tff_hetero import data as data_lib
from tff_hetero import models
from tff_hetero.algorithms import adaptivefl
from tff_hetero.algorithms import adaptivefl_simulation as simulation
from tff_hetero.errors import UsageError
from tff_hetero.program import loop
from tff_hetero.submodels import pools

PARTS = ("2", "3", "4", "5", "sim")
DEFAULT_SEEDS = (0, 1, 2)
OFFLINE_DEFAULTS = collections.OrderedDict(
  algorithm="adaptivefl",
  dataset="mnist5k",
  model="mnist_cnn",
  num_clients=50,
  clients_per_round=10,
  rounds=30,
  local_epochs=2,
  batch_size=20,
  client_lr=0.05,
  client_momentum=0.5,
  eval_every=5,
  checkpoint_every=10,
  min_samples_per_client=8,
  tier_proportions="4:3:3",
  pool_ratios="0.66:0.3",
  pool_start_indices="2:1",
  tier_fluctuation="0.125:0.0625:0.057",
  experiment_name="adaptivefl_reproduction",
  progress=False,
)
# The reference code's VGG-16 devices against its pool: 8/8.39, 16/16.81,
# 35/33.65 (weak vs S1, medium vs M1, strong vs L1).
CAPACITY_OF_LEVEL = collections.OrderedDict(
  [("weak", ("S1", 0.95)), ("medium", ("M1", 0.95)), ("strong", ("L1", 1.04))]
)
SIM_ROUNDS = 1000
SIM_CLIENTS, SIM_PER_ROUND = 100, 10

DISTRIBUTIONS = collections.OrderedDict(
  [
    ("IID", dict(partition="iid")),
    ("alpha=0.6", dict(partition="dirichlet", alpha=0.6)),
    ("alpha=0.3", dict(partition="dirichlet", alpha=0.3)),
  ]
)
ALGORITHMS = collections.OrderedDict(
  [
    ("All-Large", "all_large"),
    ("Decoupled", "decoupled"),
    ("HeteroFL", "heterofl"),
    ("AdaptiveFL", "adaptivefl"),
  ]
)
PROPORTIONS = ("4:3:3", "8:1:1", "1:8:1", "1:1:8")
# Figure 5's variants: label -> (selection, every seed?).
VARIANTS = collections.OrderedDict(
  [
    ("AdaptiveFL+Greed", ("greedy", True)),
    ("AdaptiveFL+Random", ("random", True)),
    ("AdaptiveFL+C", ("curiosity", False)),
    ("AdaptiveFL+S", ("resource", False)),
    ("AdaptiveFL+CS", ("rl", True)),
  ]
)

# The paper's figures (percent), CIFAR-10, VGG-16. Table 2: (avg, full) for
# IID, alpha = 0.6 and alpha = 0.3; None where the paper prints "-".
PAPER_TABLE2 = {
  "All-Large": [(None, 79.76), (None, 77.29), (None, 74.95)],
  "Decoupled": [(75.02, 69.80), (72.95, 67.58), (69.11, 62.91)],
  "HeteroFL": [(77.98, 74.96), (75.18, 72.69), (71.18, 67.59)],
  "AdaptiveFL": [(82.97, 83.14), (81.12, 81.31), (78.85, 78.99)],
}
# Table 3 (CIFAR-10, IID): (avg, full) per proportion 4:3:3, 8:1:1, 1:8:1,
# 1:1:8. All-Large ignores the devices: one value in every column.
PAPER_TABLE3 = {
  "All-Large": [(None, 79.76)] * 4,
  "HeteroFL": [(77.98, 74.96), (72.43, 64.44), (75.94, 65.96), (81.26, 81.12)],
  "AdaptiveFL": [
    (82.95, 83.14),
    (81.62, 81.93),
    (82.78, 82.89),
    (82.82, 83.24),
  ],
}
# Table 4 (CIFAR-10, VGG-16, full accuracy): IID, alpha = 0.6 and 0.3.
PAPER_TABLE4 = {"coarse": (80.1, 78.9, 74.27), "fine": (83.14, 81.31, 78.99)}


def _main_name(label: str, dist: str) -> str:
  return f"{_common.slug(label)}_{_common.slug(dist)}"


def _proportion_name(label: str, proportion: str) -> str:
  return f"{_common.slug(label)}_iid_{proportion.replace(':', '')}"


def _coarse_name(dist: str) -> str:
  return f"adaptivefl_coarse_{_common.slug(dist)}"


def _variant_name(selection: str) -> str:
  return (
    "adaptivefl_iid" if selection == "rl" else f"adaptivefl_{selection}_iid"
  )


def _start_indices(base) -> list[int]:
  if base.settings.pool_start_indices:
    return [int(i) for i in base.settings.pool_start_indices.split(":")]
  return list(models.MODELS[base.model].default_start_indices)


def population_capacities(base) -> str:
  """`--tier_capacities` of the population (module docstring), in parameters.

  The given flag if any; else CAPACITY_OF_LEVEL of the AdaptiveFL pool of
  the base settings, on the data set's input shape.
  """
  if base.tier_capacities:
    return base.tier_capacities
  tiers = [t.strip() for t in base.tiers.split(",")]
  if tiers != list(CAPACITY_OF_LEVEL):
    raise UsageError(
      "--tier_capacities",
      f"give one per tier of --tiers={base.tiers} (defaults"
      " exist for weak,medium,strong only)",
    )
  splits = data_lib.load_dataset(
    base.dataset, data_dir=base.data_dir, seed=base.seed
  )
  task = loop.build_task(base, splits)
  pool = adaptivefl.pool_from_config(base, task)
  budgets = []
  for level, factor in CAPACITY_OF_LEVEL.values():
    params = models.count_params(
      task.width_model_fn(pool.member(level).widths)
    ).trainable
    budgets.append(str(math.floor(factor * params + 0.5)))
  return ":".join(budgets)


def plan_runs(base, parts, seeds=DEFAULT_SEEDS) -> list[_common.Run]:
  """Every training run the parts need, each once, seed by seed."""
  plan = _common.RunPlan(base)
  first = seeds[0]

  def add(name, seed, **changes):
    plan.add(_common.seed_name(name, seed), seed=seed, **changes)

  starts = _start_indices(base)
  if "4" in parts and len(starts) < 2:
    raise UsageError(
      "--pool_start_indices",
      "Table 4 compares the fine pool with the"
      f" coarse one; give at least two start indices, got {starts}",
    )
  for seed in seeds:
    if "2" in parts:
      for dist, changes in DISTRIBUTIONS.items():
        for label, algorithm in ALGORITHMS.items():
          add(
            _main_name(label, dist),
            seed,
            algorithm=algorithm,
            tier_proportions="4:3:3",
            **changes,
          )
    if "4" in parts:
      for dist, changes in DISTRIBUTIONS.items():
        add(
          _main_name("AdaptiveFL", dist),
          seed,
          algorithm="adaptivefl",
          tier_proportions="4:3:3",
          **changes,
        )
        add(
          _coarse_name(dist),
          seed,
          algorithm="adaptivefl",
          tier_proportions="4:3:3",
          pool_start_indices=str(starts[0]),
          **changes,
        )
    if "5" in parts:
      for selection, every_seed in VARIANTS.values():
        if every_seed or seed == first:
          add(
            _variant_name(selection),
            seed,
            algorithm="adaptivefl",
            adaptivefl_selection=selection,
            tier_proportions="4:3:3",
            **DISTRIBUTIONS["IID"],
          )
  if "3" in parts:
    for label in PAPER_TABLE3:
      add(
        _main_name(label, "IID"),
        first,
        algorithm=ALGORITHMS[label],
        tier_proportions="4:3:3",
        **DISTRIBUTIONS["IID"],
      )
      if label == "All-Large":
        continue  # The same run at every proportion (it ignores devices).
      for proportion in PROPORTIONS[1:]:
        add(
          _proportion_name(label, proportion),
          first,
          algorithm=ALGORITHMS[label],
          tier_proportions=proportion,
          **DISTRIBUTIONS["IID"],
        )
  return plan.runs()


def _seeded(reports, name, seeds):
  return [
    reports[_common.seed_name(name, s)]
    for s in seeds
    if _common.seed_name(name, s) in reports
  ]


def _metric(reports, key):
  return [_common.final_metric(r, key) for r in reports]


def _waste_rate(report) -> float:
  sent = _common.history_sum(report, "sent_model_bytes")
  returned = _common.history_sum(report, "returned_model_bytes")
  return 1.0 - returned / sent if sent else math.nan


def _paper_pair(pair) -> str:
  avg, full = pair
  return f"{'-' if avg is None else f'{avg:.2f}'} / {full:.2f}"


def _pct(values) -> str:
  return _common.mean_std_percent(values)


def simulate(seeds) -> collections.OrderedDict:
  """The `sim` part: waste per selection and seed (module docstring)."""
  pool = pools.adaptivefl_pool(
    models.width_units("vgg16", (32, 32, 3), 10), 0.66, 0.4, (8, 6, 4)
  )
  out = collections.OrderedDict()
  for label, (selection, _) in VARIANTS.items():
    runs = []
    for seed in seeds:
      result = simulation.simulate_selection(
        pool,
        simulation.VGG16_TABLE1_PARAMS,
        simulation.population(SIM_CLIENTS, seed),
        clients_per_round=SIM_PER_ROUND,
        rounds=SIM_ROUNDS,
        selection=selection,
        seed=seed,
      )
      window = 50
      runs.append(
        collections.OrderedDict(
          seed=seed,
          waste_rate=result.waste_rate(),
          first_100=result.waste_rate(0, 100),
          last_500=result.waste_rate(SIM_ROUNDS - 500),
          failed=int(result.failed.sum()),
          windows=[
            result.waste_rate(i, i + window)
            for i in range(0, SIM_ROUNDS, window)
          ],
        )
      )
    out[label] = runs
  return out


def _claim(
  claims, text, ours, theirs, note="", lower_is_better=False, noise=None
):
  """A claims-table row: `ours` better than `theirs` over seeds.

  `noise`: for one-seed rows, seed runs of the same methods elsewhere whose
  spread stands for theirs (`claim_verdict` on the one values, with the
  larger standard deviation of `noise` as the margin).
  """
  sign = -1 if lower_is_better else 1
  a, b = [sign * v for v in ours], [sign * v for v in theirs]
  margin = (
    0.0 if noise is None else max(_common.seed_stats(v)["std"] for v in noise)
  )
  verdict = _common.claim_verdict(a, b, noise=margin)
  claims.append([text, _pct(ours), _pct(theirs), verdict + note])


def build_tables(base, reports, parts, seeds=DEFAULT_SEEDS, capacities=""):
  """Markdown tables (ours beside the paper's), claims, and the numbers."""
  scale = (
    f"Ours: {base.dataset}, {base.model} (pool r_M:r_S ="
    f" {base.settings.pool_ratios}, I = {':'.join(map(str, _start_indices(base)))}),"
    f" {base.num_clients} clients, {base.clients_per_round} per round,"
    f" {base.rounds} rounds of {base.local_epochs} local epochs, batch"
    f" {base.batch_size}, SGD lr {base.client_lr} momentum"
    f" {base.client_momentum}; devices weak:medium:strong 4:3:3 with"
    f" capacities {capacities} parameters fluctuating by"
    f" {base.tier_fluctuation} (relative std), the same for every"
    f" method; seeds {', '.join(map(str, seeds))}. Test accuracy (%) at"
    " the last round, mean ± sample standard deviation over seeds"
    " (one value: one seed). Paper: CIFAR-10, VGG-16, 100 clients, 10"
    " per round, 5 local epochs, batch 50, lr 0.01 momentum 0.5."
  )
  md = [f"# AdaptiveFL reproduction\n\n{scale}\n"]
  results = collections.OrderedDict(
    scale=scale, seeds=list(seeds), tier_capacities=capacities
  )
  claims = []
  dists = list(DISTRIBUTIONS)

  def stats(name, key, which=seeds):
    return _metric(_seeded(reports, name, which), key)

  if "2" in parts:
    rows, numbers = [], collections.OrderedDict()
    for label, algorithm in ALGORITHMS.items():
      numbers[label] = collections.OrderedDict()
      row = [label]
      for dist, paper in zip(dists, PAPER_TABLE2[label]):
        name = _main_name(label, dist)
        avg, full = stats(name, "avg_accuracy"), stats(name, "accuracy")
        runs = _seeded(reports, name, seeds)
        numbers[label][dist] = collections.OrderedDict(
          avg=avg,
          full=full,
          client_macs=[r["client_flops_total"] for r in runs],
        )
        row += [
          "-" if algorithm == "all_large" else _pct(avg),
          _pct(full),
          _paper_pair(paper),
        ]
      rows.append(row)
    headers = ["Algorithm"]
    for d in dists:
      headers += [f"{d} avg", f"{d} full", f"{d} paper avg / full"]
    macs = [
      [label]
      + [
        f"{sum(v['client_macs']) / len(v['client_macs']):.3g}"
        for v in numbers[label].values()
      ]
      for label in ALGORITHMS
    ]
    md.append(
      "## Table 2: avg / full test accuracy\n\n"
      + _common.markdown_table(headers, rows)
      + "\n\nClient compute"
      " over the whole run (training MACs, all clients, measured;"
      " mean over seeds): Decoupled trains each of its three models"
      " on a cohort of its own (up to --clients_per_round devices that"
      " can hold it), so up to three times as many client-models a"
      " round as the others.\n\n"
      + _common.markdown_table(["Algorithm"] + dists, macs)
      + "\n"
    )
    results["table2"] = numbers
    for dist in dists:
      ada = numbers["AdaptiveFL"][dist]
      for other in ("HeteroFL", "Decoupled"):
        _claim(
          claims,
          f"AdaptiveFL avg > {other} avg ({dist}, Table 2)",
          ada["avg"],
          numbers[other][dist]["avg"],
        )
        _claim(
          claims,
          f"AdaptiveFL full > {other} full ({dist}, Table 2)",
          ada["full"],
          numbers[other][dist]["full"],
        )
      _claim(
        claims,
        f"AdaptiveFL full > All-Large full ({dist}, Table 2)",
        ada["full"],
        numbers["All-Large"][dist]["full"],
      )
      _claim(
        claims,
        f"HeteroFL full > Decoupled full ({dist}, Table 2;"
        " Decoupled worst needs this and AdaptiveFL full > Decoupled"
        " full)",
        numbers["HeteroFL"][dist]["full"],
        numbers["Decoupled"][dist]["full"],
      )
  if "3" in parts:
    rows, numbers = [], collections.OrderedDict()
    for label in PAPER_TABLE3:
      row, numbers[label] = [label], collections.OrderedDict()
      for j, proportion in enumerate(PROPORTIONS):
        # All-Large trains L1 on every device whatever it holds: its
        # Table 2 IID run stands in every column.
        name = (
          _main_name(label, "IID")
          if proportion == "4:3:3" or label == "All-Large"
          else _proportion_name(label, proportion)
        )
        avg = stats(name, "avg_accuracy", seeds[:1])
        full = stats(name, "accuracy", seeds[:1])
        numbers[label][proportion] = collections.OrderedDict(avg=avg, full=full)
        row += [
          "-" if label == "All-Large" else _pct(avg),
          _pct(full),
          _paper_pair(PAPER_TABLE3[label][j]),
        ]
      rows.append(row)
    headers = ["Algorithm"]
    for p in PROPORTIONS:
      headers += [f"{p} avg", f"{p} full", f"{p} paper"]
    md.append(
      f"## Table 3: weak:medium:strong proportions (IID, seed"
      f" {seeds[0]} only)\n\n" + _common.markdown_table(headers, rows) + "\n"
    )
    results["table3"] = numbers
    for proportion in PROPORTIONS[1:]:
      noise = None
      if "2" in parts:  # The 4:3:3 runs' spread over seeds.
        noise = [
          results["table2"][m]["IID"]["full"]
          for m in ("AdaptiveFL", "HeteroFL")
        ]
      for other in ("HeteroFL", "All-Large"):
        _claim(
          claims,
          f"AdaptiveFL full > {other} full ({proportion}, Table 3)",
          numbers["AdaptiveFL"][proportion]["full"],
          numbers[other][proportion]["full"],
          " (one seed; noise: the 4:3:3 runs' std)" if noise else " (one seed)",
          noise=noise,
        )
  if "4" in parts:
    rows, numbers = [], collections.OrderedDict()
    for grain in ("coarse", "fine"):
      numbers[grain] = collections.OrderedDict()
      row = [grain]
      for dist in dists:
        name = (
          _coarse_name(dist)
          if grain == "coarse"
          else _main_name("AdaptiveFL", dist)
        )
        runs = _seeded(reports, name, seeds)
        numbers[grain][dist] = collections.OrderedDict(
          avg=stats(name, "avg_accuracy"),
          full=stats(name, "accuracy"),
          trained_nothing=[_common.history_sum(r, "failed") for r in runs],
        )
        row += [
          _pct(numbers[grain][dist]["full"]),
          _pct(numbers[grain][dist]["avg"]),
          " / ".join(f"{v:g}" for v in numbers[grain][dist]["trained_nothing"]),
        ]
      rows.append(row + [" / ".join(f"{v:.2f}" for v in PAPER_TABLE4[grain])])
    headers = ["Pool"]
    for d in dists:
      headers += [f"{d} full", f"{d} avg", f"{d} idle"]
    md.append(
      f"## Table 4: coarse (p = 1, I = {_start_indices(base)[0]}) vs"
      f" fine (p = {len(_start_indices(base))}) pool\n\n"
      + _common.markdown_table(
        headers + [f"paper full ({' / '.join(dists)})"], rows
      )
      + "\n\nidle: client-rounds in which the device could hold no"
      " pool member it could reach and trained nothing (the sum of"
      " the `failed` metric, per seed). The capacities are the"
      " population's, set from the fine pool (weak devices hold 0.95"
      " x S1 on average), and the coarse pool's smallest member is"
      " S1, so its weak devices idle whenever their capacity dips"
      " below S1; the fine pool lets them train S2.\n"
    )
    results["table4"] = numbers
    for dist in dists:
      _claim(
        claims,
        f"fine pool full > coarse pool full ({dist}, Table 4)",
        numbers["fine"][dist]["full"],
        numbers["coarse"][dist]["full"],
        " (coarse: some weak devices idle, see Table 4)"
        if sum(numbers["coarse"][dist]["trained_nothing"])
        else "",
      )
  if "5" in parts:
    rows, numbers = [], collections.OrderedDict()
    for label, (selection, every_seed) in VARIANTS.items():
      which = seeds if every_seed else seeds[:1]
      runs = _seeded(reports, _variant_name(selection), which)
      numbers[label] = collections.OrderedDict(
        waste_rate=[_waste_rate(r) for r in runs],
        avg=_metric(runs, "avg_accuracy"),
        full=_metric(runs, "accuracy"),
      )
      rows.append(
        [
          label + ("" if every_seed else " (one seed)"),
          _pct(numbers[label]["waste_rate"]),
          _pct(numbers[label]["avg"]),
          _pct(numbers[label]["full"]),
        ]
      )
    md.append(
      "## Figure 5: selection strategies in training (IID)\n\n"
      + _common.markdown_table(["Variant", "waste rate", "avg", "full"], rows)
      + "\n\n"
      "The paper (CIFAR-100, ResNet-18) shows AdaptiveFL+CS with the"
      " highest accuracy at a low waste rate; it prints no numbers.\n"
    )
    results["figure5"] = numbers
    cs = numbers["AdaptiveFL+CS"]
    for other in ("AdaptiveFL+Random", "AdaptiveFL+Greed"):
      _claim(
        claims,
        f"waste: AdaptiveFL+CS < {other} (Figure 5a, training)",
        cs["waste_rate"],
        numbers[other]["waste_rate"],
        lower_is_better=True,
      )
      _claim(
        claims,
        f"accuracy: AdaptiveFL+CS avg > {other} avg (Figure 5b)",
        cs["avg"],
        numbers[other]["avg"],
      )
  if "sim" in parts:
    sim = simulate(seeds)
    rows = []
    for label, runs in sim.items():
      rows.append(
        [label]
        + [
          _pct([r[k] for r in runs])
          for k in ("waste_rate", "first_100", "last_500")
        ]
        + [f"{sum(r['failed'] for r in runs) / len(runs):.1f}"]
      )
    md.append(
      f"## Selection only: {SIM_ROUNDS} rounds on the paper's VGG-16"
      " pool\n\nThe real selection, device rule and table updates"
      " (no training), the paper's VGG-16 pool (Table 1 sizes), the"
      " reference code's VGG-16 devices (8, 16, 35 million parameters,"
      f" relative spreads 1/8, 1/16, 2/35, 4:3:3), {SIM_CLIENTS}"
      f" clients, {SIM_PER_ROUND} per round, seeds"
      f" {', '.join(map(str, seeds))}. Waste rate (%) in parameters,"
      " mean ± std over seeds.\n\n"
      + _common.markdown_table(
        [
          "Selection",
          "all rounds",
          "rounds 1-100",
          f"rounds {SIM_ROUNDS - 499}-{SIM_ROUNDS}",
          "clients that trained nothing (per run)",
        ],
        rows,
      )
      + "\n"
    )
    results["selection_simulation"] = sim
    rl = sim["AdaptiveFL+CS"]
    for other in ("AdaptiveFL+Random", "AdaptiveFL+Greed"):
      _claim(
        claims,
        f"waste: RL < {other[len('AdaptiveFL+') :].lower()}"
        f" selection (selection only, rounds {SIM_ROUNDS - 499}-"
        f"{SIM_ROUNDS})",
        [r["last_500"] for r in rl],
        [r["last_500"] for r in sim[other]],
        lower_is_better=True,
      )
  if claims:
    md.append(
      "## Claims\n\n"
      + _common.markdown_table(["Claim", "ours", "baseline", "verdict"], claims)
      + '\n\n"within'
      ' noise": the difference of the means is not larger than the larger'
      " sample standard deviation of the two (over seeds); for waste, lower"
      " is better.\n"
    )
    results["claims"] = [
      dict(zip(("claim", "ours", "baseline", "verdict"), c)) for c in claims
    ]
  results["runs"] = [
    _common.run_record(run, reports[run.name])
    for run in plan_runs(base, parts, seeds)
  ]
  return "\n".join(md), results


def _mean_curve(reports, key):
  """(round, mean over reports of `key`) at the evaluated rounds."""
  curves = [_common.curve(r, "round", key) for r in reports]
  if not curves:
    return []
  rounds = [x for x, _ in curves[0]]
  return [
    (x, sum(dict(c)[x] for c in curves) / len(curves))
    for x in rounds
    if all(x in dict(c) for c in curves)
  ]


def plot(out_dir, reports, parts, seeds=DEFAULT_SEEDS) -> list[str]:
  """Table 2's curves, Figure 5's bars, the simulation's waste over rounds;
  and each run's metrics.csv copied under `metrics/`."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  _common.copy_run_metrics(out_dir, reports)
  paths = []
  if "2" in parts:
    fig, axes = plt.subplots(
      1, len(DISTRIBUTIONS), figsize=(10, 3.5), dpi=100, sharey=True
    )
    for ax, dist in zip(axes, DISTRIBUTIONS):
      for label, algorithm in ALGORITHMS.items():
        key = "accuracy" if algorithm == "all_large" else "avg_accuracy"
        points = _mean_curve(
          _seeded(reports, _main_name(label, dist), seeds), key
        )
        if points:
          ax.plot(*zip(*points), marker="o", markersize=3, label=label)
      ax.set_title(dist)
      ax.set_xlabel("round")
      ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("avg test accuracy, mean over seeds\n(All-Large: full)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "table2_curves.png"))
    fig.savefig(paths[-1])
    plt.close(fig)
  if "5" in parts:
    labels = list(VARIANTS)
    wastes, accs = [], []
    for selection, every_seed in VARIANTS.values():
      runs = _seeded(
        reports, _variant_name(selection), seeds if every_seed else seeds[:1]
      )
      wastes.append([_waste_rate(r) for r in runs])
      accs.append(_metric(runs, "avg_accuracy"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5), dpi=100)
    for ax, values, title in (
      (left, wastes, "communication waste rate"),
      (right, accs, "avg test accuracy"),
    ):
      stats = [_common.seed_stats(v) for v in values]
      ax.bar(
        range(len(labels)),
        [s["mean"] for s in stats],
        yerr=[s["std"] for s in stats],
        capsize=3,
      )
      ax.set_title(f"{title} (mean ± std over seeds)")
      ax.set_xticks(range(len(labels)))
      ax.set_xticklabels([l.replace("AdaptiveFL", "") for l in labels])
      ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "figure5.png"))
    fig.savefig(paths[-1])
    plt.close(fig)
  return paths


def plot_simulation(out_dir, sim) -> str:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
  for label, runs in sim.items():
    windows = len(runs[0]["windows"])
    step = SIM_ROUNDS // windows
    mean = [
      sum(r["windows"][i] for r in runs) / len(runs) for i in range(windows)
    ]
    ax.plot(
      [step * (i + 1) for i in range(windows)],
      mean,
      marker="o",
      markersize=3,
      label=label.replace("AdaptiveFL+", ""),
    )
  ax.set_xlabel(f"round (waste over each {step}-round window)")
  ax.set_ylabel("waste rate, mean over seeds")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  path = os.path.join(out_dir, "selection_waste.png")
  fig.savefig(path)
  plt.close(fig)
  return path


def main(argv):
  seeds = tuple(_common.seeds_from_flag(DEFAULT_SEEDS))
  state = {}

  def base_with_population():
    if "base" not in state:
      import attrs  # pylint: disable=g-import-not-at-top

      base = _common.base_config(OFFLINE_DEFAULTS)
      state["capacities"] = population_capacities(base)
      state["base"] = attrs.evolve(base, tier_capacities=state["capacities"])
    return state["base"]

  def plan(base, parts):
    del base
    return plan_runs(base_with_population(), parts, seeds)

  def tables(base, reports, parts):
    del base
    text, results = build_tables(
      base_with_population(), reports, parts, seeds, state["capacities"]
    )
    state["sim"] = results.get("selection_simulation")
    return text, results

  def plots(out_dir, reports, parts):
    paths = plot(out_dir, reports, parts, seeds)
    if state.get("sim"):
      paths.append(plot_simulation(out_dir, state["sim"]))
    return paths

  _common.reproduce_main(
    argv,
    flag="--parts",
    selected=_common.PARTS_FLAG.value or PARTS,
    accepted=PARTS,
    defaults=OFFLINE_DEFAULTS,
    plan_runs=plan,
    build_tables=tables,
    plot=plots,
  )


if __name__ == "__main__":
  _cli.run_main(main)
