"""The local job server: a real server process forks real job scripts over a Unix socket (no Snakemake needed).

A job must behave as if it ran in its own process: its streams, status, directory, command line, environment and
thread count; and it must not outlive the script waiting for it. Without a usable server the script runs itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verbmirage.workflow import jobserver

SRC = str(Path(jobserver.__file__).resolve().parents[2])  # src/, above the verbmirage package

JOB = """\
import json, os, sys
from verbmirage.workflow.jobserver import delegate

preloaded = "torch" in sys.modules
delegate()
preloaded = preloaded or "torch" in sys.modules
import numpy, torch

numpy.ones((300, 300)) @ numpy.ones((300, 300))  # a BLAS call (BLAS libraries start their workers lazily)
record = {
    "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv,
    "marker": os.environ.get("JOB_MARKER"), "server_named": "VERBMIRAGE_JOB_SERVER" in os.environ,
    "torch_preloaded": preloaded, "threads": torch.get_num_threads(),
    "os_threads": len(os.listdir("/proc/self/task")),
    "torch_rand": torch.rand(3).tolist(), "numpy_global": float(numpy.random.random()),
}
print(json.dumps(record))
print("to stderr", file=sys.stderr)
mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
if mode == "raise":
    raise RuntimeError("the job failed")
if mode.isdigit():
    sys.exit(int(mode))
"""

SLOW_JOB = """\
import os, signal, sys, time
from pathlib import Path
from verbmirage.workflow.jobserver import delegate

delegate()
here = Path(sys.argv[1])

def mark(name):
    # written whole, then renamed: the test polls for the name and must never read an empty file
    (here / f"{name}.part").write_text(str(os.getpid()))
    os.replace(here / f"{name}.part", here / name)

def stopped(signum, frame):
    mark("terminated")
    sys.exit(7)

signal.signal(signal.SIGTERM, stopped)
mark("started")
time.sleep(60)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server that preloads numpy and torch; named in this process's environment while the module runs."""
    log = tmp_path_factory.mktemp("server") / "job_server.log"
    process = jobserver.start(log, preload=("numpy", "torch", "verbmirage.workflow.jobserver"))
    _wait_until(lambda: os.path.exists(process.ready_marker), 120, "the server's imports")
    yield process
    jobserver.stop(process)
    assert process.returncode == 0
    assert not os.path.exists(process.socket_path) and not os.path.exists(process.ready_marker)


