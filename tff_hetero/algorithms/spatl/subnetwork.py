"""The compute of the sub-network a client's salient selection leaves.

Paper: Yu et al., SPATL, Section V-D and its inference table: "when the salient
parameter selection agent selects salient parameters, it prunes the model as
well", and the pruned model's FLOPs are reported per client (average and
largest reduction over the clients).

A selection keeps whole output channels of each prunable layer: its kernel's
and bias' slices and those of the batch norms that follow it (`agent.
LayerGraph.followers`). A dropped channel is zero for every input, so
whatever reads it loses that input channel too: the next convolution's
kernel rows for it, the Dense units of a flattened map, the batch norm
(only a follower's: its gamma and beta are dropped with the channel; any
other batch norm turns a zero into its beta and keeps the channel alive).
`channel_flow(model, prunable_names, followers)` reads the Keras functional
graph once and lists, call by call, how the live channels flow:

* the model's inputs and any layer not listed below: every output channel
  live;
* Conv2D and Dense (`linear`): live outputs are the layer's selection if it
  is prunable, else all of them; if its activation does not map 0 to 0
  (e.g. a sigmoid) every output is live downstream;
* DepthwiseConv2D: input channel c feeds outputs c*m .. c*m+m-1;
* batch norm: a follower passes its input's live channels, another makes
  every channel live;
* elementwise layers that map 0 to 0 (ReLU, LeakyReLU, ELU, `Activation`s
  with f(0) = 0, pooling, dropout, zero padding): the input's live channels;
  an `Activation` with f(0) != 0 makes every channel live;
* Add / Subtract / Average / Maximum: the union of the inputs' live channels;
  Multiply: their intersection; Concatenate (last axis): their
  concatenation;
* Flatten (channels last): the input's live channels repeated for every
  position;
* `models.blocks.ChannelShortcut`: the input's live channels truncated or
  zero-padded (padding channels are dead).

A call's MACs per example are `models.counting`'s for the whole layer (the
project's exact counter; batch norms one MAC per output element) scaled by
the live fraction of its input channels (convolutions, Dense) and of its
output channels (convolutions, Dense, depthwise convolutions, batch norms):
for a convolution positions x k_h x k_w x live_in x live_out, exactly what
the physically smaller layer costs. Every other call costs what `counting`
says, unscaled. With every channel selected the sum is
`counting.count_flops(model)`.

`selected_macs(flow, channel_masks)` evaluates the flow in TensorFlow
(inside a client's round: the masks are tensors) and returns float64 MACs
per example of one forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tff_hetero.models import counting
from tff_hetero.models.blocks import ChannelShortcut

RULES = (
  "source",
  "linear",
  "depthwise",
  "follower_norm",
  "same",
  "union",
  "intersection",
  "concat",
  "flatten",
  "shortcut",
)


class FlowStep(NamedTuple):
  """One layer call of a `ChannelFlow`.

  Attributes:
    rule: One of `RULES` (module docstring).
    parents: Indices of the steps whose outputs it reads, in input order.
    channels: Its output's channels (last dimension).
    prunable: Index of its selection among the prunable layers, or -1.
    in_channels: Its (first) input's channels.
    macs: `counting`'s MACs per example of the whole call.
    scale_in: Whether its MACs scale with its inputs' live fraction.
    scale_out: Whether its MACs scale with its outputs' live fraction.
    dead_out_live: The activation after it maps 0 elsewhere: every output
      is live downstream.
    repeat: Flatten: positions per channel; depthwise: the multiplier.
  """

  rule: str
  parents: tuple[int, ...]
  channels: int
  prunable: int = -1
  in_channels: int = 0
  macs: int = 0
  scale_in: bool = False
  scale_out: bool = False
  dead_out_live: bool = False
  repeat: int = 1


class ChannelFlow(NamedTuple):
  """A model's `FlowStep`s in graph order and its full MACs per example."""

  steps: tuple[FlowStep, ...]
  full_macs: int


