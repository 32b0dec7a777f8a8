"""Tests for the tf.data / TFF views: `make_client_dataset`, `to_client_data`.

No federated computation is run: datasets are only built and iterated.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from tff_hetero.data import ArrayDataset
from tff_hetero.data import DataError
from tff_hetero.data import build_federated_data
from tff_hetero.data import load_dataset
from tff_hetero.data import make_client_dataset
from tff_hetero.data import make_indexed_client_dataset

tf = pytest.importorskip("tensorflow")


def _arrays(n: int) -> ArrayDataset:
  x = np.arange(n * 4, dtype=np.float32).reshape(n, 2, 2, 1) / (n * 4)
  return ArrayDataset(x=x, y=np.arange(n, dtype=np.int32))


def _batches(arrays: ArrayDataset, **kwargs) -> list[list[int]]:
  """The labels of each batch of `make_client_dataset(arrays, **kwargs)`."""
  dataset = make_client_dataset(arrays, **kwargs)
  return [batch["y"].numpy().tolist() for batch in dataset]


def test_element_structure():
  dataset = make_client_dataset(
    _arrays(5), batch_size=2, local_epochs=1, shuffle_seed=0
  )
  spec = dataset.element_spec
  assert isinstance(spec, collections.OrderedDict) and list(spec) == ["x", "y"]
  assert spec["x"] == tf.TensorSpec([None, 2, 2, 1], tf.float32)
  assert spec["y"] == tf.TensorSpec([None], tf.int32)
  assert isinstance(next(iter(dataset)), collections.OrderedDict)


@pytest.mark.parametrize(
  ("n", "batch_size", "epochs"), [(10, 3, 1), (10, 3, 3), (7, 16, 2)]
)
def test_examples_times_epochs(n, batch_size, epochs):
  batches = _batches(
    _arrays(n), batch_size=batch_size, local_epochs=epochs, shuffle_seed=1
  )
  labels = [y for batch in batches for y in batch]
  assert len(labels) == n * epochs
  assert len(batches) == -(-n * epochs // batch_size)  # No drop_remainder.
  for epoch in range(epochs):  # Every epoch is a permutation of the data.
    assert sorted(labels[epoch * n : (epoch + 1) * n]) == list(range(n))


def test_seeded_shuffle_is_deterministic_and_reshuffles_each_epoch():
  def epochs(seed: int) -> list[list[int]]:
    return _batches(
      _arrays(50), batch_size=50, local_epochs=2, shuffle_seed=seed
    )

  first = epochs(7)
  assert epochs(7) == first
  assert epochs(8) != first
  assert first[0] != first[1]  # A new order in the second epoch.
  assert first[0] != list(range(50))
  # TensorFlow's global seed plays no part: a run is the same in any process.
  tf.random.set_seed(123)
  try:
    assert epochs(7) == first
  finally:
    tf.random.set_seed(None)


def test_no_seed_means_index_order():
  batches = _batches(
    _arrays(5), batch_size=2, local_epochs=2, shuffle_seed=None
  )
  assert batches == [[0, 1], [2, 3], [4, 0], [1, 2], [3, 4]]


def test_images_follow_their_labels():
  arrays = _arrays(9)
  dataset = make_client_dataset(
    arrays, batch_size=4, local_epochs=1, shuffle_seed=3
  )
  for batch in dataset:
    expected = arrays.x[batch["y"].numpy()]
    np.testing.assert_array_equal(batch["x"].numpy(), expected)


@pytest.mark.parametrize(
  "kwargs",
  [
    {},
    {"epoch_aligned": True, "local_epochs": 3},
    {"augment": "crop"},
  ],
)
def test_client_datasets_hold_no_dataset_function(kwargs):
  # The program builds one dataset per sampled client per round in one
  # eager process; each `Dataset.map` (or filter, flat_map) it would hold
  # keeps native memory for the rest of the process.
  arguments = {"batch_size": 4, "local_epochs": 2, "shuffle_seed": 3, **kwargs}
  for dataset in (
    make_client_dataset(_arrays(9), **arguments),
    make_indexed_client_dataset(
      _arrays(9),
      batch_size=4,
      local_epochs=2,
      shuffle_seed=3,
      augment=kwargs.get("augment", "none"),
      batch_values={"flag": True},
      sample_rows={"row": np.eye(9, dtype=np.float32)},
    ),
  ):
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
    assert not graph.library.function
    assert "MapDataset" not in {node.op for node in graph.node}


def test_datasets_a_worker_receives_have_autotuning_off():
  # With autotuning on, each iterator's model thread could hold the TFF
  # worker idle for seconds when the iterator was destroyed
  # (tff_hetero/data/options.py). The option must survive TFF's own
  # serialization of a dataset argument, which is what a worker receives.
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executors import (
    value_serialization,
  )  # pylint: disable=g-import-not-at-top

  from tff_hetero.algorithms import cohort_positions  # pylint: disable=g-import-not-at-top

  plain = make_client_dataset(
    _arrays(9), batch_size=4, local_epochs=2, shuffle_seed=3
  )
  datasets = [
    plain,
    make_indexed_client_dataset(
      _arrays(9),
      batch_size=4,
      local_epochs=2,
      shuffle_seed=3,
      batch_values={"flag": True},
    ),
    cohort_positions.empty_dataset(plain.element_spec),
  ]
  # tf.data's default is on, so the check below can fail.
  assert tf.data.Dataset.range(3).options().autotune.enabled is not False
  for dataset in datasets:
    proto, _ = value_serialization.serialize_value(
      dataset,
      tff.SequenceType(tff.types.tensorflow_to_type(dataset.element_spec)),
    )
    received, _ = value_serialization.deserialize_value(proto)
    assert received.options().autotune.enabled is False
    assert len(list(received)) == len(list(dataset))


@pytest.mark.parametrize(
  ("kwargs", "flag"),
  [
    ({"batch_size": 0}, "--batch_size"),
    ({"local_epochs": 0}, "--local_epochs"),
    ({"shuffle_seed": -1}, "shuffle_seed"),
  ],
)
def test_bad_arguments(kwargs, flag):
  arguments = {"batch_size": 2, "local_epochs": 1, "shuffle_seed": 0, **kwargs}
  with pytest.raises(DataError) as error:
    make_client_dataset(_arrays(3), **arguments)
  assert flag in str(error.value) and "\n" not in str(error.value)


def test_to_client_data():
  tff = pytest.importorskip("tensorflow_federated")
  data = build_federated_data(
    load_dataset("synthetic", seed=0),
    num_clients=4,
    method="shards",
    seed=2,
    val_fraction=0.1,
  )
  client_data = data.to_client_data()
  assert isinstance(client_data, tff.simulation.datasets.ClientData)
  assert list(client_data.client_ids) == list(data.client_ids)
  assert client_data.element_type_structure == collections.OrderedDict(
    x=tf.TensorSpec([8, 8, 1], tf.float32), y=tf.TensorSpec([], tf.int32)
  )

  @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
  def traced_summary(client_id):
    """(count, label sum, pixel sum) of a client's dataset, built in a graph."""
    dataset = client_data.serializable_dataset_fn(client_id)
    zero = (
      tf.constant(0, tf.int64),
      tf.constant(0, tf.int64),
      tf.constant(0.0, tf.float64),
    )
    return dataset.reduce(
      zero,
      lambda s, e: (
        s[0] + 1,
        s[1] + tf.cast(e["y"], tf.int64),
        s[2] + tf.reduce_sum(tf.cast(e["x"], tf.float64)),
      ),
    )

  for cid in data.client_ids:
    expected = data.client_train(cid)
    elements = list(client_data.create_tf_dataset_for_client(cid))
    assert len(elements) == len(expected) == data.num_train_examples(cid)
    np.testing.assert_array_equal(
      np.stack([e["x"].numpy() for e in elements]), expected.x
    )
    np.testing.assert_array_equal(
      [e["y"].numpy() for e in elements], expected.y
    )
    # The graph path (used by `dataset_computation`) selects the same rows.
    count, label_sum, pixel_sum = traced_summary(tf.constant(cid))
    assert int(count) == len(expected)
    assert int(label_sum) == int(expected.y.astype(np.int64).sum())
    pixels = float(expected.x.astype(np.float64).sum())
    assert float(pixel_sum) == pytest.approx(pixels)

  validation = data.to_client_data("validation")
  cid = data.client_ids[0]
  elements = list(validation.create_tf_dataset_for_client(cid))
  assert len(elements) == len(data.client_validation(cid)) > 0
