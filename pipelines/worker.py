r"""Serve a TFF worker on this host for `--executor=remote --workers=...`.

    python -m pipelines.worker --port=8101                 # loopback only
    python -m pipelines.worker --listen_address=0.0.0.0 --port=8101 \
        --tls_cert=worker.pem --tls_key=worker.key --tls_ca=ca.pem
    python -m pipelines.worker --probe=host:8101 [--tls_...]  # readiness

Starts TFF's `worker_binary` in a network namespace of its own, where no
other host or process can reach it (the binary itself always binds every
interface), and serves it through our gRPC front (`tff_hetero.runtime.front`)
on `--listen_address:--port`, which defaults to loopback. Then prints

    TFF worker ready on 127.0.0.1:8101 (plaintext; worker pid 12345)

and keeps serving until SIGINT (Ctrl-C), SIGTERM or SIGHUP, on which it stops
the worker and exits 0. (Like any Python program it keeps SIGINT ignored if it
was started with SIGINT ignored, e.g. as `cmd &` from a non-interactive shell;
stop such a launcher with SIGTERM.) The worker dies with this process even if
it is SIGKILLed. One line on stderr per computation result a driver fetches,
with its duration.

Security (README "Security"): a worker runs whatever TensorFlow graph an
accepted driver sends, as this user; TensorFlow is not a sandbox. A
non-loopback `--listen_address` needs mutual TLS (`--tls_cert`, `--tls_key`,
`--tls_ca`: drivers must present a certificate signed by that CA) unless
`--insecure` is given. On loopback without TLS, any user of this host can
reach the front. Isolating the binary needs root, or CAP_SYS_ADMIN and
CAP_NET_ADMIN; without them the worker does not start unless
`--allow_unisolated_worker` is given (refused with TLS on a non-loopback
address), and then its binary also listens on every interface (said on
stderr and in the ready line).

Exit status 2 with a one-line error for bad flags, a busy port or a worker
that cannot start; 1 if the worker dies on its own while serving, or if
`--probe` finds no ready worker.
"""

from __future__ import annotations

import os
import sys
import time

from absl import flags

# Not `pipelines._cli`: it imports TensorFlow (seconds of start-up, C++ log
# lines on stderr), which a launcher of `worker_binary` does not need. gRPC's
# C core is silenced as there: a refused handshake is logged in one line by
# the front, not in several by gRPC.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

_PORT = flags.DEFINE_integer("port", None, "TCP port to serve on (1-65535).")
_LISTEN_ADDRESS = flags.DEFINE_string(
  "listen_address",
  "127.0.0.1",
  "Interface address to serve on. Anything but loopback needs --tls_cert,"
  " --tls_key and --tls_ca, or --insecure.",
)
_TLS_CERT = flags.DEFINE_string(
  "tls_cert", "", "PEM certificate (chain) this worker presents."
)
_TLS_KEY = flags.DEFINE_string("tls_key", "", "PEM private key of --tls_cert.")
_TLS_CA = flags.DEFINE_string(
  "tls_ca",
  "",
  "PEM CA certificate(s): drivers must present a certificate signed by it.",
)
_INSECURE = flags.DEFINE_bool(
  "insecure",
  False,
  "Allow plaintext on a non-loopback --listen_address.",
)
_ALLOW_UNISOLATED = flags.DEFINE_bool(
  "allow_unisolated_worker",
  False,
  "When this host cannot put the worker binary in a network namespace of"
  " its own, run it anyway: it then also listens on every interface,"
  " plaintext. Refused with TLS on a non-loopback --listen_address (it"
  " would bypass the TLS).",
)
_PROBE = flags.DEFINE_string(
  "probe",
  "",
  "host:port of a worker to probe instead of serving: exit 0 and one line if"
  " it is ready, 1 and a one-line reason if not (--tls_* as for a driver).",
)
_PROBE_TIMEOUT = flags.DEFINE_float(
  "probe_timeout_s", 5.0, "Seconds --probe waits for an answer."
)
_MAX_MESSAGE_MB = flags.DEFINE_integer(
  "max_message_mb",
  2000,
  "Max gRPC message size in MB (1-2047; the worker binary default of 10000"
  " overflows). Drivers must use the same or a smaller limit.",
)
_MAX_CONCURRENT = flags.DEFINE_integer(
  "max_concurrent_computation_calls",
  -1,
  "Max parallel calls of one computation in the worker; <= 0: no limit.",
)
_READY_TIMEOUT = flags.DEFINE_float(
  "ready_timeout_s", 60.0, "Seconds to wait for the worker to answer."
)
_HEAP_PROFILE = flags.DEFINE_string(
  "heap_profile",
  "throughput",
  "Heap of the worker binary (tff_hetero/runtime/heap.py): throughput"
  " (glibc's dynamic mmap threshold, tensors from TensorFlow's BFC pools) or"
  " compact (glibc's threshold fixed at 128 KiB: freed tensors unmapped at"
  " once, a page fault for each of their pages at every step).",
)
_LOG_FILE = flags.DEFINE_string(
  "log_file", "", "File for the worker binary's own log (default: discarded)."
)


