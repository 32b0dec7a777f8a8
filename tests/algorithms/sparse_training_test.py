"""FedSGC and FedDST: prune-and-grow and aggregation by hand, against TFF's
FedAvg at sparsity 0, and what the computations measure."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.aggregators import MaskedSums
from tff_hetero.algorithms import api
from tff_hetero.algorithms import feddst
from tff_hetero.algorithms import fedsgc
from tff_hetero.algorithms import sparse_training
from tff_hetero.program import ExperimentConfig
from tff_hetero.program import loop

# -- readjustment of one kernel, by hand -----------------------------------
#
# Active weights 0..3, inactive 4..7. Local pseudo-gradient sign(now - recv)
# is (-, -, +, +) on 0..3; the global direction map is (+, +, +, +) there, so
# 0 and 1 move against it. On 4..7 the loss gradients are (.5, -.9, .2, -.1):
# learning directions (-, +, -, +); with the map (+, -, -, +), 6 and 7 agree.
_MASK = np.array([1, 1, 1, 1, 0, 0, 0, 0], np.float32)
_NOW = np.array([0.3, -0.4, 0.1, -0.2, 0, 0, 0, 0], np.float32)
_RECEIVED = np.array([0.4, -0.3, 0.0, -0.3, 0, 0, 0, 0], np.float32)
_GRADIENT = np.array([0, 0, 0, 0, 0.5, -0.9, 0.2, -0.1], np.float32)
_DIRECTION = np.array([1, 1, 1, 1, 1, -1, -1, 1], np.int8)


@pytest.mark.parametrize("congruity_lambda, expected", [
    # k = floor(0.5 x 4) = 2. Magnitude only (FedDST): prune 2 and 3 (|w| .1,
    # .2), grow 5 and 4 (|g| .9, .5).
    (0.0, [1, 1, 0, 0, 1, 1, 0, 0]),
    # lambda = 0.5: one of each guided. Prune 0 (smallest |w| against the
    # map) then 2 (smallest left); grow 6 (largest |g| along the map) then 5.
    (0.5, [0, 1, 0, 1, 0, 1, 1, 0]),
    # lambda = 1: both from the guided sets: prune 0, 1; grow 6, 7.
    (1.0, [0, 0, 1, 1, 0, 0, 1, 1]),
])
def test_readjust_mask_by_hand(congruity_lambda, expected, tff_context):
  del tff_context
  mask = sparse_training.readjust_mask(
      _MASK, _NOW, _RECEIVED, _GRADIENT, _DIRECTION, 0.5, congruity_lambda)
  np.testing.assert_array_equal(mask, expected)
  # The same inside a TFF computation (a graph, where Python operators on
  # tensors may mean something else than in eager code).
  vector = tff.TensorType(np.float32, [8])

  @tff.tensorflow.computation(vector, vector, vector, vector,
                              tff.TensorType(np.int8, [8]))
  def readjust(mask, now, received, gradient, direction):
    return sparse_training.readjust_mask(mask, now, received, gradient,
                                         direction, 0.5, congruity_lambda)

  np.testing.assert_array_equal(
      readjust(_MASK, _NOW, _RECEIVED, _GRADIENT, _DIRECTION), expected)


def test_readjust_keeps_the_number_of_active_weights():
  rng = np.random.default_rng(0)
  mask = (rng.random([6, 5]) < 0.3).astype(np.float32)
  now = rng.normal(size=[6, 5]).astype(np.float32) * mask
  new = sparse_training.readjust_mask(
      mask, now, now * 0.9, rng.normal(size=[6, 5]).astype(np.float32),
      rng.integers(-1, 2, size=[6, 5]).astype(np.int8), 0.3, 0.5)
  assert int(np.sum(new)) == int(np.sum(mask))
  assert set(np.unique(new)) <= {0.0, 1.0}


def test_prune_fraction_schedule():
  assert sparse_training.prune_fraction(1, 0.2, 10) == pytest.approx(0.2)
  assert sparse_training.prune_fraction(6, 0.2, 10) == pytest.approx(0.1)
  assert sparse_training.prune_fraction(11, 0.2, 10) == 0.0


# -- a tiny sparse task ----------------------------------------------------

_SPEC = collections.OrderedDict(x=tf.TensorSpec([None, 6], tf.float32),
                                y=tf.TensorSpec([None], tf.int32))


def _mlp():
  inputs = tf.keras.Input((6,))
  x = tf.keras.layers.Dense(8, activation="relu", name="fc1",
                            kernel_initializer=tf.keras.initializers.GlorotUniform(1))(inputs)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(
      3, name="logits",
      kernel_initializer=tf.keras.initializers.GlorotUniform(2))(x))


_TASK = api.Task("mlp6", _mlp, (6,), 3, _SPEC, training_flops_per_example=3 * 72)
_SIZES = (9, 5, 7)


def _clients(states, seed=0, ids=(0, 1, 2)):
  out = []
  for i in ids:
    rng = np.random.default_rng(seed * 10 + i)
    n = _SIZES[i]
    dataset = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=rng.normal(size=[n, 6]).astype(np.float32),
        y=rng.integers(0, 3, size=[n]).astype(np.int32))).batch(3)
    out.append(api.ClientRound(client_id=f"c{i}", dataset=dataset,
                               num_examples=n, state=states.get(f"c{i}")))
  return out


def _config(**changes):
  settings = dict(sparsity=0.5, readjust_every=1, readjust_end_round=4,
                  prune_alpha=0.3, congruity_lambda=0.5, client_lr=0.1,
                  local_epochs=2, rounds=4, seed=3)
  settings.update(changes)
  return ExperimentConfig(**settings)


def _run(algorithm, rounds, ids_per_round=None):
  state = algorithm.initialize()
  states = collections.defaultdict(algorithm.initial_client_state)
  outputs = []
  for r in range(1, rounds + 1):
    ids = (0, 1, 2) if ids_per_round is None else ids_per_round[r - 1]
    clients = _clients({c: states[c] for c in [f"c{i}" for i in ids]}, r, ids)
    output = algorithm.next(state, r, clients)
    state = output.state
    states.update(output.client_states)
    outputs.append(output)
  return state, outputs


def test_masked_weights_stay_zero_and_masks_keep_their_budget(tff_context):
  del tff_context
  algorithm = fedsgc.build_fedsgc(_config(), _TASK)
  keep = algorithm.keep
  state, outputs = _run(algorithm, 3)
  assert [o.metrics["readjusted"] for o in outputs] == [1.0, 1.0, 1.0]
  for output in outputs:
    for upload in output.client_states.values():
      for kernel, mask in zip(algorithm.layout.kernels, upload.masks):
        values = np.asarray(upload.trainable[kernel.trainable_index])
        assert np.all(values[np.asarray(mask) == 0] == 0)
      # Readjustment moves weights, never their number.
      assert [int(np.sum(m)) for m in upload.masks] == keep
  model = sparse_training.SparseModel(*state.model)
  assert [int(np.sum(m)) for m in model.masks] == keep
  assert outputs[-1].metrics["sparsity"] == pytest.approx(0.5, abs=0.01)


def test_server_masks_move_with_readjustment(tff_context):
  del tff_context
  algorithm = feddst.build_feddst(_config(), _TASK)
  initial = [np.asarray(m) for m in algorithm.initialize().model.masks]
  state, _ = _run(algorithm, 2)
  assert any(not np.array_equal(a, np.asarray(b))
             for a, b in zip(initial, state.model.masks))


def test_sparsity_zero_without_readjustment_equals_tff_fedavg(tff_context):
  del tff_context
  process = tff.learning.algorithms.build_weighted_fed_avg(
      _TASK.tff_model_fn(),
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1))
  fed_state = process.initialize()
  for r in (1, 2, 3):
    data = [c.dataset for c in _clients({}, r)]
    fed_state = process.next(fed_state, data).state
  expected = process.get_model_weights(fed_state).trainable
  for build in (fedsgc.build_fedsgc, feddst.build_feddst):
    algorithm = build(_config(sparsity=0.0, readjust_every=0), _TASK)
    state, _ = _run(algorithm, 3)
    actual = algorithm.model_weights(state).trainable
    for a, e in zip(actual, expected):
      np.testing.assert_allclose(a, e, rtol=0, atol=1e-5)


def test_feddst_is_fedsgc_without_congruity_or_memory(tff_context):
  del tff_context
  ids = [(0, 1, 2), (0, 1), (1, 2)]
  dst, _ = _run(feddst.build_feddst(_config(), _TASK), 3, ids)
  reduced = fedsgc.build_sparse_algorithm("x", _config(), _TASK,
                                          congruity_lambda=0.0,
                                          remember_uploads=False)
  same, _ = _run(reduced, 3, ids)
  guided, _ = _run(fedsgc.build_fedsgc(_config(), _TASK), 3, ids)
  for a, b in zip(dst.model.trainable, same.model.trainable):
    np.testing.assert_array_equal(a, b)
  assert any(not np.allclose(a, b) for a, b in zip(dst.model.trainable,
                                                   guided.model.trainable))


def test_fedsgc_counts_the_last_upload_of_absent_clients(tff_context):
  del tff_context
  algorithm = fedsgc.build_fedsgc(_config(readjust_every=0), _TASK)
  state, outputs = _run(algorithm, 2, [(0, 1, 2), (0,)])
  uploads = dict(outputs[0].client_states)
  uploads.update(outputs[1].client_states)  # c0 anew; c1, c2 from round 1.
  weighted = [np.zeros_like(np.asarray(w)) for w in state.model.trainable]
  counts = [np.zeros_like(w) for w in weighted]
  for upload in uploads.values():
    masks = [np.ones_like(w) for w in weighted]
    for kernel, mask in zip(algorithm.layout.kernels, upload.masks):
      masks[kernel.trainable_index] = np.asarray(mask)
    for i, (w, m) in enumerate(zip(upload.trainable, masks)):
      weighted[i] += float(upload.weight) * np.asarray(w) * m
      counts[i] += float(upload.weight) * m
  average = [np.where(c > 0, w / np.maximum(c, 1e-12), 0)
             for w, c in zip(weighted, counts)]
  for kernel, mask in zip(algorithm.layout.kernels, state.model.masks):
    average[kernel.trainable_index] *= np.asarray(mask)
  for a, e in zip(state.model.trainable, average):
    np.testing.assert_allclose(a, e, atol=1e-6)
  sums = MaskedSums(*state.sums)
  # A dense bias is held by every upload: each client's examples once.
  np.testing.assert_allclose(sums.weight_sum[1], sum(_SIZES) * np.ones(8))


def test_fedsgc_without_upload_memory_averages_this_round_only(tff_context):
  del tff_context
  algorithm = fedsgc.build_fedsgc(
      _config(readjust_every=0, sgc_remember_uploads=False), _TASK)
  assert algorithm.initial_client_state() is None
  cohorts = [(0, 1, 2), (0,)]
  state, outputs = _run(algorithm, 2, cohorts)
  assert not outputs[1].client_states
  # Without readjustment and memory, FedSGC is FedDST: round 2 is c0 alone.
  dst, _ = _run(feddst.build_feddst(_config(readjust_every=0), _TASK), 2,
                cohorts)
  for a, b in zip(state.model.trainable, dst.model.trainable):
    np.testing.assert_array_equal(a, b)


def test_traffic_is_the_sparse_encoding(tff_context):
  del tff_context
  algorithm = fedsgc.build_fedsgc(_config(readjust_every=2), _TASK)
  state, outputs = _run(algorithm, 2)
  layout = algorithm.layout
  kernel_sizes = [k.size for k in layout.kernels]
  dense = 8 + 3  # The two biases.
  model_bytes = (sum(4 * k + (s + 7) // 8 for k, s in zip(algorithm.keep,
                                                          kernel_sizes))
                 + 4 * dense)
  readjust_bytes = sum(kernel_sizes) + 4  # int8 maps and the fraction.
  first, second = outputs
  assert first.metrics["readjusted"] == 1.0
  assert second.metrics["readjusted"] == 0.0
  for output, extra in ((first, readjust_bytes), (second, 0)):
    for traffic, upload in zip(output.traffic,
                               [output.client_states[f"c{i}"] for i in (0, 1, 2)]):
      assert traffic.bytes_down == model_bytes + extra
      kept = [int(np.sum(m)) for m in upload.masks]
      upload_bytes = (sum(4 * k + (s + 7) // 8 for k, s in zip(kept,
                                                               kernel_sizes))
                      + 4 * dense + 4)
      assert traffic.bytes_up - upload_bytes == (
          output.traffic[0].bytes_up - (model_bytes + 4)) > 0  # Metric sums.


def test_flags_reach_the_algorithm():
  experiment = loop.build_experiment(ExperimentConfig(
      algorithm="fedsgc", dataset="synthetic", model="mlp", num_clients=4,
      clients_per_round=2, sparsity=0.9, readjust_every=3, prune_alpha=0.1,
      congruity_lambda=0.25, rounds=10))
  algorithm = experiment.algorithm
  assert algorithm.sparsity == 0.9 and algorithm.readjust_end_round == 5
  assert [algorithm.readjusts(r) for r in range(1, 9)] == [
      True, False, False, True, False, False, False, False]


def _bn_mlp():
  inputs = tf.keras.Input((6,))
  x = tf.keras.layers.Dense(8, name="fc1",
                            kernel_initializer=tf.keras.initializers.GlorotUniform(1))(inputs)
  x = tf.keras.layers.BatchNormalization(name="bn")(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(
      3, name="logits",
      kernel_initializer=tf.keras.initializers.GlorotUniform(2))(x))


def test_batch_norm_statistics_come_from_the_clients_data(tff_context):
  del tff_context
  task = api.Task("bn_mlp6", _bn_mlp, (6,), 3, _SPEC,
                  training_flops_per_example=1)
  algorithm = fedsgc.build_fedsgc(_config(), task)
  state, _ = _run(algorithm, rounds=1)
  weights = algorithm.model_weights(state)
  wrapped = algorithm.keras_fn()
  positions = {id(v): i for i, v in enumerate(wrapped.non_trainable_weights)}
  mean_at = positions[id(wrapped.get_layer("bn").moving_mean)]
  # The server aggregates kernels and biases only.
  np.testing.assert_array_equal(weights.non_trainable[mean_at], np.zeros(8))
  datasets = [c.dataset for c in _clients({})]
  (evaluated,) = algorithm.evaluation_models(
      state, api.ClientDatasets(datasets)).values()
  # By hand: fc1's outputs (masked kernel as the server holds it) over all
  # clients' examples, averaged per channel.
  def fc1(name, variables, values):
    (value,) = [a for v, a in zip(variables, values)
                if "fc1" in v.name and v.name.endswith(f"/{name}:0")]
    return value

  kernel = fc1("kernel", wrapped.trainable_weights, weights.trainable)
  bias = fc1("bias", wrapped.trainable_weights, weights.trainable)
  mask = fc1("mask", wrapped.non_trainable_weights, weights.non_trainable)
  x = np.concatenate([b["x"] for d in datasets for b in d])
  np.testing.assert_allclose(evaluated.weights.non_trainable[mean_at],
                             (x @ (kernel * mask) + bias).mean(axis=0),
                             atol=1e-5)
  assert np.abs(evaluated.weights.non_trainable[mean_at]).max() > 1e-2
