"""The training program: rounds of any `FederatedAlgorithm` with everything around them.

`run_experiment(config)` loads and partitions the data, builds the device
population, the model task and the algorithm, then for each round: samples a
cohort among the clients available that round, builds their datasets with
seeds drawn from the checkpointed RNG, runs the algorithm's round, records
the measured traffic and compute in the `CommLedger`, stops on non-finite
loss or weights, evaluates every `--eval_every` rounds, releases the metrics,
checkpoints every `--checkpoint_every` rounds, and at the end writes the
report and plots. With `--resume` it continues from the newest checkpoint and
ends with the same weights and metrics as an uninterrupted run. With
`--client_data=files` the clients' training arrays are written once to files
the workers read (`tff_hetero.data.ClientFiles`, removed when the run ends)
and the rounds send each client's sample order instead of its samples.

Text data (the GLUE tasks ``--dataset=glue_<task>``, int32 token ids) need a
model for token ids (`resolve_model`): ``--model=text_transformer``, or
``transformer`` (InclusiveFL's default), which on text data is built as its
token counterpart ``text_transformer`` (`TOKEN_COUNTERPARTS`; the config
keeps the name given, the report's ``glue.model`` says what was built). Any
other image model on text, a token model on images, ``--augment`` other than
none on text, and ``--dataset=glue_stsb`` (a regression) are one-line
`UsageError`s. On a GLUE task every evaluation also reports the task's
metric (`tff_hetero.data.text_metrics.GLUE_METRICS`: ``f1`` for MRPC,
``matthews_corrcoef`` for CoLA, ``matched_accuracy`` for MNLI) of every
evaluated model on the whole test split, named like its accuracy
(``f1``, ``L4_f1``, ``avg_f1``, ...); for the tasks whose metric is accuracy
that is the ``accuracy`` column itself. `report.json` holds the metric's
name and the final values (``glue``, ``final_metrics``); "best" figures
stay the best accuracy, and each round's metric is in ``history`` and
metrics.csv.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
import contextlib
import functools
import math
import os
import sys
import time
from typing import Any
from typing import Optional

import attrs
import numpy as np

from tff_hetero import data as data_lib
from tff_hetero import devices as devices_lib
from tff_hetero import models as models_lib
from tff_hetero import runtime
from tff_hetero.accounting import CommLedger
from tff_hetero.aggregators import model_aggregators
from tff_hetero.algorithms import api
from tff_hetero.algorithms import task_devices
from tff_hetero.algorithms.registry import ALGORITHMS
from tff_hetero.data import text_metrics
from tff_hetero.errors import DivergenceError
from tff_hetero.errors import UsageError
from tff_hetero.program import atomic_files
from tff_hetero.program import checkpoint as checkpoint_lib
from tff_hetero.program import outputs
from tff_hetero.program import profiling
from tff_hetero.program.config import ExperimentConfig
from tff_hetero.program.evaluation import CentralEvaluator
from tff_hetero.program.evaluation import TaskMetric
from tff_hetero.program.progress import ProgressBar
from tff_hetero.program.sampling import CohortSampler
from tff_hetero.runtime import heap

MIB = outputs.MIB

# Errors that mean "this input cannot run": the CLI prints them in one line
# and exits with status 2.
USER_ERRORS = (
  UsageError,
  data_lib.DataError,
  models_lib.ModelError,
  devices_lib.DeviceError,
  runtime.WorkerUnavailableError,
)


# Image models built as their counterpart on token ids when the data are
# text: InclusiveFL's registry default `transformer` works on GLUE as is.
TOKEN_COUNTERPARTS = {"transformer": "text_transformer"}


def resolve_model(model: str, dataset: str, tokens: bool) -> str:
  """The registered model a run builds: `model`, or on token data
  (`tokens`) its `TOKEN_COUNTERPARTS` entry.

  Raises:
    UsageError: (--model) an image model without a counterpart on token
      data, or a token model on images; the message names --dataset.
  """
  spec = models_lib.MODELS.get(model)
  if spec is None:
    raise UsageError(
      "--model",
      f"unknown value {model!r}; accepted: {', '.join(models_lib.MODELS)}",
    )
  if spec.takes_tokens == tokens:
    return model
  if tokens and model in TOKEN_COUNTERPARTS:
    return TOKEN_COUNTERPARTS[model]
  token_models = sorted(
    n for n, s in models_lib.MODELS.items() if s.takes_tokens
  )
  if tokens:
    raise UsageError(
      "--model",
      f"{model} takes images, but --dataset={dataset} holds token ids"
      f" (text); use a model for token ids: --model="
      + ", --model=".join(token_models),
    )
  raise UsageError(
    "--model",
    f"{model} takes token ids (text), but --dataset={dataset} holds images;"
    " use an image model, e.g. --model=transformer",
  )


def validate_config(config: ExperimentConfig) -> ExperimentConfig:
  if config.dataset in data_lib.UNSUPPORTED_DATASETS:
    raise UsageError("--dataset", data_lib.UNSUPPORTED_DATASETS[config.dataset])
  config.validate(
    algorithms=ALGORITHMS.keys(),
    datasets=data_lib.DATASETS.keys(),
    models=models_lib.MODELS.keys(),
    partitions=data_lib.PARTITIONERS.keys(),
    executors=runtime.available_executors(),
    augmentations=data_lib.AUGMENTATIONS.keys(),
  )
  text = data_lib.is_text_dataset(config.dataset)
  if text and config.augment != "none":
    raise UsageError(
      "--augment",
      f"--dataset={config.dataset} holds token ids (text), which take no"
      f" augmentation; got --augment={config.augment}, use --augment=none",
    )
  resolve_model(config.model, config.dataset, text)
  settings_cls = ALGORITHMS[config.algorithm].settings
  if type(config.settings) is not settings_cls:
    raise UsageError(
      "--algorithm",
      f"{config.algorithm} reads {settings_cls.__name__}, the config holds"
      f" {type(config.settings).__name__} (build configs with"
      " tff_hetero.program.make_config)",
    )
  accepted = ALGORITHMS[config.algorithm].client_optimizers
  if config.client_optimizer not in accepted:
    raise UsageError(
      "--client_optimizer",
      f"{config.algorithm} accepts"
      f" {', '.join(accepted)}, got {config.client_optimizer!r}",
    )
  if (
    config.client_momentum and not ALGORITHMS[config.algorithm].client_momentum
  ):
    raise UsageError(
      "--client_momentum",
      f"{config.algorithm} trains with plain SGD, accepts 0 only, got"
      f" {config.client_momentum}",
    )
  model_aggregators.check_settings(
    config.aggregator, config.clip_norm, config.noise_multiplier
  )
  accepted = ALGORITHMS[config.algorithm].aggregators
  if config.aggregator not in accepted:
    raise UsageError(
      "--aggregator",
      f"{config.algorithm} accepts {', '.join(accepted)},"
      f" got {config.aggregator!r}",
    )
  return config


@attrs.frozen
class Experiment:
  """Everything built from a config before the first round."""

  config: ExperimentConfig
  splits: Any
  federated_data: Any
  population: Any
  task: api.Task
  algorithm: api.FederatedAlgorithm


def _vocab_size(splits) -> int:
  """The token ids' range of text splits: their vocabulary's size, or
  (splits without one) the largest id + 1."""
  vocab_size = getattr(splits, "vocab_size", None)
  if vocab_size is not None:
    return int(vocab_size)
  return 1 + max(
    int(np.max(s.x, initial=0)) for s in (splits.train, splits.test)
  )


def build_task(config: ExperimentConfig, splits) -> api.Task:
  """The `api.Task` of `config` on `splits`: the model (`resolve_model`)
  built for the data's input shape, classes and (token ids) vocabulary, and
  the batch spec with the data's dtypes (float32 images or int32 token ids,
  int32 labels)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  x_dtype = np.asarray(splits.train.x).dtype
  y_dtype = np.asarray(splits.train.y).dtype
  tokens = bool(np.issubdtype(x_dtype, np.integer))
  model = resolve_model(
    config.model, getattr(splits, "name", config.dataset), tokens
  )
  inputs = {"vocab_size": _vocab_size(splits)} if tokens else {}

  def build(**kwargs):
    return models_lib.build_model(
      model,
      splits.input_shape,
      splits.num_classes,
      seed=config.seed,
      **inputs,
      **kwargs,
    )

  def model_fn():
    return build()

  def width_model_fn(widths):
    return build(widths=tuple(widths))

  depths = tuple(models_lib.MODELS[model].depths)

  def depth_model_fn(depth):
    return build(depth=int(depth))

  probe = model_fn()
  element_spec = collections.OrderedDict(
    x=tf.TensorSpec([None, *splits.input_shape], tf.as_dtype(x_dtype)),
    y=tf.TensorSpec([None], tf.as_dtype(y_dtype)),
  )
  task = api.Task(
    model_name=model,
    model_fn=model_fn,
    input_shape=tuple(splits.input_shape),
    num_classes=splits.num_classes,
    element_spec=element_spec,
    training_flops_per_example=models_lib.training_flops_per_example(probe),
    width_model_fn=width_model_fn,
    width_units=models_lib.width_units(
      model, splits.input_shape, splits.num_classes
    ),
    depth_model_fn=depth_model_fn if depths else None,
    depths=depths,
  )
  # The probe counts as the full (and deepest) model the tiers are sized on.
  task_devices.adopt_full_model(task, probe)
  return task


