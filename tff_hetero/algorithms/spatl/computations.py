"""SPATL's client step, server step and round as TFF computations.

Paper: Yu et al., "SPATL: Salient Parameter Aggregation and Transfer
Learning for Heterogeneous Federated Learning", `spatl.txt`, Section IV.
What each step does, and
where it departs from the paper, is in `spatl.py`'s docstring; this module
only computes it. Three layers, as TFF's `model_delta_client_work.py`:

1. `build_spatl_client_update(model_fn, layout, options)`: the pure
   `tf.function` client step: set the downloaded encoder and the client's own
   predictor, train both for K local SGD steps with the encoder's gradients
   corrected by c_g - c_l (Eq. 9), update c_l (Eq. 10, option II), pick
   the salient channels of the trained encoder with the client's agent
   (`agent.salient_search`, reward 100 x local validation accuracy of the
   selected sub-network), and return the encoder update masked to those
   channels with a `MaskedWeight`, Delta c_l, its weighted batch-norm
   statistics, the client's new state and its `ClientReport` (bytes
   measured on the encoded upload). Also `build_predictor_update`: the
   predictor-only pass of Eq. 4.
2. `SpatlComputations` traces, with E the encoder's trainable variables,
   N the model's non-trainable variables, C the control variate (E; an
   empty struct without gradient control), S = `ClientState`, D the data's
   sequence type (validation: the same type), R = `RoundInfo`, M =
   `MaskedWeight<float32, E>`, U the model's unfinalized metrics:
     client_work: (<<E, N, C>, S, D, D, R> -> <E, M, C, N, S, ClientReport, U>)
       (update, its mask and weight, Delta c_l, the weighted statistics)
     server_update: (<E, MaskedSums<E, E>, float32, C, C, N, N, float32> ->
                     <E, C, N>)
       (encoder, masked sums, total weight, c_g, sum of Delta c_l, the
       statistics, their weighted sum, the server learning rate eta)
     predictor_update: (<E, N, P, D> -> P)   (P the predictor's variables)
3. and the round, one federated computation:
     round: (<E@SERVER, N@SERVER, C@SERVER, float32@SERVER (eta),
              S@CLIENTS, D@CLIENTS, D@CLIENTS, R@CLIENTS,
              int32@CLIENTS (cohort position)> ->
             <E@SERVER, C@SERVER, N@SERVER, <rows=<S, ClientReport>[n],
              positions=int32[n]>@SERVER, metrics@SERVER>)
   returning the new encoder, c_g and statistics, and each client's new
   state and report stacked by cohort position (`cohort_positions.gather`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.accounting import payload
from tff_hetero.accounting import tff_measure
from tff_hetero.aggregators import masked
from tff_hetero.algorithms import cohort_positions
from tff_hetero.algorithms import local_training
from tff_hetero.algorithms.spatl import agent as agent_lib
from tff_hetero.algorithms.spatl import subnetwork
from tff_hetero.errors import ModelError


class ClientState(NamedTuple):
  """What a SPATL client keeps between rounds (the client-state store):
  its private predictor's variables, its control variate c_l (the
  encoder's shape; empty without gradient control), and its agent's actor
  and the actor's Adam state (empty without selection)."""

  predictor: Any
  control: Any
  actor: Any
  actor_optimizer: Any


class RoundInfo(NamedTuple):
  """Per client and round: whether the agent is fine-tuned (the paper's
  first 10 rounds) and the seed of its episodes' noise (int64[2])."""

  fine_tune: Any
  seed: Any


class ClientReport(NamedTuple):
  """What a client's round did, measured: bytes of its upload (selected
  channels, their int32 indices, Delta c_l, its weight), the kept fraction of
  each prunable layer's output channels, the MACs per example of the model
  its selection leaves (`subnetwork.selected_macs`, float64; 0 without a
  layer graph), the selected sub-network's reward, the agent's mean reward
  over the episodes, the local SGD steps, the validation examples the
  search evaluated, and 1 if its update was not finite (then zeroed, of
  weight 0, and its predictor left as it was), else 0."""

  bytes_up: Any
  keep_fractions: Any
  macs: Any
  reward: Any
  mean_reward: Any
  steps: Any
  evaluated_examples: Any
  non_finite: Any


