"""The test SLURM's own folder and its stop by pid (tools/slurm/local_cluster.py), without SLURM: what the
cluster tier (tests/cluster/test_slurm.py) relies on to leave a SLURM the machine runs itself alone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "slurm"))

import local_cluster  # noqa: E402  (tools/ is not a package)

#: paths outside the folder that the configuration may name: the fake GPUs and the mail program
OUTSIDE_ALLOWED = {"/dev/null", "/dev/zero", "/bin/true"}


def _paths_in(text: str) -> list[str]:
    """Every absolute path in a SLURM configuration (``Key=/path``, also inside ``AuthInfo=socket=/path``)."""
    return re.findall(r"=(/[^\s,]+)", text)


def test_the_configuration_names_no_path_outside_its_folder_and_no_default_port(tmp_path):
    folder = tmp_path / "cluster"
    files = local_cluster.write_config(folder, "node1", 2, 1000, (23456, 23457))
    written = {path.relative_to(folder) for path in folder.rglob("*")}
    assert {Path("slurm.conf"), Path("gres.conf"), Path("plugstack.conf"), Path("munge/munge.key")} <= written
    conf = files.conf.read_text()
    for text in (conf, files.gres.read_text()):
        for path in _paths_in(text):
            assert path in OUTSIDE_ALLOWED or Path(path).is_relative_to(folder), path
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile",
                "SlurmdLogFile", "PlugStackConfig"):
        assert re.search(rf"^{key}={re.escape(str(folder))}/", conf, re.MULTILINE), key
    # SLURM talks to this cluster's munge, and listens on the ports given, not SLURM's defaults (6817, 6818)
    assert f"AuthInfo=socket={files.munge_socket}\n" in conf
    assert "SlurmctldPort=23456\n" in conf and "SlurmdPort=23457\n" in conf
    assert files.munge_key.stat().st_mode & 0o777 == 0o400 and files.munge_key.stat().st_size == 1024
    for name in local_cluster.LAYOUT:
        assert getattr(files, name).is_relative_to(folder), name


def test_each_daemon_is_started_on_the_folder_and_its_command_line_names_it(tmp_path):
    files = local_cluster.write_config(tmp_path, "node1", 2, 1000, (23456, 23457))
    commands = local_cluster.daemon_commands(files, "node1")
    assert [command[0] for command in commands] == ["munged", "slurmctld", "slurmd"]
    for command in commands:
        named = _paths_in(" ".join(command)) + [argument for argument in command if argument.startswith("/")]
        assert named and all(Path(path).is_relative_to(tmp_path) for path in named), command
    environment = local_cluster.environment(tmp_path)
    assert environment["SLURM_CONF"] == str(files.conf)
    assert environment["PATH"].split(os.pathsep)[0] == str(files.srun.parent)


def test_the_folders_srun_names_the_configuration_that_a_snakemake_job_step_drops(tmp_path):
    """Inside a job, Snakemake's job step runs srun without any SLURM_* variable; the folder's srun (first on
    PATH) runs SLURM's srun (here ``env``, which prints the environment it gets) with SLURM_CONF set again."""
    files = local_cluster.write_config(tmp_path, "node1", 2, 1000, (23456, 23457), srun=shutil.which("env"))
    environment = {key: value for key, value in local_cluster.environment(tmp_path).items() if key != "SLURM_CONF"}
    printed = subprocess.run(["srun"], env=environment, capture_output=True, text=True, check=True).stdout
    assert f"SLURM_CONF={files.conf}\n" in printed


def test_the_free_ports_are_distinct_and_not_slurms_defaults():
    ports = local_cluster.free_ports(2)
    assert len(set(ports)) == 2 and not set(ports) & {6817, 6818}


@pytest.fixture
def sleeper():
    """Start a process that sleeps, with ``arguments`` on its command line; killed at the end if it still runs."""
    started = []

    def start(*arguments: str) -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *arguments]))
        return started[-1]

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_stop_leaves_a_process_alone_whose_command_line_does_not_name_the_folder(tmp_path, sleeper):
    files = local_cluster.Files(tmp_path)
    stranger = sleeper()  # a pid file that names a process of someone else (its pid reused, say)
    files.slurmd_pid.write_text(f"{stranger.pid}\n")
    assert local_cluster.our_pid(files.slurmd_pid, tmp_path) is None
    local_cluster.stop(tmp_path, timeout=5)
    assert stranger.poll() is None


def test_stop_ends_the_process_that_names_the_folder_by_its_pid(tmp_path, sleeper):
    files = local_cluster.Files(tmp_path)
    files.munge_pid.parent.mkdir()
    ours = sleeper(f"--pid-file={files.munge_pid}")  # an argument as munged's
    elsewhere = sleeper(f"--pid-file={tmp_path}-other/munged.pid")  # a folder whose name only starts the same
    files.munge_pid.write_text(f"{ours.pid}\n")
    files.slurmd_pid.write_text(f"{elsewhere.pid}\n")
    assert local_cluster.our_pid(files.munge_pid, tmp_path) == ours.pid
    assert local_cluster.our_pid(files.slurmd_pid, tmp_path) is None
    local_cluster.stop(tmp_path, timeout=5)
    assert ours.wait(timeout=5) == -15  # SIGTERM
    assert elsewhere.poll() is None


def test_a_pid_file_of_a_process_that_ended_stops_nothing(tmp_path):
    files = local_cluster.Files(tmp_path)
    ended = subprocess.Popen(["true", f"{tmp_path}/slurm.conf"])
    ended.wait()
    files.slurmctld_pid.write_text(f"{ended.pid}\n")
    assert local_cluster.our_pid(files.slurmctld_pid, tmp_path) is None
    local_cluster.stop(tmp_path, timeout=5)  # no pid file of the others, no controller to ask: returns


def test_start_names_the_packages_when_slurm_is_not_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(local_cluster.ClusterError, match="apt-get install -y slurmctld slurmd slurm-client munge"):
        local_cluster.start(tmp_path / "cluster")
    assert not (tmp_path / "cluster").exists()
