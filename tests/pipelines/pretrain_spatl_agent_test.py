"""pipelines.pretrain_spatl_agent: a tiny pre-training end to end, its
reward against masking by hand, and a bad flag.

The run is a subprocess, as a user runs it (and to check that it leaves no
TFF worker behind); the others run in process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pipelines import _cli
from pipelines import pretrain_spatl_agent
from tff_hetero.runtime import testing as proc_testing

_REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
_SMALL = [
  "--dataset=synthetic",
  "--model=resnet8",
  "--train_epochs=1",
  "--iterations=2",
  "--episodes=2",
  "--ppo_epochs=2",
  "--val_examples=50",
  "--seed=3",
]


def test_pretrains_and_writes_the_agent_with_provenance(tmp_path):
  from tff_hetero.algorithms.spatl import agent
  from tff_hetero.algorithms.spatl import spatl

  output = str(tmp_path / "agent.npz")
  tag, env = proc_testing.tagged_env()
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "pipelines.pretrain_spatl_agent",
      *_SMALL,
      f"--output={output}",
    ],
    cwd=_REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr
  proc_testing.assert_no_workers_left(tag, timeout_s=5)
  assert proc.stdout.count("\niteration ") == 2, proc.stdout

  policy = spatl.load_policy(output)
  initial = agent.init_policy(3)
  # Pre-training updates the GNN (and the actor and critic) too.
  for part in ("gnn", "actor", "critic"):
    assert any(
      not np.allclose(a, b)
      for a, b in zip(getattr(policy, part), getattr(initial, part))
    ), part

  with open(str(tmp_path / "agent.json")) as f:
    provenance = json.load(f)
  assert provenance["command"].startswith(
    "python -m pipelines.pretrain_spatl_agent --dataset=synthetic"
  )
  assert f"--output={output}" in provenance["command"]
  commit = provenance["commit"]
  assert commit == "unknown" or len(commit) == 40, commit
  assert provenance["model"] == "resnet8"
  assert provenance["data_size"] == {
    "train_split": 600,
    "model_training": 550,
    "validation": 50,
  }
  assert 0.0 <= provenance["val_accuracy_unpruned"] <= 1.0
  settings = provenance["settings"]
  assert (settings["iterations"], settings["episodes"]) == (2, 2)
  assert (settings["budget"], settings["train_gnn"]) == (0.7, True)
  best, mean = provenance["best_rewards"], provenance["mean_rewards"]
  assert len(best) == len(mean) == 2
  for b, m in zip(best, mean):
    assert 0.0 <= m <= b <= 100.0
  assert provenance["final_best_reward"] == best[-1]
  assert len(provenance["final_best_ratios"]) == 7  # resnet8's convs
  assert provenance["search_traces"] == 1
  assert provenance["elapsed_s"] > 0


def test_reward_is_the_accuracy_with_channels_zeroed_by_hand():
  import tensorflow as tf

  from tff_hetero import data
  from tff_hetero import models
  from tff_hetero.algorithms.spatl import computations

  splits = data.load_dataset("synthetic", None, 0)
  model = models.build_model("resnet8", splits.input_shape, 10, 0)
  model.compile(
    tf.keras.optimizers.SGD(0.05, momentum=0.9),
    tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
  )
  model.fit(splits.train.x, splits.train.y, epochs=1, batch_size=32, verbose=0)
  encoder, predictor = models.encoder_predictor_split("resnet8", model)
  layout = computations.build_layout(
    model, encoder, predictor, graph_layers=encoder
  )
  test = splits.test
  batches = tf.data.Dataset.from_tensor_slices((test.x, test.y)).batch(37)
  reward_fn, restore = pretrain_spatl_agent.build_reward_fn(
    model, layout, batches
  )
  ratios = np.array([0.9, 0.5, 0.3, 0.7, 0.2, 0.6, 0.4], np.float32)
  reward = tf.function(reward_fn)
  whole = float(reward(tf.ones([7])))
  pruned = float(reward(tf.constant(ratios)))
  restore()
  accuracy = lambda: (
    100 * np.mean(np.argmax(model.predict(test.x, verbose=0), -1) == test.y)
  )
  assert whole == pytest.approx(accuracy(), abs=1e-3)
  graph = layout.graph
  for p, name in enumerate(graph.prunable_names):
    layer = model.get_layer(name)
    kernel = layer.kernel.numpy()
    out = kernel.shape[-1]
    keep = max(1, int(np.floor(ratios[p] * out + 0.5)))
    scores = np.abs(kernel.reshape(-1, out)).sum(0)
    mask = np.zeros(out, np.float32)
    mask[np.argsort(-scores, kind="stable")[:keep]] = 1.0
    variables = [layer.kernel] + ([layer.bias] if layer.use_bias else [])
    for follower in graph.followers[p]:
      bn = model.get_layer(follower)
      variables += [bn.gamma, bn.beta]
    for variable in variables:
      variable.assign(variable.numpy() * mask)
  assert pruned == pytest.approx(accuracy(), abs=1e-3)
  assert pruned < whole


def test_bad_budget_is_one_line_naming_the_flag(capsys):
  with pytest.raises(SystemExit) as info:
    _cli.run_in_process(
      pretrain_spatl_agent.main,
      ["pretrain_spatl_agent", *_SMALL, "--budget=0"],
    )
  assert info.value.code == _cli.USAGE_EXIT
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: --budget"), err


def test_the_shipped_agent_loads_and_its_provenance_shows_it_learned():
  import json  # pylint: disable=g-import-not-at-top

  from tff_hetero.algorithms.spatl import spatl  # pylint: disable=g-import-not-at-top

  policy = spatl.load_policy(spatl.SHIPPED_AGENT)
  with open(spatl.SHIPPED_AGENT[: -len(".npz")] + ".json") as f:
    provenance = json.load(f)
  assert provenance["model"] == "resnet56"
  assert provenance["command"].startswith("python -m pipelines.pretrain_spatl")
  assert len(provenance["commit"]) == 40
  best = provenance["best_rewards"]
  assert provenance["final_best_reward"] == best[-1]
  # The reward it reached: the last ten iterations' best clearly above the
  # first ten's.
  assert sum(best[-10:]) / 10 > sum(best[:10]) / 10 + 10
  assert len(policy.gnn) and len(policy.actor) and len(policy.critic)
