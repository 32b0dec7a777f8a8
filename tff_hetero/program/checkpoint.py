"""Checkpoints that hold everything a run needs to continue.

A checkpoint is one `tff.program.FileProgramStateManager` version (a SavedModel
of a flat list of arrays, written atomically by TFF) plus a JSON sidecar
written after it, which says how to rebuild the structure. The arrays are the
state's leaves packed by dtype: every numeric or boolean leaf is raveled into
one 1-D array per dtype (in order of first appearance), any other leaf is
saved on its own, and the sidecar's `leaf_layout` holds each leaf's array,
offset and shape. TFF's manager writes one SavedModel variable per array, at
about 10 ms each on two cores: InclusiveFL's 1,280 leaves took 16.5 s to save
and 11.3 s to load one variable each, and 0.2 s and 0.1 s packed
(`tools/checkpoint_bench.py`). The leaves, in order, are:

* the server state, flattened with `tree` (its structure comes back from the
  algorithm's `initialize()`),
* the client-state store (one flattened entry per client id, listed in the
  sidecar; structure from the algorithm's `initial_client_state()`),
* the communication ledger's columns,
* the program's own state: round number, the sampling/data RNG's bit-generator
  state, elapsed wall time, metric history, and the config fingerprint.

A version counts only once its sidecar exists, so a run killed between the two
writes resumes from the previous complete checkpoint.

The sidecar also holds the SHA-256 of every file of the version's SavedModel.
`load_latest` checks them before reading: a version whose files are missing,
changed or truncated (or that TensorFlow cannot read) is skipped with a
one-line warning naming the file, moved aside (`damaged_program_state_N`,
so that later saves never keep it in place of a good one), and the previous
version is loaded instead; `CheckpointError` (a `UsageError` of `--resume`)
if none is intact. A version written with other settings (its sidecar's
fingerprint, checked by the caller's `check_fingerprint` before anything
else is read) is an error, not damage. Nothing
is read with pickle: the SavedModel holds tensors, the sidecar is JSON.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Mapping
import hashlib
import json
import os
import shutil
import sys
from typing import Any
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tree

from tff_hetero.accounting import CommLedger
from tff_hetero.errors import UsageError
from tff_hetero.program import atomic_files
from tff_hetero.runtime.signals import run_to_completion

_PREFIX = "program_state_"
_SIDECAR = _PREFIX + "{version}.json"


class CheckpointError(UsageError):
  """No checkpoint under the run's directory is intact."""

  def __init__(self, message: str):
    super().__init__("--resume", message)


def _check_layout(directory: str, template: Any, leaves) -> None:
  """Raises `CheckpointError` (one line) unless there are as many `leaves`
  as `template` has: a server state written in another layout (e.g. by a
  version whose optimizer state was per tensor) cannot be resumed. (Shapes
  are not compared: some states' arrays change shape from round to round.)"""
  expected = len(tree.flatten(template))
  if len(leaves) != expected:
    raise CheckpointError(
      f"checkpoint {directory} holds a server state of another layout"
      f" ({len(leaves)} arrays where this run's has {expected}): written by"
      " another version of the algorithm; start a new run (another"
      " --experiment_name)"
    )


def file_digests(directory: str) -> collections.OrderedDict:
  """SHA-256 (hex) of every file under `directory`, by relative path."""
  digests = collections.OrderedDict()
  for root, dirs, files in os.walk(directory):
    dirs.sort()
    for name in sorted(files):
      path = os.path.join(root, name)
      digest = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          digest.update(block)
      digests[os.path.relpath(path, directory)] = digest.hexdigest()
  return digests


def _warn(message: str) -> None:
  print(f"warning: {message}", file=sys.stderr, flush=True)


@attrs.frozen
class ProgramState:
  """Everything saved at the end of a round."""

  round_num: int
  server_state: Any
  client_states: Mapping[str, Any]
  ledger: CommLedger
  rng_state: Mapping[str, Any]
  elapsed_s: float
  history: tuple[Mapping[str, Any], ...]
  fingerprint: str


