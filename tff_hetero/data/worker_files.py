"""Client training data kept where the TFF worker reads it.

TFF sends a `tf.data.Dataset` to a worker as the dataset's serialized graph.
A dataset made from NumPy arrays holds them in that graph as constants, so
every round sent each sampled client's samples to the worker again, all
`local_epochs` passes of them (3.1 MB for a client of 200 MNIST samples and
5 epochs, `docs/performance.md`). Here each client's training arrays are
written once, as `tf.io.serialize_tensor` files in a directory the driver and
its workers share, and the client's dataset is a graph that reads them: what
crosses each round is the two paths and the epochs' sample order (8 bytes a
sample), and the worker reads, parses and gathers the samples itself.

* `ClientFiles(parent)`: a fresh directory under `parent` (the system's
  temporary directory by default) that `store` fills and `close` removes with
  everything in it (a context manager).
* `ClientFiles.store(client_id, arrays) -> StoredArrays`: writes the client's
  arrays the first time (atomically), then returns the same paths; it keeps
  the paths, not the arrays. A
  `StoredArrays` reads like the arrays it wraps (`x`, `y`, `len`,
  `input_shape`, `subset`), so code that takes arrays takes it unchanged.
* `StoredArrays.dataset(order, batch_size, passes)`: the batches of
  `stored` at `order` (`order` cut into `passes` equal passes, batched
  apart), ``OrderedDict(x=, y=)`` with the spec of the in-memory dataset
  `partition.make_client_dataset` builds, the same elements in the same
  order; `make_client_dataset` calls it for a `StoredArrays` it does not
  augment.

How the dataset is built: a graph made once per (arrays' spec, batch size,
passes) holds a `flat_map` over one element (the two paths and the order)
whose function reads, parses, gathers and batches, and `DatasetToGraphV2`
of it; a session runs that with each client's element fed, and
`DatasetFromGraph` makes the result an eager dataset. No dataset function is
traced per client: each one traced in an eager process keeps about 100 KiB
for the rest of the process (1,600 `flat_map` datasets built and serialized
in eager: +167 MiB and 9.6 ms each; built this way: +0.02 MiB and 1.2 ms
each, each message 4.7 KB; scratch measurement, 250 MNIST-sized samples).

The files are read when the dataset is iterated: by the worker the dataset
is sent to, or by the driver if it iterates the dataset itself. A worker on
another machine needs the directory at the same path (a shared file
system); the program uses these files for its local workers only, unless
given a shared directory (`--client_data`, `--client_data_dir`).
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import threading
from typing import Any

import attrs
import numpy as np

from tff_hetero.data import options as options_lib
from tff_hetero.errors import DataError

_FILE_SUFFIXES = ("x", "y")


@attrs.frozen(eq=False)
class StoredArrays:
  """A client's training arrays, and the files a worker reads them from.

  Reads like `arrays` (`x`, `y`, `len`, `input_shape`, `subset`); `x_path`
  and `y_path` hold `tf.io.serialize_tensor` of `arrays.x` and `arrays.y`,
  in `files`' directory.
  """

  arrays: Any
  x_path: str
  y_path: str
  files: ClientFiles = attrs.field(repr=False)

  @property
  def x(self) -> np.ndarray:
    return self.arrays.x

  @property
  def y(self) -> np.ndarray:
    return self.arrays.y

  def __len__(self) -> int:
    return len(self.arrays)

  @property
  def input_shape(self) -> tuple[int, ...]:
    return self.arrays.input_shape

  def subset(self, indices: np.ndarray):
    """The examples at `indices` (in memory: a copy, not stored)."""
    return self.arrays.subset(indices)

  def dataset(self, order: np.ndarray, batch_size: int, passes: int = 1):
    """The batches at `order`, read from the files (`ClientFiles.dataset`)."""
    return self.files.dataset(self, order, batch_size, passes)


class ClientFiles:
  """A directory of clients' arrays for the workers to read; see the module
  docstring. `close()` (or leaving the `with` block) removes it."""

  def __init__(self, parent: str | None = None):
    if parent is not None and not os.path.isdir(parent):
      raise DataError(f"client data directory {parent!r} is not a directory")
    self._directory = tempfile.mkdtemp(prefix="tff_hetero_clients_", dir=parent)
    # client id -> ((x path, y path), (spec, samples)); the arrays are not
    # kept (the driver need not hold every client's data at once).
    self._stored: dict[str, tuple] = {}
    self._templates: dict[tuple, _Template] = {}
    self._lock = threading.Lock()
    self._closed = False

  @property
  def directory(self) -> str:
    return self._directory

  def store(self, client_id: str, arrays) -> StoredArrays:
    """`arrays` as stored for `client_id`, written the first time (later
    calls check that `arrays` has the stored spec and length, and return
    them with the same files).

    Raises:
      DataError: `client_id` was stored before with other arrays (another
        number of samples or another spec).
    """
    spec = (_spec_of(arrays), len(arrays))
    with self._lock:
      if self._closed:
        raise DataError(f"the client files in {self._directory} were closed")
      known = self._stored.get(client_id)
      if known is None:
        paths = tuple(
          os.path.join(self._directory, f"{len(self._stored)}.{suffix}")
          for suffix in _FILE_SUFFIXES
        )
        for path, values in zip(paths, (arrays.x, arrays.y)):
          _write_tensor(path, values)
        known = self._stored[client_id] = (paths, spec)
      elif known[1] != spec:
        raise DataError(
          f"client {client_id!r} was stored with {known[1][1]} samples of"
          f" spec {known[1][0]}, not the {spec[1]} of spec {spec[0]} given"
        )
    return StoredArrays(arrays, *known[0], self)

  def dataset(
    self,
    stored: StoredArrays,
    order: np.ndarray,
    batch_size: int,
    passes: int = 1,
  ):
    """The batches of `stored` at `order` as a dataset that reads its files.

    `order` (int64 positions into `stored`, its length a multiple of
    `passes`) is cut into `passes` equal parts batched apart, like
    `partition.make_client_dataset`'s in-memory dataset, whose elements and
    element spec this has.

    Raises:
      DataError: `order` is not `passes` equal passes, or these files were
        closed.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorflow.python.ops import gen_experimental_dataset_ops  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

    order = np.asarray(order, np.int64)
    if order.ndim != 1 or len(order) % passes:
      raise DataError(
        f"order of shape {order.shape} is not {passes} equal passes"
      )
    key = (_spec_of(stored), batch_size, passes)
    with self._lock:
      if self._closed:
        raise DataError(f"the client files in {self._directory} were closed")
      template = self._templates.get(key)
      if template is None:
        template = _build_template(*key)
        self._templates[key] = template
    graph_def = template.session.run(
      template.serialized,
      {
        template.paths[0]: stored.x_path,
        template.paths[1]: stored.y_path,
        template.order: order,
      },
    )
    return tf.data.experimental.from_variant(
      gen_experimental_dataset_ops.dataset_from_graph(graph_def),
      template.element_spec,
    )

  def close(self) -> None:
    """Closes the sessions and removes the directory (idempotent)."""
    with self._lock:
      self._closed = True
      for template in self._templates.values():
        template.session.close()
      self._templates.clear()
      self._stored.clear()
    shutil.rmtree(self._directory, ignore_errors=True)

  def __enter__(self) -> ClientFiles:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _write_tensor(path: str, values: np.ndarray) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  partial = path + ".partial"
  with open(partial, "wb") as f:
    f.write(tf.io.serialize_tensor(values).numpy())
  os.replace(partial, path)


