"""Width-heterogeneous rounds against TFF itself and against hand computations.

A toy width-capable CNN (conv 3x3 -> conv 3x3 -> flatten -> dense -> logits,
three width units) exercises every slicing case, the flatten->dense view
included (AdaptiveFL's pools keep the first unit whole, I >= 1):

* with one level, AdaptiveFL, HeteroFL and All-Large rounds equal TFF's
  `build_weighted_fed_avg` (the issue's correctness check);
* a round mixing three levels equals an oracle built from TFF: each client
  trained alone by `build_weighted_fed_avg` on its level's model from the
  slice of the global model it trains, then AdaptiveFL's Algorithm 2 in NumPy;
* the traffic each client is charged is the size of its sub-models;
* static batch norm sets each BN layer's statistics to the example-weighted
  average of batch moments, by hand.
"""

import collections
import functools

import attrs
from conftest import checkpoint_round_trip
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import devices
from tff_hetero.algorithms import adaptivefl
from tff_hetero.algorithms import all_large
from tff_hetero.algorithms import api
from tff_hetero.algorithms import decoupled
from tff_hetero.algorithms import heterofl
from tff_hetero.algorithms import static_batch_norm
from tff_hetero.algorithms import task_devices
from tff_hetero.algorithms import width_rounds
from tff_hetero.algorithms.width_computations import WidthComputations
from tff_hetero.algorithms.width_process import count_examples
from tff_hetero.devices import Capacity
from tff_hetero.errors import UsageError
from tff_hetero.models.width import WidthUnit
from tff_hetero.program import evolve_config
from tff_hetero.program import make_config
from tff_hetero.program.sampling import CohortSampler
from tff_hetero.submodels import pools

_LR = 0.1
_SHAPE = (5, 5, 1)
_FULL = (3, 4, 6)
_UNITS = (
  WidthUnit(1, "conv1", 3, ("conv1",)),
  WidthUnit(2, "conv2", 4, ("conv2",)),
  WidthUnit(3, "fc1", 6, ("fc1",)),
)
_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, *_SHAPE], tf.float32),
  y=tf.TensorSpec([None], tf.int32),
)


def _toy(widths=_FULL):
  inputs = tf.keras.Input(_SHAPE)
  x = tf.keras.layers.Conv2D(
    widths[0],
    3,
    activation="relu",
    name="conv1",
    kernel_initializer=tf.keras.initializers.GlorotUniform(1),
    bias_initializer=tf.keras.initializers.RandomNormal(seed=2),
  )(inputs)
  x = tf.keras.layers.Conv2D(
    widths[1],
    3,
    activation="relu",
    padding="same",
    name="conv2",
    kernel_initializer=tf.keras.initializers.GlorotUniform(6),
    bias_initializer=tf.keras.initializers.RandomNormal(seed=7),
  )(x)
  x = tf.keras.layers.Flatten()(x)
  x = tf.keras.layers.Dense(
    widths[2],
    activation="relu",
    name="fc1",
    kernel_initializer=tf.keras.initializers.GlorotUniform(3),
    bias_initializer=tf.keras.initializers.RandomNormal(seed=4),
  )(x)
  logits = tf.keras.layers.Dense(
    3, name="logits", kernel_initializer=tf.keras.initializers.GlorotUniform(5)
  )(x)
  return tf.keras.Model(inputs, logits)


_TASK = api.Task(
  "toy",
  _toy,
  _SHAPE,
  3,
  _SPEC,
  training_flops_per_example=1,
  width_model_fn=lambda w: _toy(tuple(w)),
  width_units=_UNITS,
)


def _dataset(seed, n):
  rng = np.random.default_rng(seed)
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=rng.normal(size=[n, *_SHAPE]).astype(np.float32),
      y=rng.integers(0, 3, size=[n]).astype(np.int32),
    )
  ).batch(3)


_SIZES = (7, 4, 5)


def _clients(
  assignments=(0, 0, 0), capacities=(None, None, None), tiers=("strong",) * 3
):
  return [
    api.ClientRound(
      client_id=f"c{i}",
      dataset=_dataset(i, n),
      num_examples=n,
      capacity=None if c is None else Capacity(c, None),
      tier=t,
      assignment=a,
    )
    for i, (n, a, c, t) in enumerate(
      zip(_SIZES, assignments, capacities, tiers)
    )
  ]


