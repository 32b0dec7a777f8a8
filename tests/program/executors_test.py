"""The same experiment on the local runtime, one TFF worker and two workers.

The workers are started as a user would (`python -m pipelines.worker`), on
loopback; with two, TFF's mergeable context splits each round's cohort between
them. The runs must end with the same weights (float tolerance: the
order of summation differs) and the same measured traffic, for FedAvg with
seeded crop/flip augmentation (also on one worker) and AdaptiveFL (also
with the workers reading the clients' samples from files in a directory
given, `--client_data=files`; one federated computation per sub-model
group, plus the server step and the static-BN queries). FedGKT and FedSGC,
whose drivers read per-client results (models, memory rows, reports) and
hand per-client state back in, and the public FedDST process run local and
on two workers.
"""

import os

from conftest import sparse_toy_dataset
from conftest import sparse_toy_model
from conftest import sparse_toy_spec
import numpy as np
import pytest
import tensorflow_federated as tff

import tff_hetero
from tff_hetero import models
from tff_hetero.program import make_config
from tff_hetero.program import run_experiment
from tff_hetero.runtime import testing as proc_testing

# Multi-process end-to-end checks: outside the unit tier.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


@pytest.fixture(scope="module")
def two_workers():
  with proc_testing.cli_workers(2) as workers:
    yield [w.address for w in workers]


def _run(tmp_path, name, algorithm, augment, model, on_round=None, **executor):
  config = make_config(
    algorithm=algorithm,
    augment=augment,
    dataset="synthetic",
    model=model,
    num_clients=8,
    clients_per_round=4,
    rounds=2,
    batch_size=10,
    client_lr=0.1,
    seed=3,
    eval_every=2,
    checkpoint_every=2,
    root_output_dir=str(tmp_path),
    experiment_name=name,
    progress=False,
    **executor,
  )
  return run_experiment(config, on_round=on_round)


# FedAvg with seeded augmentation: the workers crop and flip exactly as the
# local runtime does. AdaptiveFL needs a model with two width units.
# SCAFFOLD is not run here: its control variates take the path FedGKT's and
# FedSGC's per-client state takes below (in CLIENTS-placed, back stacked by
# cohort position: `cohort_positions`), as SPATL's rows do in
# remote_conformance_test.py.
@pytest.mark.parametrize(
  "algorithm,augment,model",
  [
    ("fedavg", "crop_flip", "mlp"),
    ("adaptivefl", "none", "small_cnn"),
  ],
)
def test_local_one_worker_and_two_workers_agree(
  tmp_path, two_workers, algorithm, augment, model
):
  local = _run(tmp_path, "local", algorithm, augment, model)
  others = [
    _run(
      tmp_path,
      "two",
      algorithm,
      augment,
      model,
      executor="remote",
      workers=tuple(two_workers),
    )
  ]
  if augment == "none":
    # The workers read the clients' samples from files in a directory given;
    # during the run it holds the files of the clients trained so far (the
    # weights agree with the local run's only if the workers read them).
    shared = tmp_path / "client_files"
    shared.mkdir()
    seen = []

    def files_after(round_num, row):
      del row
      (directory,) = shared.iterdir()
      seen.append((round_num, sorted(os.listdir(directory))))

    others.append(
      _run(
        tmp_path,
        "two_files",
        algorithm,
        augment,
        model,
        on_round=files_after,
        executor="remote",
        workers=tuple(two_workers),
        client_data="files",
        client_data_dir=str(shared),
      )
    )
    # The clients trained so far had their files there (`files_after`'s
    # unpacking: one run directory); the weights match the local run's.
    assert [names[:2] for _, names in seen] == [["0.x", "0.y"]] * 2
    assert list(shared.iterdir()) == []  # Removed at the end of the run.
  if algorithm == "fedavg":  # One worker: TFF's remote, non-mergeable context.
    others.append(
      _run(
        tmp_path,
        "one",
        algorithm,
        augment,
        model,
        executor="remote",
        workers=(two_workers[0],),
      )
    )
  for other in others:
    for a, b in zip(
      local.final_weights.trainable, other.final_weights.trainable
    ):
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert other.report["bytes_up_total"] == local.report["bytes_up_total"]
    assert other.report["bytes_down_total"] == local.report["bytes_down_total"]
    assert other.report["final_metrics"]["accuracy"] == pytest.approx(
      local.report["final_metrics"]["accuracy"], abs=1e-6
    )
  # Training moved the weights: the comparison is not between two copies of
  # the initial model.
  initial = models.build_model(model, (8, 8, 1), 10, seed=3).get_weights()
  assert np.max(np.abs(initial[0] - local.final_weights.trainable[0])) > 1e-3


