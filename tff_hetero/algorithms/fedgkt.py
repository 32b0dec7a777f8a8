"""FedGKT: group knowledge transfer between small edge models and a large
server model.

He, Annavaram and Avestimehr, "Group Knowledge Transfer: Federated Learning
of Large CNNs at the Edge" (NeurIPS 2020), Algorithm 1. Every client keeps
its own small edge model (the stem of the CNN, `tff_hetero.models.fedgkt`,
then its own blocks and classifier; it is never averaged); the server trains
one large model, the rest of the CNN, on the stems' feature maps. Per round:

* client k (`fedgkt_steps.build_edge_update`): E_c local epochs of SGD on
  CE(y, z_c) + alpha_c x KD(z_s -> z_c), where z_s are the server's logits
  of the same samples from its last answer (CE alone before any answer) and
  KD(t -> s) = [T^2] KL(softmax(t / T) || softmax(s / T))
  (`distillation.soft_label_kl`); then, in inference mode, the features H
  (the edge model's output at its registry `split_layer`), the logits z_c
  and the labels of every local sample, in sample order;
* server (`fedgkt_steps.build_server_update`): first the accuracy of the server
  model on the received features (inference mode: it has not trained on
  them this round), then E_s epochs of its optimizer over them (in the
  order `server_order` says, see deviations) on CE(y, f_s(H)) + alpha_s x
  KD(z_c -> z_s), then z_s = f_s(H) for every received sample (inference
  mode), the answer, sent to its client at once.

Settings beyond the paper's equations:

* `kd_t_squared` (default True, the official code's `KL_Loss`): the KL term
  is multiplied by T^2 on both sides. Eq. 6/7 have no T^2; with it off the
  KD gradient is T^2 times weaker (`distillation.py`).
* The server's learning rate is reduced on plateau, as the paper says
  ("we reduce the learning rate once the accuracy has plateaued") and the
  official code does (PyTorch `ReduceLROnPlateau(mode="max")` with its
  defaults, stepped once per round): when the round's metric has not beaten
  the best so far by a relative 1e-4 for more than `lr_patience` (10)
  rounds, the learning rate is multiplied by `lr_factor` (0.1). The metric
  is the server's accuracy on the round's received features before it
  trains on them (see deviations).
* Each client keeps its optimizer's state (momentum) across rounds in the
  client-state store, as the official code does (one optimizer per client
  process, created once).
* The paper's hyper-parameters (Section 4.2): client epochs 1; server
  epochs 20 for I.I.D. data, "for non-I.I.D., the value depends on the level
  of data bias" (no value given); "for I.I.D., Adam optimizer works better
  than SGD with momentum, while for non-I.I.D., SGD with momentum works
  better". The sentence does not say which side; we read it as the
  server's optimizer (`--gkt_server_optimizer`), and the clients train with
  SGD (momentum `--client_momentum`) in both settings, as FedAvg's clients
  do here, so that the FedAvg comparison differs in the algorithm only (the
  official code applies its one `--optimizer` to clients and server). The
  temperature is not given in the text; T = 3 (`--gkt_temperature`) is
  ours, a common distillation value (the official example scripts pass
  larger ones). The learning rates and the plateau schedule's constants are
  in its appendix tables (Tables 10-12), which our copy of the paper does
  not include, so they are the flags' values (`--gkt_server_lr`,
  `--client_lr`) and PyTorch's defaults above.

Modes (`mode`):

* `sync`: the server waits for the round's cohort, trains once on all of
  its features and answers every client; the program samples the cohort.
* `async`: the paper's "the server model can immediately start training
  when it receives inputs from any client". An event simulation of the
  devices (`async_events.Simulation`, K = `--clients_per_round` devices at
  work at once, each job's duration its local training and extraction MACs
  over its device's MAC capacity from the device population) decides which
  uploads arrive when; the server trains on each arrival alone, in arrival
  order, and answers that client at once; the client starts its next job
  with those logits (the newest it has). A program round is the next
  arrivals (at most K, ending before a client's second arrival); the
  client computation always gets K clients, the arrivals padded with
  clients that have no data and whose results are dropped, since the TFF
  worker keeps an executor stack per cohort size (`cohort_positions`).
  `attach(population, client_sizes)` gives the simulation its devices.
  Two readings of the paper's one sentence: the server trains E_s epochs on
  each single arrival's features (not on a buffer of several clients'), and
  the plateau schedule is stepped once per program round (a round holds a
  variable number of arrivals, so in simulated time its patience is
  shorter than in sync mode when rounds hold fewer clients).

Metrics per round, beside the losses: `staleness_mean` / `staleness_max`,
the server updates made between the answer a client trained with and the
server model that answers its new features (0 in sync mode for a client
sampled in consecutive rounds; in async mode one update is one arrival);
`server_fresh_accuracy`, `server_lr`, `server_version` (updates so far) and
`sim_time` (the simulated clock: in sync mode each round lasts as long as its
slowest client) and `server_step_s` (the server step's wall time on the TFF
worker, from `tf.timestamp` inside it).

Deviations from the paper and the official code (FedML
`simulation/mpi/fedgkt`), with the reason:

* Server logits are keyed by sample, not by batch: the official code stores
  them by batch index while the client's loader reshuffles, so they reach
  the wrong images. Here each batch of the client's dataset carries its
  samples' positions and their rows of the client's last server logits
  (`teacher`; `client_dataset_with_teacher`): the logits travel inside the
  client's own data, so the cohort can be split across TFF workers in any
  way.
* The features, logits and labels a client sends come from one pass over
  its samples without augmentation; the official code extracts them from its
  training loader, whose random crops and flips differ from the images the
  server's logits then guide.
* The answer z_s is computed after the server's training, in inference mode;
  the official code keeps the logits of its last training pass (training-mode
  batch norm, before the last updates).
* The plateau metric: the official code steps its scheduler on the best test
  accuracy of the server model; the test set is the program's evaluation,
  not the algorithm's, so we use the accuracy on each round's fresh features
  before training on them, a held-out figure of the same kind.
* Client and server optimizers: TFF's SGD (heavy-ball momentum from
  `--client_momentum`; `sgd` on the server: momentum 0.9) and Adam, without
  the official code's weight decay, Nesterov momentum and AMSGrad; FedAvg
  trains with the same client optimizer, so the comparison is even.
* The server's pass over a round's features (`server_order`, flag
  `--gkt_server_order`): Algorithm 1 and the official code go client by
  client, each client's batches in turn, in every epoch; ours by default
  shuffles the samples of all the round's clients in each epoch. The
  objective (Eq. 7, summed over clients) is the same; the order is not: on
  non-I.I.D. data, client-by-client batches end each epoch on the last
  client's classes. "by_client" gives Algorithm 1's order (the samples as
  received, client after client; a batch at a client boundary holds the end
  of one client and the start of the next, where the official code's last
  batch of a client is smaller).
* Official server loss: KD + alpha x CE (alpha weighting CE); ours CE +
  alpha_s x KD, as Eq. 6; the same at alpha = 1, the default.
* Async mode simulates time instead of measuring it: the server's own time is
  not modelled (handled on arrival), devices work at their tier's MAC
  capacity, and network time is not modelled.
* Not in the paper: a client whose round is not finite (its edge model or
  optimizer, its features, logits or metrics) is rolled back in the client
  computation; it uploads zeros that the server leaves out of its scoring
  and training (`TaggedUpload.valid`), keeps its state (no answer is sent
  to it), and counts in `non_finite_updates`. Without it one NaN client
  would train the server on NaN features.

State: the server model, its optimizer state, the plateau schedule, the
update counter and the event simulation (`GKTState`); per client, in the
program's client-state store, its edge model, its optimizer state, the
server logits of its samples and the server version that computed them
(`EdgeState`, no rows before the first answer). Features are used when they
arrive and dropped: nothing accumulates on the server between rounds.

Layers: `fedgkt_steps` holds the pure TensorFlow steps (the edge's train
and extract, the server's score, train and answer), `fedgkt_computations`
their typed TFF computations, and this module the settings and the driver.
One round is one TFF computation (signatures in `fedgkt_computations`):

    round: (<S@SERVER, O@SERVER, P@SERVER, M@CLIENTS, {D*}@CLIENTS,
             int32@CLIENTS> -> <R@SERVER, <rows=<M[?], Z[?]>,
             positions=int32[?]>@SERVER, metric sums@SERVER>)

The clients' features, logits and labels reach the server step through a
`tff.federated_aggregate` inside it, not through the driver (on one TFF
worker; on several, see `fedgkt_computations`); the driver
plans the server's pass beforehand (P: its groups, one per round in sync
mode and one per arrival in async mode, and each group's sample order from
the seed) and gets back the server's state and its answers, which it keeps
per client until the client's next round. The driver-to-worker traffic of a
sync round with `fedgkt_edge_resnet8` + `fedgkt_server_resnet19` on
mnist5k, four clients (`tools/bench.py --suite=gkt`, `fedgkt_rpc_mib_*`):
47.95 MiB sent and 41.66 MiB received per round when the client and server
computations were called separately and the features went through the
driver; 9.95 MiB and 3.35 MiB with one computation.

Accounting, measured on the tensors: a client uploads its features, logits,
labels and metric sums (sizes taken in the client computation) and
downloads the answer the server sends it (the array's size, in the round it
is sent).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Mapping
from collections.abc import Sequence
import functools
import math
from typing import Any
from typing import NamedTuple
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import data as data_lib
from tff_hetero import models as models_lib
from tff_hetero.accounting import ClientTraffic
from tff_hetero.algorithms import api
from tff_hetero.algorithms import async_events
from tff_hetero.algorithms import client_state_process
from tff_hetero.algorithms import cohort_positions
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms.client_state_process import ClientStateProcess
from tff_hetero.algorithms.fedgkt_computations import GKTComputations
from tff_hetero.algorithms.fedgkt_steps import MODES
from tff_hetero.algorithms.fedgkt_steps import SERVER_OPTIMIZERS
from tff_hetero.algorithms.fedgkt_steps import SERVER_ORDERS
from tff_hetero.algorithms.fedgkt_steps import TRANSFERS
from tff_hetero.algorithms.fedgkt_steps import ClientModel
from tff_hetero.algorithms.fedgkt_steps import GKTSettings
from tff_hetero.algorithms.fedgkt_steps import UploadSizes
from tff_hetero.algorithms.fedgkt_steps import client_dataset_with_teacher
from tff_hetero.algorithms.fedgkt_steps import server_batch_order
from tff_hetero.algorithms.fedgkt_steps import server_plan
from tff_hetero.errors import UsageError
from tff_hetero.models import fedgkt as gkt_models
from tff_hetero.settings import AlgorithmSettings
from tff_hetero.settings import in_interval
from tff_hetero.settings import non_negative_float
from tff_hetero.settings import non_negative_int
from tff_hetero.settings import positive_float
from tff_hetero.settings import positive_int
from tff_hetero.settings import setting

FULL_MODEL_OF_SERVER = gkt_models.FULL_MODEL_OF_SERVER
# PyTorch ReduceLROnPlateau's default threshold (relative, mode "max").
PLATEAU_THRESHOLD = 1e-4


class EdgeState(NamedTuple):
  """A client's persistent state (module docstring)."""

  trainable: Any
  non_trainable: Any
  optimizer_state: Any
  server_logits: Any
  logits_version: Any


