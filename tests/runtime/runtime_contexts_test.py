"""Execution contexts: same results everywhere, bounded waits on dead workers.

Remote workers are started the way users start them, with
`python -m pipelines.worker --port=N` (module fixture, stopped by SIGTERM at
the end, which must exit 0 and leave no worker).
"""

import os
import signal
import threading
import time

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top,wrong-import-position

from tff_hetero import runtime  # pylint: disable=wrong-import-position
from tff_hetero.runtime import testing as proc_testing  # pylint: disable=wrong-import-position

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
SLACK_S = 4.0  # Generous: CI machines are shared and loaded.


# ---------------------------------------------------------------------------
# Computations.


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def federated_mean(values):
  return tff.federated_mean(values)


@tff.tensorflow.computation(np.float32)
def _spin(x):
  """A few seconds of single-threaded work per client."""

  def body(i, a):
    return i + 1, a * 0.999999 + 1e-6

  return tf.while_loop(lambda i, a: i < 2_000_000, body, (0, x))[1]


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def slow_mean(values):
  return tff.federated_mean(tff.federated_map(_spin, values))


def _model_fn():
  keras_model = tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer(input_shape=(3,)),
      tf.keras.layers.Dense(2, kernel_initializer="zeros"),
    ]
  )
  return tff.learning.models.from_keras_model(
    keras_model,
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    input_spec=(
      tf.TensorSpec([None, 3], tf.float32),
      tf.TensorSpec([None], tf.int32),
    ),
    metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
  )


@pytest.fixture(scope="module")
def fedavg():
  process = tff.learning.algorithms.build_weighted_fed_avg(
    _model_fn,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  )
  rng = np.random.default_rng(0)
  datasets = [
    tf.data.Dataset.from_tensor_slices(
      (
        rng.normal(size=(n, 3)).astype(np.float32),
        rng.integers(0, 2, size=n).astype(np.int32),
      )
    ).batch(2)
    for n in (3, 4, 5, 2, 6)
  ]
  return process, datasets


def _run_fedavg(process, datasets):
  """initialize, then two rounds; returns flat numpy weights and metrics."""
  state = process.initialize()
  for _ in range(2):
    output = process.next(state, datasets)
    state = output.state
  weights = [
    np.asarray(w)
    for w in tf.nest.flatten(process.get_model_weights(state).trainable)
  ]
  train = output.metrics["client_work"]["train"]
  return weights, {k: float(v) for k, v in train.items()}


def _assert_same_fedavg(actual, expected):
  for a, e in zip(actual[0], expected[0]):
    np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
  assert actual[1].keys() == expected[1].keys()
  for key in expected[1]:
    assert actual[1][key] == pytest.approx(expected[1][key], rel=1e-5)


# ---------------------------------------------------------------------------
# Workers started with `python -m pipelines.worker`.


_CliWorker = proc_testing.CliWorker


@pytest.fixture(scope="module")
def cli_workers():
  workers = [_CliWorker(), _CliWorker()]
  yield workers
  for worker in workers:
    code, err = worker.stop(signal.SIGTERM)
    assert code == 0, err
    proc_testing.assert_all_gone([worker.worker_pid])
    proc_testing.assert_no_workers_left(worker.tag, timeout_s=1)


# ---------------------------------------------------------------------------
# Same results on every context.


def test_federated_mean_and_fedavg_agree_on_all_contexts(cli_workers, fedavg):
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )  # pylint: disable=g-import-not-at-top

  before = context_stack_impl.context_stack.current
  values = [1.0, 2.0, 3.0, 4.0, 10.0]
  results = {}
  with runtime.local_execution(worker_timeout_s=30) as handle:
    assert handle.kind == "local" and not handle.mergeable
    assert context_stack_impl.context_stack.current is handle.context
    results["local"] = (federated_mean(values), _run_fedavg(*fedavg))
  assert context_stack_impl.context_stack.current is before
  assert not handle.workers[0].is_running()

  with runtime.remote_execution(
    [cli_workers[0].address], worker_timeout_s=30
  ) as handle:
    assert handle.kind == "remote" and not handle.mergeable
    results["one"] = (federated_mean(values), _run_fedavg(*fedavg))

  addresses = [w.address for w in cli_workers]
  with runtime.remote_execution(addresses, worker_timeout_s=30) as handle:
    assert handle.mergeable
    assert isinstance(
      handle.context.inner, tff.framework.MergeableCompExecutionContext
    )
    results["two"] = (federated_mean(values), _run_fedavg(*fedavg))
    cardinalities = handle.client_cardinalities()
    counts = handle.rpc_counts()
  assert context_stack_impl.context_stack.current is before

  # The mergeable context split the 5 clients 3 + 2 across the two workers,
  # and both computed.
  assert 3 in cardinalities[addresses[0]], cardinalities
  assert 2 in cardinalities[addresses[1]], cardinalities
  for address in addresses:
    assert counts[address].get("Compute", 0) > 0, counts

  expected_mean = np.mean(values)
  for name, (mean, fedavg_result) in results.items():
    assert mean == pytest.approx(expected_mean, rel=1e-6), name
    _assert_same_fedavg(fedavg_result, results["local"][1])
  # The rounds actually trained.
  assert np.abs(results["local"][1][0][0]).sum() > 0
  assert results["local"][1][1]["num_examples"] == 20


