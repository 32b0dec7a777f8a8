"""FedGKT's edge and server models: a small ResNet on the device, the rest of a
deep one on the server.

He, Annavaram and Avestimehr, "Group Knowledge Transfer: Federated Learning
of Large CNNs at the Edge" (NeurIPS 2020), Section 4 and Appendix B.3:

* edge model `fedgkt_edge_resnet{4,6,8}`: a 3x3 stem convolution with 16
  channels + batch norm + ReLU, then 1, 2 or 3 BasicBlocks with 16 channels
  (stride 1): the feature extractor, whose output H (same height and width as
  the image, 16 channels) is what the device sends; then global average
  pooling and a dense layer to the logits (the edge classifier). Depth =
  1 + 2 x blocks convolutions + the dense layer.
* server model `fedgkt_server_resnet{55,109}`: CIFAR ResNet-56/110
  (`resnet.py`: three stages of 9/18 BasicBlocks with 16, 32 and 64
  channels, option-A shortcuts) without its stem convolution, taking the
  edge's 16-channel feature maps where ResNet-56/110 takes its stem's
  output: 54/108 convolutions + the dense layer. `fedgkt_server_resnet19`
  is ResNet-20 cut the same way (not in the paper: for fast offline runs).
  The server model of a registry build on images of shape (H, W, C) takes
  inputs of shape (H, W, 16) (`feature_shape`).

The edge extractor followed by the server model is therefore ResNet-56/110
with its one-convolution stem replaced by the edge extractor (1 + 2 x blocks
convolutions), as in the paper's Figure 1(b). FedGKT's reference code
(FedML `resnet56_gkt`) builds its server ResNet-55 from Bottleneck blocks
([6, 6, 6], expansion 4: 64/128/256 channels), the pretrained-ResNet variant;
we keep the BasicBlock ResNet-56 of our zoo, the model the FedAvg baseline
trains, so that "ResNet-56" means one model across the comparison.

Exact figures with 10 classes (edge on 32x32x3, server on 32x32x16;
parameters = trainable, MACs as in `counting.py`), asserted in
`tests/models/` (ResNet-56: 853,018 and 126,018,176):

| model | parameters | forward MACs |
|---|---|---|
| fedgkt_edge_resnet4 | 5,306 | 5,210,272 |
| fedgkt_edge_resnet6 | 9,978 | 9,961,632 |
| fedgkt_edge_resnet8 | 14,650 | 14,712,992 |
| fedgkt_server_resnet19 | 269,258 | 40,280,704 |
| fedgkt_server_resnet55 | 852,554 | 125,559,424 |
| fedgkt_server_resnet109 | 1,727,498 | 253,477,504 |

`edge_with_features(edge)` views an edge model as image -> (features,
logits) over the same variables; `extractor_and_server(edge, server)` is
image -> server logits, the model FedGKT evaluates.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tff_hetero.models import resnet
from tff_hetero.models import width as width_lib
from tff_hetero.models.blocks import Factory
from tff_hetero.models.blocks import UnitsFn
from tff_hetero.models.cnn import check_image_input
from tff_hetero.models.errors import ModelError

FEATURE_CHANNELS = 16
# name -> BasicBlocks after the stem.
EDGE_BLOCKS = {"fedgkt_edge_resnet4": 1, "fedgkt_edge_resnet6": 2,
               "fedgkt_edge_resnet8": 3}
# name -> BasicBlocks per stage (those of ResNet-56 / ResNet-110).
SERVER_BLOCKS = {"fedgkt_server_resnet19": 3, "fedgkt_server_resnet55": 9,
                 "fedgkt_server_resnet109": 18}
FEATURES_LAYER_SUFFIX = "_out"


def feature_shape(input_shape: Sequence[int]) -> tuple[int, int, int]:
  """Shape of the edge features H of one image of shape `input_shape`."""
  return (int(input_shape[0]), int(input_shape[1]), FEATURE_CHANNELS)


def _edge_units(name: str, input_shape: tuple[int, ...]) -> tuple[
    width_lib.WidthUnit, ...]:
  check_image_input(name, input_shape)
  return resnet._resnet_units(  # pylint: disable=protected-access
      FEATURE_CHANNELS, (FEATURE_CHANNELS,), EDGE_BLOCKS[name], (False,))


def _server_units(name: str, input_shape: tuple[int, ...]) -> tuple[
    width_lib.WidthUnit, ...]:
  check_image_input(name, input_shape)
  return resnet._resnet_units(  # pylint: disable=protected-access
      None, resnet.CIFAR_STAGE_WIDTHS, SERVER_BLOCKS[name],
      (False,) * len(resnet.CIFAR_STAGE_WIDTHS))


def edge_units(name: str) -> UnitsFn:
  """Width units of edge model `name`: stem, stage1."""

  def units(input_shape, num_classes):
    del num_classes
    return _edge_units(name, input_shape)

  return units


def server_units(name: str) -> UnitsFn:
  """Width units of server model `name`: stage1..3."""

  def units(input_shape, num_classes):
    del num_classes
    return _server_units(name, input_shape)

  return units


def edge_model(name: str) -> Factory:
  """The factory of edge model `name` (a key of `EDGE_BLOCKS`)."""
  if name not in EDGE_BLOCKS:
    raise KeyError(name)

  def factory(input_shape, num_classes, seed, widths=None) -> tf.keras.Model:
    return resnet._resnet(  # pylint: disable=protected-access
        name, input_shape, num_classes, seed, _edge_units(name, input_shape),
        EDGE_BLOCKS[name], (False,), widths)

  factory.__name__ = name
  return factory


def server_model(name: str) -> Factory:
  """The factory of server model `name` (a key of `SERVER_BLOCKS`).

  `input_shape` is the image's; the model takes `feature_shape(input_shape)`.
  """
  if name not in SERVER_BLOCKS:
    raise KeyError(name)

  def factory(input_shape, num_classes, seed, widths=None) -> tf.keras.Model:
    units = _server_units(name, input_shape)
    return resnet._resnet(  # pylint: disable=protected-access
        name, feature_shape(input_shape), num_classes, seed, units,
        SERVER_BLOCKS[name], (False,) * len(resnet.CIFAR_STAGE_WIDTHS),
        widths, stem=False, input_name="features")

  factory.__name__ = name
  return factory


def features_layer(edge: tf.keras.Model) -> tf.keras.layers.Layer:
  """The layer whose output is the edge features H (last block's output)."""
  outs = [layer for layer in edge.layers
          if layer.name.startswith("stage1_block") and
          layer.name.endswith(FEATURES_LAYER_SUFFIX)]
  if not outs:
    raise ModelError(f"model {edge.name!r} is not a FedGKT edge model (no"
                     " stage1_block*_out layer)")
  return outs[-1]


def edge_with_features(edge: tf.keras.Model) -> tf.keras.Model:
  """image -> (features H, logits), sharing `edge`'s variables."""
  return tf.keras.Model(edge.input, [features_layer(edge).output, edge.output],
                        name=f"{edge.name}_with_features")


def extractor_and_server(edge: tf.keras.Model,
                         server: tf.keras.Model) -> tf.keras.Model:
  """image -> server logits: the edge extractor, then the server model.

  Its weights are the extractor's (the edge model's without the classifier)
  followed by the server model's, in that order.
  """
  features = features_layer(edge).output
  extractor = tf.keras.Model(edge.input, features,
                             name=f"{edge.name}_extractor")
  image = tf.keras.Input(shape=edge.input.shape[1:], name="image")
  return tf.keras.Model(image, server(extractor(image)),
                        name=f"{edge.name}_{server.name}")
