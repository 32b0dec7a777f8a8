"""Depth-scalable models: their parts, their seeds and their weight files.

InclusiveFL (Liu et al., "No One Left Behind: Inclusive Federated Learning
over Heterogeneous Devices", KDD 2022) gives weak, medium and strong clients
transformers of 4, 8 and 12 encoder layers that share their BOTTOM layers: a
tier of depth L is the embedding, encoder layers 1..L and its own top layers.
A model of this package is *depth-scalable* when its Keras layers are, in
`model.layers` order,

* the **embedding**: every layer before `block_1`;
* the **blocks** `block_1`, `block_2`, ..., `block_L`, each ONE Keras layer
  and all with the same weight shapes (so block i of any tier can take block
  i of any other);
* the **head**: every layer after `block_L` (the logits layer last).

`transformer.py` (`image_transformer`, `text_transformer`) and
`depth_cnn.py` (`depth_cnn`) build such models. Their factories take
`depth` (the number of blocks) and seed every initialiser through
`DepthSeeds`, so that the embedding, block i and the head start from the same
values whatever the depth: two tiers built with one seed agree on everything
they share, and the shallower one's weights are the deeper one's embedding,
first blocks and head.

`depth_partition(model)` reads that structure off a built model as indices
into `model.trainable_weights` (`DepthPartition`); `depth_of(model)` is its
number of blocks. Both raise a one-line `ModelError` for a model that is not
depth-scalable: no `block_1`, gaps in the numbering, blocks of different
weight shapes, weighted layers between blocks, or non-trainable weights.

Weight files (the `--init_weights` use: every tier's shared bottom layers come
from one file):

* `save_depth_weights(model, path)` writes an `.npz` whose keys do not depend
  on Keras's model name or its uniquified variable names:
  `embedding/<layer>/<variable>`, `block_<i>/<variable>` and
  `head/<layer>/<variable>`, e.g. `embedding/patch_embed/kernel`,
  `block_3/query_kernel`, `head/logits/bias`.
* `load_depth_weights(model, path)` sets the embedding, blocks 1..L (L the
  model's depth) and the head from such an `.npz` or from a Keras HDF5
  weights file (`model.save_weights("x.h5")`, or `model.save("x.h5")`) of a
  model of the same family whose depth is at least L; the file's deeper
  blocks are ignored. Nothing is assigned unless every variable is found
  with its shape. Errors name the path and what is wrong (missing or
  unreadable file, a file shallower than the model, a missing variable, a
  shape mismatch naming the variable and both shapes, a variable the model
  does not have).
"""

from __future__ import annotations

from collections.abc import Sequence
import os
import re

import attrs
import numpy as np
import tensorflow as tf

from tff_hetero.errors import ModelError
from tff_hetero.models.seeding import SeedStream

BLOCK_PREFIX = "block_"
_BLOCK_NAME = re.compile(r"^block_(\d+)$")
# Distinguishes the depth streams from other uses of the same user seed.
_DEPTH_TAG = 0x646570  # "dep"
_MAX_SEED = 2**31 - 1
_NPZ_MAGIC = b"PK"
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def block_name(index: int) -> str:
  """The Keras layer name of block `index` (from 1): `block_<index>`."""
  return f"{BLOCK_PREFIX}{index}"


def check_depth(model_name: str, depth: object) -> int:
  """`depth` as an int >= 1; a one-line `ModelError` otherwise."""
  if (
    not isinstance(depth, (int, np.integer))
    or isinstance(depth, bool)
    or depth < 1
  ):
    raise ModelError(
      f"model {model_name!r}: depth must be an integer >= 1, got {depth!r}"
    )
  return int(depth)


