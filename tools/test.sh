#!/usr/bin/env bash
# Run the test suite (installs first if needed). Extra arguments go to pytest.
# Tests run on VERBMIRAGE_TEST_WORKERS pytest-xdist workers (default: one per CPU, at most 4; 0 = serial,
# needed for pytest's -s or --pdb). tests/conftest.py keeps each file, and the shared demo run, on one worker.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
workers=${VERBMIRAGE_TEST_WORKERS:-$(python3 -c 'import os; print(min(4, len(os.sched_getaffinity(0))))')}
if [ "$workers" = 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup --no-loadscope-reorder "$@"