def _tff_fedavg(keras_fn, initial_trainable, datasets):
  """One round of TFF's own FedAvg from `initial_trainable`."""
  process = tff.learning.algorithms.build_weighted_fed_avg(
    _TASK.tff_model_fn(keras_fn, plain_graph_methods=False),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
  )
  state = process.initialize()
  weights = process.get_model_weights(state)
  state = process.set_model_weights(
    state,
    tff.learning.models.ModelWeights(
      trainable=[np.asarray(w) for w in initial_trainable],
      non_trainable=list(weights.non_trainable),
    ),
  )
  state = process.next(state, datasets).state
  return [np.asarray(w) for w in process.get_model_weights(state).trainable]


def _assert_close(actual, expected, atol=1e-5):
  assert len(actual) == len(expected)
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, rtol=0, atol=atol)


_FULL_ONLY = pools.SubModelPool(
  _UNITS, (pools.PoolMember(0, "L1", "L", 1.0, len(_UNITS), _FULL),)
)


@pytest.fixture(scope="module")
def reference_round(tff_context):
  del tff_context
  initial = _toy().get_weights()
  trainable = [initial[i] for i in range(len(initial))]
  return trainable, _tff_fedavg(
    _toy, trainable, [c.dataset for c in _clients()]
  )


def test_adaptivefl_with_full_pool_equals_tff_fedavg(reference_round):
  initial, expected = reference_round
  algorithm = adaptivefl.AdaptiveFL(
    _TASK, _FULL_ONLY, ["c0", "c1", "c2"], client_lr=_LR
  )
  state = algorithm.initialize()
  _assert_close(state.model.trainable, initial, atol=0)
  output = algorithm.next(state, 1, _clients())
  _assert_close(output.state.model.trainable, expected)
  assert output.metrics["waste_rate"] == 0.0


def test_heterofl_with_full_rates_equals_tff_fedavg(reference_round):
  _, expected = reference_round
  algorithm = heterofl.HeteroFL(_TASK, {"strong": 1.0}, client_lr=_LR)
  output = algorithm.next(algorithm.initialize(), 1, _clients())
  _assert_close(output.state.model.trainable, expected)


def test_all_large_equals_tff_fedavg(reference_round):
  _, expected = reference_round
  algorithm = _all_large()
  output = algorithm.next(algorithm.initialize(), 1, _clients())
  _assert_close(output.state.model.trainable, expected)


# AdaptiveFL's pool over the toy: conv1 whole (I = 1), conv2 and fc1
# narrowed, so the dense layer reading the flattened conv2 is sliced through
# its view.
_POOL = pools.adaptivefl_pool(_UNITS, 0.5, 0.25, (1,))
# Every client id the tests use: c0..c7 and b (`_nan_client`).
_IDS = ["b"] + [f"c{i}" for i in range(8)]


# The algorithms several tests run, built once: their state is explicit
# and each caches the computations it traces (per level pair), which is
# most of a round's cost here.
@functools.cache
def _adaptivefl():
  return adaptivefl.AdaptiveFL(_TASK, _POOL, _IDS, client_lr=_LR)


@functools.cache
def _decoupled():
  return decoupled.Decoupled(_TASK, _POOL, client_lr=_LR)


@functools.cache
def _all_large():
  return all_large.AllLarge(_TASK, client_lr=_LR)


def _resource_of(algorithm, state, client_id):
  """The resource table's column of `client_id` (one row per member)."""
  return state.tables.resource[:, algorithm.client_ids.index(client_id)]


def test_pool_of_the_toy():
  assert [(m.level, m.widths) for m in _POOL.members] == [
    ("S1", (3, 1, 1)),
    ("M1", (3, 2, 3)),
    ("L1", (3, 4, 6)),
  ]
  # conv1 3*3*1*3+3 = 30; conv2 9*3*c+c; flatten 3*3*c; fc1 9c*f+f; 3f+3.
  algorithm = _adaptivefl()
  assert algorithm.params == (
    30 + 28 + 10 + 6,
    30 + 56 + 57 + 12,
    30 + 112 + 222 + 21,
  )


