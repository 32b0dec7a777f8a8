"""SPATL's process against independent references.

* With selection keeping everything (budget and min keep 1) and gradient
  control off, the encoder after a round equals TFF's own FedAvg; with the
  predictor shared too (no transfer) every variable does, for two rounds.
* With selection off and gradient control on, and the predictor shared, two
  rounds equal this project's SCAFFOLD (itself checked by hand), control
  variates included.
* A selecting client's upload, by hand from an independent Keras SGD run:
  the kept channels are the top-L1 output channels of its trained kernels,
  the update is zero elsewhere, and its bytes are the selected slices, their
  int32 indices, Delta c and the weight.
* Eq. 11 / 12 on the server, by hand, for both means.
* A private predictor stays the client's own, and Eq. 4 trains the
  predictor alone.
"""

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.aggregators import masked
from tff_hetero.algorithms import model_fns
from tff_hetero.algorithms import scaffold
from tff_hetero.algorithms.spatl import computations
from tff_hetero.algorithms.spatl import spatl

_LR = 0.1
_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 6, 6, 1], tf.float32),
  y=tf.TensorSpec([None], tf.int32),
)
_ENCODER = ("features", "conv", "relu", "flatten", "hidden", "hidden_relu")
_PREDICTOR = ("logits",)


def _keras_model():
  init = tf.keras.initializers.GlorotUniform
  inputs = tf.keras.Input((6, 6, 1), name="features")
  x = tf.keras.layers.Conv2D(
    4, 3, name="conv", kernel_initializer=init(seed=1), bias_initializer="ones"
  )(inputs)
  x = tf.keras.layers.ReLU(name="relu")(x)
  x = tf.keras.layers.Flatten(name="flatten")(x)
  x = tf.keras.layers.Dense(6, name="hidden", kernel_initializer=init(seed=2))(
    x
  )
  x = tf.keras.layers.ReLU(name="hidden_relu")(x)
  outputs = tf.keras.layers.Dense(
    3, name="logits", kernel_initializer=init(seed=3)
  )(x)
  return tf.keras.Model(inputs, outputs)


def _arrays(n, seed):
  rng = np.random.default_rng(seed)
  return (
    rng.normal(size=[n, 6, 6, 1]).astype(np.float32),
    rng.integers(0, 3, size=[n]).astype(np.int32),
  )


def _dataset(arrays, batch_size=4):
  x, y = arrays
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(x=x, y=y)
  ).batch(batch_size)


_CLIENTS = [_arrays(8, 10), _arrays(12, 11), _arrays(4, 12)]
_VALIDATION = [_arrays(6, 20), _arrays(6, 21), _arrays(6, 22)]


def _process(options, transfer=True, total_clients=3):
  return spatl.build_spatl_process(
    _keras_model,
    input_spec=_SPEC,
    encoder_layers=_ENCODER,
    predictor_layers=_PREDICTOR,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
    total_clients=total_clients,
    options=options,
    transfer=transfer,
  )


def _run(process, rounds, cohorts, server_lr=1.0):
  state = process.initialize()
  stores = {}
  outputs = []
  for r in range(rounds):
    cohort = cohorts[r]
    output = process.next(
      state,
      [_dataset(_CLIENTS[k]) for k in cohort],
      [_dataset(_VALIDATION[k]) for k in cohort],
      [stores.get(k, process.initial_client_state()) for k in cohort],
      [spatl.RoundInfo(r == 0, np.array([r, k])) for k in cohort],
      server_lr=server_lr,
    )
    for k, s in zip(cohort, output.client_states):
      stores[k] = s
    state = output.state
    outputs.append(output)
  return state, stores, outputs


_KEEP_ALL = computations.SpatlOptions(
  gradient_control=False, selection=True, budget=1.0, min_keep=1.0, episodes=2
)


@functools.lru_cache(maxsize=None)
def _keep_all_process():
  """Built once for the tests that share it (a build traces the agent)."""
  return _process(_KEEP_ALL)


# Gradient control without selection, the predictor shared, four clients:
# SCAFFOLD's setting.
_CONTROL_ONLY = computations.SpatlOptions(
  gradient_control=True, selection=False
)


