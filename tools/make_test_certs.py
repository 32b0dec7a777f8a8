r"""Make a test CA and the certificates mutual TLS between driver and workers needs.

    python tools/make_test_certs.py --out_dir=certs \
        --hosts=localhost,127.0.0.1,10.0.0.5,worker1.example

Writes into `--out_dir` (created, mode 0700; keys mode 0600):

* `ca.pem`, `ca.key`: a self-signed CA (keep `ca.key` off the workers);
* `worker.pem`, `worker.key`: the workers' server certificate, valid for
  every name and IP address in `--hosts` (the driver checks that the worker
  it dials is one of them);
* `driver.pem`, `driver.key`: the driver's client certificate.

Then, on each worker host: `python -m pipelines.worker --listen_address=...
--port=8101 --tls_cert=worker.pem --tls_key=worker.key --tls_ca=ca.pem`; on
the driver: `python -m pipelines.train --executor=remote --workers=host:8101
--tls_cert=driver.pem --tls_key=driver.key --tls_ca=ca.pem ...`.

For tests and trials: a production deployment should get its certificates
from the operator's own CA (`tff_hetero.runtime.certificates`).
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tff_hetero.runtime.certificates import make_test_certificates  # noqa: E402  pylint: disable=g-import-not-at-top

_OUT_DIR = flags.DEFINE_string("out_dir", None, "Directory to write into.")
_HOSTS = flags.DEFINE_list(
  "hosts",
  ["localhost", "127.0.0.1", "::1"],
  "Names and IP addresses the workers' certificate is valid for.",
)
_DAYS = flags.DEFINE_integer("days", 30, "Validity in days (1-3650).")
_CA_NAME = flags.DEFINE_string(
  "ca_name", "tff-hetero test CA", "Common name of the CA."
)


def main(argv) -> None:
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments: {' '.join(argv[1:])}")
  if not _OUT_DIR.value:
    sys.exit("error: --out_dir is required")
  if not 1 <= _DAYS.value <= 3650:
    sys.exit(f"error: --days must be in 1..3650, got {_DAYS.value}")
  hosts = [h.strip() for h in _HOSTS.value if h.strip()]
  if not hosts:
    sys.exit("error: --hosts must name at least one host or address")
  paths = make_test_certificates(
    _OUT_DIR.value, hosts, _DAYS.value, _CA_NAME.value
  )
  for name in sorted(paths):
    print(paths[name])


if __name__ == "__main__":
  app.run(main)
