"""SPATL (Yu et al., "SPATL: Salient Parameter Aggregation and Transfer
Learning for Heterogeneous Federated Learning" — `shared/papers/spatl.txt`,
Section IV):
a shared encoder learned by federated learning, a private predictor per
client, salient channels chosen by an RL agent, and gradient control on the
encoder.

A round (Figure 1, Algorithm 2 of the paper):

1. The server broadcasts the global encoder w_g (with the model's
   non-trainable variables) and its control variate c_g.
2. Each sampled client k sets w_e = w_g and its own predictor w_p^k and
   trains both on its data for K local SGD steps (Eq. 3), the encoder's
   gradients corrected by c_g - c_l (Eq. 9); then
   c_l+ = c_l - c_g + (w_g - w_e) / (K eta) (Eq. 10).
3. Its agent (`agent.py`: a GCN over the encoder's layer graph and an MLP
   actor, PPO with clip 0.2, action std 0.5, Adam 3e-4) picks a keep ratio
   per prunable layer; the layer's output channels with the largest L1 norms
   are kept (with the batch norms following the layer). Reward: 100 x the
   client's local validation accuracy of the selected sub-network. In the
   first `spatl_finetune_rounds` rounds (the paper's 10) the agent's MLP is
   fine-tuned by PPO each round (20 epochs); the GCN and critic stay as
   pre-trained.
4. It uploads the selected channels of its new encoder and of Delta c_l,
   one int32 index per selected channel (a layer's kernel, bias and batch
   norm share it), its model's non-trainable variables (batch-norm
   statistics) and its weight; c_l changes by the Delta c_l it sent.
5. The server moves the global encoder toward the clients' values at the
   uploaded indices (Eq. 12): w_g <- w_g + eta * (1/|K|) sum_k (w^k - w_g),
   each client counting only where it uploaded; c_g <- c_g + (1/|N|)
   sum_k Delta c_k over the uploaded channels (Eq. 11); the batch-norm
   statistics become the clients' mean.

Evaluation (Section V-B): every client's model, the global encoder with its
own predictor, on its own local validation split; the reported `accuracy`
is their mean. A client never sampled first trains its predictor alone on
the encoder (Eq. 4, one unshuffled local pass at the client learning rate,
redone at each evaluation); that predictor is evaluated and not kept. A
sampled client is evaluated with the predictor of its last round. The
evaluated encoder is the whole global one: the selection decides what a
client uploads, and the selected sub-network's accuracy is reported as
`selection_reward`. The paper's inference acceleration (Section V-D and its
unnumbered inference table: FLOPs of each client's pruned model) is measured
each round on the
sub-network each client's selection leaves, counted layer by layer
(`subnetwork.py`: a dropped channel also removes what reads it):
`model_flops_saved` (mean over the round's clients) and
`model_flops_saved_max`; the pruned models' accuracy is not evaluated
separately.

Departures, each on purpose:

* Eq. 12 as printed moves w_g *away* from the clients (w_g + eta mean(w_g -
  w^k)); the sign is fixed here. Its 1/|K| counts every client once
  (`ClientWeighting.UNIFORM` on the CLI; the builder takes any weighting
  and defaults to TFF's NUM_EXAMPLES);
  `--spatl_salient_mean=selected` divides by the clients that uploaded each
  element instead of |K|.
* Delta c_l goes up at the selected channels only, like the encoder (the
  paper does not say how it travels; sending it densely would cost every
  client SCAFFOLD's upload), and c_l changes by what was sent, not by the
  whole Delta c_l of Eq. 10: SCAFFOLD's correction c_g - c_l needs c_g to
  stay the mean of the clients' c_l (Eq. 11 over N clients, zero starts),
  which holds only if each c_l changes by what reaches the server. Measured
  when each client kept its whole Delta c_l (at 7dccc93, offline
  reproduction setting): SPATL diverged at rounds 31 and 43 (seeds 0, 1),
  and without transfer at 27, while SPATL without selection (Delta c_l
  sent whole) and without gradient control did not (seed 0). c_g still
  goes down whole, since Eq. 9 needs
  all of it: a client's download is twice FedAvg's (encoder and c_g), so
  its round costs more than FedAvg's, unlike the paper's Table I (SPATL
  2.1 MB per client and round, as FedAvg), which does not say how c_g
  travels.
* Eq. 10 divides by K eta with K the client's local steps (SCAFFOLD's
  option II); the paper writes E, the local epochs, which would scale the
  correction by the number of batches per epoch.
* The official code starts control variates from a random network and
  divides the server variate's change by the sampled clients; here they
  start at zero and Eq. 11's 1/|N| (all clients) is kept, as SCAFFOLD
  and the paper say. It also damps the correction by 1/100 (here
  `--spatl_control_scale`, default 1, the paper's; 0.01 is the official
  code's) and "corrects" batch-norm statistics (not done here). Since c_l
  changes by what was sent (above), the undamped correction diverged on
  none of 3 seeds of the offline reproduction's main setting and on 1 of 3
  (round 42) of its 30-client setting (`docs/reproductions/spatl`).
* The official code uploads the dense encoder with pruned channels zeroed
  and averages those zeros in; here only the selected channels are counted
  as sent and the others keep their global value. (Inside the simulation
  TFF carries dense tensors with a mask, its types being static; the bytes
  are measured on the channel-indexed encoding of the same values, gathered
  in the client computation.)
* A kept output channel goes up with its whole input slice, also the
  weights that read channels this client's selection dropped in the layer
  before; the paper uploads "the parameter w ... of the target encoder Ê",
  the pruned network, which has no such weights. The client trained them
  (local training is on the whole encoder; the selection only decides the
  upload), and the server's encoder keeps every channel, so they are
  averaged in like the rest. The budget is therefore the uploaded fraction
  of the kernel and bias parameters, larger than Ê's size; the FLOPs
  metric (`subnetwork.py`) is Ê's, with those weights removed.
* The agent's action is a keep ratio per layer (the paper: a sparsity
  ratio, its complement; the same choice).
* The agent's graph has the encoder's layers as nodes (the line graph of
  the paper's, whose nodes are feature maps and edges operations;
  `agent.py`).
* Channels are ranked by L1 norm (the official code: L2).
* The predictor is the classifier layer of the model (`ModelSpec.
  predictor_layers`); the official ResNet code also keeps the stem local.
  The registry's `vgg11` is AdaptiveFL's (4096-wide hidden layers, both in
  the shared encoder), larger than the paper's.
* Batch-norm moving statistics are averaged over the clients (as the
  official code's state-dict averaging does), uploaded densely.
* Each agent episode proposes the whole ratio vector at once (Eq. 5-6),
  projected onto the size budget (`--spatl_budget`, the fraction of the
  prunable layers' kernel and bias parameters uploaded, met exactly as
  AMC's agents meet theirs, so that the agent shares the budget among the
  layers; 0.7 is ours, the paper gives none; the ratios meet it exactly,
  the kept channels then round each ratio to whole channels); episodes
  have one step, so gamma plays no part. `--spatl_min_keep` 0.1 and
  `--spatl_episodes` 8 are ours (the official code's smallest ratio is
  0.2; the paper gives neither). The agent's state is the encoder's architecture (the paper's
  graph), the same for every client and round: the ratios a client's actor
  learns are per client, the channels within a layer follow its trained
  weights. The search runs every round (`--spatl_episodes`, the first
  being the policy's mean); its PPO update only in the first
  `--spatl_finetune_rounds` rounds of the run (global rounds, as the
  paper's "first 10 communication rounds").
* The actor is a per-layer MLP on [h_i, g] (each prunable node's GCN
  embedding beside the graph's mean embedding), not Eq. 6's one MLP on g:
  one output per layer whatever the encoder's depth, so an agent trained on
  ResNet-56 applies to any encoder (`agent.py`).
* Dense layers of the encoder are prunable as well as convolutions (the
  official code prunes Conv2d only): on `mnist_cnn`, the offline default,
  `fc1` holds most of the encoder; on the registry's `vgg11` the two
  4096-wide layers dominate the budget.
* The shipped agent was pre-trained on our ResNet-56 pruning task on the
  embedded MNIST subset (`pipelines.pretrain_spatl_agent`; the paper's
  task is on ResNet-56, its data unnamed, presumably CIFAR-10 as in its
  pruning table): its provenance file gives the data, commit and rewards
  (that commit had uncommitted changes; a rerun on a clean commit wrote
  the same file byte for byte, recorded there as `rerun_clean`).
* The agent's reward and the reported accuracy use the same split, each
  client's local validation data (the paper's reward is "validation
  accuracy" and its metric the clients' local validation accuracy; it does
  not say whether they differ).
* A sampled client is evaluated with the global encoder and the predictor
  of its last round, which it trained beside its own local encoder, maybe
  rounds ago; the paper does not say, and the official code logs the local
  encoder with its predictor, sampled clients only, right after local
  training. This can understate SPATL's accuracy under partial sampling.
* The CLI weights Eq. 12 uniformly (the paper's 1/|K|); the official
  server weights by data size.
* Each client's new state (predictor, c_l, actor) comes back to the
  driver with the round's results, as the simulation's client-state store;
  it is not counted as traffic, since in the paper it never leaves the
  client.
* Not in the paper: a client whose round is not finite (its update,
  Delta c_l, BN statistics or predictor) sends zeros of weight 0, keeps its
  predictor, c_l and agent, and is counted in `non_finite_updates`; its
  selection is left out of the round's selection metrics.
* Ablations: `--nospatl_selection` (whole encoder sent),
  `--nospatl_transfer` (the predictor is shared and averaged too),
  `--nospatl_gradient_control` (no control variates).

`build_spatl_process(...)` returns a `SpatlProcess`: `initialize()`,
`next(state, datasets, validations, client_states, round_infos)`, and
`predictor_for(state, predictor, dataset)` (Eq. 4); its typed computations
are in `computations.py` (their type signatures there).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Sequence
import json
import os
from typing import Any
from typing import NamedTuple
from typing import Optional
import zlib

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import models as models_lib
from tff_hetero.accounting import ClientTraffic
from tff_hetero.algorithms import api
from tff_hetero.algorithms import cohort_positions
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import model_fns
from tff_hetero.algorithms.spatl import agent as agent_lib
from tff_hetero.algorithms.spatl import computations
from tff_hetero.algorithms.spatl import subnetwork
from tff_hetero.errors import ModelError
from tff_hetero.errors import UsageError
from tff_hetero.settings import AlgorithmSettings
from tff_hetero.settings import in_interval
from tff_hetero.settings import non_negative_int
from tff_hetero.settings import positive_int
from tff_hetero.settings import setting

ClientState = computations.ClientState
RoundInfo = computations.RoundInfo
SpatlOptions = computations.SpatlOptions


@attrs.frozen(kw_only=True)
class SpatlSettings(AlgorithmSettings):
  spatl_selection: bool = setting(
    True,
    "SPATL's salient parameter selection; false: each client uploads its"
    " whole encoder (the paper's ablation).",
  )
  spatl_transfer: bool = setting(
    True,
    "SPATL's private predictors; false: the predictor is shared and"
    " averaged with the encoder (the 'no transfer' ablation).",
  )
  spatl_gradient_control: bool = setting(
    True, "SPATL's gradient control on the encoder (Eq. 9-11)."
  )
  spatl_control_scale: float = setting(
    1.0,
    "s in Eq. 9's corrected gradient g + s (c_g - c_l): 1 is the paper's"
    " (and SCAFFOLD's); the official code damps the correction with 0.01.",
    check=in_interval(0.0, 1.0, closed_low=False, closed_high=True),
  )
  spatl_budget: float = setting(
    0.7,
    "Fraction of the encoder's prunable parameters a client uploads (the"
    " selection's size constraint, met exactly by the keep ratios, which"
    " whole channels then round; 1 sends everything).",
    check=in_interval(0.0, 1.0, closed_low=False, closed_high=True),
  )
  spatl_min_keep: float = setting(
    0.1,
    "Smallest fraction of a layer's output channels a client keeps.",
    check=in_interval(0.0, 1.0, closed_low=False, closed_high=True),
  )
  spatl_episodes: int = setting(
    8, "Agent episodes per client and round.", check=positive_int
  )
  spatl_ppo_epochs: int = setting(
    20, "PPO epochs per fine-tuning round (the paper's 20).", check=positive_int
  )
  spatl_finetune_rounds: int = setting(
    10,
    "Rounds in which clients fine-tune their agent's MLP (the paper's 10).",
    check=non_negative_int("no fine-tuning"),
  )
  spatl_agent: str = setting(
    "",
    "The agent: a .npz of tff_hetero.algorithms.spatl.spatl.save_policy;"
    " default: the shipped agent pre-trained on ResNet-56 pruning on mnist5k"
    " (pipelines.pretrain_spatl_agent; provenance beside it); 'init': the"
    " seeded initial agent.",
  )
  spatl_salient_mean: str = setting(
    "cohort",
    "Eq. 12's mean: cohort (1/|K|, the paper) or selected (over the clients"
    " that uploaded each element).",
    choices=("cohort", "selected"),
  )


SHIPPED_AGENT = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "pretrained", "resnet56_agent.npz"
)
"""The agent pre-trained by `pipelines.pretrain_spatl_agent` (ResNet-56,
its provenance in the `.json` beside it)."""

DEFAULTS = {"val_fraction": 0.2}
"""SPATL's own defaults: its clients evaluate on local validation splits."""


