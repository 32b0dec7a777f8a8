"""Client training data kept where the TFF worker reads it.

TFF sends a `tf.data.Dataset` to a worker as the dataset's serialized graph.
A dataset made from NumPy arrays holds them in that graph as constants, so
every round sends each sampled client's samples to the worker again, all
`local_epochs` passes of them (3.1 MB for a client of 200 MNIST samples and
5 epochs). Here (`--client_data=files`) each client's training arrays are
written once, as `tf.io.serialize_tensor` files in a directory the driver
and its workers share, and the client's dataset is a graph that reads them:
what crosses each round is that graph (about 5 KB) holding the two paths and
the epochs' sample order (8 bytes per sample and epoch), and the worker
reads, parses and gathers the samples itself.

* `ClientFiles(parent)`: a fresh directory under `parent` (the system's
  temporary directory by default) that `close` removes with everything in
  it (a context manager). With a parent given, other users may read the
  directory and its files as far as they may read the parent (for workers
  running as another user), whatever the umask; only this user may write.
* `ClientFiles.store(client_id, arrays) -> StoredArrays`: `arrays` bound to
  the client's files. Nothing is written until a dataset is made from them;
  the first one writes the files (atomically), later ones check that the
  arrays are the ones written (CRC-32 of their bytes) and reuse the files.
  The arrays themselves are not kept. A `StoredArrays` reads like the arrays
  it wraps (`x`, `y`, `len`, `input_shape`, `subset`), so code that takes
  arrays takes it unchanged.
* `StoredArrays.dataset(order, batch_size, passes)`: the batches at `order`
  (int64 positions, cut into `passes` equal passes batched apart) as
  ``OrderedDict(x=, y=)``: the elements, in the order and with the element
  spec of the in-memory dataset `partition.make_client_dataset` builds
  (`make_client_dataset` calls it for a `StoredArrays` it does not augment).
  Its cardinality is unknown (a `flat_map`) where the in-memory one's is
  known.

How the dataset is built: a graph made once per (arrays' spec, batch size,
passes) holds a `flat_map` over one element (the two paths and the order)
whose function reads, parses, gathers and batches, and `DatasetToGraphV2`
of it; a session runs that with each client's element fed, and
`DatasetFromGraph` makes the result an eager dataset. No dataset function is
traced per client: each one traced in an eager process keeps about 70 KiB
for the rest of the process (`tools/dataset_memory.py --datasets=1600`
compares `map`, a traced function per dataset, with `stored`).

The files are read when the dataset is iterated: by the worker the dataset
is sent to (each client's file once a round, 1/`local_epochs` of what the
round would have sent), or by the driver if it iterates the dataset itself.
A dataset whose files cannot be read fails when iterated (TensorFlow's
`NotFoundError` naming the path). Only `make_client_dataset` reads files:
`make_indexed_client_dataset` (FedGKT) and validation splits still carry
their samples. `close` is not for calling while another thread makes a
dataset. A worker on
another machine needs the directory at the same path (a shared file
system). On disk the files hold each client that made a dataset once: at
most the training split, uncompressed. A run killed with SIGKILL leaves its
directory (``tff_hetero_clients_*``) behind.
"""

from __future__ import annotations

import collections
import os
import shutil
import stat
import tempfile
import threading
from typing import Any
import zlib

import attrs
import numpy as np

from tff_hetero.data import options as options_lib
from tff_hetero.errors import DataError

_FILE_SUFFIXES = ("x", "y")


@attrs.frozen(eq=False)
class StoredArrays:
  """A client's training arrays, bound to the files a worker reads them from.

  Reads like `arrays` (`x`, `y`, `len`, `input_shape`, `subset`).
  """

  arrays: Any
  client_id: str
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


@attrs.frozen
class _Written:
  """A client's files, and what they hold."""

  x_path: str
  y_path: str
  spec: tuple
  crc: int


