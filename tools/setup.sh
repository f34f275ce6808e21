#!/usr/bin/env bash
# Create .venv (Python 3.11+) with the pinned dependencies and the package.
# Idempotent: a stamp file skips the install when pyproject.toml is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.verbmirage-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # torch is pinned to 2.13.0 in pyproject.toml: a CPU wheel where one is available locally.
    # --no-compile: byte-compiling every installed file (torch alone has thousands) took over half of the
    # install; Python compiles what it imports on first use instead.
    "$VENV/bin/python" -m pip install --quiet --no-compile -e ".[test]"
    touch "$stamp"
fi
