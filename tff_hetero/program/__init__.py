"""The training program: rounds, evaluation, checkpoints, metrics, report."""

from tff_hetero.program.config import ExperimentConfig
from tff_hetero.program.errors import DivergenceError
from tff_hetero.program.errors import UsageError
from tff_hetero.program.loop import build_experiment
from tff_hetero.program.loop import run_experiment
from tff_hetero.program.loop import validate_config
