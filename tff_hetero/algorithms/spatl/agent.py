"""SPATL's salient parameter agent (Yu et al., "SPATL: Salient Parameter
Aggregation and Transfer Learning for Heterogeneous Federated Learning" —
`shared/papers/spatl.txt`, Section IV-B "RL-based Topology-Aware Salient
Parameter Selection" and Section V "RL Agent Settings").

After local training a client picks, for each prunable layer of its encoder,
the fraction of the layer's output channels it uploads: a GNN over the
encoder's graph embeds the layers (the paper's graph encoder, Eq. 5), an MLP
(the actor) maps the embeddings to keep ratios (Eq. 6), and within a layer
the channels with the largest L1 norms are kept. The reward is 100 x the
validation accuracy of the selected sub-network (Eq. 7); the agent learns by
PPO (Eq. 8) with clip 0.2, gamma 0.99, a fixed action std 0.5 and Adam (lr
3e-4, betas (0.9, 0.999)). Fine-tuning on clients updates the actor only;
pre-training updates everything.

What each piece computes:

* `layer_graph(model, encoder_layers)`: the encoder as a `LayerGraph`, one
  node per Keras layer (its InputLayer as an "input" node), an edge from a
  layer to each layer that consumes its output (both inputs of a residual
  `Add`; a layer called several times contributes the edges of every call),
  node features (`layer_graph`'s docstring lists them), the symmetric
  normalised adjacency D^-1/2 (A + A^T + I) D^-1/2, and for each prunable
  layer (Conv2D and Dense; not DepthwiseConv2D, whose channels are its
  input's) its output channels, its kernel-plus-bias parameter count and the
  batch norms that follow its channels.
* `init_policy`, `policy_mean`, `policy_value`: the policy network as plain
  tensors (`PolicyParams`). GNN: two GCN layers h1 = relu(Â X W1 + b1),
  h2 = relu(Â h1 W2 + b2); graph embedding g = mean of h2 over the nodes.
  Actor: for each prunable node i, concat(h2_i, g) -> Dense(hidden, relu) ->
  Dense(1) -> sigmoid, the mean keep ratio mu_i. Critic: g -> Dense(hidden,
  relu) -> Dense(1), the value.
* `gaussian_log_prob`: the diagonal Gaussian log density of an action.
* `project_to_budget`: the paper's size constraint on the selected
  sub-network (Algorithm "RL search": E^ must satisfy the size constraint
  before it is rewarded), as a projection: ratios clipped to [min_ratio, 1]
  and moved by one common factor toward min_ratio (kept parameters
  sum(r_i n_i) above budget * sum(n_i)) or toward 1 (below it) so that the
  sum equals the budget exactly; `channel_masks` then rounds each ratio to
  whole channels.
* `channel_masks`: per prunable layer, the 0/1 mask of its
  max(1, round(r * out)) output channels with the largest L1 norms.
* `ppo_loss`, `ppo_update`: PPO's clipped surrogate plus a value loss, and
  `epochs` full-batch steps of a `tff.learning.optimizers.Optimizer` on
  it (all parameters, or the actor only).
* `salient_search`: one client's search: `episodes` actions (episode 0 the
  policy mean itself, the others mean + std * N(0, 1) drawn statelessly),
  each projected, rewarded by the caller's `reward_fn`; the best projected
  ratios are returned, and if `fine_tune` the policy is updated by PPO on
  the episodes.

Everything that runs per client (all but `layer_graph` and `init_policy`)
is pure TensorFlow, usable in a `tf.function` traced inside a
`tff.tensorflow.computation`: the parameters and optimizer state come in as
tensors and leave as new tensors, no variables are created, randomness is
`tf.random.stateless_*` from an explicit seed, and the loops are
`tf.while_loop`s.

Departures, each on purpose:

* Nodes are layers, carrying the attributes of the feature map each one
  outputs, and edges are "feeds into". The paper's graph (after Yu et al.,
  ICCV 2021) has feature maps as nodes and operations as edges; the layer
  graph is its line graph (an operation for each edge, adjacent when one
  consumes the other's output), which puts the operation's attributes on
  nodes, where a plain GCN reads them. The features are fixed and
  model-independent, so an agent pre-trained on one architecture applies to
  another.
* Episodes have one step: the state is the encoder's graph and the action
  the whole ratio vector (Eq. 5-6 produce all ratios at once), so the return
  of an episode is its reward and gamma (kept as a parameter of
  `ppo_update`) has no effect. The advantage is the reward minus the
  critic's value, standardised over the episodes.
* The size constraint is met by `project_to_budget` rather than by rejecting
  or re-drawing actions, so every episode is rewarded.
* The log probability stored for PPO is that of the Gaussian draw
  mean + std * noise before clipping to [0, 1] (the clipped value, and its
  projection, is what is evaluated): the draw is what the policy sampled,
  so the likelihood-ratio gradient stays unbiased; the density of a clipped
  value is not the probability of the clipped event.
* Episode 0 is the policy mean without noise, so the deterministic policy
  is always a candidate. It enters the PPO batch too (at the old parameters
  its log-probability gradient is zero; it contributes to the advantage
  statistics and the value target).
* No entropy bonus: the std is fixed, so the entropy is a constant.

Why hand-written rather than TF-Agents' PPO: neither `tf_agents` nor
`tensorflow_gnn` is installed in the project's environment (both fail to
import in `.venv`; neither is in `pyproject.toml`'s dependencies).
TF-Agents' `PPOAgent` needs environment and time-step specs, its own
`Network` classes (none is a GNN over a per-model graph with one output per
prunable node) and Keras variables, none of which fits a per-client function
of tensors traced inside a TFF computation; one-step PPO with a fixed-std
Gaussian is a few dozen lines of tensor code here.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
import math
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

# The paper's PPO settings (Section V, "RL Agent Settings").
CLIP = 0.2
GAMMA = 0.99
ACTION_STD = 0.5
LEARNING_RATE = 3e-4
BETA_1 = 0.9
BETA_2 = 0.999
VALUE_COEF = 0.5
HIDDEN = 64

OP_KINDS = (
  "input",
  "conv",
  "depthwise_conv",
  "dense",
  "batch_norm",
  "layer_norm",
  "activation",
  "add",
  "pool",
  "flatten",
  "dropout",
  "other",
)
# After the one-hot op kind (`layer_graph`'s docstring).
NUMERIC_FEATURES = (
  "log1p_in_channels",
  "log1p_out_channels",
  "kernel_height",
  "kernel_width",
  "stride",
  "log1p_params",
  "log1p_macs",
  "position",
  "prunable",
)
NUM_FEATURES = len(OP_KINDS) + len(NUMERIC_FEATURES)


class LayerGraph(NamedTuple):
  """An encoder as a graph (`layer_graph`); NumPy arrays and tuples.

  Attributes:
    features: float32 [num_nodes, NUM_FEATURES].
    adjacency: float32 [num_nodes, num_nodes], D^-1/2 (A + A^T + I) D^-1/2
      with A the directed edge matrix (binary).
    node_names: The layer name of each node, in model layer order.
    prunable: int32 [P], the node indices of the prunable layers.
    prunable_names: Their layer names.
    out_channels: int32 [P], their kernels' last dimension.
    param_counts: float32 [P], their kernel plus bias sizes.
    followers: For each prunable layer, the names of the batch norms whose
      only input is its output (their per-channel variables follow its
      channel selection).
    edges: The directed edges (source node, destination node), sorted.
  """

  features: np.ndarray
  adjacency: np.ndarray
  node_names: tuple
  prunable: np.ndarray
  prunable_names: tuple
  out_channels: np.ndarray
  param_counts: np.ndarray
  followers: tuple
  edges: tuple = ()


class GraphTensors(NamedTuple):
  """A `LayerGraph`'s arrays the policy reads, as tensors."""

  features: Any
  adjacency: Any
  prunable: Any
  param_counts: Any


