#!/usr/bin/env bash
# Stop the SLURM that tools/slurm/start_cluster.sh started in FOLDER: cancels its jobs through its own controller,
# then stops its daemons by the pids of its pid files (a pid that is another process now is left alone).
#   tools/slurm/stop_cluster.sh [FOLDER]      FOLDER defaults to .slurm-test/ in the project
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
exec python3 "$(dirname "$0")/local_cluster.py" stop "$@"