def _spec_of(arrays) -> tuple:
  x, y = np.asarray(arrays.x), np.asarray(arrays.y)
  return (x.dtype.name, tuple(x.shape[1:]), y.dtype.name, tuple(y.shape[1:]))


@attrs.frozen(eq=False)
class _Template:
  """One graph: the fed element, and the serialized dataset it makes."""

  session: Any
  paths: tuple[Any, Any]
  order: Any
  serialized: Any
  element_spec: Any


def _build_template(spec: tuple, batch_size: int, passes: int) -> _Template:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  x_dtype, x_shape, y_dtype, y_shape = spec

  def batches(x_path, y_path, order):
    x = tf.ensure_shape(
      tf.io.parse_tensor(tf.io.read_file(x_path), x_dtype), (None, *x_shape)
    )
    y = tf.ensure_shape(
      tf.io.parse_tensor(tf.io.read_file(y_path), y_dtype), (None, *y_shape)
    )
    length = tf.size(order, out_type=tf.int64) // passes
    dataset = None
    for p in range(passes):
      rows = order[p * length : (p + 1) * length]
      part = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=tf.gather(x, rows), y=tf.gather(y, rows))
      ).batch(batch_size)
      dataset = part if dataset is None else dataset.concatenate(part)
    return dataset

  graph = tf.Graph()
  with graph.as_default():
    paths = (
      tf.compat.v1.placeholder(tf.string, (), name="x_path"),
      tf.compat.v1.placeholder(tf.string, (), name="y_path"),
    )
    order = tf.compat.v1.placeholder(tf.int64, (None,), name="order")
    dataset = options_lib.without_autotune(
      tf.data.Dataset.from_tensors((*paths, order)).flat_map(batches)
    )
    serialized = tf.raw_ops.DatasetToGraphV2(
      input_dataset=tf.data.experimental.to_variant(dataset),
      external_state_policy=2,  # FAIL: nothing here may hold state.
    )
  return _Template(
    tf.compat.v1.Session(graph=graph),
    paths,
    order,
    serialized,
    dataset.element_spec,
  )
