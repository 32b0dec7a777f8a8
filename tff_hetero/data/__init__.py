"""Data sets and federated partitions for tff-hetero.

* `load_dataset` / `DATASETS` (`datasets`): centralised train / test splits as
  in-memory arrays; ``mnist5k`` works offline and is the default.
* `build_federated_data` / `partition_indices` / `PARTITIONERS`
  (`partition`): iid, Dirichlet and FedAvg-shards client partitions,
  per-client local validation, label histograms and a TFF `ClientData` view.
* `make_client_dataset`: the batched ``OrderedDict(x=..., y=...)``
  `tf.data.Dataset` a TFF client computation consumes;
  `make_indexed_client_dataset` adds each batch's sample positions and a
  final ordered pass (FedGKT).
* `AUGMENTATIONS` (`augment`): seeded crop / flip of training batches
  (`--augment`).
* `DataError`: the one-line, user-facing error every check here raises.

TensorFlow, TensorFlow Datasets and TensorFlow Federated are imported lazily.
"""

from tff_hetero.data.augment import AUGMENTATIONS
from tff_hetero.data.datasets import (
    DATASETS,
    ArrayDataset,
    DatasetLoader,
    DatasetSplits,
    ImageFolderLoader,
    TfdsLoader,
    default_tfds_data_dir,
    load_dataset,
)
from tff_hetero.errors import DataError
from tff_hetero.data.partition import (
    DIRICHLET_MAX_ATTEMPTS,
    PARTITIONERS,
    ClientSplit,
    FederatedData,
    PartitionConfig,
    PartitionOptions,
    Partitioner,
    build_federated_data,
    client_id_for,
    epoch_order,
    make_client_dataset,
    make_indexed_client_dataset,
    partition_indices,
    split_train_validation,
)

DEFAULT_DATASET = "mnist5k"
"""The data set used when none is named: bundled, so it works offline."""

__all__ = [
    "AUGMENTATIONS",
    "DATASETS",
    "DEFAULT_DATASET",
    "DIRICHLET_MAX_ATTEMPTS",
    "PARTITIONERS",
    "ArrayDataset",
    "ClientSplit",
    "DataError",
    "DatasetLoader",
    "DatasetSplits",
    "FederatedData",
    "ImageFolderLoader",
    "PartitionConfig",
    "PartitionOptions",
    "Partitioner",
    "TfdsLoader",
    "build_federated_data",
    "client_id_for",
    "default_tfds_data_dir",
    "epoch_order",
    "load_dataset",
    "make_client_dataset",
    "make_indexed_client_dataset",
    "partition_indices",
    "split_train_validation",
]
