"""InclusiveFL: type signatures, then known answers.

The oracles are independent of the code under test: local training is
plain eager SGD on the Keras model, the server is Algorithm 1 (Liu et al.,
KDD 2022) written out in NumPy with Adam's textbook update, and the
one-group case is TFF's own FedAvg with a FedAdam server.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import models as models_lib
from tff_hetero.algorithms import api
from tff_hetero.algorithms import inclusivefl
from tff_hetero.algorithms import task_devices
from tff_hetero.errors import UsageError

WIDTH = 4
CLIENT_LR = 0.1
SERVER_LR = 0.05
BETA_1, BETA_2, EPSILON = 0.9, 0.99, 1e-3


def toy_model(depth: int) -> tf.keras.Model:
  """embed (3 -> 4), blocks 1..depth (4 -> 4, one shape), head (4 -> 2);
  block i's initial weights do not depend on `depth`."""
  inputs = tf.keras.Input((3,))
  x = tf.keras.layers.Dense(
    WIDTH,
    activation="tanh",
    name="embed",
    kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
  )(inputs)
  for i in range(1, depth + 1):
    x = tf.keras.layers.Dense(
      WIDTH,
      activation="tanh",
      name=f"block_{i}",
      kernel_initializer=tf.keras.initializers.GlorotUniform(seed=100 + i),
      bias_initializer=tf.keras.initializers.RandomUniform(
        -0.1, 0.1, seed=200 + i
      ),
    )(x)
  logits = tf.keras.layers.Dense(
    2,
    name="head",
    kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2 + depth),
  )(x)
  return tf.keras.Model(inputs, logits)


ELEMENT_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 3], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


def toy_task(depths=(1, 2, 3)) -> api.Task:
  return api.Task(
    model_name="toy",
    model_fn=lambda: toy_model(max(depths)),
    input_shape=(3,),
    num_classes=2,
    element_spec=ELEMENT_SPEC,
    training_flops_per_example=1,
    depth_model_fn=toy_model,
    depths=tuple(depths),
  )


def client_arrays(seed: int, n: int = 5):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 3)).astype(np.float32)
  y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int32)
  return x, y


def client(cid: str, tier: str, seed: int) -> api.ClientRound:
  x, y = client_arrays(seed)
  dataset = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(x=x, y=y)
  ).batch(2)
  return api.ClientRound(cid, dataset, num_examples=len(y), tier=tier)


def adam(learning_rate=SERVER_LR):
  return tff.learning.optimizers.build_adam(
    learning_rate=learning_rate, beta_1=BETA_1, beta_2=BETA_2, epsilon=EPSILON
  )


def build(tier_depths, beta=0.5, share=True, task=None):
  return inclusivefl.InclusiveFL(
    task or toy_task(),
    tier_depths,
    client_optimizer=tff.learning.optimizers.build_sgdm(CLIENT_LR),
    server_optimizer=adam(),
    beta=beta,
    share=share,
  )


# -- oracles -----------------------------------------------------------------


def eager_update(depth, weights, seed):
  """w_received - w_trained after plain SGD over the client's batches."""
  model = toy_model(depth)
  for v, w in zip(model.trainable_weights, weights):
    v.assign(w)
  x, y = client_arrays(seed)
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  for start in range(0, len(y), 2):
    with tf.GradientTape() as tape:
      loss = loss_fn(y[start : start + 2], model(x[start : start + 2]))
    grads = tape.gradient(loss, model.trainable_weights)
    for v, g in zip(model.trainable_weights, grads):
      v.assign_sub(CLIENT_LR * g)
  return [w - v.numpy() for w, v in zip(weights, model.trainable_weights)]


class NumpyAdam:
  """Adam with bias correction folded into the step size."""

  def __init__(self, shapes):
    self.m = [np.zeros(s) for s in shapes]
    self.v = [np.zeros(s) for s in shapes]
    self.t = 0

  def step(self, weights, grads):
    self.t += 1
    lr = SERVER_LR * np.sqrt(1 - BETA_2**self.t) / (1 - BETA_1**self.t)
    out = []
    for i, (w, g) in enumerate(zip(weights, grads)):
      self.m[i] = BETA_1 * self.m[i] + (1 - BETA_1) * g
      self.v[i] = BETA_2 * self.v[i] + (1 - BETA_2) * g * g
      out.append(w - lr * self.m[i] / (np.sqrt(self.v[i]) + EPSILON))
    return out


# Toy layout: [embed kernel, embed bias, block_1 k, b, ..., head k, b].
def block(layer):  # Indices of block `layer` (1-based) in a toy model.
  return [2 * layer, 2 * layer + 1]