class CheckpointManager:
  """Saves and restores `ProgramState` under `root_dir`."""

  def __init__(
    self,
    root_dir: str,
    keep_total: int = 2,
    warn: Callable[[str], None] = _warn,
  ):
    self._root_dir = root_dir
    self._keep_total = keep_total
    self._warn = warn
    self._tff_manager = None

  @property
  def _manager(self) -> tff.program.FileProgramStateManager:
    # Created on first use: TFF's manager makes `root_dir`, and a run that
    # fails validation must leave nothing behind.
    if self._tff_manager is None:
      # One more than kept: TFF removes the oldest version as soon as it
      # has written a new one, before the new one's sidecar completes it;
      # `_prune` removes it after, so that `keep_total` complete versions
      # exist at every moment.
      self._tff_manager = tff.program.FileProgramStateManager(
        self._root_dir,
        prefix=_PREFIX,
        keep_total=self._keep_total + 1 if self._keep_total > 0 else 0,
        keep_first=False,
      )
    return self._tff_manager

  @property
  def root_dir(self) -> str:
    return self._root_dir

  def _sidecar(self, version: int) -> str:
    return os.path.join(self._root_dir, _SIDECAR.format(version=version))

  def _version_dir(self, version: int) -> str:
    return os.path.join(self._root_dir, f"{_PREFIX}{version}")

  def complete_versions(self) -> list[int]:
    if not os.path.isdir(self._root_dir):
      return []
    versions = run_to_completion(self._manager.get_versions()) or []
    return sorted(v for v in versions if os.path.exists(self._sidecar(v)))

  def latest_round(self) -> Optional[int]:
    versions = self.complete_versions()
    return versions[-1] if versions else None

  def save(self, state: ProgramState) -> None:
    leaves = []
    server_leaves = tree.flatten(state.server_state)
    leaves.extend(server_leaves)
    client_counts = collections.OrderedDict()
    for client_id, client_state in state.client_states.items():
      flat = tree.flatten(client_state)
      client_counts[client_id] = len(flat)
      leaves.extend(flat)
    ledger_arrays = state.ledger.to_arrays()
    leaves.extend(ledger_arrays.values())
    leaves = [np.asarray(leaf) for leaf in leaves]
    arrays, layout = _pack(leaves)
    version = int(state.round_num)
    # A partial version left by a killed run is replaced.
    run_to_completion(self._manager._remove(version))  # pylint: disable=protected-access
    if os.path.exists(self._sidecar(version)):
      os.remove(self._sidecar(version))
    run_to_completion(self._manager.save(arrays, version))
    sidecar = collections.OrderedDict(
      round_num=version,
      num_server_leaves=len(server_leaves),
      client_leaf_counts=client_counts,
      ledger_client_ids=list(state.ledger.client_ids),
      ledger_columns=list(ledger_arrays.keys()),
      leaf_layout=layout,
      rng_state=state.rng_state,
      elapsed_s=state.elapsed_s,
      history=list(state.history),
      fingerprint=state.fingerprint,
      sha256=file_digests(self._version_dir(version)),
    )
    atomic_files.write_json(self._sidecar(version), sidecar)
    self._prune()
    self._remove_orphan_sidecars()

  def _prune(self) -> None:
    """Removes all but the newest `keep_total` versions (0: keeps all)."""
    if self._keep_total <= 0:
      return
    versions = sorted(run_to_completion(self._manager.get_versions()) or [])
    for old in versions[: -self._keep_total]:
      run_to_completion(self._manager._remove(old))  # pylint: disable=protected-access

  def _remove_orphan_sidecars(self) -> None:
    versions = set(run_to_completion(self._manager.get_versions()) or [])
    for name in os.listdir(self._root_dir):
      if name.startswith(_PREFIX) and name.endswith(".json"):
        version = int(name[len(_PREFIX) : -len(".json")])
        if version not in versions:
          os.remove(os.path.join(self._root_dir, name))

  def load_latest(
    self,
    server_template: Any,
    client_template: Any,
    check_fingerprint: Callable[[str], None] = lambda fingerprint: None,
  ) -> Optional[ProgramState]:
    """The newest intact checkpoint (module docstring), or None when there
    is none at all. `check_fingerprint` raises if a version's settings do
    not match the run's."""
    versions = self.complete_versions()
    if not versions:
      return None
    problems = []
    for version in reversed(versions):
      try:
        return self._load(
          version, server_template, client_template, check_fingerprint
        )
      except _Damaged as e:
        problems.append(str(e))
        older = [v for v in versions if v < version]
        then = (
          f"falling back to the checkpoint of round {older[-1]}"
          if older
          else "no older checkpoint"
        )
        self._warn(f"{e}; {then}")
        self._move_aside(version)
    raise CheckpointError(
      f"no intact checkpoint under {self._root_dir}: {'; '.join(problems)}"
    )

  def _move_aside(self, version: int) -> None:
    """Renames a damaged version and its sidecar to `damaged_...`: TFF's
    manager no longer counts it, and nothing of it is deleted."""
    for path in (self._version_dir(version), self._sidecar(version)):
      if os.path.exists(path):
        target = os.path.join(
          os.path.dirname(path), "damaged_" + os.path.basename(path)
        )
        if os.path.isdir(target):
          shutil.rmtree(target)
        elif os.path.exists(target):
          os.remove(target)
        os.replace(path, target)

  def _verify(self, version: int, sidecar: Mapping[str, Any]) -> None:
    expected = sidecar.get("sha256")
    directory = self._version_dir(version)
    if expected is None:  # Written before checksums: loading will tell.
      return
    try:
      actual = file_digests(directory) if os.path.isdir(directory) else {}
    except OSError as e:
      raise _Damaged(f"checkpoint {directory} is unreadable ({e})") from None
    for name, digest in expected.items():
      path = os.path.join(directory, name)
      if name not in actual:
        raise _Damaged(f"checkpoint file {path} is missing")
      if actual[name] != digest:
        raise _Damaged(
          f"checkpoint file {path} is corrupt (its SHA-256 does not match)"
        )

  def _load(
    self,
    version: int,
    server_template: Any,
    client_template: Any,
    check_fingerprint: Callable[[str], None],
  ) -> ProgramState:
    try:
      with open(self._sidecar(version)) as f:
        sidecar = json.load(f)
    except (OSError, ValueError) as e:
      raise _Damaged(
        f"checkpoint file {self._sidecar(version)} is unreadable ({e})"
      ) from None
    check_fingerprint(sidecar["fingerprint"])
    self._verify(version, sidecar)
    return self._read(version, sidecar, server_template, client_template)

  def _read(
    self,
    version: int,
    sidecar: Mapping[str, Any],
    server_template: Any,
    client_template: Any,
  ) -> ProgramState:
    num_server = sidecar["num_server_leaves"]
    client_counts = sidecar["client_leaf_counts"]
    num_columns = len(sidecar["ledger_columns"])
    total = num_server + sum(client_counts.values()) + num_columns
    layout = sidecar.get("leaf_layout")  # None: written before packing.
    num_arrays = total if layout is None else _num_arrays(layout)
    try:
      arrays = run_to_completion(
        self._manager.load(version, [None] * num_arrays)
      )
      arrays = [np.asarray(array) for array in arrays]
      leaves = arrays if layout is None else _unpack(arrays, layout)
    except (tf.errors.OpError, OSError, ValueError, IndexError) as e:
      # Files that pass (or predate) the checksums but that TensorFlow
      # cannot read: damaged too; the previous version may load.
      first = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise _Damaged(
        f"checkpoint {self._version_dir(version)} does not load ({first})"
      ) from None
    _check_layout(
      self._version_dir(version), server_template, leaves[:num_server]
    )
    server_state = tree.unflatten_as(server_template, leaves[:num_server])
    position = num_server
    client_states = collections.OrderedDict()
    for client_id, count in client_counts.items():
      client_states[client_id] = tree.unflatten_as(
        client_template, leaves[position : position + count]
      )
      position += count
    ledger = CommLedger.from_arrays(
      sidecar["ledger_client_ids"],
      dict(zip(sidecar["ledger_columns"], leaves[position:])),
    )
    return ProgramState(
      round_num=version,
      server_state=server_state,
      client_states=client_states,
      ledger=ledger,
      rng_state=sidecar["rng_state"],
      elapsed_s=float(sidecar["elapsed_s"]),
      history=tuple(sidecar["history"]),
      fingerprint=sidecar["fingerprint"],
    )


