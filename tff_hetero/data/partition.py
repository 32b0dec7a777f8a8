"""Partitioning a centralised training split into simulated federated clients.

`partition_indices` splits the indices of a label array among clients with a
registered method (`PARTITIONERS`):

* ``iid`` -- a seeded random permutation cut into `num_clients` nearly equal
  parts (sizes differ by at most one). Every sample is used exactly once.
* ``dirichlet`` -- label skew after Hsu et al. (2019): for every class, draw
  client proportions p ~ Dirichlet(alpha * 1) and hand the class's (shuffled)
  samples out in those proportions (client j gets floor(n_c * P_j) -
  floor(n_c * P_{j-1}) samples, P the cumulative proportions). Every sample is
  used exactly once. Small `alpha` gives clients few dominant classes, large
  `alpha` approaches iid. If some client ends up with fewer than
  `min_samples_per_client` samples the proportions are redrawn from the same
  random stream, up to `DIRICHLET_MAX_ATTEMPTS` (1,000) times, so the result
  is still a function of the seed; if every draw fails a `DataError` suggests
  a larger ``--alpha``. (With 4,000 samples and 100 clients, alpha=0.05
  fails even for one sample per client; alpha=0.1 succeeds.)
* ``shards`` -- the pathological non-iid split of the FedAvg paper (McMahan et
  al., 2017): sort the samples by label (ties in seeded random order), cut them
  into `num_clients * shards_per_client` contiguous shards of nearly equal
  size and deal each client `shards_per_client` random shards. Every sample is
  used exactly once. A shard holds consecutive labels: when class sizes are
  multiples of the shard size each client sees at most `shards_per_client`
  classes; otherwise shards straddle class boundaries (a shard spans at most
  two classes if no class is smaller than a shard, so a client at most
  2 * `shards_per_client`; classes smaller than a shard make more).

Client index arrays are sorted ascending and int64.

`build_federated_data` partitions a `DatasetSplits` train split, then splits
each client's samples into local train / validation parts, giving a
`FederatedData`: per-client `ArrayDataset`s, label histograms for reports, and
a TFF `ClientData` view. `make_client_dataset` turns a client's arrays into
the batched ``OrderedDict(x=..., y=...)`` `tf.data.Dataset` that TFF client
computations consume.

TensorFlow and TensorFlow Federated are imported lazily, so partitioning and
flag validation stay fast and NumPy-only.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING
from typing import Literal
from typing import Protocol

import attrs
import numpy as np

from tff_hetero.data import _checks
from tff_hetero.data import augment as augment_lib
from tff_hetero.data import worker_files
from tff_hetero.data.datasets import ArrayDataset
from tff_hetero.data.datasets import DatasetSplits
from tff_hetero.data.options import without_autotune
from tff_hetero.errors import DataError

if TYPE_CHECKING:
  import tensorflow as tf
  import tensorflow_federated as tff

__all__ = [
  "DIRICHLET_MAX_ATTEMPTS",
  "PARTITIONERS",
  "ClientSplit",
  "FederatedData",
  "PartitionConfig",
  "PartitionOptions",
  "Partitioner",
  "build_federated_data",
  "client_id_for",
  "make_client_dataset",
  "partition_indices",
  "split_train_validation",
]

DIRICHLET_MAX_ATTEMPTS = 1000
"""How many times `dirichlet` draws proportions to meet the minimum size."""


def _alpha(value: object) -> float:
  return _checks.check_positive_float("--alpha", value)


def _shards_per_client(value: object) -> int:
  return _checks.check_int("--shards_per_client", value, minimum=1)


def _min_samples_per_client(value: object) -> int:
  return _checks.check_int("--min_samples_per_client", value, minimum=0)


@attrs.frozen
class PartitionOptions:
  """Method-specific knobs of `partition_indices` (validated on creation).

  Attributes:
    alpha: Dirichlet concentration (``dirichlet``), > 0.
    shards_per_client: shards dealt to each client (``shards``), >= 1.
    min_samples_per_client: every client must get at least this many
      samples (all methods), >= 0.
  """

  alpha: float = attrs.field(default=0.5, converter=_alpha)
  shards_per_client: int = attrs.field(default=2, converter=_shards_per_client)
  min_samples_per_client: int = attrs.field(
    default=1, converter=_min_samples_per_client
  )


class Partitioner(Protocol):
  """Splits `range(len(labels))` into `num_clients` disjoint index arrays.

  Called by `partition_indices` after the common checks (valid labels,
  `num_clients >= 1`, `num_clients * min_samples_per_client <= len(labels)`).
  Must draw all randomness from `rng`.
  """

  def __call__(
    self,
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    options: PartitionOptions,
  ) -> list[np.ndarray]: ...


def _partition_iid(
  labels: np.ndarray,
  num_clients: int,
  rng: np.random.Generator,
  options: PartitionOptions,
) -> list[np.ndarray]:
  del options  # Unused.
  return np.array_split(rng.permutation(len(labels)), num_clients)


def _dirichlet_counts(
  class_sizes: np.ndarray,
  num_clients: int,
  alpha: float,
  rng: np.random.Generator,
) -> np.ndarray | None:
  """Draws a [num_classes, num_clients] matrix of per-client class counts."""
  proportions = rng.dirichlet(
    np.full(num_clients, alpha), size=len(class_sizes)
  )
  if not np.all(np.isfinite(proportions)):
    return None
  sizes = class_sizes[:, None]
  bounds = np.floor(np.cumsum(proportions, axis=1) * sizes).astype(np.int64)
  bounds[:, -1] = class_sizes
  bounds = np.minimum(bounds, sizes)  # Guards against round-off above 1.
  return np.diff(bounds, axis=1, prepend=0)


def _partition_dirichlet(
  labels: np.ndarray,
  num_clients: int,
  rng: np.random.Generator,
  options: PartitionOptions,
) -> list[np.ndarray]:
  classes = np.unique(labels)
  members = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
  class_sizes = np.array([len(m) for m in members], dtype=np.int64)
  minimum = options.min_samples_per_client
  for _ in range(DIRICHLET_MAX_ATTEMPTS):
    counts = _dirichlet_counts(class_sizes, num_clients, options.alpha, rng)
    if counts is not None and counts.sum(axis=0).min() >= minimum:
      break
  else:
    raise DataError(
      f"--partition=dirichlet with --alpha={options.alpha:g} and "
      f"--num_clients={num_clients} left some client with fewer than "
      f"--min_samples_per_client={minimum} samples in all "
      f"{DIRICHLET_MAX_ATTEMPTS} draws; raise --alpha or lower "
      f"--num_clients or --min_samples_per_client"
    )
  pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for class_members, class_counts in zip(members, counts):
    cuts = np.cumsum(class_counts)[:-1]
    for client, piece in enumerate(np.split(class_members, cuts)):
      pieces[client].append(piece)
  return [np.concatenate(p) for p in pieces]


def _partition_shards(
  labels: np.ndarray,
  num_clients: int,
  rng: np.random.Generator,
  options: PartitionOptions,
) -> list[np.ndarray]:
  per_client = options.shards_per_client
  num_shards = num_clients * per_client
  if num_shards > len(labels):
    raise DataError(
      f"--partition=shards needs --num_clients * --shards_per_client = "
      f"{num_clients} * {per_client} = {num_shards} <= number of samples, "
      f"data set has {len(labels)}"
    )
  # A random permutation first, then a stable sort by label: within a class
  # the order is random, so shards are random subsets of their classes.
  shuffled = rng.permutation(len(labels))
  by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
  shards = np.array_split(by_label, num_shards)
  dealt = rng.permutation(num_shards).reshape(num_clients, per_client)
  return [np.concatenate([shards[s] for s in client]) for client in dealt]


PARTITIONERS: Mapping[str, Partitioner] = MappingProxyType(
  {
    "iid": _partition_iid,
    "dirichlet": _partition_dirichlet,
    "shards": _partition_shards,
  }
)
"""Registered partitioning methods: name -> `Partitioner` (see module doc)."""


def partition_indices(
  labels: np.ndarray,
  num_clients: int,
  method: str,
  *,
  seed: int,
  alpha: float = 0.5,
  shards_per_client: int = 2,
  min_samples_per_client: int = 1,
) -> list[np.ndarray]:
  """Splits sample indices among `num_clients` clients.

  Args:
    labels: integer class labels, shape [N], values >= 0.
    num_clients: number of clients, >= 1.
    method: a key of `PARTITIONERS` (``iid``, ``dirichlet``, ``shards``).
    seed: seeds `numpy.random.default_rng`; the result is a function of the
      arguments.
    alpha: Dirichlet concentration for ``dirichlet`` (> 0; smaller is more
      skewed).
    shards_per_client: shards per client for ``shards`` (>= 1).
    min_samples_per_client: minimum samples per client (>= 0).

  Returns:
    `num_clients` sorted int64 index arrays into `labels`; disjoint, and
    together covering every index exactly once.

  Raises:
    DataError: (one line) bad argument values, or a partition that cannot
      meet `min_samples_per_client`.
  """
  method = _checks.check_choice("--partition", method, PARTITIONERS)
  num_clients = _checks.check_int("--num_clients", num_clients, minimum=1)
  seed = _checks.check_seed(seed)
  options = PartitionOptions(
    alpha=alpha,
    shards_per_client=shards_per_client,
    min_samples_per_client=min_samples_per_client,
  )
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise DataError(
      f"labels must be a 1-D integer array, got {labels.dtype} with shape "
      f"{labels.shape}"
    )
  if len(labels) and labels.min() < 0:
    raise DataError(f"labels must be >= 0, got {labels.min()}")
  minimum = options.min_samples_per_client
  needed = max(num_clients * minimum, 1)
  if needed > len(labels):
    raise DataError(
      f"--num_clients={num_clients} with --min_samples_per_client={minimum} "
      f"needs at least {needed} samples, data set has {len(labels)}"
    )

  rng = np.random.default_rng(seed)
  parts = PARTITIONERS[method](labels, num_clients, rng, options)

  smallest = min(len(p) for p in parts)
  if smallest < minimum:
    raise DataError(
      f"--partition={method} with --num_clients={num_clients} gives some "
      f"client only {smallest} samples, below --min_samples_per_client="
      f"{minimum}; lower --num_clients"
    )
  return [np.sort(p).astype(np.int64) for p in parts]


def split_train_validation(
  indices: np.ndarray, val_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """Splits one client's sample indices into (train, validation) parts.

  The validation part holds floor(val_fraction * len(indices)) indices
  chosen at random with `seed`; ``val_fraction=0`` gives an empty one. Both
  parts are sorted int64 arrays.

  Raises:
    DataError: `val_fraction` outside [0, 1) or a bad `seed`.
  """
  val_fraction = _checks.check_fraction("--val_fraction", val_fraction)
  seed = _checks.check_seed(seed)
  indices = np.asarray(indices, dtype=np.int64)
  num_val = int(np.floor(val_fraction * len(indices)))
  shuffled = np.random.default_rng(seed).permutation(indices)
  return np.sort(shuffled[num_val:]), np.sort(shuffled[:num_val])


def client_id_for(index: int) -> str:
  """The id of the `index`-th client: ``client_0000``, ``client_0001``, ..."""
  return f"client_{index:04d}"


def _index_array(array: np.ndarray) -> np.ndarray:
  return _checks.read_only_view(np.asarray(array, dtype=np.int64))


@attrs.frozen(eq=False)
class ClientSplit:
  """One client's samples, as indices into the source train split.

  Attributes:
    client_id: e.g. ``"client_0003"``.
    train_indices: sorted int64 indices of the client's local train samples.
    val_indices: sorted int64 indices of its local validation samples
      (possibly empty).
  """

  client_id: str
  train_indices: np.ndarray = attrs.field(converter=_index_array)
  val_indices: np.ndarray = attrs.field(converter=_index_array)


@attrs.frozen
class PartitionConfig:
  """The arguments `build_federated_data` partitioned with (for reports)."""

  num_clients: int
  method: str
  seed: int
  alpha: float
  shards_per_client: int
  min_samples_per_client: int
  val_fraction: float


def _check_split(split: object) -> None:
  if split not in ("train", "validation"):
    raise DataError(f"split must be 'train' or 'validation', got {split!r}")


@attrs.frozen(eq=False)
class FederatedData:
  """A data set split among simulated clients.

  Attributes:
    source: the centralised data set; client samples index `source.train`,
      and `source.test` stays central (server-side evaluation).
    clients: one `ClientSplit` per client, in client-id order.
    config: how the partition was made.
  """

  source: DatasetSplits
  clients: tuple[ClientSplit, ...] = attrs.field(converter=tuple)
  config: PartitionConfig
  _positions: Mapping[str, int] = attrs.field(init=False, repr=False)

  def __attrs_post_init__(self) -> None:
    if not self.clients:
      raise DataError("FederatedData needs at least one client")
    positions = {c.client_id: i for i, c in enumerate(self.clients)}
    if len(positions) != len(self.clients):
      raise DataError("FederatedData client ids must be unique")
    num_train = len(self.source.train)
    for client in self.clients:
      for part in (client.train_indices, client.val_indices):
        if len(part) and (part.min() < 0 or part.max() >= num_train):
          raise DataError(
            f"client {client.client_id} indexes outside the "
            f"{num_train}-example train split"
          )
    object.__setattr__(self, "_positions", MappingProxyType(positions))

  @property
  def client_ids(self) -> tuple[str, ...]:
    """All client ids, in order."""
    return tuple(client.client_id for client in self.clients)

  @property
  def num_clients(self) -> int:
    return len(self.clients)

  @property
  def num_classes(self) -> int:
    return self.source.num_classes

  @property
  def input_shape(self) -> tuple[int, ...]:
    return self.source.input_shape

  @property
  def test(self) -> ArrayDataset:
    """The central test split."""
    return self.source.test

  def client(self, client_id: str) -> ClientSplit:
    """The `ClientSplit` of `client_id`; `DataError` if unknown."""
    position = self._positions.get(client_id)
    if position is None:
      raise DataError(
        f"unknown client id {client_id!r}; ids run from "
        f"{self.clients[0].client_id} to {self.clients[-1].client_id}"
      )
    return self.clients[position]

  def client_train(self, client_id: str) -> ArrayDataset:
    """The local training examples of `client_id`."""
    return self.source.train.subset(self.client(client_id).train_indices)

  def client_validation(self, client_id: str) -> ArrayDataset:
    """The local validation examples of `client_id` (possibly empty)."""
    return self.source.train.subset(self.client(client_id).val_indices)

  def num_train_examples(self, client_id: str) -> int:
    """How many local training examples `client_id` has."""
    return len(self.client(client_id).train_indices)

  def _indices(self, split: str) -> list[np.ndarray]:
    _check_split(split)
    if split == "train":
      return [client.train_indices for client in self.clients]
    return [client.val_indices for client in self.clients]

  def label_counts(
    self, split: Literal["train", "validation"] = "train"
  ) -> collections.OrderedDict[str, list[int]]:
    """Per-client label histograms: id -> counts of length num_classes."""
    labels = self.source.train.y
    counts = collections.OrderedDict()
    for client_id, indices in zip(self.client_ids, self._indices(split)):
      histogram = np.bincount(labels[indices], minlength=self.num_classes)
      counts[client_id] = [int(c) for c in histogram]
    return counts

  def to_client_data(
    self, split: Literal["train", "validation"] = "train"
  ) -> tff.simulation.datasets.ClientData:
    """A TFF `ClientData` over the clients' unbatched examples.

    Each client's dataset yields ``OrderedDict(x=float32[H, W, C],
    y=int32[])`` elements in index order (batch and shuffle them with the
    usual `preprocess`). Called with a Python string (as
    `create_tf_dataset_for_client` does) the client's rows are sliced in
    NumPy; traced with a `tf.string` tensor (as `dataset_computation` does)
    the whole split is embedded as graph constants, which suits small data
    sets only.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    parts = self._indices(split)
    ids = self.client_ids
    sizes = [len(p) for p in parts]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = np.concatenate(parts).astype(np.int64)
    images, labels = self.source.train.x, self.source.train.y
    position_of = dict(zip(ids, range(len(ids))))

    def dataset_fn(client_id: str | bytes | tf.Tensor) -> tf.data.Dataset:
      if isinstance(client_id, (str, bytes)):  # Eager: slice in NumPy.
        if isinstance(client_id, bytes):
          client_id = client_id.decode()
        rows = parts[position_of[client_id]]
        return without_autotune(
          tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(x=images[rows], y=labels[rows])
          )
        )
      matches = tf.equal(tf.constant(ids), client_id)
      check = tf.debugging.assert_equal(
        tf.reduce_any(matches), True, message="unknown client id"
      )
      with tf.control_dependencies([check]):
        position = tf.argmax(tf.cast(matches, tf.int32), output_type=tf.int32)
      bounds = tf.constant(offsets)
      rows = tf.constant(flat)[bounds[position] : bounds[position + 1]]
      return without_autotune(
        tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(
            x=tf.gather(tf.constant(images), rows),
            y=tf.gather(tf.constant(labels), rows),
          )
        )
      )

    return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      list(ids), dataset_fn
    )