class SpatlState(NamedTuple):
  """Server state: the global encoder, the model's non-trainable variables
  and c_g (empty without gradient control)."""

  encoder: Any
  non_trainable: Any
  control: Any


class SpatlOutput(NamedTuple):
  """`SpatlProcess.next`'s result: the new state, the round's measured
  metrics, and each client's new `ClientState` and `ClientReport`, in
  cohort order."""

  state: SpatlState
  metrics: Any
  client_states: list
  reports: list


def save_policy(path: str, policy: agent_lib.PolicyParams, provenance=None):
  """Writes `policy` to `path` (.npz) and `provenance` beside it (.json)."""
  arrays = {}
  for part in agent_lib.PolicyParams._fields:
    for k, value in enumerate(getattr(policy, part)):
      arrays[f"{part}_{k}"] = np.asarray(value, np.float32)
  np.savez(path, **arrays)
  if provenance is not None:
    with open(os.path.splitext(path)[0] + ".json", "w") as f:
      json.dump(provenance, f, indent=2, sort_keys=True)


def load_policy(path: str) -> agent_lib.PolicyParams:
  """A policy written by `save_policy`; `UsageError` naming `--spatl_agent`
  if the file is missing or not one."""
  try:
    with np.load(path, allow_pickle=False) as data:
      parts = {}
      for part in agent_lib.PolicyParams._fields:
        count = sum(1 for key in data.files if key.startswith(part + "_"))
        parts[part] = [data[f"{part}_{k}"] for k in range(count)]
  except (OSError, ValueError, KeyError) as e:
    raise UsageError(
      "--spatl_agent", f"cannot read an agent from {path!r}: {e}"
    ) from None
  reference = agent_lib.init_policy(0)
  for part in agent_lib.PolicyParams._fields:
    shapes = [np.shape(a) for a in parts[part]]
    expected = [np.shape(a) for a in getattr(reference, part)]
    if shapes != expected:
      raise UsageError(
        "--spatl_agent",
        f"{path!r} holds a {part} of shapes {shapes}, expected {expected}",
      )
  return agent_lib.PolicyParams(**parts)