@pytest.mark.slow
def test_mixed_round_equals_per_client_oracle(tff_context, monkeypatch):
  del tff_context
  algorithm = _adaptivefl()
  catalog = algorithm.catalog
  params = [level.params for level in catalog.levels]
  state = algorithm.initialize()
  # c0: sent L1, keeps it; c1: sent L1 but holds only M1 -> prunes to M1;
  # c2: sent M1, holds only S1 -> prunes to S1.
  clients = _clients(
    assignments=(2, 2, 1), capacities=(None, params[1], params[0])
  )
  # Every group's call holds the cohort's 3 clients (the worker compiles a
  # computation per CLIENTS cardinality), padded with clients of no data.
  calls = []
  group_round = WidthComputations.group_round

  def counted(self, sent, trained):
    computation = group_round(self, sent, trained)

    def call(sent_slice, datasets):
      calls.append([count_examples(d) for d in datasets])
      return computation(sent_slice, datasets)

    return call

  monkeypatch.setattr(WidthComputations, "group_round", counted)
  output = algorithm.next(state, 1, clients)
  assert sorted(calls) == sorted([[n, 0, 0] for n in _SIZES])
  trained_levels = (2, 1, 0)

  full = catalog.outer
  global_trainable = [np.asarray(w) for w in state.model.trainable]
  weighted = [np.zeros_like(w) for w in global_trainable]
  counts = [np.zeros_like(w) for w in global_trainable]
  for client, level_index in zip(clients, trained_levels):
    level = catalog.levels[level_index]
    level_map = catalog.map(full, level)
    start = [np.asarray(w) for w in level_map.extract(global_trainable)]
    trained = _tff_fedavg(level.keras_fn, start, [client.dataset])
    scattered = level_map.scatter(trained)
    for i, (values, mask) in enumerate(zip(scattered, level_map.coverage())):
      weighted[i] += client.num_examples * np.asarray(values)
      counts[i] += client.num_examples * mask
  expected = [
    np.where(c > 0, w / np.maximum(c, 1e-12), g)
    for w, c, g in zip(weighted, counts, global_trainable)
  ]
  _assert_close(output.state.model.trainable, expected)
  # Elements only the full model has (fc1 units 3..5 of c0) were trained by
  # c0 alone; nothing is left untrained in this round.
  assert output.metrics["pruned"] == 2.0
  assert output.metrics["failed"] == 0.0

  # Traffic: what each client received and returned, 4 bytes per float.
  by_id = {t.client_id: t for t in output.traffic}
  sent_levels = (2, 2, 1)
  for client, sent, trained in zip(clients, sent_levels, trained_levels):
    traffic = by_id[client.client_id]
    assert traffic.bytes_down == 4 * params[sent]
    metric_bytes = traffic.bytes_up - 4 * params[trained] - 4
    assert metric_bytes == by_id["c0"].bytes_up - 4 * params[2] - 4 > 0
    assert traffic.examples == client.num_examples
    assert traffic.flops == (
      client.num_examples * catalog.levels[trained].training_flops_per_example
    )
  sent_total = sum(params[s] for s in sent_levels)
  returned_total = sum(params[t] for t in trained_levels)
  assert output.metrics["waste_rate"] == pytest.approx(
    1 - returned_total / sent_total
  )
  # The tables learnt c1's and c2's limits.
  np.testing.assert_array_equal(
    _resource_of(algorithm, output.state, "c1"), [1, 2, 0]
  )


def test_elements_nobody_trained_keep_their_values(tff_context):
  del tff_context
  algorithm = _adaptivefl()
  state = algorithm.initialize()
  output = algorithm.next(state, 1, _clients(assignments=(1, 0, 1)))
  catalog = algorithm.catalog
  covered = catalog.map(catalog.outer, catalog.by_name("M1")).coverage()
  for before, after, mask in zip(
    state.model.trainable, output.state.model.trainable, covered
  ):
    np.testing.assert_array_equal(after[mask == 0], before[mask == 0])
    assert np.any(after[mask == 1] != before[mask == 1])


@pytest.mark.slow
def test_adaptivefl_state_survives_a_checkpoint(tff_context, tmp_path):
  del tff_context
  algorithm = _adaptivefl()
  params = algorithm.params
  state = algorithm.next(
    algorithm.initialize(),
    1,
    _clients(assignments=(2, 2, 1), capacities=(None, params[1], params[0])),
  ).state
  restored = checkpoint_round_trip(
    tmp_path, state, algorithm.initialize()
  ).server_state
  assert isinstance(restored, adaptivefl.AdaptiveFLState)
  for name in ("curiosity", "resource"):
    table = getattr(restored.tables, name)
    assert table.dtype == np.int64
    np.testing.assert_array_equal(table, getattr(state.tables, name))
  assert not np.array_equal(
    state.tables.resource, algorithm.initialize().tables.resource
  )
  _assert_close(restored.model.trainable, state.model.trainable, atol=0)


def test_client_that_holds_nothing_downloads_only(tff_context):
  del tff_context
  algorithm = _adaptivefl()
  state = algorithm.initialize()
  clients = _clients(assignments=(2, 0, 1), capacities=(None, None, 1))
  output = algorithm.next(state, 1, clients)
  c2 = [t for t in output.traffic if t.client_id == "c2"][0]
  assert c2.bytes_up == 0 and c2.examples == 0 and c2.flops == 0
  assert c2.bytes_down == 4 * algorithm.catalog.levels[1].params
  assert output.metrics["failed"] == 1.0


