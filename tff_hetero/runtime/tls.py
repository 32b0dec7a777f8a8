"""Mutual TLS between the driver and its TFF workers.

Both sides take the same three PEM files (`--tls_cert`, `--tls_key`,
`--tls_ca`): their own certificate and key, and the CA that signed the
other side's certificate. A worker (`pipelines.worker`, `front.py`) accepts a
connection only from a client whose certificate chains to its CA; a driver
(`remote_execution(tls=...)`) accepts a worker only if the worker's
certificate chains to its CA and names the host the driver dialed
(subjectAltName). `tools/make_test_certs.py` makes a CA and such
certificates for tests and trials.

`TlsConfig.from_flags` checks the files when the flags are read: the three go
together, each must be readable PEM, and the key must match the certificate
(checked with Python's `ssl`), each error one line naming the flag.
"""

from __future__ import annotations

import ssl
from typing import Optional

import attrs
import grpc

__all__ = ["TlsConfig"]

_FLAGS = ("--tls_cert", "--tls_key", "--tls_ca")


def _read(flag: str, path: str) -> bytes:
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise ValueError(
      f"{flag}: cannot read {path} ({e.strerror or e})"
    ) from None
  if b"-----BEGIN " not in data:
    raise ValueError(f"{flag}: {path} is not a PEM file")
  return data


@attrs.frozen
class TlsConfig:
  """This side's certificate chain and key, and the CA it trusts (PEM)."""

  cert_path: str
  key_path: str
  ca_path: str
  cert: bytes = attrs.field(repr=False)
  key: bytes = attrs.field(repr=False)
  ca: bytes = attrs.field(repr=False)

  @classmethod
  def from_flags(
    cls, cert: Optional[str], key: Optional[str], ca: Optional[str]
  ) -> Optional["TlsConfig"]:
    """None when none of the three is given; raises `ValueError` (one line
    naming the flag) when only some are, or a file is unusable."""
    given = [bool(v) for v in (cert, key, ca)]
    if not any(given):
      return None
    if not all(given):
      missing = [f for f, g in zip(_FLAGS, given) if not g]
      raise ValueError(
        f"{missing[0]}: missing; {', '.join(_FLAGS)} go together (mutual TLS)"
      )
    config = cls(
      cert_path=cert,
      key_path=key,
      ca_path=ca,
      cert=_read("--tls_cert", cert),
      key=_read("--tls_key", key),
      ca=_read("--tls_ca", ca),
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
      context.load_cert_chain(cert, key)
    except ssl.SSLError as e:
      raise ValueError(
        f"--tls_key: {key} does not match --tls_cert {cert} or is not a"
        f" key ({e.reason or e})"
      ) from None
    try:
      context.load_verify_locations(cafile=ca)
    except ssl.SSLError as e:
      raise ValueError(
        f"--tls_ca: {ca} holds no usable certificate ({e.reason or e})"
      ) from None
    return config

  def server_credentials(self) -> grpc.ServerCredentials:
    """Serves this certificate; requires a client certificate signed by
    the CA."""
    return grpc.ssl_server_credentials(
      [(self.key, self.cert)],
      root_certificates=self.ca,
      require_client_auth=True,
    )

  def channel_credentials(self) -> grpc.ChannelCredentials:
    """Presents this certificate; trusts servers signed by the CA."""
    return grpc.ssl_channel_credentials(
      root_certificates=self.ca,
      private_key=self.key,
      certificate_chain=self.cert,
    )


def secure_or_insecure_channel(
  address: str, options, tls: Optional[TlsConfig]
) -> grpc.Channel:
  """A channel to `address`: mutual TLS with `tls`, plaintext without."""
  if tls is None:
    return grpc.insecure_channel(address, options=options)
  return grpc.secure_channel(
    address, tls.channel_credentials(), options=options
  )
