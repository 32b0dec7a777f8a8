r"""Serve a TFF worker on this host for `--executor=remote --workers=...`.

    python -m pipelines.worker --port=8000

Starts TFF's `worker_binary` on `[::]:PORT`, waits until it answers, prints

    TFF worker ready on [::]:8000 (pid 12345)

and keeps serving until SIGINT (Ctrl-C), SIGTERM or SIGHUP, on which it stops
the worker and exits 0. (Like any Python program it keeps SIGINT ignored if it
was started with SIGINT ignored, e.g. as `cmd &` from a non-interactive shell;
stop such a launcher with SIGTERM.) The worker dies with this process even if it is
SIGKILLed. Exit status 2 with a one-line error if the port is busy or the
worker cannot start; 1 if the worker dies on its own while serving.

Security: the worker accepts unauthenticated, unencrypted gRPC from anyone who
can reach the port and runs whatever TensorFlow graphs it is sent, as this
user. Expose it only on a trusted network.
"""

from __future__ import annotations

import sys
import time

from absl import flags

# Not `pipelines._cli`: it imports TensorFlow (seconds of start-up, C++ log
# lines on stderr), which a launcher of `worker_binary` does not need.

_PORT = flags.DEFINE_integer("port", None, "TCP port to serve on (1-65535).")
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


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
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

  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top

  worker = runtime.WorkerProcess(
    port,
    max_message_mb=_MAX_MESSAGE_MB.value,
    max_concurrent_computation_calls=_MAX_CONCURRENT.value,
    log_path=_LOG_FILE.value or None,
  )
  try:
    with runtime.handle_termination():
      try:
        worker.start()
        worker.wait_ready(_READY_TIMEOUT.value)
      except runtime.WorkerStartError as e:
        _cli.fail(str(e))
      print(f"TFF worker ready on [::]:{port} (pid {worker.pid})", flush=True)
      while worker.is_running():
        time.sleep(0.5)
      code = worker.returncode
      _cli.fail(f"TFF worker on port {port} exited on its own (code {code})", 1)
  except (KeyboardInterrupt, runtime.Terminated):
    worker.stop()
    sys.exit(0)
  finally:
    worker.stop()


if __name__ == "__main__":
  _cli.run_main(main)