def test_round_where_nobody_can_train(tff_context):
  del tff_context
  algorithm = _adaptivefl()
  state = algorithm.initialize()
  output = algorithm.next(
    state, 1, _clients(assignments=(2, 1, 0), capacities=(1, 1, 1))
  )
  assert output.metrics["failed"] == 3.0
  assert all(t.examples == 0 and t.bytes_up == 0 for t in output.traffic)
  assert sum(t.bytes_down for t in output.traffic) == 4 * sum(
    algorithm.params
  )  # L1, M1 and S1 were sent.
  _assert_close(output.state.model.trainable, state.model.trainable, atol=0)


@pytest.mark.slow
def test_decoupled_trains_every_model_a_device_holds(tff_context):
  del tff_context
  algorithm = _decoupled()
  state = algorithm.initialize()
  params = [r.catalog.outer.params for r in algorithm.runners]  # L1, M1, S1
  # No plan (assignment None): each client trains every model it holds.
  clients = _clients(
    assignments=(None,) * 3, capacities=(params[1], params[2], params[2] - 1)
  )
  output = algorithm.next(state, 1, clients)
  # c0 holds M1, so it trains M1 and S1; c1 trains S1; c2 holds nothing and
  # takes no part. L1 is untouched.
  _assert_close(
    output.state.models[0].trainable, state.models[0].trainable, atol=0
  )
  for i, members in ((1, [clients[0]]), (2, clients[:2])):
    expected = _tff_fedavg(
      algorithm.runners[i].catalog.outer.keras_fn,
      state.models[i].trainable,
      [c.dataset for c in members],
    )
    _assert_close(output.state.models[i].trainable, expected)
  assert output.metrics["M1_clients"] == 1.0
  assert output.metrics["S1_clients"] == 2.0
  # One traffic entry per client: c0's is the sum of its two models.
  by_id = {t.client_id: t for t in output.traffic}
  assert sorted(by_id) == ["c0", "c1"]
  assert by_id["c0"].bytes_down == 4 * (params[1] + params[2])
  assert by_id["c1"].bytes_down == 4 * params[2]
  assert by_id["c0"].examples == 2 * clients[0].num_examples


def test_heterofl_device_below_its_tier_trains_a_fallback_rate_not_idles():
  algorithm = heterofl.HeteroFL(
    _TASK, {"weak": 0.5, "strong": 1.0}, client_lr=_LR
  )
  half = heterofl.sub_model_params(_TASK, 0.5)
  # Capacity one parameter short of the weak tier's sub-model: the largest
  # fallback rate k x 0.05 below 0.5 whose sub-model fits.
  fitting = [
    r
    for r in (0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05)
    if heterofl.sub_model_params(_TASK, r) <= half - 1
  ]
  client = api.ClientRound(
    client_id="c0",
    dataset=None,
    num_examples=1,
    capacity=Capacity(half - 1, None),
    tier="weak",
  )
  level = algorithm.level_of(client)
  assert level is not None and level.params == heterofl.sub_model_params(
    _TASK, fitting[0]
  )
  assert level.params < half
  # Below the 0.05 sub-model: nothing fits, the device idles.
  tiny = heterofl.sub_model_params(_TASK, 0.05)
  assert (
    algorithm.level_of(attrs.evolve(client, capacity=Capacity(tiny - 1, None)))
    is None
  )
  # Only the tiers' rates and the full model are evaluated.
  names = [lv.name for lv in algorithm._evaluated]  # pylint: disable=protected-access
  assert names == ["x0.5", "x1"]


