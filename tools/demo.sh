#!/usr/bin/env bash
# Run the whole demo pipeline on the embedded config (installs first if needed).
# Extra arguments go to snakemake, e.g. `tools/demo.sh --cores 4`.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
# greedy: Snakemake's default ILP scheduler runs a solver at every scheduling round; with the demo's ~180 short
# jobs on 2 cores that took 30-50 s of the run (docs/models.md, "Demo and CI time").
exec .venv/bin/snakemake --cores "${CORES:-2}" --scheduler greedy "$@"
