#!/usr/bin/env bash
# Start a single-node SLURM (munge, slurmctld, slurmd; two fake GPUs) whose every file lives in FOLDER, on
# ports of its own: a SLURM the machine already runs is not touched. As root; install Debian's packages first.
#   tools/slurm/start_cluster.sh [FOLDER]     FOLDER defaults to .slurm-test/ in the project
# Then SLURM_CONF=FOLDER/slurm.conf PATH=FOLDER/bin:$PATH point sbatch, squeue and Snakemake at it (FOLDER/bin has
# an srun that keeps the configuration inside a job); tools/slurm/stop_cluster.sh FOLDER stops it.
# Details: tools/slurm/local_cluster.py --help.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
exec python3 "$(dirname "$0")/local_cluster.py" start "$@"
