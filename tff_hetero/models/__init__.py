"""Keras models of the papers, their registry, and exact parameter/MAC counters.

    from tff_hetero import models
    model = models.build_model("mnist_cnn", (28, 28, 1), num_classes=10, seed=0)
    models.count_params(model).trainable   # 21840
    models.count_flops(model)              # 480500 forward MACs per example

    units = models.width_units("vgg16", (32, 32, 3), 10)    # 15 WidthUnits
    narrow = models.widths_for(units, 0.66, start_index=8)  # AdaptiveFL M1
    models.build_model("vgg16", (32, 32, 3), 10, seed=0, widths=narrow)

    tiers = models.depth_tiers("transformer")                # (4, 8, 12)
    small = models.build_model("transformer", (28, 28, 1), 10, seed=0,
                               depth=4)     # block_1..block_4 of the 12-layer
    models.depth_partition(small).blocks[0]  # block_1's weight indices
    models.load_depth_weights(small, "pretrained.npz")  # shared bottom layers

See `registry.py` for the names, `cnn.py` / `mlp.py` / `vgg.py` /
`resnet.py` / `transformer.py` / `depth_cnn.py` for the exact variants and
their papers, `width.py` for width units, `depth.py` for depth-scalable
models and their weight files, and `counting.py` for the counting
conventions.
"""

from tff_hetero.errors import ModelError
from tff_hetero.models.counting import TRAINING_MACS_MULTIPLIER
from tff_hetero.models.counting import LayerCost
from tff_hetero.models.counting import ParamCount
from tff_hetero.models.counting import count_flops
from tff_hetero.models.counting import count_params
from tff_hetero.models.counting import layer_costs
from tff_hetero.models.counting import training_flops_per_example
from tff_hetero.models.depth import DepthPartition
from tff_hetero.models.depth import LoadedDepthWeights
from tff_hetero.models.depth import depth_of
from tff_hetero.models.depth import depth_partition
from tff_hetero.models.depth import load_depth_weights
from tff_hetero.models.depth import save_depth_weights
from tff_hetero.models.registry import MODELS
from tff_hetero.models.registry import ModelSpec
from tff_hetero.models.registry import build_model
from tff_hetero.models.registry import depth_matched_widths
from tff_hetero.models.registry import depth_tiers
from tff_hetero.models.registry import encoder_predictor_split
from tff_hetero.models.registry import model_names
from tff_hetero.models.registry import split_layer
from tff_hetero.models.registry import width_units
from tff_hetero.models.width import WidthUnit
from tff_hetero.models.width import check_widths
from tff_hetero.models.width import contains
from tff_hetero.models.width import full_widths
from tff_hetero.models.width import widths_for

__all__ = [
  "DepthPartition",
  "LayerCost",
  "LoadedDepthWeights",
  "MODELS",
  "ModelError",
  "ModelSpec",
  "ParamCount",
  "TRAINING_MACS_MULTIPLIER",
  "WidthUnit",
  "build_model",
  "check_widths",
  "contains",
  "count_flops",
  "count_params",
  "depth_matched_widths",
  "depth_of",
  "depth_partition",
  "depth_tiers",
  "encoder_predictor_split",
  "full_widths",
  "layer_costs",
  "load_depth_weights",
  "model_names",
  "save_depth_weights",
  "split_layer",
  "training_flops_per_example",
  "width_units",
  "widths_for",
]