@attrs.frozen
class SpatlOptions:
  """The computations' switches (the paper's ablations) and the agent's
  search settings.

  Attributes:
    gradient_control: Eq. 9-11 on the encoder (False: no control variates,
      nothing of them sent).
    control_scale: s in Eq. 9's corrected gradient g + s (c_g - c_l): 1 is
      the paper's and SCAFFOLD's; the official code uses 0.01. Eq. 10's
      update of c_l is not scaled.
    selection: Salient channel selection (False: the whole encoder is sent).
    episodes: Agent episodes per client and round.
    ppo_epochs: PPO epochs of a fine-tuning update (the paper's 20).
    budget: The fraction of the prunable layers' parameters a client
      uploads (the selection's size constraint, met exactly).
    min_keep: The smallest keep ratio of a layer.
    cohort_mean: Eq. 12's 1/|K| over the cohort (True) or the mean over the
      clients that selected each element (False).
  """

  gradient_control: bool = True
  control_scale: float = 1.0
  selection: bool = True
  episodes: int = 8
  ppo_epochs: int = 20
  budget: float = 0.7
  min_keep: float = 0.1
  cohort_mean: bool = True


@attrs.frozen
class SpatlLayout:
  """Where the encoder and the predictor sit in a model's variables.

  Attributes:
    encoder: Indices into the model's trainable variables of the shared
      encoder's, in order (E).
    predictor: The private predictor's (P).
    channel_of: Per encoder position, the prunable layer whose output
      channels select it (its kernel, bias and the batch norms following
      it), or -1: sent whole.
    kernel_positions: Per prunable layer, the encoder position of its kernel.
    graph: The encoder's `agent.LayerGraph` (None without selection).
    flow: The whole model's `subnetwork.ChannelFlow` for the graph's
      prunable layers (None without selection).
  """

  encoder: tuple[int, ...]
  predictor: tuple[int, ...]
  channel_of: tuple[int, ...]
  kernel_positions: tuple[int, ...]
  graph: Any = None
  flow: Any = None


def build_layout(
  keras_model: tf.keras.Model,
  encoder_layers: Sequence[str],
  predictor_layers: Sequence[str],
  *,
  graph_layers: Optional[Sequence[str]] = None,
) -> SpatlLayout:
  """The `SpatlLayout` of `keras_model` split into `encoder_layers` (shared)
  and `predictor_layers` (private). `graph_layers` (default: the encoder)
  are the layers the agent sees and may prune; a shared layer outside them
  is sent whole.

  Raises:
    ModelError: a predictor layer with non-trainable variables (a private
      predictor keeps trainable variables only), or a layer in neither part.
  """
  owner = {}
  for layer in keras_model.layers:
    for variable in layer.weights:
      owner[id(variable)] = layer
  encoder_layers, predictor_layers = set(encoder_layers), set(predictor_layers)
  for layer in keras_model.layers:
    if layer.name in predictor_layers and layer.non_trainable_weights:
      raise ModelError(
        f"SPATL: predictor layer {layer.name!r} has non-trainable variables;"
        " a private predictor keeps trainable variables only"
      )
  encoder, predictor = [], []
  for index, variable in enumerate(keras_model.trainable_weights):
    name = owner[id(variable)].name
    if name in predictor_layers:
      predictor.append(index)
    elif name in encoder_layers:
      encoder.append(index)
    else:
      raise ModelError(f"SPATL: layer {name!r} is in neither part")
  graph = flow = None
  channel_of = [-1] * len(encoder)
  kernel_positions = []
  if graph_layers is not None:
    graph = agent_lib.layer_graph(keras_model, list(graph_layers))
    flow = subnetwork.channel_flow(
      keras_model, graph.prunable_names, graph.followers
    )
    position = {
      id(keras_model.trainable_weights[i]): p for p, i in enumerate(encoder)
    }
    for p, name in enumerate(graph.prunable_names):
      layer = keras_model.get_layer(name)
      kernel_positions.append(position[id(layer.kernel)])
      selected = list(layer.trainable_weights)
      for follower in graph.followers[p]:
        selected += keras_model.get_layer(follower).trainable_weights
      for variable in selected:
        channel_of[position[id(variable)]] = p
  return SpatlLayout(
    encoder=tuple(encoder),
    predictor=tuple(predictor),
    channel_of=tuple(channel_of),
    kernel_positions=tuple(kernel_positions),
    graph=graph,
    flow=flow,
  )


