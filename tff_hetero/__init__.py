"""tff-hetero: TensorFlow Federated algorithms for federated learning across
heterogeneous devices.

The public API, importable from here (each name loads its module, and with it
TensorFlow and TFF, on first use; `import tff_hetero` alone loads neither):

* Builders in TFF's form, taking a no-arg Keras factory, the spec of one batch
  of client data, TFF optimizers and `tff.aggregators` factories, and
  returning measured `tff.learning.templates.LearningProcess`es:
  `build_fedavg_process`, `build_fedprox_process`, `build_fedadam_process`,
  `build_fednova_process`, and `build_feddst_process` (federated dynamic sparse training; readjust
  decided in the graph from the round counter in its state).
* `build_heterofl_process` and `build_adaptivefl_process`: HeteroFL and
  AdaptiveFL over a width factory of your Keras model, clients of one round
  training sub-models of different widths; `initialize` / `next` in Python
  over typed `tff.Computation`s (`tff_hetero.algorithms.width_process`,
  AdaptiveFL's clients given as `AvailableClient`s), uploads summed by a
  `MaskedAggregation` (mean, clipped, or differentially private) or by any
  `tff.aggregators` wrapper around a `MaskedSumFactory` (zeroing; secure
  sums inside it, simulated).
* `build_all_large_process` and `build_decoupled_process`: AdaptiveFL's
  baselines (the full model on every client; separate models per size) on
  the same width machinery.
* `build_scaffold_process`: SCAFFOLD, whose clients keep control variates;
  `initialize` / `next(state, datasets, client_controls)` in Python over
  typed `tff.Computation`s (`ScaffoldProcess`), the caller keeping each
  client's variate.
* `build_fedsgc_process`: FedSGC, whose server remembers clients by id and
  whose clients count their own epochs, and its baselines
  `build_prunefl_process` and `build_grasp_process` (pruning on the first
  client of round 1); `initialize` / `next(state, {client_id: dataset})` in
  Python over typed `tff.Computation`s
  (`tff_hetero.algorithms.sparse.sparse_process`).
* `build_fedgkt_process` and `build_split_learning_process`: FedGKT (sync)
  and split learning over your edge model, the layer it is cut at and your
  server model; clients keep state by id (`ClientStateProcess`:
  `initialize` / `next(state, {client_id: (images, labels)})` in Python
  over typed `tff.Computation`s, `tff_hetero.algorithms.client_state_process`).
* `build_spatl_process`: SPATL, a shared encoder with private predictors,
  an RL agent choosing the salient channels each client uploads, and
  gradient control; `initialize` / `next(state, datasets, validations,
  client_states, round_infos)` in Python over typed `tff.Computation`s
  (`SpatlProcess`, switches in `SpatlOptions`), the caller keeping each
  client's state.
* `build_model_aggregator`: the `--aggregator` choices (mean, clip, dp) as TFF
  factories with their client weighting.
* Execution: `local_execution`, `remote_execution` (context managers on TFF
  workers this process owns).
* The training program: `make_config` (an `ExperimentConfig` from flat
  settings, each algorithm's own checked by its settings class),
  `evolve_config`, `run_experiment`; `AlgorithmSettings` and `setting` to
  declare a new algorithm's settings (`tff_hetero.settings`).
* Errors: `HeteroError` and its family (`tff_hetero.errors`).

Subpackages keep their own `__all__` (`tff_hetero.models`, `.data`,
`.devices`, `.submodels`, `.aggregators`, `.accounting`, `.algorithms`,
`.runtime`, `.program`).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public name -> the module defining it.
_EXPORTS = {
  "build_fedavg_process": "tff_hetero.algorithms.fedavg",
  "build_fedprox_process": "tff_hetero.algorithms.fedprox",
  "build_fedadam_process": "tff_hetero.algorithms.fedadam",
  "build_fednova_process": "tff_hetero.algorithms.fednova",
  "build_scaffold_process": "tff_hetero.algorithms.scaffold",
  "ScaffoldProcess": "tff_hetero.algorithms.scaffold",
  "build_feddst_process": "tff_hetero.algorithms.sparse.feddst",
  "build_fedsgc_process": "tff_hetero.algorithms.sparse.fedsgc",
  "build_grasp_process": "tff_hetero.algorithms.sparse.grasp",
  "build_prunefl_process": "tff_hetero.algorithms.sparse.prunefl",
  "build_heterofl_process": "tff_hetero.algorithms.heterofl",
  "build_all_large_process": "tff_hetero.algorithms.all_large",
  "build_decoupled_process": "tff_hetero.algorithms.decoupled",
  "build_fedgkt_process": "tff_hetero.algorithms.fedgkt",
  "build_split_learning_process": "tff_hetero.algorithms.split_learning",
  "ClientStateProcess": "tff_hetero.algorithms.client_state_process",
  "build_spatl_process": "tff_hetero.algorithms.spatl.spatl",
  "SpatlProcess": "tff_hetero.algorithms.spatl.spatl",
  "SpatlOptions": "tff_hetero.algorithms.spatl.computations",
  "build_adaptivefl_process": "tff_hetero.algorithms.adaptivefl",
  "AvailableClient": "tff_hetero.algorithms.adaptivefl",
  "MaskedAggregation": "tff_hetero.aggregators.masked_dp",
  "MaskedSumFactory": "tff_hetero.aggregators.masked",
  "build_model_aggregator": "tff_hetero.aggregators.model_aggregators",
  "local_execution": "tff_hetero.runtime.contexts",
  "remote_execution": "tff_hetero.runtime.contexts",
  "ExperimentConfig": "tff_hetero.program.config",
  "make_config": "tff_hetero.program.configs",
  "evolve_config": "tff_hetero.program.configs",
  "AlgorithmSettings": "tff_hetero.settings",
  "setting": "tff_hetero.settings",
  "run_experiment": "tff_hetero.program.loop",
  "HeteroError": "tff_hetero.errors",
  "UsageError": "tff_hetero.errors",
  "DataError": "tff_hetero.errors",
  "DeviceError": "tff_hetero.errors",
  "ModelError": "tff_hetero.errors",
  "DivergenceError": "tff_hetero.errors",
  "WorkerError": "tff_hetero.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'tff_hetero' has no attribute {name!r}")
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
