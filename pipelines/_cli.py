"""Shared CLI plumbing: one-line errors with exit status 2, absl flag parsing."""

from __future__ import annotations

import atexit
from collections.abc import Callable
import os
import sys

from absl import flags

# TensorFlow must be imported before absl parses the flags: imported after, its
# Keras runs functional-model construction eagerly and `Flatten` fails on the
# unknown batch dimension (seen with TF 2.14 + absl). Its C++ start-up chatter
# is silenced first, so that errors stay one line.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# So is gRPC's C core (every failed TLS handshake logs several lines); the
# error it causes is reported once, in our one line.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# glibc keeps the arenas made before its limit is set
# (tff_hetero/runtime/heap.py): set it before TensorFlow's thread pools run.
from tff_hetero.runtime import heap  # noqa: E402

heap.configure_process_heap()
import warnings  # noqa: E402

import tensorflow  # noqa: E402, F401

# TFF warns that batch-norm statistics are not trained by federated rounds;
# the width-heterogeneous algorithms compute them on purpose before each
# evaluation (static batch norm), so the warning is noise in their output.
warnings.filterwarnings(
  "ignore", message="Batch Normalization contains non-trainable variables"
)

USAGE_EXIT = 2
_TFF_DEFAULT_CONTEXT = (
  "tensorflow_federated.python.core.impl.context_stack.set_default_context"
)


def _drop_tff_default_context() -> None:
  """At exit, replaces TFF's default execution context (made when TFF is
  imported; the pipelines never use it) while the interpreter is whole: left
  to module teardown, its `__del__` prints a traceback after our last line.
  """
  module = sys.modules.get(_TFF_DEFAULT_CONTEXT)
  if module is not None:
    module.set_no_default_context()


atexit.register(_drop_tff_default_context)


def fail(message: str, status: int = USAGE_EXIT) -> None:
  """Prints `error: message` as one line on stderr and exits."""
  line = " ".join(str(message).split())
  print(f"error: {line}", file=sys.stderr, flush=True)
  sys.exit(status)


def parse_flags_or_fail(argv: list[str]) -> list[str]:
  """absl flags parser for `app.run` that reports bad flags in one line.

  Log messages below ERROR (TensorFlow's deprecation notices among them) are
  hidden unless `--verbosity` is given: the progress bar and the final lines
  are the pipeline's output.
  """
  try:
    remaining = flags.FLAGS(argv)
  except flags.Error as e:
    fail(str(e).splitlines()[0] if str(e) else repr(e))
  if not flags.FLAGS["verbosity"].present:
    from absl import logging  # pylint: disable=g-import-not-at-top

    logging.set_verbosity(logging.ERROR)
  return remaining


def run_main(main: Callable[[list[str]], None]) -> None:
  """`absl.app.run(main)` with one-line flag errors."""
  from absl import app  # pylint: disable=g-import-not-at-top

  app.run(main, flags_parser=parse_flags_or_fail)


def run_in_process(main: Callable[[list[str]], None], argv: list[str]) -> None:
  """Parses `argv` afresh (every flag back to its default) and calls `main`.

  For tests and notebooks; exits through `SystemExit` like the CLI.
  """
  flags.FLAGS.unparse_flags()
  main(parse_flags_or_fail(list(argv)))


def _quiet_abandoned_coroutines() -> None:
  """A signal can land between TFF's creating a call's coroutine and its
  being awaited; collected at exit, the coroutine's "was never awaited"
  warning would print two lines after the one that says why the run
  stopped (seen in CI, `train_run_test.py`'s SIGINT test)."""
  warnings.filterwarnings(
    "ignore", message="coroutine .* was never awaited", category=RuntimeWarning
  )


def run_guarded(fn: Callable[[], object], *, resume_hint: str) -> object:
  """Runs `fn()` with SIGTERM handled; what stops it becomes one line.

  Invalid input exits 2, divergence 3, SIGINT 130 and SIGTERM 143, each
  with one line; `resume_hint` (e.g. "continue with --resume") says how to
  pick up an interrupted run.
  """
  # Imported here so that flag errors are reported before TF starts up.
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import DivergenceError  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top

  try:
    with runtime.handle_termination():
      return fn()
  except loop.USER_ERRORS as e:
    fail(str(e))
  except DivergenceError as e:
    fail(str(e), status=3)
  except KeyboardInterrupt:
    _quiet_abandoned_coroutines()
    fail(f"interrupted by SIGINT; {resume_hint}", status=130)
  except runtime.Terminated as e:
    _quiet_abandoned_coroutines()
    fail(f"{e}; {resume_hint}", status=e.code)
