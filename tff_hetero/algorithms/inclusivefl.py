"""InclusiveFL (Liu et al., "No One Left Behind: Inclusive Federated
Learning over Heterogeneous Devices", KDD 2022) and its baselines.

Every device tier trains a model of its own depth (4 / 8 / 12 encoder
blocks in the paper) of one depth-scalable model (`tff_hetero.models.depth`:
an embedding, encoder blocks of one shape, a head). The clients of a tier
keep that tier: the server groups each round's cohort by tier (Algorithm 1,
line 6; the server knows each device's type) and runs Algorithm 1 in
`depth_computations.py`: per group the clients train the group's sub-global
model W_j and upload their updates, whose mean g_j (over users, line 14)
passes through the momentum distillation and a per-group FedAdam step
(lines 15-23), then the embedding and the blocks below each group's top
block are averaged across the groups that hold them, weighted by the
round's client counts (lines 25-29). A device receives and trains only its
group's model: no layer it does not train is ever sent.

The baselines of the paper's Table 2 run on the same computations and the
same device population, differing only in which depth each tier trains and
whether layers are shared (`VARIANTS`):

* `inclusivefl_all_large`: every client trains the deepest model, capacity
  ignored (the paper's upper bound);
* `inclusivefl_all_small`: every client trains the shallowest model;
* `exclusivefl`: only the tiers of the deepest model train; the others are
  sampled as usual and dropped (they receive nothing);
* a tier with depth 0 in `--inclusivefl_depths` is dropped likewise (the
  paper's Figure 5); the global model is then the deepest that trains;
* `inclusivefl_local`: each tier trains its depth alone, nothing shared,
  no distillation (the paper's "Local" in a cross-device form, below);
* InclusiveFL without momentum distillation: `--inclusivefl_beta=0`;
* HeteroFL with width-matched tiers is `--algorithm=heterofl` on the same
  depth-scalable model with `--heterofl_width_units=hidden`: its default
  tier capacities are the depth tiers' parameter counts
  (`task_devices.py`), so its rates narrow the hidden size to the
  parameter counts of the 4 / 8 / 12-block models, as the paper narrows
  768 to 456 / 624.

Each device tier's depth is `--inclusivefl_depths` (one per tier of
`--tiers`, default the model's registered depths, e.g. 4:8:12), checked
against the tier's capacity in trainable parameters.

Departures from the paper and from its code (`Rachelxuan11/InclusiveFL`),
each with its reason:

* Algorithm 1 as written (tested against a by-hand oracle over two
  rounds). The official code's momentum distillation applies in round 0
  only: it distils only while the stored momentum is still the integer 0
  (a type check, true before the first heterogeneous aggregation), so it
  scales the top block's first update by (1 - beta) once; and its
  aggregation assigns where it means to accumulate, so the momentum it
  stores is the update of block L_k alone over n, not the mean of blocks
  L^- .. L_k. It caches that update before distilling it; ours takes line
  22's mean after line 17, as written.
* The official code's clients take no local step (its per-batch SGD
  optimizer never calls `step()`: a tier's update is the gradient of its
  pooled data at the server weights, FedSGD), its server optimizer is
  AdamW with a linear decay to 0 and one learning rate per tier (2e-4 /
  5e-5 / 5e-5), and it shares the classifier head across tiers unless
  `--local_cls` is given. Ours follows the paper in each: local SGD
  epochs ("local optimization with SGD"), one constant FedAdam rate for
  every type ("the same learning rate for each type"), a head per group
  (Algorithm 1, lines 28-29).
* Device types: the paper (and its code, `random.choices`) gives each
  client a type at random with equal probability; the device population
  here gives the tiers exact proportions by a seeded permutation
  (`devices.population`), the same population for every algorithm of a
  comparison, so no method sees more strong clients than another.
* g_j is the unweighted mean over the group's users (line 14); the
  heterogeneous aggregation weighs groups by their number of users this
  round (lines 26-27). The official code weighs by sample share; with the
  paper's IID split into 1,000 clients both are nearly the same.
* The embedding is shared by every group (the paper's shared module is
  "bottom encoding layers"; the official code averages every same-named
  parameter, the embeddings included).
* m_j is the mean of the updates of blocks L^- .. L_j as line 22 reads,
  the update of block L_j being the one line 17 already distilled.
* A group absent from a round keeps its model, optimizer state and
  momentum (see `depth_computations.py`).
* With a tier dropped (a depth of 0, Figure 5), "the device type that is
  greater than j" of line 17 is the next deeper group that trains: without
  the medium tier the 4-block model's top block is distilled with the
  12-block group's momentum, the mean update of its blocks 4 .. 12. The
  paper defines the step only with all three types present.
* Initial models: every group's embedding and blocks 1 .. L_j are the
  deepest model's (line 2); heads are built from the same seed, where
  the paper has a head f_0^j per type and does not say how each starts:
  one seed makes the groups differ at round 0 only in depth, which is what
  Table 2's rows compare. With `--init_weights` every group's model is
  loaded from the one file.
* FedAdam is TFF's Adam (`tff.learning.optimizers.build_adam`), which
  corrects the moments' bias (the step size times sqrt(1 - beta_2^t) /
  (1 - beta_1^t)); Reddi et al.'s FedAdam, which the paper writes, has no
  bias correction. Uncorrected, with the defaults beta_1 = 0.9 and beta_2
  = 0.99, the first step is the same (1 - beta_1 = sqrt(1 - beta_2)), the
  steps around round 13 are up to 2.1 times as large (for a constant
  gradient, (1 - beta_1^t) / sqrt(1 - beta_2^t)), and within 3 % of ours
  after round 300. Kept because the official code's AdamW corrects the
  bias too, and TFF's Adam is what a TFF user composes.
* `inclusivefl_local` is the paper's "Local" in its cross-device form: each
  tier federated on its own (FedAdam within the tier), nothing shared.
* Not in the paper: a client whose update TFF zeroed as non-finite does
  not count in its group's n_j (nor in g_j's mean: its weight is 0) and is
  counted in `non_finite_updates`. A group left with no finite update is
  absent from the step, and the round reports a NaN loss (diverged).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from collections.abc import Sequence
import math
import types
from typing import Any
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import models as models_lib
from tff_hetero.algorithms import api
from tff_hetero.algorithms import depth_computations
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import task_devices
from tff_hetero.algorithms.depth_computations import DepthGroup
from tff_hetero.algorithms.fedadam import FedAdamSettings
from tff_hetero.errors import ModelError
from tff_hetero.errors import UsageError
from tff_hetero.models import depth as depth_lib
from tff_hetero.parsing import parse_number_list
from tff_hetero.runtime.contexts import compile_ahead
from tff_hetero.settings import in_interval
from tff_hetero.settings import setting

__all__ = [
  "DEFAULTS",
  "DepthSettings",
  "InclusiveFL",
  "InclusiveFLSettings",
  "VARIANTS",
  "build_inclusivefl",
]


# The common settings InclusiveFL and its baselines default differently
# (`registry.AlgorithmEntry.defaults`): the depth-scalable transformer, the
# paper's equal tier shares, and a server learning rate for Adam.
DEFAULTS = types.MappingProxyType(
  {"model": "transformer", "tier_proportions": "1:1:1", "server_lr": 0.003}
)


@attrs.frozen(kw_only=True)
class DepthSettings(FedAdamSettings):
  inclusivefl_depths: str = setting(
    "",
    "Encoder depth each tier of --tiers trains, colon-separated (default:"
    " the model's registered depths, e.g. 4:8:12), each checked against the"
    " tier's capacity; 0 drops the tier (sampled, never trained: the"
    " paper's Figure 5).",
  )
  init_weights: str = setting(
    "",
    "Initial weights of the depth-scalable model: a .npz of"
    " tff_hetero.models.save_depth_weights or a Keras HDF5 weights file of a"
    " model at least as deep as the deepest group; every group's embedding,"
    " blocks and head are loaded from it (default: the seeded"
    " initialisation).",
  )
  server_adam_beta_1: float = setting(
    0.9,
    "FedAdam server beta_1.",
    check=in_interval(0.0, 1.0, closed_high=False),
  )
  server_adam_beta_2: float = setting(
    0.99,
    "FedAdam server beta_2.",
    check=in_interval(0.0, 1.0, closed_high=False),
  )


@attrs.frozen(kw_only=True)
class InclusiveFLSettings(DepthSettings):
  inclusivefl_beta: float = setting(
    0.2,
    "InclusiveFL momentum-distillation factor beta (0: without MD; the"
    " paper's 0.2 for GLUE).",
    check=in_interval(0.0, 1.0, closed_high=True),
  )
  inclusivefl_share_layers: bool = setting(
    True,
    "InclusiveFL's layer-wise heterogeneous aggregation (Algorithm 1, lines"
    " 25-29); false: momentum distillation only, as the paper's Table 5"
    " row marked *.",
  )


@attrs.frozen
class Variant:
  """Which depth each tier trains and whether groups share layers.

  Attributes:
    name: The registry name.
    assign: `(tier depths) -> tier depths`, None for a tier that is dropped.
    share: Whether lines 25-29 (shared layers) run.
    distil: Whether lines 15-23 use `--inclusivefl_beta` (else beta = 0).
    capacity_checked: Whether a tier's depth must fit its capacity.
  """

  name: str
  assign: Any
  share: bool = True
  distil: bool = True
  capacity_checked: bool = True


def _deepest_only(depths):
  deepest = max(d for d in depths.values() if d)
  return {t: (d if d == deepest else None) for t, d in depths.items()}


def _everyone(pick):
  """Every tier that trains trains `pick` of their depths (a dropped tier
  stays dropped)."""

  def assign(depths):
    chosen = pick(d for d in depths.values() if d)
    return {t: (chosen if d else None) for t, d in depths.items()}

  return assign


VARIANTS: Mapping[str, Variant] = collections.OrderedDict(
  (v.name, v)
  for v in (
    Variant("inclusivefl", dict),
    Variant(
      "inclusivefl_all_large",
      _everyone(max),
      distil=False,
      capacity_checked=False,
    ),
    Variant(
      "inclusivefl_all_small",
      _everyone(min),
      distil=False,
    ),
    Variant("exclusivefl", _deepest_only, distil=False),
    Variant("inclusivefl_local", dict, share=False, distil=False),
  )
)


class InclusiveFL(api.FederatedAlgorithm):
  """Algorithm 1 over fixed depth groups (module docstring).

  State: `OrderedDict(models=[W_j ...], optimizer_states=[...],
  momenta=[B ...])` of NumPy arrays, the groups shallowest first
  (`depth_computations.DepthComputations`).
  """

  def __init__(
    self,
    task: api.Task,
    tier_depths: Mapping[str, Optional[int]],
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    beta: float = 0.2,
    share: bool = True,
    name: str = "inclusivefl",
    init_weights: Optional[str] = None,
  ):
    if task.depth_model_fn is None:
      raise UsageError("--model", f"{task.model_name} has no depth knob")
    self.name = name
    self.task = task
    self.tier_depths = dict(tier_depths)
    depths = sorted({d for d in self.tier_depths.values() if d is not None})
    if not depths:
      raise UsageError("--inclusivefl_depths", "no tier trains any model")
    self.groups = tuple(self._group(d, init_weights) for d in depths)
    self._group_of_tier = {
      tier: depths.index(d)
      for tier, d in self.tier_depths.items()
      if d is not None
    }
    self._initial_models = self._initial_models_from()
    self.computations = depth_computations.DepthComputations(
      self.groups,
      task.element_spec,
      task.tff_model_fn,
      client_optimizer=client_optimizer,
      server_optimizer=server_optimizer,
      beta=beta,
      share=share,
    )

  def _group(self, depth: int, init_weights: Optional[str]) -> DepthGroup:
    """The group of `depth`, its model built once (the one the device
    tiers' capacities were counted on, `task_devices.take_built_model`):
    seeded, or loaded from `init_weights`. That model is then what
    `keras_fn` returns to its first caller outside a graph (the client
    work's type probe, or the evaluator), every other call building a new
    one."""
    task = self.task
    model = task_devices.take_built_model(task, depth)
    spare = []

    def keras_fn():
      if spare and tf.executing_eagerly():
        return spare.pop()
      return task.depth_model_fn(depth)

    if init_weights:
      try:
        depth_lib.load_depth_weights(model, init_weights)
      except ModelError as e:
        raise UsageError("--init_weights", str(e)) from None
    group = DepthGroup(
      name=f"L{depth}",
      depth=depth,
      keras_fn=keras_fn,
      partition=depth_lib.depth_partition(model),
      training_flops_per_example=models_lib.training_flops_per_example(model),
      initial_weights=tuple(
        np.asarray(w, np.float32) for w in model.trainable_weights
      ),
    )
    spare.append(model)
    return group

  # -- state ---------------------------------------------------------------

  def initialize(self):
    return self.computations.initial_state(self._initial_models)

  def _initial_models_from(self):
    """Every group's initial trainable weights (Algorithm 1, lines 1-3):
    its own, with the shared layers the deepest group's (line 2)."""
    source = self.groups[-1].partition
    deepest = self.groups[-1].initial_weights
    models = []
    for group in self.groups:
      weights = list(group.initial_weights)
      target = group.partition
      for a, b in zip(target.embedding, source.embedding):
        weights[a] = deepest[b]
      for layer in range(group.depth):
        for a, b in zip(target.blocks[layer], source.blocks[layer]):
          weights[a] = deepest[b]
      models.append(weights)
    return models

  def model_weights(self, state):
    return self._weights(state, len(self.groups) - 1)

  def _weights(self, state, j: int):
    return tff.learning.models.ModelWeights(
      trainable=[np.asarray(w) for w in state["models"][j]],
      non_trainable=[],
    )

  # -- a round -------------------------------------------------------------

  def group_of(self, client: api.ClientRound) -> Optional[int]:
    """The index of the client's depth group; None if its tier is dropped."""
    if client.tier not in self.tier_depths:
      raise ValueError(
        f"client {client.client_id} has tier {client.tier!r}, not one of"
        f" {', '.join(self.tier_depths)}"
      )
    return self._group_of_tier.get(client.tier)

  def next(self, state, round_num: int, clients: Sequence[api.ClientRound]):
    del round_num
    members = [[] for _ in self.groups]
    idle = 0
    for client in clients:
      j = self.group_of(client)
      if j is None:
        idle += 1
      else:
        members[j].append(client)
    # Every computation this round calls is traced before the first runs,
    # each queued for compilation as soon as it is traced: the server step
    # (built with the algorithm), then the groups deepest first (the longest
    # to compile). The worker's context compiles one while the next is
    # traced (`compile_ahead`; the first round's start-up,
    # docs/performance.md), and the groups run in that order, so that the
    # worker can train one while the next compiles. Later rounds find them
    # compiled. The groups are independent until the server step: their
    # results are read below in the order of the groups.
    present = [j for j in reversed(range(len(self.groups))) if members[j]]
    compile_ahead(self.computations.server_step)
    for j in present:
      compile_ahead(self.computations.group_round(j))
    outputs = {
      j: self.computations.group_round(j)(
        state["models"][j], [c.dataset for c in members[j]]
      )
      for j in present
    }
    updates, traffic = [], []
    counts = np.zeros([len(self.groups)], np.float32)
    loss_sum = accuracy_sum = 0.0
    processed = expected = non_finite = 0
    starved = False  # A group whose every update with examples was zeroed.
    metrics = collections.OrderedDict()
    for j, group in enumerate(self.groups):
      cohort = members[j]
      metrics[f"clients_{group.name}"] = float(len(cohort))
      if not cohort:
        updates.append([np.zeros_like(w) for w in state["models"][j]])
        continue
      update, measured = outputs[j]
      # A client whose update was not finite sent zeros of weight 0 (the
      # group's client work weighs the others 1: no empty one weighs 0).
      zeroed = learning_process.non_finite_count(
        measured["aggregator"], cohort, empties_weigh_zero=False
      )
      non_finite += zeroed
      counts[j] = len(cohort) - zeroed
      if counts[j]:
        updates.append([np.asarray(u) for u in update])
      else:  # The mean of no update is 0/0: the group counts as absent.
        updates.append([np.zeros_like(w) for w in state["models"][j]])
      traffic.extend(
        learning_process.dense_cohort_traffic(
          f"group {group.name}",
          cohort,
          measured,
          group.training_flops_per_example,
        )
      )
      train = measured["train"]["metrics"]
      examples = int(train["num_examples"])
      processed += examples
      expected += sum(c.num_examples for c in cohort)
      starved |= examples == 0 and zeroed > 0
      if examples:
        loss_sum += float(train["loss"]) * examples
        # Absent when the task's metrics hold no accuracy.
        accuracy = train.get("sparse_categorical_accuracy", math.nan)
        accuracy_sum += float(accuracy) * examples
    new_state = tf.nest.map_structure(
      np.asarray, self.computations.server_step(state, updates, counts)
    )
    learning_process.check_examples(processed, expected, non_finite)
    out = collections.OrderedDict(
      # NaN (the round diverged) if a group had clients with examples but
      # no finite update: its model could not train.
      loss=loss_sum / processed if processed and not starved else math.nan,
      train_accuracy=accuracy_sum / processed if processed else math.nan,
      non_finite_updates=float(non_finite),
      idle_clients=float(idle),
    )
    out.update(metrics)
    for j, group in enumerate(self.groups[1:], start=1):
      out[f"momentum_norm_{group.name}"] = float(
        np.sqrt(sum(np.sum(np.square(m)) for m in new_state["momenta"][j - 1]))
      )
    return api.RoundOutput(state=new_state, metrics=out, traffic=tuple(traffic))

  # -- evaluation ----------------------------------------------------------

  def evaluation_models(self, state, data=None):
    """Every group's model, deepest first: `accuracy` is the deepest's
    (global inference), `avg_accuracy` the groups' mean (local)."""
    del data
    return collections.OrderedDict(
      (
        group.name,
        api.EvaluationModel(self._weights(state, j), model_fn=group.keras_fn),
      )
      for j, group in reversed(list(enumerate(self.groups)))
    )

  def report_extras(self):
    return collections.OrderedDict(
      tier_depths=self.tier_depths,
      group_params={
        g.name: int(sum(w.size for w in g.initial_weights)) for g in self.groups
      },
    )


# -- the CLI's builders ------------------------------------------------------


def tier_depths_from_config(config, task: api.Task, check_capacity=True):
  """Each tier's depth of `--inclusivefl_depths` (default: the model's
  registered depths), in `--tiers` order, checked against capacities."""
  flag = "--inclusivefl_depths"
  tiers = task_devices.resolve_tiers(config, task)
  text = config.settings.inclusivefl_depths
  if text:
    depths = parse_number_list(flag, text, int)
  else:
    depths = list(task.depths)
    if len(depths) != len(tiers):
      raise UsageError(
        flag,
        f"{task.model_name} has default depths"
        f" {':'.join(map(str, task.depths)) or 'none'} but --tiers has"
        f" {len(tiers)} tiers; give one depth per tier",
      )
  if len(depths) != len(tiers):
    raise UsageError(
      flag, f"needs one depth per tier of --tiers, got {len(depths)}"
    )
  if any(d < 0 for d in depths) or not any(depths):
    raise UsageError(
      flag,
      f"depths must be integers >= 0 (0: tier dropped), not all 0, got"
      f" {text!r}",
    )
  if check_capacity:
    for tier, depth in zip(tiers, depths):
      if not depth:
        continue
      params = task_devices.model_size(task, depth)[0]
      if tier.capacity_params is not None and params > tier.capacity_params:
        raise UsageError(
          flag,
          f"tier {tier.name}'s {depth}-block model has {params:,}"
          f" parameters, more than its capacity {tier.capacity_params:,}"
          " (--tier_capacities)",
        )
  return collections.OrderedDict(
    (tier.name, depth or None) for tier, depth in zip(tiers, depths)
  )


def build_inclusivefl(config, task: api.Task, client_ids=()) -> InclusiveFL:
  """The registry's builder of every entry of `VARIANTS`."""
  del client_ids  # Groups follow the device tiers.
  if task.depth_model_fn is None:
    raise UsageError(
      "--model",
      f"{task.model_name} has no depth knob; {config.algorithm} needs a"
      " depth-scalable model: "
      + ", ".join(n for n, m in models_lib.MODELS.items() if m.depths),
    )
  variant = VARIANTS[config.algorithm]
  settings = config.settings
  depths = tier_depths_from_config(config, task, variant.capacity_checked)
  return InclusiveFL(
    task,
    variant.assign(depths),
    client_optimizer=learning_process.client_optimizer(
      config.client_optimizer, config.client_lr, config.client_momentum
    ),
    server_optimizer=tff.learning.optimizers.build_adam(
      learning_rate=config.server_lr,
      beta_1=settings.server_adam_beta_1,
      beta_2=settings.server_adam_beta_2,
      epsilon=settings.server_adam_epsilon,
    ),
    beta=settings.inclusivefl_beta if variant.distil else 0.0,
    share=variant.share and getattr(settings, "inclusivefl_share_layers", True),
    name=variant.name,
    init_weights=settings.init_weights or None,
  )
