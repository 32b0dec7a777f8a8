"""A test CA and the certificates mutual TLS between driver and workers needs.

`make_test_certificates(out_dir, hosts)` writes, into `out_dir` (created,
mode 0700; keys mode 0600):

* `ca.pem`, `ca.key`: a self-signed CA (keep `ca.key` off the workers);
* `worker.pem`, `worker.key`: the workers' server certificate, valid for
  every name and IP address in `hosts` (the driver checks that the worker it
  dials is one of them);
* `driver.pem`, `driver.key`: the driver's client certificate.

For tests and trials (`tools/make_test_certs.py` is its command line): a
production deployment should get its certificates from the operator's own
CA. ECDSA P-256 keys, SHA-256 signatures, with the `cryptography` package.
"""

from __future__ import annotations

from collections.abc import Sequence
import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.oid import NameOID

__all__ = ["make_test_certificates"]


def _name(common_name: str) -> x509.Name:
  return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _alt_names(hosts) -> list:
  names = []
  for host in hosts:
    try:
      names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
    except ValueError:
      names.append(x509.DNSName(host))
  return names


def make_test_certificates(
  out_dir: str,
  hosts: Sequence[str] = ("localhost", "127.0.0.1", "::1"),
  days: int = 30,
  ca_name: str = "tff-hetero test CA",
) -> dict[str, str]:
  """Writes the files (module docstring); returns {file name: path}."""
  out_dir = os.fspath(out_dir)
  now = datetime.datetime.now(datetime.timezone.utc)
  valid = dict(
    not_valid_before=now - datetime.timedelta(minutes=5),
    not_valid_after=now + datetime.timedelta(days=days),
  )
  ca_key = ec.generate_private_key(ec.SECP256R1())
  ca_cert = (
    x509.CertificateBuilder()
    .subject_name(_name(ca_name))
    .issuer_name(_name(ca_name))
    .public_key(ca_key.public_key())
    .serial_number(x509.random_serial_number())
    .not_valid_before(valid["not_valid_before"])
    .not_valid_after(valid["not_valid_after"])
    .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    .add_extension(
      x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
      ),
      critical=True,
    )
    .sign(ca_key, hashes.SHA256())
  )

  def leaf(common_name: str, usage, alt_names):
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
      x509.CertificateBuilder()
      .subject_name(_name(common_name))
      .issuer_name(ca_cert.subject)
      .public_key(key.public_key())
      .serial_number(x509.random_serial_number())
      .not_valid_before(valid["not_valid_before"])
      .not_valid_after(valid["not_valid_after"])
      .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
      .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if alt_names:
      builder = builder.add_extension(
        x509.SubjectAlternativeName(alt_names), critical=False
      )
    return key, builder.sign(ca_key, hashes.SHA256())

  worker_key, worker_cert = leaf(
    "tff-hetero worker", ExtendedKeyUsageOID.SERVER_AUTH, _alt_names(hosts)
  )
  driver_key, driver_cert = leaf(
    "tff-hetero driver", ExtendedKeyUsageOID.CLIENT_AUTH, []
  )
  os.makedirs(out_dir, mode=0o700, exist_ok=True)
  os.chmod(out_dir, 0o700)
  paths = {}

  def write(name: str, data: bytes, mode: int) -> None:
    path = os.path.join(out_dir, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # Before writing: an existing file keeps its mode.
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    paths[name] = path

  pem = serialization.Encoding.PEM
  for name, key in (
    ("ca", ca_key),
    ("worker", worker_key),
    ("driver", driver_key),
  ):
    write(
      f"{name}.key",
      key.private_bytes(
        pem,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
      ),
      0o600,
    )
  for name, cert in (
    ("ca", ca_cert),
    ("worker", worker_cert),
    ("driver", driver_cert),
  ):
    write(f"{name}.pem", cert.public_bytes(pem), 0o644)
  return paths
