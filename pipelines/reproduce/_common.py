"""Shared plumbing of the reproduction pipelines (`pipelines/reproduce/*.py`).

A reproduction is a list of named runs (each an `ExperimentConfig`) whose
reports fill tables printed beside the paper's numbers. Runs live under
`<root_output_dir>/<experiment_name>/runs/<run name>/`, so an interrupted
reproduction continues where it stopped: a run whose report exists and was
made with the same settings is reused, one with a checkpoint is resumed, any
other is started afresh (outputs of a run stopped before its first checkpoint
are moved aside to `<run name>.interrupted[-N]`, not deleted). A run that
diverges is a result, not a failure: its `report.json` holds the rows
before the divergence and `diverged_at_round` (`diverged_report`). Several
processes may work on one reproduction at once (start the same command once
per core): each run is locked by the process doing it, the others move on and
wait for it at the end.

A reproduction also continues on another machine from what was committed.
Each finished run leaves its record and rows beside the tables as soon as it
ends (`records/<run>.json`, `metrics/<run>.csv`: `keep_record`), and
`--reuse_from=docs/reproductions/<paper>` restores each run not done under
`--root_output_dir` whose record there (in `results.json` or `records/`) has
the same settings and all its rounds (`restore_run`), instead of running it
again.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
import contextlib
import csv
import datetime
import fcntl
import json
import math
import os
import shutil
import statistics
import subprocess
from typing import Any

from absl import flags
import attrs

from tff_hetero import settings as settings_lib
from tff_hetero.errors import DivergenceError
from tff_hetero.errors import UsageError
from tff_hetero.program import atomic_files
from tff_hetero.program import configs

REPORT_JSON = "report.json"

# The parts of a paper a pipeline runs (its `PARTS`; all when not given).
# Defined once: several pipelines may be imported into one process.
PARTS_FLAG = flags.DEFINE_list(
  "parts",
  [],
  "Which parts of the paper to run (the pipeline's PARTS,"
  " comma-separated; default all).",
)
# Seeds of the runs a pipeline repeats (its own default when not given).
SEEDS_FLAG = flags.DEFINE_list(
  "seeds",
  [],
  "Seeds of the repeated runs (comma-separated integers;"
  " default the pipeline's).",
)
REUSE_FROM_FLAG = flags.DEFINE_string(
  "reuse_from",
  "",
  "A reproduction's committed output directory (its results.json or"
  " records/<run>.json, and metrics/<run>.csv; e.g."
  " docs/reproductions/inclusivefl): every run not done under"
  " --root_output_dir whose record there has the same settings and all its"
  " rounds is restored from it instead of run again.",
)
MIB = float(1 << 20)
PROVENANCE_JSON = "provenance.json"
RESULTS_JSON = "results.json"
RECORDS_DIR = "records"


@attrs.frozen
class Run:
  """One experiment of a reproduction."""

  name: str
  config: Any  # tff_hetero.program.ExperimentConfig


class RunPlan:
  """The runs of a reproduction, each once, under `<base dir>/runs/<name>`."""

  def __init__(self, base, given=None):
    """`given`: algorithm settings for every run whose algorithm reads them
    (default: those given on the command line), below each run's changes."""
    self._base = base
    self._given = given_algorithm_settings() if given is None else given
    self._runs_dir = os.path.join(
      base.root_output_dir, base.experiment_name, "runs"
    )
    self._runs: dict[str, Run] = {}

  def add(self, name: str, **changes) -> str:
    """Adds run `name`: the base settings with `changes` (flat settings;
    with another `algorithm`, the settings it shares with the base's carry
    over: `tff_hetero.program.evolve_config`), once per name."""
    if name not in self._runs:
      read = configs.algorithm_settings(
        changes.get("algorithm", self._base.algorithm)
      )
      given = {
        k: v for k, v in self._given.items() if k in read and k not in changes
      }
      self._runs[name] = Run(
        name,
        configs.evolve_config(
          self._base,
          **given,
          root_output_dir=self._runs_dir,
          experiment_name=name,
          resume=False,
          **changes,
        ),
      )
    return name

  def add_seeds(self, name: str, seeds: Sequence[int], **changes) -> list[str]:
    """Adds `name` once per seed (`<name>_seed<k>`); returns their names."""
    return [
      self.add(seed_name(name, seed), seed=int(seed), **changes)
      for seed in seeds
    ]

  def runs(self) -> list[Run]:
    return list(self._runs.values())