class _cli:  # pylint: disable=invalid-name
  """One-line errors and flag parsing like `pipelines._cli`, without TF."""

  @staticmethod
  def fail(message: str, status: int = 2) -> None:
    line = " ".join(str(message).split())
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(status)

  @staticmethod
  def parse_flags_or_fail(argv: list[str]) -> list[str]:
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      _cli.fail(str(e).splitlines()[0] if str(e) else repr(e))
    return []  # Unreachable.

  @staticmethod
  def run_main(main_fn) -> None:
    from absl import app  # pylint: disable=g-import-not-at-top

    app.run(main_fn, flags_parser=_cli.parse_flags_or_fail)


def _is_loopback(address: str) -> bool:
  import ipaddress  # pylint: disable=g-import-not-at-top

  if address == "localhost":
    return True
  try:
    return ipaddress.ip_address(address).is_loopback
  except ValueError:
    return False


def _tls_or_fail():
  from tff_hetero.runtime import tls  # pylint: disable=g-import-not-at-top

  try:
    return tls.TlsConfig.from_flags(
      _TLS_CERT.value, _TLS_KEY.value, _TLS_CA.value
    )
  except ValueError as e:
    _cli.fail(str(e))
  return None  # Unreachable.


def _probe(address: str) -> None:
  from tff_hetero.runtime import WorkerUnavailableError  # pylint: disable=g-import-not-at-top
  from tff_hetero.runtime import bounded_stub  # pylint: disable=g-import-not-at-top
  from tff_hetero.runtime import parse_address  # pylint: disable=g-import-not-at-top

  try:
    parse_address(address)
  except ValueError as e:
    _cli.fail(str(e).replace("--workers", "--probe"))
  if _PROBE_TIMEOUT.value <= 0:
    _cli.fail("--probe_timeout_s must be > 0")
  tls = _tls_or_fail()
  try:
    print(bounded_stub.probe(address, _PROBE_TIMEOUT.value, tls), flush=True)
  except WorkerUnavailableError as e:
    _cli.fail(str(e), 1)
  sys.exit(0)


def _ready_worker(runtime, **kwargs):
  """A started `WorkerProcess` that answers; stopped on any failure.
  `WorkerIsolationError` propagates, any other start error is one line."""
  worker = runtime.WorkerProcess(**kwargs)
  try:
    worker.start()
    return worker.wait_ready(_READY_TIMEOUT.value)
  except runtime.WorkerIsolationError:
    worker.stop()
    raise
  except runtime.WorkerStartError as e:
    worker.stop()
    _cli.fail(str(e))
  except BaseException:
    worker.stop()
    raise
  return worker  # Unreachable.