def test_decoupled_draws_a_cohort_per_model_among_clients_that_hold_it():
  algorithm = decoupled.Decoupled(_TASK, _POOL, client_lr=_LR)
  with pytest.raises(RuntimeError, match="attach"):
    algorithm.plan_round(None, 1, ["c0"], 1, CohortSampler(0))
  # S1 74, M1 155, L1 385 parameters; constant capacities: two devices hold
  # only S1, two hold M1 and S1, two hold all three.
  ids = [f"c{i}" for i in range(6)]
  tiers = (
    devices.TierSpec("weak", 1, capacity_params=100),
    devices.TierSpec("medium", 1, capacity_params=200),
    devices.TierSpec("strong", 1, capacity_params=400),
  )
  population = devices.assign_tiers(ids, tiers, seed=0)
  algorithm.attach(population, {})
  by_tier = {t.name: set(population.clients_in_tier(t.name)) for t in tiers}
  plan = algorithm.plan_round(None, 1, ids, 3, CohortSampler(5))
  drawn = collections.defaultdict(list)
  for a in plan:
    drawn[a.payload].append(a.client_id)
  # L1 (0): both strong devices (only two can hold it); M1 (1): 3 of the 4
  # medium or strong; S1 (2): 3 of all 6.
  assert set(drawn[0]) == by_tier["strong"]
  assert len(drawn[1]) == 3 and set(drawn[1]) <= (
    by_tier["medium"] | by_tier["strong"]
  )
  assert len(drawn[2]) == len(set(drawn[2])) == 3
  # A drawn client trains the model it was drawn for, and only that.
  strong = sorted(by_tier["strong"])[0]
  client = api.ClientRound(
    client_id=strong,
    dataset=None,
    num_examples=1,
    capacity=Capacity(400, None),
    assignment=1,
  )
  assert algorithm.levels_for(client) == [1]
  assert algorithm.levels_for(attrs.evolve(client, assignment=None)) == [
    0,
    1,
    2,
  ]
  assert (
    algorithm.levels_for(attrs.evolve(client, capacity=Capacity(100, None)))
    == []
  )


def test_group_round_signature():
  # AdaptiveFL's rounds: `HeterogeneousRounds` over the pool's levels.
  rounds = _adaptivefl().rounds
  catalog = rounds.catalog
  assert [(lv.name, lv.widths) for lv in catalog.levels] == [
    (m.level, m.widths) for m in _POOL.members
  ]
  sent, trained = catalog.levels[1], catalog.levels[0]
  computation = rounds.computations.group_round(sent, trained)
  signature = computation.type_signature

  # Only the sent level goes in (not the server model's); the sums come
  # back at the trained level's shapes with one scalar weight sum.
  def shapes(level):
    return [w.shape for w in catalog.initial_weights(level).trainable]

  sent_shapes, trained_shapes = shapes(sent), shapes(trained)
  assert sent_shapes not in (trained_shapes, shapes(catalog.outer))
  assert signature.parameter[0].placement == tff.SERVER
  assert [t.shape for t in signature.parameter[0].member] == sent_shapes
  assert signature.parameter[1].placement == tff.CLIENTS
  weighted_sum, weight_sum = signature.result[0].member
  assert signature.result[0].placement == tff.SERVER
  assert [t.shape for t in weighted_sum] == trained_shapes
  assert weight_sum == tff.TensorType(np.float32)
  measurements = str(signature.result[1].member)
  assert "bytes_down=int64" in measurements
  assert "returned_model_bytes=int64" in measurements


# -- static batch norm --------------------------------------------------------


def _bn_model():
  inputs = tf.keras.Input((2,))
  x = tf.keras.layers.Dense(
    2, use_bias=False, name="fc1", kernel_initializer="identity"
  )(inputs)
  x = tf.keras.layers.BatchNormalization(name="bn1")(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(3, name="logits")(x))


def test_static_batch_norm_statistics_by_hand(tff_context):
  del tff_context
  spec = collections.OrderedDict(
    x=tf.TensorSpec([None, 2], tf.float32), y=tf.TensorSpec([None], tf.int32)
  )
  query = static_batch_norm.build_statistics_query(_bn_model, spec)
  model = _bn_model()
  weights = tff.learning.models.ModelWeights.from_model(model)
  weights = tf.nest.map_structure(lambda v: v.numpy(), weights)

  def data(rows):
    return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(
        x=np.asarray(rows, np.float32), y=np.zeros([len(rows)], np.int32)
      )
    ).batch(2)

  # Client A: one batch {(1,2), (3,4)}: mean (2,3), unbiased variance (2,2).
  # Client B: one batch {(5,6)}: mean (5,6), variance 0 (one element).
  result = query(weights, [data([[1, 2], [3, 4]]), data([[5, 6]])])
  positions = {id(v): i for i, v in enumerate(model.non_trainable_weights)}
  bn = model.get_layer("bn1")
  np.testing.assert_allclose(
    result.non_trainable[positions[id(bn.moving_mean)]], [3, 4], atol=1e-6
  )
  np.testing.assert_allclose(
    result.non_trainable[positions[id(bn.moving_variance)]],
    [4 / 3, 4 / 3],
    atol=1e-6,
  )
  _assert_close(result.trainable, weights.trainable, atol=0)


