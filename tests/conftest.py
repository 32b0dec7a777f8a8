"""Shared pytest fixtures.

`tff_context`: one TFF execution context for the whole session, on a worker
process our runtime starts and stops (never TFF's default context, whose
worker outlives the interpreter). Tests that execute TFF computations in
process request it.

SIGINT: a test run started in the background (`cmd &` from a script, as CI
supervisors may) inherits SIGINT ignored, and so would every process a test
starts, making the tests that interrupt a pipeline or a worker fail. The
session restores Python's handler so that the children start with the
default, as from a terminal.
"""

import os
import signal

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tff_context():
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  with runtime.local_execution(worker_timeout_s=120.0) as handle:
    yield handle
