r"""Reproduce FedGKT's Tables 1-5 and its efficiency comparison at reduced scale.

  python -m pipelines.reproduce.fedgkt                     # offline default
  python -m pipelines.reproduce.fedgkt --dataset=cifar10 --data_dir=DIR \
      --gkt_server_model=fedgkt_server_resnet55 --num_clients=16 \
      --clients_per_round=16 --rounds=100 --gkt_server_epochs=20 \
      --augment=crop_flip
  python -m pipelines.reproduce.fedgkt --dataset=cinic10 --data_dir=DIR ...
  python -m pipelines.reproduce.fedgkt --dataset=cifar100 --data_dir=DIR ...

Paper: He, Annavaram and Avestimehr, "Group Knowledge Transfer: Federated
Learning of Large CNNs at the Edge" (NeurIPS 2020), Section 4: CIFAR-10/100
and CINIC-10, 16 clients all training every round, the ResNet-8 edge model
with ResNet-55/109 on the server, compared with FedAvg of ResNet-56/110 and
centralized ResNet-56 and ResNet-8 (Table 1, I.I.D. and non-I.I.D.); the
loss ablation (Table 2), asynchronous training (Table 3), the number of
edges (Table 4), ResNet-4/6 edges (Table 5) and the edge's compute and
traffic against FedAvg and split learning (Section 4.3).

Runs (every flag of `pipelines.train` applies to all of them; the full
model of the baselines is the one the server model stands for, ResNet-20
for `fedgkt_server_resnet19`, ResNet-56 for `_resnet55`):

* Table 1: FedGKT and FedAvg (full model) on the IID and the Dirichlet
  (`--alpha`, default 0.5) split; centralized full model and edge model (one
  client holding all the training data, same rounds and local epochs);
* Table 2: FedGKT with transfer none and server-to-edge (IID; "both" is
  Table 1's);
* Table 3: FedGKT asynchronous (IID);
* Table 4: FedGKT with half and twice as many edges, all training;
* Table 5: FedGKT with the ResNet-4 and ResNet-6 edges.

The offline default is the embedded 5,000-image MNIST subset with the
ResNet-8 edge and the ResNet-19 server (ResNet-20 split; ResNet-55 is
`--gkt_server_model=fedgkt_server_resnet55`), 8 clients all training each
round, 10 rounds of 1 client epoch and 2 server epochs, batch 32, seed 0.
Writes `tables.md`, `results.json` and `accuracy.png` under
`<root_output_dir>/<experiment_name>/`; an interrupted reproduction
continues where it stopped.
"""

from __future__ import annotations

import collections
import math
import os


from pipelines import _cli
from pipelines import train  # noqa: F401  (defines the shared flags)
from pipelines.reproduce import _common

# --parts: the paper's tables (the efficiency comparison comes with 1).
PARTS = ("1", "2", "3", "4", "5")
OFFLINE_DEFAULTS = collections.OrderedDict(
    dataset="mnist5k", model="fedgkt_edge_resnet8",
    gkt_server_model="fedgkt_server_resnet19", num_clients=8,
    clients_per_round=8, rounds=10, local_epochs=1, batch_size=32,
    client_lr=0.05, client_momentum=0.9, gkt_server_epochs=2,
    gkt_server_optimizer="adam", gkt_server_lr=1e-3, partition="iid",
    alpha=0.5, min_samples_per_client=1, eval_every=2, checkpoint_every=1,
    experiment_name="fedgkt_reproduction", progress=False)

# The paper's CIFAR-10 figures (%), ResNet-56 block of Table 1.
PAPER = collections.OrderedDict(
    table1=collections.OrderedDict([
        ("FedGKT", (92.97, 86.59)), ("FedAvg", (92.88, 86.60)),
        ("Centralized (full model)", (93.05,)),
        ("Centralized (edge model)", (78.94,))]),
    table2=collections.OrderedDict([
        ("none", "diverges"), ("server_to_edge", 92.97), ("both", 90.53)]),
    table3=collections.OrderedDict([("sync", 92.97), ("async", 92.92)]),
    table4="CIFAR-100: 8 edges 69.51, 16 69.57, 64 69.65, 128 69.59",
    table5=collections.OrderedDict([
        ("fedgkt_edge_resnet4", 88.86), ("fedgkt_edge_resnet6", 90.32),
        ("fedgkt_edge_resnet8", 92.97)]))


def _full_model(base) -> str:
  from tff_hetero.algorithms import fedgkt  # pylint: disable=g-import-not-at-top
  return fedgkt.FULL_MODEL_OF_SERVER[base.gkt_server_model]