@functools.lru_cache(maxsize=None)
def _control_only_process():
  """Built once for the tests that share it."""
  return _process(_CONTROL_ONLY, transfer=False, total_clients=4)


def _tff_model_fn():
  return model_fns.variable_model_fn(
    _keras_model, _SPEC, plain_graph_methods=False
  )


def test_keep_all_without_gradient_control_is_tffs_fedavg(tff_context):
  del tff_context
  fedavg = tff.learning.algorithms.build_weighted_fed_avg(
    _tff_model_fn(),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  )
  fed_state = fedavg.initialize()
  cohorts = [[0, 1, 2], [0, 2]]
  expected = []
  for cohort in cohorts:
    fed_state = fedavg.next(
      fed_state, [_dataset(_CLIENTS[k]) for k in cohort]
    ).state
    expected.append(fedavg.get_model_weights(fed_state).trainable)

  # Private predictors: round 1's encoder (every client starts from the
  # same predictor) equals FedAvg's.
  state, _, outputs = _run(_keep_all_process(), 1, cohorts)
  for p, i in enumerate((0, 1, 2, 3)):
    np.testing.assert_allclose(state.encoder[p], expected[0][i], atol=1e-5)
  assert [r.keep_fractions.tolist() for r in outputs[0].reports] == [
    [1.0, 1.0]
  ] * 3
  # Shared predictor: every variable, two rounds.
  state, _, _ = _run(_process(_KEEP_ALL, transfer=False), 2, cohorts)
  for got, want in zip(state.encoder, expected[1]):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_no_selection_with_gradient_control_is_scaffold(tff_context):
  del tff_context
  reference = scaffold.build_scaffold_process(
    _keras_model,
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
    total_clients=4,
  )
  cohorts = [[0, 1], [1, 2]]
  ref_state = reference.initialize()
  ref_controls = {}
  for cohort in cohorts:
    out = reference.next(
      ref_state,
      [_dataset(_CLIENTS[k]) for k in cohort],
      [ref_controls.get(k, reference.initial_client_control()) for k in cohort],
    )
    ref_state = out.state
    ref_controls.update(zip(cohort, out.client_controls))
  state, stores, _ = _run(_control_only_process(), 2, cohorts)
  for got, want in zip(state.encoder, ref_state.weights.trainable):
    np.testing.assert_allclose(got, want, atol=1e-5)
  for got, want in zip(state.control, ref_state.control):
    np.testing.assert_allclose(got, want, atol=1e-5)
  for k in (0, 1, 2):
    for got, want in zip(stores[k].control, ref_controls[k]):
      np.testing.assert_allclose(got, want, atol=1e-5)


def _keras_sgd(weights, arrays, batch_size=4, correction=()):
  """Independent reference: plain Keras SGD over the client's batches, the
  gradient of variable i plus `correction[i]` where given."""
  model = _keras_model()
  model.set_weights(weights)
  loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  x, y = arrays
  for start in range(0, len(y), batch_size):
    with tf.GradientTape() as tape:
      value = loss(
        y[start : start + batch_size], model(x[start : start + batch_size])
      )
    grads = tape.gradient(value, model.trainable_weights)
    for i, (v, g) in enumerate(zip(model.trainable_weights, grads)):
      v.assign_sub(_LR * (g + (correction[i] if i < len(correction) else 0)))
  return [np.asarray(v) for v in model.trainable_weights]