def task_metric(splits) -> Optional[TaskMetric]:
  """The metric evaluation reports beside accuracy: a GLUE task's
  (`text_metrics.glue_metric`), None for other data."""
  if not isinstance(splits, data_lib.GlueSplits):
    return None
  return TaskMetric(
    splits.metric, functools.partial(text_metrics.glue_metric, splits.task)
  )


def _extra_metric(evaluator: CentralEvaluator) -> Optional[str]:
  """The name of the evaluator's metric column(s) beside accuracy, if any."""
  metric = evaluator.metric
  if metric is None or metric.name == "accuracy":
    return None
  return metric.name


def build_experiment(config: ExperimentConfig) -> Experiment:
  """Loads data, partitions, builds population, task and algorithm."""
  config = validate_config(config)
  splits = data_lib.load_dataset(
    config.dataset, data_dir=config.data_dir, seed=config.seed
  )
  federated_data = data_lib.build_federated_data(
    splits,
    num_clients=config.num_clients,
    method=config.partition,
    seed=config.seed,
    alpha=config.alpha,
    shards_per_client=config.shards_per_client,
    min_samples_per_client=config.min_samples_per_client,
    val_fraction=config.val_fraction,
  )
  task = build_task(config, splits)
  algorithm = ALGORITHMS[config.algorithm].builder(
    config, task, federated_data.client_ids
  )
  population = task_devices.build_population(
    config, federated_data.client_ids, task
  )
  # The algorithm took the models it wanted of those its tiers were counted
  # on; the others need not live as long as the run.
  task_devices.release_built_models(task)
  algorithm.attach(
    population,
    {
      c: federated_data.num_train_examples(c) for c in federated_data.client_ids
    },
  )
  return Experiment(config, splits, federated_data, population, task, algorithm)


