"""CheckpointManager: full round trip, client-state store, partial versions."""

import asyncio
import collections
import json
import os
import shutil

import attrs
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
import tree

from tff_hetero.accounting import ClientTraffic
from tff_hetero.accounting import CommLedger
from tff_hetero.program import checkpoint as checkpoint_lib
from tff_hetero.program.sampling import CohortSampler


def _server(value):
  return collections.OrderedDict(
    weights=[np.full([2, 3], value, np.float32), np.zeros([3], np.float32)],
    optimizer=collections.OrderedDict(step=np.int64(value)),
  )


def _client(value):
  return collections.OrderedDict(control=np.full([4], value, np.float32))


def _state(round_num, sampler):
  ledger = CommLedger().record(round_num, [ClientTraffic("c1", 10, 20, 30, 4)])
  return checkpoint_lib.ProgramState(
    round_num=round_num,
    server_state=_server(round_num),
    client_states=collections.OrderedDict(c1=_client(1.0), c7=_client(7.0)),
    ledger=ledger,
    rng_state=sampler.get_state(),
    elapsed_s=1.5,
    history=({"round": round_num, "accuracy": 0.5},),
    fingerprint="f",
  )


def test_round_trip(tmp_path):
  sampler = CohortSampler(seed=4)
  sampler.sample([f"c{i}" for i in range(10)], 3)
  manager = checkpoint_lib.CheckpointManager(str(tmp_path / "ckpt"))
  manager.save(_state(3, sampler))
  expected_next = sampler.sample([f"c{i}" for i in range(10)], 3)

  restored = checkpoint_lib.CheckpointManager(
    str(tmp_path / "ckpt")
  ).load_latest(_server(0), _client(0))
  assert restored.round_num == 3
  np.testing.assert_array_equal(
    restored.server_state["weights"][0], np.full([2, 3], 3, np.float32)
  )
  assert int(restored.server_state["optimizer"]["step"]) == 3
  assert list(restored.client_states) == ["c1", "c7"]
  np.testing.assert_array_equal(
    restored.client_states["c7"]["control"], np.full([4], 7, np.float32)
  )
  assert restored.ledger.totals().bytes_up == 20
  assert restored.history[0]["accuracy"] == 0.5
  resumed = CohortSampler(seed=999)
  resumed.set_state(restored.rng_state)
  assert resumed.sample([f"c{i}" for i in range(10)], 3) == expected_next


def test_keeps_newest_and_ignores_versions_without_sidecar(tmp_path):
  manager = checkpoint_lib.CheckpointManager(str(tmp_path), keep_total=2)
  sampler = CohortSampler(seed=0)
  for round_num in (1, 2, 3):
    manager.save(_state(round_num, sampler))
  assert manager.complete_versions() == [2, 3]
  # A run killed between writing a version and its sidecar: not complete.
  os.remove(tmp_path / "program_state_3.json")
  assert manager.latest_round() == 2
  restored = manager.load_latest(_server(0), _client(0))
  assert restored.round_num == 2
  # Saving that round again replaces the partial version.
  manager.save(_state(3, sampler))
  assert manager.latest_round() == 3


def test_a_save_cut_before_its_sidecar_leaves_keep_total_complete(
  tmp_path, monkeypatch
):
  # Killed after TFF wrote version 4 (and pruned what it prunes) but before
  # the sidecar completed it: versions 2 and 3 must both still be there.
  manager = checkpoint_lib.CheckpointManager(str(tmp_path), keep_total=2)
  sampler = CohortSampler(seed=0)
  for round_num in (1, 2, 3):
    manager.save(_state(round_num, sampler))

  def killed(path, value):
    raise KeyboardInterrupt(path)

  monkeypatch.setattr(checkpoint_lib.atomic_files, "write_json", killed)
  with pytest.raises(KeyboardInterrupt):
    manager.save(_state(4, sampler))
  assert manager.complete_versions() == [2, 3]
  monkeypatch.undo()
  manager.save(_state(4, sampler))  # The next save completes it, keeps two.
  assert manager.complete_versions() == [3, 4]
  assert sorted(p.name for p in tmp_path.iterdir()) == [
    "program_state_3",
    "program_state_3.json",
    "program_state_4",
    "program_state_4.json",
  ]


def test_no_checkpoint(tmp_path):
  manager = checkpoint_lib.CheckpointManager(str(tmp_path / "none"))
  assert manager.load_latest(_server(0), _client(0)) is None
  assert not os.path.exists(tmp_path / "none")


def _variables_file(root, round_num):
  directory = root / f"program_state_{round_num}" / "variables"
  (name,) = [n for n in os.listdir(directory) if n.startswith("variables.data")]
  return directory / name


def _saved(directory, rounds, warnings=None):
  """A real `CheckpointManager` in `directory` that saved `_state` of each
  of `rounds` (its warnings appended to `warnings` when given)."""
  kwargs = {} if warnings is None else {"warn": warnings.append}
  manager = checkpoint_lib.CheckpointManager(str(directory), **kwargs)
  sampler = CohortSampler(seed=0)
  for round_num in rounds:
    manager.save(_state(round_num, sampler))
  return manager


