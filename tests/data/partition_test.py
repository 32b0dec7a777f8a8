"""Tests for `tff_hetero.data.partition`: partitioners and `FederatedData`."""

from __future__ import annotations

import numpy as np
import pytest

from tff_hetero.data import DIRICHLET_MAX_ATTEMPTS
from tff_hetero.data import PARTITIONERS
from tff_hetero.data import DataError
from tff_hetero.data import PartitionConfig
from tff_hetero.data import build_federated_data
from tff_hetero.data import load_dataset
from tff_hetero.data import partition_indices
from tff_hetero.data import split_train_validation

METHODS = sorted(PARTITIONERS)
# 4,000 labels, 400 per class, shuffled (like mnist5k's train split).
BALANCED = np.random.default_rng(123).permutation(np.repeat(np.arange(10), 400))
# Unequal class sizes: 10, 20, ..., 100 (550 samples).
UNEVEN = np.random.default_rng(5).permutation(
  np.repeat(np.arange(10), np.arange(1, 11) * 10)
)


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
  everything = np.concatenate(parts)
  assert everything.dtype == np.int64
  np.testing.assert_array_equal(np.sort(everything), np.arange(n))
  for part in parts:
    np.testing.assert_array_equal(part, np.sort(part))


def _mean_total_variation(labels: np.ndarray, parts: list[np.ndarray]) -> float:
  """Mean distance between client label distributions and the global one."""
  counts = np.stack([np.bincount(labels[p], minlength=10) for p in parts])
  per_client = counts / counts.sum(axis=1, keepdims=True)
  overall = np.bincount(labels, minlength=10) / len(labels)
  return float(0.5 * np.abs(per_client - overall).sum(axis=1).mean())


def test_registry():
  assert METHODS == ["dirichlet", "iid", "shards"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
  "labels", [BALANCED, UNEVEN], ids=["balanced", "uneven"]
)
def test_every_index_used_exactly_once(method, labels):
  parts = partition_indices(labels, 13, method, seed=0)
  assert len(parts) == 13
  _assert_exact_cover(parts, len(labels))


@pytest.mark.parametrize("method", METHODS)
def test_determinism(method):
  first = partition_indices(BALANCED, 20, method, seed=42)
  again = partition_indices(BALANCED, 20, method, seed=42)
  other = partition_indices(BALANCED, 20, method, seed=43)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(first, other))


def test_iid_sizes_are_exact():
  parts = partition_indices(np.zeros(1000, np.int64), 7, "iid", seed=1)
  # 1000 = 6 * 143 + 142.
  assert sorted(len(p) for p in parts) == [142] + [143] * 6
  iid = partition_indices(BALANCED, 10, "iid", seed=0)
  assert _mean_total_variation(BALANCED, iid) < 0.1


def test_shards_aligned_gives_at_most_shards_per_client_classes():
  # 20 shards of 200 samples; each class (400) is exactly two shards.
  parts = partition_indices(BALANCED, 10, "shards", seed=3, shards_per_client=2)
  assert [len(p) for p in parts] == [400] * 10
  for part in parts:
    counts = np.bincount(BALANCED[part], minlength=10)
    assert np.count_nonzero(counts) <= 2
    assert set(counts[counts > 0]) <= {200, 400}


@pytest.mark.parametrize("shards_per_client", [1, 2, 3])
def test_shards_unaligned_bound(shards_per_client):
  # Classes of 300, 310, ..., 390 samples: every class is larger than a
  # shard, but shard boundaries need not fall on class boundaries.
  class_sizes = 300 + 10 * np.arange(10)
  labels = np.random.default_rng(6).permutation(
    np.repeat(np.arange(10), class_sizes)
  )
  parts = partition_indices(
    labels, 10, "shards", seed=4, shards_per_client=shards_per_client
  )
  _assert_exact_cover(parts, len(labels))
  for part in parts:
    assert len(np.unique(labels[part])) <= 2 * shards_per_client


def test_dirichlet_skew_grows_as_alpha_shrinks():
  def skew(alpha: float) -> float:
    return float(
      np.mean(
        [
          _mean_total_variation(
            BALANCED,
            partition_indices(
              BALANCED, 20, "dirichlet", seed=seed, alpha=alpha
            ),
          )
          for seed in range(3)
        ]
      )
    )

  small, medium, large = skew(0.1), skew(1.0), skew(100.0)
  assert small > medium > large
  assert small > 0.6  # Clients dominated by a few classes.
  assert large < 0.1  # Close to iid.


def test_dirichlet_respects_min_samples():
  parts = partition_indices(
    BALANCED, 50, "dirichlet", seed=0, alpha=0.1, min_samples_per_client=10
  )
  assert min(len(p) for p in parts) >= 10
  _assert_exact_cover(parts, len(BALANCED))


def test_dirichlet_gives_up_after_bounded_attempts():
  with pytest.raises(DataError) as error:
    partition_indices(
      BALANCED,
      100,
      "dirichlet",
      seed=0,
      alpha=0.001,
      min_samples_per_client=30,
    )
  message = str(error.value)
  assert "\n" not in message
  assert "--alpha=0.001" in message and "--num_clients=100" in message
  assert f"{DIRICHLET_MAX_ATTEMPTS}" in message


