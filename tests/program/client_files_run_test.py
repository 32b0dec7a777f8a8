"""The program with `--client_data=files`: the workers read the clients'
samples from files the run writes and removes.

A run reading files ends with the very weights of the same run sending the
samples (the same batches on the same local worker); its directory is gone
after the run, also after one stopped by KeyboardInterrupt; and a worker
that cannot read the files fails the round with one line naming the flag,
the checkpoints written before kept.
"""

import os
import tempfile

import numpy as np
import pytest

from tff_hetero.errors import UsageError
from tff_hetero.program import make_config
from tff_hetero.program import run_experiment

pytestmark = pytest.mark.slow


def _run(tmp_path, name, on_round=None, **settings):
  config = make_config(
    algorithm="fedavg",
    dataset="synthetic",
    model="mlp",
    num_clients=4,
    clients_per_round=4,
    rounds=3,
    local_epochs=2,
    batch_size=10,
    client_lr=0.1,
    seed=5,
    eval_every=3,
    checkpoint_every=1,
    root_output_dir=str(tmp_path / "runs"),
    experiment_name=name,
    progress=False,
    **settings,
  )
  return run_experiment(config, on_round=on_round)


@pytest.fixture
def temporary(tmp_path, monkeypatch):
  """The system's temporary directory, for this test alone."""
  directory = tmp_path / "tmp"
  directory.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(directory))
  return directory


def _client_dirs(root):
  return [d for d in os.listdir(root) if d.startswith("tff_hetero_clients_")]


def test_files_give_the_weights_sending_gives_and_are_removed(
  tmp_path, temporary
):
  during = []

  def files_now(round_num, row):
    del row
    (directory,) = _client_dirs(temporary)
    during.append((round_num, sorted(os.listdir(temporary / directory))))

  files = _run(tmp_path, "files", on_round=files_now, client_data="files")
  sent = _run(tmp_path, "sent")
  # Every round trained all four clients, each with its two files.
  expected = sorted(f"{i}.{s}" for i in range(4) for s in "xy")
  assert during == [(r, expected) for r in (1, 2, 3)]
  assert _client_dirs(temporary) == []
  for a, b in zip(files.final_weights.trainable, sent.final_weights.trainable):
    np.testing.assert_array_equal(a, b)
  # Training moved them: not two copies of the initial weights.
  first = files.report["history"][0]["loss"]
  assert files.report["history"][-1]["loss"] < first


def test_an_interrupted_run_removes_its_files(tmp_path, temporary):
  def stop(round_num, row):
    del row
    assert _client_dirs(temporary)
    if round_num == 2:
      raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    _run(tmp_path, "stopped", on_round=stop, client_data="files")
  assert _client_dirs(temporary) == []
  checkpoints = tmp_path / "runs" / "stopped" / "checkpoints"
  assert os.listdir(checkpoints)  # Round 1's, for --resume.


def test_unreadable_files_fail_the_round_in_one_line(tmp_path, temporary):
  def lose_files(round_num, row):
    del row
    if round_num == 1:
      (directory,) = _client_dirs(temporary)
      for name in os.listdir(temporary / directory):
        os.remove(temporary / directory / name)

  with pytest.raises(UsageError) as raised:
    _run(tmp_path, "unread", on_round=lose_files, client_data="files")
  message = str(raised.value)
  assert message.startswith("--client_data_dir: round 2 failed: a worker")
  assert "\n" not in message
  assert _client_dirs(temporary) == []
  assert os.listdir(tmp_path / "runs" / "unread" / "checkpoints")
