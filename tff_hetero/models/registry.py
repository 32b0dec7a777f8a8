"""The model registry: names the CLI accepts, mapped to seeded Keras factories.

`build_model(name, input_shape, num_classes, seed)` validates its arguments,
looks the name up in `MODELS` and calls the factory. Every model outputs
logits, and two builds with the same arguments have identical initial weights
(each layer's initialiser carries an explicit seed derived from `seed`; the
TensorFlow global seed plays no part). The variants, their papers and their
exact parameter and MAC counts are documented in `cnn.py` and `mlp.py`.

A new model is added by appending its `ModelSpec` to `_SPECS`.
"""

from __future__ import annotations

import numbers
import types
from collections.abc import Callable, Mapping, Sequence

import attrs
import tensorflow as tf

from tff_hetero.models import cnn
from tff_hetero.models import mlp
from tff_hetero.models.errors import ModelError

ModelFactory = Callable[[tuple[int, ...], int, int], tf.keras.Model]


@attrs.frozen
class ModelSpec:
  """A registered model.

  Attributes:
    name: Registry name (the `--model` flag value).
    factory: `(input_shape, num_classes, seed) -> tf.keras.Model` (logits).
    description: One line: the variant, as precisely as it matters.
    paper: Where the architecture comes from.
  """

  name: str
  factory: ModelFactory
  description: str
  paper: str


_SPECS = (
    ModelSpec(
        name="mnist_cnn",
        factory=cnn.mnist_cnn,
        description=("conv5x5(10,valid)-pool2-conv5x5(20,valid)-pool2-fc50-fc; "
                     "21,840 params on 28x28x1/10 classes; needs >= 16x16"),
        paper="Bibikar et al. 2022 (FedDST), as used by FedSGC",
    ),
    ModelSpec(
        name="mnist_cnn_feddst",
        factory=cnn.mnist_cnn_feddst,
        description=("FedDST reference MNISTNet: conv5x5(10)-pool3/1-conv5x5(20)"
                     "-pool3/1-fc50-fc; 261,840 params on 28x28x1/10 classes"),
        paper="Bibikar et al. 2022 (FedDST), code bibikar/feddst models.py",
    ),
    ModelSpec(
        name="cifar_cnn",
        factory=cnn.cifar_cnn,
        description=("TF CIFAR-10 tutorial CNN without LRN: conv5x5(64)-pool3/2-"
                     "conv5x5(64)-pool3/2-fc384-fc192-fc; 1,756,426 params on "
                     "32x32x3/10 classes"),
        paper="McMahan et al. 2017 (FedAvg), from the TensorFlow CIFAR-10 tutorial",
    ),
    ModelSpec(
        name="small_cnn",
        factory=cnn.small_cnn,
        description=("conv3x3(16,same)-pool2-conv3x3(32,same)-pool2-fc; 6,090 "
                     "params on 8x8x1/10 classes; for tiny images"),
        paper="none (this project's test model)",
    ),
    ModelSpec(
        name="mlp",
        factory=mlp.mlp,
        description="flatten-fc64-fc; 4,810 params on 8x8x1/10 classes",
        paper="none (this project's test model)",
    ),
    ModelSpec(
        name="mnist_2nn",
        factory=mlp.mnist_2nn,
        description="flatten-fc200-fc200-fc; 199,210 params on 28x28x1/10 classes",
        paper="McMahan et al. 2017 (FedAvg), the 2NN",
    ),
)

MODELS: Mapping[str, ModelSpec] = types.MappingProxyType(
    {spec.name: spec for spec in _SPECS})
assert len(MODELS) == len(_SPECS), "duplicate model name in _SPECS"


def model_names() -> tuple[str, ...]:
  """The registered names, sorted."""
  return tuple(sorted(MODELS))


def _is_int(value: object) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_input_shape(input_shape: object) -> tuple[int, ...]:
  """A tuple of positive ints (lists, numpy shapes and TensorShapes too)."""
  dims: tuple = ()
  if not isinstance(input_shape, (str, bytes)):
    try:
      dims = tuple(input_shape)  # type: ignore[arg-type]
    except TypeError:
      dims = ()
  if not dims or not all(_is_int(d) and d >= 1 for d in dims):
    raise ModelError(
        f"input_shape must be a non-empty sequence of positive integers "
        f"(one example, no batch dimension), got {input_shape!r}")
  return tuple(int(d) for d in dims)


def build_model(name: str, input_shape: Sequence[int], num_classes: int,
                seed: int) -> tf.keras.Model:
  """Builds registered model `name` (logits out, seeded initial weights).

  Args:
    name: A key of `MODELS`.
    input_shape: Shape of one example without the batch dimension, e.g.
      `(28, 28, 1)`.
    num_classes: Number of labels (>= 2): the width of the logits.
    seed: Non-negative integer; every layer's initialiser seed derives from it.

  Raises:
    ModelError: unknown name, malformed arguments, or an input shape the model
      cannot take (e.g. `mnist_cnn` on 8x8 images).
  """
  spec = MODELS.get(name) if isinstance(name, str) else None
  if spec is None:
    raise ModelError(
        f"unknown model {name!r}; accepted: {', '.join(model_names())}")
  shape = _check_input_shape(input_shape)
  if not _is_int(num_classes) or num_classes < 2:
    raise ModelError(f"num_classes must be an integer >= 2, got {num_classes!r}")
  if not _is_int(seed) or seed < 0:
    raise ModelError(f"seed must be a non-negative integer, got {seed!r}")
  return spec.factory(shape, int(num_classes), int(seed))
