#!/usr/bin/env python3
"""A single-node SLURM that lives in a folder of its own: the cluster test tier's, or yours.

The cluster tier (tests/cluster/test_slurm.py) runs the demo through it.

``start FOLDER`` writes everything into FOLDER and nowhere else: ``slurm.conf``, ``gres.conf``, an empty
``plugstack.conf``, the controller's state, slurmd's spool, the daemons' logs and pid files, and a munge of its
own (key, socket, seed, log, pid file). It then starts munged, slurmctld and slurmd (Debian's ``slurmctld
slurmd slurm-client munge`` packages; as root, without systemd) pointed at that folder: one node, this machine,
with two fake GPUs declared as gres (``/dev/null`` and ``/dev/zero``: a job gets ``CUDA_VISIBLE_DEVICES`` but
no GPU). The daemons listen on free ports and SLURM talks to this munge only, so a SLURM the machine already
runs is neither read, addressed nor changed. Clients reach the cluster with ``SLURM_CONF=FOLDER/slurm.conf``
(sbatch, squeue, scancel, and Snakemake's SLURM executor through them) and ``FOLDER/bin`` first on ``PATH``: its
``srun`` names the configuration again inside a job, where Snakemake's SLURM job step drops every ``SLURM_*``
variable from the environment of the srun it runs (:func:`environment`).

``stop FOLDER`` cancels the jobs of this cluster (through its own controller), then stops each daemon by the
pid its pid file names, and only when that process's command line names FOLDER: a pid reused by another
process is left alone.

Start on a folder whose cluster still runs stops that cluster first. Nothing is installed here: install the
packages first (``apt-get install -y slurmctld slurmd slurm-client munge``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the folder of ``start`` and ``stop`` when none is named (ignored by git)
DEFAULT_FOLDER = REPO / ".slurm-test"
PACKAGES = "slurmctld slurmd slurm-client munge"
#: the programs this needs, from those packages
PROGRAMS = ("munged", "slurmctld", "slurmd", "sinfo", "squeue", "scancel", "srun")
#: memory the node keeps for everything that is not a job
RESERVED_MB = 2048
#: a Unix socket's path must fit in ``sun_path`` (108 bytes with its terminating zero)
MAX_SOCKET_PATH = 107


class ClusterError(RuntimeError):
    """The cluster could not be started or stopped; the message says why and where its logs are."""


@dataclass(frozen=True)
class Files:
    """Where the cluster of ``folder`` keeps each file; nothing it writes is outside ``folder``."""

    folder: Path

    def __getattr__(self, name: str) -> Path:
        try:
            return self.folder / LAYOUT[name]
        except KeyError:
            raise AttributeError(name) from None


#: every file and folder of a cluster, relative to its folder (:class:`Files`)
LAYOUT = {
    "conf": "slurm.conf",
    "gres": "gres.conf",
    "plugstack": "plugstack.conf",
    "srun": "bin/srun",
    "state": "slurmctld-state",
    "spool": "slurmd-spool",
    "slurmctld_log": "slurmctld.log",
    "slurmd_log": "slurmd.log",
    "slurmctld_pid": "slurmctld.pid",
    "slurmd_pid": "slurmd.pid",
    "munge_key": "munge/munge.key",
    "munge_socket": "munge/munge.socket",
    "munge_seed": "munge/munged.seed",
    "munge_log": "munge/munged.log",
    "munge_pid": "munge/munged.pid",
}
#: the daemons, in the order ``stop`` stops them (the reverse of ``start``), each with its pid file's key
DAEMONS = (("slurmd", "slurmd_pid"), ("slurmctld", "slurmctld_pid"), ("munged", "munge_pid"))


def environment(folder: Path) -> dict[str, str]:
    """The environment variables that point SLURM's commands at the cluster of ``folder``: ``SLURM_CONF``, and
    ``PATH`` with the folder's ``bin/`` first (its ``srun``: see :func:`write_config`)."""
    files = Files(folder.resolve())
    return {"SLURM_CONF": str(files.conf), "PATH": os.pathsep.join([str(files.srun.parent), os.environ["PATH"]])}


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that nothing listens on now (the kernel's choice)."""
    sockets = []
    try:
        for _ in range(count):
            sockets.append(socket.socket())
            sockets[-1].bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def write_config(folder: Path, node: str, cpus: int, memory_mb: int, ports: tuple[int, int],
                 srun: str = "/usr/bin/srun") -> Files:
    """Write the cluster's configuration, munge key and ``srun`` into ``folder`` (made if missing); every path in
    them is inside ``folder``. ``ports``: the controller's and slurmd's; ``srun``: SLURM's own."""
    files = Files(folder.resolve())
    for directory in (files.folder, files.state, files.spool, files.munge_key.parent, files.srun.parent):
        directory.mkdir(parents=True, exist_ok=True)
    # munged wants the socket's folder open to all (its clients run as any user); its key readable by it alone
    files.munge_key.parent.chmod(0o755)
    if not files.munge_key.exists():
        files.munge_key.write_bytes(os.urandom(1024))
    files.munge_key.chmod(0o400)
    controller_port, node_port = ports
    files.conf.write_text(f"""\
# A single-node test cluster (tools/slurm/local_cluster.py); every path below is inside {files.folder}.
ClusterName=verbmirage-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={controller_port}
SlurmdPort={node_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={files.munge_socket}
CredType=cred/munge
PlugStackConfig={files.plugstack}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
# finished jobs stay visible to squeue (no slurmdbd, so no sacct)
MinJobAge=600
ReturnToService=2
StateSaveLocation={files.state}
SlurmdSpoolDir={files.spool}
SlurmctldPidFile={files.slurmctld_pid}
SlurmdPidFile={files.slurmd_pid}
SlurmctldLogFile={files.slurmctld_log}
SlurmdLogFile={files.slurmd_log}
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} Gres=gpu:fake:2 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
""")
    # two fake GPUs: gres wants character devices; a job gets CUDA_VISIBLE_DEVICES and no GPU
    files.gres.write_text(f"NodeName={node} Name=gpu Type=fake File=/dev/null\n"
                          f"NodeName={node} Name=gpu Type=fake File=/dev/zero\n")
    files.plugstack.write_text("")  # no SPANK plugins: the machine's plugstack.conf is not read
    # Snakemake's job step (snakemake-executor-plugin-slurm-jobstep) runs each job through srun with every
    # SLURM_* variable dropped; SLURM_CONF too, so that srun would look for the configuration at SLURM's default
    # path (the machine's own SLURM, or none). This srun, first on the job's PATH, names it again.
    files.srun.write_text(f'#!/bin/sh\nSLURM_CONF="{files.conf}" exec "{srun}" "$@"\n')
    files.srun.chmod(0o755)
    return files


def daemon_commands(files: Files, node: str) -> list[list[str]]:
    """How ``start`` runs munged, slurmctld and slurmd (in that order), each naming the cluster's folder."""
    return [
        # --force: munged also refuses a socket below a folder that not everyone may enter (a home folder,
        # pytest's temporary folders); this socket serves only this cluster's root daemons and jobs
        ["munged", "--force", f"--socket={files.munge_socket}", f"--key-file={files.munge_key}",
         f"--pid-file={files.munge_pid}", f"--log-file={files.munge_log}", f"--seed-file={files.munge_seed}"],
        # -c: start without the saved state of an earlier run of this cluster (the folder's own state)
        ["slurmctld", "-c", "-f", str(files.conf)],
        ["slurmd", "-f", str(files.conf), "-N", node],
    ]


def _command_line(pid: int) -> list[str] | None:
    """The arguments of running process ``pid``; None when there is none (or only its zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if state in ("Z", "X"):
        return None
    return arguments.rstrip(b"\0").decode(errors="replace").split("\0")


def _pid_in(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def our_pid(pid_file: Path, folder: Path) -> int | None:
    """The pid that ``pid_file`` names when that process runs and its command line names ``folder`` (a daemon
    started for that folder); None otherwise: no pid file, no such process, or another process that now has
    that pid."""
    pid = _pid_in(pid_file)
    arguments = _command_line(pid) if pid is not None else None
    inside = f"{folder.resolve()}{os.sep}"
    if arguments is None or not any(inside in argument for argument in arguments):
        return None
    return pid


def _stop_daemon(name: str, pid_file: Path, folder: Path, timeout: float) -> None:
    """SIGTERM the daemon that ``pid_file`` names if it is this folder's (SIGKILL after ``timeout`` s)."""
    pid = _pid_in(pid_file)
    if pid is None or _command_line(pid) is None:
        return  # not running
    if our_pid(pid_file, folder) is None:
        print(f"{name}: {pid_file} names pid {pid}, which is another process now (its command line does not "
              f"name {folder}): left alone", file=sys.stderr)
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _command_line(pid) is not None:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.1)


