"""FedProx: signatures, FedAvg at mu=0, and the proximal pull by known answers.

The client update is checked in closed form on a model whose loss gradient is
a known constant `g`: every SGD step is `w <- w - lr * (g + mu * (w - w0))`, so
after `k` steps `w_k - w0 = -(g / mu) * (1 - (1 - lr * mu)^k)` (Li et al.,
2020), while TFF 0.87's `build_weighted_fed_prox` client update, whose proximal
term has the wrong sign, gives `(g / mu) * (1 - (1 + lr * mu)^k)`.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.templates import proximal_client_work

from tff_hetero.algorithms import api
from tff_hetero.algorithms import fedavg
from tff_hetero.algorithms import fedprox

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 3], tf.float32), y=tf.TensorSpec([None], tf.int32)
)
_LR, _MU = 0.1, 2.0


def _keras_model():
  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        4,
        input_shape=(3,),
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
      ),
    ]
  )


# Dense 3 -> 4, bias initialised to zero.
_TASK = api.Task(
  "tiny", _keras_model, (3,), 4, _SPEC, training_flops_per_example=3 * 12
)


def _dataset(x, y, batch_size):
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=np.asarray(x, np.float32), y=np.asarray(y, np.int32)
    )
  ).batch(batch_size)


def _datasets():
  rng = np.random.default_rng(0)
  return [
    _dataset(rng.normal(size=[n, 3]), rng.integers(0, 4, size=[n]), 2)
    for n in (5, 3)
  ]


def _sq_distance(a, b):
  return sum(
    float(np.sum((np.asarray(x) - np.asarray(y)) ** 2)) for x, y in zip(a, b)
  )


# Built once: each build traces several TF graphs.
@pytest.fixture(scope="module")
def processes():
  return collections.OrderedDict(
    fedavg=fedavg.build_fedavg_process(
      _TASK.model_fn,
      input_spec=_TASK.element_spec,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
    ),
    prox0=fedprox.build_fedprox_process(
      _TASK.model_fn,
      input_spec=_TASK.element_spec,
      prox_mu=0.0,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
    ),
    prox=fedprox.build_fedprox_process(
      _TASK.model_fn,
      input_spec=_TASK.element_spec,
      prox_mu=_MU,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
    ),
  )


def test_signatures_match_measured_fedavg(processes):
  avg, prox = processes["fedavg"], processes["prox"]
  assert isinstance(prox, tff.learning.templates.LearningProcess)
  for process in (prox, processes["prox0"]):
    # Same state (weights, hparams, aggregator and finalizer states), same
    # client data, and metrics identical to FedAvg's measured ones.
    assert process.next.type_signature.is_identical_to(avg.next.type_signature)
    assert process.initialize.type_signature.is_identical_to(
      avg.initialize.type_signature
    )
  metrics = prox.next.type_signature.result.metrics.member
  assert str(metrics.distributor) == "<bytes_down=int64,clients=int64>"
  assert str(metrics.client_work.train) == (
    "<metrics=<sparse_categorical_accuracy=float32,loss=float32,"
    "num_examples=int64,num_batches=int64>,uploaded_bytes=int64>"
  )
  assert str(metrics.aggregator) == (
    "<inner=<mean_value=<>,mean_weight=<>>,bytes_up=int64,clients=int64,"
    "zero_weight_clients=int64>"
  )
  assert str(prox.next.type_signature.parameter.client_data) == (
    "{<x=float32[?,3],y=int32[?]>*}@CLIENTS"
  )


def test_client_work_signature():
  model_fn = _TASK.tff_model_fn()
  work = fedprox.build_proximal_client_work(
    model_fn, tff.learning.optimizers.build_sgdm(_LR), _MU
  )
  assert isinstance(work, tff.learning.templates.ClientWorkProcess)
  assert str(work.initialize.type_signature) == (
    "( -> <learning_rate=float32>@SERVER)"
  )
  assert str(work.next.type_signature) == (
    "(<state=<learning_rate=float32>@SERVER,"
    "weights={<trainable=<float32[3,4],float32[4]>,non_trainable=<>>}"
    "@CLIENTS,"
    "client_data={<x=float32[?,3],y=int32[?]>*}@CLIENTS> -> "
    "<state=<learning_rate=float32>@SERVER,"
    "result={<update=<float32[3,4],float32[4]>,update_weight=float32>}"
    "@CLIENTS,"
    "measurements=<train=<sparse_categorical_accuracy=float32,"
    "loss=float32,num_examples=int64,num_batches=int64>>@SERVER>)"
  )


def test_negative_mu_is_rejected():
  with pytest.raises(ValueError, match="prox_mu"):
    fedprox.build_proximal_client_work(
      _TASK.tff_model_fn(), tff.learning.optimizers.build_sgdm(_LR), -1.0
    )


# A model with a constant loss gradient: loss = mean(x @ w + b) with every
# x = (1, 2), so dloss/dw = (1, 2)^T and dloss/db = 1 whatever w and b.
_X = np.array([1.0, 2.0], np.float32)
_G = (_X.reshape([2, 1]), np.ones([1], np.float32))
_W0 = (np.array([[0.5], [-1.0]], np.float32), np.array([0.25], np.float32))
_LINEAR_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 2], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


class _MeanPrediction(tf.keras.losses.Loss):
  def call(self, y_true, y_pred):
    del y_true
    return tf.reduce_mean(y_pred, axis=-1)


def _linear_model_fn():
  keras_model = tf.keras.Sequential(
    [tf.keras.layers.Dense(1, input_shape=(2,), kernel_initializer="zeros")]
  )
  return tff.learning.models.from_keras_model(
    keras_model, loss=_MeanPrediction(), input_spec=_LINEAR_SPEC
  )


def _linear_data(num_steps):
  # One example per batch: num_steps SGD steps.
  return _dataset(np.tile(_X, [num_steps, 1]), np.zeros([num_steps]), 1)


def _w0():
  return tff.learning.models.ModelWeights(
    trainable=[tf.constant(w) for w in _W0], non_trainable=[]
  )


@pytest.mark.parametrize("mu", [0.0, 0.5, _MU])
def test_client_update_follows_proximal_sgd_known_answer(mu):
  k = 7
  update_fn = fedprox.build_proximal_client_update(_linear_model_fn, mu)
  result, _ = update_fn(
    tff.learning.optimizers.build_sgdm(_LR), _w0(), _linear_data(k)
  )
  # The recurrence, step by step, in float64.
  expected = [w.astype(np.float64) for w in _W0]
  for _ in range(k):
    expected = [
      w - _LR * (g + mu * (w - w0)) for w, g, w0 in zip(expected, _G, _W0)
    ]
  for got, want, w0 in zip(result.update, expected, _W0):
    # TFF's convention: update = initial - trained.
    np.testing.assert_allclose(w0 - np.asarray(got), want, rtol=0, atol=1e-6)
  assert float(result.update_weight) == k  # Weighted by examples.
  if mu > 0:
    # Closed form: w_k - w0 = -(g / mu) * (1 - (1 - lr * mu)^k).
    shrink = 1.0 - (1.0 - _LR * mu) ** k
    for got, g in zip(result.update, _G):
      np.testing.assert_allclose(
        -np.asarray(got), -(g / mu) * shrink, rtol=0, atol=1e-6
      )


def test_tff_087_fed_prox_pushes_away_ours_pulls():
  """Documents the deviation: TFF 0.87's proximal sign is reversed."""
  k = 7
  tff_update_fn = (
    proximal_client_work.build_model_delta_update_with_tff_optimizer(
      _linear_model_fn,
      weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
      delta_l2_regularizer=_MU,
      loop_implementation=tff.learning.LoopImplementation.DATASET_REDUCE,
    )
  )
  tff_result, _ = tff_update_fn(
    tff.learning.optimizers.build_sgdm(_LR), _w0(), _linear_data(k)
  )
  ours, _ = fedprox.build_proximal_client_update(_linear_model_fn, _MU)(
    tff.learning.optimizers.build_sgdm(_LR), _w0(), _linear_data(k)
  )
  away = (1.0 + _LR * _MU) ** k - 1.0
  towards = 1.0 - (1.0 - _LR * _MU) ** k
  for tff_got, got, g in zip(tff_result.update, ours.update, _G):
    np.testing.assert_allclose(
      -np.asarray(tff_got), -(g / _MU) * away, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
      -np.asarray(got), -(g / _MU) * towards, rtol=0, atol=1e-6
    )
  # Plain SGD (mu = 0) moves by k * lr * g; TFF's FedProx moves further.
  assert (
    _sq_distance(tff_result.update, [0, 0])
    > _sq_distance([k * _LR * g for g in _G], [0, 0])
    > _sq_distance(ours.update, [0, 0])
  )


