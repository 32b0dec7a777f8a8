"""Federated algorithms: one module per algorithm.

Homogeneous algorithms, and FedDST, are TFF `LearningProcess`es
(`build_<name>_process`); HeteroFL and AdaptiveFL are also processes for
TFF users (`build_heterofl_process`, `build_adaptivefl_process`:
`initialize` / `next` in Python over typed computations), and so are
FedGKT and split learning, whose clients keep state by id
(`build_fedgkt_process`, `build_split_learning_process`:
`client_state_process.ClientStateProcess`).
Width-heterogeneous ones run one federated computation per sub-model group
(`width_computations.WidthComputations.group_round`, run by
`width_rounds.HeterogeneousRounds`) and are driven as
`FederatedAlgorithm`s (`AdaptiveFL`, `HeteroFL`, `AllLarge`, `Decoupled`).
"""

from tff_hetero.algorithms.adaptivefl import AdaptiveFL
from tff_hetero.algorithms.adaptivefl import AdaptiveFLProcess
from tff_hetero.algorithms.adaptivefl import AvailableClient
from tff_hetero.algorithms.adaptivefl import build_adaptivefl_process
from tff_hetero.algorithms.all_large import AllLarge
from tff_hetero.algorithms.api import Assignment
from tff_hetero.algorithms.api import ClientDatasets
from tff_hetero.algorithms.api import ClientRound
from tff_hetero.algorithms.api import EvaluationData
from tff_hetero.algorithms.api import EvaluationModel
from tff_hetero.algorithms.api import FederatedAlgorithm
from tff_hetero.algorithms.api import RoundOutput
from tff_hetero.algorithms.api import Task
from tff_hetero.algorithms.client_state_process import ClientStateProcess
from tff_hetero.algorithms.decoupled import Decoupled
from tff_hetero.algorithms.fedadam import build_fedadam_process
from tff_hetero.algorithms.fedavg import build_fedavg_process
from tff_hetero.algorithms.fedgkt import build_fedgkt_process
from tff_hetero.algorithms.fednova import build_fednova_process
from tff_hetero.algorithms.fedprox import build_fedprox_process
from tff_hetero.algorithms.heterofl import HeteroFL
from tff_hetero.algorithms.heterofl import build_heterofl_process
from tff_hetero.algorithms.registry import ALGORITHMS
from tff_hetero.algorithms.scaffold import ScaffoldProcess
from tff_hetero.algorithms.scaffold import build_scaffold_process
from tff_hetero.algorithms.sparse.feddst import build_feddst_process
from tff_hetero.algorithms.split_learning import build_split_learning_process
from tff_hetero.algorithms.static_batch_norm import build_statistics_query
from tff_hetero.algorithms.width_process import WidthProcess
from tff_hetero.algorithms.width_process import WidthProcessState
from tff_hetero.algorithms.width_process import WidthRoundOutput
from tff_hetero.algorithms.width_rounds import HeterogeneousRounds
from tff_hetero.algorithms.width_rounds import LevelCatalog

__all__ = [
  "AdaptiveFL",
  "AdaptiveFLProcess",
  "AvailableClient",
  "build_adaptivefl_process",
  "AllLarge",
  "Assignment",
  "ClientRound",
  "ClientDatasets",
  "EvaluationData",
  "EvaluationModel",
  "FederatedAlgorithm",
  "RoundOutput",
  "Task",
  "ClientStateProcess",
  "Decoupled",
  "build_fedadam_process",
  "build_fedavg_process",
  "build_fedgkt_process",
  "build_split_learning_process",
  "build_feddst_process",
  "build_fednova_process",
  "build_fedprox_process",
  "HeteroFL",
  "build_heterofl_process",
  "ALGORITHMS",
  "ScaffoldProcess",
  "build_scaffold_process",
  "build_statistics_query",
  "HeterogeneousRounds",
  "LevelCatalog",
  "WidthProcess",
  "WidthProcessState",
  "WidthRoundOutput",
]
