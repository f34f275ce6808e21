#!/usr/bin/env bash
# Run the test suite (installs first if needed). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
exec .venv/bin/python -m pytest "$@"