def slug(text: str) -> str:
  """A table label as a run name: 'InclusiveFL w/o MD' -> 'inclusivefl_w_o_md'."""
  return "".join(c if c.isalnum() else "_" for c in text).strip("_").lower()


def seed_name(name: str, seed: int) -> str:
  return f"{name}_seed{int(seed)}"


def seeds_from_flag(default: Sequence[int]) -> list[int]:
  """`--seeds` as integers (the pipeline's `default` when not given);
  a one-line error naming the flag when malformed."""
  from pipelines import _cli  # pylint: disable=g-import-not-at-top

  if not SEEDS_FLAG.value:
    return [int(s) for s in default]
  try:
    seeds = [int(s) for s in SEEDS_FLAG.value]
  except ValueError:
    _cli.fail(
      f"--seeds: {','.join(SEEDS_FLAG.value)!r} is not a list of integers"
    )
  if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
    _cli.fail(
      f"--seeds: need distinct integers >= 0, got {','.join(SEEDS_FLAG.value)}"
    )
  return seeds


def code_version(repo_dir: str | None = None) -> dict:
  """The git commit the code runs at, and whether its sources differ from
  it (`dirty`: uncommitted changes under tff_hetero/ or pipelines/)."""
  repo_dir = repo_dir or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )

  def git(*args):
    try:
      return subprocess.run(
        ("git", "-C", repo_dir) + args,
        check=True,
        capture_output=True,
        text=True,
      ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
      return None

  commit = git("rev-parse", "HEAD")
  changes = git("status", "--porcelain", "--", "tff_hetero", "pipelines")
  return collections.OrderedDict(commit=commit, dirty=bool(changes))


def _record_segment(run_dir: str, action: str) -> None:
  """Appends when and at which commit a run was started or resumed."""
  path = os.path.join(run_dir, PROVENANCE_JSON)
  segments = []
  if os.path.exists(path):
    with open(path) as f:
      segments = json.load(f)["segments"]
  segment = code_version()
  segment.update(
    action=action,
    at=datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds"
    ),
  )
  os.makedirs(run_dir, exist_ok=True)
  atomic_files.write_text(
    path, json.dumps({"segments": segments + [segment]}, indent=1)
  )


def provenance(report_dir: str) -> list[dict]:
  """The commits a run ran at (`[]` for runs made before this was kept)."""
  path = os.path.join(report_dir, PROVENANCE_JSON)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f)["segments"]


def run_record(run: Run, report: Mapping[str, Any]) -> collections.OrderedDict:
  """One run for `results.json`: settings, seed, final and best metrics,
  and the commits it ran at."""
  return collections.OrderedDict(
    name=run.name,
    seed=run.config.seed,
    settings=report.get("config"),
    final_metrics=report.get("final_metrics"),
    best_accuracy=report.get("best_accuracy"),
    best_accuracy_by_upload_mib=report.get("best_accuracy_by_upload_mib"),
    rounds_completed=report.get("rounds_completed"),
    bytes_up_total=report.get("bytes_up_total"),
    wall_time_s=report.get("wall_time_s"),
    **{key: report[key] for key in _MORE_RECORDED if key in report},
    code=provenance(run.config.experiment_dir),
  )


# Report totals a run's record keeps beyond those above (when the run has
# them), so that a run restored from its record (`restore_run`) has them.
_MORE_RECORDED = (
  "algorithm",
  "glue",
  "final_round",
  "bytes_down_total",
  "client_flops_total",
  "examples_processed_total",
  "non_finite_updates_total",
  "diverged_at_round",
  "diverged",
)
# Record keys that are not report keys.
_RECORD_ONLY = ("name", "seed", "settings", "code")