class PolicyParams(NamedTuple):
  """The policy network's parameters, flat lists of float32 arrays/tensors.

  gnn: [W1, b1, W2, b2]; actor: [W1, b1, W2, b2] (input 2 * hidden);
  critic: [W1, b1, W2, b2] (input hidden)."""

  gnn: list
  actor: list
  critic: list


class SearchResult(NamedTuple):
  """`salient_search`'s result: the best episode's projected ratios [P] and
  reward, the mean reward over the episodes, and the (updated) policy and
  optimizer state."""

  ratios: Any
  reward: Any
  mean_reward: Any
  params: PolicyParams
  optimizer_state: Any


# ------------------------------------------------------------------- graph


def _op_kind(layer) -> str:
  layers = tf.keras.layers
  if isinstance(layer, layers.InputLayer):
    return "input"
  if isinstance(layer, (layers.DepthwiseConv1D, layers.DepthwiseConv2D)):
    return "depthwise_conv"
  if isinstance(
    layer,
    (
      layers.Conv1D,
      layers.Conv2D,
      layers.Conv3D,
      layers.SeparableConv1D,
      layers.SeparableConv2D,
    ),
  ):
    return "conv"
  if isinstance(layer, layers.Dense):
    return "dense"
  if isinstance(layer, layers.BatchNormalization):
    return "batch_norm"
  if isinstance(layer, layers.LayerNormalization):
    return "layer_norm"
  if isinstance(
    layer,
    (
      layers.ReLU,
      layers.Activation,
      layers.LeakyReLU,
      layers.ELU,
      layers.PReLU,
      layers.Softmax,
      layers.ThresholdedReLU,
    ),
  ):
    return "activation"
  if isinstance(layer, layers.Add):
    return "add"
  if isinstance(
    layer,
    (
      layers.MaxPooling1D,
      layers.MaxPooling2D,
      layers.MaxPooling3D,
      layers.AveragePooling1D,
      layers.AveragePooling2D,
      layers.AveragePooling3D,
      layers.GlobalAveragePooling1D,
      layers.GlobalAveragePooling2D,
      layers.GlobalAveragePooling3D,
      layers.GlobalMaxPooling1D,
      layers.GlobalMaxPooling2D,
      layers.GlobalMaxPooling3D,
    ),
  ):
    return "pool"
  if isinstance(layer, layers.Flatten):
    return "flatten"
  if isinstance(layer, layers.Dropout):
    return "dropout"
  return "other"