def _two_bn_model(widths=(3, 2)):
  inputs = tf.keras.Input((2,))
  x = tf.keras.layers.Dense(
    widths[0],
    name="fc1",
    kernel_initializer=tf.keras.initializers.GlorotUniform(7),
  )(inputs)
  x = tf.keras.layers.BatchNormalization(name="bn1", epsilon=1e-3)(x)
  x = tf.keras.layers.ReLU()(x)
  x = tf.keras.layers.Dense(
    widths[1],
    name="fc2",
    kernel_initializer=tf.keras.initializers.GlorotUniform(8),
  )(x)
  x = tf.keras.layers.BatchNormalization(name="bn2", epsilon=1e-3)(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(3, name="logits")(x))


def test_evaluated_sub_model_gets_statistics_of_its_own_activations(
  tff_context,
):
  """Two BN layers: the second sees the first normalised by batch moments."""
  del tff_context
  spec = collections.OrderedDict(
    x=tf.TensorSpec([None, 2], tf.float32), y=tf.TensorSpec([None], tf.int32)
  )
  units = (WidthUnit(1, "fc1", 3, ("fc1",)), WidthUnit(2, "fc2", 2, ("fc2",)))
  task = api.Task(
    "bn",
    _two_bn_model,
    (2,),
    3,
    spec,
    1,
    width_model_fn=lambda w: _two_bn_model(tuple(w)),
    width_units=units,
  )
  catalog = width_rounds.LevelCatalog(task, [("S", (2, 1)), ("L", (3, 2))])
  rounds = width_rounds.HeterogeneousRounds(catalog, client_lr=_LR)
  weights = catalog.initial_weights(catalog.outer)
  rng = np.random.default_rng(3)
  batches = [
    [rng.normal(size=(4, 2)).astype(np.float32)],
    [
      rng.normal(size=(3, 2)).astype(np.float32),
      rng.normal(size=(2, 2)).astype(np.float32),
    ],
  ]

  class Data(api.EvaluationData):
    def client_datasets(self):
      return [
        tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(
            x=np.concatenate(b), y=np.zeros([sum(len(x) for x in b)], np.int32)
          )
        ).batch(len(b[0]))
        for b in batches
      ]

  small = catalog.by_name("S")
  model = rounds.evaluation_model(weights, small, Data())
  sliced = catalog.map(catalog.outer, small).extract(weights)
  w1, b1, g1, be1, w2, b2 = [np.asarray(w) for w in sliced.trainable[:6]]
  mean_sums, var_sums = [np.zeros(2), np.zeros(1)], [np.zeros(2), np.zeros(1)]
  count = 0
  for client in batches:
    for x in client:  # The batches each client's dataset yields.
      h1 = x @ w1 + b1
      m1, v1 = h1.mean(0), h1.var(0)
      y1 = np.maximum(g1 * (h1 - m1) / np.sqrt(v1 + 1e-3) + be1, 0)
      h2 = y1 @ w2 + b2
      n = len(x)
      for i, h in enumerate((h1, h2)):
        mean_sums[i] += n * h.mean(0)
        var_sums[i] += n * (h.var(0, ddof=1) if n > 1 else 0 * h.var(0))
      count += n
  probe = small.keras_fn()
  positions = {id(v): i for i, v in enumerate(probe.non_trainable_weights)}
  for i, name in enumerate(("bn1", "bn2")):
    layer = probe.get_layer(name)
    np.testing.assert_allclose(
      model.weights.non_trainable[positions[id(layer.moving_mean)]],
      mean_sums[i] / count,
      atol=1e-5,
    )
    np.testing.assert_allclose(
      model.weights.non_trainable[positions[id(layer.moving_variance)]],
      var_sums[i] / count,
      atol=1e-5,
    )
  assert model.model_fn is small.keras_fn


def test_no_query_without_batch_norm():
  assert static_batch_norm.build_statistics_query(_toy, _SPEC) is None


