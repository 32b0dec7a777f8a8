"""SPATL's agent (`tff_hetero/algorithms/spatl/agent.py`) by known answers.

Every expected value is worked out by hand (in the comments) or by an
independent NumPy computation: the layer graph of a tiny residual model, the
GCN forward pass, the Gaussian density, the budget projection, the L1
channel choice and PPO's clipped objective. PPO is then seen to learn a toy
reward, fine-tuning to touch the actor only, and the search to run inside a
TFF computation whose reward iterates its dataset argument.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms.spatl import agent

_NAMES = ("image", "conv1", "bn1", "relu1", "conv2", "add", "pool")
# image -> conv1 -> bn1 -> relu1 -> conv2 -> add <- relu1; add -> pool.
_EDGES = ((0, 1), (1, 2), (2, 3), (3, 4), (3, 5), (4, 5), (5, 6))


def _tiny_model():
  """8x8x3 -> conv1 (4, 3x3, stride 2) -> bn1 -> relu1 -> conv2 (4, 3x3) ->
  add(conv2, relu1) -> pool (global average) -> logits (Dense 5)."""
  image = tf.keras.Input((8, 8, 3), name="image")
  x = tf.keras.layers.Conv2D(4, 3, strides=2, padding="same", name="conv1")(
    image
  )
  x = tf.keras.layers.BatchNormalization(name="bn1")(x)
  relu = tf.keras.layers.ReLU(name="relu1")(x)
  x = tf.keras.layers.Conv2D(4, 3, padding="same", name="conv2")(relu)
  x = tf.keras.layers.Add(name="add")([x, relu])
  x = tf.keras.layers.GlobalAveragePooling2D(name="pool")(x)
  logits = tf.keras.layers.Dense(5, name="logits")(x)
  return tf.keras.Model(image, logits)


@pytest.fixture(scope="module")
def tiny_graph():
  model = _tiny_model()
  return agent.layer_graph(
    model, [l.name for l in model.layers if l.name != "logits"]
  )


def _known_policy(mean: float, value: float) -> agent.PolicyParams:
  """A policy whose actor outputs `mean` for every layer and whose critic
  outputs `value`: their last kernels are zero, their last biases
  logit(mean) and value."""
  params = agent.init_policy(3)
  actor = list(params.actor)
  actor[2] = np.zeros_like(actor[2])
  actor[3] = np.full([1], math.log(mean / (1 - mean)), np.float32)
  critic = list(params.critic)
  critic[2] = np.zeros_like(critic[2])
  critic[3] = np.full([1], value, np.float32)
  return agent.PolicyParams(list(params.gnn), actor, critic)


def _np_normal_log_prob(x, mean, std):
  return np.sum(
    -0.5 * ((x - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi),
    axis=-1,
  )


# ------------------------------------------------------------------ graph


def test_layer_graph_of_a_tiny_residual_model(tiny_graph):
  g = tiny_graph
  assert g.node_names == _NAMES
  assert g.edges == _EDGES
  # Adjacency: binary A + A^T + I, scaled by 1/sqrt(d_i d_j).
  a = np.eye(7)
  for i, j in _EDGES:
    a[i, j] = a[j, i] = 1.0
  # Degrees with the self loop, by hand: image 2, conv1 3, bn1 3, relu1 4
  # (bn1, conv2, add), conv2 3, add 4 (conv2, relu1, pool), pool 2.
  degrees = np.array([2, 3, 3, 4, 3, 4, 2], np.float64)
  np.testing.assert_array_equal(a.sum(axis=1), degrees)
  expected = a / np.sqrt(np.outer(degrees, degrees))
  np.testing.assert_allclose(g.adjacency, expected, rtol=1e-6)
  assert g.adjacency.dtype == np.float32
  # The Add node touches both of its inputs.
  assert g.adjacency[5, 4] > 0 and g.adjacency[5, 3] > 0
  assert g.adjacency[5, 2] == 0

  np.testing.assert_array_equal(g.prunable, [1, 4])
  assert g.prunable.dtype == np.int32
  assert g.prunable_names == ("conv1", "conv2")
  np.testing.assert_array_equal(g.out_channels, [4, 4])
  # conv1: 3*3*3*4 + 4 = 112; conv2: 3*3*4*4 + 4 = 148.
  np.testing.assert_array_equal(g.param_counts, [112.0, 148.0])
  assert g.param_counts.dtype == np.float32
  assert g.followers == (("bn1",), ())

  assert g.features.shape == (7, agent.NUM_FEATURES) == (7, 21)
  kinds = ("input", "conv", "batch_norm", "activation", "conv", "add", "pool")
  one_hot = np.zeros([7, len(agent.OP_KINDS)], np.float32)
  for i, kind in enumerate(kinds):
    one_hot[i, agent.OP_KINDS.index(kind)] = 1.0
  base = len(agent.OP_KINDS)
  np.testing.assert_array_equal(g.features[:, :base], one_hot)
  # [cin, cout, kh, kw, stride, params, MACs, position, prunable]; conv1's
  # output is 4x4 (stride 2), so its MACs are 3*3*3*4 * 16 = 1728; conv2's
  # 3*3*4*4 * 16 = 2304; bn1 has 4 x 4 parameters.
  log1p = math.log1p
  expected_numeric = [
    [log1p(3), log1p(3), 0, 0, 1, 0, 0, 0 / 6, 0],
    [log1p(3), log1p(4), 3, 3, 2, log1p(112), log1p(1728), 1 / 6, 1],
    [log1p(4), log1p(4), 0, 0, 1, log1p(16), 0, 2 / 6, 0],
    [log1p(4), log1p(4), 0, 0, 1, 0, 0, 3 / 6, 0],
    [log1p(4), log1p(4), 3, 3, 1, log1p(148), log1p(2304), 4 / 6, 1],
    [log1p(4), log1p(4), 0, 0, 1, 0, 0, 5 / 6, 0],
    [log1p(4), log1p(4), 0, 0, 1, 0, 0, 6 / 6, 0],
  ]
  np.testing.assert_allclose(g.features[:, base:], expected_numeric, rtol=1e-6)


def test_layer_graph_of_resnet20():
  from tff_hetero.models import registry  # pylint: disable=g-import-not-at-top

  model = registry.build_model("resnet20", (32, 32, 3), 10, 0)
  encoder = [l.name for l in model.layers if l.name != "logits"]
  g = agent.layer_graph(model, encoder)
  convs = [
    l.name for l in model.layers if isinstance(l, tf.keras.layers.Conv2D)
  ]
  assert len(convs) == 19
  assert g.prunable_names == tuple(convs)
  assert len(g.node_names) == len(encoder)
  assert np.all(np.isfinite(g.features)) and np.all(np.isfinite(g.adjacency))
  np.testing.assert_array_equal(g.adjacency, g.adjacency.T)
  index = {name: i for i, name in enumerate(g.node_names)}
  assert g.followers[0] == ("stem_bn",)
  assert (index["stage1_block1_bn2"], index["stage1_block1_add"]) in g.edges
  assert (index["stage1_block1_shortcut"], index["stage1_block1_add"]) in (
    g.edges
  )


def test_layer_graph_rejects_an_unknown_layer():
  with pytest.raises(ValueError, match="nope"):
    agent.layer_graph(_tiny_model(), ["image", "nope"])


# ----------------------------------------------------------------- policy


def test_policy_matches_a_numpy_forward_pass(tiny_graph):
  g = tiny_graph
  params = agent.init_policy(5, hidden=8)
  w1, b1, w2, b2 = params.gnn
  relu = lambda x: np.maximum(x, 0.0)
  a, x = g.adjacency.astype(np.float64), g.features.astype(np.float64)
  h = relu(a @ x @ w1 + b1)
  h = relu(a @ h @ w2 + b2)
  graph = h.mean(axis=0)
  aw1, ab1, aw2, ab2 = params.actor
  inputs = np.concatenate([h[[1, 4]], np.tile(graph, [2, 1])], axis=1)
  mean = 1 / (1 + np.exp(-(relu(inputs @ aw1 + ab1) @ aw2 + ab2)[:, 0]))
  cw1, cb1, cw2, cb2 = params.critic
  value = (relu(graph @ cw1 + cb1) @ cw2 + cb2)[0]
  np.testing.assert_allclose(
    agent.policy_mean(params, g.features, g.adjacency, g.prunable),
    mean,
    rtol=1e-5,
  )
  np.testing.assert_allclose(
    agent.policy_value(params, g.features, g.adjacency), value, rtol=1e-5
  )
  # Shapes and initialisation of the default policy.
  default = agent.init_policy(0)
  assert [np.shape(w) for w in default.gnn] == [
    (21, 64),
    (64,),
    (64, 64),
    (64,),
  ]
  assert [np.shape(w) for w in default.actor] == [
    (128, 64),
    (64,),
    (64, 1),
    (1,),
  ]
  assert [np.shape(w) for w in default.critic] == [
    (64, 64),
    (64,),
    (64, 1),
    (1,),
  ]
  assert all(np.all(b == 0) for b in default.gnn[1::2])
  limit = math.sqrt(6 / (21 + 64))
  assert np.max(np.abs(default.gnn[0])) <= limit


def test_known_policy_outputs(tiny_graph):
  g = tiny_graph
  params = _known_policy(0.25, 3.0)
  np.testing.assert_allclose(
    agent.policy_mean(params, g.features, g.adjacency, g.prunable),
    [0.25, 0.25],
    rtol=1e-6,
  )
  assert float(agent.policy_value(params, g.features, g.adjacency)) == 3.0


def test_gaussian_log_prob_closed_form():
  x = np.array([[0.1, 0.9, 0.5], [1.2, -0.3, 0.0]], np.float32)
  mean = np.array([0.2, 0.7, 0.5], np.float32)
  np.testing.assert_allclose(
    agent.gaussian_log_prob(x, mean, 0.5),
    _np_normal_log_prob(x.astype(np.float64), mean, 0.5),
    rtol=1e-6,
  )
  # At the mean: P * (-log std - log(2 pi) / 2).
  np.testing.assert_allclose(
    float(agent.gaussian_log_prob(mean, mean, 0.5)),
    3 * (-math.log(0.5) - 0.5 * math.log(2 * math.pi)),
    rtol=1e-6,
  )


# ---------------------------------------------------------------- actions


def test_project_to_budget_by_hand():
  counts = np.array([100.0, 300.0], np.float32)
  # Kept 400 > 0.5 * 400 = 200: s = (200 - 40) / (400 - 40) = 4/9, both
  # ratios 0.1 + 0.9 * 4/9 = 0.5.
  r = agent.project_to_budget([1.0, 1.0], counts, 0.5, 0.1).numpy()
  np.testing.assert_allclose(r, [0.5, 0.5], rtol=1e-6)
  np.testing.assert_allclose(np.sum(r * counts), 200.0, rtol=1e-6)
  # Kept 100 + 120 = 220: s = 160 / 180 = 8/9; 0.1 + 0.9 s = 0.9 and
  # 0.1 + 0.3 s = 0.3667; kept 90 + 110 = 200.
  r = agent.project_to_budget([1.0, 0.4], counts, 0.5, 0.1).numpy()
  np.testing.assert_allclose(r, [0.9, 0.1 + 0.3 * 8 / 9], rtol=1e-6)
  np.testing.assert_allclose(np.sum(r * counts), 200.0, rtol=1e-6)
  # Under the budget: kept 20 + 90 = 110 < 200; toward 1 by
  # s = (400 - 200) / (400 - 110) = 20/29: 1 - 0.8 s and 1 - 0.7 s.
  under = [1 - 0.8 * 20 / 29, 1 - 0.7 * 20 / 29]
  r = agent.project_to_budget([0.2, 0.3], counts, 0.5, 0.1).numpy()
  np.testing.assert_allclose(r, under, rtol=1e-6)
  np.testing.assert_allclose(np.sum(r * counts), 200.0, rtol=1e-6)
  # Budget 1: everything kept.
  np.testing.assert_allclose(
    agent.project_to_budget([-0.5, 1.5], counts, 1.0, 0.1), [1.0, 1.0]
  )
  # Budget at or below the floor: everything at the floor.
  np.testing.assert_allclose(
    agent.project_to_budget([0.9, 0.6], counts, 0.05, 0.1), [0.1, 0.1]
  )
  # A batch of episodes, each projected on its own.
  np.testing.assert_allclose(
    agent.project_to_budget([[1.0, 1.0], [0.2, 0.3]], counts, 0.5, 0.1),
    [[0.5, 0.5], under],
    rtol=1e-6,
  )


def test_channel_masks_by_hand():
  # A Dense kernel [2, 4] with column L1 norms 3, 1, 4, 2.
  dense = np.array([[1.0, -0.5, 2.0, 1.0], [-2.0, 0.5, -2.0, 1.0]], np.float32)
  # A conv kernel [1, 1, 2, 4] with channel L1 norms 2, 5, 5, 1 (a tie).
  conv = np.array([[[[1.0, 2.0, -3.0, 0.5], [-1.0, 3.0, 2.0, -0.5]]]])
  masks = agent.channel_masks([dense, conv], [0.5, 0.25])
  np.testing.assert_array_equal(masks[0], [1, 0, 1, 0])
  np.testing.assert_array_equal(masks[1], [0, 1, 0, 0])  # Tie: lower index.
  masks = agent.channel_masks([dense, conv], [0.0, 0.5])
  np.testing.assert_array_equal(masks[0], [0, 0, 1, 0])  # At least one.
  np.testing.assert_array_equal(masks[1], [0, 1, 1, 0])
  masks = agent.channel_masks([np.ones([3, 4]), conv], [0.5, 1.0])
  np.testing.assert_array_equal(masks[0], [1, 1, 0, 0])  # All tied.
  np.testing.assert_array_equal(masks[1], [1, 1, 1, 1])
  assert masks[0].dtype == tf.float32


# -------------------------------------------------------------------- PPO


def test_ppo_loss_is_the_clipped_objective(tiny_graph):
  g = tiny_graph
  params = _known_policy(0.25, 3.0)  # mean 0.25 on both layers, V = 3.
  actions = np.array([[0.25, 0.25], [0.6, 0.1], [0.0, 0.9], [0.3, 0.3]])
  new = _np_normal_log_prob(actions, 0.25, 0.5)
  ratios = np.array([2.0, 0.5, 0.5, 2.0])
  old = (new - np.log(ratios)).astype(np.float32)
  advantages = np.array([1.0, -2.0, 1.5, -0.5], np.float32)
  returns = np.array([4.0, 1.0, 3.0, 0.0], np.float32)
  # r = 2, A > 0: clipped to 1.2 A; r = 0.5, A < 0: 0.8 A (the smaller);
  # r = 0.5, A > 0: 0.5 A; r = 2, A < 0: 2 A.
  surrogate = np.array([1.2 * 1.0, 0.8 * -2.0, 0.5 * 1.5, 2.0 * -0.5])
  value_loss = np.mean((3.0 - returns) ** 2)  # (1 + 4 + 0 + 9) / 4
  for coef in (0.0, 0.5):
    loss = agent.ppo_loss(
      params,
      g.features,
      g.adjacency,
      g.prunable,
      actions.astype(np.float32),
      old,
      advantages,
      returns,
      value_coef=coef,
    )
    np.testing.assert_allclose(
      float(loss), -surrogate.mean() + coef * value_loss, rtol=1e-5
    )


def test_ppo_update_advantages_and_mean_loss(tiny_graph):
  g = tiny_graph
  params = _known_policy(0.25, 3.0)  # mean 0.25, V = 3.
  optimizer = agent.build_agent_optimizer()
  actions = np.array([[0.1, 0.5], [0.4, 0.2]], np.float32)
  # Old log probs those of the current policy: r = 1 at the first step, so
  # the loss before it is -mean(A) + 0.5 mean((3 - R)^2).
  old = _np_normal_log_prob(actions, 0.25, 0.5).astype(np.float32)

  def mean_loss(episodes, epochs):
    state = agent.init_optimizer_state(optimizer, params, train_gnn=False)
    new, _, loss = agent.ppo_update(
      params,
      optimizer,
      state,
      g,
      actions[:episodes],
      old[:episodes],
      np.array([10.0, 30.0], np.float32)[:episodes],
      epochs=epochs,
      train_gnn=False,
    )
    return new, float(loss)

  # Two episodes: A = R - V = (7, 27) standardised to (-1, 1), mean 0; the
  # value term 0.5 * (49 + 729) / 2 = 194.5.
  np.testing.assert_allclose(mean_loss(2, 1)[1], 194.5, rtol=1e-5)
  # One episode: A = 7 as it is; -7 + 0.5 * 49 = 17.5.
  np.testing.assert_allclose(mean_loss(1, 1)[1], 17.5, rtol=1e-5)
  new, loss = mean_loss(2, 0)
  assert loss == 0.0
  for old_w, new_w in zip(tf.nest.flatten(params), tf.nest.flatten(new)):
    np.testing.assert_array_equal(new_w, old_w)


def test_ppo_learns_a_toy_reward(tiny_graph):
  g = tiny_graph
  target = tf.constant([0.3, 0.8])
  # The paper's std 0.5 with actions clipped to [0, 1] makes the expected
  # reward best at saturated means (-0.07 and 1.5 for this reward); a
  # smaller std keeps the optimum of the noisy policy at the target.
  std = 0.2
  # The target's size: (0.3 * 112 + 0.8 * 148) / 260 of the parameters, so
  # the projection can reach it; the agent learns how to share it.
  budget = (0.3 * 112 + 0.8 * 148) / 260
  optimizer = tff.learning.optimizers.build_adam(3e-3)
  params = agent.init_policy(0)
  state = agent.init_optimizer_state(optimizer, params, train_gnn=False)

  def reward_fn(ratios):
    return 100.0 - 100.0 * tf.reduce_mean(tf.abs(ratios - target))

  @tf.function
  def search(params, state, seed):
    result = agent.salient_search(
      params,
      optimizer,
      state,
      g,
      reward_fn,
      episodes=8,
      ppo_epochs=10,
      fine_tune=tf.constant(True),
      seed=seed,
      budget=budget,
      min_ratio=0.0,
      std=std,
    )
    return result.params, result.optimizer_state

  def error(params):
    # The ratios the policy's mean proposes, after the projection.
    mean = agent.policy_mean(params, g.features, g.adjacency, g.prunable)
    ratios = agent.project_to_budget(mean, g.param_counts, budget, 0.0)
    return float(np.mean(np.abs(ratios.numpy() - [0.3, 0.8])))

  before = error(params)
  for call in range(30):
    params, state = search(params, state, tf.constant([11, call]))
  after = error(params)
  assert before > 0.15  # Both ratios near the budget at initialisation.
  assert after < 0.5 * before, (before, after)


def test_fine_tuning_updates_the_actor_only(tiny_graph):
  g = tiny_graph
  optimizer = agent.build_agent_optimizer()
  params = agent.init_policy(1)
  state = agent.init_optimizer_state(optimizer, params, train_gnn=False)
  assert len(state["accumulator"]) == len(params.actor)

  def search(fine_tune):
    return agent.salient_search(
      params,
      optimizer,
      state,
      g,
      lambda r: 100.0 * tf.reduce_mean(r),
      episodes=3,
      ppo_epochs=2,
      fine_tune=tf.constant(fine_tune),
      seed=tf.constant([1, 2]),
      budget=0.6,
      min_ratio=0.1,
    )

  tuned = search(True)
  for part in ("gnn", "critic"):
    for old, new in zip(getattr(params, part), getattr(tuned.params, part)):
      np.testing.assert_array_equal(new, old)
  assert all(
    not np.array_equal(new, old)
    for old, new in zip(params.actor, tuned.params.actor)
  )
  assert int(tuned.optimizer_state["step"]) == 2
  kept = search(False)
  for old, new in zip(
    tf.nest.flatten(params) + tf.nest.flatten(state),
    tf.nest.flatten(kept.params) + tf.nest.flatten(kept.optimizer_state),
  ):
    np.testing.assert_array_equal(new, old)
  # Pre-training (train_gnn=True) moves every part.
  full_state = agent.init_optimizer_state(optimizer, params, train_gnn=True)
  updated, _, _ = agent.ppo_update(
    params,
    optimizer,
    full_state,
    agent.graph_tensors(g),
    np.array([[0.2, 0.4], [0.6, 0.8]], np.float32),
    np.array([-1.0, -1.2], np.float32),
    np.array([10.0, 30.0], np.float32),
    epochs=1,
    train_gnn=True,
  )
  for part in agent.PolicyParams._fields:
    assert not np.array_equal(
      getattr(updated, part)[0], getattr(params, part)[0]
    )


def test_salient_search_episodes_by_hand(tiny_graph):
  g = tiny_graph
  params = _known_policy(0.25, 3.0)
  optimizer = agent.build_agent_optimizer()
  state = agent.init_optimizer_state(optimizer, params, train_gnn=False)
  seen = []

  def reward_fn(ratios):  # Eager: the loop runs in Python.
    seen.append(ratios.numpy())
    return -100.0 * tf.abs(ratios[0] - 0.5)

  seed = tf.constant([4, 5])
  result = agent.salient_search(
    params,
    optimizer,
    state,
    g,
    reward_fn,
    episodes=4,
    ppo_epochs=1,
    fine_tune=tf.constant(False),
    seed=seed,
    budget=0.5,
    min_ratio=0.1,
  )
  noise = tf.random.stateless_normal([4, 2], seed=seed).numpy()
  noise[0] = 0.0  # Episode 0: the mean itself.
  counts = np.array([112.0, 148.0])
  expected = []
  for e in range(4):
    r = np.clip(np.clip(0.25 + 0.5 * noise[e], 0, 1), 0.1, 1)
    kept, total = np.sum(r * counts), counts.sum()
    if kept > 0.5 * total:  # Toward the floor.
      s = (0.5 * total - 0.1 * total) / (kept - 0.1 * total)
      r = 0.1 + (r - 0.1) * s
    elif kept < 0.5 * total:  # Toward 1.
      s = (total - 0.5 * total) / (total - kept)
      r = 1 - (1 - r) * s
    expected.append(r)
  np.testing.assert_allclose(seen, expected, rtol=1e-5, atol=1e-6)
  # Episode 0, the mean 0.25 everywhere: kept 65 of 260, raised to 130 by
  # s = 130 / 195, 1 - 0.75 s = 0.5.
  np.testing.assert_allclose(seen[0], [0.5, 0.5], rtol=1e-6)
  rewards = [-100.0 * abs(r[0] - 0.5) for r in expected]
  best = int(np.argmax(rewards))
  np.testing.assert_allclose(result.ratios, expected[best], rtol=1e-5)
  np.testing.assert_allclose(float(result.reward), rewards[best], rtol=1e-4)
  np.testing.assert_allclose(
    float(result.mean_reward), np.mean(rewards), rtol=1e-4
  )


def test_salient_search_in_a_tff_computation(tff_context, tiny_graph):
  del tff_context
  g = tiny_graph
  params = agent.init_policy(2)
  optimizer = agent.build_agent_optimizer()
  state = agent.init_optimizer_state(optimizer, params, train_gnn=False)
  actor_type = [tff.TensorType(np.float32, np.shape(a)) for a in params.actor]

  @tf.function
  def run(values, actor, fine_tune):
    def reward_fn(ratios):
      total, count = tf.constant(0.0), tf.constant(0.0)
      for value in iter(values):
        total += value
        count += 1.0
      return total / count * tf.reduce_mean(ratios)

    result = agent.salient_search(
      agent.PolicyParams(params.gnn, list(actor), params.critic),
      optimizer,
      state,
      g,
      reward_fn,
      episodes=3,
      ppo_epochs=2,
      fine_tune=fine_tune,
      seed=tf.constant([3, 4], tf.int64),
      budget=0.5,
      min_ratio=0.2,
    )
    return result.ratios, result.reward, result.mean_reward, result.params.actor

  @tff.tensorflow.computation(
    tff.SequenceType(np.float32), actor_type, np.bool_
  )
  def search(values, actor, fine_tune):
    return run(values, actor, fine_tune)

  values = tf.data.Dataset.from_tensor_slices(
    np.array([2.0, 4.0, 9.0], np.float32)
  )
  ratios, reward, mean_reward, actor = search(values, params.actor, True)
  ratios = np.asarray(ratios)
  # Reward of the returned ratios: mean(2, 4, 9) = 5 times their mean.
  np.testing.assert_allclose(float(reward), 5.0 * ratios.mean(), rtol=1e-5)
  assert float(reward) >= float(mean_reward)
  assert np.all(ratios >= 0.2 - 1e-6) and np.all(ratios <= 1.0)
  assert np.sum(ratios * [112, 148]) <= 0.5 * 260 * (1 + 1e-5)
  assert not np.array_equal(actor[0], params.actor[0])
  _, _, _, actor = search(values, params.actor, False)
  for old, new in zip(params.actor, actor):
    np.testing.assert_array_equal(new, old)