def test_damped_correction_by_hand(tff_context):
  del tff_context
  # Eq. 9 with the official code's damping s: g + s (c_g - c_l) on the
  # encoder; Eq. 10 (K = 3 steps) is not damped.
  scale = 0.25
  options = computations.SpatlOptions(
    gradient_control=True, selection=False, control_scale=scale
  )
  process = _process(options)
  state = process.initialize()
  initial = [np.asarray(v) for v in _keras_model().get_weights()]
  rng = np.random.default_rng(5)
  c_g = [rng.normal(size=np.shape(w)).astype(np.float32) for w in initial[:4]]
  c_l = [rng.normal(size=np.shape(w)).astype(np.float32) for w in initial[:4]]
  client = process.initial_client_state()._replace(control=c_l)
  update, _, control_delta, _, new_state, _, _ = (
    process.computations.client_work(
      [state.encoder, state.non_trainable, c_g],
      client,
      _dataset(_CLIENTS[1]),
      _dataset(_VALIDATION[1]),
      spatl.RoundInfo(np.bool_(False), np.array([0, 1], np.int64)),
    )
  )
  trained = _keras_sgd(
    initial,
    _CLIENTS[1],
    correction=[scale * (g - l) for g, l in zip(c_g, c_l)],
  )
  for p in range(4):
    np.testing.assert_allclose(update[p], initial[p] - trained[p], atol=1e-5)
    delta = (initial[p] - trained[p]) / (3 * _LR) - c_g[p]
    np.testing.assert_allclose(control_delta[p], delta, atol=1e-4)
    np.testing.assert_allclose(new_state.control[p], c_l[p] + delta, atol=1e-4)
  np.testing.assert_allclose(new_state.predictor[0], trained[4], atol=1e-5)


def _top_l1(kernel, keep):
  scores = np.abs(kernel).reshape(-1, kernel.shape[-1]).sum(axis=0)
  order = sorted(range(len(scores)), key=lambda c: (-scores[c], c))
  mask = np.zeros(len(scores), np.float32)
  mask[order[:keep]] = 1.0
  return mask


def test_selected_upload_by_hand(tff_context):
  del tff_context
  # Budget = min keep = 0.5: every layer keeps half its channels, whatever
  # the agent proposes.
  options = computations.SpatlOptions(
    gradient_control=True, selection=True, budget=0.5, min_keep=0.5, episodes=3
  )
  process = _process(options)
  layout = process.layout
  # conv kernel, conv bias, hidden kernel, hidden bias | logits kernel, bias.
  assert layout.encoder == (0, 1, 2, 3)
  assert layout.predictor == (4, 5)
  assert layout.channel_of == (0, 0, 1, 1)
  assert layout.graph.prunable_names == ("conv", "hidden")
  signature = process.computations.round.type_signature
  assert signature.parameter[0].placement is tff.SERVER
  assert signature.parameter[4].placement is tff.CLIENTS  # client states
  assert signature.result[0].member.is_equivalent_to(
    signature.parameter[0].member
  )
  client_type = process.computations.client_work.type_signature
  assert client_type.result[1].mask.is_equivalent_to(client_type.result[0])
  state = process.initialize()
  initial = [np.asarray(v) for v in _keras_model().get_weights()]
  client = process.initial_client_state()
  comps = process.computations
  update, weight, control_delta, _, new_state, report, _ = comps.client_work(
    [state.encoder, state.non_trainable, state.control],
    client,
    _dataset(_CLIENTS[1]),
    _dataset(_VALIDATION[1]),
    spatl.RoundInfo(np.bool_(True), np.array([0, 1], np.int64)),
  )
  trained = _keras_sgd(initial, _CLIENTS[1])
  conv_mask = _top_l1(trained[0], 2)
  hidden_mask = _top_l1(trained[2], 3)
  masks = [conv_mask, conv_mask, hidden_mask, hidden_mask]
  for p in range(4):
    want = (initial[p] - trained[p]) * masks[p]
    np.testing.assert_allclose(update[p], want, atol=1e-5)
    np.testing.assert_array_equal(
      weight.mask[p], np.broadcast_to(masks[p], initial[p].shape)
    )
  assert float(weight.weight) == 12.0
  # Eq. 10 with zero controls: Delta c = (w_g - w_e) / (K eta), K = 3; the
  # client sends its selected channels and its c_l changes by just those.
  for p in range(4):
    delta = (initial[p] - trained[p]) / (3 * _LR)
    np.testing.assert_allclose(control_delta[p], delta * masks[p], atol=1e-4)
    np.testing.assert_allclose(
      new_state.control[p], delta * masks[p], atol=1e-4
    )
  np.testing.assert_allclose(new_state.predictor[0], trained[4], atol=1e-5)
  # Bytes: conv kernel 2 of 4 channels x 9 values, conv bias 2 values,
  # hidden kernel 3 of 6 channels x 64 values, hidden bias 3, each float32,
  # for the encoder and for Delta c; one int32 index per selected channel
  # of each layer (2 + 3); the float32 weight.
  expected = 2 * (2 * 9 + 2 + 3 * 64 + 3) * 4 + (2 + 3) * 4 + 4
  assert int(report.bytes_up) == expected
  np.testing.assert_allclose(report.keep_fractions, [0.5, 0.5])
  # The sub-network's MACs: conv 4x4 positions x 3x3 x 1 input x 2 kept;
  # hidden reads the 2 live channels at 16 positions, keeps 3 units; logits
  # read those 3 (whole model: 576 + 384 + 18).
  assert float(report.macs) == 16 * 9 * 2 + 32 * 3 + 3 * 3
  assert layout.flow.full_macs == 978
  assert int(report.steps) == 3
  assert float(report.evaluated_examples) == 6.0 * 3