def _warn(line: str) -> None:
  print(f"warning: {line}", file=sys.stderr, flush=True)


class ClientTrainingData(api.EvaluationData):
  """Every client's training data, one unshuffled epoch, for evaluation
  (read from `client_files` on the worker, if given)."""

  def __init__(
    self,
    federated_data,
    batch_size: int,
    client_states: Callable[[], Any] = dict,
    client_files: Optional[data_lib.ClientFiles] = None,
  ):
    self._fed = federated_data
    self._batch_size = batch_size
    self._client_states = client_states
    self._client_files = client_files

  def client_states(self):
    return self._client_states()

  def client_ids(self):
    return tuple(self._fed.client_ids)

  def client_validation(self, client_id):
    arrays = self._fed.client_validation(client_id)
    return arrays.x, arrays.y

  def client_datasets(self):
    return [
      data_lib.make_client_dataset(
        self._training_arrays(client_id),
        batch_size=self._batch_size,
        local_epochs=1,
        shuffle_seed=None,
      )
      for client_id in self._fed.client_ids
    ]

  def _training_arrays(self, client_id):
    arrays = self._fed.client_train(client_id)
    if self._client_files is None:
      return arrays
    return self._client_files.store(client_id, arrays)


def _evaluate(
  evaluator: CentralEvaluator,
  evaluated: "collections.OrderedDict[str, api.EvaluationModel]",
  members: Optional[dict] = None,
) -> collections.OrderedDict:
  """Test metrics of `evaluated` (`FederatedAlgorithm.evaluation_models`):
  per model (the first unprefixed, the others `<name>_`) or group of models
  (`<group>_`, means over the group) its accuracy, test loss and the
  evaluator's task metric if it has one besides accuracy (`task_metric`),
  and over several models their mean (`avg_`). `members`, if given, gets
  each group's accuracy per model name."""
  extra = _extra_metric(evaluator)
  keys = [("accuracy", "accuracy"), ("test_loss", "loss")]
  if extra is not None:
    keys.append((extra, extra))
  row = collections.OrderedDict()
  values = collections.defaultdict(list)
  groups = collections.OrderedDict()
  for index, (name, model) in enumerate(evaluated.items()):
    result = (
      evaluator(model.weights, model.model_fn)
      if model.data is None
      else evaluator(model.weights, model.model_fn, data=model.data)
    )
    if model.group is not None:
      groups.setdefault(model.group, []).append(result)
      continue
    prefix = "" if index == 0 else f"{name}_"
    for column, key in keys:
      row[f"{prefix}{column}"] = result[key]
      values[column].append(result[key])
  for group, results in groups.items():
    if members is not None:
      names = [n for n, m in evaluated.items() if m.group == group]
      members[group] = collections.OrderedDict(
        (n, r["accuracy"]) for n, r in zip(names, results)
      )
    for column, key in keys:
      row[f"{group}_{column}"] = float(np.mean([r[key] for r in results]))
  first = next(iter(evaluated.values()))
  if first.group is not None:
    for column, _ in reversed(keys):
      row[column] = row[f"{first.group}_{column}"]
      row.move_to_end(column, last=False)
  elif len(values["accuracy"]) > 1:
    row["avg_accuracy"] = float(np.mean(values["accuracy"]))
    if extra is not None:
      row[f"avg_{extra}"] = float(np.mean(values[extra]))
  return row