def seed_stats(values: Sequence[float]) -> collections.OrderedDict:
  """Mean, sample standard deviation, min and max over seeds (NaNs out)."""
  kept = [float(v) for v in values if v is not None and not math.isnan(v)]
  if not kept:
    return collections.OrderedDict(
      mean=math.nan, std=math.nan, min=math.nan, max=math.nan, n=0
    )
  return collections.OrderedDict(
    mean=statistics.fmean(kept),
    std=statistics.stdev(kept) if len(kept) > 1 else 0.0,
    min=min(kept),
    max=max(kept),
    n=len(kept),
  )


def mean_std_percent(values: Sequence[float]) -> str:
  """`mean ± std` of fractions, in percent (one value: just it)."""
  stats = seed_stats(values)
  if stats["n"] == 0:
    return "-"
  if stats["n"] == 1:
    return f"{100 * stats['mean']:.1f}"
  return f"{100 * stats['mean']:.1f} ± {100 * stats['std']:.1f}"


def claim_verdict(
  ours: Sequence[float], baseline: Sequence[float], noise: float = 0.0
) -> str:
  """Whether `ours` beats `baseline` over seeds: "within noise" when the
  difference of the means is not larger than the larger standard deviation
  of the two (or than `noise`, the spread a one-seed comparison borrows from
  runs with several seeds), else "supported" (higher) or "not supported"
  (lower)."""
  a, b = seed_stats(ours), seed_stats(baseline)
  if a["n"] == 0 or b["n"] == 0:
    return "not measured"
  difference = a["mean"] - b["mean"]
  if abs(difference) <= max(a["std"], b["std"], noise):
    return "within noise"
  return "supported" if difference > 0 else "not supported"


def _has_checkpoint(run_dir: str) -> bool:
  checkpoints = os.path.join(run_dir, "checkpoints")
  return os.path.isdir(checkpoints) and any(
    f.endswith(".json") for f in os.listdir(checkpoints)
  )


def prepare_run_dir(run_dir: str, log: Callable[[str], None] = print) -> bool:
  """Whether the run in `run_dir` resumes from a checkpoint.

  A run stopped before its first checkpoint left rows but no state to resume
  from; its outputs are moved aside (kept) so the run starts afresh.
  """
  if _has_checkpoint(run_dir):
    return True
  if os.path.isdir(run_dir) and os.listdir(run_dir):
    aside, n = f"{run_dir}.interrupted", 1
    while os.path.exists(aside):
      n += 1
      aside = f"{run_dir}.interrupted-{n}"
    os.replace(run_dir, aside)
    log(
      f"    stopped before its first checkpoint; its outputs moved to {aside}"
    )
  return False


def _csv_value(text: str):
  if text == "":
    return math.nan
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def _history_from_csv_file(path: str) -> list[dict]:
  """The rows of a metrics CSV: numbers as numbers, an empty cell (a
  metric not measured that round) as NaN."""
  with open(path, newline="") as f:
    return [
      {key: _csv_value(value) for key, value in row.items()}
      for row in csv.DictReader(f)
    ]


def _history_from_csv(run_dir: str) -> list[dict]:
  """A run's rows from its `metrics.csv` ([] without one)."""
  path = os.path.join(run_dir, "metrics.csv")
  return _history_from_csv_file(path) if os.path.exists(path) else []


def diverged_report(config, message: str) -> dict:
  """The report of a run that diverged (`DivergenceError`), written as its
  `report.json`: its settings, the rows it released before the round that
  diverged, `diverged_at_round` and the message, no final metrics. A
  diverged run is a result of the method (the paper's SCAFFOLD diverges
  too), reused as such on the next call (runs are seeded)."""
  history = _history_from_csv(config.experiment_dir)
  done = int(history[-1]["round"]) if history else 0
  report = collections.OrderedDict(
    config=config.to_json_dict(),
    history=history,
    final_metrics={},
    rounds_completed=done,
    diverged_at_round=done + 1,
    diverged=message,
  )
  atomic_files.write_text(
    os.path.join(config.experiment_dir, REPORT_JSON),
    json.dumps(report, indent=1, allow_nan=True),
  )
  return report