class Plateau(NamedTuple):
  """The server's learning-rate schedule (module docstring)."""

  learning_rate: Any
  best: Any
  bad_rounds: Any


class GKTState(NamedTuple):
  """The server's state (module docstring)."""

  trainable: Any
  non_trainable: Any
  optimizer_state: Any
  plateau: Any
  version: Any
  events: Any


# --------------------------------------------------------------------------
# The algorithm the program drives.


def weights_of(model: tf.keras.Model) -> tff.learning.models.ModelWeights:
  """A Keras model's weights as NumPy arrays."""
  return tff.learning.models.ModelWeights(
    [np.asarray(v) for v in model.trainable_weights],
    [np.asarray(v) for v in model.non_trainable_weights],
  )


def optimizer_initial(optimizer, weights) -> Any:
  """The optimizer's initial state as arrays; its float hyper-parameters
  float32, the dtype of the weights they multiply."""
  specs = tuple(tf.TensorSpec(np.shape(w), tf.float32) for w in weights)

  def array(value):
    value = np.asarray(value)
    return value.astype(np.float32) if value.dtype == np.float64 else value

  return tf.nest.map_structure(array, optimizer.initialize(specs))


def _with_learning_rate(optimizer_state, learning_rate):
  state = collections.OrderedDict(optimizer_state)
  old = np.asarray(state["learning_rate"])
  state["learning_rate"] = np.asarray(learning_rate, old.dtype)
  return state