def _pack(
  leaves: list[np.ndarray],
) -> tuple[list[np.ndarray], list[list[Any]]]:
  """`leaves` as few arrays (module docstring) and each leaf's
  [array index, offset or None, shape] in them."""
  index_of = {}  # dtype -> its array's index
  parts = collections.defaultdict(list)
  filled = collections.Counter()
  arrays = []
  layout = []
  for leaf in leaves:
    if leaf.dtype.kind in "biufc":
      if leaf.dtype not in index_of:
        index_of[leaf.dtype] = len(arrays)
        arrays.append(None)
      layout.append(
        [index_of[leaf.dtype], filled[leaf.dtype], list(leaf.shape)]
      )
      parts[leaf.dtype].append(leaf.reshape(-1))
      filled[leaf.dtype] += leaf.size
    else:
      layout.append([len(arrays), None, list(leaf.shape)])
      arrays.append(leaf)
  for dtype, index in index_of.items():
    arrays[index] = np.concatenate(parts[dtype])
  return arrays, layout


def _num_arrays(layout: list[list[Any]]) -> int:
  return 1 + max((index for index, _, _ in layout), default=-1)


def _unpack(
  arrays: list[np.ndarray], layout: list[list[Any]]
) -> list[np.ndarray]:
  """The leaves `_pack` packed into `arrays`."""
  leaves = []
  for index, offset, shape in layout:
    array = arrays[index]
    if offset is None:
      leaves.append(array)
    else:
      size = int(np.prod(shape, dtype=np.int64))
      if offset + size > array.size:
        raise ValueError(
          f"array {index} holds {array.size} values, not {offset + size}"
        )
      leaves.append(array[offset : offset + size].reshape(shape))
  return leaves


class _Damaged(Exception):
  """One checkpoint version is missing, changed or unreadable."""