def plan_runs(base, parts):
  plan = _common.RunPlan(base)
  add = plan.add

  gkt = dict(algorithm="fedgkt", partition="iid")
  noniid = dict(partition="dirichlet")
  central = dict(algorithm="fedavg", num_clients=1, clients_per_round=1,
                 partition="iid")
  if "1" in parts:
    add("fedgkt_iid", **gkt)
    add("fedgkt_noniid", **{**gkt, **noniid})
    add("fedavg_iid", algorithm="fedavg", model=_full_model(base),
        partition="iid")
    add("fedavg_noniid", algorithm="fedavg", model=_full_model(base),
        **noniid)
    add("central_full", model=_full_model(base), **central)
    add("central_edge", **central)
  if "2" in parts:
    add("fedgkt_iid", **gkt)
    for transfer in ("none", "server_to_edge"):
      add(f"fedgkt_transfer_{transfer}", gkt_transfer=transfer, **gkt)
  if "3" in parts:
    add("fedgkt_iid", **gkt)
    add("fedgkt_async", gkt_mode="async", **gkt)
  if "4" in parts:
    add("fedgkt_iid", **gkt)
    for clients in (max(1, base.num_clients // 2), 2 * base.num_clients):
      add(f"fedgkt_edges_{clients}", num_clients=clients,
          clients_per_round=clients, **gkt)
  if "5" in parts:
    add("fedgkt_iid", **gkt)
    for edge in ("fedgkt_edge_resnet4", "fedgkt_edge_resnet6"):
      add(f"fedgkt_{edge[len('fedgkt_edge_'):]}", model=edge, **gkt)
  return plan.runs()


def _accuracy(report) -> float:
  return _common.final_metric(report, "accuracy")


def _best(report) -> float:
  value = report.get("best_accuracy")
  return math.nan if value is None else float(value)


def _efficiency(base, reports) -> list[list[str]]:
  """Section 4.3 from the measured IID runs: edge cost and traffic."""
  gkt, fedavg = reports["fedgkt_iid"], reports["fedavg_iid"]
  profile = gkt["algorithm"]["fedgkt_models"]
  mib = lambda b: f"{b / _common.MIB:.2f}"
  last = gkt["history"][-1]
  split_bytes = (last["split_learning_bytes_per_batch"] *
                 gkt["examples_processed_total"] / base.batch_size)
  gkt_bytes = gkt["bytes_up_total"] + gkt["bytes_down_total"]
  fedavg_bytes = fedavg["bytes_up_total"] + fedavg["bytes_down_total"]
  return [
      ["edge parameters", f"{profile['edge_params']:,}",
       f"{profile['full_params']:,}",
       f"{profile['full_params'] / profile['edge_params']:.1f}x"],
      ["edge forward MACs per example", f"{profile['edge_flops']:,}",
       f"{profile['full_flops']:,}",
       f"{profile['full_flops'] / profile['edge_flops']:.1f}x"],
      ["client compute, whole run (MACs)", f"{gkt['client_flops_total']:,}",
       f"{fedavg['client_flops_total']:,}",
       f"{fedavg['client_flops_total'] / gkt['client_flops_total']:.1f}x"],
      ["traffic, whole run (MiB, up + down)", mib(gkt_bytes),
       mib(fedavg_bytes), f"{fedavg_bytes / gkt_bytes:.2f}x"],
      ["split learning, same batches (MiB)", mib(gkt_bytes),
       mib(split_bytes), f"{split_bytes / gkt_bytes:.2f}x"],
  ]


def build_tables(base, reports, parts):
  full = _full_model(base)
  scale = (f"Ours: {base.dataset}, edge {base.model}, server"
           f" {base.gkt_server_model} (a {full} split), {base.num_clients}"
           f" clients ({base.clients_per_round} per round), {base.rounds}"
           f" rounds of {base.local_epochs} client and"
           f" {base.gkt_server_epochs} server epochs, batch {base.batch_size},"
           f" client SGD lr {base.client_lr} momentum {base.client_momentum},"
           f" server {base.gkt_server_optimizer} lr {base.gkt_server_lr}, T ="
           f" {base.gkt_temperature}, non-IID = Dirichlet alpha {base.alpha},"
           f" seed {base.seed}; accuracy in % at the last round (best in"
           " brackets); FedGKT's is the mean over clients of extractor +"
           " server. Paper: CIFAR-10, ResNet-8 edge, ResNet-55 server, 16"
           " clients.")
  text = [f"# FedGKT reproduction\n\n{scale}\n"]
  results = collections.OrderedDict(scale=scale)
  def cell(report) -> str:
    return (f"{_common.percent(_accuracy(report))}"
            f" ({_common.percent(_best(report))})")

  if "1" in parts:
    rows = [
        ["FedGKT", cell(reports["fedgkt_iid"]),
         cell(reports["fedgkt_noniid"]), "92.97 / 86.59"],
        [f"FedAvg ({full})", cell(reports["fedavg_iid"]),
         cell(reports["fedavg_noniid"]), "92.88 / 86.60"],
        [f"Centralized ({full})", cell(reports["central_full"]), "",
         "93.05"],
        [f"Centralized ({base.model})", cell(reports["central_edge"]), "",
         "78.94"]]
    text.append("## Table 1\n\n" + _common.markdown_table(
        ["Method", "IID", "non-IID", "paper (IID / non-IID)"], rows) + "\n")
    edge_alone = _common.final_metric(reports["fedgkt_iid"], "edge_accuracy")
    text.append(f"FedGKT's edge models alone (IID): "
                f"{_common.percent(edge_alone)}.\n")
    text.append("## Efficiency (Section 4.3, IID runs)\n\n" +
                _common.markdown_table(
                    ["", "FedGKT", f"FedAvg {full} / split learning",
                     "ratio"], _efficiency(base, reports)) + "\n")
    results["table1"] = {name: _accuracy(reports[name]) for name in (
        "fedgkt_iid", "fedgkt_noniid", "fedavg_iid", "fedavg_noniid",
        "central_full", "central_edge")}
  if "2" in parts:
    names = collections.OrderedDict([
        ("none", "fedgkt_transfer_none"),
        ("server_to_edge", "fedgkt_transfer_server_to_edge"),
        ("both", "fedgkt_iid")])
    rows = [[k, cell(reports[v]), PAPER["table2"][k]]
            for k, v in names.items()]
    text.append("## Table 2 (knowledge transfer)\n\n" + _common.markdown_table(
        ["transfer", "accuracy", "paper"], rows) + "\n")
    results["table2"] = {k: _accuracy(reports[v]) for k, v in names.items()}
  if "3" in parts:
    rows = [["sync", cell(reports["fedgkt_iid"]), 92.97],
            ["async", cell(reports["fedgkt_async"]), 92.92]]
    text.append("## Table 3 (asynchronous training)\n\n" +
                _common.markdown_table(["mode", "accuracy", "paper"], rows) +
                "\n")
    results["table3"] = {"sync": _accuracy(reports["fedgkt_iid"]),
                         "async": _accuracy(reports["fedgkt_async"])}
  if "4" in parts:
    counts = sorted({max(1, base.num_clients // 2), base.num_clients,
                     2 * base.num_clients})
    name = lambda n: ("fedgkt_iid" if n == base.num_clients else
                      f"fedgkt_edges_{n}")
    text.append("## Table 4 (number of edges)\n\n" + _common.markdown_table(
        ["edges"] + [str(n) for n in counts],
        [["accuracy"] + [cell(reports[name(n)]) for n in counts]]) +
                f"\n\nPaper: {PAPER['table4']}.\n")
    results["table4"] = {str(n): _accuracy(reports[name(n)]) for n in counts}
  if "5" in parts:
    names = collections.OrderedDict([
        ("fedgkt_edge_resnet4", "fedgkt_resnet4"),
        ("fedgkt_edge_resnet6", "fedgkt_resnet6")])
    names[base.model] = "fedgkt_iid"
    rows = [[k, cell(reports[v]), PAPER["table5"].get(k, "")]
            for k, v in names.items()]
    text.append("## Table 5 (smaller edge models)\n\n" +
                _common.markdown_table(["edge", "accuracy", "paper"], rows) +
                "\n")
    results["table5"] = {k: _accuracy(reports[v]) for k, v in names.items()}
  return "\n".join(text), results


def plot(out_dir, reports, parts) -> list[str]:
  del parts
  return [_common.plot_curves(
      os.path.join(out_dir, "accuracy.png"),
      {name: _common.curve(report, "round")
       for name, report in reports.items()}, xlabel="round")]


def _check(base) -> None:
  from tff_hetero.algorithms import fedgkt  # pylint: disable=g-import-not-at-top
  fedgkt.check_flags(base)


def main(argv):
  _common.reproduce_main(
      argv, flag="--parts", selected=_common.PARTS_FLAG.value or PARTS,
      accepted=PARTS,
      defaults=OFFLINE_DEFAULTS, plan_runs=plan_runs,
      build_tables=build_tables, plot=plot,
      check=_check)


if __name__ == "__main__":
  _cli.run_main(main)
