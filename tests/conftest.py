"""Shared pytest fixtures.

`tff_context`: one TFF execution context for the whole session, on a worker
process our runtime starts and stops (never TFF's default context, whose
worker outlives the interpreter). Tests that execute TFF computations in
process request it.

SIGINT: a test run started in the background (`cmd &` from a script, as CI
supervisors may) inherits SIGINT ignored, and so would every process a test
starts, making the tests that interrupt a pipeline or a worker fail. The
session restores Python's handler so that the children start with the
default, as from a terminal.

`DEEPER_TWINS`: registered models that are a shallower registered model with
more blocks per stage, built and sliced by the same code. Structural tests
that run once per model (`once_per_structure`) cover them by their twin:
building each several times costs over a minute of CI and checks nothing the
twin does not. Their exact sizes stay asserted by hand in
`models/models_counting_test.py` and `models/models_zoo_test.py`.
"""

import os
import signal

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
signal.signal(signal.SIGINT, signal.default_int_handler)

DEEPER_TWINS = {
  "resnet110": "resnet56",
  "resnet110_bottleneck": "resnet56_bottleneck",
  "fedgkt_server_resnet109": "fedgkt_server_resnet55",
  "fedgkt_server_resnet109_bottleneck": "fedgkt_server_resnet55_bottleneck",
}


# Models whose structure a smaller registered model shows: the same code builds
# them with more blocks per stage (ResNet-32/56 as ResNet-20, the ResNet-55
# server as the ResNet-19 server) or the same blocks in the same stages (the
# bottleneck ResNet-55 server is ResNet-56-bottleneck without its stem,
# `models/models_zoo_test.py`). Per-model structural tests leave them out in
# every tier, as `DEEPER_TWINS`: building them cost about 80 s of CI
# (2026-11-27) and checks nothing their smaller model does not.
SMALLER_TWINS = {
  "resnet32": "resnet20",
  "resnet56": "resnet20",
  "fedgkt_server_resnet55": "fedgkt_server_resnet19",
  "fedgkt_server_resnet55_bottleneck": "resnet56_bottleneck",
}

# Models the fast tier (`tools/test.sh --fast`) leaves to the full suite in
# per-model structural tests: ResNet-56-bottleneck's blocks are those of the
# ResNet-8-bottleneck edge, but only it has their downsampling stages.
FAST_TIER_COVERED = {
  "resnet56_bottleneck": "fedgkt_edge_resnet8_bottleneck",
}


def fast_tier_params(names):
  """`names` as pytest parameters without `SMALLER_TWINS`, those of
  `FAST_TIER_COVERED` marked slow."""
  return [
    pytest.param(n, marks=pytest.mark.slow) if n in FAST_TIER_COVERED else n
    for n in names
    if n not in SMALLER_TWINS
  ]


def once_per_structure(names):
  """`names` sorted, without the models their shallower twin covers, as
  `fast_tier_params`."""
  return fast_tier_params(sorted(n for n in names if n not in DEEPER_TWINS))


@pytest.fixture(scope="session")
def tff_context():
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top

  with runtime.local_execution(worker_timeout_s=120.0) as handle:
    yield handle


def checkpoint_round_trip(
  directory, server_state, template, client_states=None, client_template=None
):
  """Saves a round-1 checkpoint holding `server_state` (and `client_states`)
  with the real `CheckpointManager` in `directory`, and loads it back with
  `template` / `client_template`; returns the restored `ProgramState`."""
  from tff_hetero.accounting import CommLedger  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import checkpoint  # pylint: disable=g-import-not-at-top

  manager = checkpoint.CheckpointManager(str(directory))
  manager.save(
    checkpoint.ProgramState(
      round_num=1,
      server_state=server_state,
      client_states=client_states or {},
      ledger=CommLedger(),
      rng_state={},
      elapsed_s=0.0,
      history=(),
      fingerprint="",
    )
  )
  return manager.load_latest(template, client_template)


def assert_one_line_error(error_type, call, *needles) -> str:
  """`call()` raises `error_type` with a one-line message holding `needles`;
  returns the message."""
  with pytest.raises(error_type) as info:
    call()
  message = str(info.value)
  assert "\n" not in message
  for needle in needles:
    assert needle in message, (needle, message)
  return message


def resume_from_round_1(whole, flags):
  """Runs `python -m pipelines.train *flags --resume` (in this process) on a
  run stopped right after round 1: `whole`'s round-1 checkpoint and its
  metrics.csv up to round 1, under the same name (part of a run's settings)
  in another --root_output_dir. Returns the resumed run's directory."""
  import shutil  # pylint: disable=g-import-not-at-top

  from pipelines import _cli  # pylint: disable=g-import-not-at-top
  from pipelines import train  # pylint: disable=g-import-not-at-top

  parts = whole.parent / "parts" / whole.name
  source, target = whole / "checkpoints", parts / "checkpoints"
  shutil.copytree(source / "program_state_1", target / "program_state_1")
  shutil.copy(source / "program_state_1.json", target)
  header, round_1 = (whole / "metrics.csv").read_text().splitlines()[:2]
  (parts / "metrics.csv").write_text(f"{header}\n{round_1}\n")
  _cli.run_in_process(
    train.main,
    [
      "train",
      *flags,
      f"--root_output_dir={parts.parent}",
      f"--experiment_name={whole.name}",
      "--resume",
    ],
  )
  return parts


