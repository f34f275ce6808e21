#!/usr/bin/env bash
# Start a real single-node SLURM on this machine (as root, without systemd) for the tests:
# munge, slurmctld and slurmd from Debian's packages, one node "$(hostname -s)" with two
# fake GPUs declared as gres (character devices linked to /dev/null and /dev/zero: jobs get
# CUDA_VISIBLE_DEVICES but no GPU). Installs the packages when missing. Idempotent: a
# running cluster is restarted with this configuration.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
set -euo pipefail
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi
"$(dirname "$0")/stop_cluster.sh" >/dev/null 2>&1 || true

node=$(hostname -s)
cpus=$(nproc)
memory=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 2048 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/log/munge
ln -sf /dev/null /dev/fakegpu0
ln -sf /dev/zero /dev/fakegpu1

cat > /etc/slurm/slurm.conf <<CONF
ClusterName=verbmirage-test
SlurmctldHost=${node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
# finished jobs stay visible to squeue (no slurmdbd, so no sacct)
MinJobAge=600
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=${node} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${memory} Gres=gpu:fake:2 State=UNKNOWN
PartitionName=debug Nodes=${node} Default=YES MaxTime=INFINITE State=UP
CONF
cat > /etc/slurm/gres.conf <<CONF
NodeName=${node} Name=gpu Type=fake File=/dev/fakegpu0
NodeName=${node} Name=gpu Type=fake File=/dev/fakegpu1
CONF

if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
runuser -u munge -- /usr/sbin/munged
slurmctld -c
slurmd
for _ in $(seq 1 60); do
    if sinfo -h -o "%T" 2>/dev/null | grep -qE "^idle"; then
        echo "SLURM up: node ${node}, ${cpus} CPUs, ${memory} MB, 2 fake GPUs"
        exit 0
    fi
    sleep 1
done
echo "SLURM did not come up; see /var/log/slurm/" >&2
sinfo >&2 || true
exit 1
