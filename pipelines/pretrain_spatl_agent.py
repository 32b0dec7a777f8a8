r"""Pre-train SPATL's salient parameter agent on a network pruning task.

  python -m pipelines.pretrain_spatl_agent          # resnet56 on mnist5k
  python -m pipelines.pretrain_spatl_agent --model=resnet20 \
      --dataset=cifar10 --data_dir=~/tensorflow_datasets --iterations=100

SPATL (`shared/papers/spatl.txt`, Section V, "RL Agent Settings"): "The RL
agent is pre-trained on ResNet-56 by a network pruning task"; clients then
fine-tune only its MLP (`tff_hetero/algorithms/spatl/agent.py`). This
pipeline is that pre-training:

1. Load `--dataset` (`tff_hetero.data.load_dataset`, `--data_dir` for the
   TFDS sets). A seeded random subset of `--val_examples` examples of the
   train split is held out as the validation subset; the model is trained on
   the rest of the train split only, and the reward evaluates on the subset
   only. The test split is not used at all (nothing the agent learns from
   ever sees it).
2. Build `--model` with `--seed` and train it for `--train_epochs` epochs
   (Keras `fit`, SGD with momentum 0.9 at `--train_lr`, batches of
   `--batch_size`, shuffled with a seed derived from `--seed`). Its
   unpruned validation accuracy is logged and recorded.
3. The agent sees the model's encoder (`models.encoder_predictor_split`: all
   but the registry's predictor layers) as its layer graph
   (`computations.build_layout`, as SPATL's clients do). Each of
   `--iterations` iterations runs `agent.salient_search` inside one
   `tf.function` with `--episodes` episodes, `fine_tune=True`,
   `train_gnn=True` (pre-training updates the GNN, actor and critic; Adam
   3e-4 as the paper), `--ppo_epochs` PPO epochs, the size budget
   `--budget` and smallest keep ratio `--min_keep`, and the episode noise
   seeded by (`--seed`, iteration). An episode's reward is 100 x the
   validation-subset accuracy of the trained model with the output channels
   of every prunable encoder layer that `agent.channel_masks` drops zeroed
   (kernel, bias and the following batch norms' gamma and beta, through
   `computations.element_masks`: exactly what a SPATL client's search
   evaluates), in inference mode (batch-norm moving statistics of the
   trained model). The model's weights are set back to the trained ones
   after each iteration.
4. Write the policy with `spatl.save_policy` to `--output` (default
   `tff_hetero/algorithms/spatl/pretrained/<model>_agent.npz` in the
   package) and its provenance beside it (`.json`): the command, the git
   commit and whether `tff_hetero/` or `pipelines/` had uncommitted changes,
   the data and training summary, every setting, the best and mean reward of
   each iteration, the final iteration's best reward and keep ratios, the
   elapsed seconds and the date. Use the agent in training with
   `--spatl_agent=<output>`.

One line per training epoch and per iteration is printed. Bad flags exit
with status 2 and one line naming the flag. Nothing here uses TFF's runtime
(the agent is pure TensorFlow), so no TFF worker process is ever started.
"""

from __future__ import annotations

import datetime
import os
import shlex
import subprocess
import sys
import time

from absl import flags

from pipelines import _cli