def finish_runs_by_hand(monkeypatch, real, report_of):
  """Has `_common.run_all` (a pipeline's runner) run for real only the
  runs named in `real`: every other run it dispatches to
  `loop.run_experiment` is checked (`loop.validate_config`) and finished by
  hand, `report_of(config)` (the report's history, final metrics, ...)
  written as its `metrics.csv` rows and `report.json`, as a run leaves
  them. A run finished by hand is validated but not built (building traces
  its computations, most of a tiny run's cost): the algorithms themselves
  are tested in tests/algorithms, and each test runs some of its pipeline's
  runs for real. Returns the configs dispatched, in order."""
  import csv  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top

  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  run_for_real, dispatched = loop.run_experiment, []

  def run_experiment(config, **kwargs):
    dispatched.append(config)
    if config.experiment_name in real:
      return run_for_real(config, **kwargs)
    loop.validate_config(config)
    report = dict(
      config=config.to_json_dict(),
      rounds_completed=config.rounds,
      **report_of(config),
    )
    os.makedirs(config.experiment_dir, exist_ok=True)
    with open(
      os.path.join(config.experiment_dir, "metrics.csv"), "w", newline=""
    ) as f:
      writer = csv.DictWriter(f, fieldnames=list(report["history"][0]))
      writer.writeheader()
      writer.writerows(report["history"])
    with open(os.path.join(config.experiment_dir, "report.json"), "w") as f:
      json.dump(report, f)
    return loop.RunResult(report, config.experiment_dir, None)

  monkeypatch.setattr(loop, "run_experiment", run_experiment)
  return dispatched


def tff_fedavg_round(keras_fn, input_spec, learning_rate, start, datasets):
  """The trainable weights after one round of TFF's own
  `build_weighted_fed_avg` (SGD at `learning_rate`, cross-entropy on
  logits) from `start` over `datasets`: an oracle independent of our code.
  `keras_fn()` must have no non-trainable weights."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  process = tff.learning.algorithms.build_weighted_fed_avg(
    lambda: tff.learning.models.from_keras_model(
      keras_fn(),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=input_spec,
    ),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate),
  )
  state = process.set_model_weights(
    process.initialize(),
    tff.learning.models.ModelWeights(trainable=start, non_trainable=[]),
  )
  state = process.next(state, list(datasets)).state
  return [np.asarray(w) for w in process.get_model_weights(state).trainable]


def sparse_toy_spec():
  """The batch spec of `sparse_toy_model`'s data: 4 features, int labels."""
  import collections  # pylint: disable=g-import-not-at-top

  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return collections.OrderedDict(
    x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32)
  )


def sparse_toy_model():
  """The sparse-training tests' seeded Dense 4 -> 8 (ReLU) -> 2 model: its
  kernels (32 and 16 weights) keep 13 and 11 at sparsity 0.5 under ERK."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(
        8,
        activation="relu",
        input_shape=(4,),
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1),
      ),
      tf.keras.layers.Dense(
        2, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2)
      ),
    ]
  )


def sparse_toy_dataset(client: int, round_num: int, n: int, epochs: int = 1):
  """`n` examples seeded by (client, round), label x0 + x1 > 0, batches of
  5, `epochs` passes."""
  import collections  # pylint: disable=g-import-not-at-top

  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng([client, round_num])
  x = rng.normal(size=[n, 4]).astype(np.float32)
  y = (x[:, 0] + x[:, 1] > 0).astype(np.int32)
  data = collections.OrderedDict(x=x, y=y)
  return tf.data.Dataset.from_tensor_slices(data).batch(5).repeat(epochs)


# A toy edge model cut at its layer "cut" and its server model (FedGKT and
# split learning processes on a user's own models), and images whose class
# c lights up row 2c.
GKT_TOY_SHAPE = (6, 6, 1)
GKT_TOY_CLASSES = 3
GKT_TOY_FEATURES = (6, 6, 2)


def gkt_toy_edge_model():
  """Images -> conv "cut" (2 channels, ReLU) -> flatten -> dense logits."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  image = tf.keras.Input(GKT_TOY_SHAPE)
  features = tf.keras.layers.Conv2D(
    2,
    3,
    padding="same",
    activation="relu",
    name="cut",
    kernel_initializer=tf.keras.initializers.GlorotUniform(1),
  )(image)
  x = tf.keras.layers.Flatten()(features)
  logits = tf.keras.layers.Dense(
    GKT_TOY_CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(2)
  )(x)
  return tf.keras.Model(image, logits)


def gkt_toy_server_model():
  """Features of "cut" -> conv (ReLU) -> batch norm -> flatten -> logits."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  features = tf.keras.Input(GKT_TOY_FEATURES)
  x = tf.keras.layers.Conv2D(
    3,
    3,
    padding="same",
    activation="relu",
    kernel_initializer=tf.keras.initializers.GlorotUniform(3),
  )(features)
  x = tf.keras.layers.BatchNormalization()(x)
  x = tf.keras.layers.Flatten()(x)
  logits = tf.keras.layers.Dense(
    GKT_TOY_CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(4)
  )(x)
  return tf.keras.Model(features, logits)


def gkt_toy_arrays(n, seed):
  """`n` seeded images of `gkt_toy_edge_model`'s shape and their labels."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  y = rng.integers(0, GKT_TOY_CLASSES, n).astype(np.int32)
  x = rng.uniform(0, 0.2, (n,) + GKT_TOY_SHAPE).astype(np.float32)
  # Class c lights up row 2c: learnable from the edge's features.
  for i, label in enumerate(y):
    x[i, 2 * label, :, 0] += 1.0
  return data_lib.ArrayDataset(x, y)