def test_one_group_without_distillation_equals_tff_fedavg_with_fedadam(
  tff_context,
):
  del tff_context  # Runs on the session's TFF worker.
  task = toy_task(depths=(2,))
  algorithm = build({"strong": 2}, beta=0.0, task=task)
  state = algorithm.initialize()
  process = tff.learning.algorithms.build_weighted_fed_avg(
    task.tff_model_fn(lambda: toy_model(2), plain_graph_methods=False),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(CLIENT_LR),
    server_optimizer_fn=adam(),
    client_weighting=tff.learning.ClientWeighting.UNIFORM,
  )
  tff_state = process.set_model_weights(
    process.initialize(), algorithm.model_weights(state)
  )
  for round_num, seeds in enumerate([(1, 2, 3), (4, 5, 6)]):
    clients = [client(f"c{s}", "strong", s) for s in seeds]
    state = algorithm.next(state, round_num, clients).state
    tff_state = process.next(tff_state, [c.dataset for c in clients]).state
    for ours, theirs in zip(
      algorithm.model_weights(state).trainable,
      process.get_model_weights(tff_state).trainable,
    ):
      np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("beta, share", [(0.5, True), (1.0, False)])
def test_three_groups_two_rounds_equal_algorithm_1_by_hand(
  beta, share, tff_context
):
  del tff_context  # Runs on the session's TFF worker.
  # Depths 2 / 3 / 5: line 26 averages block 1 over all three groups, line
  # 27 block 2 over the two deeper ones.
  depths = [2, 3, 5]
  tiers = {"weak": 2, "medium": 3, "strong": 5}
  algorithm = build(tiers, beta=beta, share=share, task=toy_task(depths))
  state = algorithm.initialize()
  deepest = [w.numpy() for w in toy_model(5).trainable_weights]
  models = []
  for d in depths:  # Line 2: shared layers from the deepest model.
    own = [w.numpy() for w in toy_model(d).trainable_weights]
    models.append(deepest[: 2 + 2 * d] + own[2 + 2 * d :])
  for j in range(3):
    for ours, expected in zip(state["models"][j], models[j]):
      np.testing.assert_array_equal(ours, expected)
  adams = [NumpyAdam([w.shape for w in m]) for m in models]
  momenta = {
    1: [np.zeros((4, 4)), np.zeros(4)],
    2: [np.zeros((4, 4)), np.zeros(4)],
  }
  # Round 0: every group; round 1: the middle group is absent (it keeps
  # its model and momentum, which the shallowest group then reads).
  rounds = [
    {0: (1, 2), 1: (3,), 2: (4, 5, 6)},
    {0: (7, 8), 2: (9,)},
  ]
  names = ["weak", "medium", "strong"]
  for round_num, cohort in enumerate(rounds):
    clients = [
      client(f"c{s}", names[j], s) for j, seeds in cohort.items() for s in seeds
    ]
    out = algorithm.next(state, round_num, clients)
    state = out.state
    # By hand: lines 14-23, shallowest group first.
    new_momenta = dict(momenta)
    for j in range(3):
      if j not in cohort:
        continue
      g = [
        np.mean(parts, axis=0)
        for parts in zip(
          *[eager_update(depths[j], models[j], s) for s in cohort[j]]
        )
      ]
      if j < 2:  # Line 17.
        for pos, index in enumerate(block(depths[j])):
          g[index] = beta * momenta[j + 1][pos] + (1 - beta) * g[index]
      models[j] = adams[j].step(models[j], g)
      if j > 0:  # Line 22: blocks L^- .. L_j.
        layers = range(depths[j - 1], depths[j] + 1)
        new_momenta[j] = [
          np.mean([g[block(layer)[pos]] for layer in layers], axis=0)
          for pos in range(2)
        ]
    momenta = new_momenta
    # Lines 25-29: layers 1 .. L_a - 1 over all groups (line 26), L_a ..
    # L_b - 1 over the two deeper ones (line 27), and the embedding over
    # all (our reading: it is part of the shared module); weights =
    # clients per group this round.
    n = [len(cohort.get(j, ())) for j in range(3)]
    la, lb = depths[0], depths[1]
    shared = (
      [([0, 1], [0, 1, 2])]
      + [(block(layer), [0, 1, 2]) for layer in range(1, la)]
      + [(block(layer), [1, 2]) for layer in range(la, lb)]
    )
    for indices, holders in shared if share else ():
      total = sum(n[j] for j in holders)
      for index in indices:
        mean = sum(n[j] * models[j][index] for j in holders) / total
        for j in holders:
          models[j][index] = mean
    for j in range(3):
      for ours, expected in zip(state["models"][j], models[j]):
        np.testing.assert_allclose(ours, expected, atol=1e-5)
    for j in (1, 2):
      for ours, expected in zip(state["momenta"][j - 1], momenta[j]):
        np.testing.assert_allclose(ours, expected, atol=1e-6)
    assert out.metrics["clients_L2"] == n[0]
    assert out.metrics["momentum_norm_L5"] == pytest.approx(
      np.sqrt(sum(np.sum(m**2) for m in momenta[2])), rel=1e-5
    )


