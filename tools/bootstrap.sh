#!/usr/bin/env bash
# Creates or updates the project's virtualenv (.venv) from uv.lock: Python 3.11, the
# pinned TFF stack and the test extra. Idempotent, quiet on success, fast when up to date.
#
#   tools/bootstrap.sh            # from anywhere; the venv is <repo>/.venv
#
# The project itself is installed editable with its own copies of the files (not links
# into uv's cache; below). Needs python3 (3.11) on PATH; installs uv with pip if it is missing. Never downloads a
# Python (UV_PYTHON_DOWNLOADS=never). Env: PYTHON=/path/to/python3.11 to choose the
# interpreter.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

die() {
  echo "tools/bootstrap.sh: error: $*" >&2
  exit 1
}

export UV_PYTHON_DOWNLOADS=never
# Trust the system's CA store (/etc/ssl/certs), where a registry proxy's CA is installed,
# even when SSL_CERT_FILE is not exported (e.g. a CI runner's clean environment).
export UV_NATIVE_TLS="${UV_NATIVE_TLS:-true}"
# The venv is always <repo>/.venv: ignore a venv the caller may have activated.
unset UV_PROJECT_ENVIRONMENT VIRTUAL_ENV

# --- the interpreter: Python 3.11 ------------------------------------------------------
PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
  for cand in python3 python3.11; do
    if command -v "$cand" >/dev/null 2>&1 &&
      "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      # The real executable, not a wrapper such as a pyenv shim (slow to start).
      PYTHON="$("$cand" -c 'import sys; print(sys.executable)')"
      break
    fi
  done
fi
[[ -n "$PYTHON" ]] || die "no Python 3.11 found on PATH (python3 or python3.11); set PYTHON=/path/to/python3.11"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
  die "$PYTHON is not Python 3.11"

# --- uv ----------------------------------------------------------------------------------
UV=()
find_uv() {
  if command -v uv >/dev/null 2>&1 && uv --version >/dev/null 2>&1; then
    UV=(uv)
  elif [[ -x "$HOME/.local/bin/uv" ]] && "$HOME/.local/bin/uv" --version >/dev/null 2>&1; then
    UV=("$HOME/.local/bin/uv")
  elif "$PYTHON" -m uv --version >/dev/null 2>&1; then
    UV=("$PYTHON" -m uv)
  else
    return 1
  fi
}

if ! find_uv; then
  log="$(mktemp)"
  trap 'rm -f "$log"' EXIT
  echo "tools/bootstrap.sh: uv not found, installing it with pip" >&2
  # A Debian-managed python3 refuses --user installs (PEP 668) unless told otherwise;
  # uv is a standalone binary, so that is harmless.
  if ! "$PYTHON" -m pip install --user --quiet uv >"$log" 2>&1 &&
    ! "$PYTHON" -m pip install --user --quiet --break-system-packages uv >>"$log" 2>&1 &&
    ! { command -v pip >/dev/null 2>&1 && pip install --quiet uv >>"$log" 2>&1; }; then
    cat "$log" >&2
    die "could not install uv with pip (install it: https://docs.astral.sh/uv/)"
  fi
  find_uv || die "uv was installed but cannot be run (not on PATH, nor '$PYTHON -m uv')"
fi

# --- the venv ----------------------------------------------------------------------------
# `uv sync --frozen` installs exactly uv.lock (it fails if pyproject.toml and uv.lock
# disagree instead of re-locking) and is a no-op check when .venv is up to date.
# `--compile-bytecode` writes every installed module's .pyc once: where
# PYTHONDONTWRITEBYTECODE=1 is set (it is on this project's machines) Python never writes
# them itself, and every process then recompiles TensorFlow's and TFF's sources on import
# (measured: `import tensorflow_federated` 21.6 s without the .pyc files, 6.9 s with them;
# compiling them takes ~25 s once).
sync=(sync --frozen --extra test --compile-bytecode --python "$PYTHON" --quiet)
out="$("${UV[@]}" "${sync[@]}" 2>&1)" || {
  status=$?
  echo "$out" >&2
  die "'${UV[*]} ${sync[*]}' failed (exit $status) in $REPO_ROOT"
}

[[ -x .venv/bin/python ]] || die "uv sync succeeded but $REPO_ROOT/.venv/bin/python is missing"

# The project is installed editable, and uv hard-links installed files from its cache:
# a second clone bootstrapped on the same machine can rewrite the first venv's editable
# finder (same inode), so that its tff_hetero is the other clone's (seen 2026-11-28).
# Re-install the project alone with copied files when the venv points elsewhere or its
# editable files are still shared with the cache; a clone bootstrapped before this check
# existed is repaired by its own next bootstrap.
installed_root() {
  # -I: neither PYTHONPATH nor the current directory may stand in for the install.
  "$REPO_ROOT/.venv/bin/python" -I -c \
    'import os, tff_hetero; print(os.path.dirname(os.path.dirname(os.path.realpath(tff_hetero.__file__))))' \
    2>/dev/null || true
}
shares_editable_files() {
  [[ -n "$(find .venv/lib/python3*/site-packages -maxdepth 1 -name '__editable__*tff_hetero*' -links +1 -print -quit)" ]]
}
if [[ "$(installed_root)" != "$(realpath "$REPO_ROOT")" ]] || shares_editable_files; then
  out="$(UV_LINK_MODE=copy "${UV[@]}" "${sync[@]}" --reinstall-package tff-hetero 2>&1)" || {
    echo "$out" >&2
    die "re-installing tff-hetero into $REPO_ROOT/.venv failed"
  }
  [[ "$(installed_root)" == "$(realpath "$REPO_ROOT")" ]] ||
    die "$REPO_ROOT/.venv imports tff_hetero from '$(installed_root)', not from $REPO_ROOT"
  ! shares_editable_files ||
    die "$REPO_ROOT/.venv's editable install still shares its files with uv's cache"
fi
