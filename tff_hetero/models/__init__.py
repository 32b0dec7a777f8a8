"""Keras models of the papers, their registry, and exact parameter/MAC counters.

    from tff_hetero import models
    model = models.build_model("mnist_cnn", (28, 28, 1), num_classes=10, seed=0)
    models.count_params(model).trainable   # 21840
    models.count_flops(model)              # 480500 forward MACs per example

See `registry.py` for the names, `cnn.py` / `mlp.py` for the exact variants
and their papers, and `counting.py` for the counting conventions.
"""

from tff_hetero.models.counting import LayerCost
from tff_hetero.models.counting import ParamCount
from tff_hetero.models.counting import TRAINING_MACS_MULTIPLIER
from tff_hetero.models.counting import count_flops
from tff_hetero.models.counting import count_params
from tff_hetero.models.counting import layer_costs
from tff_hetero.models.counting import training_flops_per_example
from tff_hetero.models.errors import ModelError
from tff_hetero.models.registry import MODELS
from tff_hetero.models.registry import ModelSpec
from tff_hetero.models.registry import build_model
from tff_hetero.models.registry import model_names

__all__ = [
    "LayerCost",
    "MODELS",
    "ModelError",
    "ModelSpec",
    "ParamCount",
    "TRAINING_MACS_MULTIPLIER",
    "build_model",
    "count_flops",
    "count_params",
    "layer_costs",
    "model_names",
    "training_flops_per_example",
]
