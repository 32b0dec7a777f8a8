"""FedGKT's edge and server models: one CNN cut after its stem.

He, Annavaram and Avestimehr, "Group Knowledge Transfer: Federated Learning
of Large CNNs at the Edge" (NeurIPS 2020), Section 3.2, Figure 1(b) and
Section 4.1: the global CNN W is divided into a small feature extractor W_e
on the edge and a large server partition W_s; the edge adds its own
classifier W_c (more blocks, pooling and a dense layer) to make a small
trainable model of its own. The extractor is the CNN's stem (a 3x3
convolution with 16 channels + BN + ReLU): its output H, 16 channels at full
resolution, is what the device sends, and extractor + server is exactly the
ResNet-56/110 that FedAvg trains. The official code (FedML
`model/cv/resnet56_gkt/resnet_client.py`) takes `extracted_features` right
after the stem's ReLU the same way.

The split point is a property of the edge model: its registry entry's
`split_layer` (`SPLIT_LAYER`, "stem_relu") names the layer whose output is
H, and `edge_with_features` / `extractor` / `extractor_and_server` take it.

Two families, beside each other:

* ours, of the BasicBlocks of `resnet.py` (the CIFAR ResNets of He et al.
  2016): edge `fedgkt_edge_resnet{4,6,8}` = stem + 1, 2 or 3 BasicBlocks
  with 16 channels (the paper's Table 5: ResNet-4/6 have one and two
  BasicBlocks) + pooling + dense; server `fedgkt_server_resnet{55,109}` =
  CIFAR ResNet-56/110 without its stem (`fedgkt_server_resnet19` and
  `fedgkt_server_resnet7`: ResNet-20 and ResNet-8 cut the same way, not in
  the paper, for fast offline runs and tests);
* the official code's, of the Bottleneck blocks of `bottleneck.py`, whose
  counts are the paper's: edge `fedgkt_edge_resnet8_bottleneck` = stem + 2
  Bottleneck blocks with 16 planes (64 channels out) + pooling + dense
  (FedML `resnet8_56`: 8 weighted layers, 10,586 parameters, "about 11K");
  server `fedgkt_server_resnet{55,109}_bottleneck` = `resnet56_bottleneck`
  / `resnet110_bottleneck` without the stem (FedML `resnet56_server`, whose
  unused stem convolution we leave out). The paper's "54x / 105x fewer
  parameters and 9x / 17x fewer FLOPs than ResNet-56 / ResNet-110" are this
  edge model against those full models: `pipelines.describe` prints our
  ratios beside them (`PAPER_RATIOS`) and `tests/models/` compares them.

The paper contradicts itself here: its Table 5 text (ResNet-4/6 with one
and two BasicBlocks) implies a BasicBlock ResNet-8 (14,650 parameters), its
"about 11K" and ratios the official code's Bottleneck one. Both are offered;
the reproduction's default edge is the BasicBlock family.

Exact figures with 10 classes (edge on 32x32x3, server on its 32x32x16
features; parameters = trainable, MACs as in `counting.py`), asserted in
`tests/models/`:

| model | parameters | forward MACs |
|---|---|---|
| fedgkt_edge_resnet4 | 5,306 | 5,210,272 |
| fedgkt_edge_resnet6 | 9,978 | 9,961,632 |
| fedgkt_edge_resnet8 | 14,650 | 14,712,992 |
| fedgkt_edge_resnet8_bottleneck | 10,586 | 9,896,576 |
| the extractor of every edge model (stem) | 464 | 458,752 |
| fedgkt_server_resnet7 | 74,826 | 11,854,464 |
| fedgkt_server_resnet19 | 269,258 | 40,280,704 |
| fedgkt_server_resnet55 | 852,554 | 125,559,424 |
| fedgkt_server_resnet109 | 1,727,498 | 253,477,504 |
| fedgkt_server_resnet55_bottleneck | 590,858 | 87,955,968 |
| fedgkt_server_resnet109_bottleneck | 1,147,274 | 169,204,224 |

`edge_with_features(edge, split_layer)` views an edge model as image ->
(features, logits) over the same variables; `extractor_and_server(edge,
server, split_layer)` is image -> server logits, the model FedGKT evaluates
(and split learning trains).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tff_hetero.errors import ModelError
from tff_hetero.models import bottleneck
from tff_hetero.models import resnet
from tff_hetero.models import width as width_lib
from tff_hetero.models.blocks import Factory
from tff_hetero.models.blocks import UnitsFn
from tff_hetero.models.cnn import check_image_input

FEATURE_CHANNELS = 16
SPLIT_LAYER = "stem_relu"
BASIC, BOTTLENECK = "basic", "bottleneck"
# name -> (block family, blocks after the stem).
EDGE_MODELS = {
  "fedgkt_edge_resnet4": (BASIC, 1),
  "fedgkt_edge_resnet6": (BASIC, 2),
  "fedgkt_edge_resnet8": (BASIC, 3),
  "fedgkt_edge_resnet8_bottleneck": (BOTTLENECK, 2),
}
# name -> (block family, blocks per stage).
SERVER_MODELS = {
  "fedgkt_server_resnet7": (BASIC, 1),
  "fedgkt_server_resnet19": (BASIC, 3),
  "fedgkt_server_resnet55": (BASIC, 9),
  "fedgkt_server_resnet109": (BASIC, 18),
  "fedgkt_server_resnet55_bottleneck": (BOTTLENECK, 6),
  "fedgkt_server_resnet109_bottleneck": (BOTTLENECK, 12),
}
# The server model -> the model the edge extractor + server is.
FULL_MODEL_OF_SERVER = {
  "fedgkt_server_resnet7": "resnet8",
  "fedgkt_server_resnet19": "resnet20",
  "fedgkt_server_resnet55": "resnet56",
  "fedgkt_server_resnet109": "resnet110",
  "fedgkt_server_resnet55_bottleneck": "resnet56_bottleneck",
  "fedgkt_server_resnet109_bottleneck": "resnet110_bottleneck",
}
# The edge model -> the full models of its family it is compared with.
COMPARED_FULL_MODELS = {
  BASIC: ("resnet56", "resnet110"),
  BOTTLENECK: ("resnet56_bottleneck", "resnet110_bottleneck"),
}
# Section 4.3 and the abstract: (edge, full) -> (parameter ratio, FLOP
# ratio) as printed, and the edge model's parameters ("11K").
PAPER_RATIOS = {
  ("fedgkt_edge_resnet8_bottleneck", "resnet56_bottleneck"): (54, 9),
  ("fedgkt_edge_resnet8_bottleneck", "resnet110_bottleneck"): (105, 17),
}
PAPER_EDGE_PARAMS = {"fedgkt_edge_resnet8_bottleneck": 11_000}


def family(name: str) -> str:
  """The block family (`BASIC` / `BOTTLENECK`) of an edge or server model."""
  table = EDGE_MODELS if name in EDGE_MODELS else SERVER_MODELS
  return table[name][0]


def feature_shape(input_shape: Sequence[int]) -> tuple[int, int, int]:
  """Shape of the edge features H of one image of shape `input_shape`."""
  return (int(input_shape[0]), int(input_shape[1]), FEATURE_CHANNELS)


def _edge_units(
  name: str, input_shape: tuple[int, ...]
) -> tuple[width_lib.WidthUnit, ...]:
  check_image_input(name, input_shape)
  kind, blocks = EDGE_MODELS[name]
  if kind == BOTTLENECK:
    return bottleneck.units(FEATURE_CHANNELS, blocks, (FEATURE_CHANNELS,))
  return resnet._resnet_units(  # pylint: disable=protected-access
    FEATURE_CHANNELS, (FEATURE_CHANNELS,), blocks, (False,)
  )


def _server_units(
  name: str, input_shape: tuple[int, ...]
) -> tuple[width_lib.WidthUnit, ...]:
  check_image_input(name, input_shape)
  kind, blocks = SERVER_MODELS[name]
  if kind == BOTTLENECK:
    return bottleneck.units(None, blocks)
  return resnet._resnet_units(  # pylint: disable=protected-access
    None,
    resnet.CIFAR_STAGE_WIDTHS,
    blocks,
    (False,) * len(resnet.CIFAR_STAGE_WIDTHS),
  )


def edge_units(name: str) -> UnitsFn:
  """Width units of edge model `name`: the stem, then its blocks' units."""

  def units(input_shape, num_classes):
    del num_classes
    return _edge_units(name, input_shape)

  return units


