"""The widths a width-heterogeneous algorithm trains: levels and their catalog.

A `Level` is one width sub-model of a model with width knobs
(`tff_hetero.models.width`): its widths, a no-arg Keras builder and its
measured parameters and FLOPs. A `LevelCatalog` builds each level's Keras
model once (seeded by the task), checks that every level is part of the
server model's level, and holds the `SubModelMap`s between levels (cached).

No TFF computation is built here (TFF only lends `ModelWeights`): the typed
computations over a catalog are built in `width_computations.py`, and run
round by round in `width_rounds.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero import devices as devices_lib
from tff_hetero import models as models_lib
from tff_hetero.algorithms import api
from tff_hetero.models import width as width_lib
from tff_hetero.submodels.maps import SubModelMap


@attrs.frozen
class Level:
  """One model width of a catalog.

  Attributes:
    index: Position in the catalog.
    name: e.g. `L1`, `M2`, `x0.5`.
    widths: Output width of every width unit.
    keras_fn: No-arg builder of this level's Keras model.
    params: Trainable parameters.
    forward_flops: Forward MACs per example.
    training_flops_per_example: Forward + backward MACs per example.
  """

  index: int
  name: str
  widths: tuple[int, ...]
  keras_fn: Callable[[], tf.keras.Model] = attrs.field(eq=False)
  params: int
  forward_flops: int
  training_flops_per_example: int

  def capacity(self) -> devices_lib.Capacity:
    """The device capacity that holds exactly this level."""
    return devices_lib.Capacity(params=self.params, flops=self.forward_flops)


def _numpy_weights(model: tf.keras.Model) -> tff.learning.models.ModelWeights:
  return tff.learning.models.ModelWeights(
    trainable=[np.asarray(v.numpy()) for v in model.trainable_weights],
    non_trainable=[np.asarray(v.numpy()) for v in model.non_trainable_weights],
  )


class LevelCatalog:
  """The widths a heterogeneous algorithm trains, with models, costs and maps.

  `levels` are (name, widths) pairs; `outer` names the server model's level
  (by default the last); every level must be part of it.
  """

  def __init__(
    self,
    task: api.Task,
    levels: Sequence[tuple[str, Sequence[int]]],
    outer: Optional[str] = None,
  ):
    if task.width_model_fn is None:
      raise models_lib.ModelError(
        f"model {task.model_name!r} has no width knobs"
      )
    self.task = task
    built = []
    for index, (name, widths) in enumerate(levels):
      widths = tuple(int(w) for w in widths)
      model = task.width_model_fn(widths)
      keras_fn = _level_builder(task, widths)
      built.append(
        (
          Level(
            index=index,
            name=name,
            widths=widths,
            keras_fn=keras_fn,
            params=models_lib.count_params(model).trainable,
            forward_flops=models_lib.count_flops(model),
            training_flops_per_example=models_lib.training_flops_per_example(
              model
            ),
          ),
          model,
        )
      )
    self.levels: tuple[Level, ...] = tuple(level for level, _ in built)
    self._models = [model for _, model in built]
    names = [level.name for level in self.levels]
    if len(set(names)) != len(names):
      raise ValueError(f"level names must be unique, got {names}")
    self.outer = self.by_name(outer) if outer else self.levels[-1]
    for level in self.levels:
      if not width_lib.contains(self.outer.widths, level.widths):
        raise ValueError(f"level {level.name} is not part of {self.outer.name}")
    self._maps: dict[tuple[int, int], SubModelMap] = {}

  def by_name(self, name: str) -> Level:
    for level in self.levels:
      if level.name == name:
        return level
    raise KeyError(name)

  def map(self, outer: Level, inner: Level) -> SubModelMap:
    """The map from level `outer` to its part `inner` (cached)."""
    key = (outer.index, inner.index)
    if key not in self._maps:
      if not width_lib.contains(outer.widths, inner.widths):
        raise ValueError(f"level {inner.name} is not part of {outer.name}")
      self._maps[key] = SubModelMap.between(
        self._models[outer.index], self._models[inner.index]
      )
    return self._maps[key]

  def initial_weights(self, level: Level) -> tff.learning.models.ModelWeights:
    """The seeded initial weights of `level`'s model, as NumPy arrays."""
    return _numpy_weights(self._models[level.index])


def _level_builder(task: api.Task, widths: tuple[int, ...]):
  def build():
    return task.width_model_fn(widths)

  return build
