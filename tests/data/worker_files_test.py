"""Tests for `tff_hetero.data.worker_files`: client arrays the worker reads.

The expected batches are cut by hand in NumPy from the orders NumPy draws
from the seed (`default_rng(seed).permutation(n)` per epoch), not from the
code under test. One test sends a stored dataset to a real TFF worker.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_hetero import runtime
from tff_hetero.data import ArrayDataset
from tff_hetero.data import ClientFiles
from tff_hetero.data import DataError
from tff_hetero.data import StoredArrays
from tff_hetero.data import TextArrayDataset
from tff_hetero.data import make_client_dataset
from tff_hetero.runtime import testing as proc_testing

tf = pytest.importorskip("tensorflow")


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


def test_store_writes_once_and_close_removes_everything(tmp_path):
  arrays = _images(6)
  files = ClientFiles(str(tmp_path))
  first = files.store("a", arrays)
  assert isinstance(first, StoredArrays)
  assert len(first) == 6 and first.input_shape == (3, 3, 1)
  np.testing.assert_array_equal(first.x, arrays.x)
  with open(first.x_path, "rb") as f:
    np.testing.assert_array_equal(
      tf.io.parse_tensor(f.read(), tf.float32).numpy(), arrays.x
    )
  written = os.stat(first.x_path).st_mtime_ns
  again = files.store("a", _images(6, seed=1))  # Same spec and length.
  assert (again.x_path, again.y_path) == (first.x_path, first.y_path)
  assert os.stat(first.x_path).st_mtime_ns == written
  other = files.store("b", arrays)
  assert other.x_path != first.x_path
  with pytest.raises(DataError, match="client 'a' was stored with 6 samples"):
    files.store("a", _images(5))
  directory = files.directory
  assert os.path.dirname(directory) == str(tmp_path)
  files.close()
  assert not os.path.exists(directory) and os.listdir(tmp_path) == []
  with pytest.raises(DataError, match="were closed"):
    first.dataset(np.arange(6), 2)
  with pytest.raises(DataError, match="were closed"):
    files.store("c", arrays)
  files.close()  # Idempotent.


def test_bad_input_is_a_data_error(tmp_path):
  with pytest.raises(DataError, match="is not a directory"):
    ClientFiles(str(tmp_path / "missing"))
  with ClientFiles(str(tmp_path)) as files:
    stored = files.store("a", _images(6))
    with pytest.raises(DataError, match="is not 4 equal passes"):
      stored.dataset(np.arange(6), 2, passes=4)


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


def test_a_tff_worker_reads_the_files(tmp_path):
  """A real TFF worker iterates the stored dataset: the sum of the labels it
  trained on, order by order, is the one NumPy computes."""
  arrays = _images(30)
  with ClientFiles(str(tmp_path)) as files:
    datasets = [
      make_client_dataset(
        files.store(f"c{i}", arrays),
        batch_size=4,
        local_epochs=2,
        shuffle_seed=i,
      )
      for i in range(2)
    ]
    element = tff.types.tensorflow_to_type(datasets[0].element_spec)

    @tff.tensorflow.computation(tff.SequenceType(element))
    def weighted_labels(dataset):
      def add(total, batch):
        positions = tf.range(1, tf.size(batch["y"]) + 1)
        step = total[1] + 1
        value = tf.reduce_sum(positions * batch["y"]) * step
        return total[0] + value, step

      return dataset.reduce((0, 0), add)[0]

    @tff.federated_computation(
      tff.FederatedType(tff.SequenceType(element), tff.CLIENTS)
    )
    def on_clients(client_data):
      return tff.federated_map(weighted_labels, client_data)

    with runtime.local_execution():
      got = on_clients(datasets)
  expected = []
  for i in range(2):
    batches = _expected(arrays, 4, 2, i, aligned=False)
    expected.append(
      sum(
        int(np.sum(np.arange(1, len(y) + 1) * y)) * (k + 1)
        for k, (_, y) in enumerate(batches)
      )
    )
  assert list(got) == expected
  proc_testing.assert_no_workers_left()
