"""`spatl.subnetwork`: the MACs of the model a channel selection leaves.

Expected values: a residual toy counted by hand; with every channel kept, the
project's layer counter (`models.counting`); and on ResNet-20 with random
selections, an empirical oracle that runs the masked model on random inputs
and reads which channels actually carry non-zero values into each layer.
"""

import numpy as np
import pytest
import tensorflow as tf

from tff_hetero import models
from tff_hetero.algorithms.spatl import agent
from tff_hetero.algorithms.spatl import subnetwork
from tff_hetero.models import counting


def _residual_toy(norm_after_add: bool):
  layers = tf.keras.layers
  inputs = tf.keras.Input((6, 6, 2))
  x = layers.Conv2D(3, 3, padding="same", name="c1")(inputs)
  x = layers.BatchNormalization(name="b1")(x)
  x = layers.ReLU(name="r1")(x)
  y = layers.Conv2D(4, 3, padding="same", name="c2")(x)
  y = layers.BatchNormalization(name="b2")(y)
  z = layers.Conv2D(4, 1, name="c3")(x)
  x = layers.Add(name="add")([y, z])
  if norm_after_add:
    x = layers.BatchNormalization(name="b3")(x)
  x = layers.GlobalAveragePooling2D(name="pool")(x)
  outputs = layers.Dense(2, name="logits")(x)
  return tf.keras.Model(inputs, outputs)


@pytest.mark.parametrize("norm_after_add", [True, False])
def test_residual_toy_by_hand(norm_after_add):
  model = _residual_toy(norm_after_add)
  graph = agent.layer_graph(
    model, [l.name for l in model.layers if l.name != "logits"]
  )
  assert graph.prunable_names == ("c1", "c2", "c3")
  assert graph.followers == (("b1",), ("b2",), ())
  flow = subnetwork.channel_flow(model, graph.prunable_names, graph.followers)
  masks = [[1, 0, 1], [1, 1, 0, 0], [0, 1, 1, 0]]
  # 36 positions. c1: 3x3 x 2 inputs x 2 kept = 1296; b1 (a follower, one
  # MAC per live output) 72; c2: 3x3 x 2 live inputs x 2 kept = 1296; b2 72;
  # c3: 1x1 x 2 x 2 = 144. The add's union is channels {0, 1, 2}: a batch
  # norm after it makes all four live again (its beta) and costs 36 x 4;
  # the logits then read 4 inputs (8 MACs), else 3 (6 MACs).
  kept = 1296 + 72 + 1296 + 72 + 144
  full = 1944 + 108 + 3888 + 144 + 432 + 8
  if norm_after_add:
    kept, full = kept + 144 + 8, full + 144
  else:
    kept += 6
  assert float(subnetwork.selected_macs(flow, masks)) == kept
  assert flow.full_macs == full == counting.count_flops(model)
  assert subnetwork.saved_fraction(flow, kept) == pytest.approx(1 - kept / full)


@pytest.mark.parametrize(
  "name, shape", [("mnist_cnn", (28, 28, 1)), ("resnet20", (32, 32, 3))]
)
def test_every_channel_kept_costs_the_whole_model(name, shape):
  model = models.build_model(name, shape, 10, seed=0)
  encoder, _ = models.encoder_predictor_split(name, model)
  graph = agent.layer_graph(model, encoder)
  flow = subnetwork.channel_flow(model, graph.prunable_names, graph.followers)
  ones = [np.ones(c, np.float32) for c in graph.out_channels]
  assert float(subnetwork.selected_macs(flow, ones)) == counting.count_flops(
    model
  )


def _empirical_macs(model, graph, masks, rng):
  """MACs from the channels that carry non-zero values when the masked
  model runs on random inputs. Every weight, input and batch-norm statistic
  is positive (running means 0): a kept channel is positive everywhere,
  never zeroed by a ReLU by chance; kernels are divided by their fan-in, so
  that no value overflows (0 x inf would read as live)."""
  for layer in model.layers:
    for weight in layer.weights:
      values = rng.uniform(0.5, 1.5, weight.shape)
      if "moving_mean" in weight.name:
        values = np.zeros(weight.shape)
      elif "kernel" in weight.name:
        values /= np.prod(weight.shape[:-1])
      weight.assign(values.astype(np.float32))
  followers = {}
  for p, name in enumerate(graph.prunable_names):
    layer = model.get_layer(name)
    for weight in layer.weights:
      weight.assign(weight * masks[p])
    for follower in graph.followers[p]:
      norm = model.get_layer(follower)
      norm.gamma.assign(norm.gamma * masks[p])
      norm.beta.assign(norm.beta * masks[p])
      followers[follower] = p
  costed = [
    l
    for l in model.layers
    if isinstance(
      l,
      (
        tf.keras.layers.Conv2D,
        tf.keras.layers.Dense,
        tf.keras.layers.BatchNormalization,
      ),
    )
  ]
  probe = tf.keras.Model(model.inputs, [(l.input, l.output) for l in costed])
  shape = (16,) + tuple(model.input_shape[1:])
  seen = probe(rng.uniform(size=shape).astype(np.float32), training=False)
  costs = {row.name: row.macs for row in counting.layer_costs(model)}
  total = 0.0
  for layer, (x, y) in zip(costed, seen):
    x = np.asarray(x)
    live_in = np.any(x != 0, axis=tuple(range(x.ndim - 1)))
    y = np.asarray(y)
    assert np.all(np.isfinite(y)), layer.name
    live_out = np.any(y != 0, axis=tuple(range(y.ndim - 1)))
    if isinstance(layer, tf.keras.layers.BatchNormalization):
      share = live_out.mean() if layer.name in followers else 1.0
    else:
      share = live_in.mean() * live_out.mean()
    total += costs[layer.name] * share
  return total


def test_resnet20_random_selections_equal_the_empirical_oracle():
  rng = np.random.default_rng(0)
  model = models.build_model("resnet20", (32, 32, 3), 10, seed=0)
  encoder, _ = models.encoder_predictor_split("resnet20", model)
  graph = agent.layer_graph(model, encoder)
  flow = subnetwork.channel_flow(model, graph.prunable_names, graph.followers)
  for keep in (0.3, 0.7):
    masks = [
      (rng.uniform(size=c) < keep).astype(np.float32)
      for c in graph.out_channels
    ]
    for mask in masks:
      mask[rng.integers(len(mask))] = 1.0  # At least one channel per layer.
    want = _empirical_macs(model, graph, masks, rng)
    got = float(subnetwork.selected_macs(flow, masks))
    assert got == pytest.approx(want, rel=1e-9)
    assert 0 < got < flow.full_macs