class SpatlProcess:
  """SPATL's computations with a FedJAX-like `initialize` / `next` (module
  docstring). Build with `build_spatl_process`."""

  def __init__(
    self,
    keras_model_fn: Callable[[], tf.keras.Model],
    comps: computations.SpatlComputations,
  ):
    self.computations = comps
    self.layout = comps.layout
    model = keras_model_fn()
    trainable = [np.asarray(v) for v in model.trainable_weights]
    self._initial = SpatlState(
      encoder=[trainable[i] for i in self.layout.encoder],
      non_trainable=[np.asarray(v) for v in model.non_trainable_weights],
      control=[np.zeros_like(trainable[i]) for i in self.layout.encoder]
      if comps.options.gradient_control
      else [],
    )
    self.initial_predictor = [trainable[i] for i in self.layout.predictor]
    self._num_trainable = len(trainable)

  def initialize(self) -> SpatlState:
    return SpatlState(*(list(part) for part in self._initial))

  def initial_client_state(self) -> ClientState:
    return self.computations.initial_client_state(self.initial_predictor)

  def next(
    self,
    state: SpatlState,
    datasets: Sequence[tf.data.Dataset],
    validations: Sequence[tf.data.Dataset],
    client_states: Sequence[ClientState],
    round_infos: Sequence[RoundInfo],
    server_lr: float = 1.0,
  ) -> SpatlOutput:
    n = len(datasets)
    if not len(validations) == len(client_states) == len(round_infos) == n:
      raise ValueError(
        f"SPATL: {n} datasets, {len(validations)} validation sets,"
        f" {len(client_states)} client states and {len(round_infos)} round"
        " infos"
      )
    encoder, control, statistics, gathered, metrics = self.computations.round(
      state.encoder,
      state.non_trainable,
      state.control,
      np.float32(server_lr),
      [_state_arg(s) for s in client_states],
      list(datasets),
      list(validations),
      [
        RoundInfo(np.bool_(i.fine_tune), np.asarray(i.seed, np.int64))
        for i in round_infos
      ],
      cohort_positions.positions(n),
    )
    rows = cohort_positions.unstack_rows(gathered, n, "SPATL")
    return SpatlOutput(
      state=SpatlState(
        [np.asarray(w) for w in encoder],
        [np.asarray(v) for v in statistics],
        [np.asarray(c) for c in control],
      ),
      metrics=metrics,
      client_states=[_as_client_state(r[0]) for r in rows],
      reports=[computations.ClientReport(*r[1]) for r in rows],
    )

  def predictor_for(self, state: SpatlState, predictor, dataset) -> list:
    """Eq. 4: `predictor` trained alone on `dataset` under the global
    encoder (a never-sampled client's, before it is evaluated)."""
    return [
      np.asarray(p)
      for p in self.computations.predictor_update(
        state.encoder, state.non_trainable, list(predictor), dataset
      )
    ]

  def model_weights(self, state: SpatlState, predictor=None):
    """`ModelWeights` of the whole model: the global encoder with
    `predictor` (default: the initial one)."""
    predictor = self.initial_predictor if predictor is None else predictor
    trainable = [None] * self._num_trainable
    for p, i in enumerate(self.layout.encoder):
      trainable[i] = np.asarray(state.encoder[p])
    for p, i in enumerate(self.layout.predictor):
      trainable[i] = np.asarray(predictor[p])
    return tff.learning.models.ModelWeights(
      trainable=trainable,
      non_trainable=[np.asarray(v) for v in state.non_trainable],
    )