def _is_prunable(layer) -> bool:
  layers = tf.keras.layers
  if isinstance(layer, layers.Conv2D):
    # Conv2DTranspose subclasses Conv2D, its kernel's last axis is its input.
    return not isinstance(layer, layers.Conv2DTranspose)
  return isinstance(layer, layers.Dense)


def _first_shape(shapes) -> tuple:
  """The first shape of a shape or a (nested) list of shapes."""
  if isinstance(shapes, tf.TensorShape):
    return tuple(shapes.as_list()) if shapes.rank is not None else ()
  if isinstance(shapes, (list, tuple)) and shapes:
    if all(d is None or isinstance(d, (int, np.integer)) for d in shapes):
      return tuple(shapes)
    return _first_shape(shapes[0])
  return ()


def _last_dim(shape: tuple) -> int:
  return int(shape[-1]) if shape and shape[-1] is not None else 0


def _spatial(shape: tuple) -> int:
  """The product of the dimensions between batch and channels."""
  out = 1
  for d in shape[1:-1]:
    out *= int(d) if d is not None else 1
  return out


def _pair(value) -> tuple[int, int]:
  if value is None:
    return 0, 0
  value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
  return int(value[0]), int(value[1]) if len(value) > 1 else 1


def _graph_nodes(model: tf.keras.Model) -> list:
  """The Keras nodes (calls of layers) of `model`'s own graph."""
  if not getattr(model, "_is_graph_network", False):
    raise ValueError(
      f"layer_graph needs a functional Keras model; {model.name!r} is not one"
    )
  nodes = []
  for depth in sorted(model._nodes_by_depth, reverse=True):
    nodes.extend(model._nodes_by_depth[depth])
  return nodes