@pytest.fixture(scope="module")
def local_round(tff_context):
  """The local variant (no distillation, nothing shared) of a depth-1 and
  a depth-3 group, and its round 0 of weak client a and strong client b."""
  del tff_context  # Runs on the session's TFF worker.
  algorithm = build({"weak": 1, "strong": 3}, beta=0.0, share=False)
  out = algorithm.next(
    algorithm.initialize(),
    0,
    [client("a", "weak", 1), client("b", "strong", 2)],
  )
  return algorithm, out


def test_each_client_receives_and_returns_only_its_groups_model(local_round):
  # What travels is each group's model whatever the variant.
  _, out = local_round
  # Parameters by hand: embed 3*4+4, each block 4*4+4, head 4*2+2.
  params = {1: 16 + 20 + 10, 3: 16 + 3 * 20 + 10}
  traffic = {t.client_id: t for t in out.traffic}
  assert traffic["a"].bytes_down == 4 * params[1]
  assert traffic["b"].bytes_down == 4 * params[3]
  # The upload: the update, its weight and the metric sums.
  assert traffic["a"].bytes_up >= 4 * params[1] + 4
  assert traffic["b"].bytes_up - traffic["a"].bytes_up == 4 * 2 * 20


def test_local_variant_shares_nothing_and_exclusive_drops_tiers(local_round):
  _, out = local_round
  weak, strong = out.state["models"]
  assert not np.allclose(weak[0], strong[0])  # Embeddings trained apart.
  exclusive = inclusivefl.VARIANTS["exclusivefl"].assign(
    {"weak": 1, "medium": 2, "strong": 3}
  )
  assert exclusive == {"weak": None, "medium": None, "strong": 3}
  algorithm = build(exclusive)
  out = algorithm.next(
    algorithm.initialize(),
    0,
    [client("a", "weak", 1), client("b", "strong", 2)],
  )
  assert [t.client_id for t in out.traffic] == ["b"]
  assert out.metrics["idle_clients"] == 1.0


def test_type_signatures(local_round):
  algorithm, _ = local_round
  computations = algorithm.computations
  group_round = computations.group_round(0)
  parameter = group_round.type_signature.parameter
  assert parameter[0].placement is tff.SERVER
  assert [t.shape for t in parameter[0].member] == [
    (3, 4),
    (4,),
    (4, 4),
    (4,),
    (4, 2),
    (2,),
  ]
  assert parameter[1].placement is tff.CLIENTS
  result = group_round.type_signature.result
  assert result[0].placement is tff.SERVER
  assert result[0].member.is_equivalent_to(parameter[0].member)
  step = computations.server_step.type_signature
  assert step.result.is_equivalent_to(step.parameter[0])
  assert step.parameter[2].shape == (2,)
  assert [t.shape for t in step.result["momenta"][0]] == [(4, 4), (4,)]


def test_a_depth_group_must_exist():
  with pytest.raises(UsageError, match="--inclusivefl_depths"):
    build({"weak": None})


def test_init_weights_load_every_group_from_one_file(tmp_path):
  source = toy_model(3)
  rng = np.random.default_rng(0)
  for v in source.trainable_weights:
    v.assign(rng.normal(size=v.shape).astype(np.float32))
  path = str(tmp_path / "init.npz")
  models_lib.save_depth_weights(source, path)
  algorithm = inclusivefl.InclusiveFL(
    toy_task(),
    {"weak": 1, "strong": 3},
    client_optimizer=tff.learning.optimizers.build_sgdm(CLIENT_LR),
    server_optimizer=adam(),
    init_weights=path,
  )
  expected = [v.numpy() for v in source.trainable_weights]
  weak, strong = algorithm.initialize()["models"]
  for ours, theirs in zip(strong, expected):
    np.testing.assert_array_equal(ours, theirs)
  # Depth 1: the embedding, block 1 and the head of the file.
  for ours, theirs in zip(weak, expected[:4] + expected[-2:]):
    np.testing.assert_array_equal(ours, theirs)
  with pytest.raises(UsageError, match="--init_weights.*no such file"):
    inclusivefl.InclusiveFL(
      toy_task(),
      {"strong": 3},
      client_optimizer=tff.learning.optimizers.build_sgdm(CLIENT_LR),
      server_optimizer=adam(),
      init_weights=str(tmp_path / "missing.npz"),
    )


