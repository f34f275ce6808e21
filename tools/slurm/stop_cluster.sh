#!/usr/bin/env bash
# Stop the test SLURM started by start_cluster.sh (cancels its jobs first).
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
scancel --user=root >/dev/null 2>&1 || true
for daemon in slurmd slurmctld munged; do
    pkill -x "$daemon" 2>/dev/null || true
done
for _ in $(seq 1 20); do
    pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || exit 0
    sleep 0.5
done