def _start_worker(runtime, allow_unisolated: bool):
  """(worker, isolated): the worker in a private network; with
  `allow_unisolated`, on every interface when this host cannot isolate
  it."""
  kwargs = dict(
    max_message_mb=_MAX_MESSAGE_MB.value,
    max_concurrent_computation_calls=_MAX_CONCURRENT.value,
    log_path=_LOG_FILE.value or None,
  )
  try:
    return _ready_worker(runtime, private_network=True, **kwargs), True
  except runtime.WorkerIsolationError as e:
    if not allow_unisolated:
      _cli.fail(
        f"{e}; --allow_unisolated_worker runs it on every interface anyway"
      )
    print(f"warning: {e}", file=sys.stderr, flush=True)
  worker = _ready_worker(runtime, **kwargs)
  print(
    f"warning: the TFF worker binary also listens on [::]:{worker.port}"
    " (every interface, plaintext, no authentication)",
    file=sys.stderr,
    flush=True,
  )
  return worker, False


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  if _PROBE.value:
    _probe(_PROBE.value)
  port = _PORT.value
  if port is None:
    _cli.fail("--port is required")
  if not 0 < port < 65536:
    _cli.fail(f"--port must be in 1..65535, got {port}")
  if not 1 <= _MAX_MESSAGE_MB.value <= 2047:
    _cli.fail(
      f"--max_message_mb must be in 1..2047, got {_MAX_MESSAGE_MB.value}"
    )
  if _READY_TIMEOUT.value <= 0:
    _cli.fail("--ready_timeout_s must be > 0")
  listen = _LISTEN_ADDRESS.value.strip().strip("[]")
  if not listen:
    _cli.fail("--listen_address must not be empty")
  tls = _tls_or_fail()
  if tls is not None and not _is_loopback(listen) and _ALLOW_UNISOLATED.value:
    _cli.fail(
      "--allow_unisolated_worker: refused with TLS on a non-loopback"
      f" --listen_address={listen} (the unisolated worker binary would take"
      " plaintext connections on every interface, bypassing the TLS)"
    )
  if tls is None and not _is_loopback(listen) and not _INSECURE.value:
    _cli.fail(
      f"--listen_address={listen} is not loopback: serving it needs mutual"
      " TLS (--tls_cert, --tls_key, --tls_ca), or --insecure to serve"
      " plaintext to the network anyway"
    )

  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.runtime import front as front_lib  # pylint: disable=g-import-not-at-top
  from tff_hetero.runtime import heap  # pylint: disable=g-import-not-at-top

  try:
    # The worker binary started below inherits this process's profile.
    heap.configure_process_heap(heap.get_profile(_HEAP_PROFILE.value))
  except ValueError as e:
    _cli.fail(f"--heap_profile: {e}")

  if not runtime.port_is_free(port):
    _cli.fail(f"port {port} is already in use; cannot start a TFF worker on it")
  worker = None
  front = None
  try:
    with runtime.handle_termination():
      worker, isolated = _start_worker(runtime, _ALLOW_UNISOLATED.value)
      front = front_lib.WorkerFront(
        worker.address,
        listen_address=listen,
        port=port,
        tls=tls,
        max_message_mb=_MAX_MESSAGE_MB.value,
      )
      try:
        front.start()
      except runtime.PortInUseError as e:
        _cli.fail(str(e))
      mode = "mutual TLS" if tls else "plaintext"
      if not isolated:
        mode += ", unisolated worker"
      if tls is None and not _is_loopback(listen):
        print(
          f"warning: --insecure: serving plaintext on {front.bind_address},"
          " without authentication: whoever reaches it can run code on this"
          " host",
          file=sys.stderr,
          flush=True,
        )
      print(
        f"TFF worker ready on {front.bind_address} ({mode}; worker pid"
        f" {worker.pid})",
        flush=True,
      )
      while worker.is_running():
        time.sleep(0.5)
      code = worker.returncode
      _cli.fail(f"TFF worker on port {port} exited on its own (code {code})", 1)
  except (KeyboardInterrupt, runtime.Terminated):
    sys.exit(0)
  finally:
    if front is not None:
      front.stop()
    if worker is not None:
      worker.stop()


if __name__ == "__main__":
  _cli.run_main(main)