def _slurm(files: Files, *command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(command, env={**os.environ, "SLURM_CONF": str(files.conf)}, capture_output=True,
                          text=True, timeout=timeout)


def cancel_jobs(files: Files, timeout: float = 60) -> None:
    """Cancel every job of the cluster through its own controller, and wait until none is left running."""
    active = "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING"
    deadline = time.monotonic() + timeout
    while True:
        listed = _slurm(files, "squeue", "--noheader", "--format=%i", f"--states={active}")
        jobs = listed.stdout.split()
        if listed.returncode != 0 or not jobs:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"jobs {jobs} still running after scancel (SLURM_CONF={files.conf})")
        _slurm(files, "scancel", *jobs)
        time.sleep(0.5)


def stop(folder: Path, timeout: float = 30) -> None:
    """Cancel the jobs of the cluster of ``folder`` and stop its daemons (only those it started: by pid)."""
    files = Files(folder.resolve())
    if our_pid(files.slurmctld_pid, files.folder) is not None:
        cancel_jobs(files)
    for name, key in DAEMONS:
        _stop_daemon(name, getattr(files, key), files.folder, timeout)


def _log_tails(files: Files, lines: int = 15) -> str:
    tails = []
    for log in (files.munge_log, files.slurmctld_log, files.slurmd_log):
        if log.exists():
            tails.append(f"--- {log} (last {lines} lines)\n" + "\n".join(log.read_text().splitlines()[-lines:]))
    return "\n".join(tails)