def _expand_mask(mask, like):
  """A channel mask [C] broadcast to a variable whose last axis is C."""
  return tf.broadcast_to(tf.cast(mask, like.dtype), tf.shape(like))


def element_masks(layout: SpatlLayout, encoder, channel_masks):
  """Per encoder variable, its 0/1 element mask (ones where sent whole)."""
  return [
    tf.ones_like(w) if p < 0 else _expand_mask(channel_masks[p], w)
    for w, p in zip(encoder, layout.channel_of)
  ]


def _accuracy_fold(model, data):
  """(correct, count) of `model`'s inference-mode predictions on `data`."""

  def reduce_fn(state, batch):
    correct, count = state
    logits = model.predict_on_batch(batch["x"], training=False)
    labels = tf.cast(tf.reshape(batch["y"], [-1]), tf.int64)
    hits = tf.equal(tf.argmax(logits, axis=-1), labels)
    return (
      correct + tf.reduce_sum(tf.cast(hits, tf.float32)),
      count + tf.cast(tf.size(labels), tf.float32),
    )

  return local_training.fold_batches(
    data, (tf.constant(0.0), tf.constant(0.0)), reduce_fn
  )


def _count_examples(data):
  """Examples in `data` (its labels counted, no forward pass)."""
  return local_training.fold_batches(
    data,
    tf.constant(0.0),
    lambda n, batch: n + tf.cast(tf.size(batch["y"]), tf.float32),
  )