def test_zero_mu_equals_fedavg_after_one_round(processes, tff_context):
  del tff_context
  avg, prox = processes["fedavg"], processes["prox0"]
  avg_out = avg.next(avg.initialize(), _datasets())
  prox_out = prox.next(prox.initialize(), _datasets())
  for a, b in zip(
    prox.get_model_weights(prox_out.state).trainable,
    avg.get_model_weights(avg_out.state).trainable,
  ):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
  assert prox_out.metrics == avg_out.metrics


def test_round_known_answer_with_example_weighting(processes, tff_context):
  """One full round where each client's trajectory is computable by hand.

  With x = 0 the kernel gets no data gradient (and no proximal one: it stays
  at w0), and with one example per batch the bias gradient is
  softmax(b) - onehot(y), so b_{t+1} = b_t - lr * (softmax(b_t) - e_y +
  mu * (b_t - b0)). Clients hold 3 and 1 examples; the server applies half
  (server_lr = 0.5) of their example-weighted mean delta.
  """
  del tff_context
  process = processes["prox"]
  state = process.initialize()
  kernel0, bias0 = process.get_model_weights(state).trainable
  labels = ([0, 0, 0], [2])
  datasets = [_dataset(np.zeros([len(y), 3]), y, 1) for y in labels]

  def client_bias(ys):
    b = np.asarray(bias0, np.float64)
    for y in ys:
      softmax = np.exp(b - b.max()) / np.sum(np.exp(b - b.max()))
      b = b - _LR * (softmax - np.eye(4)[y] + _MU * (b - bias0))
    return b

  deltas = [bias0 - client_bias(ys) for ys in labels]
  mean_delta = (3 * deltas[0] + 1 * deltas[1]) / 4
  output = process.next(state, datasets)
  kernel, bias = process.get_model_weights(output.state).trainable
  np.testing.assert_array_equal(kernel, kernel0)
  np.testing.assert_allclose(bias, bias0 - 0.5 * mean_delta, rtol=0, atol=1e-6)
  assert output.metrics["client_work"]["train"]["metrics"]["num_examples"] == 4


def test_proximal_term_pulls_towards_global_model(processes, tff_context):
  del tff_context
  start = (
    processes["fedavg"]
    .get_model_weights(processes["fedavg"].initialize())
    .trainable
  )
  distances = {}
  for name in ("prox0", "prox"):
    process = processes[name]
    # Ten local epochs: long enough for the proximal pull to act.
    datasets = [d.repeat(10) for d in _datasets()]
    state = process.next(process.initialize(), datasets).state
    # Undo the server learning rate: the distance of the clients' weighted
    # mean model to the global one.
    lr = 1.0 if name == "prox0" else 0.5
    end = process.get_model_weights(state).trainable
    distances[name] = _sq_distance(end, start) / lr**2
  assert distances["prox"] < distances["prox0"]