def _local_accuracy(evaluator, evaluated, data, members) -> float:
  """The first evaluated model's mean accuracy over the clients' own
  validation splits (`--local_evaluation`); each client's goes to
  `members["local"]`."""
  first = next(iter(evaluated.values()))
  accuracies = collections.OrderedDict()
  for client_id in data.client_ids():
    validation = data.client_validation(client_id)
    if validation is not None and len(validation[1]):
      result = evaluator(first.weights, first.model_fn, data=validation)
      accuracies[client_id] = result["accuracy"]
  members["local"] = accuracies
  return float(np.mean(list(accuracies.values())))


@attrs.frozen
class RunResult:
  report: dict
  experiment_dir: str
  final_weights: Any


def run_experiment(
  config: ExperimentConfig,
  *,
  on_round: Optional[Callable[[int, dict], None]] = None,
) -> RunResult:
  """Runs (or resumes) an experiment; see the module docstring."""
  experiment = build_experiment(config)
  config = experiment.config
  experiment_dir = config.experiment_dir
  checkpoints = checkpoint_lib.CheckpointManager(
    os.path.join(experiment_dir, "checkpoints"),
    keep_total=config.keep_checkpoints,
  )
  _check_output_dir(config, checkpoints)
  os.makedirs(experiment_dir, exist_ok=True)

  algorithm = experiment.algorithm
  fed = experiment.federated_data
  sampler = CohortSampler(config.seed)
  client_template = algorithm.initial_client_state()

  tls = config.tls()
  with (
    _client_files_context(config) as client_files,
    runtime.execution_context(
      config.executor,
      config.workers,
      config.worker_timeout_s,
      **({"tls": tls} if tls else {}),
    ) as execution,
  ):

    def survive(fn, what):
      with _client_file_errors(client_files, what):
        return execution.run_round(
          fn,
          redistribute=config.on_worker_loss == "redistribute",
          log=_warn,
          what=what,
        )

    start = _restore(config, checkpoints, algorithm, client_template, sampler)
    server_state = start.server_state
    client_states = collections.OrderedDict(start.client_states)
    ledger = start.ledger
    history = [dict(r) for r in start.history]
    elapsed_s = start.elapsed_s
    start_round = start.round_num + 1

    evaluator = CentralEvaluator(
      experiment.task.model_fn,
      experiment.splits.test.x,
      experiment.splits.test.y,
      metric=task_metric(experiment.splits),
    )
    extra_metric = _extra_metric(evaluator)
    evaluation_data = ClientTrainingData(
      fed, config.batch_size, lambda: client_states, client_files
    )
    evaluated_first = (
      None  # (round, weights) of the last evaluation's first model
    )
    releaser = outputs.MetricsReleaser(experiment_dir)
    profiler = profiling.RoundProfiler(
      os.path.join(experiment_dir, outputs.TENSORBOARD_DIR),
      config.profile_rounds,
      first_round=start_round + 1
      if config.rounds > start_round
      else start_round,
    )
    progress = ProgressBar(
      config.rounds, start_round - 1, enabled=config.progress
    )
    last_checkpoint = start_round - 1
    try:
      for round_num in range(start_round, config.rounds + 1):
        profiler.round_starts(round_num)
        round_start = time.monotonic()
        clients = _round_clients(
          experiment,
          server_state,
          client_states,
          client_template,
          round_num,
          sampler,
          client_files,
        )
        output = survive(
          functools.partial(algorithm.next, server_state, round_num, clients),
          f"round {round_num}",
        )
        check_not_diverged(
          algorithm, output, round_num, last_checkpoint, checkpoints.root_dir
        )
        server_state = output.state
        client_states.update(output.client_states)
        ledger = ledger.record(round_num, output.traffic)

        row = collections.OrderedDict(round=round_num)
        row.update(output.metrics)
        if round_num % config.eval_every == 0 or round_num == config.rounds:
          evaluated = survive(
            functools.partial(
              algorithm.evaluation_models, server_state, evaluation_data
            ),
            f"round {round_num}'s evaluation",
          )
          members = collections.OrderedDict()
          row.update(_evaluate(evaluator, evaluated, members))
          if config.local_evaluation and "local" not in members:
            row["local_accuracy"] = _local_accuracy(
              evaluator, evaluated, evaluation_data, members
            )
          if members:
            outputs.write_client_accuracy(experiment_dir, round_num, members)
          evaluated_first = (round_num, next(iter(evaluated.values())).weights)
        else:
          row["accuracy"] = float("nan")
          row["test_loss"] = float("nan")
          if extra_metric is not None:
            row[extra_metric] = float("nan")
        this_round = ledger.round_totals(round_num)
        cumulative = ledger.totals()
        elapsed_s += time.monotonic() - round_start
        row.update(
          clients=this_round.num_clients,
          bytes_down=this_round.bytes_down,
          bytes_up=this_round.bytes_up,
          bytes_down_cumulative=cumulative.bytes_down,
          bytes_up_cumulative=cumulative.bytes_up,
          client_flops=this_round.flops,
          wall_time_s=round(elapsed_s, 3),
        )
        if config.executor == "remote":
          row["workers"] = len(execution.addresses)
        history.append(dict(row))
        releaser.release(row, round_num)
        progress.update(
          round_num, row.get("accuracy"), cumulative.bytes_up / MIB
        )
        # Freed tensors' pages back to the system (runtime/heap.py).
        heap.release_free_memory()
        if on_round is not None:
          on_round(round_num, row)
        if (
          round_num % config.checkpoint_every == 0 or round_num == config.rounds
        ):
          checkpoints.save(
            checkpoint_lib.ProgramState(
              round_num=round_num,
              server_state=server_state,
              client_states=client_states,
              ledger=ledger,
              rng_state=sampler.get_state(),
              elapsed_s=elapsed_s,
              history=tuple(history),
              fingerprint=config.fingerprint(),
            )
          )
          last_checkpoint = round_num
        profiler.round_ended(round_num)
    finally:
      profiler.close()
      progress.close()
    if evaluated_first is not None and evaluated_first[0] == config.rounds:
      final_weights = evaluated_first[1]
    else:  # Resumed after the last round: nothing was evaluated here.
      final_weights = next(
        iter(
          algorithm.evaluation_models(server_state, evaluation_data).values()
        )
      ).weights
  return _finish(experiment, final_weights, ledger, history, elapsed_s)