def _local_and_two_workers(run, name, two_workers, atol):
  """`run(name, **executor)` locally and on two workers; same final weights."""
  local = run(f"{name}_local")
  two = run(f"{name}_two", executor="remote", workers=tuple(two_workers))
  for a, b in zip(local.final_weights.trainable, two.final_weights.trainable):
    np.testing.assert_allclose(a, b, rtol=0, atol=atol)
  return local, two


def test_fedgkt_on_two_workers_agrees_with_local(tmp_path, two_workers):
  # TFF's mergeable context merges the workers' partial results in the order
  # the workers finish; FedGKT's rows come back stacked with each client's
  # cohort position and are read by it (unequal Dirichlet shares: a mix-up
  # fails a check or the comparison).
  def run(name, **executor):
    return run_experiment(
      make_config(
        algorithm="fedgkt",
        dataset="synthetic",
        model="fedgkt_edge_resnet4",
        gkt_server_model="fedgkt_server_resnet7",
        partition="dirichlet",
        num_clients=4,
        clients_per_round=4,
        rounds=2,
        batch_size=32,
        seed=0,
        gkt_server_epochs=1,
        eval_every=2,
        checkpoint_every=2,
        root_output_dir=str(tmp_path),
        experiment_name=name,
        progress=False,
        **executor,
      )
    )

  local, two = _local_and_two_workers(run, "gkt", two_workers, atol=1e-4)
  for key in ("bytes_up_total", "bytes_down_total"):
    assert two.report[key] == local.report[key]


def test_fedsgc_on_two_workers_agrees_with_local(tmp_path, two_workers):
  # FedSGC keeps each client's last upload (server memory) and cumulative
  # epochs (its readjust clock) by client: both come back stacked at the
  # server with each client's cohort position and are read by it. Unequal
  # Dirichlet shares and
  # a 2 + 1 split of each cohort make the one-client worker finish first; a
  # mix-up stores one client's upload under another and changes later rounds.
  def run(name, **executor):
    return run_experiment(
      make_config(
        algorithm="fedsgc",
        dataset="synthetic",
        model="mlp",
        partition="dirichlet",
        alpha=0.3,
        num_clients=6,
        clients_per_round=3,
        rounds=2,
        local_epochs=2,
        batch_size=5,
        client_lr=0.1,
        sparsity=0.5,
        # Round 1 readjusts (full memory rows), round 2 does not (packed
        # rows): both kinds merge across the workers, and round 2 reads the
        # memory round 1 stored.
        readjust_every=2,
        readjust_delta_epochs=1,
        readjust_begin_epoch=1,
        seed=1,
        eval_every=2,
        checkpoint_every=2,
        root_output_dir=str(tmp_path),
        experiment_name=name,
        progress=False,
        **executor,
      )
    )

  local, two = _local_and_two_workers(run, "sgc", two_workers, atol=1e-5)
  assert two.report["per_client"] == local.report["per_client"]


def test_feddst_process_on_two_workers_agrees_with_local(two_workers):
  # The public `build_feddst_process` (a LearningProcess, readjust decided in
  # the graph from the round counter) split 2 + 1 across two workers: the
  # same masks, weights and measured bytes as on one local worker.
  spec, model, data = sparse_toy_spec(), sparse_toy_model, sparse_toy_dataset

  process = tff_hetero.build_feddst_process(
    model,
    input_spec=spec,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    total_rounds=3,
    sparsity=0.5,
    readjust_every=2,
  )

  def run(execution):
    with execution:
      state = process.initialize()
      bytes_up = []
      for round_num in (1, 2, 3):
        cohort = [data(c, round_num, n) for c, n in enumerate((20, 10, 15))]
        output = process.next(state, cohort)
        state = output.state
        bytes_up.append(int(output.metrics["sparse"]["upload_bytes"]))
      return process.get_model_weights(state), bytes_up

  local_weights, local_up = run(tff_hetero.local_execution())
  two_weights, two_up = run(tff_hetero.remote_execution(two_workers))
  assert two_up == local_up
  for a, b in zip(local_weights.trainable, two_weights.trainable):
    np.testing.assert_array_equal(a == 0, b == 0)  # The same masks.
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
