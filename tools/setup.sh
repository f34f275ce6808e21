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
    # pip byte-compiles the installed files on one core (over half of a 2-minute install); compileall -j 0
    # does it on all of them. Needed: with PYTHONDONTWRITEBYTECODE=1 (set on our machines) nothing would
    # ever write the .pyc files and every process would compile torch and transformers again (10 s -> 23 s).
    "$VENV/bin/python" -m pip install --quiet --no-compile -e ".[test]"
    # (a few files in third-party packages do not compile, e.g. templates; pip skips those too)
    "$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")" > /dev/null || true
    touch "$stamp"
fi
# The package's own modules at every call (they change; compileall skips the current ones): Snakemake and each
# job import them, and PYTHONDONTWRITEBYTECODE would have them compiled again in every process (docs/models.md).
"$VENV/bin/python" -m compileall -q -j 0 src > /dev/null || true