def _state_arg(state: ClientState):
  return ClientState(
    predictor=list(state.predictor),
    control=list(state.control),
    actor=list(state.actor),
    actor_optimizer=state.actor_optimizer,
  )


def _as_client_state(row) -> ClientState:
  predictor, control, actor, actor_optimizer = row
  return ClientState(
    predictor=[np.asarray(p) for p in predictor],
    control=[np.asarray(c) for c in control],
    actor=[np.asarray(a) for a in actor],
    actor_optimizer=tf.nest.map_structure(np.asarray, actor_optimizer),
  )


def build_spatl_process(
  model_fn: Callable[[], tf.keras.Model],
  *,
  input_spec: Any,
  encoder_layers: Sequence[str],
  predictor_layers: Sequence[str],
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  total_clients: int,
  options: SpatlOptions = SpatlOptions(),
  policy: Optional[agent_lib.PolicyParams] = None,
  transfer: bool = True,
  client_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
  metrics_fn: Optional[Callable[[], list]] = None,
  seed: int = 0,
) -> SpatlProcess:
  """SPATL (module docstring) on the Keras model of `model_fn`, split into
  `encoder_layers` (shared; the agent's graph) and `predictor_layers`
  (private, or shared too when `transfer` is False).

  `client_optimizer_fn` must be `build_sgdm(learning_rate)` without
  momentum (Eq. 10 needs eta). `policy` is the agent (default:
  `agent.init_policy(seed)`).
  """
  learning_process.check_sgd(
    client_optimizer_fn, "SPATL (Eq. 10 needs eta)", momentum=False
  )
  learning_process.check_positive("total_clients", total_clients)
  keras_model = model_fn()
  shared = list(encoder_layers) + ([] if transfer else list(predictor_layers))
  private = list(predictor_layers) if transfer else []
  layout = computations.build_layout(
    keras_model,
    shared,
    private,
    graph_layers=list(encoder_layers) if options.selection else None,
  )
  if options.selection and not layout.kernel_positions:
    raise ModelError(
      "SPATL: the encoder has no Conv2D or Dense layer to select channels of"
    )
  if policy is None:
    policy = agent_lib.init_policy(seed)
  tff_model_fn = model_fns.variable_model_fn(
    model_fn, input_spec, loss_fn, metrics_fn
  )
  parts = learning_process.measured_parts(tff_model_fn, None, client_weighting)
  comps = computations.SpatlComputations(
    tff_model_fn,
    layout,
    options,
    client_optimizer=client_optimizer_fn,
    total_clients=int(total_clients),
    initial_policy=policy if options.selection else None,
    metrics_aggregator=parts.metrics_aggregator,
    uniform=client_weighting is tff.learning.ClientWeighting.UNIFORM,
  )
  return SpatlProcess(model_fn, comps)


