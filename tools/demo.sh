#!/usr/bin/env bash
# Run the whole demo pipeline on the embedded config (installs first if needed), then write its HTML report
# (REPORT, default report.html in the repository; not after a dry run) and say how to open it.
# Extra arguments go to snakemake, e.g. `tools/demo.sh --cores 4`.
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
# greedy: Snakemake's default ILP scheduler runs a solver at every scheduling round; with the demo's ~180 short
# jobs on 2 cores that took 30-50 s of the run (bench/README.md, "Demo and CI time").
.venv/bin/snakemake --cores "${CORES:-2}" --scheduler greedy "$@"
for argument in "$@"; do
    case "$argument" in  # a dry run made nothing
        --dry-run|--dryrun) exit 0 ;;
        --*) ;;
        -*n*) exit 0 ;;  # -n, also among other one-letter flags (-np)
    esac
done
# The report: every table and figure of the run with its caption, one self-contained HTML file, written the way
# `verbmirage report` writes it (src/verbmirage/workflow/report_file.py): nothing of the config runs as script.
.venv/bin/verbmirage report --no-run --output "$report" -- "$@" >/dev/null
echo "demo: open $report in a browser (e.g. xdg-open $report; from a remote machine, copy it first)"
