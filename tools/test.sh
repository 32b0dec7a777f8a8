#!/usr/bin/env bash
# The project's test command: bootstraps .venv (tools/bootstrap.sh), then runs pytest on
# tests/ (files *_test.py) from the repo root. Arguments go to pytest:
#
#   tools/test.sh                         # everything under tests/
#   tools/test.sh -k partition -x         # options apply to tests/
#   tools/test.sh tests/data              # a path given: only that path
#   tools/test.sh -n 0                    # in this process only (no xdist workers)
#   tools/test.sh --fast                  # unit tier for local work: no end-to-end
#                                         # pipeline runs (tests/pipelines, tests/examples),
#                                         # no import-isolation sweep, no @pytest.mark.slow
#
# Test files are spread over one pytest-xdist process per logical CPU
# (`-n logical --dist loadfile`: a file's tests, and its module fixtures, stay in one
# process) unless the arguments choose `-n`/`--numprocesses` themselves. pytest-xdist
# hands out the files with the most tests first; handing out the longest first instead
# (`--no-loadscope-reorder` and a measured order) was no faster (README, Tests). Most
# tests wait on TFF workers or on subprocesses part of the time, so two processes on two
# cores take about half the time.
#
# Exit code: pytest's (0 all passed, 1 failures, 5 no tests collected, ...).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO_ROOT/tools/bootstrap.sh"
cd "$REPO_ROOT"

# This project's machines set PYTHONDONTWRITEBYTECODE=1, so every Python process the
# suite starts (dozens of `python -m pipelines.*` runs and TFF worker hosts) would compile
# all of tff_hetero/ and pipelines/ from source again. The suite writes them once, into
# the repo's (git-ignored) __pycache__ directories.
unset PYTHONDONTWRITEBYTECODE

fast=()
args=()
for arg in "$@"; do
  if [[ "$arg" == "--fast" ]]; then
    fast=(--ignore=tests/pipelines --ignore=tests/examples
          --ignore=tests/imports_test.py -m "not slow")
  else
    args+=("$arg")
  fi
done
set -- ${args[@]+"${args[@]}"}

# Run tests/ unless the arguments already name a test path (file, dir or node id).
targets=(tests)
for arg in "$@"; do
  if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then
    targets=()
    break
  fi
done

parallel=(-n logical --dist loadfile)
for arg in "$@"; do
  if [[ "$arg" == -n* || "$arg" == --numprocesses* ]]; then
    parallel=()
    break
  fi
done

exec .venv/bin/python -m pytest ${parallel[@]+"${parallel[@]}"} ${fast[@]+"${fast[@]}"} \
  ${targets[@]+"${targets[@]}"} "$@"
