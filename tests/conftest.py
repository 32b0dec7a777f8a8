"""Shared pytest fixtures.

`tff_context`: one TFF execution context for the whole session, on a worker
process our runtime starts and stops (never TFF's default context, whose
worker outlives the interpreter). Tests that execute TFF computations in
process request it.
"""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@pytest.fixture(scope="session")
def tff_context():
  from tff_hetero import runtime  # pylint: disable=g-import-not-at-top
  with runtime.local_execution(worker_timeout_s=120.0) as handle:
    yield handle
