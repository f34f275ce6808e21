#!/usr/bin/env bash
# Run the whole demo pipeline on the embedded config (installs first if needed), write its HTML report (REPORT,
# default report.html in the repository; not after a dry run), then print the run's summary: where the tables
# and figures are, every model's headline numbers beside the paper's, and the report to open (the last lines).
# Extra arguments go to snakemake, e.g. `tools/demo.sh --cores 4`, `tools/demo.sh -n`.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
for argument in "$@"; do
    case "$argument" in  # Snakemake's own report would skip what makes ours safe to open
        --report|--report=*) echo "tools/demo.sh: name the report with REPORT=path, not --report" >&2; exit 2 ;;
    esac
done
report=${REPORT:+$(realpath -m "$REPORT")}  # before the cd: a relative REPORT is a path from where you are
cd "$(dirname "$0")/.."
report=${report:-$PWD/report.html}
tools/setup.sh
# `verbmirage report` runs the workflow (the greedy scheduler: Snakemake's default ILP scheduler ran a solver at
# every scheduling round, 30-50 s of the demo on 2 cores; bench/README.md, "Demo and CI time"), then writes the
# report the way that keeps anything a config says from running as script in it
# (src/verbmirage/workflow/report_file.py; what Snakemake says meanwhile goes to logs/report.log), then prints the
# run's summary.
exec .venv/bin/verbmirage report --output "$report" --cores "${CORES:-2}" -- "$@"
