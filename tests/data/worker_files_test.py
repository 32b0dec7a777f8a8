"""Tests for `tff_hetero.data.worker_files`: client arrays the worker reads.

The expected batches are cut by hand in NumPy from the orders NumPy draws
from the seed (`default_rng(seed).permutation(n)` per epoch), not from the
code under test. One test sends a stored dataset to a real TFF worker.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.data import ArrayDataset
from tff_hetero.data import ClientFiles
from tff_hetero.data import DataError
from tff_hetero.data import StoredArrays
from tff_hetero.data import TextArrayDataset
from tff_hetero.data import make_client_dataset


def _images(n: int, seed: int = 0) -> ArrayDataset:
  rng = np.random.default_rng(seed)
  return ArrayDataset(
    x=rng.random((n, 3, 3, 1), dtype=np.float32),
    y=rng.integers(0, 10, n).astype(np.int32),
  )


def _expected(arrays, batch_size, epochs, seed, aligned):
  """The batches, cut by hand: each epoch a fresh NumPy permutation."""
  rng = np.random.default_rng(seed)
  passes = [rng.permutation(len(arrays)) for _ in range(epochs)]
  runs = passes if aligned else [np.concatenate(passes)]
  return [
    (arrays.x[run[i : i + batch_size]], arrays.y[run[i : i + batch_size]])
    for run in runs
    for i in range(0, len(run), batch_size)
  ]


def _assert_batches(dataset, expected):
  got = [(b["x"].numpy(), b["y"].numpy()) for b in dataset]
  assert len(got) == len(expected)
  for (x, y), (ex, ey) in zip(got, expected):
    np.testing.assert_array_equal(x, ex)
    np.testing.assert_array_equal(y, ey)


def _serialized(dataset) -> bytes:
  """The bytes TFF sends a worker for `dataset` (its `_serialize_dataset`)."""
  return tf.raw_ops.DatasetToGraphV2(
    input_dataset=tf.data.experimental.to_variant(dataset)
  ).numpy()


@pytest.mark.parametrize("aligned", [False, True])
def test_stored_dataset_yields_the_hand_cut_batches(tmp_path, aligned):
  arrays = _images(23)  # 5 does not divide 23: short last batches.
  with ClientFiles(str(tmp_path)) as files:
    stored = files.store("c0", arrays)
    dataset = make_client_dataset(
      stored,
      batch_size=5,
      local_epochs=3,
      shuffle_seed=7,
      epoch_aligned=aligned,
    )
    in_memory = make_client_dataset(
      arrays,
      batch_size=5,
      local_epochs=3,
      shuffle_seed=7,
      epoch_aligned=aligned,
    )
    assert dataset.element_spec == in_memory.element_spec
    _assert_batches(dataset, _expected(arrays, 5, 3, 7, aligned))


def test_text_arrays_and_unshuffled_order(tmp_path):
  x = np.arange(7 * 4, dtype=np.int32).reshape(7, 4)
  arrays = TextArrayDataset(x=x, y=np.linspace(0, 1, 7).astype(np.float32))
  with ClientFiles(str(tmp_path)) as files:
    dataset = make_client_dataset(
      files.store("t", arrays), batch_size=3, local_epochs=2, shuffle_seed=None
    )
    in_memory = make_client_dataset(
      arrays, batch_size=3, local_epochs=2, shuffle_seed=None
    )
    assert dataset.element_spec == in_memory.element_spec
    assert dataset.element_spec["x"] == tf.TensorSpec([None, 4], tf.int32)
    assert dataset.element_spec["y"] == tf.TensorSpec([None], tf.float32)
    order = [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6]
    _assert_batches(
      dataset,
      [(x[order[i : i + 3]], arrays.y[order[i : i + 3]]) for i in (0, 3, 6, 9)]
      + [(x[order[12:]], arrays.y[order[12:]])],
    )


def test_what_crosses_is_the_order_not_the_samples(tmp_path):
  small, large = _images(40), _images(400)
  with ClientFiles(str(tmp_path)) as files:
    sizes = {}
    for name, arrays in (("small", small), ("large", large)):
      dataset = make_client_dataset(
        files.store(name, arrays),
        batch_size=10,
        local_epochs=5,
        shuffle_seed=1,
      )
      sizes[name] = len(_serialized(dataset))
    message = _serialized(
      make_client_dataset(
        files.store("large", large),
        batch_size=10,
        local_epochs=5,
        shuffle_seed=1,
      )
    )
  # 5 epochs of 400 samples of 9 floats are 72,000 bytes in memory; the
  # message grows by 8 bytes per sample of the order (1,800 samples more).
  in_memory = len(
    _serialized(
      make_client_dataset(large, batch_size=10, local_epochs=5, shuffle_seed=1)
    )
  )
  assert in_memory > 5 * 400 * 9 * 4
  assert sizes["large"] - sizes["small"] == pytest.approx(8 * 1800, abs=64)
  assert sizes["large"] < in_memory / 3
  assert large.x[0].tobytes() not in message  # No sample in the message.


def test_files_are_written_by_the_first_dataset_then_reused(tmp_path):
  arrays = _images(6)
  files = ClientFiles(str(tmp_path))
  first = files.store("a", arrays)
  assert isinstance(first, StoredArrays)
  assert len(first) == 6 and first.input_shape == (3, 3, 1)
  np.testing.assert_array_equal(first.x, arrays.x)
  assert os.listdir(files.directory) == []  # Nothing until a dataset.
  first.dataset(np.arange(6), 4)
  assert sorted(os.listdir(files.directory)) == ["0.x", "0.y"]
  x_file = os.path.join(files.directory, "0.x")
  with open(x_file, "rb") as f:
    np.testing.assert_array_equal(
      tf.io.parse_tensor(f.read(), tf.float32).numpy(), arrays.x
    )
  inode = os.stat(x_file).st_ino
  # The same arrays again (a copy, as the program passes each round).
  again = files.store("a", arrays.subset(np.arange(6)))
  _assert_batches(
    again.dataset(np.array([5, 0, 3]), 2),
    [(arrays.x[[5, 0]], arrays.y[[5, 0]]), (arrays.x[[3]], arrays.y[[3]])],
  )
  assert os.stat(x_file).st_ino == inode
  files.store("b", arrays).dataset(np.arange(6), 4)
  assert sorted(os.listdir(files.directory)) == ["0.x", "0.y", "1.x", "1.y"]
  other = files.store("a", _images(6, seed=1))  # Same spec, other samples.
  with pytest.raises(DataError, match="client 'a' was stored with other"):
    other.dataset(np.arange(6), 2)
  directory = files.directory
  assert os.path.dirname(directory) == str(tmp_path)
  files.close()
  assert not os.path.exists(directory) and os.listdir(tmp_path) == []
  with pytest.raises(DataError, match="were closed"):
    first.dataset(np.arange(6), 2)
  with pytest.raises(DataError, match="were closed"):
    files.store("c", arrays)
  files.close()  # Idempotent.


def test_a_client_without_samples_has_no_batches(tmp_path):
  with ClientFiles(str(tmp_path)) as files:
    dataset = make_client_dataset(
      files.store("empty", _images(0)),
      batch_size=4,
      local_epochs=3,
      shuffle_seed=0,
    )
    assert list(dataset) == []


@pytest.mark.parametrize(
  "parent_mode, directory_mode, file_mode",
  [
    (0o750, 0o750, 0o640),
    (0o1777, 0o755, 0o644),  # Others may read, never write.
    (0o700, 0o700, 0o600),
  ],
)
def test_the_directory_is_absolute_and_read_as_far_as_the_parent(
  tmp_path, monkeypatch, parent_mode, directory_mode, file_mode
):
  parent = tmp_path / "shared"
  parent.mkdir()
  os.chmod(parent, parent_mode)
  monkeypatch.chdir(tmp_path)
  umask = os.umask(0o077)  # Files would be 0600 if left to the umask.
  try:
    with ClientFiles("shared") as files:
      assert os.path.isabs(files.directory)
      assert os.path.dirname(files.directory) == str(parent)
      files.store("a", _images(3)).dataset(np.arange(3), 2)
      assert stat.S_IMODE(os.stat(files.directory).st_mode) == directory_mode
      for name in ("0.x", "0.y"):
        path = os.path.join(files.directory, name)
        assert stat.S_IMODE(os.stat(path).st_mode) == file_mode
  finally:
    os.umask(umask)


def test_bad_input_is_a_data_error(tmp_path):
  with pytest.raises(DataError, match="is not a directory this process"):
    ClientFiles(str(tmp_path / "missing"))
  with ClientFiles(str(tmp_path)) as files:
    stored = files.store("a", _images(6))
    for args, message in (
      ((np.arange(6), 2, 4), "6 positions are not 4 equal passes"),
      ((np.arange(6), 2, 0), "passes must be >= 1"),
      ((np.arange(6), 0), "batch_size and passes must be >= 1"),
      ((np.array([0, 6]), 2), "outside the 6 samples"),
      ((np.array([-1, 0]), 2), "outside the 6 samples"),
      ((np.zeros((2, 3), np.int64), 2), "order must be 1-D integers"),
    ):
      with pytest.raises(DataError, match=message):
        stored.dataset(*args)


def test_augmented_batches_are_made_in_memory(tmp_path):
  arrays = _images(8)
  with ClientFiles(str(tmp_path)) as files:
    stored = files.store("a", arrays)
    kwargs = dict(
      batch_size=4, local_epochs=1, shuffle_seed=2, augment="crop_flip"
    )
    from_stored = [
      b["x"].numpy() for b in make_client_dataset(stored, **kwargs)
    ]
    expected = [b["x"].numpy() for b in make_client_dataset(arrays, **kwargs)]
  for got, want in zip(from_stored, expected, strict=True):
    np.testing.assert_array_equal(got, want)


def test_a_tff_worker_reads_the_files(tmp_path, tff_context):
  """A real TFF worker iterates stored datasets: per client, a sum over its
  batches of what the batches hold, equal to the one NumPy computes from
  the hand-cut batches (epoch-aligned for the second client)."""
  del tff_context
  arrays = _images(30)
  with ClientFiles(str(tmp_path)) as files:
    datasets = [
      make_client_dataset(
        files.store(f"c{i}", arrays),
        batch_size=4,
        local_epochs=2,
        shuffle_seed=i,
        epoch_aligned=i == 1,
      )
      for i in range(2)
    ]
    element = tff.types.tensorflow_to_type(datasets[0].element_spec)

    @tff.tensorflow.computation(tff.SequenceType(element))
    def batch_sums(dataset):
      def add(total, batch):
        step = total[1] + 1.0
        positions = tf.cast(tf.range(1, tf.size(batch["y"]) + 1), tf.float32)
        value = tf.reduce_sum(positions * tf.cast(batch["y"], tf.float32))
        value += tf.reduce_sum(batch["x"]) * 1000.0
        return total[0] + value * step, step

      return dataset.reduce((0.0, 0.0), add)[0]

    @tff.federated_computation(
      tff.FederatedType(tff.SequenceType(element), tff.CLIENTS)
    )
    def on_clients(client_data):
      return tff.federated_map(batch_sums, client_data)

    got = on_clients(datasets)
    # The worker read the files: without one of them the same call fails.
    os.remove(os.path.join(files.directory, "1.x"))
    with pytest.raises(Exception, match="1.x"):
      on_clients(datasets)
  expected = []
  for i in range(2):
    batches = _expected(arrays, 4, 2, i, aligned=i == 1)
    expected.append(
      sum(
        (np.sum(np.arange(1, len(y) + 1) * y) + np.sum(x) * 1000.0) * (k + 1)
        for k, (x, y) in enumerate(batches)
      )
    )
  np.testing.assert_allclose(got, expected, rtol=1e-5)