def test_baseline_variants_assign_depths_and_keep_dropped_tiers_dropped():
  depths = {"weak": 4, "medium": None, "strong": 12}
  variants = inclusivefl.VARIANTS
  assert variants["inclusivefl_all_large"].assign(depths) == {
    "weak": 12,
    "medium": None,
    "strong": 12,
  }
  assert variants["inclusivefl_all_small"].assign(depths) == {
    "weak": 4,
    "medium": None,
    "strong": 4,
  }
  assert variants["exclusivefl"].assign(depths) == {
    "weak": None,
    "medium": None,
    "strong": 12,
  }


def test_a_model_without_depth_knob_is_a_one_line_error():
  from tff_hetero.program import make_config  # pylint: disable=g-import-not-at-top

  task = api.Task(
    model_name="mnist_cnn",
    model_fn=lambda: toy_model(1),
    input_shape=(3,),
    num_classes=2,
    element_spec=ELEMENT_SPEC,
    training_flops_per_example=1,
  )
  config = make_config(algorithm="inclusivefl", model="mnist_cnn")
  with pytest.raises(
    UsageError,
    match="--model: mnist_cnn has no depth knob; inclusivefl needs a"
    " depth-scalable model: .*transformer",
  ):
    inclusivefl.build_inclusivefl(config, task)


def test_a_non_finite_update_is_left_out_of_its_group(tff_context):
  del tff_context
  algorithm = build({"weak": 1, "medium": 2, "strong": 3})
  state = algorithm.initialize()
  nan = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=np.full([10, 3], np.nan, np.float32), y=np.zeros([10], np.int32)
    )
  ).batch(2)
  b = api.ClientRound("b", nan, num_examples=10, tier="strong")
  others = [
    client("a", "weak", 1),
    client("m", "medium", 2),
    client("s", "strong", 3),
  ]
  with_b = algorithm.next(state, 0, others + [b])
  without_b = algorithm.next(state, 0, others)
  assert with_b.metrics["non_finite_updates"] == 1.0
  assert np.isfinite(with_b.metrics["loss"])
  assert with_b.metrics["loss"] == without_b.metrics["loss"]
  # b sent zeros of weight 0 beside s's update: bit for bit the round
  # without b.
  for x, y in zip(
    tf.nest.flatten(with_b.state), tf.nest.flatten(without_b.state)
  ):
    np.testing.assert_array_equal(x, y)
  # b alone in its group: no finite update is left to train the deepest
  # model, which the round reports as diverged (NaN loss); the group is
  # left as it was, finite (Adam state and momentum).
  alone = algorithm.next(state, 0, others[:2] + [b])
  assert alone.metrics["non_finite_updates"] == 1.0
  assert np.isnan(alone.metrics["loss"])
  for x, y in zip(
    tf.nest.flatten(alone.state["optimizer_states"][2])
    + list(alone.state["momenta"][1]),
    tf.nest.flatten(state["optimizer_states"][2]) + list(state["momenta"][1]),
  ):
    np.testing.assert_array_equal(x, y)


def test_tier_capacities_are_the_depth_models_sizes_each_built_once():
  from tff_hetero.program import make_config  # pylint: disable=g-import-not-at-top

  built = collections.Counter()

  def depth_model_fn(depth):
    built[depth] += 1
    return toy_model(depth)

  def model_fn():
    built["full"] += 1
    return toy_model(3)

  task = api.Task(
    model_name="toy",
    model_fn=model_fn,
    input_shape=(3,),
    num_classes=2,
    element_spec=ELEMENT_SPEC,
    training_flops_per_example=1,
    depth_model_fn=depth_model_fn,
    depths=(1, 2, 3),
  )
  config = make_config(algorithm="inclusivefl", model="transformer")
  depths = inclusivefl.tier_depths_from_config(config, task)
  assert depths == {"weak": 1, "medium": 2, "strong": 3}
  # By hand: embed 3*4+4 = 16, each block 4*4+4 = 20, head 4*2+2 = 10.
  tiers = task_devices.resolve_tiers(config, task)
  assert [t.capacity_params for t in tiers] == [46, 66, 86]
  # The population and the capacity check asked again: nothing rebuilt.
  assert built == {1: 1, 2: 1, 3: 1, "full": 1}