def build_spatl_client_update(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  layout: SpatlLayout,
  options: SpatlOptions,
  fixed_policy: Optional[agent_lib.PolicyParams] = None,
  uniform: bool = False,
):
  """Layer 1: the pure `tf.function` SPATL client step (module docstring).

  `fixed_policy` holds the agent's GNN and critic, which clients never
  update (its actor is the client's own, from its state)."""
  model = model_fn()
  agent_optimizer = agent_lib.build_agent_optimizer()
  num_prunable = len(layout.kernel_positions)

  @tf.function
  def client_update(
    optimizer, encoder, non_trainable, control, state, data, validation, info
  ):
    weights = tff.learning.models.ModelWeights.from_model(model)
    trainable = list(weights.trainable)
    for p, i in enumerate(layout.encoder):
      trainable[i].assign(encoder[p])
    for p, i in enumerate(layout.predictor):
      trainable[i].assign(state.predictor[p])
    for variable, value in zip(weights.non_trainable, non_trainable):
      variable.assign(value)
    correction = {}
    if options.gradient_control:
      for p, i in enumerate(layout.encoder):
        correction[i] = options.control_scale * (control[p] - state.control[p])
    examples, steps, learning_rate = local_training.corrected_sgd_pass(
      model, trainable, optimizer, data, correction
    )
    trained = [tf.identity(trainable[i]) for i in layout.encoder]
    predictor = [tf.identity(trainable[i]) for i in layout.predictor]
    statistics = [tf.identity(v) for v in weights.non_trainable]
    # TFF's sign: the update is what the server subtracts.
    update = [w - y for w, y in zip(encoder, trained)]
    if options.gradient_control:
      # Eq. 10 (option II): c_l+ = c_l - c_g + (w_g - w_e) / (K eta).
      control_delta = local_training.option_two_control_delta(
        update, control, steps, learning_rate
      )
    else:
      control_delta = []

    actor, actor_optimizer = list(state.actor), state.actor_optimizer
    reward = mean_reward = evaluated = tf.constant(0.0)
    if options.selection:
      kernels = [trained[p] for p in layout.kernel_positions]

      def reward_fn(ratios):
        masks = element_masks(
          layout, trained, agent_lib.channel_masks(kernels, ratios)
        )
        for p, i in enumerate(layout.encoder):
          trainable[i].assign(trained[p] * masks[p])
        correct, count = _accuracy_fold(model, validation)
        return 100.0 * tf.math.divide_no_nan(correct, count)

      params = agent_lib.PolicyParams(
        gnn=list(fixed_policy.gnn),
        actor=actor,
        critic=list(fixed_policy.critic),
      )
      search = agent_lib.salient_search(
        params,
        agent_optimizer,
        actor_optimizer,
        layout.graph,
        reward_fn,
        episodes=options.episodes,
        ppo_epochs=options.ppo_epochs,
        fine_tune=info.fine_tune,
        seed=info.seed,
        budget=options.budget,
        min_ratio=options.min_keep,
      )
      channel = agent_lib.channel_masks(kernels, search.ratios)
      actor, actor_optimizer = list(search.params.actor), search.optimizer_state
      reward, mean_reward = search.reward, search.mean_reward
      evaluated = _count_examples(validation) * float(options.episodes)
    else:
      channel = [
        tf.ones(tf.shape(k)[-1:])
        for k in [trained[p] for p in layout.kernel_positions]
      ]
    masks = element_masks(layout, trained, channel)
    update = [u * m for u, m in zip(update, masks)]
    # The BN statistics and the predictor are checked with the update: a
    # NaN in either would reach the global statistics (NaN x 0 is NaN) or
    # the client's next rounds.
    (update, control_delta, statistics, _), non_finite = (
      local_training.zero_all_if_any_non_finite(
        (update, control_delta, statistics, predictor)
      )
    )
    weight = (
      tf.constant(1.0, tf.float32) if uniform else tf.cast(examples, tf.float32)
    )
    # The client keeps its predictor, and its agent (which searched a broken
    # model), as they were.
    predictor, actor, actor_optimizer = tf.nest.map_structure(
      lambda new, old: tf.where(non_finite > 0, old, new),
      (predictor, actor, actor_optimizer),
      (list(state.predictor), list(state.actor), state.actor_optimizer),
      check_types=False,
    )
    predictor, actor = list(predictor), list(actor)
    if non_finite > 0 or steps == 0:
      weight = tf.constant(0.0, tf.float32)
      model.reset_metrics()
    # Only the selected channels of Delta c travel, and c_l changes by what
    # it sends: c_g stays the mean of the clients' c_l (spatl.py).
    sent_control = [d * m for d, m in zip(control_delta, masks)]
    new_control = [c + d for c, d in zip(state.control, sent_control)]
    sent_channels = [None if p < 0 else channel[p] for p in layout.channel_of]
    groups = list(layout.channel_of)
    bytes_up = (
      payload.tf_channel_indexed_nbytes(
        trained + sent_control,
        sent_channels + sent_channels[: len(sent_control)],
        groups + groups[: len(sent_control)],
      )
      + payload.tf_dense_nbytes(statistics)
      + payload.tf_dense_nbytes(weight)
    )
    keep = (
      tf.stack([tf.reduce_mean(c) for c in channel])
      if num_prunable
      else tf.zeros([0])
    )
    report = ClientReport(
      bytes_up=bytes_up,
      keep_fractions=keep,
      macs=(
        subnetwork.selected_macs(layout.flow, channel)
        if layout.flow is not None
        else tf.constant(0.0, tf.float64)
      ),
      reward=reward,
      mean_reward=mean_reward,
      steps=steps,
      evaluated_examples=evaluated,
      non_finite=non_finite,
    )
    return (
      update,
      masked.MaskedWeight(weight=weight, mask=masks),
      sent_control,
      [v * weight for v in statistics],
      ClientState(
        predictor=predictor,
        control=new_control,
        actor=actor,
        actor_optimizer=actor_optimizer,
      ),
      report,
      model.report_local_unfinalized_metrics(),
    )

  return client_update


def build_predictor_update(
  model_fn: Callable[[], tff.learning.models.VariableModel],
  layout: SpatlLayout,
):
  """Layer 1: Eq. 4, the predictor-only pass of a client that was never
  sampled: `predictor_update(optimizer, encoder, non_trainable, predictor,
  data) -> predictor` (local SGD on the predictor, the encoder frozen)."""
  model = model_fn()

  @tf.function
  def predictor_update(optimizer, encoder, non_trainable, predictor, data):
    weights = tff.learning.models.ModelWeights.from_model(model)
    trainable = list(weights.trainable)
    for p, i in enumerate(layout.encoder):
      trainable[i].assign(encoder[p])
    for p, i in enumerate(layout.predictor):
      trainable[i].assign(predictor[p])
    for variable, value in zip(weights.non_trainable, non_trainable):
      variable.assign(value)
    head = [trainable[i] for i in layout.predictor]
    optimizer_state = optimizer.initialize(
      tuple(tf.TensorSpec(v.shape, v.dtype) for v in head)
    )

    def reduce_fn(optimizer_state, batch):
      optimizer_state, _, _ = local_training.sgd_step(
        model, head, optimizer, optimizer_state, batch
      )
      return optimizer_state

    local_training.fold_batches(data, optimizer_state, reduce_fn)
    return [tf.identity(v) for v in head]

  return predictor_update