_PROGRAM = "pipelines.pretrain_spatl_agent"
# Batches of the reward's validation pass (inference only: larger is faster).
_EVAL_BATCH = 256
_MOMENTUM = 0.9
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Set when run as `python -m pipelines.pretrain_spatl_agent` (the command
# line in the provenance is then the process's own).
_AS_CLI = False


def _define(kind: str, name: str, default, help_text: str):
  """A flag that other pipelines (`pipelines.train`, `describe`) may define
  too: absl keeps one global set of flags, so when several pipelines are
  imported into one process (tests, notebooks) they share the flag object.
  This pipeline reads a flag's value only when it is given on the command
  line (`present`) and otherwise applies its own default (`_value`), so
  which definition won does not matter."""
  if name in flags.FLAGS:
    return flags.FlagHolder(flags.FLAGS, flags.FLAGS[name])
  define = getattr(flags, f"DEFINE_{kind}")
  return define(name, default, help_text, allow_override=True)


_DEFAULTS = {
  "model": "resnet56",
  "dataset": "mnist5k",
  "data_dir": None,
  "train_epochs": 4,
  "train_lr": 0.02,
  "batch_size": 64,
  "iterations": 100,
  "episodes": 8,
  "ppo_epochs": 20,
  "budget": 0.7,
  "min_keep": 0.1,
  "val_examples": 500,
  "seed": 0,
  "output": None,
}
_FLAGS = {
  "model": _define(
    "string", "model", _DEFAULTS["model"], "Model registry name to prune."
  ),
  "dataset": _define(
    "string",
    "dataset",
    _DEFAULTS["dataset"],
    "Image data set of tff_hetero.data (mnist5k: offline default; synthetic;"
    " cifar10 with --data_dir, ...).",
  ),
  "data_dir": _define(
    "string",
    "data_dir",
    None,
    "Root of prepared TFDS data (TFDS-backed data sets only).",
  ),
  "train_epochs": _define(
    "integer",
    "train_epochs",
    _DEFAULTS["train_epochs"],
    "Epochs of plain Keras SGD (momentum 0.9) on the train split before the"
    " agent is trained.",
  ),
  "train_lr": _define(
    "float",
    "train_lr",
    _DEFAULTS["train_lr"],
    "Learning rate of the model's training.",
  ),
  "batch_size": _define(
    "integer",
    "batch_size",
    _DEFAULTS["batch_size"],
    "Batch size of the model's training.",
  ),
  "iterations": _define(
    "integer",
    "iterations",
    _DEFAULTS["iterations"],
    "PPO iterations (salient searches with an update each).",
  ),
  "episodes": _define(
    "integer",
    "episodes",
    _DEFAULTS["episodes"],
    "Episodes (rewarded pruning actions) per iteration.",
  ),
  "ppo_epochs": _define(
    "integer",
    "ppo_epochs",
    _DEFAULTS["ppo_epochs"],
    "PPO epochs per iteration (the paper's 20).",
  ),
  "budget": _define(
    "float",
    "budget",
    _DEFAULTS["budget"],
    "Fraction of the encoder's prunable parameters kept, in (0, 1]: the"
    " keep ratios are projected onto it exactly (up or down).",
  ),
  "min_keep": _define(
    "float",
    "min_keep",
    _DEFAULTS["min_keep"],
    "Smallest kept fraction of a layer's output channels, in (0, 1].",
  ),
  "val_examples": _define(
    "integer",
    "val_examples",
    _DEFAULTS["val_examples"],
    "Examples of the train split held out for the reward (not trained on).",
  ),
  "seed": _define(
    "integer",
    "seed",
    _DEFAULTS["seed"],
    "Seed of the model, the validation subset, the shuffles and the agent.",
  ),
  "output": _define(
    "string",
    "output",
    None,
    "Where to write the agent (.npz; its provenance goes beside it as"
    " .json). Default: tff_hetero/algorithms/spatl/pretrained/"
    "<model>_agent.npz in the package.",
  ),
}


def _value(name: str):
  """The flag's value if given on the command line, else our default."""
  holder = _FLAGS[name]
  return holder.value if holder.present else _DEFAULTS[name]


def default_output(model: str) -> str:
  """`tff_hetero/algorithms/spatl/pretrained/<model>_agent.npz` in the
  installed package."""
  from tff_hetero.algorithms import spatl  # pylint: disable=g-import-not-at-top

  return os.path.join(
    os.path.dirname(os.path.abspath(spatl.__file__)),
    "pretrained",
    f"{model}_agent.npz",
  )


def _settings() -> dict:
  """Every setting, checked; bad ones fail in one line naming the flag."""
  s = {name: _value(name) for name in _DEFAULTS}
  for name in (
    "train_epochs",
    "batch_size",
    "iterations",
    "episodes",
    "ppo_epochs",
    "val_examples",
  ):
    if s[name] is None or s[name] < 1:
      _cli.fail(f"--{name} must be a positive integer, got {s[name]}")
  for name in ("budget", "min_keep"):
    if not 0.0 < s[name] <= 1.0:
      _cli.fail(f"--{name} must lie in (0, 1], got {s[name]}")
  if not 0.0 < s["train_lr"] < float("inf"):
    _cli.fail(f"--train_lr must be a positive number, got {s['train_lr']}")
  if s["seed"] < 0:
    _cli.fail(f"--seed must be an integer >= 0, got {s['seed']}")
  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero import models  # pylint: disable=g-import-not-at-top

  if s["model"] not in models.MODELS:
    _cli.fail(
      f"--model must be one of {', '.join(models.model_names())},"
      f" got {s['model']!r}"
    )
  if s["dataset"] not in data_lib.DATASETS:
    _cli.fail(
      f"--dataset must be one of {', '.join(data_lib.DATASETS)},"
      f" got {s['dataset']!r}"
    )
  if data_lib.is_text_dataset(s["dataset"]):
    _cli.fail(
      f"--dataset must be an image data set (the agent prunes channels),"
      f" got {s['dataset']!r}"
    )
  output = s["output"] or default_output(s["model"])
  if not output.endswith(".npz"):
    _cli.fail(f"--output must end with .npz, got {output!r}")
  s["output"] = os.path.abspath(os.path.expanduser(output))
  return s


def _command_line() -> str:
  """The command of this run: the process's own arguments when run as the
  CLI, else (in process: tests, notebooks) the flags given."""
  if _AS_CLI:
    args = sys.argv[1:]
  else:
    args = [
      flags.FLAGS[name].serialize()
      for name, holder in _FLAGS.items()
      if holder.present
    ]
  return shlex.join(["python", "-m", _PROGRAM, *args])


def _git(*args: str) -> str | None:
  try:
    return subprocess.run(
      ("git", "--no-optional-locks", "-C", _REPO, *args),
      check=True,
      capture_output=True,
      text=True,
      timeout=30,
    ).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None


def code_version() -> dict:
  """The git commit (or "unknown") and whether the code differed from it
  (`dirty`: uncommitted changes under tff_hetero/ or pipelines/, as the
  reproductions record; None when git cannot tell)."""
  commit = _git("rev-parse", "HEAD")
  changes = _git("status", "--porcelain", "--", "tff_hetero", "pipelines")
  return {
    "commit": commit or "unknown",
    "dirty": None if changes is None else bool(changes),
  }


def _load(s: dict):
  """(splits, training subset, validation subset) as `ArrayDataset`s."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  from tff_hetero import data as data_lib  # pylint: disable=g-import-not-at-top

  try:
    splits = data_lib.load_dataset(s["dataset"], s["data_dir"], s["seed"])
  except data_lib.DataError as e:
    _cli.fail(str(e))
  size = len(splits.train)
  if s["val_examples"] >= size:
    _cli.fail(
      f"--val_examples must be below the {s['dataset']} train split's"
      f" {size} examples, got {s['val_examples']}"
    )
  order = np.random.default_rng([s["seed"], 1]).permutation(size)
  validation = splits.train.subset(np.sort(order[: s["val_examples"]]))
  train = splits.train.subset(np.sort(order[s["val_examples"] :]))
  return splits, train, validation


def _train_model(model, train, s: dict) -> dict:
  """Trains `model` on `train` (Keras fit); its last epoch's loss and
  accuracy."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  dataset = (
    tf.data.Dataset.from_tensor_slices((train.x, train.y))
    .shuffle(len(train), seed=s["seed"], reshuffle_each_iteration=True)
    .batch(s["batch_size"])
  )
  model.compile(
    optimizer=tf.keras.optimizers.SGD(s["train_lr"], momentum=_MOMENTUM),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
  )
  start = time.monotonic()

  def log_epoch(epoch, logs):
    print(
      f"train epoch {epoch + 1}/{s['train_epochs']}: loss"
      f" {logs['loss']:.4f}, accuracy {logs['accuracy']:.4f}"
      f" ({time.monotonic() - start:.0f}s)",
      flush=True,
    )

  history = model.fit(
    dataset,
    epochs=s["train_epochs"],
    verbose=0,
    callbacks=[tf.keras.callbacks.LambdaCallback(on_epoch_end=log_epoch)],
  )
  return {
    "train_loss": float(history.history["loss"][-1]),
    "train_accuracy": float(history.history["accuracy"][-1]),
  }


