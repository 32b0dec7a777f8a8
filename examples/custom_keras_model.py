"""FedAvg, FedDST or HeteroFL with a Keras model of your own, from
tff-hetero's public API only.

  python examples/custom_keras_model.py [--aggregator=mean|clip|dp] [--rounds=N]
  python examples/custom_keras_model.py --algorithm=feddst [--rounds=N]
  python examples/custom_keras_model.py --algorithm=heterofl [--aggregator=...]

Builds a small Keras MLP (not one of the registry's models), trains it with
`tff_hetero.build_fedavg_process` on a TFF worker this script owns
(`tff_hetero.local_execution`) over synthetic, seeded client data, and prints
per round the training loss, the global model's accuracy on held-out data,
and the bytes that crossed the network as TFF measured them. With
`--aggregator=clip` or `dp` the model updates go through TFF's clipping or
DP-FedAvg Gaussian factory (`tff_hetero.build_model_aggregator`). With
`--algorithm=feddst` the same model trains sparse (half its kernel weights
masked, masks readjusted every round but the last:
`tff_hetero.build_feddst_process`). With `--algorithm=heterofl` half the
clients are weak devices that train the model at half its hidden width
(`tff_hetero.build_heterofl_process`); the accuracy printed is the full
model's.
"""

from __future__ import annotations

import argparse
import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import tff_hetero

NUM_FEATURES, NUM_CLASSES = 10, 3
INPUT_SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, NUM_FEATURES], tf.float32),
  y=tf.TensorSpec([None], tf.int32),
)


HIDDEN = 16


def width_model(widths=(HIDDEN,)) -> tf.keras.Model:
  """Your model: any Keras model that outputs logits, seeded; for HeteroFL
  its hidden width is a knob (a narrower model is the first units)."""
  initializer = tf.keras.initializers.GlorotUniform(seed=1)
  return tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer(input_shape=(NUM_FEATURES,)),
      tf.keras.layers.Dense(
        widths[0], activation="relu", kernel_initializer=initializer
      ),
      tf.keras.layers.Dense(NUM_CLASSES, kernel_initializer=initializer),
    ]
  )


def keras_model() -> tf.keras.Model:
  return width_model()


def synthetic_data(num_clients: int, per_client: int, seed: int = 0):
  """Linearly separable classes, each client with its own label skew."""
  rng = np.random.default_rng(seed)
  centers = rng.normal(0, 2, size=(NUM_CLASSES, NUM_FEATURES))

  def sample(n, label_probs):
    y = rng.choice(NUM_CLASSES, size=n, p=label_probs).astype(np.int32)
    x = (centers[y] + rng.normal(0, 1, size=(n, NUM_FEATURES))).astype(
      np.float32
    )
    return x, y

  clients = []
  for _ in range(num_clients):
    x, y = sample(per_client, rng.dirichlet([1.0] * NUM_CLASSES))
    clients.append(
      tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)
      ).batch(10)
    )
  test = sample(600, [1 / NUM_CLASSES] * NUM_CLASSES)
  return clients, test


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--aggregator", default="mean", choices=["mean", "clip", "dp"]
  )
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument(
    "--algorithm", default="fedavg", choices=["fedavg", "feddst", "heterofl"]
  )
  args = parser.parse_args()
  if args.algorithm == "feddst" and args.aggregator != "mean":
    parser.error("--aggregator: feddst takes only mean")
  clip_norm = None if args.aggregator == "mean" else 1.0
  noise_multiplier = 0.1 if args.aggregator == "dp" else None

  clients, (test_x, test_y) = synthetic_data(num_clients=8, per_client=60)
  cohort = 4
  aggregator, weighting = tff_hetero.build_model_aggregator(
    args.aggregator,
    clip_norm=clip_norm,
    noise_multiplier=noise_multiplier,
    clients_per_round=cohort,
  )
  # HeteroFL: clients 0-3 are weak devices (half the hidden width).
  rate_of = [0.5] * 4 + [1.0] * 4
  if args.algorithm == "heterofl":
    process = tff_hetero.build_heterofl_process(
      width_model,
      full_widths=(HIDDEN,),
      rates=(0.5,),
      input_spec=INPUT_SPEC,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      model_aggregator=tff_hetero.MaskedAggregation(
        clip_norm=clip_norm, noise_multiplier=noise_multiplier
      ),
      # A fixed DP noise seed makes the example repeatable (None: secret).
      noise_seed=0 if args.aggregator == "dp" else None,
    )
  elif args.algorithm == "feddst":
    process = tff_hetero.build_feddst_process(
      keras_model,
      input_spec=INPUT_SPEC,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      total_rounds=args.rounds,
      sparsity=0.5,
    )
  else:
    process = tff_hetero.build_fedavg_process(
      keras_model,
      input_spec=INPUT_SPEC,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      model_aggregator=aggregator,
      client_weighting=weighting,
    )

  evaluation_model = keras_model()
  rng = np.random.default_rng(1)
  with tff_hetero.local_execution():
    state = process.initialize()
    for round_num in range(1, args.rounds + 1):
      chosen = rng.choice(len(clients), size=cohort, replace=False)
      if args.algorithm == "heterofl":
        by_rate = {}
        for i in chosen:
          by_rate.setdefault(rate_of[i], []).append(clients[i])
        output = process.next(state, by_rate)
      else:
        output = process.next(state, [clients[i] for i in chosen])
      state = output.state
      metrics = output.metrics
      process.get_model_weights(state).assign_weights_to(evaluation_model)
      logits = evaluation_model(test_x, training=False)
      accuracy = float(np.mean(np.argmax(logits, axis=1) == test_y))
      if args.algorithm == "heterofl":
        loss, down, up = (
          metrics[k] for k in ("loss", "bytes_down", "bytes_up")
        )
      elif args.algorithm == "feddst":
        sparse = metrics["sparse"]
        loss = sparse["train"]["metrics"]["loss"]
        # The round number and the sparse model down; values, bit masks
        # where they changed, dense biases and the weight up.
        down = (
          metrics["round"]["bytes_down"] + sparse["distributor"]["bytes_down"]
        )
        up = sparse["upload_bytes"]
      else:
        loss = metrics["client_work"]["train"]["metrics"]["loss"]
        down = metrics["distributor"]["bytes_down"]
        up = metrics["aggregator"]["bytes_up"]
      print(
        f"round {round_num}: loss={float(loss):.4f}"
        f" test_accuracy={accuracy:.4f}"
        f" bytes_down={int(down)} bytes_up={int(up)}",
        flush=True,
      )


if __name__ == "__main__":
  main()