def test_capacities_belong_to_the_population_and_heterofl_rates_fit_them():
  ids = [f"c{i}" for i in range(10)]
  full = 385  # test_pool_of_the_toy
  # weak,medium,strong 4:3:3, 0.25:0.5:1.
  config = make_config(algorithm="heterofl")
  population = task_devices.build_population(config, ids, _TASK)
  # floor(f x 385 + 0.5): 96.25 -> 96, 192.5 -> 193.
  assert [t.capacity_params for t in population.tiers] == [96, 193, full]
  # Parameter counts as given; HeteroFL's rates are the largest k/100 whose
  # uniform (ceil) sub-model fits, by hand (conv1 10c1, conv2 9c1c2+c2,
  # fc1 9c2f+f, logits 3f+3):
  #   rate 0.5 -> (2, 2, 3): 20 + 38 + 57 + 12 = 127 <= 130;
  #   rate 0.51 -> (2, 3, 4): 20 + 57 + 112 + 15 = 204 > 130;
  #   rate 0.75 -> (3, 3, 5): 30 + 84 + 140 + 18 = 272 <= 300;
  #   rate 0.76 -> (3, 4, 5): 30 + 112 + 185 + 18 = 345 > 300.
  given = attrs.evolve(config, tier_capacities="130:300:1")
  assert [
    t.capacity_params for t in task_devices.resolve_tiers(given, _TASK)
  ] == [130, 300, full]
  assert heterofl.tier_rates_from_config(given, _TASK) == {
    "weak": 0.5,
    "medium": 0.75,
    "strong": 1.0,
  }
  assert heterofl.sub_model_params(_TASK, 0.51) == 204
  assert heterofl.sub_model_params(_TASK, 0.76) == 345
  # Given rates are checked against the capacities.
  assert heterofl.tier_rates_from_config(
    evolve_config(given, heterofl_rates="0.25:0.5:1"), _TASK
  ) == {"weak": 0.25, "medium": 0.5, "strong": 1.0}
  with pytest.raises(
    UsageError,
    match=(
      "--heterofl_rates: rate 0.76 of tier medium needs 345 parameters, above"
      " its capacity 300"
    ),
  ):
    heterofl.tier_rates_from_config(
      evolve_config(given, heterofl_rates="0.5:0.76:1"), _TASK
    )
  # A tier that holds nothing trains nothing.
  assert (
    heterofl.tier_rates_from_config(
      attrs.evolve(config, tier_capacities="2:300:1"), _TASK
    )["weak"]
    is None
  )


class _Sealed:
  """A capacity the server must not read: any use but unsealing fails."""

  def __init__(self, capacity):
    object.__setattr__(self, "_capacity", capacity)

  def __getattribute__(self, name):
    if name == "unseal":
      return lambda: object.__getattribute__(self, "_capacity")
    raise AssertionError(f"the server read a capacity ({name})")

  def _fail(self, *args):
    raise AssertionError("the server used a capacity")

  __eq__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __int__ = _fail
  __float__ = __index__ = __iter__ = __len__ = __getitem__ = __hash__ = _fail
  __array__ = _fail


def test_adaptivefl_server_never_reads_a_capacity(tff_context, monkeypatch):
  """Only the device's own reading (`device_budget`) may open a capacity."""
  del tff_context
  device_budget = adaptivefl.device_budget
  monkeypatch.setattr(
    adaptivefl, "device_budget", lambda sealed: device_budget(sealed.unseal())
  )
  with pytest.raises(AssertionError, match="read a capacity"):
    _ = _Sealed(Capacity(1, None)).params
  algorithm = _adaptivefl()
  params = algorithm.params
  state = algorithm.initialize()
  # Planning never sees a capacity at all.
  plan = algorithm.plan_round(state, 1, ["c0", "c1", "c2"], 3, CohortSampler(0))
  assert sorted(a.client_id for a in plan) == ["c0", "c1", "c2"]
  # As in the mixed round: c0 keeps L1, c1 prunes L1 to M1, c2 M1 to S1.
  clients = [
    attrs.evolve(c, capacity=_Sealed(c.capacity))
    for c in _clients(
      assignments=(2, 2, 1), capacities=(None, params[1], params[0])
    )
  ]
  output = algorithm.next(state, 1, clients)
  assert output.metrics["pruned"] == 2.0
  assert output.metrics["failed"] == 0.0
  np.testing.assert_array_equal(
    _resource_of(algorithm, output.state, "c1"), [1, 2, 0]
  )
  by_id = {t.client_id: t for t in output.traffic}
  assert [by_id[f"c{i}"].flops // _SIZES[i] for i in range(3)] == [
    algorithm.catalog.levels[t].training_flops_per_example for t in (2, 1, 0)
  ]