def layer_graph(
  model: tf.keras.Model, encoder_layers: Sequence[str]
) -> LayerGraph:
  """The `LayerGraph` of the layers `encoder_layers` of built functional
  `model`.

  Nodes are those layers in model layer order; an edge runs from a layer to
  every layer that consumes its output, among the encoder's layers only,
  for every call of the layer in `model`'s graph (a layer used more than
  once has the edges of all its calls). Node features (NUM_FEATURES
  float32 values, independent of the model so that an agent trained on one
  architecture applies to another):

  * one-hot of the op kind over OP_KINDS (ReLU and Activation layers are
    "activation"; max, average and global pooling are "pool"; convolutions
    other than depthwise are "conv"; anything else, e.g. a custom layer or
    a nested model, is "other");
  * log1p(input channels) (last dimension of the first input of the first
    call; 0 if unknown), log1p(output channels);
  * kernel height and width (`kernel_size`, or `pool_size` for windowed
    pooling; 0 and 0 without a window; a 1-D window has width 1);
  * stride (first dimension, 1 if none);
  * log1p(parameters of the layer, all its weights);
  * log1p(MACs per example): for convolutions and dense layers, the size of
    their kernels times the spatial size of the output, summed over the
    layer's calls (Conv2D kh*kw*cin*cout*H_out*W_out, Dense in*out); 0 for
    other layers;
  * relative position index / (num_nodes - 1) (0 for a single node);
  * 1 if the layer is prunable (Conv2D, not transposed; Dense), else 0.

  A prunable layer's followers are the BatchNormalization layers of the
  encoder whose every call takes exactly one input, an output of that
  layer, and normalise the last axis.

  Raises:
    ValueError: `model` is not a functional model, or a name of
      `encoder_layers` is not one of its layers.
  """
  nodes = _graph_nodes(model)
  by_name = {}
  for node in nodes:
    by_name.setdefault(node.layer.name, node.layer)
  ordered = [l for l in model._input_layers if l not in model.layers]
  ordered += list(model.layers)
  wanted = set(encoder_layers)
  unknown = wanted - {l.name for l in ordered} - set(by_name)
  if unknown:
    raise ValueError(f"layer_graph: unknown encoder layers {sorted(unknown)}")
  layers = [l for l in ordered if l.name in wanted]
  names = tuple(l.name for l in layers)
  index = {name: i for i, name in enumerate(names)}
  n = len(layers)

  calls = {name: [] for name in names}
  parents = {name: [] for name in names}
  edges = set()
  for node in nodes:
    name = node.layer.name
    if name not in index:
      continue
    calls[name].append(node)
    sources = [p.layer.name for p in node.parent_nodes]
    parents[name].append(sources)
    for source in sources:
      if source in index:
        edges.add((index[source], index[name]))
  edges = tuple(sorted(edges))

  directed = np.zeros([n, n], np.float64)
  for source, destination in edges:
    directed[source, destination] = 1.0
  undirected = np.minimum(directed + directed.T + np.eye(n), 1.0)
  scale = 1.0 / np.sqrt(undirected.sum(axis=1))
  adjacency = (scale[:, None] * undirected * scale[None, :]).astype(np.float32)

  features = np.zeros([n, NUM_FEATURES], np.float32)
  base = len(OP_KINDS)
  prunable = []
  for i, layer in enumerate(layers):
    kind = _op_kind(layer)
    features[i, OP_KINDS.index(kind)] = 1.0
    layer_calls = calls[layer.name]
    if layer_calls:
      in_shape = _first_shape(layer_calls[0].input_shapes)
      out_shape = _first_shape(layer_calls[0].output_shapes)
    else:
      in_shape = out_shape = ()
    if kind == "input" or not in_shape:
      in_shape = in_shape or out_shape
    kernel = getattr(layer, "kernel_size", None)
    if kernel is None:
      kernel = getattr(layer, "pool_size", None)
    kh, kw = _pair(kernel)
    strides = getattr(layer, "strides", None)
    stride = _pair(strides)[0] if strides else 1
    macs = 0
    if kind in ("conv", "depthwise_conv", "dense"):
      kernel_size = sum(
        int(np.prod(w.shape))
        for w in layer.weights
        if "kernel" in w.name.split("/")[-1]
      )
      for node in layer_calls:
        macs += kernel_size * _spatial(_first_shape(node.output_shapes))
    is_prunable = _is_prunable(layer)
    features[i, base:] = [
      math.log1p(_last_dim(in_shape)),
      math.log1p(_last_dim(out_shape)),
      kh,
      kw,
      stride,
      math.log1p(layer.count_params() if layer.built else 0),
      math.log1p(macs),
      i / (n - 1) if n > 1 else 0.0,
      float(is_prunable),
    ]
    if is_prunable:
      prunable.append(i)

  followers = []
  out_channels = []
  param_counts = []
  for i in prunable:
    layer = layers[i]
    out_channels.append(int(layer.kernel.shape[-1]))
    count = int(np.prod(layer.kernel.shape))
    if getattr(layer, "use_bias", False) and layer.bias is not None:
      count += int(np.prod(layer.bias.shape))
    param_counts.append(count)
    follows = []
    for candidate in layers:
      if not isinstance(candidate, tf.keras.layers.BatchNormalization):
        continue
      sources = parents[candidate.name]
      if not sources or any(s != [layer.name] for s in sources):
        continue
      axis = list(np.atleast_1d(candidate.axis))
      rank = len(_first_shape(calls[candidate.name][0].input_shapes))
      if len(axis) == 1 and axis[0] in (-1, rank - 1):
        follows.append(candidate.name)
    followers.append(tuple(follows))

  return LayerGraph(
    features=features,
    adjacency=adjacency,
    node_names=names,
    prunable=np.asarray(prunable, np.int32),
    prunable_names=tuple(names[i] for i in prunable),
    out_channels=np.asarray(out_channels, np.int32),
    param_counts=np.asarray(param_counts, np.float32),
    followers=tuple(followers),
    edges=edges,
  )