def _restore(
  config: ExperimentConfig,
  checkpoints: checkpoint_lib.CheckpointManager,
  algorithm: api.FederatedAlgorithm,
  client_template: Any,
  sampler: CohortSampler,
) -> checkpoint_lib.ProgramState:
  """Where the run starts: its latest checkpoint with `--resume` (checked to
  hold the same settings; the sampler's RNG restored), else round 0."""
  server_state = algorithm.initialize()
  if not config.resume:
    return checkpoint_lib.ProgramState(
      round_num=0,
      server_state=server_state,
      client_states=collections.OrderedDict(),
      ledger=CommLedger(),
      rng_state=sampler.get_state(),
      elapsed_s=0.0,
      history=(),
      fingerprint=config.fingerprint(),
    )

  def check_fingerprint(fingerprint: str) -> None:
    if not config.same_results_as(fingerprint):
      raise UsageError(
        "--resume",
        f"the checkpoint in {checkpoints.root_dir} was"
        " written with different settings; use the same flags (only"
        " --rounds, the executor flags and the checkpoint flags may"
        " change)",
      )

  restored = checkpoints.load_latest(
    server_state, client_template, check_fingerprint
  )
  sampler.set_state(restored.rng_state)
  return restored


def _client_files_context(config: ExperimentConfig):
  """Where `--client_data=files` writes the clients' training arrays for
  the workers, removed when the run ends; a no-op context when the rounds
  send the samples."""
  if config.client_data != "files":
    return contextlib.nullcontext()
  return data_lib.ClientFiles(config.client_data_dir or None)


