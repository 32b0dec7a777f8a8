"""Shared plumbing of the reproduction pipelines (`pipelines/reproduce/*.py`).

A reproduction is a list of named runs (each an `ExperimentConfig`) whose
reports fill tables printed beside the paper's numbers. Runs live under
`<root_output_dir>/<experiment_name>/runs/<run name>/`, so an interrupted
reproduction continues where it stopped: a run whose report exists and was
made with the same settings is reused, one with a checkpoint is resumed, any
other is started afresh.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

REPORT_JSON = "report.json"
MIB = float(1 << 20)


@attrs.frozen
class Run:
  """One experiment of a reproduction."""

  name: str
  config: Any  # tff_hetero.program.ExperimentConfig


def _has_checkpoint(run_dir: str) -> bool:
  checkpoints = os.path.join(run_dir, "checkpoints")
  return os.path.isdir(checkpoints) and any(
      f.endswith(".json") for f in os.listdir(checkpoints))


def _same_settings(saved: Mapping[str, Any], config) -> bool:
  """Whether a saved report's config is `config`'s.

  A setting the report lacks (added to `ExperimentConfig` after the run)
  matches when `config` leaves it at its default.
  """
  current = json.loads(json.dumps(config.to_json_dict()))
  defaults = json.loads(json.dumps(type(config)().to_json_dict()))
  return all(saved[key] == value if key in saved else value == defaults[key]
             for key, value in current.items())


def run_all(runs: Sequence[Run], *,
            log: Callable[[str], None] = print) -> dict[str, dict]:
  """Runs (or reuses, or resumes) every run; returns name -> report."""
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  reports = {}
  for i, run in enumerate(runs, start=1):
    config = run.config
    run_dir = config.experiment_dir
    report_path = os.path.join(run_dir, REPORT_JSON)
    if os.path.exists(report_path):
      with open(report_path) as f:
        report = json.load(f)
      if (_same_settings(report.get("config") or {}, config) and
          report.get("rounds_completed") == config.rounds):
        log(f"[{i}/{len(runs)}] {run.name}: done before, reused")
        reports[run.name] = report
        continue
      raise SystemExit(
          f"error: {run_dir} holds a run made with other settings; choose"
          " another --experiment_name or remove it")
    resume = _has_checkpoint(run_dir)
    log(f"[{i}/{len(runs)}] {run.name}: "
        f"{'resuming' if resume else 'running'} ({config.algorithm},"
        f" {config.rounds} rounds)")
    result = loop.run_experiment(attrs.evolve(config, resume=resume))
    reports[run.name] = result.report
    accuracy = result.report["final_metrics"].get("accuracy")
    log(f"    final accuracy {accuracy:.4f}")
  return reports


def final_metric(report: Mapping[str, Any], key: str) -> float:
  """A final metric of a report (NaN when the run does not report it)."""
  value = report.get("final_metrics", {}).get(key)
  return math.nan if value is None else float(value)


def history_sum(report: Mapping[str, Any], key: str) -> float:
  """The sum of a per-round metric over a run's history."""
  return float(sum(row.get(key) or 0.0 for row in report["history"]))


def percent(value: float) -> str:
  return "-" if value is None or math.isnan(value) else f"{100 * value:.2f}"


def markdown_table(headers: Sequence[str],
                   rows: Sequence[Sequence[Any]]) -> str:
  lines = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---" for _ in headers) + "|"]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def write_text(path: str, text: str) -> None:
  temp = f"{path}.tmp"
  with open(temp, "w") as f:
    f.write(text)
  os.replace(temp, path)


def base_config(defaults: Mapping[str, Any]):
  """An `ExperimentConfig` from `pipelines.train`'s flags.

  A reproduction accepts every flag of `pipelines.train` (same names, same
  checks); a flag not given on the command line takes the reproduction's
  default from `defaults`, else train's.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  from pipelines import train  # pylint: disable=g-import-not-at-top

  config = train.config_from_flags()
  given = {name for name in defaults
           if name in flags.FLAGS and flags.FLAGS[name].present}
  return attrs.evolve(config, **{k: v for k, v in defaults.items()
                                 if k not in given})