def _client_seed(seed: int, round_num: int, client_id: str) -> np.ndarray:
  return np.array(
    [seed * 1_000_003 + round_num, zlib.crc32(client_id.encode())], np.int64
  )


class Spatl(api.FederatedAlgorithm):
  """`--algorithm=spatl`: a `SpatlProcess` whose clients' predictors,
  control variates and agents live in the program's client-state store."""

  name = "spatl"

  def __init__(
    self,
    process: SpatlProcess,
    task: api.Task,
    *,
    settings: SpatlSettings,
    server_lr: float,
    seed: int,
  ):
    self.process, self.task = process, task
    self._settings, self._server_lr, self._seed = settings, server_lr, seed
    self._empty = cohort_positions.empty_dataset(task.element_spec)
    graph = process.layout.graph
    self._layers = graph.prunable_names if graph is not None else ()

  def initialize(self) -> SpatlState:
    return self.process.initialize()

  def initial_client_state(self) -> ClientState:
    return self.process.initial_client_state()

  def _validation(self, client: api.ClientRound) -> tf.data.Dataset:
    if client.validation is None:
      return self._empty
    return client.validation

  def next(
    self, state, round_num: int, clients: Sequence[api.ClientRound]
  ) -> api.RoundOutput:
    fine_tune = round_num <= self._settings.spatl_finetune_rounds
    output = self.process.next(
      state,
      [c.dataset for c in clients],
      [self._validation(c) for c in clients],
      [
        c.state if c.state is not None else self.initial_client_state()
        for c in clients
      ],
      [
        RoundInfo(fine_tune, _client_seed(self._seed, round_num, c.client_id))
        for c in clients
      ],
      server_lr=self._server_lr,
    )
    measured = output.metrics
    down = learning_process.per_client_bytes(
      measured["distributor"]["bytes_down"], len(clients), "download"
    )
    forward = self.task.training_flops_per_example // 3
    traffic = tuple(
      ClientTraffic(
        client_id=c.client_id,
        bytes_down=down,
        bytes_up=int(r.bytes_up),
        flops=c.num_examples * self.task.training_flops_per_example
        + int(r.evaluated_examples) * forward,
        examples=c.num_examples,
      )
      for c, r in zip(clients, output.reports)
    )
    metrics = learning_process.train_metrics(
      measured["train"],
      clients,
      sum(int(r.non_finite) for r in output.reports),
    )
    # Selections of clients whose round was not finite were undone.
    selected = [r for r in output.reports if not int(r.non_finite)]
    if self._layers and selected:
      keep = np.mean([np.asarray(r.keep_fractions) for r in selected], 0)
      metrics["selection_reward"] = float(
        np.mean([float(r.reward) for r in selected])
      )
      metrics["agent_mean_reward"] = float(
        np.mean([float(r.mean_reward) for r in selected])
      )
      # The compute each client's selection saves on the whole model (the
      # sub-network it leaves, counted layer by layer: `subnetwork`).
      saved = [
        subnetwork.saved_fraction(self.process.layout.flow, r.macs)
        for r in selected
      ]
      metrics["model_flops_saved"] = float(np.mean(saved))
      metrics["model_flops_saved_max"] = float(np.max(saved))
      for name, fraction in zip(self._layers, keep):
        metrics[f"keep_{name}"] = float(fraction)
    return api.RoundOutput(
      state=output.state,
      metrics=metrics,
      traffic=traffic,
      client_states={
        c.client_id: s for c, s in zip(clients, output.client_states)
      },
    )

  def model_weights(self, state):
    return self.process.model_weights(state)

  def evaluation_models(self, state, data=None):
    """Every client's model (the global encoder, its own predictor) on its
    own validation split, group `local`: `accuracy` is their mean. Without
    client data, the global encoder with the initial predictor."""
    weights = self.process.model_weights(state)
    if data is None or not data.client_ids():
      return collections.OrderedDict(global_model=api.EvaluationModel(weights))
    stored = data.client_states()
    models = collections.OrderedDict()
    datasets = None
    for k, client_id in enumerate(data.client_ids()):
      validation = data.client_validation(client_id)
      if validation is None or len(validation[1]) == 0:
        continue
      client_state = stored.get(client_id)
      if client_state is None:
        if datasets is None:
          datasets = data.client_datasets()
        predictor = self.process.predictor_for(
          state, self.process.initial_predictor, datasets[k]
        )
      else:
        predictor = client_state.predictor
      models[client_id] = api.EvaluationModel(
        self.process.model_weights(state, predictor),
        group="local",
        data=validation,
      )
    if not models:
      return collections.OrderedDict(global_model=api.EvaluationModel(weights))
    return models

  def report_extras(self):
    graph = self.process.layout.graph
    return {
      "spatl_prunable_layers": list(self._layers),
      "spatl_encoder_variables": len(self.process.layout.encoder),
      "spatl_predictor_variables": len(self.process.layout.predictor),
      "spatl_graph_nodes": 0 if graph is None else len(graph.node_names),
    }