def start(folder: Path, timeout: float = 60) -> Files:
    """Start the cluster of ``folder`` (stopping one that still runs there); return its files once its node is
    idle. Raises :class:`ClusterError` (with the daemons' log tails) and stops what it started when it fails."""
    missing = [program for program in PROGRAMS if shutil.which(program) is None]
    if missing:
        raise ClusterError(f"{', '.join(missing)} not found: install Debian's packages first "
                           f"(apt-get install -y {PACKAGES})")
    if os.geteuid() != 0:
        raise ClusterError("the test SLURM runs its daemons and jobs as root: run as root")
    files = Files(folder.resolve())
    if len(os.fsencode(files.munge_socket)) > MAX_SOCKET_PATH:
        raise ClusterError(f"{files.munge_socket}: longer than a Unix socket's {MAX_SOCKET_PATH} bytes; "
                           "use a folder with a shorter path")
    stop(files.folder)
    node = socket.gethostname().split(".")[0]
    cpus = len(os.sched_getaffinity(0))
    memory_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20 - RESERVED_MB
    # SLURM's srun, not this folder's (write_config)
    others = [entry for entry in os.environ["PATH"].split(os.pathsep)
              if entry and Path(entry).resolve() != files.srun.parent]
    srun = shutil.which("srun", path=os.pathsep.join(others))
    write_config(files.folder, node, cpus, memory_mb, tuple(free_ports(2)), srun)
    try:
        for command in daemon_commands(files, node):
            started = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            if started.returncode != 0:
                raise ClusterError(f"{' '.join(command)} failed: {started.stdout}{started.stderr}")
        deadline = time.monotonic() + timeout
        while not _slurm(files, "sinfo", "--noheader", "--format=%T").stdout.startswith("idle"):
            if time.monotonic() > deadline:
                shown = _slurm(files, "sinfo")
                raise ClusterError(f"the node is not idle after {timeout:.0f} s: {shown.stdout}{shown.stderr}")
            time.sleep(0.5)
    except BaseException as error:
        stop(files.folder)
        if isinstance(error, ClusterError):
            raise ClusterError(f"{error}\n{_log_tails(files)}") from None
        raise
    print(f"SLURM up in {files.folder}: node {node}, {cpus} CPUs, {memory_mb} MB, 2 fake GPUs. Use it with "
          f"SLURM_CONF={files.conf} PATH={files.srun.parent}:$PATH; stop it with tools/slurm/stop_cluster.sh "
          f"{files.folder}")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT_FOLDER,
                        help=f"the cluster's folder (default: {DEFAULT_FOLDER.relative_to(REPO)}/ in the project)")
    arguments = parser.parse_args(argv)
    try:
        (start if arguments.action == "start" else stop)(arguments.folder)
    except ClusterError as error:
        print(f"{arguments.action}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
