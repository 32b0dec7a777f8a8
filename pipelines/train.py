r"""Train one federated experiment.

  python -m pipelines.train --algorithm=fedavg --dataset=mnist5k \
      --model=mnist_cnn --num_clients=20 --clients_per_round=5 --rounds=10

Writes `<root_output_dir>/<experiment_name>/` (metrics.csv, tensorboard/,
report.json, plots, checkpoints/). Bad flags exit with status 2 and one line
naming the flag; a diverged run exits with status 3 naming the round; an
interrupted run resumes with `--resume`.
"""

from __future__ import annotations

import sys

from absl import flags

from pipelines import _cli
from tff_hetero import settings as settings_lib
from tff_hetero.program import configs
from tff_hetero.program import loop

# One flag per setting, generated from `ExperimentConfig`'s fields and each
# registered algorithm's settings class (`tff_hetero.program.configs`).
configs.define_flags(flags.FLAGS)
flags.adopt_module_key_flags(settings_lib)


def config_from_flags():
  """The `ExperimentConfig` the parsed flags describe."""
  return configs.config_from_flags(flags.FLAGS)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  result = _cli.run_guarded(
    lambda: loop.run_experiment(config_from_flags()),
    resume_hint="continue with --resume",
  )
  report = result.report
  final = report["final_metrics"]
  average = (
    f" (mean over the evaluated sub-models {final['avg_accuracy']:.4f})"
    if "avg_accuracy" in final
    else ""
  )
  print(
    f"final accuracy: {final.get('accuracy'):.4f}{average} after"
    f" {report['rounds_completed']} rounds; uploaded"
    f" {report['bytes_up_total'] / 2**20:.2f} MiB"
  )
  print(f"report: {result.experiment_dir}/report.json")
  for path in report.get("plots", []):
    print(f"plot: {path}")
  sys.stdout.flush()


if __name__ == "__main__":
  _cli.run_main(main)
