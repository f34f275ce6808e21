#!/usr/bin/env bash
# Create .venv (Python 3.11+) with the pinned dependencies and the package.
# Idempotent: a stamp file skips the install when pyproject.toml is unchanged.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
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
    # --no-compile: pip byte-compiles every installed file on one core. Instead, tools/warm_bytecode.py imports
    # what the pipeline and its tests use with bytecode writing on (two processes at once): needed because with
    # PYTHONDONTWRITEBYTECODE=1 (set on our machines) nothing would ever write the .pyc files and every process
    # would compile torch and transformers again (10 s -> 23 s); about 3,500 files instead of all 16,000.
    "$VENV/bin/python" -m pip install --quiet --no-compile -e ".[test]"
    env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" tools/warm_bytecode.py torch &
    env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" tools/warm_bytecode.py rest
    wait $!
    touch "$stamp"
fi
# The package's own modules at every call (they change; compileall skips the current ones): Snakemake and each
# job import them, and PYTHONDONTWRITEBYTECODE would have them compiled again in every process (docs/models.md).
"$VENV/bin/python" -m compileall -q -j 0 src > /dev/null || true
