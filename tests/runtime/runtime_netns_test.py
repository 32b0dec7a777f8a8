"""Workers on three hosts of their own, the driver on a fourth, mutual TLS.

The hosts are Linux network namespaces (`ip netns`) joined to the driver's
by veth pairs, with addresses of this test only (10.X.i.0/30): a worker
listens on its host's address, a driver reaches it over that link and
nowhere else. `python -m pipelines.worker` serves on each worker host with
TLS on; `python -m pipelines.train --executor=remote` runs in the driver's
namespace on the three workers, and must end where the same run on the
local runtime ends (the saved weights, the report's accuracy, the measured
bytes). That local run is the test's own (`run_experiment` with the same
settings: the flags and `make_config` share their defaults), which spares
an interpreter's TensorFlow start-up.

Needs root and `ip` (iproute2); skipped with the reason otherwise.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tff_hetero.program import make_config
from tff_hetero.program import run_experiment
from tff_hetero.runtime import certificates
from tff_hetero.runtime import testing as proc_testing

pytestmark = pytest.mark.slow

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
NUM_WORKERS = 3
PORT = 8101


_REASON = proc_testing.namespaces_unavailable()


@pytest.mark.skipif(bool(_REASON), reason=_REASON or "available")
def test_three_worker_hosts_with_tls_agree_with_local(tmp_path):
  tag, env = proc_testing.tagged_env()
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  settings = dict(
    algorithm="fedavg", dataset="synthetic", model="mlp", num_clients=6,
    clients_per_round=6, rounds=2, batch_size=10, seed=5, eval_every=2,
    checkpoint_every=2, root_output_dir=str(tmp_path), progress=False,
  )  # fmt: skip
  train = [sys.executable, "-m", "pipelines.train"] + [
    f"--{name}={str(value).lower() if isinstance(value, bool) else value}"
    for name, value in settings.items()
  ]
  run_experiment(make_config(experiment_name="local", **settings))
  procs = []
  with proc_testing.veth_hosts(NUM_WORKERS) as (driver, workers):
    certs = certificates.make_test_certificates(
      tmp_path / "certs", [address for _, address in workers], days=1
    )
    try:
      for ns, address in workers:
        procs.append(
          proc_testing.CliWorker(
            f"--tls_cert={certs['worker.pem']}",
            f"--tls_key={certs['worker.key']}",
            f"--tls_ca={certs['ca.pem']}",
            port=PORT,
            stderr=subprocess.DEVNULL,
            namespace=ns,
            host=address,
          )
        )
        assert procs[-1].ready_line.startswith(
          f"TFF worker ready on {address}:{PORT} (mutual TLS;"
        ), procs[-1].ready_line
      tls = [
        f"--tls_cert={certs['driver.pem']}",
        f"--tls_key={certs['driver.key']}",
        f"--tls_ca={certs['ca.pem']}",
      ]
      addresses = [f"{address}:{PORT}" for _, address in workers]
      runs = {
        "three": train
        + ["--executor=remote", f"--workers={','.join(addresses)}"]
        + tls,
      }
      # The driver's host reaches the workers only over its links; a
      # driver without the certificates is refused.
      refused = subprocess.run(
        ["ip", "netns", "exec", driver]
        + train
        + ["--executor=remote", f"--workers={addresses[0]}",
           "--worker_timeout_s=3", "--experiment_name=refused"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        check=False,
      )  # fmt: skip
      assert refused.returncode == 2
      last = refused.stderr.strip().splitlines()[-1]
      assert last.startswith(
        f"error: --workers: cannot reach TFF worker at {addresses[0]} within"
        " 3s ("
      ), refused.stderr
      # The worker answered, and closed the plaintext connection.
      assert "pass --tls_cert, --tls_key and --tls_ca" in last, last
      with open(tmp_path / "local" / "report.json") as f:
        reports = {"local": json.load(f)}
      for name, args in runs.items():
        done = subprocess.run(
          ["ip", "netns", "exec", driver]
          + args
          + [f"--experiment_name={name}"],
          cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
          check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        with open(tmp_path / name / "report.json") as f:
          reports[name] = json.load(f)
    finally:
      for worker in procs:
        worker.stop()
  for worker_tag in [w.tag for w in procs] + [tag]:
    proc_testing.assert_no_workers_left(worker_tag, timeout_s=5)
  local = reports["local"]
  for name in ("three",):
    assert reports[name]["bytes_up_total"] == local["bytes_up_total"]
    assert reports[name]["bytes_down_total"] == local["bytes_down_total"]
    assert reports[name]["final_metrics"]["accuracy"] == pytest.approx(
      local["final_metrics"]["accuracy"], abs=1e-6
    )
    # The saved final models: the same weights, to the order of summation.
    with (
      np.load(
        tmp_path / "local" / "final_model_weights.npz", allow_pickle=False
      ) as ours,
      np.load(
        tmp_path / name / "final_model_weights.npz", allow_pickle=False
      ) as theirs,
    ):
      assert sorted(ours.files) == sorted(theirs.files)
      for key in ours.files:
        np.testing.assert_allclose(theirs[key], ours[key], rtol=0, atol=1e-5)
