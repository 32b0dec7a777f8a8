"""`build_all_large_process` and `build_decoupled_process` (AdaptiveFL's
baselines for TFF users): known answers from TFF's own FedAvg. An All-Large
round equals `build_weighted_fed_avg` of the full model over the same
clients; each of Decoupled's models equals its own FedAvg over its own
clients, and a model without clients in a round keeps its weights."""

import collections

from conftest import tff_fedavg_round
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_hetero

_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32)
)
_LR = 0.1


def _mlp(widths):
  """4 -> widths[0] -> 3 logits, seeded."""
  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        widths[0],
        activation="relu",
        input_shape=(4,),
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
      ),
      tf.keras.layers.Dense(
        3, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2)
      ),
    ]
  )


def _dataset(seed, n):
  rng = np.random.default_rng(seed)
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=rng.normal(size=[n, 4]).astype(np.float32),
      y=rng.integers(0, 3, size=[n]).astype(np.int32),
    )
  ).batch(3)


def _options():
  return dict(
    input_spec=_SPEC,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LR),
  )


def _close(actual, expected):
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, rtol=0, atol=1e-5)


_ORACLES = {}


def _tff_fedavg(widths, data_seeds_and_sizes):
  """One round of TFF's FedAvg of `_mlp(widths)` from its initial weights
  over `_dataset(seed, n)` for each (seed, n); computed once per argument
  (All-Large's round and Decoupled's L1 have the same oracle)."""
  key = (widths, data_seeds_and_sizes)
  if key not in _ORACLES:
    start = [np.asarray(w) for w in _mlp(widths).get_weights()]
    _ORACLES[key] = tff_fedavg_round(
      lambda: _mlp(widths),
      _SPEC,
      _LR,
      start,
      [_dataset(seed, n) for seed, n in data_seeds_and_sizes],
    )
  return _ORACLES[key]


def test_all_large_round_is_tff_fedavg_of_the_full_model(tff_context):
  del tff_context
  process = tff_hetero.build_all_large_process(
    _mlp, full_widths=(6,), **_options()
  )
  assert list(process.levels) == [1.0]
  data = [_dataset(0, 7), _dataset(1, 4)]
  output = process.next(process.initialize(), {1.0: data})
  _close(output.state.model.trainable, _tff_fedavg((6,), ((0, 7), (1, 4))))
  with pytest.raises(TypeError, match="no rates"):
    tff_hetero.build_all_large_process(
      _mlp, full_widths=(6,), rates=(0.5,), **_options()
    )


@pytest.mark.slow
def test_decoupled_models_train_apart(tff_context):
  del tff_context
  process = tff_hetero.build_decoupled_process(
    _mlp, member_widths={"L1": (6,), "S1": (2,)}, **_options()
  )
  state = process.initialize()
  large, small = ((0, 7), (1, 4)), ((2, 5),)
  output = process.next(
    state,
    {
      "L1": [_dataset(*d) for d in large],
      "S1": [_dataset(*d) for d in small],
    },
  )
  for name, widths, data in (("L1", (6,), large), ("S1", (2,), small)):
    _close(
      process.get_model_weights(output.state, name).trainable,
      _tff_fedavg(widths, data),
    )
  assert [c.examples for c in output.clients["L1"]] == [7, 4]
  assert [c.examples for c in output.clients["S1"]] == [5]
  # A round of L1 alone: S1 keeps its weights.
  again = process.next(output.state, {"L1": [_dataset(2, 5)]})
  for before, after in zip(
    process.get_model_weights(output.state, "S1").trainable,
    process.get_model_weights(again.state, "S1").trainable,
  ):
    np.testing.assert_array_equal(before, after)
  assert list(again.metrics) == ["L1"]
  with pytest.raises(KeyError, match="no model 'M1'"):
    process.next(state, {"M1": [_dataset(2, 5)]})