def graph_tensors(graph) -> GraphTensors:
  """`graph`'s features, adjacency, prunable indices and parameter counts as
  tensors (`graph` a `LayerGraph` or a `GraphTensors`)."""
  return _as_graph_tensors(graph)


def _as_graph_tensors(graph) -> GraphTensors:
  return GraphTensors(
    features=tf.convert_to_tensor(graph.features, tf.float32),
    adjacency=tf.convert_to_tensor(graph.adjacency, tf.float32),
    prunable=tf.convert_to_tensor(graph.prunable, tf.int32),
    param_counts=tf.convert_to_tensor(graph.param_counts, tf.float32),
  )


# ------------------------------------------------------------------ policy


def _glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
  limit = math.sqrt(6.0 / (fan_in + fan_out))
  return rng.uniform(-limit, limit, size=[fan_in, fan_out]).astype(np.float32)


def init_policy(seed: int, hidden: int = HIDDEN) -> PolicyParams:
  """A seeded policy: Glorot-uniform kernels (`np.random.default_rng(seed)`,
  drawn in the order gnn, actor, critic), zero biases; NumPy float32."""
  rng = np.random.default_rng(seed)

  def mlp(sizes):
    out = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
      out += [_glorot(rng, fan_in, fan_out), np.zeros([fan_out], np.float32)]
    return out

  return PolicyParams(
    gnn=mlp([NUM_FEATURES, hidden, hidden]),
    actor=mlp([2 * hidden, hidden, 1]),
    critic=mlp([hidden, hidden, 1]),
  )


def _tensors(values) -> list:
  return [tf.convert_to_tensor(v, tf.float32) for v in values]


def _params_as_tensors(params: PolicyParams) -> PolicyParams:
  return PolicyParams(
    gnn=_tensors(params.gnn),
    actor=_tensors(params.actor),
    critic=_tensors(params.critic),
  )


def _embed(gnn, features, adjacency):
  """The GCN's node embeddings h2 [N, hidden] and their mean g [hidden]."""
  w1, b1, w2, b2 = _tensors(gnn)
  x = tf.convert_to_tensor(features, tf.float32)
  a = tf.convert_to_tensor(adjacency, tf.float32)
  h = tf.nn.relu(tf.matmul(a, tf.matmul(x, w1)) + b1)
  h = tf.nn.relu(tf.matmul(a, tf.matmul(h, w2)) + b2)
  return h, tf.reduce_mean(h, axis=0)


def _actor(actor, h, g, prunable):
  w1, b1, w2, b2 = _tensors(actor)
  nodes = tf.gather(h, tf.convert_to_tensor(prunable, tf.int32))
  graph = tf.tile(g[tf.newaxis, :], [tf.shape(nodes)[0], 1])
  x = tf.concat([nodes, graph], axis=1)
  x = tf.nn.relu(tf.matmul(x, w1) + b1)
  return tf.sigmoid(tf.matmul(x, w2) + b2)[:, 0]


def _critic(critic, g):
  w1, b1, w2, b2 = _tensors(critic)
  x = tf.nn.relu(tf.matmul(g[tf.newaxis, :], w1) + b1)
  return (tf.matmul(x, w2) + b2)[0, 0]


def policy_mean(params: PolicyParams, features, adjacency, prunable):
  """The mean keep ratio of each prunable node, float32 [P] in (0, 1)."""
  h, g = _embed(params.gnn, features, adjacency)
  return _actor(params.actor, h, g, prunable)


def policy_value(params: PolicyParams, features, adjacency):
  """The critic's value of the graph, a float32 scalar."""
  _, g = _embed(params.gnn, features, adjacency)
  return _critic(params.critic, g)


def gaussian_log_prob(actions, mean, std):
  """log N(actions; mean, std^2 I), summed over the last axis: a [P] action
  gives a scalar, an [E, P] batch gives [E]. `std` is a scalar or [P]."""
  actions = tf.convert_to_tensor(actions, tf.float32)
  mean = tf.convert_to_tensor(mean, tf.float32)
  std = tf.convert_to_tensor(std, tf.float32)
  z = (actions - mean) / std
  density = -0.5 * tf.square(z) - tf.math.log(std) - 0.5 * math.log(2 * math.pi)
  return tf.reduce_sum(density, axis=-1)


# ---------------------------------------------------------------- actions