@pytest.mark.parametrize("damage", ["truncate", "flip_a_byte", "delete"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(
  tmp_path, damage
):
  warnings = []
  manager = _saved(tmp_path, (4, 5), warnings)
  damaged = _variables_file(tmp_path, 5)
  content = damaged.read_bytes()
  if damage == "truncate":  # What a disk filling up mid-write leaves.
    damaged.write_bytes(content[: len(content) // 2])
  elif damage == "flip_a_byte":  # Same size: only the checksum tells.
    damaged.write_bytes(content[:-1] + bytes([content[-1] ^ 0xFF]))
  else:
    damaged.unlink()
  restored = manager.load_latest(_server(0), _client(0))
  assert restored.round_num == 4
  np.testing.assert_array_equal(
    restored.server_state["weights"][0], np.full([2, 3], 4, np.float32)
  )
  (warning,) = warnings
  assert str(damaged) in warning
  assert "falling back to the checkpoint of round 4" in warning
  assert "\n" not in warning
  # Moved aside, kept: the run's next saves cannot keep it instead of 4.
  assert manager.complete_versions() == [4]
  assert (tmp_path / "damaged_program_state_5").is_dir()
  assert (tmp_path / "damaged_program_state_5.json").is_file()


def test_other_settings_are_refused_before_reading_not_skipped(tmp_path):
  manager = _saved(tmp_path, (1, 2))

  def check(fingerprint):
    assert fingerprint == "f"
    raise ValueError("written with different settings")

  with pytest.raises(ValueError, match="different settings"):
    manager.load_latest(_server(0), _client(0), check)
  assert manager.complete_versions() == [1, 2]  # Nothing moved aside.


def test_no_intact_checkpoint_is_a_one_line_resume_error(tmp_path):
  warnings = []
  manager = _saved(tmp_path, (1, 2), warnings)
  paths = [_variables_file(tmp_path, round_num) for round_num in (1, 2)]
  for path in paths:
    path.write_bytes(path.read_bytes()[:10])
  with pytest.raises(checkpoint_lib.CheckpointError) as raised:
    manager.load_latest(_server(0), _client(0))
  message = str(raised.value)
  assert message.startswith("--resume: no intact checkpoint under")
  assert str(paths[0]) in message and str(paths[1]) in message
  assert "\n" not in message
  assert len(warnings) == 2 and warnings[1].endswith("no older checkpoint")


def test_a_server_state_of_another_layout_is_a_one_line_resume_error(
  tmp_path,
):
  manager = _saved(tmp_path, (1, 2))
  # This run's state has one array more than the saved ones (3 arrays).
  template = _server(0)
  template["optimizer"]["moment"] = np.zeros([3], np.float32)
  with pytest.raises(checkpoint_lib.CheckpointError) as raised:
    manager.load_latest(template, _client(0))
  message = str(raised.value)
  assert message.startswith("--resume: checkpoint ")
  assert "(3 arrays where this run's has 4)" in message
  assert "\n" not in message
  assert manager.complete_versions() == [1, 2]  # Nothing moved aside.


def _mixed_server():
  return collections.OrderedDict(
    kernel=np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5,
    step=np.int64(7),
    mask=np.array([[True, False], [False, True]]),
    bias=np.array([-1.25, 2.0], np.float32),
    empty=np.zeros([0, 4], np.float32),
    counts=np.array([3, 1], np.int32),
    name=np.array(b"tier-2", object),
  )


def test_leaves_are_packed_by_dtype_and_come_back_exact(tmp_path):
  manager = checkpoint_lib.CheckpointManager(str(tmp_path))
  state = _state(1, CohortSampler(seed=0))
  manager.save(attrs.evolve(state, server_state=_mixed_server()))
  # float32 (server, clients), int64 (step, the ledger's six columns),
  # bool, int32, and the string on its own: five SavedModel variables in
  # place of 15 leaves.
  variables = tf.train.list_variables(
    str(tmp_path / "program_state_1" / "variables" / "variables")
  )
  assert sum(name.endswith("VARIABLE_VALUE") for name, _ in variables) == 5
  restored = manager.load_latest(_mixed_server(), _client(0))
  for name, expected in _mixed_server().items():
    got = restored.server_state[name]
    assert got.dtype == expected.dtype or name == "name", name
    assert got.shape == expected.shape, name
    np.testing.assert_array_equal(got, expected)
  np.testing.assert_array_equal(
    restored.client_states["c7"]["control"], np.full([4], 7, np.float32)
  )
  assert restored.ledger.totals().bytes_up == 20


def test_a_checkpoint_written_before_packing_still_loads(tmp_path):
  manager = _saved(tmp_path, (2,))
  # Rewrite version 2 the way it was written before packing: one SavedModel
  # variable per leaf, no `leaf_layout` in the sidecar.
  sidecar_path = tmp_path / "program_state_2.json"
  sidecar = json.loads(sidecar_path.read_text())
  leaves = [
    *tree.flatten(_server(2)),
    *tree.flatten(_client(1.0)),
    *tree.flatten(_client(7.0)),
    *_state(2, CohortSampler(seed=0)).ledger.to_arrays().values(),
  ]
  shutil.rmtree(tmp_path / "program_state_2")
  tff_manager = tff.program.FileProgramStateManager(
    str(tmp_path), prefix="program_state_"
  )
  asyncio.run(tff_manager.save(leaves, 2))
  del sidecar["leaf_layout"], sidecar["sha256"]
  sidecar_path.write_text(json.dumps(sidecar))
  restored = manager.load_latest(_server(0), _client(0))
  assert restored.round_num == 2
  np.testing.assert_array_equal(
    restored.server_state["weights"][0], np.full([2, 3], 2, np.float32)
  )
  np.testing.assert_array_equal(
    restored.client_states["c7"]["control"], np.full([4], 7, np.float32)
  )
  assert restored.ledger.totals().bytes_up == 20