def make_client_dataset(
  arrays: ArrayDataset,
  *,
  batch_size: int,
  local_epochs: int,
  shuffle_seed: int | None,
  augment: str = "none",
  epoch_aligned: bool = False,
) -> tf.data.Dataset:
  """The batched local dataset a TFF client computation trains on.

  Yields ``OrderedDict(x=float32[b, H, W, C], y=int32[b])`` batches covering
  `local_epochs` passes over `arrays`; the last batch may be smaller (no
  drop_remainder), and batches may span an epoch boundary, unless
  `epoch_aligned`: then each epoch is batched on its own (every epoch has
  ceil(n / batch_size) batches, its last one possibly smaller), for
  algorithms that act at epoch boundaries. With an integer
  `shuffle_seed` the examples are reshuffled every epoch in an order fixed
  by the seed (the same on every call); with ``None`` they are not shuffled
  (index order, e.g. for evaluation).

  The epoch orders are drawn with NumPy from `shuffle_seed` alone, not with
  `tf.data`'s shuffle, whose order also depends on TensorFlow's global seed
  (`tf.random.set_seed` anywhere in the process would change a run). The
  samples are gathered in that order in NumPy and the dataset holds them
  (no dataset function: see `_gathered_batches`); when `arrays` is a
  `worker_files.StoredArrays` and nothing is augmented, the dataset reads
  them from its files instead and holds only the order (the same batches).
  `augment` names an `augment.AUGMENTATIONS` entry applied to each batch,
  seeded with (`shuffle_seed`, batch number); it needs a shuffle seed.

  Raises:
    DataError: `batch_size` or `local_epochs` below 1, a bad seed, or an
      unknown `augment`.
  """
  order = epoch_order(len(arrays), batch_size, local_epochs, shuffle_seed)
  passes = local_epochs if epoch_aligned else 1
  if (
    isinstance(arrays, worker_files.StoredArrays)
    and _augmentation(augment, shuffle_seed) is None
  ):
    return arrays.dataset(order, batch_size, passes)
  return _gathered_batches(
    arrays, order, batch_size, augment, shuffle_seed, epochs=passes
  )