def _sources(
  composed: tf.keras.Model,
  edge: tf.keras.Model,
  server: tf.keras.Model,
  attribute: str,
) -> list:
  """(0 = edge / 1 = server, index) of each of `composed`'s variables."""
  where = {}
  for source, model in enumerate((edge, server)):
    for i, v in enumerate(getattr(model, attribute)):
      where[id(v)] = (source, i)
  return [where[id(v)] for v in getattr(composed, attribute)]


class FedGKT(api.FederatedAlgorithm):
  """FedGKT (module docstring) for the program."""

  name = "fedgkt"

  def __init__(
    self,
    task: api.Task,
    server_fn: Callable[[], tf.keras.Model],
    settings: GKTSettings,
    *,
    split_layer: str,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    seed: int = 0,
    local_epochs: int = 1,
    concurrency: int = 1,
    server_model_name: str = "server",
  ):
    """FedGKT of the edge model `task.model_fn` cut at its layer
    `split_layer` and the server model `server_fn` (both no-arg factories of
    identically initialised Keras models); `server_optimizer` None: the
    settings' (`server_optimizer` at `server_lr`). `settings.server_lr` is
    the plateau schedule's starting learning rate."""
    if settings.mode not in MODES:
      raise ValueError(
        f"mode must be one of {', '.join(MODES)}, got {settings.mode!r}"
      )
    self.task = task
    self.settings = settings
    self.seed = int(seed)
    self.local_epochs = int(local_epochs)
    self.concurrency = int(concurrency)
    self.split_layer = split_layer
    self.edge_fn = task.model_fn
    self.server_fn = server_fn
    self.server_model_name = server_model_name

    def composed_fn():
      return gkt_models.extractor_and_server(
        self.edge_fn(), self.server_fn(), self.split_layer
      )

    self.composed_fn = composed_fn
    edge, server = self.edge_fn(), self.server_fn()
    extractor = gkt_models.extractor(edge, self.split_layer)
    self.feature_shape = tuple(int(d) for d in extractor.output.shape[1:])
    if self.feature_shape != tuple(server.input.shape[1:]):
      raise models_lib.ModelError(
        f"the edge model {task.model_name!r} sends features of shape"
        f" {self.feature_shape} but the server model {server_model_name!r}"
        f" takes {tuple(server.input.shape[1:])}"
      )
    if int(server.output_shape[-1]) != int(task.num_classes):
      raise models_lib.ModelError(
        f"the server model {server_model_name!r} outputs"
        f" {server.output_shape[-1]} classes but the edge model"
        f" {task.model_name!r} {task.num_classes}"
      )
    composed = gkt_models.extractor_and_server(edge, server, self.split_layer)
    self._composed_sources = (
      _sources(composed, edge, server, "trainable_weights"),
      _sources(composed, edge, server, "non_trainable_weights"),
    )
    self._edge_initial = weights_of(edge)
    self._server_initial = weights_of(server)
    self.num_classes = task.num_classes
    self._edge_forward = models_lib.count_flops(edge)
    self._edge_training = models_lib.training_flops_per_example(edge)
    self._server_forward = models_lib.count_flops(server)
    self._server_training = models_lib.training_flops_per_example(server)
    self.profile = collections.OrderedDict(
      edge_model=task.model_name,
      edge_params=models_lib.count_params(edge).trainable,
      edge_flops=self._edge_forward,
      split_layer=self.split_layer,
      extractor_params=models_lib.count_params(extractor).trainable,
      extractor_flops=models_lib.count_flops(extractor),
      server_model=server_model_name,
      server_params=models_lib.count_params(server).trainable,
      server_flops=self._server_forward,
    )
    if server_optimizer is None:
      server_optimizer = SERVER_OPTIMIZERS[settings.server_optimizer](
        settings.server_lr
      )
    self._client_optimizer_initial = optimizer_initial(
      client_optimizer, self._edge_initial.trainable
    )
    self._server_optimizer_initial = optimizer_initial(
      server_optimizer, self._server_initial.trainable
    )
    self._optimizers = (client_optimizer, server_optimizer)
    self._population = None
    self._client_sizes: Mapping[str, int] = {}
    self.simulation: Optional[async_events.Simulation] = None

  @classmethod
  def of_registry(
    cls,
    task: api.Task,
    server_model: str,
    settings: GKTSettings,
    *,
    client_lr: float,
    client_momentum: float = 0.0,
    seed: int = 0,
    local_epochs: int = 1,
    concurrency: int = 1,
  ) -> "FedGKT":
    """FedGKT of a registered edge model (`task.model_name`, cut at its
    registry `split_layer`) and registered server model, the clients on SGD
    (`client_lr`, heavy-ball `client_momentum`): what `--algorithm=fedgkt`
    runs."""
    gkt_models.check_server_model(server_model)
    shape, classes = task.input_shape, task.num_classes
    algorithm = cls(
      task,
      lambda: models_lib.build_model(server_model, shape, classes, seed=seed),
      settings,
      split_layer=models_lib.split_layer(task.model_name),
      client_optimizer=learning_process.client_sgd(client_lr, client_momentum),
      seed=seed,
      local_epochs=local_epochs,
      concurrency=concurrency,
      server_model_name=server_model,
    )
    # The ResNet that extractor + server model make (the paper's "full"
    # model, split learning's and FedAvg's comparison).
    full_model = FULL_MODEL_OF_SERVER[server_model]
    full = models_lib.build_model(full_model, shape, classes, seed=seed)
    algorithm.profile.update(
      full_model=full_model,
      full_params=models_lib.count_params(full).trainable,
      full_flops=models_lib.count_flops(full),
    )
    return algorithm

  @functools.cached_property
  def computations(self) -> GKTComputations:
    """The typed computations, built (traced) on first use."""
    shape, classes = self.task.input_shape, self.num_classes
    element_spec = collections.OrderedDict(
      x=tf.TensorSpec([None, *shape], tf.float32),
      y=tf.TensorSpec([None], tf.int32),
      index=tf.TensorSpec([None], tf.int64),
      train=tf.TensorSpec([], tf.bool),
      has_teacher=tf.TensorSpec([], tf.bool),
      teacher=tf.TensorSpec([None, classes], tf.float32),
    )
    return GKTComputations(
      self.edge_fn,
      self.server_fn,
      self.split_layer,
      element_spec,
      ClientModel(*self._edge_initial, self._client_optimizer_initial),
      self._server_initial,
      self._server_optimizer_initial,
      *self._optimizers,
      self.settings,
      classes,
      self.feature_shape,
    )

  # -- program interface --------------------------------------------------

  def attach(self, population, client_sizes: Mapping[str, int]) -> None:
    """The device population and each client's training examples: they set
    the simulated clock (and, in async mode, the arrivals). Without a
    population (None; sync mode only) the clock is not simulated
    (`sim_time` NaN)."""
    self._population = population
    self._client_sizes = dict(client_sizes)
    if population is None:
      if self.settings.mode != "sync":
        raise ValueError("FedGKT's async mode needs a device population")
      self.simulation = None
      return
    self.simulation = async_events.Simulation(
      sorted(self._client_sizes),
      self.concurrency,
      self.seed,
      work=lambda c: self._job_macs(self._client_sizes[c]),
      speed=lambda c, r: population.capacity_at_round(c, r).flops,
    )

  def initialize(self) -> GKTState:
    k = self.concurrency
    events = (
      self.simulation.initial_state()
      if self.simulation is not None
      else async_events.Simulation(
        [], k, self.seed, work=len, speed=lambda *_: 1
      ).initial_state()
    )
    return GKTState(
      list(self._server_initial.trainable),
      list(self._server_initial.non_trainable),
      self._server_optimizer_initial,
      Plateau(
        np.float64(self.settings.server_lr), np.float64(-np.inf), np.int64(0)
      ),
      np.int64(0),
      events,
    )

  def initial_client_state(self) -> EdgeState:
    return EdgeState(
      list(self._edge_initial.trainable),
      list(self._edge_initial.non_trainable),
      self._client_optimizer_initial,
      np.zeros((0, self.num_classes), np.float32),
      np.int64(-1),
    )

  def client_dataset(
    self,
    arrays,
    *,
    batch_size,
    local_epochs,
    shuffle_seed,
    augment="none",
    state=None,
  ):
    """Indexed batches carrying the client's last server logits (`state`)."""
    logits = (
      EdgeState(*state).server_logits
      if state is not None
      else np.zeros((0, self.num_classes), np.float32)
    )
    return client_dataset_with_teacher(
      arrays,
      logits,
      self.num_classes,
      batch_size=batch_size,
      local_epochs=local_epochs,
      shuffle_seed=shuffle_seed,
      augment=augment,
    )

  @functools.cached_property
  def _no_data(self) -> tf.data.Dataset:
    """A padding client's dataset: no batches, the clients' element spec."""
    shape, classes = self.task.input_shape, self.num_classes
    return client_dataset_with_teacher(
      data_lib.ArrayDataset(
        np.zeros((0, *shape), np.float32), np.zeros((0,), np.int32)
      ),
      np.zeros((0, classes), np.float32),
      classes,
      batch_size=1,
      local_epochs=1,
      shuffle_seed=0,
    )

  def plan_round(
    self,
    state: GKTState,
    round_num: int,
    available: Sequence[str],
    size: int,
    sampler,
  ) -> list[api.Assignment]:
    """Sync: `size` clients uniformly; async: the next arrivals."""
    if self.settings.mode == "sync":
      return super().plan_round(state, round_num, available, size, sampler)
    if self.simulation is None:
      raise RuntimeError(
        "FedGKT's async mode needs attach(population,"
        " client_sizes) before its first round"
      )
    arrivals, events = self.simulation.plan(
      async_events.EventState(*state.events), round_num, available, size
    )
    return [api.Assignment(a.client_id, payload=(a, events)) for a in arrivals]

  def next(
    self, state: GKTState, round_num: int, clients: Sequence[api.ClientRound]
  ) -> api.RoundOutput:
    comps = self.computations
    states = [
      EdgeState(
        *(c.state if c.state is not None else self.initial_client_state())
      )
      for c in clients
    ]
    if not clients:
      return api.RoundOutput(
        state=state,
        metrics=collections.OrderedDict(loss=math.nan, non_finite_updates=0.0),
        traffic=(),
      )
    # The cohort is padded to K clients that train on nothing: async rounds
    # hold 1..K arrivals, and the worker keeps an executor stack per cohort
    # size (`cohort_positions`).
    size = max(len(clients), self.concurrency)
    sent = [
      ClientModel(s.trainable, s.non_trainable, s.optimizer_state)
      for s in states
    ]
    # Each client uploads every local sample once (`client_dataset`; its
    # `num_examples` counts all local epochs), so the driver plans the
    # server's pass from the clients' sizes (`attach`) before the round;
    # the server checks the plan's counts against the samples it receives.
    missing = [
      c.client_id for c in clients if c.client_id not in self._client_sizes
    ]
    if missing:
      raise RuntimeError(
        "FedGKT needs attach(population, client_sizes) with every client's"
        f" number of samples before a round; missing: {missing[:3]}"
      )
    samples = [int(self._client_sizes[c.client_id]) for c in clients]
    rng = np.random.default_rng([self.seed, round_num])
    if self.settings.mode == "sync":
      groups = [range(len(clients))]
      events = async_events.EventState(*state.events)
      durations = [self._duration(c.client_id, round_num) for c in clients]
      clock = (
        float(events.clock) + max(durations)
        if all(d is not None for d in durations)
        else math.nan
      )
      events = events._replace(clock=np.float64(clock))
    else:
      groups = [range(k, k + 1) for k in range(len(clients))]  # arrivals
      events = clients[-1].assignment[1]
      clock = float(events.clock)
    group_samples = [sum(samples[k] for k in group) for group in groups]
    plan = server_plan(
      [group.stop for group in groups],
      group_samples,
      [
        server_batch_order(
          n,
          self.settings.server_batch_size,
          self.settings.server_epochs,
          self.settings.server_order,
          int(rng.integers(2**31)),
        )
        for n in group_samples
      ],
    )
    plateau = Plateau(*state.plateau)
    learning_rate = float(plateau.learning_rate)
    result, gathered, client_sums = comps.round(
      tff.learning.models.ModelWeights(state.trainable, state.non_trainable),
      _with_learning_rate(state.optimizer_state, learning_rate),
      plan,
      cohort_positions.padded(sent, size, sent[0]),
      cohort_positions.padded(
        [c.dataset for c in clients], size, self._no_data
      ),
      cohort_positions.positions(size),
    )
    # Rows by cohort position (on several workers they arrive in the order
    # the workers finish: `cohort_positions`).
    rows = cohort_positions.unstack_rows(gathered, size, "FedGKT")
    models = [ClientModel(*model) for model, _ in rows[: len(clients)]]
    sizes = [UploadSizes(*(int(v) for v in z)) for _, z in rows[: len(clients)]]
    if [z.samples for z in sizes] != samples:
      raise RuntimeError(
        f"FedGKT: the clients uploaded {[z.samples for z in sizes]} samples,"
        f" their data holds {samples}"
      )
    # A client whose round was not finite sent zeros the server left out
    # (`fedgkt_steps.build_edge_update`); it keeps its state as it was: no
    # new model, answer or version.
    finite = [z.non_finite == 0 for z in sizes]
    server = tff.learning.models.ModelWeights(*result.weights)
    optimizer_state = result.optimizer_state
    answered = np.asarray(result.answers, np.float32)
    owners = np.asarray(result.answer_owners)
    answers = [
      answered[owners == k] if finite[k] else None for k in range(len(clients))
    ]
    # Group g's clients are answered by the server after its g + 1-th update
    # of the round.
    version = int(state.version)
    answered_at = [None] * len(clients)
    staleness = []
    for g, group in enumerate(groups):
      for k in group:
        if not finite[k]:
          continue
        if int(states[k].logits_version) >= 0:
          staleness.append(version + g - int(states[k].logits_version))
        answered_at[k] = version + g + 1
    version += len(groups)
    server_sums = {key: float(v) for key, v in result.sums.items()}
    fresh_correct = float(result.fresh_correct)
    server_seconds = float(result.seconds)
    fresh_samples = sum(n for n, ok in zip(samples, finite) if ok)
    fresh_accuracy = (
      fresh_correct / fresh_samples if fresh_samples else math.nan
    )
    plateau = self._plateau_step(plateau, fresh_accuracy)
    client_states = collections.OrderedDict()
    for k, (c, model, answer, at) in enumerate(
      zip(clients, models, answers, answered_at)
    ):
      if not finite[k]:
        client_states[c.client_id] = states[k]
        continue
      client_states[c.client_id] = EdgeState(
        [np.asarray(t) for t in model.trainable],
        [np.asarray(t) for t in model.non_trainable],
        tf.nest.map_structure(np.asarray, model.optimizer_state),
        answer,
        np.int64(at),
      )
    metrics = collections.OrderedDict(
      **self._metrics(clients, sizes, client_sums, server_sums),
      server_fresh_accuracy=fresh_accuracy,
      server_lr=learning_rate,
      server_version=float(version),
      staleness_mean=(float(np.mean(staleness)) if staleness else math.nan),
      staleness_max=(float(np.max(staleness)) if staleness else math.nan),
      sim_time=clock,
      server_step_s=server_seconds,
    )
    return api.RoundOutput(
      state=GKTState(
        list(server.trainable),
        list(server.non_trainable),
        tf.nest.map_structure(np.asarray, optimizer_state),
        plateau,
        np.int64(version),
        events,
      ),
      metrics=metrics,
      traffic=tuple(
        ClientTraffic(
          client_id=c.client_id,
          # No answer reaches a client whose round was not finite.
          bytes_down=0 if answer is None else int(answer.nbytes),
          bytes_up=z.bytes_up,
          flops=self._client_flops(c, z.samples),
          examples=c.num_examples,
        )
        for c, z, answer in zip(clients, sizes, answers)
      ),
      client_states=client_states,
    )

  def model_weights(self, state: GKTState):
    return tff.learning.models.ModelWeights(
      trainable=list(state.trainable), non_trainable=list(state.non_trainable)
    )

  def evaluation_models(self, state: GKTState, data=None):
    """Each client's extractor + the server model, and its edge model alone.

    Clients never sampled still hold the initial edge model; they are left
    out (the initial model stands in while no client has trained).
    """
    stored = dict(data.client_states()) if data is not None else {}
    if not stored:
      stored = {"initial": self.initial_client_state()}
    out = collections.OrderedDict()
    for client_id, edge in stored.items():
      out[f"edge_server/{client_id}"] = api.EvaluationModel(
        self._composed_weights(EdgeState(*edge), state),
        model_fn=self.composed_fn,
        group="edge_server",
      )
    for client_id, edge in stored.items():
      edge = EdgeState(*edge)
      out[f"edge/{client_id}"] = api.EvaluationModel(
        tff.learning.models.ModelWeights(
          list(edge.trainable), list(edge.non_trainable)
        ),
        model_fn=self.edge_fn,
        group="edge",
      )
    return out

  def report_extras(self) -> collections.OrderedDict:
    return collections.OrderedDict(fedgkt_models=self.profile)

  # -- helpers --------------------------------------------------------------

  def _plateau_step(self, plateau: Plateau, metric: float) -> Plateau:
    """PyTorch's ReduceLROnPlateau(mode="max", threshold_mode="rel")."""
    learning_rate, best = float(plateau.learning_rate), float(plateau.best)
    bad = int(plateau.bad_rounds)
    if math.isnan(metric):
      return plateau
    if metric > best * (1 + PLATEAU_THRESHOLD):  # -inf before the first
      best, bad = metric, 0
    else:
      bad += 1
    if bad > self.settings.lr_patience:
      learning_rate *= self.settings.lr_factor
      bad = 0
    return Plateau(np.float64(learning_rate), np.float64(best), np.int64(bad))

  def _job_macs(self, num_samples: int) -> float:
    """A client's job: local epochs of training and one extraction pass."""
    return float(
      num_samples
      * (self.local_epochs * self._edge_training + self._edge_forward)
    )

  def _duration(self, client_id: str, round_num: int) -> Optional[float]:
    if self.simulation is None or client_id not in self._client_sizes:
      return None
    return self.simulation.duration(client_id, round_num)

  def _composed_weights(self, edge: EdgeState, state: GKTState):
    parts = []
    for sources, edge_values, server_values in zip(
      self._composed_sources,
      (edge.trainable, edge.non_trainable),
      (state.trainable, state.non_trainable),
    ):
      parts.append([(edge_values, server_values)[s][i] for s, i in sources])
    return tff.learning.models.ModelWeights(*parts)

  def _client_flops(self, client: api.ClientRound, samples: int) -> int:
    return (
      client.num_examples * self._edge_training + samples * self._edge_forward
    )

  def _metrics(
    self, clients, sizes, client_sums, server_sums
  ) -> collections.OrderedDict:
    examples = float(client_sums["examples"])
    non_finite = sum(z.non_finite for z in sizes)
    learning_process.check_examples(
      examples, sum(c.num_examples for c in clients), non_finite
    )
    mean = lambda sums, key, n: float(sums[key]) / n if n else math.nan
    server_n = server_sums["examples"]
    samples = sum(z.samples for z in sizes)
    return collections.OrderedDict(
      loss=mean(client_sums, "loss", examples),
      non_finite_updates=float(non_finite),
      train_accuracy=mean(client_sums, "correct", examples),
      client_ce=mean(client_sums, "ce", examples),
      client_kd=mean(client_sums, "kd", examples),
      server_loss=mean(server_sums, "loss", server_n),
      server_ce=mean(server_sums, "ce", server_n),
      server_kd=mean(server_sums, "kd", server_n),
      server_accuracy=mean(server_sums, "correct", server_n),
      server_flops=float(
        server_n * self._server_training + 2 * samples * self._server_forward
      ),
      feature_bytes=float(sum(z.feature_bytes for z in sizes)),
    )