def server_units(name: str) -> UnitsFn:
  """Width units of server model `name`: its stages' units."""

  def units(input_shape, num_classes):
    del num_classes
    return _server_units(name, input_shape)

  return units


def edge_model(name: str) -> Factory:
  """The factory of edge model `name` (a key of `EDGE_MODELS`)."""
  if name not in EDGE_MODELS:
    raise KeyError(name)
  kind, blocks = EDGE_MODELS[name]

  def factory(input_shape, num_classes, seed, widths=None) -> tf.keras.Model:
    units = _edge_units(name, input_shape)
    if kind == BOTTLENECK:
      return bottleneck.build(
        name, input_shape, num_classes, seed, units, blocks, widths
      )
    return resnet._resnet(  # pylint: disable=protected-access
      name, input_shape, num_classes, seed, units, blocks, (False,), widths
    )

  factory.__name__ = name
  return factory


def check_server_model(name: str) -> None:
  """A one-line `ValueError` unless `name` is a key of `SERVER_MODELS`."""
  if name not in SERVER_MODELS:
    raise ValueError(
      f"the server model must be one of {', '.join(SERVER_MODELS)}, got"
      f" {name!r}"
    )


def server_model(name: str) -> Factory:
  """The factory of server model `name` (a key of `SERVER_MODELS`).

  `input_shape` is the image's; the model takes `feature_shape(input_shape)`.
  """
  if name not in SERVER_MODELS:
    raise KeyError(name)
  kind, blocks = SERVER_MODELS[name]

  def factory(input_shape, num_classes, seed, widths=None) -> tf.keras.Model:
    units = _server_units(name, input_shape)
    if kind == BOTTLENECK:
      return bottleneck.build(
        name,
        feature_shape(input_shape),
        num_classes,
        seed,
        units,
        blocks,
        widths,
        stem=False,
        input_name="features",
      )
    return resnet._resnet(  # pylint: disable=protected-access
      name,
      feature_shape(input_shape),
      num_classes,
      seed,
      units,
      blocks,
      (False,) * len(resnet.CIFAR_STAGE_WIDTHS),
      widths,
      stem=False,
      input_name="features",
    )

  factory.__name__ = name
  return factory