class DepthSeeds:
  """Initialiser seeds of a depth-scalable model, independent of its depth.

  The embedding, each block and the head draw from streams of their own,
  derived from (`seed`, part, block index), so block i's seeds do not depend
  on how many blocks come before or after it.
  """

  def __init__(self, seed: int):
    self._seed = int(seed)

  def _derive(self, part: int, index: int) -> int:
    rng = np.random.default_rng([_DEPTH_TAG, self._seed, part, index])
    return int(rng.integers(0, _MAX_SEED))

  def embedding(self) -> SeedStream:
    """The stream of the layers before the blocks."""
    return SeedStream(self._derive(0, 0))

  def block(self, index: int) -> int:
    """The seed of block `index` (from 1); the block draws its own stream."""
    return self._derive(1, int(index))

  def head(self) -> SeedStream:
    """The stream of the layers after the blocks."""
    return SeedStream(self._derive(2, 0))


@attrs.frozen
class DepthPartition:
  """A depth-scalable model's trainable weights, by part.

  Attributes:
    embedding: Indices into `model.trainable_weights` of the layers before
      `block_1`, in order.
    blocks: Per block (block i at position i - 1), the indices of its
      weights, in the layer's weight order.
    head: Indices of the layers after the last block, in order.
  """

  embedding: tuple[int, ...]
  blocks: tuple[tuple[int, ...], ...]
  head: tuple[int, ...]

  @property
  def depth(self) -> int:
    """The number of blocks."""
    return len(self.blocks)


@attrs.frozen
class _Sections:
  """Layer names of a depth-scalable layer list, by part."""

  embedding: tuple[str, ...]
  blocks: tuple[str, ...]
  head: tuple[str, ...]


def _sections(
  what: str, names: Sequence[str], weighted: Sequence[bool]
) -> _Sections:
  """Splits layer names (in model order) into embedding, blocks and head."""
  numbered = [
    (int(m.group(1)), position)
    for position, name in enumerate(names)
    if (m := _BLOCK_NAME.match(name))
  ]
  numbers = sorted(n for n, _ in numbered)
  if 1 not in numbers:
    raise ModelError(
      f"{what} has no layer {block_name(1)}: not a depth-scalable model"
      f" (its blocks must be layers named block_1, block_2, ...)"
    )
  if numbers != list(range(1, len(numbers) + 1)):
    missing = sorted(set(range(1, numbers[-1] + 1)) - set(numbers))
    raise ModelError(
      f"{what} has blocks numbered {', '.join(map(str, numbers))}: the"
      f" numbering has gaps ({', '.join(map(block_name, missing))} missing)"
    )
  positions = [p for _, p in sorted(numbered)]
  if positions != sorted(positions):
    raise ModelError(
      f"{what}: its blocks do not come in the order of their numbers"
    )
  first, last = positions[0], positions[-1]
  between = [
    names[p]
    for p in range(first, last + 1)
    if p not in positions and weighted[p]
  ]
  if between:
    raise ModelError(
      f"{what} has weighted layers between its blocks"
      f" ({', '.join(between)}): each block must be one layer"
    )
  return _Sections(
    embedding=tuple(n for n, w in zip(names[:first], weighted) if w),
    blocks=tuple(block_name(i) for i in range(1, len(positions) + 1)),
    head=tuple(n for n, w in zip(names[last + 1 :], weighted[last + 1 :]) if w),
  )


def _model_sections(model: tf.keras.Model) -> _Sections:
  what = f"model {model.name!r}"
  if model.non_trainable_weights:
    names = sorted({v.name.split(":")[0] for v in model.non_trainable_weights})
    raise ModelError(
      f"{what} has {len(model.non_trainable_weights)} non-trainable"
      f" weights ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}):"
      f" a depth-scalable model must have trainable weights only"
    )
  layers = model.layers
  sections = _sections(
    what, [l.name for l in layers], [bool(l.weights) for l in layers]
  )
  shapes = [
    [tuple(v.shape) for v in model.get_layer(name).weights]
    for name in sections.blocks
  ]
  for name, block_shapes in zip(sections.blocks, shapes):
    if block_shapes != shapes[0]:
      raise ModelError(
        f"{what}: {name}'s weight shapes {block_shapes} differ from"
        f" block_1's {shapes[0]}; every block must have the same shapes"
      )
  return sections