def _wait_until(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _environment(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1", **extra)


def _run(script: Path, *args, cwd: Path, env: dict, python: str = sys.executable):
    result = subprocess.run([python, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=120)
    record = json.loads(result.stdout.splitlines()[0]) if result.stdout.startswith("{") else None
    return result, record


def test_a_job_runs_in_a_fork_of_the_server_as_if_in_its_own_process(server, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    work = tmp_path / "work"
    work.mkdir()
    result, record = _run(script, "ok", cwd=work, env=_environment(JOB_MARKER="m1"))
    assert result.returncode == 0, result.stderr
    assert record["ppid"] == server.pid  # forked by the server, not started by us
    assert record["torch_preloaded"]
    assert record["cwd"] == str(work) and record["argv"] == [str(script), "ok"] and record["marker"] == "m1"
    assert not record["server_named"]  # processes the job starts run their own scripts
    assert record["threads"] == 1  # OMP_NUM_THREADS of the job, not of the server
    # one thread means one: the job's own and the server's watch on its script, no BLAS workers (those that
    # a forked job started when it limited the BLAS library itself spun while it ran)
    assert record["os_threads"] == 2
    assert result.stderr == "to stderr\n"
    # A job of another thread count gets its own; the next job starts from the server's count again.
    for threads in (2, 1):
        result, record = _run(script, "ok", cwd=work, env={**_environment(), "OMP_NUM_THREADS": str(threads)})
        assert result.returncode == 0 and record["ppid"] == server.pid and record["threads"] == threads

    alone, own = _run(script, "ok", cwd=work, env=_environment(VERBMIRAGE_JOB_SERVER=""))
    assert alone.returncode == 0 and own["ppid"] == os.getpid() and not own["torch_preloaded"]
    again = _run(script, "ok", cwd=work, env=_environment())[1]
    assert again["ppid"] == server.pid
    # Unseeded global generators start from entropy in every job, as in new processes, not from the server's state.
    assert again["numpy_global"] != record["numpy_global"] and again["torch_rand"] != record["torch_rand"]


def test_exit_status_and_traceback_reach_the_caller(server, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    result, record = _run(script, "3", cwd=tmp_path, env=_environment())
    assert result.returncode == 3 and record["ppid"] == server.pid
    result, record = _run(script, "raise", cwd=tmp_path, env=_environment())
    assert result.returncode == 1 and record["ppid"] == server.pid
    assert "RuntimeError: the job failed" in result.stderr and "Traceback" in result.stderr
    served = Path(server.log_path).read_text()  # the server logs every job it ran
    assert "job.py: exit 3" in served and "job.py: exit 1" in served


def test_without_a_usable_server_the_script_runs_itself(server, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    path = os.environ[jobserver.ENV_VAR].partition(":")[2]
    for name in (f"another-host:{path}", f"{os.uname().nodename}:{tmp_path / 'no-socket'}"):
        result, record = _run(script, cwd=tmp_path, env=_environment(VERBMIRAGE_JOB_SERVER=name))
        assert result.returncode == 0 and record["ppid"] == os.getpid(), name
    # Another Python environment (the base interpreter, not this venv): the server declines and it runs itself.
    base = Path(sys.base_prefix) / "bin" / "python3"
    if base.resolve() != Path(sys.executable).resolve() or sys.prefix != sys.base_prefix:
        probe = tmp_path / "probe.py"
        probe.write_text("import os, sys\nfrom verbmirage.workflow.jobserver import delegate\ndelegate()\n"
                         "print(os.getppid(), sys.prefix)\n")
        result = subprocess.run([str(base), str(probe)], env=_environment(), capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr
        assert int(result.stdout.split()[0]) == os.getpid()
        assert "declined probe.py" in Path(server.log_path).read_text()  # the server says why


def test_killing_the_waiting_script_stops_the_job(server, tmp_path):
    script = tmp_path / "slow.py"
    script.write_text(SLOW_JOB)
    waiting = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=_environment())
    _wait_until((tmp_path / "started").exists, 60, "the job to start")
    job_pid = int((tmp_path / "started").read_text())
    assert job_pid != waiting.pid
    waiting.send_signal(signal.SIGKILL)  # what a user's kill -9 or a dying Snakemake leaves behind
    waiting.wait()
    _wait_until((tmp_path / "terminated").exists, 30, "the orphaned job to get SIGTERM")
    assert int((tmp_path / "terminated").read_text()) == job_pid


KILLED_JOB = """\
import os, signal, sys
from verbmirage.workflow.jobserver import delegate


class Job:  # what Snakemake sets before a rule's script runs: the job's log files among its fields
    log = [sys.argv[1]]


snakemake = Job()
delegate()
with open(sys.argv[1], "a") as log:
    log.write(f"job pid {os.getpid()}\\nslow 2 sets:  41%|####      | 77/189 [00:10<00:14, 7.6 q/s]\\r")
os.kill(os.getpid(), signal.SIGKILL)  # as a kill -9 of the job, or the kernel's out-of-memory killer
"""


def test_a_job_killed_by_a_signal_is_named_so_in_its_log_and_the_summary(server, tmp_path):
    """Its waiting script said only that it ended without a status, and the run's summary showed the job's
    last progress bar as its error line."""
    from verbmirage.workflow.run_summary import error_line

    script, log = tmp_path / "killed.py", tmp_path / "job.log"
    script.write_text(KILLED_JOB)
    result = subprocess.run([sys.executable, str(script), str(log)], env=_environment(), capture_output=True,
                            text=True, timeout=120)
    job_pid = int(log.read_text().split()[2])
    said = f"verbmirage job server: the job (pid {job_pid}) was killed by signal 9 (SIGKILL)"
    assert result.returncode == 128 + 9 and result.stderr == said + "\n"
    assert log.read_text().endswith(said + "\n") and error_line(log) == said


RUN = """\
import subprocess, sys, time
from verbmirage.workflow import jobserver

jobserver.mark_run()  # as the Snakefile's onstart does (jobserver.start_run)
subprocess.Popen(["bash", "-c", f"set -eu; {sys.executable} {sys.argv[1]} {sys.argv[2]}"])  # a job, as Snakemake
time.sleep(120)
"""


@pytest.mark.parametrize("served", [True, False], ids=["served", "own_process"])
def test_a_job_stops_when_the_run_that_started_it_is_gone(server, tmp_path, served):
    """SIGKILL of Snakemake stops nothing by itself; its job, a grandchild, must notice and stop."""
    (tmp_path / "slow.py").write_text(SLOW_JOB)
    (tmp_path / "run.py").write_text(RUN)
    environment = _environment()
    if not served:
        environment.pop(jobserver.ENV_VAR)
    run = subprocess.Popen([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "slow.py"), str(tmp_path)],
                           env=environment)
    _wait_until((tmp_path / "started").exists, 60, "the job to start")
    job_pid = int((tmp_path / "started").read_text())
    parent = int(Path(f"/proc/{job_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert (parent == server.pid) == served
    run.kill()
    run.wait()
    _wait_until((tmp_path / "terminated").exists, 15, "the job of the killed run to get SIGTERM")
    assert int((tmp_path / "terminated").read_text()) == job_pid
    _wait_until(lambda: not _alive(job_pid), 15, "the job to end")


COUNTING_JOB = """\
import os, signal, sys, time
from pathlib import Path
from verbmirage.workflow.jobserver import delegate

delegate(wait=True)
here, count = Path(sys.argv[1]), []
signal.signal(signal.SIGINT, lambda signum, frame: count.append(signum))
(here / "started").write_text(str(os.getpid()))
while not count:
    time.sleep(0.01)
time.sleep(1)  # a second SIGINT, if any, arrives meanwhile
(here / "count").write_text(str(len(count)))
"""

GROUP_RUN = """\
import os, signal, subprocess, sys, time
from verbmirage.workflow import jobserver

signal.signal(signal.SIGINT, lambda signum, frame: None)  # as Snakemake, it lets its jobs end by themselves
server = jobserver.start(sys.argv[2] + "/server.log", preload=("verbmirage.workflow.jobserver",))
while not os.path.exists(server.ready_marker):
    time.sleep(0.05)
subprocess.run([sys.executable, sys.argv[1], sys.argv[2]])  # the job, in this process group, as under Snakemake
jobserver.stop(server)
"""


def test_ctrl_c_reaches_a_served_job_once(tmp_path):
    """Ctrl-C signals the terminal's whole process group: Snakemake, the job server, the waiting script; the job
    must get it once, from the script (a second SIGINT would interrupt it while it saves its answered rows)."""
    (tmp_path / "job.py").write_text(COUNTING_JOB)
    (tmp_path / "run.py").write_text(GROUP_RUN)
    environment = {key: value for key, value in _environment().items() if key != jobserver.ENV_VAR}
    run = subprocess.Popen([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "job.py"), str(tmp_path)],
                           env=environment, start_new_session=True)
    _wait_until((tmp_path / "started").exists, 60, "the job to start")
    assert int((tmp_path / "started").read_text()) != run.pid
    os.killpg(run.pid, signal.SIGINT)
    _wait_until((tmp_path / "count").exists, 30, "the job to count its signals")
    assert (tmp_path / "count").read_text() == "1"
    run.wait(timeout=60)


def test_a_signal_to_the_script_reaches_the_job(server, tmp_path):
    script = tmp_path / "slow.py"
    script.write_text(SLOW_JOB)
    waiting = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=_environment())
    _wait_until((tmp_path / "started").exists, 60, "the job to start")
    waiting.send_signal(signal.SIGTERM)  # Snakemake stopping its jobs
    assert waiting.wait(timeout=30) == 7  # the job's own handler ran and its status came back
    assert (tmp_path / "terminated").read_text() == (tmp_path / "started").read_text()


def test_the_server_exits_when_the_run_that_started_it_is_gone(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from verbmirage.workflow import jobserver\n"
         f"p = jobserver.start({str(tmp_path / 'log')!r}, preload=())\n"
         "print(p.pid, p.socket_path, flush=True); time.sleep(120)"],
        env=_environment(), stdout=subprocess.PIPE, text=True,
    )
    server_pid, socket_path = parent.stdout.readline().split()
    _wait_until(lambda: os.path.exists(f"{socket_path}.ready"), 60, "the server's imports")
    parent.kill()  # Snakemake killed: no onsuccess/onerror hook runs
    parent.wait()
    _wait_until(lambda: not _alive(int(server_pid)), 30, "the server to notice")
    assert not os.path.exists(socket_path) and not os.path.exists(f"{socket_path}.ready")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; whoever adopted it may not have reaped it yet


def test_while_the_server_imports_model_jobs_wait_and_light_jobs_run_themselves(tmp_path, monkeypatch):
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(4)\n")
    script = tmp_path / "job.py"
    script.write_text("import os, sys\nfrom verbmirage.workflow.jobserver import delegate\n"
                      "delegate(wait=sys.argv[1] == 'wait')\nprint(os.getppid(), 'slow_to_import' in sys.modules)\n")
    monkeypatch.setenv("PYTHONPATH", f"{SRC}{os.pathsep}{tmp_path}")
    monkeypatch.delenv(jobserver.ENV_VAR, raising=False)  # restored afterwards for the module's server
    process = jobserver.start(tmp_path / "log", preload=("slow_to_import",))
    try:
        _wait_until(lambda: os.path.exists(process.socket_path), 30, "the server to listen")
        light = subprocess.run([sys.executable, str(script), "light"], capture_output=True, text=True, timeout=60)
        assert light.stdout.split() == [str(os.getpid()), "False"], light.stderr  # not served: ran itself
        heavy = subprocess.run([sys.executable, str(script), "wait"], capture_output=True, text=True, timeout=60)
        assert heavy.stdout.split() == [str(process.pid), "True"], heavy.stderr  # served after the imports
        light = subprocess.run([sys.executable, str(script), "light"], capture_output=True, text=True, timeout=60)
        assert light.stdout.split() == [str(process.pid), "True"], light.stderr  # the server is ready now
    finally:
        jobserver.stop(process)


def test_the_server_imports_the_package_copy_that_started_it(tmp_path):
    """As in a Snakefile that puts src/ on its own sys.path: the package is not installed in that Python
    (here the base interpreter) and PYTHONPATH does not name it; the server still starts and serves."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs a Python without the package installed (run from a virtual environment)")
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", jobserver.ENV_VAR)}
    starter = subprocess.run(
        [str(base), "-c",
         f"import os, sys, time; sys.path.insert(0, {SRC!r}); from verbmirage.workflow import jobserver\n"
         f"p = jobserver.start({str(tmp_path / 'log')!r}, preload=('json',))\n"
         "deadline = time.monotonic() + 60\n"
         "while not os.path.exists(p.ready_marker) and p.poll() is None and time.monotonic() < deadline:\n"
         "    time.sleep(0.05)\n"
         "print(os.path.exists(p.ready_marker)); jobserver.stop(p)"],
        env=environment, capture_output=True, text=True, timeout=120,
    )
    assert starter.stdout.split() == ["True"], starter.stdout + starter.stderr + (tmp_path / "log").read_text()