def check_flags(config) -> None:
  """Raises `UsageError` if `--model` is not an edge model (one with a split
  point); `FedGKTSettings` checks the `--gkt_*` flags when built."""
  if (
    config.model not in models_lib.MODELS
    or not models_lib.MODELS[config.model].split_layer
  ):
    edges = sorted(n for n, s in models_lib.MODELS.items() if s.split_layer)
    raise UsageError(
      "--model",
      f"{config.algorithm} trains an edge model (a"
      f" model with a split point); accepted:"
      f" {', '.join(edges)}",
    )


def server_model_setting():
  """`--gkt_server_model`, read by FedGKT and split learning."""
  return setting(
    "fedgkt_server_resnet55",
    "The server model (fedgkt_server_resnet7 | _resnet19 | _resnet55 |"
    " _resnet109 |"
    " _resnet55_bottleneck | _resnet109_bottleneck); --model is the edge"
    " model (fedgkt_edge_resnet4 | 6 | 8 | 8_bottleneck).",
    choices=gkt_models.SERVER_MODELS,
  )


@attrs.frozen(kw_only=True)
class FedGKTSettings(AlgorithmSettings):
  """FedGKT's flags (`GKTSettings` is what the rounds read)."""

  gkt_server_model: str = server_model_setting()
  gkt_temperature: float = setting(
    3.0, "FedGKT: distillation temperature T.", check=positive_float
  )
  gkt_client_kd_weight: float = setting(
    1.0,
    "FedGKT: weight of the server-to-edge KD term in the client loss.",
    check=non_negative_float,
  )
  gkt_server_kd_weight: float = setting(
    1.0,
    "FedGKT: weight of the edge-to-server KD term in the server loss.",
    check=non_negative_float,
  )
  gkt_server_epochs: int = setting(
    1,
    "FedGKT: server epochs over each round's features (client epochs:"
    " --local_epochs).",
    check=positive_int,
  )
  gkt_server_optimizer: str = setting(
    "adam",
    "FedGKT: server optimizer, adam | sgd (momentum 0.9).",
    choices=SERVER_OPTIMIZERS,
  )
  gkt_server_lr: float = setting(
    1e-3, "FedGKT: server learning rate.", check=positive_float
  )
  gkt_transfer: str = setting(
    "both",
    "FedGKT: knowledge transfer, both | server_to_edge | none (Table 2).",
    choices=TRANSFERS,
  )
  gkt_mode: str = setting(
    "sync",
    "FedGKT: sync (server waits for the cohort) | async (trains on each"
    " client's features as they arrive, in the order the device population's"
    " simulated clock says; --clients_per_round devices work at once).",
    choices=MODES,
  )
  gkt_kd_t_squared: bool = setting(
    True,
    "FedGKT: multiply the KL terms by T^2 (the official code; Eq. 6/7 have"
    " no T^2: --nogkt_kd_t_squared).",
  )
  gkt_lr_patience: int = setting(
    10,
    "FedGKT: rounds without a new best server accuracy on fresh features"
    " before its learning rate is reduced (PyTorch ReduceLROnPlateau).",
    check=non_negative_int("reduce after the first round without a new best"),
  )
  gkt_lr_factor: float = setting(
    0.1,
    "FedGKT: factor of each server learning-rate reduction, in (0, 1]"
    " (1: never reduce).",
    check=in_interval(
      0, 1, closed_low=False, closed_high=True, note=" (1: never reduce)"
    ),
  )
  gkt_server_order: str = setting(
    "shuffled",
    "FedGKT: the server's pass over a round's features, shuffled (over all"
    " clients, each epoch) | by_client (client after client in sample order,"
    " Algorithm 1 and the official code).",
    choices=SERVER_ORDERS,
  )


