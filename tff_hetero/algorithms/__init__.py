"""Federated algorithms: one module per algorithm, each with a `build_<name>_process`."""

from tff_hetero.algorithms.api import ClientRound
from tff_hetero.algorithms.api import FederatedAlgorithm
from tff_hetero.algorithms.api import RoundOutput
from tff_hetero.algorithms.api import Task
from tff_hetero.algorithms.fedadam import build_fedadam_process
from tff_hetero.algorithms.fedavg import build_fedavg_process
from tff_hetero.algorithms.fedprox import build_fedprox_process
from tff_hetero.algorithms.registry import ALGORITHMS
