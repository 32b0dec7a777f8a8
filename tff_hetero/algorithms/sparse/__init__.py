"""Federated sparse training: FedSGC, FedDST, PruneFL, GraSP (and their
shared mechanics).

Layers: `prune_grow` (pure TF mask arithmetic), `client_update` (the
client's `tf.function`), `computations` (typed TFF computations, one per kind
of round), `training` (the `FederatedAlgorithm` driver), `sparse_process` (the
process a TFF user drives),
`initial_pruning` (pruning on one client first); one module per algorithm
(`fedsgc`, `feddst`, `prunefl`, `grasp`).
"""

from tff_hetero.algorithms.sparse.client_update import ClientReport
from tff_hetero.algorithms.sparse.client_update import SparseUpload
from tff_hetero.algorithms.sparse.computations import MEMORIES
from tff_hetero.algorithms.sparse.computations import MemoryRows
from tff_hetero.algorithms.sparse.computations import SparseRounds
from tff_hetero.algorithms.sparse.feddst import FedDSTState
from tff_hetero.algorithms.sparse.feddst import build_feddst
from tff_hetero.algorithms.sparse.feddst import build_feddst_process
from tff_hetero.algorithms.sparse.fedsgc import build_fedsgc
from tff_hetero.algorithms.sparse.fedsgc import build_fedsgc_process
from tff_hetero.algorithms.sparse.grasp import build_grasp
from tff_hetero.algorithms.sparse.grasp import build_grasp_process
from tff_hetero.algorithms.sparse.prune_grow import ReadjustCounts
from tff_hetero.algorithms.sparse.prune_grow import ReadjustSchedule
from tff_hetero.algorithms.sparse.prunefl import build_prunefl
from tff_hetero.algorithms.sparse.prunefl import build_prunefl_process
from tff_hetero.algorithms.sparse.sparse_process import SparseProcess
from tff_hetero.algorithms.sparse.sparse_process import SparseProcessState
from tff_hetero.algorithms.sparse.sparse_process import SparseRoundOutput
from tff_hetero.algorithms.sparse.training import SparseState
from tff_hetero.algorithms.sparse.training import SparseTraining

__all__ = [
  "ClientReport",
  "FedDSTState",
  "MEMORIES",
  "MemoryRows",
  "ReadjustCounts",
  "ReadjustSchedule",
  "SparseProcess",
  "SparseProcessState",
  "SparseRoundOutput",
  "SparseRounds",
  "SparseState",
  "SparseTraining",
  "SparseUpload",
  "build_feddst",
  "build_feddst_process",
  "build_fedsgc",
  "build_fedsgc_process",
  "build_grasp",
  "build_grasp_process",
  "build_prunefl",
  "build_prunefl_process",
]
