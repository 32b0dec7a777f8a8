"""CompiledTensorBoardReleaseManager: TFF's TensorBoard manager as the oracle."""

import asyncio
import collections
import glob

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.program import outputs

# Python and NumPy numbers of every kind the program releases, a name with
# a slash, a round with a value more (an evaluation), an array (a
# histogram) and a string (skipped by both).
_RELEASES = (
  (1, collections.OrderedDict(loss=np.float32(0.5), bytes_up=10, ok=True)),
  (
    2,
    collections.OrderedDict(
      loss=0.25, bytes_up=np.int64(3_000_000_017), ok=np.bool_(False)
    ),
  ),
  (
    3,
    collections.OrderedDict(
      [
        ("loss", 0.125),
        ("bytes_up", 30),
        ("ok", True),
        ("eval/accuracy", np.float64(0.7)),
        ("_private", 1.5),
        ("-dash", np.int32(-2)),
        ("/root", 2.5),
        ("per_class", np.array([1.0, 2.0, 2.0])),
        ("note", "skipped"),
        ("nested", collections.OrderedDict(b=[1.0, 2.0], a=np.int64(4))),
      ]
    ),
  ),
)


def _events(directory):
  """(step, tag, plugin, dtype, value) of every summary under `directory`."""
  found = []
  for path in sorted(glob.glob(f"{directory}/events.out.tfevents.*")):
    for record in tf.data.TFRecordDataset(path):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for value in event.summary.value:
        array = tf.make_ndarray(value.tensor)
        found.append(
          (
            event.step,
            value.tag,
            value.metadata.plugin_data.plugin_name,
            array.dtype.name,
            array.tolist(),
          )
        )
  return sorted(found)


def test_the_events_are_what_tffs_manager_writes(tmp_path):
  ours = outputs.CompiledTensorBoardReleaseManager(str(tmp_path / "ours"))
  theirs = tff.program.TensorBoardReleaseManager(str(tmp_path / "tff"))
  for key, value in _RELEASES:
    asyncio.run(ours.release(value, key=key))
    asyncio.run(theirs.release(value, key=key))
  ours.flush()
  theirs._summary_writer.flush()  # pylint: disable=protected-access
  expected = _events(tmp_path / "tff")
  assert _events(tmp_path / "ours") == expected
  # By hand: 3 + 3 + 11 summaries (the string skipped, the nested value
  # three), float32 scalars (3,000,000,017 rounded to float32), one
  # histogram.
  assert len(expected) == 17
  scalars = {(s, t): v for s, t, p, _, v in expected if p == "scalars"}
  assert scalars[(2, "bytes_up")] == 3_000_000_000.0
  assert scalars[(3, "eval/accuracy")] == np.float32(0.7)
  assert scalars[(2, "ok")] == 0.0
  assert scalars[(3, "-dash")] == -2.0
  assert scalars[(3, "nested/b/1")] == 2.0
  assert [t for _, t, p, _, _ in expected if p == "histograms"] == ["per_class"]


def test_one_traced_function_per_set_of_names(tmp_path):
  manager = outputs.CompiledTensorBoardReleaseManager(str(tmp_path))
  for key, value in _RELEASES * 2:
    asyncio.run(manager.release(value, key=key))
  functions = manager._functions  # pylint: disable=protected-access
  assert len(functions) == 2  # Rounds 1-2 and round 3 (one name more).
  for function in functions.values():
    assert function.experimental_get_tracing_count() == 1