def _maps_zero_to_zero(fn) -> bool:
  if fn is None:
    return True
  value = fn(tf.zeros([1, 1], tf.float32))
  return bool(np.all(np.asarray(value) == 0.0))


_SAME = (
  tf.keras.layers.ReLU,
  tf.keras.layers.LeakyReLU,
  tf.keras.layers.ELU,
  tf.keras.layers.Dropout,
  tf.keras.layers.SpatialDropout2D,
  tf.keras.layers.MaxPooling1D,
  tf.keras.layers.MaxPooling2D,
  tf.keras.layers.AveragePooling1D,
  tf.keras.layers.AveragePooling2D,
  tf.keras.layers.GlobalAveragePooling1D,
  tf.keras.layers.GlobalAveragePooling2D,
  tf.keras.layers.GlobalMaxPooling1D,
  tf.keras.layers.GlobalMaxPooling2D,
  tf.keras.layers.ZeroPadding2D,
)
_UNION = (
  tf.keras.layers.Add,
  tf.keras.layers.Subtract,
  tf.keras.layers.Average,
  tf.keras.layers.Maximum,
)


def _last(shape) -> int:
  shape = shape.as_list() if isinstance(shape, tf.TensorShape) else shape
  while (
    isinstance(shape, (list, tuple))
    and shape
    and not isinstance(shape[-1], (int, type(None)))
  ):
    shape = shape[0]
  return int(shape[-1])


def _positions(shape) -> int:
  shape = shape.as_list() if isinstance(shape, tf.TensorShape) else shape
  return int(np.prod([int(d) for d in shape[1:-1]], dtype=np.int64))


def channel_flow(
  model: tf.keras.Model,
  prunable_names: Sequence[str],
  followers: Sequence[Sequence[str]],
) -> ChannelFlow:
  """The `ChannelFlow` of built functional `model` (module docstring).

  `prunable_names[p]` is the layer whose output channels `channel_masks[p]`
  selects, `followers[p]` the batch norms whose channels go with them.
  """
  costs = {row.name: row.macs for row in counting.layer_costs(model)}
  prunable = {name: p for p, name in enumerate(prunable_names)}
  follower_names = {name for names in followers for name in names}
  steps: list[FlowStep] = []
  index: dict[int, int] = {}
  calls: dict[int, int] = {}
  layers = tf.keras.layers
  for depth in sorted(model._nodes_by_depth, reverse=True):  # pylint: disable=protected-access
    for node in model._nodes_by_depth[depth]:  # pylint: disable=protected-access
      layer = node.layer
      parents = tuple(index[id(p)] for p in node.parent_nodes)
      channels = _last(node.output_shapes)
      if isinstance(layer, layers.InputLayer):
        index[id(node)] = len(steps)
        steps.append(FlowStep("source", (), channels))
        continue
      call = calls.get(id(layer), 0) + 1
      calls[id(layer)] = call
      name = layer.name + (f"#{call}" if call > 1 else "")
      macs = sum(
        m for n, m in costs.items() if n == name or n.startswith(name + "/")
      )
      step = FlowStep(
        "source",
        parents,
        channels,
        in_channels=_last(node.input_shapes),
        macs=macs,
      )
      activation = getattr(layer, "activation", None)
      if isinstance(layer, layers.DepthwiseConv2D):
        step = step._replace(
          rule="depthwise",
          scale_out=True,
          repeat=int(layer.depth_multiplier),
          dead_out_live=not _maps_zero_to_zero(activation),
        )
      elif isinstance(layer, (layers.Conv2D, layers.Dense)) and not isinstance(
        layer, layers.Conv2DTranspose
      ):
        step = step._replace(
          rule="linear",
          prunable=prunable.get(layer.name, -1),
          scale_in=True,
          scale_out=True,
          dead_out_live=not _maps_zero_to_zero(activation),
        )
      elif isinstance(layer, layers.BatchNormalization):
        if layer.name in follower_names:
          step = step._replace(rule="follower_norm", scale_out=True)
      elif isinstance(layer, _SAME):
        step = step._replace(rule="same")
      elif isinstance(layer, layers.Activation):
        if _maps_zero_to_zero(layer.activation):
          step = step._replace(rule="same")
      elif isinstance(layer, _UNION):
        step = step._replace(rule="union")
      elif isinstance(layer, layers.Multiply):
        step = step._replace(rule="intersection")
      elif isinstance(layer, layers.Concatenate) and layer.axis in (
        -1,
        len(node.output_shapes) - 1,
      ):
        step = step._replace(rule="concat")
      elif isinstance(layer, layers.Flatten):
        step = step._replace(
          rule="flatten", repeat=_positions(node.input_shapes)
        )
      elif isinstance(layer, ChannelShortcut):
        step = step._replace(rule="shortcut")
      index[id(node)] = len(steps)
      steps.append(step)
  steps = tuple(steps)
  return ChannelFlow(steps=steps, full_macs=int(sum(s.macs for s in steps)))