@tff.tensorflow.computation(np.float32, np.float32)
def _squared_deviation(x, m):
  return (x - m) * (x - m)


@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def federated_variance(x):
  mean = tff.federated_mean(x)  # An aggregate that feeds another one.
  return tff.federated_mean(
    tff.federated_map(_squared_deviation, (x, tff.federated_broadcast(mean)))
  )


def test_local_execution_with_two_workers_uses_mergeable_context():
  from tensorflow_federated.python.core.impl.context_stack import context_base  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )  # pylint: disable=g-import-not-at-top

  class OtherContext(context_base.SyncContext):
    def invoke(self, comp, arg):
      raise NotImplementedError

  values = [1.0, 2.0, 3.0, 6.0]
  with context_stack_impl.context_stack.install(OtherContext()):
    assert not runtime.compile_ahead(federated_variance)  # Not ours: no-op.
  with runtime.local_execution(worker_timeout_s=30):
    # One worker: compiled in the background, then called.
    assert runtime.compile_ahead(federated_variance)
    assert federated_variance(values) == pytest.approx(3.5)
  with runtime.local_execution(num_workers=2, worker_timeout_s=30) as handle:
    assert handle.mergeable and len(handle.workers) == 2
    assert not runtime.compile_ahead(federated_mean)  # Its own compiler.
    assert federated_mean(values) == pytest.approx(3.0)
    # The mergeable context's limit: one aggregation may not depend on another.
    with pytest.raises(ValueError, match="one aggregate dependent on another"):
      federated_variance(values)
    pids = [w.pid for w in handle.workers]
  proc_testing.assert_all_gone(pids, timeout_s=5)


_SECURE_SUM = tff.aggregators.SecureSumFactory(10.0).create(
  tff.TensorType(np.float32)
)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_secure_sums_are_simulated_on_one_and_several_workers(num_workers):
  """TFF's SecureSumFactory (clip to [-10, 10], quantize to 32 bits, secure
  sum) runs as plain sums of the quantized integers: the clipped sum,
  within the quantization step 20 / 2^32 per value."""
  values = [np.float32(v) for v in (1.5, -2.25, 30.0, 4.0)]
  with runtime.local_execution(num_workers=num_workers, worker_timeout_s=30):
    output = _SECURE_SUM.next(_SECURE_SUM.initialize(), values)
  if hasattr(output, "result"):
    output = dict(result=output.result, measurements=output.measurements)
  assert float(output["result"]) == pytest.approx(
    1.5 - 2.25 + 10.0 + 4.0, abs=1e-5
  )
  assert int(output["measurements"]["secure_upper_clipped_count"]) == 1


def test_previous_context_restored_after_exception():
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )  # pylint: disable=g-import-not-at-top

  before = context_stack_impl.context_stack.current
  with pytest.raises(ZeroDivisionError):
    with runtime.local_execution(worker_timeout_s=30) as handle:
      worker = handle.workers[0]
      assert federated_mean([2.0]) == pytest.approx(2.0)
      _ = 1 / 0
  assert context_stack_impl.context_stack.current is before
  proc_testing.assert_all_gone([worker.pid], timeout_s=5)
  assert worker not in runtime.live_workers()


def test_a_local_worker_that_does_not_answer_fails_the_first_call():
  # Entry does not wait for the worker (the program traces meanwhile); the
  # first call does, up to start_timeout_s.
  with runtime.local_execution(start_timeout_s=0.001) as handle:
    worker = handle.workers[0]
    with pytest.raises(runtime.WorkerStartError, match="did not answer within"):
      federated_mean([2.0])
  proc_testing.assert_all_gone([worker.pid], timeout_s=5)