@contextlib.contextmanager
def _client_file_errors(client_files: Optional[data_lib.ClientFiles], what):
  """A failure naming `client_files`' directory (a worker that cannot read
  it) as a one-line `UsageError` of `--client_data_dir`."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    if client_files is None or client_files.directory not in str(e):
      raise
    raise UsageError(
      "--client_data_dir",
      f"{what} failed: a worker could not read the client files in"
      f" {client_files.directory}; with remote workers, give a directory"
      " every worker reads at the same path (or --client_data=sent)",
    ) from None


def _round_clients(
  experiment: Experiment,
  server_state: Any,
  client_states: dict,
  client_template: Any,
  round_num: int,
  sampler: CohortSampler,
  client_files: Optional[data_lib.ClientFiles] = None,
) -> list[api.ClientRound]:
  """The round's cohort as the algorithm plans it, each client with its
  seeded dataset, capacity, tier and persistent state. With `client_files`
  each client's arrays are bound to its files there (written by the first
  dataset made from them), so that its dataset reads them on the worker."""
  config, algorithm = experiment.config, experiment.algorithm
  population, fed = experiment.population, experiment.federated_data
  available = population.available_clients(round_num)
  assignments = algorithm.plan_round(
    server_state, round_num, available, config.clients_per_round, sampler
  )
  seeds = sampler.shuffle_seeds(len(assignments))
  clients = []
  for assignment, shuffle_seed in zip(assignments, seeds):
    client_id = assignment.client_id
    arrays = fed.client_train(client_id)
    if client_files is not None:
      arrays = client_files.store(client_id, arrays)
    state = client_states.get(client_id, client_template)
    clients.append(
      api.ClientRound(
        client_id=client_id,
        dataset=algorithm.client_dataset(
          arrays,
          batch_size=config.batch_size,
          local_epochs=config.local_epochs,
          shuffle_seed=shuffle_seed,
          augment=config.augment,
          state=state,
        ),
        num_examples=len(arrays) * config.local_epochs,
        capacity=population.capacity_at_round(client_id, round_num),
        state=state,
        tier=population.tier_of(client_id),
        assignment=assignment.payload,
        validation=_validation_dataset(fed, client_id, config.batch_size),
      )
    )
  return clients


def _validation_dataset(fed, client_id: str, batch_size: int):
  """`client_id`'s validation split, batched, one unshuffled epoch; None
  when it has none."""
  arrays = fed.client_validation(client_id)
  if len(arrays) == 0:
    return None
  return data_lib.make_client_dataset(
    arrays, batch_size=batch_size, local_epochs=1, shuffle_seed=None
  )


def check_not_diverged(
  algorithm: api.FederatedAlgorithm,
  output: api.RoundOutput,
  round_num: int,
  last_checkpoint: int,
  checkpoint_dir: str,
) -> None:
  """`DivergenceError` naming the round and the last good checkpoint if the
  round's loss or new weights are not finite.

  A client whose update was not finite is zeroed and counted by the
  algorithm (`non_finite_updates`), and the round goes on with the others;
  its loss is NaN only when that left no finite update to train on (no
  client with examples sent one; with several models, one of them got
  none). That ends the run, checked before the weights (a mean of no
  update may already have made them NaN).
  """
  if "non_finite_updates" not in output.metrics:
    raise RuntimeError(
      f"{algorithm.name}: round {round_num}'s metrics have no"
      " non_finite_updates (every algorithm counts the client updates it"
      " zeroed: api.RoundOutput)"
    )
  loss = float(output.metrics.get("loss", float("nan")))
  # A round where no client could train anything (e.g. every sampled
  # device too small for any sub-model) has no loss, and is no failure.
  trained = any(t.examples > 0 for t in output.traffic)
  if (trained and not math.isfinite(loss)) or not api.all_finite(
    algorithm.model_weights(output.state)
  ):
    where = (
      f"round {last_checkpoint} in {checkpoint_dir}"
      if last_checkpoint >= 1
      else "none"
    )
    zeroed = output.metrics["non_finite_updates"]
    why = (
      f"{int(zeroed)} client updates non-finite and zeroed left no finite"
      " update to train on"
      if trained and not math.isfinite(loss) and zeroed
      else "non-finite loss or weights"
    )
    raise DivergenceError(
      f"round {round_num}: training diverged (loss={loss}, {why});"
      f" last good checkpoint: {where}"
    )


def _finish(
  experiment: Experiment, final_weights, ledger, history, elapsed_s
) -> RunResult:
  """Saves the final model, report.json and the plots."""
  config = experiment.config
  experiment_dir = config.experiment_dir
  save_model_weights(
    os.path.join(experiment_dir, outputs.FINAL_WEIGHTS), final_weights
  )
  report = _build_report(experiment, ledger, history, elapsed_s)
  outputs.write_report(
    os.path.join(experiment_dir, outputs.REPORT_JSON), report
  )
  report["plots"] = outputs.plot_history(
    experiment_dir,
    history,
    f"{config.algorithm} / {config.dataset} / {config.model}",
  )
  outputs.write_report(
    os.path.join(experiment_dir, outputs.REPORT_JSON), report
  )
  return RunResult(report, experiment_dir, final_weights)


def save_model_weights(path: str, model_weights) -> None:
  """Writes `ModelWeights` as `trainable_i` / `non_trainable_i` arrays."""
  arrays = collections.OrderedDict()
  for i, w in enumerate(model_weights.trainable):
    arrays[f"trainable_{i}"] = np.asarray(w)
  for i, w in enumerate(model_weights.non_trainable):
    arrays[f"non_trainable_{i}"] = np.asarray(w)
  with atomic_files.atomic_write(path, "wb") as f:
    np.savez(f, **arrays)


def _check_output_dir(
  config: ExperimentConfig, checkpoints: checkpoint_lib.CheckpointManager
) -> None:
  has_run = (
    os.path.isdir(checkpoints.root_dir)
    and checkpoints.latest_round() is not None
  )
  if config.resume and not has_run:
    raise UsageError(
      "--resume", f"no checkpoint to resume under {checkpoints.root_dir}"
    )
  if not config.resume and (
    has_run
    or os.path.exists(os.path.join(config.experiment_dir, outputs.METRICS_CSV))
  ):
    raise UsageError(
      "--experiment_name",
      f"{config.experiment_dir} already holds a run; pass --resume to"
      " continue it or choose another --experiment_name",
    )


def upload_budgets(config: ExperimentConfig, bytes_up_total: int) -> list:
  """`--upload_budgets_mib`, or by default 1/8, 1/4, 1/2 and all of the
  run's upload (FedSGC's Table 2 reports accuracy at fixed upload budgets)."""
  if config.upload_budgets_mib:
    return [float(x) for x in config.upload_budgets_mib.split(":")]
  total = bytes_up_total / MIB
  return [round(total * f, 3) for f in (0.125, 0.25, 0.5, 1.0)]


def best_accuracy_by_upload(evaluated, budgets_mib) -> collections.OrderedDict:
  """Best test accuracy among evaluations whose cumulative upload (all
  clients, measured) was within each budget; None if none was."""
  out = collections.OrderedDict()
  for budget in budgets_mib:
    within = [
      r["accuracy"]
      for r in evaluated
      if r["bytes_up_cumulative"] <= budget * MIB
    ]
    out[f"{budget:g}"] = max(within) if within else None
  return out


def _build_report(
  experiment: Experiment, ledger: CommLedger, history, elapsed_s: float
) -> dict:
  config = experiment.config
  totals = ledger.totals()
  evaluated = [r for r in history if math.isfinite(r.get("accuracy", math.nan))]
  final = dict(evaluated[-1]) if evaluated else {}
  metric = task_metric(experiment.splits)

  def is_task_metric(key: str) -> bool:
    return metric is not None and (
      key == metric.name or key.endswith(f"_{metric.name}")
    )

  final_metrics = collections.OrderedDict(
    (k, v)
    for k, v in final.items()
    if (k.endswith("accuracy") or k.endswith("test_loss") or is_task_metric(k))
    and k != "train_accuracy"
  )
  if history:
    final_metrics["train_loss"] = history[-1].get("loss")
    final_metrics["train_accuracy"] = history[-1].get("train_accuracy")
  glue = {}
  if metric is not None:
    splits = experiment.splits
    glue["glue"] = collections.OrderedDict(
      task=splits.task,
      metric=metric.name,
      test_split=splits.test_split,
      seq_len=splits.seq_len,
      vocab_size=splits.vocab_size,
      model=experiment.task.model_name,
    )
  return collections.OrderedDict(
    config=config.to_json_dict(),
    **glue,
    algorithm=collections.OrderedDict(
      name=config.algorithm, **experiment.algorithm.report_extras()
    ),
    partition=collections.OrderedDict(
      method=config.partition,
      num_clients=config.num_clients,
      num_classes=experiment.splits.num_classes,
      label_counts=experiment.federated_data.label_counts(),
    ),
    devices=collections.OrderedDict(
      tier_counts=experiment.population.tier_counts(),
      tiers=[attrs.asdict(t) for t in experiment.population.tiers],
    ),
    final_metrics=final_metrics,
    final_round=final.get("round"),
    best_accuracy=max((r["accuracy"] for r in evaluated), default=None),
    best_accuracy_by_upload_mib=best_accuracy_by_upload(
      evaluated, upload_budgets(config, totals.bytes_up)
    ),
    bytes_up_total=totals.bytes_up,
    bytes_down_total=totals.bytes_down,
    client_flops_total=totals.flops,
    examples_processed_total=totals.examples,
    # Client updates zeroed for non-finite values, over the run (rows of
    # a run resumed from an older checkpoint may not have the column).
    non_finite_updates_total=int(
      sum(r.get("non_finite_updates", 0.0) for r in history)
    ),
    rounds_completed=len(history),
    wall_time_s=round(elapsed_s, 3),
    per_client=ledger.per_client_totals(),
    history=history,
  )