def test_too_few_samples_for_min_samples():
  with pytest.raises(DataError) as error:
    partition_indices(BALANCED, 100, "iid", seed=0, min_samples_per_client=50)
  assert str(error.value) == (
    "--num_clients=100 with --min_samples_per_client=50 needs at least "
    "5000 samples, data set has 4000"
  )


@pytest.mark.parametrize(
  ("kwargs", "fragments"),
  [
    ({"num_clients": 0}, ["--num_clients", "0"]),
    ({"num_clients": -3}, ["--num_clients", "-3"]),
    ({"num_clients": 2.5}, ["--num_clients", "2.5"]),
    ({"num_clients": True}, ["--num_clients", "True"]),
    (
      {"method": "pathological"},
      ["--partition", "'pathological'", "dirichlet, iid, shards"],
    ),
    ({"alpha": 0}, ["--alpha", "0"]),
    ({"alpha": -1.0}, ["--alpha", "-1.0"]),
    ({"alpha": float("nan")}, ["--alpha", "nan"]),
    ({"alpha": float("inf")}, ["--alpha", "inf"]),
    ({"shards_per_client": 0}, ["--shards_per_client", "0"]),
    ({"min_samples_per_client": -1}, ["--min_samples_per_client", "-1"]),
    ({"seed": -5}, ["--seed", "-5"]),
    (
      {
        "method": "shards",
        "num_clients": 300,
        "shards_per_client": 20,
        "min_samples_per_client": 0,
      },
      ["--num_clients * --shards_per_client", "6000", "4000"],
    ),
    ({"labels": BALANCED.reshape(40, 100)}, ["1-D integer", "(40, 100)"]),
    ({"labels": BALANCED.astype(np.float32)}, ["1-D integer", "float32"]),
    ({"labels": BALANCED - 1}, ["labels must be >= 0", "-1"]),
  ],
)
def test_bad_arguments_are_one_line_errors(kwargs, fragments):
  arguments = {
    "labels": BALANCED,
    "num_clients": 10,
    "method": "dirichlet",
    "seed": 0,
    **kwargs,
  }
  labels = arguments.pop("labels")
  num_clients = arguments.pop("num_clients")
  method = arguments.pop("method")
  with pytest.raises(DataError) as error:
    partition_indices(labels, num_clients, method, **arguments)
  message = str(error.value)
  assert "\n" not in message
  for fragment in fragments:
    assert fragment in message, (fragment, message)


def test_split_train_validation():
  indices = np.arange(100, 110)
  train, val = split_train_validation(indices, 0.25, seed=9)
  assert (len(train), len(val)) == (8, 2)  # floor(0.25 * 10) = 2.
  np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), indices)
  again_train, again_val = split_train_validation(indices, 0.25, seed=9)
  np.testing.assert_array_equal(train, again_train)
  np.testing.assert_array_equal(val, again_val)
  train, val = split_train_validation(indices, 0.0, seed=9)
  assert len(val) == 0 and val.dtype == np.int64
  np.testing.assert_array_equal(train, indices)
  for bad in (1.0, -0.1, 2):
    with pytest.raises(DataError, match="--val_fraction"):
      split_train_validation(indices, bad, seed=0)


@pytest.fixture(scope="module")
def synthetic():
  return load_dataset("synthetic", seed=0)


def test_build_federated_data(synthetic):
  arguments = dict(
    num_clients=8,
    method="dirichlet",
    seed=1,
    alpha=0.3,
    min_samples_per_client=10,
    val_fraction=0.2,
  )
  data = build_federated_data(synthetic, **arguments)
  assert data.client_ids == tuple(f"client_000{i}" for i in range(8))
  assert data.num_clients == 8
  assert data.config == PartitionConfig(shards_per_client=2, **arguments)
  assert data.test is synthetic.test
  parts = [
    np.sort(np.concatenate([c.train_indices, c.val_indices]))
    for c in data.clients
  ]
  _assert_exact_cover(parts, len(synthetic.train))
  counts = data.label_counts()
  val_counts = data.label_counts("validation")
  assert list(counts) == list(data.client_ids)
  for client, part in zip(data.clients, parts):
    cid = client.client_id
    assert len(part) >= 10
    assert len(client.val_indices) == int(0.2 * len(part))
    train = data.client_train(cid)
    assert data.num_train_examples(cid) == len(train)
    np.testing.assert_array_equal(
      train.x, synthetic.train.x[client.train_indices]
    )
    np.testing.assert_array_equal(
      train.y, synthetic.train.y[client.train_indices]
    )
    assert counts[cid] == np.bincount(train.y, minlength=10).tolist()
    assert sum(val_counts[cid]) == len(data.client_validation(cid))
  again = build_federated_data(synthetic, **arguments)
  assert again.label_counts("validation") == val_counts


def test_federated_data_without_validation(synthetic):
  data = build_federated_data(synthetic, num_clients=6, method="iid", seed=0)
  assert all(len(data.client_validation(c)) == 0 for c in data.client_ids)
  assert sum(data.num_train_examples(c) for c in data.client_ids) == 600
  with pytest.raises(DataError) as error:
    data.client_train("client_0099")
  message = str(error.value)
  assert "'client_0099'" in message and "client_0005" in message
  with pytest.raises(DataError, match="split"):
    data.label_counts("test")
