r"""Per-layer densities and signs of the masks GraSP keeps (a diagnosis).

  python tools/grasp_masks.py --seed=1

Builds the FedSGC reproduction's GraSP run (mnist5k, mnist_cnn_feddst,
100 clients with two label shards, 10 per round, 5 local epochs, batch 50,
sparsity 0.8), draws round 1's cohort as the run does, scores the initial
model on the pruning client's round data with `grasp.grasp_scores`, keeps the
run's number of kernel weights globally by score
(`initial_pruning.global_top_k_masks`) and prints, per kernel: the density,
the fraction of kept weights that are positive, and the same fraction over
all its weights; then the same for the opposite end of the scores. Nothing
is trained.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_SEED = flags.DEFINE_integer("seed", 1, "The run's --seed.")


def main(argv):
  del argv
  from tff_hetero.algorithms.sparse import grasp  # pylint: disable=g-import-not-at-top
  from tff_hetero.algorithms.sparse import initial_pruning  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import make_config  # pylint: disable=g-import-not-at-top
  from tff_hetero.program.loop import build_experiment  # pylint: disable=g-import-not-at-top
  from tff_hetero.program.sampling import CohortSampler  # pylint: disable=g-import-not-at-top

  seed = _SEED.value
  config = make_config(
    algorithm="grasp",
    dataset="mnist5k",
    model="mnist_cnn_feddst",
    partition="shards",
    shards_per_client=2,
    min_samples_per_client=1,
    num_clients=100,
    clients_per_round=10,
    local_epochs=5,
    batch_size=50,
    client_lr=0.05,
    sparsity=0.8,
    seed=seed,
  )
  experiment = build_experiment(config)
  algorithm = experiment.algorithm
  federated = experiment.federated_data
  sampler = CohortSampler(seed)
  plan = algorithm.plan_round(
    None, 1, experiment.population.available_clients(1), 10, sampler
  )
  shuffle_seeds = sampler.shuffle_seeds(len(plan))
  client = plan[0].client_id
  arrays = federated.client_train(client)
  labels = np.flatnonzero(np.bincount(arrays.y, minlength=10)).tolist()
  print(f"pruning client {client}: {len(arrays)} examples, labels {labels}")
  data = algorithm.client_dataset(
    arrays, batch_size=50, local_epochs=5, shuffle_seed=shuffle_seeds[0]
  )
  model = algorithm.rounds.model_fn()
  layout = algorithm.layout
  scores = [s.numpy() for s in grasp.grasp_scores(model, layout, data)]
  kernels = [
    model.trainable_variables[k.trainable_index].numpy() for k in layout.kernels
  ]
  for name, sign in (
    ("GraSP (largest theta*Hg kept)", 1.0),
    ("opposite end", -1.0),
  ):
    masks = initial_pruning.global_top_k_masks(
      [sign * tf.constant(s) for s in scores], sum(algorithm.keep)
    )
    print(name)
    for kernel, weights, mask in zip(layout.kernels, kernels, masks):
      kept = mask.numpy() > 0
      positive = (weights[kept] > 0).mean() if kept.any() else float("nan")
      print(
        f"  {kernel.name:<24} density {kept.mean():.3f}  kept positive"
        f" {positive:.3f}  (all weights {(weights > 0).mean():.3f})"
      )


if __name__ == "__main__":
  app.run(main)
