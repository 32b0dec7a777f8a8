"""`local_training.sgd_step` against a hand computation.

A linear model z = x w (no bias) with mean squared error over m examples has
the loss gradient dL/dw = (2 / m) x^T (x w - y). One SGD step at learning
rate lr with FedProx's term and a mask is

    w' = w - lr * mask * (dL/dw + mu * (w - w_t)).
"""

import collections

import attrs
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning import tensor_utils

from tff_hetero.algorithms import local_training

X = np.array([[1.0, 2.0], [0.0, -1.0], [3.0, 1.0]], np.float32)
Y = np.array([[1.0], [2.0], [0.0]], np.float32)
W0 = np.array([[0.5], [-0.25]], np.float32)
ANCHOR = np.array([[1.0], [1.0]], np.float32)


def _model():
  keras_model = tf.keras.Sequential(
    [
      tf.keras.Input(shape=(2,)),
      tf.keras.layers.Dense(1, use_bias=False),
    ]
  )
  keras_model.set_weights([W0])
  return tff.learning.models.from_keras_model(
    keras_model,
    loss=tf.keras.losses.MeanSquaredError(),
    input_spec=collections.OrderedDict(
      x=tf.TensorSpec([None, 2], tf.float32),
      y=tf.TensorSpec([None, 1], tf.float32),
    ),
  )


@pytest.mark.parametrize("mu, mask", [(0.0, None), (0.5, [[1.0], [0.0]])])
def test_one_step_by_hand(mu, mask):
  model = _model()
  trainable = model.trainable_variables
  optimizer = tff.learning.optimizers.build_sgdm(learning_rate=0.1)
  state = optimizer.initialize(
    tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
  )
  transform = None
  if mask is not None:
    transform = lambda i, g: g * tf.constant(mask, tf.float32)

  @tf.function
  def step():
    return local_training.sgd_step(
      model,
      trainable,
      optimizer,
      state,
      collections.OrderedDict(x=X, y=Y),
      anchor=[tf.constant(ANCHOR)],
      prox_mu=mu,
      transform=transform,
    )

  _, raw, count = step()
  gradient = 2.0 / 3.0 * X.T @ (X @ W0 - Y)
  np.testing.assert_allclose(raw[0], gradient, rtol=1e-6)
  expected = W0 - 0.1 * (
    np.asarray(mask if mask is not None else 1.0)
    * (gradient + mu * (W0 - ANCHOR))
  )
  np.testing.assert_allclose(trainable[0].numpy(), expected, rtol=1e-6)
  assert int(count) == 3


def test_prox_without_an_anchor_is_refused():
  model = _model()
  with pytest.raises(ValueError, match="anchor"):  # prox_mu 0.1, no anchor
    local_training.sgd_step(
      model,
      model.trainable_variables,
      tff.learning.optimizers.build_sgdm(0.1),
      (),
      collections.OrderedDict(x=X, y=Y),
      prox_mu=0.1,
    )


@pytest.mark.parametrize("batches", [0, 1, 3])
def test_fold_batches_visits_every_batch_in_order(batches):
  # State (count, weighted sum, last): by hand, batches [1,2], [3,4], [5,6]
  # give count 3, sum 1*3 + 2*7 + 3*11 = 50 (batch number times its sum),
  # last batch [5, 6]; no batch leaves the initial state.
  values = np.arange(1, 2 * batches + 1, dtype=np.float32).reshape(-1, 2)
  data = tf.data.Dataset.from_tensor_slices(values).batch(1)

  @tf.function
  def fold():
    def fn(state, batch):
      count, total, _ = state
      count += 1
      return (
        count,
        total + tf.cast(count, tf.float32) * tf.reduce_sum(batch),
        batch[0],
      )

    initial = (tf.constant(0), tf.constant(0.0), tf.zeros([2]))
    return local_training.fold_batches(data, initial, fn)

  count, total, last = fold()
  expected = {0: (0, 0.0, [0, 0]), 1: (1, 3.0, [1, 2]), 3: (3, 50.0, [5, 6])}
  want_count, want_total, want_last = expected[batches]
  assert int(count) == want_count
  assert float(total) == want_total
  np.testing.assert_array_equal(last.numpy(), want_last)


