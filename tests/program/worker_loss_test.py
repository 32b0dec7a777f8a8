"""A worker lost mid-run: `--on_worker_loss=stop` and `=redistribute`.

Three workers serve a FedAvg run (six clients a round, split 2 + 2 + 2). The
second worker's launcher is SIGKILLed after round 2 (its `worker_binary` dies
with it), so round 3 loses it mid-round.

* `stop` (the default): the run ends with one line naming the worker, and
  `--resume` on the two that are left continues from round 2's checkpoint.
* `redistribute`: round 3 runs again on the two that answer. The third
  worker's binary is then frozen (SIGSTOP) after round 3, behind its front,
  which stays up: round 4 hangs on it, which is noticed within
  `--worker_timeout_s` (the front's readiness probe times out), and runs
  again on the first worker alone. After round 4 a new worker is started on the killed one's
  port and the frozen one resumes (SIGCONT): round 5, the last, runs on all
  three again. Each row says how many workers its round ran on.

Either way the run ends with the weights and measured bytes of the same run
on the local runtime (float tolerance: the cohort's split changes the order
of summation).
"""

import csv
import os
import signal

import numpy as np
import pytest

from tff_hetero import runtime
from tff_hetero.program import make_config
from tff_hetero.program import run_experiment
from tff_hetero.runtime import testing as proc_testing

pytestmark = pytest.mark.slow

ROUNDS = 5


def _config(tmp_path, name, **executor):
  return make_config(
    algorithm="fedavg",
    dataset="synthetic",
    model="mlp",
    num_clients=6,
    clients_per_round=6,
    rounds=ROUNDS,
    batch_size=10,
    client_lr=0.1,
    seed=11,
    eval_every=3,
    checkpoint_every=2,
    root_output_dir=str(tmp_path),
    experiment_name=name,
    progress=False,
    **executor,
  )


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
  return run_experiment(_config(tmp_path_factory.mktemp("local"), "local"))


def _assert_same_as_local(result, local_run):
  for a, b in zip(
    local_run.final_weights.trainable, result.final_weights.trainable
  ):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
  for key in ("bytes_up_total", "bytes_down_total"):
    assert result.report[key] == local_run.report[key]


def _column(root, name, column):
  with open(os.path.join(root, name, "metrics.csv")) as f:
    return [int(row[column]) for row in csv.DictReader(f)]


class _Workers:
  def __init__(self, count):
    self.workers = [proc_testing.CliWorker() for _ in range(count)]
    self.addresses = tuple(w.address for w in self.workers)

  def kill(self, index):
    worker = self.workers[index]
    worker.stop(signal.SIGKILL)
    proc_testing.assert_all_gone([worker.worker_pid], timeout_s=5)

  def freeze(self, index, sig):
    # The worker binary behind the front: the front stays up and keeps its
    # connection, but calls hang; its readiness probe times out.
    os.kill(self.workers[index].worker_pid, sig)

  def restart(self, index):
    old = self.workers[index]
    self.workers[index] = proc_testing.CliWorker(port=old.port)

  def close(self):
    for worker in self.workers:
      try:
        os.kill(worker.worker_pid, signal.SIGCONT)  # In case a test froze it.
      except ProcessLookupError:
        pass
      worker.stop()
    for worker in self.workers:
      proc_testing.assert_no_workers_left(worker.tag, timeout_s=5)


def test_stop_ends_with_one_line_and_resumes_on_the_rest(tmp_path, local_run):
  workers = _Workers(3)
  try:

    def on_round(round_num, row):
      del row
      if round_num == 2:
        workers.kill(1)

    config = _config(
      tmp_path, "stop", executor="remote", workers=workers.addresses,
      worker_timeout_s=5,
    )  # fmt: skip
    with pytest.raises(runtime.WorkerUnavailableError) as raised:
      run_experiment(config, on_round=on_round)
    message = str(raised.value)
    assert "\n" not in message and workers.addresses[1] in message, message
    alive = (workers.addresses[0], workers.addresses[2])
    resumed = run_experiment(
      _config(
        tmp_path,
        "stop",
        executor="remote",
        workers=alive,
        resume=True,
        worker_timeout_s=5,
      )  # fmt: skip
    )
  finally:
    workers.close()
  assert _column(tmp_path, "stop", "round") == list(range(1, ROUNDS + 1))
  assert _column(tmp_path, "stop", "workers") == [3, 3, 2, 2, 2]
  _assert_same_as_local(resumed, local_run)


def test_redistribute_finishes_the_round_and_takes_the_worker_back(
  tmp_path, local_run, capfd
):
  workers = _Workers(3)
  try:

    def on_round(round_num, row):
      del row
      if round_num == 2:
        workers.kill(1)
      if round_num == 3:
        workers.freeze(2, signal.SIGSTOP)
      if round_num == 4:
        workers.restart(1)
        workers.freeze(2, signal.SIGCONT)

    result = run_experiment(
      _config(
        tmp_path,
        "redistribute",
        executor="remote",
        workers=workers.addresses,
        on_worker_loss="redistribute",
        worker_timeout_s=5,
      ),  # fmt: skip
      on_round=on_round,
    )
  finally:
    workers.close()
  assert _column(tmp_path, "redistribute", "workers") == [3, 3, 2, 1, 3]
  _assert_same_as_local(result, local_run)
  warnings = [
    l for l in capfd.readouterr().err.splitlines() if l.startswith("warning: ")
  ]
  assert any(
    "round 3 again on 2 of 3 workers" in l and workers.addresses[1] in l
    for l in warnings
  ), warnings
  assert any(
    "round 4 again on 1 of 3 workers" in l and workers.addresses[2] in l
    for l in warnings
  ), warnings
  assert any(
    f"TFF workers at {workers.addresses[1]}, {workers.addresses[2]} answer"
    " again: running round 5 on 3 of 3" in l
    for l in warnings
  ), warnings