class SpatlComputations:
  """SPATL's typed computations (module docstring, layers 2 and 3)."""

  def __init__(
    self,
    tff_model_fn: Callable[[], tff.learning.models.VariableModel],
    layout: SpatlLayout,
    options: SpatlOptions,
    *,
    client_optimizer,
    total_clients: int,
    initial_policy: Optional[agent_lib.PolicyParams],
    metrics_aggregator: Callable,
    uniform: bool = False,
  ):
    self.layout, self.options = layout, options
    with tf.Graph().as_default():
      model = tff_model_fn()
      metrics_aggregate = metrics_aggregator(model.metric_finalizers())
      initial = tff.learning.models.ModelWeights.from_model(model)
      trainable_specs = [
        tf.TensorSpec(v.shape, v.dtype) for v in initial.trainable
      ]
    weights_type = tff.learning.models.weights_type_from_model(model)
    encoder_type = tff.StructWithPythonType(
      [weights_type.trainable[i] for i in layout.encoder], list
    )
    predictor_type = tff.StructWithPythonType(
      [weights_type.trainable[i] for i in layout.predictor], list
    )
    non_trainable_type = weights_type.non_trainable
    data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))
    self.encoder_specs = [trainable_specs[i] for i in layout.encoder]
    self.predictor_specs = [trainable_specs[i] for i in layout.predictor]
    agent_optimizer = agent_lib.build_agent_optimizer()
    policy = initial_policy
    if options.selection:
      self.initial_actor = [np.asarray(a, np.float32) for a in policy.actor]
      self.initial_actor_optimizer = agent_lib.init_optimizer_state(
        agent_optimizer, policy, train_gnn=False
      )
    else:
      self.initial_actor, self.initial_actor_optimizer = [], ()
    template = self.initial_client_state(
      [np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in self.predictor_specs]
    )
    state_type = tff.types.tensorflow_to_type(
      tf.nest.map_structure(
        lambda a: tf.TensorSpec(np.shape(a), tf.as_dtype(np.asarray(a).dtype)),
        template,
      )
    )
    info_type = tff.types.tensorflow_to_type(
      RoundInfo(
        fine_tune=tf.TensorSpec([], tf.bool),
        seed=tf.TensorSpec([2], tf.int64),
      )
    )
    control_type = (
      encoder_type
      if options.gradient_control
      else tff.StructWithPythonType([], list)
    )
    sent_type = tff.StructType([encoder_type, non_trainable_type, control_type])
    self.state_type, self.data_type = state_type, data_type

    @tff.tensorflow.computation(
      sent_type, state_type, data_type, data_type, info_type
    )
    def client_work(sent, state, data, validation, info):
      update = build_spatl_client_update(
        tff_model_fn, layout, options, policy, uniform
      )
      state = ClientState(
        predictor=list(state.predictor),
        control=list(state.control),
        actor=list(state.actor),
        actor_optimizer=state.actor_optimizer,
      )
      return update(
        client_optimizer,
        list(sent[0]),
        list(sent[1]),
        list(sent[2]),
        state,
        data,
        validation,
        RoundInfo(info.fine_tune, info.seed),
      )

    mask_type = client_work.type_signature.result[1]
    has_statistics = len(non_trainable_type) > 0
    total = float(total_clients)
    cohort_mean = options.cohort_mean

    @tff.tensorflow.computation(
      encoder_type,
      tff.types.tensorflow_to_type(
        masked.MaskedSums(
          weighted_sum=[
            tf.TensorSpec(s.shape, s.dtype) for s in self.encoder_specs
          ],
          weight_sum=[
            tf.TensorSpec(s.shape, s.dtype) for s in self.encoder_specs
          ],
        )
      ),
      tff.TensorType(np.float32),
      control_type,
      control_type,
      non_trainable_type,
      non_trainable_type,
      tff.TensorType(np.float32),
    )
    def server_update(
      encoder,
      sums,
      total_weight,
      control,
      control_sum,
      statistics,
      statistics_sum,
      lr,
    ):
      # Eq. 12, its sign fixed: w_g <- w_g + eta * mean(w_k - w_g) at the
      # uploaded channels (the update is w_g - w_k, TFF's sign).
      if cohort_mean:
        mean = [
          tf.math.divide_no_nan(s, total_weight) for s in sums.weighted_sum
        ]
      else:
        mean = [
          tf.math.divide_no_nan(s, c)
          for s, c in zip(sums.weighted_sum, sums.weight_sum)
        ]
      encoder = [w - lr * m for w, m in zip(encoder, mean)]
      # Eq. 11: c_g <- c_g + (1 / |N|) sum_k Delta c_k.
      control = [c + s / total for c, s in zip(control, control_sum)]
      # The non-trainable variables (batch-norm statistics): the clients'
      # weighted mean, kept when no client trained.
      statistics = [
        tf.where(total_weight > 0, s / total_weight, v)
        for v, s in zip(statistics, statistics_sum)
      ]
      return encoder, control, statistics

    @tff.tensorflow.computation(
      encoder_type, non_trainable_type, predictor_type, data_type
    )
    def predictor_update(encoder, non_trainable, predictor, data):
      update = build_predictor_update(tff_model_fn, layout)
      return update(
        client_optimizer,
        list(encoder),
        list(non_trainable),
        list(predictor),
        data,
      )

    self.client_work = client_work
    self.server_update = server_update
    self.predictor_update = predictor_update
    distributor = tff_measure.build_measured_broadcast_process(sent_type)
    masked_sum = masked.MaskedSumFactory().create(encoder_type, mask_type)

    @tff.tensorflow.computation(mask_type)
    def weight_of(masked_weight):
      return masked_weight.weight

    @tff.federated_computation(
      tff.FederatedType(encoder_type, tff.SERVER),
      tff.FederatedType(non_trainable_type, tff.SERVER),
      tff.FederatedType(control_type, tff.SERVER),
      tff.FederatedType(tff.TensorType(np.float32), tff.SERVER),
      tff.FederatedType(state_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
      tff.FederatedType(info_type, tff.CLIENTS),
      cohort_positions.POSITIONS_AT_CLIENTS,
    )
    def spatl_round(
      encoder,
      non_trainable,
      control,
      server_lr,
      states,
      data,
      validation,
      info,
      positions,
    ):
      sent = distributor.next(
        distributor.initialize(),
        tff.federated_zip([encoder, non_trainable, control]),
      )
      (
        update,
        weight,
        control_delta,
        statistics,
        new_states,
        reports,
        metrics,
      ) = tff.federated_map(
        client_work, (sent.result, states, data, validation, info)
      )
      statistics_sum = (
        tff.federated_sum(statistics) if has_statistics else non_trainable
      )
      sums = masked_sum.next(masked_sum.initialize(), update, weight)
      total_weight = tff.federated_sum(tff.federated_map(weight_of, weight))
      control_sum = (
        tff.federated_sum(control_delta)
        if options.gradient_control
        else control
      )
      new_encoder, new_control, new_statistics = tff.federated_map(
        server_update,
        (
          encoder,
          sums.result,
          total_weight,
          control,
          control_sum,
          non_trainable,
          statistics_sum,
          server_lr,
        ),
      )
      measurements = tff.federated_zip(
        collections.OrderedDict(
          distributor=sent.measurements,
          train=metrics_aggregate(metrics),
        )
      )
      return (
        new_encoder,
        new_control,
        new_statistics,
        cohort_positions.gather(
          tff.federated_map(
            _zip_rows(state_type, reports.type_signature.member),
            (new_states, reports),
          ),
          positions,
        ),
        measurements,
      )

    self.round = spatl_round

  def initial_client_state(self, predictor) -> ClientState:
    """A client's state before its first round: the given predictor (the
    model's seeded initial one), c_l = 0, the agent's initial actor."""
    return ClientState(
      predictor=[np.asarray(p) for p in predictor],
      control=[
        np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in self.encoder_specs
      ]
      if self.options.gradient_control
      else [],
      actor=[np.array(a) for a in self.initial_actor],
      actor_optimizer=tf.nest.map_structure(
        np.array, self.initial_actor_optimizer
      ),
    )


def _zip_rows(state_type, report_type):
  @tff.tensorflow.computation(state_type, report_type)
  def rows(state, report):
    return state, report

  return rows