def test_the_first_call_runs_on_the_addresses_readiness_returns():
  from tff_hetero.runtime import contexts  # pylint: disable=g-import-not-at-top

  # A worker started again on another port (a port clash) replaces the one
  # the context was built for.
  with runtime.WorkerProcess() as first, runtime.WorkerProcess() as second:
    with contexts._run_on(  # pylint: disable=protected-access
      "local",
      [first.address],
      worker_timeout_s=30,
      default_num_clients=0,
      max_message_mb=runtime.DEFAULT_MAX_MESSAGE_MB,
      num_subrounds=None,
      ready=lambda: (second.address,),
    ) as handle:
      assert federated_mean([1.0, 3.0]) == pytest.approx(2.0)
      assert handle.configured_addresses == (second.address,)
      assert handle.addresses == (second.address,)
      assert handle.rpc_counts() == {
        second.address: handle.rpc_counts()[second.address]
      }
      assert handle.rpc_counts()[second.address]


# ---------------------------------------------------------------------------
# Unreachable and dead workers.


def test_unreachable_address_fails_fast_with_one_line():
  port = runtime.find_free_port()
  start = time.monotonic()
  with pytest.raises(runtime.WorkerUnavailableError) as e:
    with runtime.remote_execution([f"127.0.0.1:{port}"], worker_timeout_s=1.5):
      pytest.fail("entered a context with an unreachable worker")
  elapsed = time.monotonic() - start
  # The reason is gRPC's, from one fail-fast call after the wait.
  assert str(e.value).startswith(
    f"--workers: cannot reach TFF worker at 127.0.0.1:{port} within 1.5s ("
  )
  assert "Connection refused" in str(e.value)
  assert 1.4 < elapsed < 1.5 + SLACK_S


def test_one_unreachable_among_several_is_named(cli_workers):
  port = runtime.find_free_port()
  bad = f"127.0.0.1:{port}"
  with pytest.raises(runtime.WorkerUnavailableError) as e:
    with runtime.execution_context("remote", [cli_workers[0].address, bad], 1):
      pass
  assert str(e.value).startswith(
    f"--workers: cannot reach TFF worker at {bad} within 1s ("
  )
  assert cli_workers[0].address not in str(e.value)


@pytest.mark.parametrize(
  "address", ["nohost", "host:", ":80", "h:99999", "::1:80"]
)
def test_malformed_address_is_a_value_error(address):
  with pytest.raises(ValueError):
    with runtime.remote_execution([address], worker_timeout_s=1):
      pass


@pytest.mark.slow
def test_killed_worker_fails_next_call_within_timeout():
  timeout_s = 4.0
  with runtime.local_execution(worker_timeout_s=timeout_s) as handle:
    assert federated_mean([1.0, 3.0]) == pytest.approx(2.0)
    worker = handle.workers[0]
    os.kill(worker.pid, signal.SIGKILL)
    proc_testing.wait_until_gone([worker.pid], 5)
    start = time.monotonic()
    with pytest.raises(runtime.WorkerUnavailableError) as e:
      federated_mean([1.0, 3.0])
    elapsed = time.monotonic() - start
  message = str(e.value)
  assert "\n" not in message
  assert message == (
    f"cannot reach TFF worker at {worker.address} within {timeout_s:g}s"
  )
  assert timeout_s - 0.5 < elapsed < timeout_s + SLACK_S


@pytest.mark.slow
def test_killed_worker_among_two_is_named():
  timeout_s = 3.0
  with runtime.local_execution(
    num_workers=2, worker_timeout_s=timeout_s
  ) as handle:
    assert federated_mean([1.0, 3.0]) == pytest.approx(2.0)
    victim = handle.workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    proc_testing.wait_until_gone([victim.pid], 5)
    start = time.monotonic()
    with pytest.raises(runtime.WorkerUnavailableError) as e:
      federated_mean([1.0, 3.0])
    elapsed = time.monotonic() - start
  assert str(e.value) == (
    f"cannot reach TFF worker at {victim.address} within {timeout_s:g}s"
  )
  assert elapsed < timeout_s + SLACK_S


def test_worker_dying_during_a_call_fails_at_once():
  with runtime.local_execution(worker_timeout_s=30) as handle:
    worker = handle.workers[0]
    assert federated_mean([1.0]) == pytest.approx(1.0)
    killer = threading.Timer(1.0, os.kill, (worker.pid, signal.SIGKILL))
    start = time.monotonic()
    killer.start()
    try:
      with pytest.raises(runtime.WorkerUnavailableError) as e:
        slow_mean([1.0, 2.0])
    finally:
      killer.cancel()
    elapsed = time.monotonic() - start
  assert str(e.value).startswith(
    f"TFF worker at {worker.address} became unavailable during "
  )
  assert "\n" not in str(e.value)
  assert elapsed < 1.0 + SLACK_S  # Not the 30 s timeout.


