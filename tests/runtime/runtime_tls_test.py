"""`pipelines.worker` behind mutual TLS, its isolation, and `--probe`.

A real worker (`python -m pipelines.worker` with certificates from
`tools/make_test_certs.py`) serves a TFF computation to a driver holding a
certificate from the same CA, and refuses a plaintext driver, a driver with
no client certificate and one whose certificate another CA signed: each is
refused with one line, and the worker logs no computation for them (its
front logs one line per computation it forwards).
"""

import os
import subprocess
import sys
import time

import grpc
import numpy as np
import psutil
import pytest

from tff_hetero import runtime
from tff_hetero.runtime import certificates
from tff_hetero.runtime import testing as proc_testing
from tff_hetero.runtime import tls as tls_lib

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _make_certs(out_dir):
  return certificates.make_test_certificates(
    out_dir, ["localhost", "127.0.0.1"], days=1, ca_name="test CA"
  )


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
  root = tmp_path_factory.mktemp("certs")
  return _make_certs(root / "ours"), _make_certs(root / "theirs")


def _config(paths, ca_paths=None):
  return tls_lib.TlsConfig.from_flags(
    paths["driver.pem"], paths["driver.key"], (ca_paths or paths)["ca.pem"]
  )


def _computations_logged(err_path):
  return [
    l for l in err_path.read_text().splitlines() if l.startswith("computation ")
  ]


def _forwarded_calls_logged(err_path):
  """The front's lines: one per computation fetched, one per forwarded
  call the worker answered with an error."""
  return [
    l
    for l in err_path.read_text().splitlines()
    if l.startswith(("computation ", "call "))
  ]


@pytest.fixture(scope="module")
def tls_worker(certs, tmp_path_factory):
  ours, _ = certs
  err_path = tmp_path_factory.mktemp("worker") / "worker.err"
  with open(err_path, "w") as err:
    worker = proc_testing.CliWorker(
      f"--tls_cert={ours['worker.pem']}",
      f"--tls_key={ours['worker.key']}",
      f"--tls_ca={ours['ca.pem']}",
      stderr=err,
    )
  yield worker.port, worker.ready_line, err_path
  code, _ = worker.stop()
  assert code == 0
  proc_testing.assert_no_workers_left(worker.tag, timeout_s=5)


def test_ready_line_and_isolation(tls_worker):
  port, line, _ = tls_worker
  assert line.startswith(
    f"TFF worker ready on 127.0.0.1:{port} (mutual TLS; worker pid "
  )
  worker_pid = int(line.rsplit(" ", 1)[1].rstrip(")"))
  assert psutil.Process(worker_pid).name() == "worker_binary"
  # The binary binds [::]:port in its own namespace: no socket of it in ours.
  assert (
    os.stat(f"/proc/{worker_pid}/ns/net").st_ino
    != os.stat("/proc/self/ns/net").st_ino
  )
  ours = [c for c in psutil.net_connections("inet") if c.pid == worker_pid]
  assert ours == []
  # It runs whatever graph it is sent: with no capability, even when the
  # launcher is root (it had CAP_SYS_ADMIN and CAP_NET_ADMIN to isolate it).
  with open(f"/proc/{worker_pid}/status", encoding="ascii") as f:
    status = dict(
      l.split(":\t", 1) for l in f.read().splitlines() if ":\t" in l
    )
  for field in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
    assert int(status[field], 16) == 0, (field, status[field])
  assert status["NoNewPrivs"].strip() == "1"
  # Only the front listens, on loopback.
  listening = [
    c.laddr.ip
    for c in psutil.net_connections("inet")
    if c.status == psutil.CONN_LISTEN and c.laddr.port == port
  ]
  assert listening and all(
    ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip in listening
  )


def _federated_sum(tls, port, timeout_s=20):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  with runtime.remote_execution(
    [f"127.0.0.1:{port}"],
    worker_timeout_s=timeout_s,
    default_num_clients=3,
    tls=tls,
  ):

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def total(values):
      return tff.federated_sum(values)

    return total([1.0, 2.0, 4.0])