def _holds_all_rounds(done, diverged, rounds: int) -> bool:
  """Whether a run that completed `done` rounds (and diverged at round
  `diverged`, or None) is the result of a `rounds`-round run: it ran them
  all, or diverged within them (one that diverged later finished these)."""
  if diverged:
    return diverged <= rounds
  return done == rounds


def _saved_report(run: Run) -> dict | None:
  """The run's report if it is complete with these settings, else None
  (also for a run that ended with these settings at fewer rounds and kept
  its checkpoints: it continues to the new `--rounds`)."""
  config = run.config
  report_path = os.path.join(config.experiment_dir, REPORT_JSON)
  if not os.path.exists(report_path):
    return None
  with open(report_path) as f:
    report = json.load(f)
  if config.same_results_as(report.get("config") or {}):
    done = report.get("rounds_completed")
    diverged = report.get("diverged_at_round")
    if _holds_all_rounds(done, diverged, config.rounds):
      return report
    if (
      isinstance(done, int)
      and done < config.rounds
      and _has_checkpoint(config.experiment_dir)
    ):
      return None  # Extended: resumes from its last checkpoint.
  raise SystemExit(
    f"error: {config.experiment_dir} holds a run made with other settings;"
    " choose another --experiment_name or remove it"
  )


def committed_records(directory: str) -> dict[str, Mapping[str, Any]]:
  """Run name -> record (`run_record`) of a reproduction's output directory:
  its `results.json` runs, and the `records/<run>.json` of runs finished
  since (`keep_record`), which win; `UsageError` naming `--reuse_from` when
  it has neither."""
  records = {}
  path = os.path.join(directory, RESULTS_JSON)
  records_dir = os.path.join(directory, RECORDS_DIR)
  try:
    if os.path.exists(path) or not os.path.isdir(records_dir):
      with open(path) as f:
        records.update((r["name"], r) for r in json.load(f)["runs"])
    if os.path.isdir(records_dir):
      for name in sorted(os.listdir(records_dir)):
        if name.endswith(".json"):
          with open(os.path.join(records_dir, name)) as f:
            record = json.load(f)
          records[record["name"]] = record  # Newer than results.json.
  except (OSError, ValueError, KeyError, TypeError) as error:
    raise UsageError(
      "--reuse_from",
      f"{directory!r} holds no readable {RESULTS_JSON} with a runs list"
      f" or {RECORDS_DIR}/ ({type(error).__name__}); give a reproduction's"
      " output directory",
    ) from None
  return records


def keep_record(run: Run, report: Mapping[str, Any]) -> None:
  """Writes a finished run's record and rows where a later session can
  restore it from (`restore_run`) before the tables are written:
  `<output dir>/records/<run>.json` and `<output dir>/metrics/<run>.csv`."""
  run_dir = run.config.experiment_dir
  out_dir = os.path.dirname(os.path.dirname(run_dir))
  os.makedirs(os.path.join(out_dir, RECORDS_DIR), exist_ok=True)
  atomic_files.write_text(
    os.path.join(out_dir, RECORDS_DIR, f"{run.name}.json"),
    json.dumps(run_record(run, report), indent=1, allow_nan=True),
  )
  source = os.path.join(run_dir, "metrics.csv")
  if os.path.exists(source):
    os.makedirs(os.path.join(out_dir, "metrics"), exist_ok=True)
    shutil.copyfile(source, os.path.join(out_dir, "metrics", f"{run.name}.csv"))