def project_to_budget(ratios, param_counts, budget, min_ratio):
  """Keep ratios whose selected sub-network has exactly the budget's size:
  the paper's size constraint on the selected sub-network, met with
  equality as AMC's agents meet theirs (the agent decides how the budget is
  shared among the layers, not how much is kept).

  With n_i the parameter count of layer i, the ratios are clipped to
  [min_ratio, 1]. If the kept parameters sum(r_i n_i) then exceed
  B = budget * sum(n_i), every ratio moves toward min_ratio by one factor s,
  r_i <- min_ratio + (r_i - min_ratio) s; if they fall short, toward 1,
  r_i <- 1 - (1 - r_i) s; s is chosen so that sum(r_i n_i) = B exactly (the
  relative preferences the agent expressed are kept). If budget <=
  min_ratio every ratio becomes min_ratio; if budget >= 1, every ratio 1.
  Works on [P] or [..., P] (sums over the last axis). Pure TF.
  """
  ratios = tf.convert_to_tensor(ratios, tf.float32)
  counts = tf.convert_to_tensor(param_counts, tf.float32)
  floor = tf.cast(min_ratio, tf.float32)
  budget = tf.cast(budget, tf.float32)
  r = tf.clip_by_value(ratios, floor, 1.0)
  total = tf.reduce_sum(counts)
  kept = tf.reduce_sum(r * counts, axis=-1, keepdims=True)
  target = tf.clip_by_value(budget, floor, 1.0) * total
  down = tf.clip_by_value(
    tf.math.divide_no_nan(target - floor * total, kept - floor * total),
    0.0,
    1.0,
  )
  up = tf.clip_by_value(
    tf.math.divide_no_nan(total - target, total - kept), 0.0, 1.0
  )
  return tf.where(
    kept > target,
    floor + (r - floor) * down,
    tf.where(kept < target, 1.0 - (1.0 - r) * up, r),
  )


def channel_masks(kernels: Sequence[Any], ratios) -> list:
  """For each prunable layer's kernel (output channels on the LAST axis), a
  float32 0/1 mask [out] keeping the k = max(1, floor(r * out + 0.5))
  output channels with the largest L1 norms over the rest of the kernel
  (ties: the lower index first). `ratios` is [len(kernels)]. Pure TF; the
  kernels' shapes must be static."""
  ratios = tf.convert_to_tensor(ratios, tf.float32)
  masks = []
  for p, kernel in enumerate(kernels):
    kernel = tf.convert_to_tensor(kernel, tf.float32)
    out = int(kernel.shape[-1])
    scores = tf.reduce_sum(tf.abs(tf.reshape(kernel, [-1, out])), axis=0)
    k = tf.cast(tf.floor(ratios[p] * out + 0.5), tf.int32)
    k = tf.clip_by_value(k, 1, out)
    # top_k over all channels: sorted by score, equal scores by index.
    order = tf.math.top_k(scores, k=out, sorted=True).indices
    rank = tf.math.invert_permutation(order)
    masks.append(tf.cast(rank < k, tf.float32))
  return masks


# -------------------------------------------------------------------- PPO


def build_agent_optimizer() -> tff.learning.optimizers.Optimizer:
  """The paper's agent optimizer: Adam, lr 3e-4, betas (0.9, 0.999)."""
  return tff.learning.optimizers.build_adam(
    learning_rate=LEARNING_RATE, beta_1=BETA_1, beta_2=BETA_2
  )


def _trainable(params: PolicyParams, train_gnn: bool) -> list:
  if train_gnn:
    return list(params.gnn) + list(params.actor) + list(params.critic)
  return list(params.actor)


def _with_trainable(params: PolicyParams, weights, train_gnn: bool):
  weights = list(weights)
  if not train_gnn:
    return PolicyParams(list(params.gnn), weights, list(params.critic))
  g, a = len(params.gnn), len(params.actor)
  return PolicyParams(weights[:g], weights[g : g + a], weights[g + a :])


def _leaf_tensor(value):
  """Python floats as float32 and ints as int64 (a TFF optimizer's state
  holds Python numbers; a loop needs fixed dtypes)."""
  if isinstance(value, bool):
    return tf.constant(value)
  if isinstance(value, int):
    return tf.constant(value, tf.int64)
  if isinstance(value, float):
    return tf.constant(value, tf.float32)
  return tf.convert_to_tensor(value)


def _leaf_numpy(value):
  if isinstance(value, bool):
    return np.asarray(value)
  if isinstance(value, int):
    return np.asarray(value, np.int64)
  if isinstance(value, float):
    return np.asarray(value, np.float32)
  if tf.is_tensor(value) and not hasattr(value, "numpy"):
    return value
  return np.asarray(value)