def test_server_update_by_hand(tff_context):
  del tff_context
  for cohort_mean in (True, False):
    if cohort_mean:  # The default.
      assert _CONTROL_ONLY.cohort_mean
      process = _control_only_process()
    else:
      options = computations.SpatlOptions(
        gradient_control=True, selection=False, cohort_mean=False
      )
      process = _process(options, total_clients=4)
    state = process.initialize()
    shapes = [np.shape(w) for w in state.encoder]
    sums = masked.MaskedSums(
      weighted_sum=[np.full(s, 6.0, np.float32) for s in shapes],
      weight_sum=[np.full(s, 3.0, np.float32) for s in shapes],
    )
    control = [np.ones(s, np.float32) for s in shapes]
    control_sum = [np.full(s, 2.0, np.float32) for s in shapes]
    encoder, new_control, statistics = process.computations.server_update(
      state.encoder, sums, np.float32(12.0), control, control_sum, [], [], 0.5
    )
    assert statistics == []
    # Cohort: 6 / 12 (the total weight); selected: 6 / 3 (the count).
    step = 0.5 * (6.0 / 12.0 if cohort_mean else 6.0 / 3.0)
    for got, w in zip(encoder, state.encoder):
      np.testing.assert_allclose(got, w - step, atol=1e-6)
    for got in new_control:
      np.testing.assert_allclose(got, 1.0 + 2.0 / 4, atol=1e-6)


def test_predictor_is_private_and_eq4_trains_it_alone(tff_context):
  del tff_context
  process = _keep_all_process()
  state, stores, _ = _run(process, 1, [[0, 1]])
  # Each client's predictor is its own Keras SGD result of round 1.
  initial = [np.asarray(v) for v in _keras_model().get_weights()]
  for k in (0, 1):
    trained = _keras_sgd(initial, _CLIENTS[k])
    np.testing.assert_allclose(stores[k].predictor[0], trained[4], atol=1e-5)
  # Eq. 4: only the predictor moves, by Keras SGD on the frozen encoder.
  weights = process.model_weights(state)
  predictor = process.predictor_for(
    state, process.initial_client_state().predictor, _dataset(_CLIENTS[2])
  )
  model = _keras_model()
  model.set_weights(list(weights.trainable))
  for layer in model.layers:
    layer.trainable = layer.name == "logits"
  loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  x, y = _CLIENTS[2]
  with tf.GradientTape() as tape:
    value = loss(y, model(x))
  grads = tape.gradient(value, model.trainable_weights)
  for v, g in zip(model.trainable_weights, grads):
    v.assign_sub(_LR * g)
  np.testing.assert_allclose(
    predictor[0], model.get_layer("logits").kernel.numpy(), atol=1e-5
  )


def test_predictor_with_non_trainable_variables_is_refused():
  def model_fn():
    inputs = tf.keras.Input((3,))
    x = tf.keras.layers.Dense(4, name="hidden")(inputs)
    outputs = tf.keras.layers.BatchNormalization(name="logits")(x)
    return tf.keras.Model(inputs, outputs)

  with pytest.raises(Exception, match="non-trainable variables"):
    computations.build_layout(model_fn(), ("input_1", "hidden"), ("logits",))


