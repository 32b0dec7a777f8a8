"""Maps between a model and a width sub-model of it: extract and scatter.

A width sub-model (HeteroFL, AdaptiveFL; see `tff_hetero.models.width`) keeps
the first k output channels of some layers and the matching inputs of the
layers that read them, so each of its variables is a *prefix slice* of the
corresponding variable of the larger model: `full[:d0, :d1, ...]`. One
exception needs a view: a dense layer reading the flattened (H, W, C) output
of a convolution has kernel rows ordered (h, w, c); with C narrowed to C' its
rows are the (h, w, c < C') rows, a prefix slice of the kernel viewed as
(H, W, C, units). `SubModelMap` records, per variable, the shapes of both
models and that view, read off the two Keras models (built by the same
factory, so their variables come in the same order).

`extract` and `scatter` are TensorFlow ops on static shapes, usable inside
`tff.tensorflow.computation`s and eagerly on NumPy values:

* `extract(weights)`: the sub-model's weights, sliced from the larger model's;
* `scatter(weights)`: the sub-model's weights placed in the larger shape,
  zero elsewhere; `coverage()`: the 0/1 mask of the elements it covers.

For the driver, which holds the server model as NumPy arrays between
rounds, `extract_arrays` slices in NumPy and `add_scattered` adds a
sub-model-shaped value into the larger arrays in place (no larger-shaped
temporary).

Maps compose: the map from the full model to sub-model B equals the map from
the full model to A followed by the map from A to B whenever B is part of A
(tested), which is how a client prunes the sub-model it received further.
Both structures are `tff.learning.models.ModelWeights` (trainable and
non-trainable lists) or plain lists of the trainable variables.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import Any

import attrs
import numpy as np
import tensorflow as tf

from tff_hetero.errors import ModelError


@attrs.frozen
class SliceSpec:
  """One variable: its name, shapes in both models and the slicing view."""

  name: str
  outer_shape: tuple[int, ...]
  inner_shape: tuple[int, ...]
  outer_view: tuple[int, ...]
  inner_view: tuple[int, ...]

  @property
  def is_whole(self) -> bool:
    return self.outer_shape == self.inner_shape

  def extract(self, value):
    if self.is_whole:
      return tf.convert_to_tensor(value)
    view = tf.reshape(value, self.outer_view)
    sliced = view[tuple(slice(0, d) for d in self.inner_view)]
    return tf.reshape(sliced, self.inner_shape)

  def scatter(self, value):
    if self.is_whole:
      return tf.convert_to_tensor(value)
    view = tf.reshape(value, self.inner_view)
    padded = tf.pad(
      view, [[0, o - i] for o, i in zip(self.outer_view, self.inner_view)]
    )
    return tf.reshape(padded, self.outer_shape)

  def inner_part(self, outer: np.ndarray) -> np.ndarray:
    """The elements of the outer-shaped NumPy array `outer` that the inner
    variable holds, as a writable view shaped like `inner_view` (so
    `spec.inner_part(a)[...] += x` adds in place; a 0-d variable gives a
    0-d view). Raises `ValueError` if `outer` cannot be viewed in that
    shape without a copy."""
    view = outer.reshape(self.outer_view)
    if not np.may_share_memory(view, outer):
      raise ValueError(
        f"{self.name}: the array cannot be viewed as {self.outer_view}"
      )
    return view[tuple(slice(0, d) for d in self.inner_view) + (Ellipsis,)]

  def coverage(self) -> np.ndarray:
    mask = np.zeros(self.outer_view, np.float32)
    mask[tuple(slice(0, d) for d in self.inner_view)] = 1.0
    return mask.reshape(self.outer_shape)


def _flatten_views(model: tf.keras.Model) -> dict[int, tuple[int, ...]]:
  """id(kernel) -> (H, W, C, units) for dense layers reading a Flatten of rank 4."""
  views = {}
  for layer in model.layers:
    if not isinstance(layer, tf.keras.layers.Dense):
      continue
    inbound = (
      layer.inbound_nodes[0].inbound_layers if layer.inbound_nodes else None
    )
    if isinstance(inbound, list):
      inbound = inbound[0] if len(inbound) == 1 else None
    if not isinstance(inbound, tf.keras.layers.Flatten):
      continue
    source_shape = tuple(inbound.input_shape[1:])
    if len(source_shape) < 2:
      continue
    views[id(layer.kernel)] = source_shape + (int(layer.units),)
  return views


def _specs(
  outer_vars: Sequence[tf.Variable],
  inner_vars: Sequence[tf.Variable],
  outer_views,
  inner_views,
  what: str,
) -> tuple[SliceSpec, ...]:
  if len(outer_vars) != len(inner_vars):
    raise ModelError(
      f"the sub-model has {len(inner_vars)} {what} variables, the model"
      f" {len(outer_vars)}: not built by the same factory"
    )
  specs = []
  for outer, inner in zip(outer_vars, inner_vars):
    o_shape = tuple(int(d) for d in outer.shape)
    i_shape = tuple(int(d) for d in inner.shape)
    o_view = outer_views.get(id(outer), o_shape)
    i_view = inner_views.get(id(inner), i_shape)
    if (
      len(o_view) != len(i_view)
      or any(i > o for o, i in zip(o_view, i_view))
      or math.prod(o_view) != math.prod(o_shape)
      or math.prod(i_view) != math.prod(i_shape)
    ):
      raise ModelError(
        f"variable {inner.name} of shape {i_shape} is not a prefix slice of"
        f" {outer.name} of shape {o_shape}"
      )
    specs.append(SliceSpec(inner.name, o_shape, i_shape, o_view, i_view))
  return tuple(specs)


def _as_lists(weights) -> tuple[list, list | None]:
  if hasattr(weights, "trainable") and hasattr(weights, "non_trainable"):
    return list(weights.trainable), list(weights.non_trainable)
  return list(weights), None


@attrs.frozen
class SubModelMap:
  """Extract/scatter between a larger model ("outer") and a sub-model ("inner")."""

  trainable: tuple[SliceSpec, ...]
  non_trainable: tuple[SliceSpec, ...]

  @classmethod
  def between(
    cls, outer: tf.keras.Model, inner: tf.keras.Model
  ) -> "SubModelMap":
    """The map from built Keras model `outer` to its sub-model `inner`."""
    outer_views, inner_views = _flatten_views(outer), _flatten_views(inner)
    return cls(
      _specs(
        outer.trainable_weights,
        inner.trainable_weights,
        outer_views,
        inner_views,
        "trainable",
      ),
      _specs(
        outer.non_trainable_weights,
        inner.non_trainable_weights,
        outer_views,
        inner_views,
        "non-trainable",
      ),
    )

  def _apply(self, weights, fn_name: str):
    trainable, non_trainable = _as_lists(weights)
    if len(trainable) != len(self.trainable) or (
      non_trainable is not None
      and len(non_trainable) != len(self.non_trainable)
    ):
      raise ValueError(
        f"expected {len(self.trainable)} trainable and"
        f" {len(self.non_trainable)} non-trainable values"
      )
    new_trainable = [
      getattr(s, fn_name)(v) for s, v in zip(self.trainable, trainable)
    ]
    if non_trainable is None:
      return new_trainable
    new_non_trainable = [
      getattr(s, fn_name)(v) for s, v in zip(self.non_trainable, non_trainable)
    ]
    return type(weights)(
      trainable=new_trainable, non_trainable=new_non_trainable
    )

  def extract(self, weights) -> Any:
    """The inner model's weights, sliced from the outer model's."""
    return self._apply(weights, "extract")

  def scatter(self, weights) -> Any:
    """The inner model's weights in the outer shapes, zero elsewhere."""
    return self._apply(weights, "scatter")

  def extract_arrays(self, trainable: Sequence[np.ndarray]) -> list[np.ndarray]:
    """`extract` of the trainable variables in NumPy, on the driver (a
    variable the sub-model holds whole may come back as the input array
    itself, not a copy)."""
    if len(trainable) != len(self.trainable):
      raise ValueError(f"expected {len(self.trainable)} trainable values")
    return [
      np.ascontiguousarray(s.inner_part(np.asarray(v))).reshape(s.inner_shape)
      for s, v in zip(self.trainable, trainable)
    ]

  def add_scattered(
    self, targets: Sequence[np.ndarray], values: Sequence[Any]
  ) -> None:
    """`targets[i] += scatter(values)[i]` in place, in NumPy (outer-shaped
    targets that can be viewed in the variable's view shape without a copy,
    as C-contiguous ones can; a scalar value is added to every covered
    element)."""
    if len(targets) != len(self.trainable) or len(values) != len(targets):
      raise ValueError(f"expected {len(self.trainable)} targets and values")
    for spec, target, value in zip(self.trainable, targets, values):
      value = np.asarray(value, target.dtype)
      part = spec.inner_part(target)
      part += value.reshape(spec.inner_view) if value.ndim else value

  def coverage(self, trainable_only: bool = True) -> Any:
    """0/1 float32 masks, outer-shaped, of the elements the inner model holds."""
    masks = [s.coverage() for s in self.trainable]
    if trainable_only:
      return masks
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    return tff.learning.models.ModelWeights(
      trainable=masks, non_trainable=[s.coverage() for s in self.non_trainable]
    )

  def num_elements(self, trainable_only: bool = True) -> int:
    """How many elements the inner model has."""
    specs = (
      self.trainable if trainable_only else self.trainable + self.non_trainable
    )
    return sum(math.prod(s.inner_shape) for s in specs)