def init_optimizer_state(
  optimizer: tff.learning.optimizers.Optimizer,
  params: PolicyParams,
  train_gnn: bool,
):
  """`optimizer`'s initial state for the parameters `ppo_update` trains: all
  of them (gnn + actor + critic, in that order) if `train_gnn`, else the
  actor's. Leaves are NumPy values (Python floats float32, ints int64)."""
  specs = [
    tf.TensorSpec(np.shape(w), tf.float32)
    for w in _trainable(params, train_gnn)
  ]
  return tf.nest.map_structure(_leaf_numpy, optimizer.initialize(specs))


def ppo_loss(
  params: PolicyParams,
  features,
  adjacency,
  prunable,
  actions,
  old_log_probs,
  advantages,
  returns,
  *,
  clip: float = CLIP,
  std: float = ACTION_STD,
  value_coef: float = VALUE_COEF,
):
  """PPO's loss over E one-step episodes of the same state (the graph):

  -mean_e(min(r_e A_e, clip(r_e, 1 - clip, 1 + clip) A_e))
  + value_coef * mean_e((V - returns_e)^2),

  r_e = exp(log pi(actions_e) - old_log_probs_e) under the Gaussian of mean
  `policy_mean` and fixed `std`, V = `policy_value`. `actions` [E, P],
  the others [E]."""
  h, g = _embed(params.gnn, features, adjacency)
  mean = _actor(params.actor, h, g, prunable)
  value = _critic(params.critic, g)
  log_probs = gaussian_log_prob(actions, mean[tf.newaxis, :], std)
  old_log_probs = tf.convert_to_tensor(old_log_probs, tf.float32)
  advantages = tf.convert_to_tensor(advantages, tf.float32)
  returns = tf.convert_to_tensor(returns, tf.float32)
  ratio = tf.exp(log_probs - old_log_probs)
  surrogate = tf.minimum(
    ratio * advantages,
    tf.clip_by_value(ratio, 1.0 - clip, 1.0 + clip) * advantages,
  )
  value_loss = tf.reduce_mean(tf.square(value - returns))
  return -tf.reduce_mean(surrogate) + value_coef * value_loss


def ppo_update(
  params: PolicyParams,
  optimizer: tff.learning.optimizers.Optimizer,
  optimizer_state,
  graph_tensors,
  actions,
  old_log_probs,
  rewards,
  *,
  epochs: int,
  train_gnn: bool,
  clip: float = CLIP,
  std: float = ACTION_STD,
  value_coef: float = VALUE_COEF,
  gamma: float = GAMMA,
):
  """`epochs` full-batch PPO steps on E one-step episodes; returns
  `(params, optimizer_state, mean_loss)`.

  The return of a one-step episode is its reward: `gamma` discounts
  nothing and has no effect (kept for the paper's setting). Advantages are
  rewards - V(g) with the parameters before the update, standardised
  (minus their mean, divided by their population std + 1e-8) when E > 1.
  If `train_gnn` (a Python bool) every parameter is trained and
  `optimizer_state` must cover gnn + actor + critic; otherwise only the
  actor, the GNN and critic are returned unchanged, and the state covers
  the actor (`init_optimizer_state`). `mean_loss` is the mean of the loss
  before each step (0 if epochs is 0). `graph_tensors` is a
  `GraphTensors` or a `LayerGraph`. Pure TF.
  """
  del gamma  # One-step episodes: the return is the reward.
  if epochs < 0:
    raise ValueError(f"ppo_update: epochs must be >= 0, got {epochs}")
  graph = _as_graph_tensors(graph_tensors)
  params = _params_as_tensors(params)
  optimizer_state = tf.nest.map_structure(_leaf_tensor, optimizer_state)
  actions = tf.convert_to_tensor(actions, tf.float32)
  old_log_probs = tf.convert_to_tensor(old_log_probs, tf.float32)
  rewards = tf.convert_to_tensor(rewards, tf.float32)

  value = policy_value(params, graph.features, graph.adjacency)
  advantages = rewards - value
  centered = advantages - tf.reduce_mean(advantages)
  standardised = centered / (tf.math.reduce_std(advantages) + 1e-8)
  advantages = tf.where(tf.size(rewards) > 1, standardised, advantages)
  advantages = tf.stop_gradient(advantages)

  def loss_of(weights):
    return ppo_loss(
      _with_trainable(params, weights, train_gnn),
      graph.features,
      graph.adjacency,
      graph.prunable,
      actions,
      old_log_probs,
      advantages,
      rewards,
      clip=clip,
      std=std,
      value_coef=value_coef,
    )

  def body(step, weights, state, loss_sum):
    with tf.GradientTape() as tape:
      tape.watch(weights)
      loss = loss_of(weights)
    gradients = tape.gradient(
      loss, weights, unconnected_gradients=tf.UnconnectedGradients.ZERO
    )
    state, weights = optimizer.next(state, weights, gradients)
    return step + 1, list(weights), state, loss_sum + loss

  _, weights, optimizer_state, loss_sum = tf.while_loop(
    lambda step, *_: step < epochs,
    body,
    (
      tf.constant(0),
      _trainable(params, train_gnn),
      optimizer_state,
      tf.constant(0.0),
    ),
  )
  mean_loss = loss_sum / float(max(epochs, 1))
  return _with_trainable(params, weights, train_gnn), optimizer_state, mean_loss