def depth_partition(model: tf.keras.Model) -> DepthPartition:
  """The embedding, block and head weights of a built depth-scalable model.

  Raises:
    ModelError: not depth-scalable (module docstring).
  """
  sections = _model_sections(model)
  index = {id(v): i for i, v in enumerate(model.trainable_weights)}

  def of(names: Sequence[str]) -> tuple[int, ...]:
    return tuple(
      index[id(v)] for n in names for v in model.get_layer(n).trainable_weights
    )

  return DepthPartition(
    embedding=of(sections.embedding),
    blocks=tuple(of((name,)) for name in sections.blocks),
    head=of(sections.head),
  )


def depth_of(model: tf.keras.Model) -> int:
  """The number of blocks of a depth-scalable model (`ModelError` if not)."""
  return depth_partition(model).depth


# --------------------------------------------------------------------------
# Weight files


def _short_name(variable_name: str, layer_name: str) -> str:
  """`patch_embed/kernel:0` -> `kernel` (the variable's name in its layer)."""
  name = variable_name.split(":")[0]
  prefix = layer_name + "/"
  if name.startswith(prefix):
    return name[len(prefix) :]
  return name.rsplit("/", 1)[-1]


def _stable_key(sections: _Sections, layer: str, short: str) -> str:
  """`embedding/<layer>/<var>`, `block_<i>/<var>` or `head/<layer>/<var>`."""
  if _BLOCK_NAME.match(layer):
    return f"{layer}/{short}"
  part = "embedding" if layer in sections.embedding else "head"
  return f"{part}/{layer}/{short}"


def _stable_keys(model: tf.keras.Model) -> dict[str, tf.Variable]:
  """Stable key -> variable, for every trainable weight of the model."""
  sections = _model_sections(model)
  variables = {}
  for layer_name in (*sections.embedding, *sections.blocks, *sections.head):
    for v in model.get_layer(layer_name).trainable_weights:
      short = _short_name(v.name, layer_name)
      key = _stable_key(sections, layer_name, short)
      if key in variables:
        raise ModelError(
          f"model {model.name!r}: two weights of layer {layer_name!r} are"
          f" both named {short!r}"
        )
      variables[key] = v
  if len(variables) != len(model.trainable_weights):
    raise ModelError(
      f"model {model.name!r}: {len(model.trainable_weights)} trainable"
      f" weights but its layers hold {len(variables)}"
    )
  return variables


def save_depth_weights(model: tf.keras.Model, path: str | os.PathLike) -> str:
  """Writes the model's weights to `path` as an `.npz` of stable keys.

  The file is written at exactly `path` (no suffix is added). Returns the
  path.

  Raises:
    ModelError: the model is not depth-scalable, or the file cannot be
      written.
  """
  variables = _stable_keys(model)
  path = os.fspath(path)
  try:
    with open(path, "wb") as f:
      np.savez(f, **{k: v.numpy() for k, v in variables.items()})
  except OSError as e:
    raise ModelError(f"cannot write depth weights to {path}: {e}") from None
  return path


@attrs.frozen
class LoadedDepthWeights:
  """What `load_depth_weights` set.

  Attributes:
    path: The file.
    file_format: "npz" or "h5".
    file_depth: The number of blocks in the file.
    depth: The blocks set: block_1..block_<depth> (the model's depth).
    embedding: Variables set in the embedding.
    head: Variables set in the head.
    ignored_blocks: The file's blocks beyond the model's depth, unused.
  """

  path: str
  file_format: str
  file_depth: int
  depth: int
  embedding: int
  head: int
  ignored_blocks: tuple[str, ...]


def _read_npz(path: str) -> dict[str, np.ndarray]:
  with np.load(path, allow_pickle=False) as data:
    return {k: np.asarray(data[k]) for k in data.files}


def _decode(values) -> list[str]:
  return [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in values]