def restore_run(run: Run, record: Mapping[str, Any], source_dir: str) -> bool:
  """Restores a committed run into `run`'s directory; whether it did.

  Restored when `record` (the run's entry of `source_dir`'s `results.json`
  or `records/`) was made with settings that give the same results as `run`'s and holds
  all its rounds (or diverged within them), and `metrics/<name>.csv` has
  one row per completed round. Writes the run's `metrics.csv`, a
  `report.json` of the record's totals and the CSV's rows (an empty cell as
  NaN, as in `diverged_report`; `restored_from` names the source) and
  `provenance.json` (the commits the record ran at, then this restore).
  Records written before 2026-11-27 lack `algorithm` and
  `examples_processed_total` (FedGKT's tables read them: rerun those runs);
  their byte and FLOP totals are taken from the rows. A restored run has no
  checkpoint: it cannot be extended to more rounds.
  """
  config = run.config
  if not config.same_results_as(record.get("settings") or {}):
    return False
  done, diverged = (
    record.get("rounds_completed"),
    record.get("diverged_at_round"),
  )
  if not _holds_all_rounds(done, diverged, config.rounds):
    return False
  source_csv = os.path.join(source_dir, "metrics", f"{run.name}.csv")
  if not os.path.exists(source_csv):
    return False
  run_dir = config.experiment_dir
  prepare_run_dir(run_dir)
  os.makedirs(run_dir, exist_ok=True)
  staged = os.path.join(run_dir, "metrics.csv.restoring")
  shutil.copyfile(source_csv, staged)
  history = _history_from_csv_file(staged)
  last = history[-1] if history else {}
  if (
    len(history) != done
    or (done and last.get("round") != done)
    or (
      record.get("bytes_up_total") is not None
      and last.get("bytes_up_cumulative", record["bytes_up_total"])
      != record["bytes_up_total"]
    )
  ):  # Rows of another run than the record's.
    os.remove(staged)
    return False
  os.replace(staged, os.path.join(run_dir, "metrics.csv"))
  segment = collections.OrderedDict(
    action="restored",
    source=os.path.abspath(source_dir),
    at=datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds"
    ),
  )
  atomic_files.write_text(
    os.path.join(run_dir, PROVENANCE_JSON),
    json.dumps(
      {"segments": list(record.get("code") or []) + [segment]}, indent=1
    ),
  )
  report = collections.OrderedDict(config=record["settings"])
  report.update(
    (key, value)
    for key, value in record.items()
    if key not in _RECORD_ONLY and value is not None
  )
  # Records written before they kept these: the rows hold them.
  if "bytes_down_total" not in report and "bytes_down_cumulative" in last:
    report["bytes_down_total"] = last["bytes_down_cumulative"]
  if "client_flops_total" not in report and "client_flops" in last:
    report["client_flops_total"] = int(
      sum(row.get("client_flops") or 0 for row in history)
    )
  report.update(history=history, restored_from=segment["source"])
  atomic_files.write_text(
    os.path.join(run_dir, REPORT_JSON),
    json.dumps(report, indent=1, allow_nan=True),
  )
  return True