def _split_output(edge: tf.keras.Model, split_layer: str) -> tf.Tensor:
  try:
    return edge.get_layer(split_layer).output
  except ValueError:
    raise ModelError(
      f"model {edge.name!r} has no layer {split_layer!r} to split at"
    ) from None


def extractor(edge: tf.keras.Model, split_layer: str) -> tf.keras.Model:
  """image -> features H: `edge` up to `split_layer`, sharing its variables."""
  return tf.keras.Model(
    edge.input, _split_output(edge, split_layer), name=f"{edge.name}_extractor"
  )


def edge_with_features(
  edge: tf.keras.Model, split_layer: str
) -> tf.keras.Model:
  """image -> (features H, logits), sharing `edge`'s variables."""
  return tf.keras.Model(
    edge.input,
    [_split_output(edge, split_layer), edge.output],
    name=f"{edge.name}_with_features",
  )


def extractor_and_server(
  edge: tf.keras.Model, server: tf.keras.Model, split_layer: str
) -> tf.keras.Model:
  """image -> server logits: the edge extractor, then the server model.

  Its weights are the extractor's followed by the server model's.
  """
  image = tf.keras.Input(shape=edge.input.shape[1:], name="image")
  return tf.keras.Model(
    image,
    server(extractor(edge, split_layer)(image)),
    name=f"{edge.name}_{server.name}",
  )