def _read_h5(path: str) -> dict[str, np.ndarray]:
  """A Keras `save_weights("x.h5")` (or `save("x.h5")`) file by stable keys."""
  import h5py  # pylint: disable=g-import-not-at-top

  with h5py.File(path, "r") as f:
    group = f["model_weights"] if "model_weights" in f else f
    if "layer_names" not in group.attrs:
      raise ModelError(
        f"cannot load depth weights from {path}: an HDF5 file without"
        f" Keras's layer_names (Keras's newer .weights.h5 layout names layers"
        f" by class, not by name): write it with model.save_weights('x.h5')"
        f" or save_depth_weights"
      )
    names = _decode(group.attrs["layer_names"])
    weight_names = {
      n: _decode(group[n].attrs.get("weight_names", [])) for n in names
    }
    sections = _sections(
      f"file {path}", names, [bool(weight_names[n]) for n in names]
    )
    arrays = {}
    for layer in (*sections.embedding, *sections.blocks, *sections.head):
      for variable in weight_names[layer]:
        key = _stable_key(sections, layer, _short_name(variable, layer))
        arrays[key] = np.asarray(group[layer][variable])
    return arrays


def _file_blocks(keys) -> set[int]:
  return {
    int(m.group(1))
    for k in keys
    if (m := _BLOCK_NAME.match(k.split("/", 1)[0]))
  }


def load_depth_weights(
  model: tf.keras.Model, path: str | os.PathLike
) -> LoadedDepthWeights:
  """Sets the model's embedding, blocks 1..L and head from a weights file.

  Args:
    model: A built depth-scalable model of depth L.
    path: An `.npz` of `save_depth_weights`, or a Keras HDF5 weights file,
      of a model of the same family and depth >= L (told apart by content,
      not by suffix).

  Returns:
    What was set (`LoadedDepthWeights`).

  Raises:
    ModelError: the model is not depth-scalable; the file is missing,
      unreadable, shallower than the model, or lacks a variable, holds one of
      another shape or one the model does not have (one line, naming the
      path). The model is unchanged then.
  """
  variables = _stable_keys(model)
  depth = depth_of(model)
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ModelError(f"cannot load depth weights from {path}: no such file")
  try:
    with open(path, "rb") as f:
      magic = f.read(8)
    if magic.startswith(_NPZ_MAGIC):
      file_format, arrays = "npz", _read_npz(path)
    elif magic == _HDF5_MAGIC:
      file_format, arrays = "h5", _read_h5(path)
    else:
      raise ModelError(
        f"cannot load depth weights from {path}: neither an .npz nor a Keras"
        f" HDF5 weights file"
      )
  except ModelError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise ModelError(
      f"cannot load depth weights from {path}: unreadable"
      f" ({type(e).__name__}: {e})"
    ) from None
  file_blocks = _file_blocks(arrays)
  file_depth = max(file_blocks, default=0)
  if file_depth < depth:
    raise ModelError(
      f"cannot load depth weights from {path}: the file has {file_depth}"
      f" blocks, the model {model.name!r} {depth}"
    )
  for key, variable in variables.items():
    if key not in arrays:
      raise ModelError(
        f"cannot load depth weights from {path}: it has no variable {key}"
        f" (a model of another family?)"
      )
    have, want = tuple(arrays[key].shape), tuple(variable.shape)
    if have != want:
      raise ModelError(
        f"cannot load depth weights from {path}: variable {key} has shape"
        f" {have} in the file, {want} in the model"
      )
  deeper = {block_name(i) for i in file_blocks if i > depth}
  unused = sorted(
    k for k in arrays if k not in variables and k.split("/", 1)[0] not in deeper
  )
  if unused:
    raise ModelError(
      f"cannot load depth weights from {path}: the model {model.name!r} has"
      f" no variable {', '.join(unused[:3])}{', ...' if len(unused) > 3 else ''}"
      f" (a model of another family?)"
    )
  for key, variable in variables.items():
    variable.assign(arrays[key].astype(variable.dtype.as_numpy_dtype))
  return LoadedDepthWeights(
    path=path,
    file_format=file_format,
    file_depth=file_depth,
    depth=depth,
    embedding=sum(k.startswith("embedding/") for k in variables),
    head=sum(k.startswith("head/") for k in variables),
    ignored_blocks=tuple(
      block_name(i) for i in sorted(file_blocks) if i > depth
    ),
  )