def _gathered_batches(
  arrays: ArrayDataset,
  order,
  batch_size: int,
  augment: str,
  shuffle_seed: int | None,
  *,
  indexed: bool = False,
  epochs: int = 1,
  batch_values: Mapping[str, object] | None = None,
  sample_rows: Mapping[str, np.ndarray] | None = None,
):
  """Batches ``OrderedDict(x=, y=)`` of `arrays` at `order`, `augment`ed.

  With `indexed`, each batch also holds its samples' positions (`index`).
  Then come `batch_values` (one scalar per batch, the same in every batch)
  and `sample_rows` (arrays with one row per sample of `arrays`: each batch
  gets its samples' rows). With `epochs` > 1, `order` is cut into that many
  equal passes batched apart.

  The samples are gathered (and augmented) in NumPy and the dataset is made
  of slices, batch, concatenate and zip only: no dataset function. Each
  `Dataset.map` built in an eager process keeps about 70 KiB of native
  memory for the rest of the process (TensorFlow 2.14; 1,600 datasets of
  250 MNIST-sized samples: +110 MiB with an identity map each, +0.4 MiB
  without, `tools/dataset_memory.py`), and the program builds one dataset
  per sampled client per round. The price is that a dataset holds
  `len(order)` samples rather than one copy of `arrays`.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  augment_fn = _augmentation(augment, shuffle_seed)
  order = np.asarray(order, np.int64)
  pass_length = len(order) // epochs
  bounds = [(p * pass_length, (p + 1) * pass_length) for p in range(epochs)]
  fields = collections.OrderedDict(x=arrays.x[order], y=arrays.y[order])
  if augment_fn is not None:
    images = fields["x"].copy()
    number = 0
    for begin, end in bounds:
      for first in range(begin, end, batch_size):
        rows = slice(first, min(first + batch_size, end))
        images[rows] = augment_fn(
          tf.constant(images[rows]),
          tf.constant([shuffle_seed, number], tf.int64),
        ).numpy()
        number += 1
    fields["x"] = images
  if indexed:
    fields["index"] = order
  num_batches = sum(-(-(end - begin) // batch_size) for begin, end in bounds)

  per_sample = list(fields)
  for name, rows in (sample_rows or {}).items():
    if name in per_sample or name in (batch_values or {}):
      raise ValueError(
        f"sample_rows: {name!r} is already a field of the batches"
      )
    fields[name] = np.asarray(rows)[order]

  def batched(values):
    parts = [
      tf.data.Dataset.from_tensor_slices(
        tf.nest.map_structure(lambda v, b=begin, e=end: v[b:e], values)
      ).batch(batch_size)
      for begin, end in bounds
    ]
    dataset = parts[0]
    for part in parts[1:]:
      dataset = dataset.concatenate(part)
    return dataset

  if not batch_values:
    # The per-sample fields in one slicing: a third of the time of slicing
    # each on its own and zipping them (about 1 ms against 3 ms for a
    # client of 200 MNIST samples), for the same elements.
    return without_autotune(batched(fields))
  # The per-batch values go in between, in the elements' order of keys.
  datasets = collections.OrderedDict(
    (name, batched(fields[name])) for name in per_sample
  )
  for name, value in batch_values.items():
    datasets[name] = tf.data.Dataset.from_tensors(tf.constant(value)).repeat(
      num_batches
    )
  for name in sample_rows or {}:
    datasets[name] = batched(fields[name])
  return without_autotune(tf.data.Dataset.zip(datasets))


def _augmentation(augment: str, shuffle_seed: int | None):
  _checks.check_choice("--augment", augment, augment_lib.AUGMENTATIONS)
  augment_fn = augment_lib.AUGMENTATIONS[augment]
  if augment_fn is not None and shuffle_seed is None:
    raise DataError(
      f"--augment={augment} needs a shuffle seed (training"
      " batches); evaluation data is not augmented"
    )
  return augment_fn


def epoch_order(
  n: int, batch_size: int, local_epochs: int, shuffle_seed: int | None
) -> np.ndarray:
  """`local_epochs` passes over range(n), each permuted from the seed."""
  _checks.check_int("--batch_size", batch_size, minimum=1)
  local_epochs = _checks.check_int("--local_epochs", local_epochs, minimum=1)
  if shuffle_seed is None:
    return np.tile(np.arange(n, dtype=np.int64), local_epochs)
  shuffle_seed = _checks.check_seed(shuffle_seed, flag="shuffle_seed")
  rng = np.random.default_rng(shuffle_seed)
  return np.concatenate(
    [rng.permutation(n) for _ in range(local_epochs)]
  ).astype(np.int64)


def make_indexed_client_dataset(
  arrays: ArrayDataset,
  *,
  batch_size: int,
  local_epochs: int,
  shuffle_seed: int | None,
  augment: str = "none",
  batch_values: Mapping[str, object] | None = None,
  sample_rows: Mapping[str, np.ndarray] | None = None,
) -> tf.data.Dataset:
  """Training batches that say which samples they hold, then every sample once.

  For algorithms that exchange per-sample values with the server (FedGKT's
  server logits): yields ``OrderedDict(x=, y=, index=int64[b], train=bool)``,
  first the batches of `make_client_dataset` (`train=True`, `index` the
  positions of their samples in `arrays`, `augment`ed), then one pass over
  `arrays` in index order (`train=False`, never augmented), for the client
  to compute what it sends. Each batch then holds `batch_values` (the same
  scalars in every batch) and, of each `sample_rows` array (one row per
  sample of `arrays`), the rows of its samples: per-sample values the
  client received travel with its own data.
  """
  n = len(arrays)
  for name, rows in (sample_rows or {}).items():
    if len(rows) != n:
      raise DataError(
        f"sample_rows[{name!r}] has {len(rows)} rows for {n} samples"
      )
  order = epoch_order(n, batch_size, local_epochs, shuffle_seed)
  extras = dict(indexed=True, sample_rows=sample_rows)
  training = _gathered_batches(
    arrays,
    order,
    batch_size,
    augment,
    shuffle_seed,
    batch_values=collections.OrderedDict(train=True, **(batch_values or {})),
    **extras,
  )
  sent = _gathered_batches(
    arrays,
    np.arange(n, dtype=np.int64),
    batch_size,
    "none",
    None,
    batch_values=collections.OrderedDict(train=False, **(batch_values or {})),
    **extras,
  )
  return training.concatenate(sent)


def build_federated_data(
  splits: DatasetSplits,
  *,
  num_clients: int,
  method: str,
  seed: int,
  alpha: float = 0.5,
  shards_per_client: int = 2,
  min_samples_per_client: int = 1,
  val_fraction: float = 0.0,
) -> FederatedData:
  """Partitions `splits.train` among clients and carves out local validation.

  Partitioning is `partition_indices(splits.train.y, ...)`; then client i's
  samples go through `split_train_validation` with a seed derived from
  (`seed`, i), so the whole result is a function of the arguments.
  `min_samples_per_client` counts a client's samples before the validation
  split.

  Raises:
    DataError: (one line) any invalid argument; see `partition_indices`.
  """
  val_fraction = _checks.check_fraction("--val_fraction", val_fraction)
  parts = partition_indices(
    splits.train.y,
    num_clients,
    method,
    seed=seed,
    alpha=alpha,
    shards_per_client=shards_per_client,
    min_samples_per_client=min_samples_per_client,
  )
  clients = []
  for i, part in enumerate(parts):
    val_seed = int(np.random.SeedSequence([seed, i]).generate_state(1)[0])
    train, val = split_train_validation(part, val_fraction, val_seed)
    clients.append(
      ClientSplit(
        client_id=client_id_for(i), train_indices=train, val_indices=val
      )
    )
  config = PartitionConfig(
    num_clients=int(num_clients),
    method=method,
    seed=int(seed),
    alpha=float(alpha),
    shards_per_client=int(shards_per_client),
    min_samples_per_client=int(min_samples_per_client),
    val_fraction=val_fraction,
  )
  return FederatedData(source=splits, clients=tuple(clients), config=config)