def test_refused_drivers_run_nothing_then_ours_runs(tls_worker, certs):
  port, _, err_path = tls_worker
  ours, theirs = certs
  for tls in (None, _config(theirs, ca_paths=ours)):
    with pytest.raises(runtime.WorkerUnavailableError) as raised:
      _federated_sum(tls, port, timeout_s=2)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
      f"--workers: cannot reach TFF worker at 127.0.0.1:{port} within 2s ("
    ), message
  # A TLS client with the right CA but no certificate of its own: the
  # handshake fails before any call reaches the worker.
  channel = grpc.secure_channel(
    f"127.0.0.1:{port}",
    grpc.ssl_channel_credentials(root_certificates=_config(ours).ca),
  )
  with pytest.raises(grpc.RpcError) as raised:
    channel.unary_unary("/tensorflow_federated.v0.ExecutorGroup/Compute")(
      b"", timeout=3
    )
  channel.close()
  assert raised.value.code() in (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
  )
  # Nothing reached the worker: an empty Compute forwarded would have been
  # answered with an error, and logged.
  assert _forwarded_calls_logged(err_path) == []

  assert _federated_sum(_config(ours), port) == pytest.approx(7.0)
  deadline = time.monotonic() + 5
  while not _computations_logged(err_path) and time.monotonic() < deadline:
    time.sleep(0.05)
  logged = _computations_logged(err_path)
  assert len(logged) == 1, err_path.read_text()
  assert logged[0].startswith("computation 1: ") and " s, " in logged[0]


def test_probe_command(tls_worker, certs):
  port, _, _ = tls_worker
  ours, theirs = certs
  env = dict(os.environ, PYTHONPATH=REPO)
  base = [sys.executable, "-m", "pipelines.worker", f"--probe=127.0.0.1:{port}"]
  good = subprocess.run(
    base
    + [
      f"--tls_cert={ours['driver.pem']}",
      f"--tls_key={ours['driver.key']}",
      f"--tls_ca={ours['ca.pem']}",
    ],
    capture_output=True,
    text=True,
    env=env,
    timeout=60,
    check=False,
  )
  assert good.returncode == 0, good.stderr
  assert good.stdout.strip() == (
    f"127.0.0.1:{port}: ready (tff-hetero worker front, mutual TLS)"
  )
  bad = subprocess.run(
    base
    + [
      f"--tls_cert={theirs['driver.pem']}",
      f"--tls_key={theirs['driver.key']}",
      f"--tls_ca={ours['ca.pem']}",
      "--probe_timeout_s=1",
    ],
    capture_output=True,
    text=True,
    env=env,
    timeout=60,
    check=False,
  )
  assert bad.returncode == 1
  errors = [l for l in bad.stderr.splitlines() if l.startswith("error: ")]
  assert errors == [l for l in bad.stderr.splitlines() if l.strip()]
  assert errors[0].startswith(
    f"error: --probe: cannot reach TFF worker at 127.0.0.1:{port} within 1s"
  )
  assert "may not accept this driver's certificate" in errors[0], errors[0]


def _worker_cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "pipelines.worker", *args],
    capture_output=True,
    text=True,
    env=dict(os.environ, PYTHONPATH=REPO),
    timeout=60,
    check=False,
  )


def test_network_address_needs_tls_or_insecure(certs):
  ours, _ = certs
  result = _worker_cli("--listen_address=0.0.0.0", "--port=8123")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
    "error: --listen_address=0.0.0.0 is not loopback: serving it needs mutual"
    " TLS (--tls_cert, --tls_key, --tls_ca), or --insecure to serve plaintext"
    " to the network anyway"
  ]
  partial = _worker_cli("--port=8123", f"--tls_cert={ours['worker.pem']}")
  assert partial.returncode == 2
  assert partial.stderr.strip().splitlines() == [
    "error: --tls_key: missing; --tls_cert, --tls_key, --tls_ca go together"
    " (mutual TLS)"
  ]
  mismatched = _worker_cli(
    "--port=8123",
    f"--tls_cert={ours['worker.pem']}",
    f"--tls_key={ours['driver.key']}",
    f"--tls_ca={ours['ca.pem']}",
  )
  assert mismatched.returncode == 2
  (line,) = mismatched.stderr.strip().splitlines()
  assert line.startswith(
    f"error: --tls_key: {ours['driver.key']} does not match --tls_cert"
  )


def test_insecure_serves_plaintext_to_the_network_with_a_warning():
  worker = proc_testing.CliWorker("--insecure", host="0.0.0.0")
  try:
    assert worker.ready_line.startswith(
      f"TFF worker ready on 0.0.0.0:{worker.port} (plaintext; worker pid "
    )
    assert _federated_sum(None, worker.port) == pytest.approx(7.0)
  finally:
    _, err = worker.stop()
    proc_testing.assert_no_workers_left(worker.tag)
  warnings = [l for l in err.splitlines() if l.startswith("warning: ")]
  assert warnings == [
    f"warning: --insecure: serving plaintext on 0.0.0.0:{worker.port},"
    " without authentication: whoever reaches it can run code on this host"
  ]
