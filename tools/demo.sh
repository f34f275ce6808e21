#!/usr/bin/env bash
# Run the whole demo pipeline on the embedded config (installs first if needed).
# Extra arguments go to snakemake, e.g. `tools/demo.sh --cores 4`.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
exec .venv/bin/snakemake --cores "${CORES:-2}" "$@"