def _accuracy_percent(model, dataset):
  """100 x the inference-mode accuracy of `model` on `dataset` (TF ops, a
  loop over the batches: call inside a `tf.function`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tff_hetero.algorithms import local_training  # pylint: disable=g-import-not-at-top

  def add_batch(state, batch):
    correct, count = state
    x, y = batch
    logits = model(x, training=False)
    hits = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), y)
    return (
      correct + tf.reduce_sum(tf.cast(hits, tf.float32)),
      count + tf.cast(tf.size(y), tf.float32),
    )

  correct, count = local_training.fold_batches(
    dataset, (tf.constant(0.0), tf.constant(0.0)), add_batch
  )
  return 100.0 * tf.math.divide_no_nan(correct, count)


def build_reward_fn(model, layout, validation):
  """(reward_fn, restore) for the trained `model` split by `layout`
  (`computations.build_layout` with the agent's graph).

  `reward_fn(ratios)` (TF ops; float32 [P] keep ratios, one per prunable
  layer): sets the encoder's variables to their current (trained) values
  times `computations.element_masks` of `agent.channel_masks(kernels,
  ratios)`, so that the dropped output channels' kernel, bias and
  follower batch-norm gamma and beta are zero, and returns 100 x the
  inference-mode accuracy on the `validation` batches. `restore()` sets the
  trained values back.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tff_hetero.algorithms.spatl import agent as agent_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.spatl import computations  # pylint: disable=g-import-not-at-top

  trainable = model.trainable_weights
  encoder_vars = [trainable[i] for i in layout.encoder]
  trained = [tf.constant(v.numpy()) for v in encoder_vars]
  kernels = [trained[p] for p in layout.kernel_positions]

  def restore():
    for variable, value in zip(encoder_vars, trained):
      variable.assign(value)

  def reward_fn(ratios):
    masks = computations.element_masks(
      layout, trained, agent_lib.channel_masks(kernels, ratios)
    )
    for variable, value, mask in zip(encoder_vars, trained, masks):
      variable.assign(value * mask)
    return _accuracy_percent(model, validation)

  return reward_fn, restore


def pretrain(s: dict) -> dict:
  """Steps 1-4 of the module docstring; returns the provenance written."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tff_hetero import models  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.spatl import agent as agent_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.spatl import computations  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.spatl import spatl  # pylint: disable=g-import-not-at-top

  started = time.monotonic()
  date = datetime.datetime.now(datetime.timezone.utc).isoformat(
    timespec="seconds"
  )
  command = _command_line()
  code = code_version()
  splits, train, validation = _load(s)
  print(
    f"{s['dataset']}: {len(splits.train)} train examples, {len(train)} to"
    f" train the model on, {len(validation)} held out for the reward",
    flush=True,
  )
  tf.keras.utils.set_random_seed(s["seed"])
  try:
    model = models.build_model(
      s["model"], splits.input_shape, splits.num_classes, s["seed"]
    )
    encoder, predictor = models.encoder_predictor_split(s["model"], model)
    layout = computations.build_layout(
      model, encoder, predictor, graph_layers=encoder
    )
  except models.ModelError as e:
    _cli.fail(f"--model={s['model']} with --dataset={s['dataset']}: {e}")
  graph = layout.graph
  if not layout.kernel_positions:
    _cli.fail(
      f"--model={s['model']}: its encoder has no Conv2D or Dense layer to prune"
    )
  trained_stats = _train_model(model, train, s)

  val_data = tf.data.Dataset.from_tensor_slices(
    (validation.x, validation.y)
  ).batch(_EVAL_BATCH)
  reward_fn, restore = build_reward_fn(model, layout, val_data)
  unpruned = float(tf.function(_accuracy_percent)(model, val_data)) / 100.0
  print(
    f"{s['model']}: validation accuracy unpruned {unpruned:.4f};"
    f" {len(graph.prunable_names)} prunable layers of"
    f" {len(graph.node_names)} encoder nodes",
    flush=True,
  )

  optimizer = agent_lib.build_agent_optimizer()
  policy = agent_lib.init_policy(s["seed"])
  state = agent_lib.init_optimizer_state(optimizer, policy, train_gnn=True)
  state_template = state

  @tf.function
  def search(params, optimizer_state, seed):
    result = agent_lib.salient_search(
      params,
      optimizer,
      optimizer_state,
      graph,
      reward_fn,
      episodes=s["episodes"],
      ppo_epochs=s["ppo_epochs"],
      fine_tune=True,
      seed=seed,
      budget=s["budget"],
      min_ratio=s["min_keep"],
      train_gnn=True,
    )
    restore()
    return result

  best_rewards, mean_rewards = [], []
  ratios = None
  for iteration in range(s["iterations"]):
    begun = time.monotonic()
    result = search(
      policy,
      state,
      tf.constant([s["seed"], iteration], tf.int64),
    )
    policy = agent_lib.PolicyParams(
      *([np.asarray(w) for w in part] for part in result.params)
    )
    # The state keeps the Python structure of its first value, so that the
    # function is traced once.
    state = tf.nest.pack_sequence_as(
      state_template,
      [np.asarray(v) for v in tf.nest.flatten(result.optimizer_state)],
    )
    best_rewards.append(float(result.reward))
    mean_rewards.append(float(result.mean_reward))
    ratios = [float(r) for r in np.asarray(result.ratios)]
    print(
      f"iteration {iteration + 1}/{s['iterations']}: best reward"
      f" {best_rewards[-1]:.2f}, mean {mean_rewards[-1]:.2f}, best mean"
      f" keep ratio {np.mean(ratios):.3f}"
      f" ({time.monotonic() - begun:.1f}s)",
      flush=True,
    )

  provenance = {
    "command": command,
    "commit": code["commit"],
    "dirty": code["dirty"],
    "date": date,
    "model": s["model"],
    "dataset": s["dataset"],
    "data_dir": s["data_dir"],
    "input_shape": list(splits.input_shape),
    "num_classes": int(splits.num_classes),
    "data_size": {
      "train_split": len(splits.train),
      "model_training": len(train),
      "validation": len(validation),
    },
    "train_epochs": s["train_epochs"],
    **trained_stats,
    "val_accuracy_unpruned": unpruned,
    "settings": {
      **{k: v for k, v in s.items() if k != "output"},
      "train_momentum": _MOMENTUM,
      "eval_batch": _EVAL_BATCH,
      "train_gnn": True,
      "fine_tune": True,
      "ppo_clip": agent_lib.CLIP,
      "action_std": agent_lib.ACTION_STD,
      "agent_learning_rate": agent_lib.LEARNING_RATE,
      "agent_betas": [agent_lib.BETA_1, agent_lib.BETA_2],
      "hidden": agent_lib.HIDDEN,
    },
    "graph": {
      "nodes": len(graph.node_names),
      "prunable_layers": list(graph.prunable_names),
    },
    "best_rewards": best_rewards,
    "mean_rewards": mean_rewards,
    "final_best_reward": best_rewards[-1],
    "final_best_ratios": ratios,
    "search_traces": int(search.experimental_get_tracing_count()),
    "elapsed_s": round(time.monotonic() - started, 1),
  }
  os.makedirs(os.path.dirname(s["output"]), exist_ok=True)
  spatl.save_policy(s["output"], policy, provenance)
  return provenance


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  s = _settings()
  provenance = pretrain(s)
  best, mean = provenance["best_rewards"], provenance["mean_rewards"]
  print(
    f"best reward {best[0]:.2f} -> {best[-1]:.2f}, mean reward"
    f" {mean[0]:.2f} -> {mean[-1]:.2f} over {len(best)} iterations"
    f" ({provenance['elapsed_s']:.0f}s)"
  )
  print(f"agent: {s['output']}")
  print(f"provenance: {os.path.splitext(s['output'])[0]}.json")
  sys.stdout.flush()


if __name__ == "__main__":
  _AS_CLI = True
  _cli.run_main(main)