def test_fold_batches_equals_dataset_reduce_on_a_nested_state():
  # The oracle is tf.data's own reduce, on the kind of state the clients
  # carry: a named tuple, an empty tuple, a dict of optimizer state, and
  # numbered batches.
  State = collections.namedtuple("State", ["examples", "extra", "opt"])
  data = (
    tf.data.Dataset.from_tensor_slices(
      np.arange(14, dtype=np.float32).reshape(7, 2)
    )
    .batch(3)
    .enumerate()
  )

  def fn(state, numbered):
    number, batch = numbered
    opt = collections.OrderedDict(
      step=state.opt["step"] + 1,
      acc=state.opt["acc"] * 0.5 + tf.cast(number + 1, tf.float32) * batch[0],
    )
    return State(state.examples + tf.shape(batch, tf.int64)[0], (), opt)

  initial = State(
    tf.constant(0, tf.int64),
    (),
    collections.OrderedDict(step=tf.constant(0), acc=tf.zeros([2])),
  )
  got = tf.function(lambda: local_training.fold_batches(data, initial, fn))()
  want = data.reduce(initial, fn)
  assert int(got.examples) == int(want.examples) == 7
  assert got.extra == ()
  assert int(got.opt["step"]) == int(want.opt["step"]) == 3
  np.testing.assert_array_equal(got.opt["acc"].numpy(), want.opt["acc"].numpy())


@pytest.mark.parametrize(
  "second, expected, dropped",
  [
    (np.float32(2.5), [[1.0, -3.0], 2.5], 0),
    (np.float32(np.inf), [[0.0, 0.0], 0.0], 1),
    (np.float32(np.nan), [[0.0, 0.0], 0.0], 1),
  ],
)
def test_zero_all_if_any_non_finite_in_a_graph(second, expected, dropped):
  @tf.function
  def zeroed(pair, scalar):
    return local_training.zero_all_if_any_non_finite(
      (pair, scalar, tf.constant(3, tf.int32))
    )

  (pair, scalar, count), flag = zeroed(
    tf.constant([1.0, -3.0]), tf.constant(second)
  )
  np.testing.assert_array_equal(pair.numpy(), expected[0])
  assert float(scalar) == expected[1]
  # Integer leaves are not checked and are zeroed with the rest.
  assert int(count) == (0 if dropped else 3)
  assert int(flag) == dropped


class _Pair(collections.namedtuple("_Pair", ["kernel", "steps"])):
  pass


@attrs.frozen
class _AttrsPair:
  kernel: tf.Tensor
  steps: tf.Tensor


@pytest.mark.parametrize("bad", [None, np.inf, np.nan])
@pytest.mark.parametrize("container", ["ordered_dict", "namedtuple", "attrs"])
def test_zero_all_if_any_non_finite_eagerly_as_tff(container, bad):
  # TFF's own `tensor_utils.zero_all_if_any_non_finite` is the oracle: the
  # same structure back (container types included), the same values, the
  # same flag, called eagerly.
  kernel = np.array([[1.0, -2.0], [0.5, 4.0]], np.float32)
  if bad is not None:
    kernel[1, 0] = bad
  leaves = dict(
    kernel=tf.constant(kernel),
    steps=tf.constant(7.0),  # TFF checks every leaf: no integers here.
  )
  if container == "ordered_dict":
    structure = collections.OrderedDict(bias=tf.constant([0.25]), **leaves)
  elif container == "namedtuple":
    structure = _Pair(**leaves)
  else:
    structure = _AttrsPair(**leaves)
  got, got_flag = local_training.zero_all_if_any_non_finite(structure)
  want, want_flag = tensor_utils.zero_all_if_any_non_finite(structure)
  assert type(got) is type(want) is type(structure)
  tf.nest.map_structure(
    lambda g, w: np.testing.assert_array_equal(g.numpy(), w.numpy()), got, want
  )
  assert int(got_flag) == int(want_flag) == (0 if bad is None else 1)