def _bn_model():
  init = tf.keras.initializers.GlorotUniform
  inputs = tf.keras.Input((6, 6, 1), name="features")
  x = tf.keras.layers.Conv2D(
    4, 3, name="conv", kernel_initializer=init(seed=1)
  )(inputs)
  x = tf.keras.layers.BatchNormalization(name="bn")(x)
  x = tf.keras.layers.ReLU(name="relu")(x)
  x = tf.keras.layers.Flatten(name="flatten")(x)
  outputs = tf.keras.layers.Dense(
    3, name="logits", kernel_initializer=init(seed=3)
  )(x)
  return tf.keras.Model(inputs, outputs)


@functools.lru_cache(maxsize=None)
def _bn_process():
  """The batch-norm model's process, uniform weights; built once."""
  return spatl.build_spatl_process(
    _bn_model,
    input_spec=_SPEC,
    encoder_layers=("features", "conv", "bn", "relu", "flatten"),
    predictor_layers=("logits",),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
    total_clients=2,
    options=_KEEP_ALL,
    client_weighting=tff.learning.ClientWeighting.UNIFORM,
  )


def test_batch_norm_follows_its_layer_and_statistics_are_averaged(
  tff_context,
):
  del tff_context
  process = _bn_process()
  # conv kernel, conv bias, bn gamma, bn beta: all follow conv's channels.
  assert process.layout.channel_of == (0, 0, 0, 0)
  state, _, _ = _run(process, 1, [[0, 1]])
  # Keras: each client trains (moving statistics updated by every training
  # step, momentum 0.99); the server's are the clients' mean (uniform).
  means, variances = [], []
  for k in (0, 1):
    model = _bn_model()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _CLIENTS[k]
    for start in range(0, len(y), 4):
      with tf.GradientTape() as tape:
        value = loss(
          y[start : start + 4], model(x[start : start + 4], training=True)
        )
      grads = tape.gradient(value, model.trainable_weights)
      for v, g in zip(model.trainable_weights, grads):
        v.assign_sub(_LR * g)
    bn = model.get_layer("bn")
    means.append(bn.moving_mean.numpy())
    variances.append(bn.moving_variance.numpy())
  np.testing.assert_allclose(
    state.non_trainable[0], np.mean(means, 0), atol=1e-5
  )
  np.testing.assert_allclose(
    state.non_trainable[1], np.mean(variances, 0), atol=1e-5
  )


def test_non_finite_client_is_zeroed_and_keeps_its_predictor(tff_context):
  del tff_context
  process = _bn_process()
  state = process.initialize()
  fresh = process.initial_client_state()
  nan = (np.full([8, 6, 6, 1], np.nan, np.float32), np.zeros([8], np.int32))

  def round_of(arrays):
    return process.next(
      state,
      [_dataset(a) for a in arrays],
      [_dataset(_VALIDATION[0])] * len(arrays),
      [fresh] * len(arrays),
      [spatl.RoundInfo(True, np.array([0, k])) for k in range(len(arrays))],
      server_lr=1.0,
    )

  with_b = round_of([_CLIENTS[0], nan])
  alone = round_of([_CLIENTS[0]])
  assert [int(r.non_finite) for r in with_b.reports] == [0, 1]
  # b sent zeros of weight 0, its BN statistics too: the server's model and
  # statistics are client 0's round alone, and finite.
  for x, y in zip(
    list(with_b.state.encoder) + list(with_b.state.non_trainable),
    list(alone.state.encoder) + list(alone.state.non_trainable),
  ):
    assert np.all(np.isfinite(x))
    np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
  # b keeps the predictor it had (no control without gradient control).
  # Its agent too, though here that would hold anyway: every episode of
  # this tiny search scores the same, so PPO moves no agent.
  b = with_b.client_states[1]
  assert not b.control
  for x, y in zip(
    tf.nest.flatten((b.predictor, b.actor, b.actor_optimizer)),
    tf.nest.flatten((fresh.predictor, fresh.actor, fresh.actor_optimizer)),
  ):
    np.testing.assert_array_equal(x, y)