def test_frozen_worker_is_detected_within_timeout():
  timeout_s = 3.0
  with runtime.local_execution(worker_timeout_s=timeout_s) as handle:
    worker = handle.workers[0]
    assert federated_mean([1.0]) == pytest.approx(1.0)
    os.kill(worker.pid, signal.SIGSTOP)  # Connection stays up, nobody answers.
    try:
      start = time.monotonic()
      with pytest.raises(runtime.WorkerUnavailableError) as e:
        federated_mean([1.0, 2.0])
      elapsed = time.monotonic() - start
    finally:
      os.kill(worker.pid, signal.SIGCONT)
  assert str(e.value) == (
    f"cannot reach TFF worker at {worker.address} within {timeout_s:g}s"
  )
  assert timeout_s - 0.5 < elapsed < timeout_s + SLACK_S


@pytest.mark.slow
def test_long_computation_outlasts_the_timeout():
  # The bound is on silence from the worker, not on the length of a call.
  timeout_s = 1.5
  with runtime.local_execution(worker_timeout_s=timeout_s) as handle:
    assert federated_mean([1.0]) == pytest.approx(1.0)
    start = time.monotonic()
    result = slow_mean([2.0])
    elapsed = time.monotonic() - start
    counts = handle.rpc_counts()[handle.addresses[0]]
  assert elapsed > 2 * timeout_s, f"too quick ({elapsed:.1f}s) to prove it"
  assert 1.0 < result < 2.0
  assert counts["CreateCall"] >= 1


def test_restarted_worker_is_used_again():
  with runtime.local_execution(worker_timeout_s=10) as handle:
    worker = handle.workers[0]
    assert federated_mean([1.0, 3.0]) == pytest.approx(2.0)
    os.kill(worker.pid, signal.SIGKILL)
    assert not proc_testing.wait_until_gone([worker.pid], 5)
    deadline = time.monotonic() + 5
    while not runtime.port_is_free(worker.port) and time.monotonic() < deadline:
      time.sleep(0.05)
    with runtime.WorkerProcess(worker.port) as replacement:
      # The old executor is unknown to the new worker (FAILED_PRECONDITION);
      # the invocation is retried on a fresh one.
      assert federated_mean([1.0, 5.0]) == pytest.approx(3.0)
    assert not replacement.is_running()


def test_messages_above_grpc_default_4mb_limit():
  big = np.linspace(0.0, 1.0, 3_000_000, dtype=np.float32)  # 12 MB.

  @tff.tensorflow.computation(tff.TensorType(np.float32, [3_000_000]))
  def total(x):
    return tf.reduce_sum(x), x * 2.0

  with runtime.local_execution(worker_timeout_s=30) as handle:
    before = handle.rpc_bytes()
    sum_, doubled = total(big)
    after = handle.rpc_bytes()
  assert sum_ == pytest.approx(float(big.sum()), rel=1e-3)
  np.testing.assert_allclose(doubled, big * 2.0)
  # The 12,000,000-byte argument went out once and the 12,000,004-byte
  # result came back once; the rest is the computation and proto framing.
  sent = after["sent"] - before["sent"]
  received = after["received"] - before["received"]
  assert 12_000_000 <= sent < 12_100_000, sent
  assert 12_000_004 <= received < 12_100_000, received


# ---------------------------------------------------------------------------
# The registry.


def test_registry():
  assert {"local", "remote", "auto"} <= set(runtime.available_executors())
  with pytest.raises(ValueError, match="unknown executor"):
    runtime.execution_context("gpu-cluster", [], 1)
  with pytest.raises(ValueError, match="--workers must be empty"):
    runtime.execution_context("local", ["127.0.0.1:1"], 1)
  with pytest.raises(ValueError, match="needs --workers"):
    runtime.execution_context("remote", [], 1)
  with runtime.execution_context("auto", "", 30) as handle:
    assert handle.kind == "local"
    assert federated_mean([4.0]) == pytest.approx(4.0)


def test_registry_remote_from_comma_separated_string(cli_workers):
  workers = ",".join(w.address for w in cli_workers)
  with runtime.execution_context("auto", workers, 30) as handle:
    assert handle.kind == "remote" and handle.mergeable
    assert federated_mean([1.0, 2.0, 3.0, 6.0]) == pytest.approx(3.0)


def test_copied_remote_executor_methods_are_pinned_to_their_tff_version():
  from tff_hetero.runtime import threaded_executor  # pylint: disable=g-import-not-at-top

  # The installed TFF is the one the methods were copied from.
  threaded_executor.check_tff_version()
  assert threaded_executor.threaded_remote_executor_class() is not None
  with pytest.raises(RuntimeError, match=r"0\.87\.0.*0\.88\.0 is installed"):
    threaded_executor.check_tff_version("0.88.0")