@contextlib.contextmanager
def _run_lock(run: Run, *, wait: bool) -> Iterator[bool]:
  """An exclusive lock on the run (`runs/.locks/<name>`); yields whether held.

  Several processes may work on one reproduction (e.g. one per core): each
  run is done by whichever process locks it first.
  """
  locks = os.path.join(os.path.dirname(run.config.experiment_dir), ".locks")
  os.makedirs(locks, exist_ok=True)
  with open(os.path.join(locks, run.name), "w") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
      yield False
      return
    try:
      yield True
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def run_all(
  runs: Sequence[Run],
  *,
  log: Callable[[str], None] = print,
  reuse_from: str | None = None,
) -> dict[str, dict]:
  """Runs (or reuses, or resumes) every run; returns name -> report.

  A run another process is doing (locked) is left for last, then waited for.
  `reuse_from`: a committed reproduction directory whose runs are restored
  (`restore_run`) where this one has neither a report nor a checkpoint.
  """
  records = committed_records(reuse_from) if reuse_from else {}
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  reports, busy = {}, []
  for i, run in enumerate(runs, start=1):
    tag = f"[{i}/{len(runs)}] {run.name}"
    with _run_lock(run, wait=False) as held:
      if not held:
        log(f"{tag}: another process is running it; left for last")
        busy.append(run)
        continue
      report = _saved_report(run)
      if report is not None:
        log(f"{tag}: done before, reused")
        reports[run.name] = report
        keep_record(run, report)
        continue
      config = run.config
      if (
        run.name in records
        and not os.path.exists(os.path.join(config.experiment_dir, REPORT_JSON))
        and not _has_checkpoint(config.experiment_dir)
        and restore_run(run, records[run.name], reuse_from)
      ):
        log(f"{tag}: restored from {reuse_from}")
        reports[run.name] = _saved_report(run)
        keep_record(run, reports[run.name])
        continue
      action = (
        "resuming" if _has_checkpoint(config.experiment_dir) else "running"
      )
      log(f"{tag}: {action} ({config.algorithm}, {config.rounds} rounds)")
      resume = prepare_run_dir(config.experiment_dir, log)
      _record_segment(config.experiment_dir, "resumed" if resume else "started")
      try:
        result = loop.run_experiment(attrs.evolve(config, resume=resume))
      except DivergenceError as error:
        reports[run.name] = diverged_report(config, str(error))
        keep_record(run, reports[run.name])
        log(f"    {error}: kept as a result (report.json says so)")
        continue
      reports[run.name] = result.report
      keep_record(run, result.report)
      accuracy = result.report["final_metrics"].get("accuracy")
      log(f"    final accuracy {accuracy:.4f}")
  for run in busy:
    log(f"waiting for {run.name} (another process)")
    with _run_lock(run, wait=True):
      report = _saved_report(run)
    if report is None:
      raise SystemExit(
        f"error: the process running {run.name} stopped before it ended;"
        " run again to continue it"
      )
    reports[run.name] = report
    keep_record(run, report)
  return {run.name: reports[run.name] for run in runs}


def final_metric(report: Mapping[str, Any], key: str) -> float:
  """A final metric of a report (NaN when the run does not report it)."""
  value = report.get("final_metrics", {}).get(key)
  return math.nan if value is None else float(value)


def history_sum(report: Mapping[str, Any], key: str) -> float:
  """The sum of a per-round metric over a run's history."""
  return float(sum(row.get(key) or 0.0 for row in report["history"]))


def percent(value: float) -> str:
  return "-" if value is None or math.isnan(value) else f"{100 * value:.2f}"


def markdown_table(
  headers: Sequence[str], rows: Sequence[Sequence[Any]]
) -> str:
  lines = [
    "| " + " | ".join(headers) + " |",
    "|" + "|".join("---" for _ in headers) + "|",
  ]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def base_config(defaults: Mapping[str, Any]):
  """The reproduction's base `ExperimentConfig` from `pipelines.train`'s flags.

  A reproduction accepts every flag of `pipelines.train` (same names, same
  checks); a flag not given on the command line takes the reproduction's
  default from `defaults` (which names the reproduction's main
  `algorithm`), else train's. The base is a config of the main algorithm; a
  given flag that only other algorithms read reaches their runs through
  `RunPlan` (`given_algorithm_settings`).
  """
  values, given = settings_lib.values_from_flags(
    flags.FLAGS, configs.flag_specs()
  )
  if "algorithm" in given:
    raise UsageError(
      "--algorithm", "a reproduction sets each run's algorithm; drop the flag"
    )
  values.update((k, v) for k, v in defaults.items() if k not in given)
  read = configs.COMMON_SETTINGS | set(
    configs.algorithm_settings(values["algorithm"])
  )
  return configs.config_from_values(values, given & read)


def given_algorithm_settings() -> dict[str, Any]:
  """The algorithm settings given on the command line ({} before flags are
  parsed): `RunPlan` applies each to the runs whose algorithm reads it."""
  if not flags.FLAGS.is_parsed():
    return {}
  values, given = settings_lib.values_from_flags(
    flags.FLAGS, configs.flag_specs()
  )
  return {k: values[k] for k in given if k not in configs.COMMON_SETTINGS}