@pytest.mark.slow
def test_four_algorithms_train_within_one_population(tff_context, monkeypatch):
  """One population for all: no device trains more than its capacity.

  Every group a round runs is recorded where the computations are called
  (`HeterogeneousRounds.run`), with the level its clients train. All-Large
  ignores capacities by design: everyone trains L1.
  """
  del tff_context
  ids = [f"c{i}" for i in range(8)]
  # S1 74, M1 155, L1 385 (test_pool_of_the_toy); capacities fluctuate
  # across them from round to round.
  tiers = (
    devices.TierSpec("weak", 2, capacity_params=120, fluctuation=0.5),
    devices.TierSpec("medium", 1, capacity_params=200, fluctuation=0.5),
    devices.TierSpec("strong", 1, capacity_params=390, fluctuation=0.2),
  )
  population = devices.assign_tiers(ids, tiers, seed=3)
  datasets = {c: _dataset(i, 4) for i, c in enumerate(ids)}
  trained = []
  run = width_rounds.HeterogeneousRounds.run

  def recording_run(self, weights, groups, unserved=(), **kwargs):
    for group in groups:
      trained.extend((c.client_id, group.trained.params) for c in group.clients)
    return run(self, weights, groups, unserved, **kwargs)

  monkeypatch.setattr(width_rounds.HeterogeneousRounds, "run", recording_run)
  hetero_rates = {"weak": 0.5, "medium": 0.75, "strong": 1.0}
  algorithms = {
    "adaptivefl": _adaptivefl(),
    "heterofl": heterofl.HeteroFL(_TASK, hetero_rates, client_lr=_LR),
    "decoupled": _decoupled(),
    "all_large": _all_large(),
  }
  seen_capacities = set()
  for name, algorithm in algorithms.items():
    algorithm.attach(population, {c: 4 for c in ids})
    state = algorithm.initialize()
    sampler = CohortSampler(0)
    for round_num in (1, 2):
      trained.clear()
      plan = algorithm.plan_round(state, round_num, ids, 4, sampler)
      capacities = {
        a.client_id: population.capacity_at_round(a.client_id, round_num)
        for a in plan
      }
      clients = [
        api.ClientRound(
          client_id=a.client_id,
          dataset=datasets[a.client_id],
          num_examples=4,
          capacity=capacities[a.client_id],
          tier=population.tier_of(a.client_id),
          assignment=a.payload,
        )
        for a in plan
      ]
      state = algorithm.next(state, round_num, clients).state
      assert trained, name
      for client_id, params in trained:
        if name == "all_large":
          assert params == 385
        else:
          assert params <= capacities[client_id].params, (name, client_id)
      seen_capacities.update(c.params for c in capacities.values())
  # The population did reach below S1 / M1 / L1 in some rounds.
  assert min(seen_capacities) < 155 and max(seen_capacities) > 155


def _nan_client(assignment, capacity=None):
  """Client "b": NaN features, so its update cannot be finite."""
  dataset = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=np.full([10, *_SHAPE], np.nan, np.float32),
      y=np.zeros([10], np.int32),
    )
  ).batch(3)
  return api.ClientRound(
    client_id="b",
    dataset=dataset,
    num_examples=10,
    capacity=None if capacity is None else Capacity(capacity, None),
    tier="strong",
    assignment=assignment,
  )


def test_non_finite_update_is_left_out_of_its_group(tff_context):
  del tff_context
  algorithm = _adaptivefl()
  state = algorithm.initialize()
  clients = _clients(assignments=(1, 0, 1))
  # b trains level 0 beside c1: two groups, b in one.
  with_b = algorithm.next(state, 1, clients + [_nan_client(0)])
  without_b = algorithm.next(state, 1, clients)
  assert with_b.metrics["non_finite_updates"] == 1.0
  assert without_b.metrics["non_finite_updates"] == 0.0
  assert with_b.metrics["loss"] == pytest.approx(
    without_b.metrics["loss"], rel=1e-6
  )
  _assert_close(
    with_b.state.model.trainable, without_b.state.model.trainable, atol=0
  )


def test_decoupled_counts_a_non_finite_update_per_model(tff_context):
  del tff_context
  algorithm = _decoupled()
  state = algorithm.initialize()
  small = algorithm.runners[2].catalog.outer.params
  c1 = _clients(assignments=(None,) * 3, capacities=(None, small, None))[1]
  with_b = algorithm.next(state, 1, [c1, _nan_client(None, small)])
  without_b = algorithm.next(state, 1, [c1])
  assert with_b.metrics["non_finite_updates"] == 1.0
  assert with_b.metrics["loss"] == pytest.approx(
    without_b.metrics["loss"], rel=1e-6
  )
  for a, b in zip(with_b.state.models, without_b.state.models):
    _assert_close(a.trainable, b.trainable, atol=0)
  # b alone for S1: no finite update is left to train it, which the round
  # reports as diverged (NaN loss); the model stays as it was.
  alone = algorithm.next(state, 1, [_nan_client(None, small)])
  assert alone.metrics["non_finite_updates"] == 1.0
  assert np.isnan(alone.metrics["loss"])
  _assert_close(
    alone.state.models[2].trainable, state.models[2].trainable, atol=0
  )