def check_flags(config) -> None:
  """SPATL's own flag checks (the registry refuses other optimizers and
  momentum: Eq. 10 divides by the plain SGD learning rate)."""
  if config.val_fraction <= 0:
    raise UsageError(
      "--val_fraction",
      "SPATL evaluates on each client's validation split: give a value in"
      " (0, 1), e.g. 0.2",
    )


def build_spatl(config, task: api.Task, client_ids=()) -> Spatl:
  """Registry builder: `--algorithm=spatl` with the `--spatl_*` flags."""
  check_flags(config)
  s = config.settings
  model = task.model_fn()
  encoder, predictor = models_lib.encoder_predictor_split(
    task.model_name, model
  )
  policy = (
    None
    if s.spatl_agent == "init"
    else load_policy(s.spatl_agent or SHIPPED_AGENT)
  )
  options = learning_process.process_options(config)
  process = build_spatl_process(
    task.model_fn,
    input_spec=task.element_spec,
    encoder_layers=encoder,
    predictor_layers=predictor,
    client_optimizer_fn=options["client_optimizer_fn"],
    # Eq. 12's 1/|K|: every client of the cohort counts once.
    client_weighting=tff.learning.ClientWeighting.UNIFORM,
    total_clients=len(client_ids) or config.num_clients,
    options=SpatlOptions(
      gradient_control=s.spatl_gradient_control,
      control_scale=s.spatl_control_scale,
      selection=s.spatl_selection,
      episodes=s.spatl_episodes,
      ppo_epochs=s.spatl_ppo_epochs,
      budget=s.spatl_budget,
      min_keep=s.spatl_min_keep,
      cohort_mean=s.spatl_salient_mean == "cohort",
    ),
    policy=policy,
    transfer=s.spatl_transfer,
    seed=config.seed,
  )
  return Spatl(
    process,
    task,
    settings=s,
    server_lr=config.server_lr,
    seed=config.seed,
  )
