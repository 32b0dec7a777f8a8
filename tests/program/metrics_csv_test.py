"""AppendingCSVReleaseManager: TFF's CSV manager as the oracle, torn lines."""

import asyncio
import collections

import numpy as np
import tensorflow_federated as tff

from tff_hetero.program import outputs

# Rounds 1-3, a new field at round 3 (an evaluation round), then a resume
# from round 2 (the checkpointed history ends at 1) with other values.
_RELEASES = (
  (1, collections.OrderedDict(loss=np.float32(0.5), bytes_up=10, acc="")),
  (2, collections.OrderedDict(loss=0.25, bytes_up=np.int64(20), acc="")),
  (3, collections.OrderedDict(loss=0.125, bytes_up=30, acc=0.75, f1=0.5)),
  (4, collections.OrderedDict(loss=0.0625, bytes_up=40, acc="", f1="")),
  (2, collections.OrderedDict(loss=0.3, bytes_up=21, acc="")),
  (3, collections.OrderedDict(loss=0.2, bytes_up=31, acc=0.7, f1=0.6)),
)


def _release_all(manager, releases):
  for key, value in releases:
    asyncio.run(manager.release(value, key=key))


def test_the_file_is_what_tffs_manager_writes(tmp_path):
  ours = outputs.AppendingCSVReleaseManager(
    str(tmp_path / "ours.csv"), key_fieldname="round"
  )
  theirs = tff.program.CSVFileReleaseManager(
    str(tmp_path / "tff.csv"),
    save_mode=tff.program.CSVSaveMode.WRITE,
    key_fieldname="round",
  )
  for count in range(1, len(_RELEASES) + 1):  # After every release.
    _release_all(ours, _RELEASES[count - 1 : count])
    _release_all(theirs, _RELEASES[count - 1 : count])
    assert (tmp_path / "ours.csv").read_bytes() == (
      tmp_path / "tff.csv"
    ).read_bytes(), count
  # By hand: the resume at round 2 dropped the old rows 2-4.
  assert (tmp_path / "ours.csv").read_text().splitlines() == [
    "round,acc,bytes_up,loss,f1",
    "1,,10,0.5,",
    "2,,21,0.3,",
    "3,0.7,31,0.2,0.6",
  ]


def test_a_reopened_file_continues_and_drops_a_torn_last_line(tmp_path):
  path = tmp_path / "metrics.csv"
  manager = outputs.AppendingCSVReleaseManager(str(path), "round")
  _release_all(manager, _RELEASES[:3])
  # A kill in the middle of appending round 4.
  with open(path, "a") as f:
    f.write("4,0.06")
  reopened = outputs.AppendingCSVReleaseManager(str(path), "round")
  assert path.read_text().splitlines()[-1] == "3,0.75,30,0.125,0.5"
  asyncio.run(
    reopened.release(collections.OrderedDict(loss=0.05, f1=0.25), key=4)
  )
  assert path.read_text().splitlines()[-2:] == [
    "3,0.75,30,0.125,0.5",
    "4,,,0.05,0.25",
  ]