def _fraction(live, channels: int):
  return tf.reduce_sum(live) / float(channels)


def _ones(step: FlowStep):
  return tf.ones([step.channels], tf.float64)


def _linear(step, inputs, masks):
  out = masks[step.prunable] if step.prunable >= 0 else _ones(step)
  share = _fraction(inputs[0], step.in_channels) * _fraction(out, step.channels)
  return (_ones(step) if step.dead_out_live else out), share


def _depthwise(step, inputs, masks):
  del masks
  out = tf.repeat(inputs[0], step.repeat)
  share = _fraction(out, step.channels)
  return (_ones(step) if step.dead_out_live else out), share


def _shortcut(step, inputs, masks):
  del masks
  out = inputs[0][: step.channels]
  if step.in_channels < step.channels:
    padding = tf.zeros([step.channels - step.in_channels], tf.float64)
    out = tf.concat([out, padding], 0)
  return out, 1.0


# rule -> (step, its inputs' live channels, masks) -> (live outputs, the
# share of the call's MACs the sub-network keeps).
_EVALUATE = {
  "source": lambda step, inputs, masks: (_ones(step), 1.0),
  "linear": _linear,
  "depthwise": _depthwise,
  "follower_norm": lambda step, inputs, masks: (
    inputs[0],
    _fraction(inputs[0], step.channels),
  ),
  "same": lambda step, inputs, masks: (inputs[0], 1.0),
  "union": lambda step, inputs, masks: (
    tf.reduce_max(tf.stack(inputs), 0),
    1.0,
  ),
  "intersection": lambda step, inputs, masks: (
    tf.reduce_min(tf.stack(inputs), 0),
    1.0,
  ),
  "concat": lambda step, inputs, masks: (tf.concat(inputs, 0), 1.0),
  "flatten": lambda step, inputs, masks: (
    tf.tile(inputs[0], [step.repeat]),
    1.0,
  ),
  "shortcut": _shortcut,
}
assert set(_EVALUATE) == set(RULES)


def selected_macs(flow: ChannelFlow, channel_masks: Sequence[Any]):
  """float64 MACs per example of the sub-network `channel_masks` (one 0/1
  vector per prunable layer, its output channels) leaves."""
  masks = [tf.cast(m, tf.float64) for m in channel_masks]
  live: list[Any] = []
  total = tf.constant(0.0, tf.float64)
  for step in flow.steps:
    out, share = _EVALUATE[step.rule](
      step, [live[p] for p in step.parents], masks
    )
    live.append(out)
    total += tf.constant(float(step.macs), tf.float64) * share
  return total


def saved_fraction(flow: ChannelFlow, macs) -> float:
  """1 - macs / the full model's MACs (0 for a model without MACs)."""
  if not flow.full_macs:
    return 0.0
  return 1.0 - float(macs) / flow.full_macs


__all__ = [
  "ChannelFlow",
  "FlowStep",
  "RULES",
  "channel_flow",
  "saved_fraction",
  "selected_macs",
]