class ClientFiles:
  """A directory of clients' training arrays for the workers to read.

  See the module docstring. `close()` (or leaving the `with` block) removes
  the directory.

  Raises:
    DataError: `parent` is not a directory this process can write to.
  """

  def __init__(self, parent: str | None = None):
    if parent is not None:
      parent = os.path.abspath(parent)  # The path the workers are sent.
      if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise DataError(
          f"client data directory {parent!r} is not a directory this"
          " process can write to"
        )
    self._directory = tempfile.mkdtemp(prefix="tff_hetero_clients_", dir=parent)
    # Others may read (and enter) it, and its files, as far as they may the
    # parent; nobody but this user may write there.
    self._read_bits = 0
    if parent is not None:
      self._read_bits = stat.S_IMODE(os.stat(parent).st_mode) & 0o055
      os.chmod(self._directory, 0o700 | self._read_bits)
    self._written: dict[str, _Written] = {}
    self._templates: dict[tuple, _Template] = {}
    self._lock = threading.Lock()
    self._closed = False

  @property
  def directory(self) -> str:
    return self._directory

  def store(self, client_id: str, arrays) -> StoredArrays:
    """`arrays` bound to `client_id`'s files (written by the first dataset
    made from them)."""
    self._check_open()
    return StoredArrays(arrays, client_id, self)

  def dataset(
    self,
    stored: StoredArrays,
    order: np.ndarray,
    batch_size: int,
    passes: int = 1,
  ):
    """The batches of `stored` at `order` as a dataset that reads its files.

    `order` (positions into `stored`, its length a multiple of `passes`) is
    cut into `passes` equal parts batched apart, like
    `partition.make_client_dataset`'s in-memory dataset, whose elements and
    element spec this has.

    Raises:
      DataError: a bad `order`, `batch_size` or `passes`; arrays other than
        the ones written for this client earlier; or these files closed.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    order = np.asarray(order)
    if batch_size < 1 or passes < 1:
      raise DataError(
        f"batch_size and passes must be >= 1, got {batch_size} and {passes}"
      )
    if order.ndim != 1 or not np.issubdtype(order.dtype, np.integer):
      raise DataError(
        f"order must be 1-D integers, got {order.dtype}{order.shape}"
      )
    if len(order) % passes:
      raise DataError(f"{len(order)} positions are not {passes} equal passes")
    if len(order) and (order.min() < 0 or order.max() >= len(stored)):
      raise DataError(
        f"order holds positions outside the {len(stored)} samples"
      )
    written = self._written_files(stored)
    template = self._template((written.spec, batch_size, passes))
    graph_def = template.session.run(
      template.serialized,
      {
        template.paths[0]: written.x_path,
        template.paths[1]: written.y_path,
        template.order: order.astype(np.int64),
      },
    )
    return tf.data.experimental.from_variant(
      tf.raw_ops.DatasetFromGraph(graph_def=graph_def),
      template.element_spec,
    )

  def close(self) -> None:
    """Closes the sessions and removes the directory (idempotent)."""
    with self._lock:
      self._closed = True
      for template in self._templates.values():
        template.session.close()
      self._templates.clear()
      self._written.clear()
    shutil.rmtree(self._directory, ignore_errors=True)

  def __enter__(self) -> ClientFiles:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def _check_open(self) -> None:
    if self._closed:
      raise DataError(f"the client files in {self._directory} were closed")

  def _written_files(self, stored: StoredArrays) -> _Written:
    """`stored`'s files, written now if they were not."""
    x, y = np.asarray(stored.x), np.asarray(stored.y)
    spec = (x.dtype.name, tuple(x.shape[1:]), y.dtype.name, tuple(y.shape[1:]))
    crc = zlib.crc32(
      np.ascontiguousarray(y), zlib.crc32(np.ascontiguousarray(x))
    )
    with self._lock:
      self._check_open()
      written = self._written.get(stored.client_id)
      if written is None:
        number = len(self._written)
        paths = [
          os.path.join(self._directory, f"{number}.{suffix}")
          for suffix in _FILE_SUFFIXES
        ]
        file_mode = 0o600 | (self._read_bits & 0o044)
        for path, values in zip(paths, (x, y)):
          _write_tensor(path, values, file_mode)
        written = _Written(*paths, spec, crc)
        self._written[stored.client_id] = written
      elif (written.spec, written.crc) != (spec, crc):
        raise DataError(
          f"client {stored.client_id!r} was stored with other arrays; a"
          " client's training arrays must stay the same for the whole run"
        )
    return written

  def _template(self, key: tuple) -> _Template:
    with self._lock:
      self._check_open()
      template = self._templates.get(key)
      if template is None:
        template = self._templates[key] = _build_template(*key)
    return template


def _write_tensor(path: str, values: np.ndarray, mode: int) -> None:
  """`values` serialized to `path` with `mode`, whatever the umask: written
  to a new file beside it, then renamed."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  partial = path + ".partial"
  fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  try:
    with os.fdopen(fd, "wb") as f:
      os.fchmod(f.fileno(), mode)
      f.write(tf.io.serialize_tensor(values).numpy())
    os.replace(partial, path)
  finally:
    if os.path.exists(partial):
      os.remove(partial)


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
  session = tf.compat.v1.Session(
    graph=graph, config=tf.compat.v1.ConfigProto(device_count={"GPU": 0})
  )
  return _Template(session, paths, order, serialized, dataset.element_spec)