def settings_from(config) -> GKTSettings:
  """`GKTSettings` from the run's `FedGKTSettings` and batch size."""
  flags = config.settings
  return GKTSettings(
    temperature=flags.gkt_temperature,
    client_kd_weight=flags.gkt_client_kd_weight,
    server_kd_weight=flags.gkt_server_kd_weight,
    kd_t_squared=flags.gkt_kd_t_squared,
    server_epochs=flags.gkt_server_epochs,
    server_batch_size=config.batch_size,
    server_optimizer=flags.gkt_server_optimizer,
    server_lr=flags.gkt_server_lr,
    lr_patience=flags.gkt_lr_patience,
    lr_factor=flags.gkt_lr_factor,
    transfer=flags.gkt_transfer,
    mode=flags.gkt_mode,
    server_order=flags.gkt_server_order,
  )


def build_fedgkt(config, task: api.Task, client_ids=()) -> FedGKT:
  """Registry builder: `--algorithm=fedgkt` with the `--gkt_*` flags."""
  del client_ids
  check_flags(config)
  try:
    return FedGKT.of_registry(
      task,
      config.settings.gkt_server_model,
      settings_from(config),
      client_lr=config.client_lr,
      client_momentum=config.client_momentum,
      seed=config.seed,
      local_epochs=config.local_epochs,
      concurrency=config.clients_per_round,
    )
  except models_lib.ModelError as e:
    raise UsageError("--gkt_server_model", str(e)) from None


