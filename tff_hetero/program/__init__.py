"""The training program: rounds, evaluation, checkpoints, metrics, report."""

from tff_hetero.errors import DivergenceError
from tff_hetero.errors import UsageError
from tff_hetero.program.config import ExperimentConfig
from tff_hetero.program.configs import evolve_config
from tff_hetero.program.configs import make_config
from tff_hetero.program.loop import build_experiment
from tff_hetero.program.loop import run_experiment
from tff_hetero.program.loop import validate_config

__all__ = [
  "DivergenceError",
  "UsageError",
  "ExperimentConfig",
  "evolve_config",
  "make_config",
  "build_experiment",
  "run_experiment",
  "validate_config",
]