def curve(
  report: Mapping[str, Any],
  x_key: str,
  y_key: str = "accuracy",
  x_scale: float = 1.0,
) -> list[tuple[float, float]]:
  """(x, y) of every evaluated round of a report."""
  return [
    (row[x_key] / x_scale, row[y_key])
    for row in report["history"]
    if row.get(y_key) is not None and not math.isnan(row[y_key])
  ]


def copy_run_metrics(out_dir: str, names) -> None:
  """Each named run's `runs/<name>/metrics.csv` to `metrics/<name>.csv`
  under `out_dir` (runs without one are skipped)."""
  metrics_dir = os.path.join(out_dir, "metrics")
  os.makedirs(metrics_dir, exist_ok=True)
  for name in names:
    source = os.path.join(out_dir, "runs", name, "metrics.csv")
    if os.path.exists(source):
      shutil.copyfile(source, os.path.join(metrics_dir, f"{name}.csv"))


def plot_curves(
  path: str,
  curves: Mapping[str, Sequence[tuple]],
  xlabel: str,
  ylabel: str = "test accuracy",
) -> str:
  """One line per named curve, saved as a PNG at `path`."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
  styles = ("-", "--", ":")  # After each 10 colours, the next line style.
  for i, (label, points) in enumerate(curves.items()):
    if points:
      ax.plot(
        *zip(*points),
        marker="o",
        markersize=2,
        label=label,
        linestyle=styles[(i // 10) % len(styles)],
      )
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path


def _check_given_settings_are_read(runs: Sequence[Run]) -> None:
  """`UsageError` for a given flag that no planned run's algorithm reads."""
  read = set()
  for run in runs:
    read.update(configs.algorithm_settings(run.config.algorithm))
  for name in given_algorithm_settings():
    if name not in read:
      raise UsageError(
        f"--{name}",
        "no run of this reproduction reads it (its runs: "
        + ", ".join(sorted({r.config.algorithm for r in runs}))
        + ")",
      )


def reproduce_main(
  argv: Sequence[str],
  *,
  flag: str,
  selected: Sequence[str],
  accepted: Sequence[str],
  defaults: Mapping[str, Any],
  plan_runs: Callable,
  build_tables: Callable,
  plot: Callable,
  check: Callable | None = None,
) -> None:
  """The `main` of a reproduction pipeline.

  Checks the selection flag (`flag`, values `selected` among `accepted`) and
  every setting (`check(base)` for the pipeline's own) before any run; runs
  or resumes `plan_runs(base, parts)`; writes `tables.md` and `results.json`
  from `build_tables(base, reports, parts)` and the plots of
  `plot(out_dir, reports, parts)`; prints the tables and where they are.
  """
  from pipelines import _cli  # pylint: disable=g-import-not-at-top

  if len(argv) > 1:
    _cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  parts = [p.strip() for p in selected]
  unknown = [p for p in parts if p not in accepted]
  if unknown or not parts:
    _cli.fail(
      f"{flag}: unknown value(s) {', '.join(unknown) or '(none)'};"
      f" accepted: {', '.join(accepted)}"
    )
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  base = _cli.run_guarded(
    lambda: base_config(defaults), resume_hint="run again to continue"
  )
  out_dir = os.path.join(base.root_output_dir, base.experiment_name)

  def run():
    loop.validate_config(base)
    if check is not None:
      check(base)
    runs = plan_runs(base, parts)
    _check_given_settings_are_read(runs)
    print(f"{len(runs)} runs under {out_dir}/runs", flush=True)
    return run_all(
      runs,
      log=lambda m: print(m, flush=True),
      reuse_from=REUSE_FROM_FLAG.value or None,
    )

  reports = _cli.run_guarded(run, resume_hint="run again to continue")
  text, results = build_tables(base, reports, parts)
  atomic_files.write_text(os.path.join(out_dir, "tables.md"), text)
  atomic_files.write_text(
    os.path.join(out_dir, "results.json"), json.dumps(results, indent=1)
  )
  paths = plot(out_dir, reports, parts)
  print(text)
  print(f"tables: {out_dir}/tables.md")
  for path in paths:
    print(f"plot: {path}")
