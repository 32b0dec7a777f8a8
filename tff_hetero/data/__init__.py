"""Data sets and federated partitions for tff-hetero.

* `load_dataset` / `DATASETS` (`datasets`): centralised train / test splits as
  in-memory arrays; ``mnist5k`` works offline and is the default. The GLUE
  classification tasks ``glue_<task>`` (`GLUE_DATASETS`, `is_text_dataset`)
  are tokenised text (`glue`: `GlueSplits`, `TextArrayDataset`) with the
  paper's metric per task (`text_metrics`).
* `build_federated_data` / `partition_indices` / `PARTITIONERS`
  (`partition`): iid, Dirichlet and FedAvg-shards client partitions,
  per-client local validation, label histograms and a TFF `ClientData` view.
* `make_client_dataset`: the batched ``OrderedDict(x=..., y=...)``
  `tf.data.Dataset` a TFF client computation consumes;
  `make_indexed_client_dataset` adds each batch's sample positions and a
  final ordered pass (FedGKT).
* `ClientFiles` / `StoredArrays` (`worker_files`): clients' training arrays
  written once where the TFF worker reads them (`--client_data=files`);
  `make_client_dataset` of a `StoredArrays` sends the worker the epochs'
  order, not the samples (unless it augments them).
* `without_autotune` (`options`): tf.data's autotuning off, for every dataset
  a round iterates (its model thread stalled the TFF worker).
* `AUGMENTATIONS` (`augment`): seeded crop / flip of training batches
  (`--augment`).
* `DataError`: the one-line, user-facing error every check here raises.

TensorFlow, TensorFlow Datasets and TensorFlow Federated are imported lazily.
"""

from tff_hetero.data.augment import AUGMENTATIONS
from tff_hetero.data.datasets import DATASETS
from tff_hetero.data.datasets import GLUE_DATASETS
from tff_hetero.data.datasets import UNSUPPORTED_DATASETS
from tff_hetero.data.datasets import ArrayDataset
from tff_hetero.data.datasets import DatasetLoader
from tff_hetero.data.datasets import DatasetSplits
from tff_hetero.data.datasets import ImageFolderLoader
from tff_hetero.data.datasets import TfdsLoader
from tff_hetero.data.datasets import default_tfds_data_dir
from tff_hetero.data.datasets import is_prepared
from tff_hetero.data.datasets import is_text_dataset
from tff_hetero.data.datasets import load_dataset
from tff_hetero.data.glue import GlueSplits
from tff_hetero.data.glue import TextArrayDataset
from tff_hetero.data.options import without_autotune
from tff_hetero.data.partition import DIRICHLET_MAX_ATTEMPTS
from tff_hetero.data.partition import PARTITIONERS
from tff_hetero.data.partition import ClientSplit
from tff_hetero.data.partition import FederatedData
from tff_hetero.data.partition import PartitionConfig
from tff_hetero.data.partition import Partitioner
from tff_hetero.data.partition import PartitionOptions
from tff_hetero.data.partition import build_federated_data
from tff_hetero.data.partition import client_id_for
from tff_hetero.data.partition import epoch_order
from tff_hetero.data.partition import make_client_dataset
from tff_hetero.data.partition import make_indexed_client_dataset
from tff_hetero.data.partition import partition_indices
from tff_hetero.data.partition import split_train_validation
from tff_hetero.data.worker_files import ClientFiles
from tff_hetero.data.worker_files import StoredArrays
from tff_hetero.errors import DataError

DEFAULT_DATASET = "mnist5k"
"""The data set used when none is named: bundled, so it works offline."""

__all__ = [
  "AUGMENTATIONS",
  "DATASETS",
  "DEFAULT_DATASET",
  "DIRICHLET_MAX_ATTEMPTS",
  "GLUE_DATASETS",
  "PARTITIONERS",
  "UNSUPPORTED_DATASETS",
  "ArrayDataset",
  "ClientFiles",
  "ClientSplit",
  "DataError",
  "DatasetLoader",
  "DatasetSplits",
  "FederatedData",
  "GlueSplits",
  "ImageFolderLoader",
  "PartitionConfig",
  "PartitionOptions",
  "Partitioner",
  "StoredArrays",
  "TextArrayDataset",
  "TfdsLoader",
  "build_federated_data",
  "client_id_for",
  "default_tfds_data_dir",
  "epoch_order",
  "is_prepared",
  "is_text_dataset",
  "load_dataset",
  "make_client_dataset",
  "make_indexed_client_dataset",
  "partition_indices",
  "split_train_validation",
  "without_autotune",
]