def build_fedgkt_process(
  edge_model_fn: Callable[[], tf.keras.Model],
  server_model_fn: Callable[[], tf.keras.Model],
  *,
  split_layer: str,
  client_ids: Sequence[Hashable],
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  server_optimizer_fn: tff.learning.optimizers.Optimizer,
  batch_size: int,
  local_epochs: int = 1,
  server_epochs: int = 1,
  temperature: float = 3.0,
  client_kd_weight: float = 1.0,
  server_kd_weight: float = 1.0,
  kd_t_squared: bool = True,
  transfer: str = "both",
  server_order: str = "shuffled",
  lr_patience: int = 10,
  lr_factor: float = 0.1,
  seed: int = 0,
) -> ClientStateProcess:
  """FedGKT (module docstring), sync mode, as a `ClientStateProcess`.

  The same client and server steps as `--algorithm=fedgkt`, on a user's
  models: every client keeps its own copy of `edge_model_fn()`'s model
  (trained on its data with the server's logits), the server trains
  `server_model_fn()`'s model on the features the edge model's layer
  `split_layer` outputs. `next(state, {client_id: arrays})` runs a round
  of the named clients (`client_state_process`); `computations` holds
  `client_step`, `server_step` and `round` (`fedgkt_computations`). Async
  mode needs a device population (the simulated clock) and is the CLI's.

  Args:
    edge_model_fn: No-arg callable returning a fresh, identically
      initialised `tf.keras.Model` (images in, logits out): the edge model.
    server_model_fn: The same for the server model, whose input is the
      output of the edge model's `split_layer`.
    split_layer: Name of the edge model's layer whose output the clients
      send (features).
    client_ids: Every client that may take part (distinct, hashable).
    client_optimizer_fn: The clients' `tff.learning.optimizers.Optimizer`
      (each client keeps its optimizer state across rounds).
    server_optimizer_fn: The server's `tff.learning.optimizers.Optimizer`;
      its state's `learning_rate` is the plateau schedule's start.
    batch_size: Batch size of the clients' and the server's passes.
    local_epochs .. lr_factor: `FedGKTSettings`'s `--local_epochs` and
      `--gkt_*` settings (checked by it: an error names the setting as its
      flag).
    seed: Seeds the clients' shuffles and the server's sample order.

  No `model_aggregator` or `client_weighting`: FedGKT averages nothing
  (each client keeps its own edge model; the server trains on every
  received sample). The losses are the paper's (Eq. 6 and 7:
  cross-entropy on logits against integer labels plus the weighted
  distillation terms), not arguments; the metrics are accuracies.
  """
  task, ids = client_state_process.checked_edge_arguments(
    edge_model_fn,
    server_model_fn,
    split_layer,
    client_ids,
    client_optimizer_fn,
    server_optimizer_fn,
    batch_size,
    local_epochs,
  )
  flags = FedGKTSettings(
    gkt_temperature=temperature,
    gkt_client_kd_weight=client_kd_weight,
    gkt_server_kd_weight=server_kd_weight,
    gkt_server_epochs=server_epochs,
    gkt_transfer=transfer,
    gkt_kd_t_squared=kd_t_squared,
    gkt_lr_patience=lr_patience,
    gkt_lr_factor=lr_factor,
    gkt_server_order=server_order,
  )
  initial = server_optimizer_fn.initialize(
    tuple(
      tf.TensorSpec(v.shape, tf.float32)
      for v in server_model_fn().trainable_weights
    )
  )
  if not isinstance(initial, Mapping) or "learning_rate" not in initial:
    raise TypeError(
      "server_optimizer_fn's state has no learning_rate for the plateau"
      " schedule (e.g. tff.learning.optimizers.build_adam or build_sgdm)"
    )
  settings = GKTSettings(
    temperature=flags.gkt_temperature,
    client_kd_weight=flags.gkt_client_kd_weight,
    server_kd_weight=flags.gkt_server_kd_weight,
    kd_t_squared=flags.gkt_kd_t_squared,
    server_epochs=flags.gkt_server_epochs,
    server_batch_size=batch_size,
    server_lr=float(initial["learning_rate"]),
    lr_patience=flags.gkt_lr_patience,
    lr_factor=flags.gkt_lr_factor,
    transfer=flags.gkt_transfer,
    mode="sync",
    server_order=flags.gkt_server_order,
  )
  algorithm = FedGKT(
    task,
    server_model_fn,
    settings,
    split_layer=split_layer,
    client_optimizer=client_optimizer_fn,
    server_optimizer=server_optimizer_fn,
    seed=seed,
    local_epochs=local_epochs,
    server_model_name=getattr(server_model_fn, "__name__", "server"),
  )
  comps = algorithm.computations  # Traced now, as TFF's builders do.
  return ClientStateProcess(
    algorithm,
    ids,
    collections.OrderedDict(
      client_step=comps.client_step,
      server_step=comps.server_step,
      round=comps.round,
    ),
    batch_size=batch_size,
    local_epochs=local_epochs,
    seed=seed,
  )