def salient_search(
  params: PolicyParams,
  optimizer: tff.learning.optimizers.Optimizer,
  optimizer_state,
  graph,
  reward_fn: Callable[[tf.Tensor], tf.Tensor],
  *,
  episodes: int,
  ppo_epochs: int,
  fine_tune,
  seed,
  budget: float,
  min_ratio: float,
  std: float = ACTION_STD,
  clip: float = CLIP,
  train_gnn: bool = False,
) -> SearchResult:
  """One client's salient parameter search (module docstring).

  Episode e proposes a = clip(mean + std * noise_e, 0, 1), noise_e ~ N(0, I)
  from `tf.random.stateless_normal` on `seed` (int32/int64 [2]), except
  episode 0, which proposes the policy mean itself; its ratios are
  `project_to_budget(a, graph.param_counts, budget, min_ratio)` and its
  reward `reward_fn(ratios)` (a callable building TF ops from a float32 [P]
  tensor and returning a float32 scalar, e.g. 100 x validation accuracy;
  it may iterate a `tf.data.Dataset`). The log probability kept for PPO is
  that of the unclipped draw. If `fine_tune` (scalar bool tensor) is true,
  `ppo_update` runs `ppo_epochs` epochs on the episodes (the actor only
  unless `train_gnn`; `optimizer_state` must match, see
  `init_optimizer_state`); otherwise params and state come back unchanged.

  Returns the `SearchResult` of the episode with the highest reward (the
  first on ties), the mean reward, the params and optimizer state.
  """
  if episodes < 1:
    raise ValueError(f"salient_search: episodes must be >= 1, got {episodes}")
  g = graph_tensors(graph)
  num_prunable = g.prunable.shape[0]
  if num_prunable == 0:
    raise ValueError("salient_search: the graph has no prunable layer")
  params = _params_as_tensors(params)
  optimizer_state = tf.nest.map_structure(_leaf_tensor, optimizer_state)
  fine_tune = tf.convert_to_tensor(fine_tune, tf.bool)

  mean = policy_mean(params, g.features, g.adjacency, g.prunable)
  noise = tf.random.stateless_normal([episodes, num_prunable], seed=seed)
  noisy = tf.concat([tf.zeros([1, 1]), tf.ones([episodes - 1, 1])], axis=0)
  draws = mean[tf.newaxis, :] + std * noise * noisy
  ratios = project_to_budget(
    tf.clip_by_value(draws, 0.0, 1.0), g.param_counts, budget, min_ratio
  )
  log_probs = gaussian_log_prob(draws, mean[tf.newaxis, :], std)

  def body(e, rewards):
    reward = tf.reshape(tf.cast(reward_fn(ratios[e]), tf.float32), [])
    return e + 1, rewards.write(e, reward)

  _, rewards = tf.while_loop(
    lambda e, _: e < episodes,
    body,
    (tf.constant(0), tf.TensorArray(tf.float32, size=episodes)),
  )
  rewards = rewards.stack()
  best = tf.reduce_min(
    tf.where(
      tf.equal(rewards, tf.reduce_max(rewards)), tf.range(episodes), episodes
    )
  )
  best = tf.where(best < episodes, best, 0)  # All rewards NaN: the first.

  def update():
    new_params, new_state, _ = ppo_update(
      params,
      optimizer,
      optimizer_state,
      g,
      tf.stop_gradient(draws),
      tf.stop_gradient(log_probs),
      rewards,
      epochs=ppo_epochs,
      train_gnn=train_gnn,
      clip=clip,
      std=std,
    )
    return new_params, new_state

  def keep():
    return tf.nest.map_structure(tf.identity, (params, optimizer_state))

  new_params, new_state = tf.cond(fine_tune, update, keep)
  return SearchResult(
    ratios=ratios[best],
    reward=rewards[best],
    mean_reward=tf.reduce_mean(rewards),
    params=PolicyParams(
      list(new_params.gnn), list(new_params.actor), list(new_params.critic)
    ),
    optimizer_state=new_state,
  )
