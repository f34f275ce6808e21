"""A warm process that runs a local workflow's jobs by forking, so no job pays Python's start-up and imports.

Why: every Snakemake job is a new Python process. Importing torch and transformers takes 5-9 s, pandas, pyarrow
and scipy 1-2 s; on the demo (about 180 jobs on 2 cores) that start-up was as long as the jobs' own work. Here
one server process imports all of it once (``PRELOAD``); each job script's first line (``delegate()``) hands the
job to it. The server forks a child that takes over the job's stdin, stdout and stderr (passed over a Unix
socket), working directory, environment and command line, and runs the very script Snakemake wrote (its
preamble included), so a job runs the same code either way. The script's process waits and exits with the
child's status; a signal it gets is passed on, and if it dies the child is stopped.

Nothing depends on the server: without one (cluster jobs, ``job_server: false``, another host, another Python
environment) ``delegate()`` returns at once and the job runs in its own process as before. Jobs that start while
the server still imports run themselves too, except those that load models, which wait for it. The Snakefile starts
the server in ``onstart`` for local runs only and stops it when the run ends; it also exits when the Snakemake
process that started it goes away, and every job of a local run, served or not, stops then too (:func:`mark_run`,
:func:`watch_run`). Nothing exists that fits (nailgun-style servers are for the JVM;
``multiprocessing``'s forkserver cannot take over another process's terminal and exit status), hence this
module.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from verbmirage.core.paths import open_plain

#: The environment variable naming the server of this run: ``<host>:<socket path>`` (jobs inherit it).
ENV_VAR = "VERBMIRAGE_JOB_SERVER"
#: The environment variable naming the Snakemake process of a local run, ``<host>:<pid>:<start time>``: its jobs
#: stop when it is gone (:func:`mark_run`).
RUN_VAR = "VERBMIRAGE_RUN"
#: Seconds a job whose run is gone has between SIGTERM (save what it answered) and SIGKILL.
STOP_GRACE_SECONDS = 10.0

#: Modules the server imports before it serves (what the job scripts import; the transformers classes the model
#: backends and tiny models load by name). A module that fails to import is logged and left to the jobs.
PRELOAD = (
    "snakemake.script",
    "numpy",
    "pandas",
    "pyarrow.parquet",
    "scipy.io",
    "scipy.stats",
    "sklearn.metrics",
    "PIL.Image",
    "tqdm",
    "yaml",
    "matplotlib",
    "matplotlib.pyplot",
    "torch",
    "transformers",
    "peft",
    "verbmirage.*",
)
#: transformers loads these lazily by attribute; touching them imports their modules. These serve every backend;
#: each backend's own (its model and processor classes) are in its registry row (``models.registry``, ``preload``).
TRANSFORMERS_NAMES = (
    "AutoConfig", "AutoProcessor", "AutoTokenizer", "AutoImageProcessor", "PreTrainedTokenizerFast",
    "LogitsProcessorList", "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "Trainer",
)
_STATUS = struct.Struct("!i")  # a job's exit status; minus the signal that killed it (sent by the server)
_PID = struct.Struct("!i")
#: What the script waiting for a served job says, on its stderr and at the end of the job's log, when a signal
#: killed the job (the run's summary shows it as the job's error line: verbmirage.workflow.run_summary).
KILLED = "verbmirage job server: the job (pid {pid}) was killed by signal {signum} ({name})"
_MAX_REQUEST = 64 << 20
_serving = False  # True inside a job the server forked: delegate() then runs the script here
_threads: int | None = None  # the thread count this process set (the server: 1; a forked job: inherited)
log = logging.getLogger(__name__)


# ---- the job's side -----------------------------------------------------------------------------------------


def delegate(wait: bool = False) -> None:
    """Run this job script in the run's job server and exit with its status; return when there is no server.

    Call it first in a workflow script, before the heavy imports. It returns (the job then runs here) when no
    server is named, the server is on another host, not listening or gone, or declines the job (another Python
    environment), and inside the server's own child. While the server still imports, a job runs here unless
    ``wait``: jobs that load torch and transformers wait (their own imports would take as long and compete
    for the same cores), light ones start at once.
    """
    if _serving:
        return
    watch_run()  # here and in the waiting script alike: a job whose Snakemake died stops (a served one with it)
    address = os.environ.get(ENV_VAR, "")
    host, _, path = address.partition(":")
    if not path or host != socket.gethostname():
        return
    if not wait and not os.path.exists(_ready_marker(path)):
        return
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        pid = _hand_over(connection)
    except OSError:
        connection.close()
        return  # not listening, or it did not take the job: run here
    status = _wait_for(connection, pid)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # the job ran elsewhere: nothing of this process's own should run at exit


def mark_run() -> None:
    """Name this process (the Snakemake of a local run) in the environment the jobs it starts inherit.

    Killed with SIGKILL or crashed, Snakemake stops nothing: its jobs would run on unseen (they are children
    of the shell it starts, so a parent-death signal would watch the shell, not Snakemake) and a rerun would
    meet them on the locks they hold. A job named a run (:func:`watch_run`, from :func:`delegate`) stops
    when that process is gone. Not under a cluster executor, whose jobs are the cluster's to stop.
    """
    pid = os.getpid()
    os.environ[RUN_VAR] = f"{socket.gethostname()}:{pid}:{_start_time(pid) or ''}"


def watch_run(poll_seconds: float = 1.0, grace_seconds: float = STOP_GRACE_SECONDS) -> bool:
    """Stop this process when the run named in the environment (:func:`mark_run`) is gone: SIGTERM first (an
    inference job saves its answered rows, and a script waiting for a served job passes it on), SIGKILL after
    ``grace_seconds``. Returns whether a watch started (a run on this host is named)."""
    host, _, rest = os.environ.get(RUN_VAR, "").partition(":")
    pid_text, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)

    def watch():
        while _running(pid, start):
            time.sleep(poll_seconds)
        with contextlib.suppress(Exception):  # the run's terminal may be gone with it
            log.warning("the Snakemake run (pid %d) is gone; stopping this job (pid %d)", pid, os.getpid())
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_seconds)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="verbmirage-run-watch", daemon=True).start()
    return True


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from /proc), to tell it from a later one that
    reuses its pid; None without /proc or when it is gone (a zombie counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _running(pid: int, start: str) -> bool:
    """Whether process ``pid`` still runs and is the one that started at ``start`` (when known)."""
    if os.path.isdir("/proc"):
        now = _start_time(pid)
        return now is not None and (not start or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _hand_over(connection: socket.socket) -> int:
    """Send the job (streams, directory, environment, command line); return the pid of the process running it."""
    request = pickle.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "path": list(sys.path),
        "installation": _installation(),
    })
    socket.send_fds(connection, [struct.pack("!Q", len(request))], [0, 1, 2])
    connection.sendall(request)
    pid = _read_struct(connection, _PID)
    if not pid:
        raise OSError("the job server did not take the job (another Python environment or package copy)")
    return pid


def _ready_marker(path: str | Path) -> str:
    """The file the server creates once its imports are done."""
    return f"{path}.ready"


def _installation() -> tuple[str, str]:
    """What must match for the server's imports to be the job's: the Python environment and this package's copy
    (a rule's ``conda:`` environment or another checkout runs its jobs itself)."""
    return sys.prefix, os.path.realpath(__file__)


def _wait_for(connection: socket.socket, pid: int) -> int:
    """The job's exit status; signals to this process go to the job meanwhile."""

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    with connection:
        status = _read_struct(connection, _STATUS)
    if status is None:
        sys.stderr.write(f"verbmirage job server: the job (pid {pid}) ended without a status\n")
        return 1
    if status < 0:  # a signal killed it (the server saw it end): say so where the job's log ends, too
        line = KILLED.format(pid=pid, signum=-status, name=_signal_name(-status))
        sys.stderr.write(line + "\n")
        _append_to_job_log(line)
        return 128 - status  # as a shell reports a process killed by a signal
    return status


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown signal"


def _append_to_job_log(line: str) -> None:
    """Add ``line`` to the log files of the Snakemake job this script runs (``snakemake.log``, set before the
    script's own code), where they exist: a killed job's log otherwise ends with whatever it last wrote."""
    job = getattr(sys.modules.get("__main__"), "snakemake", None)
    for path in getattr(job, "log", None) or []:
        with contextlib.suppress(OSError):
            with os.fdopen(open_plain(path, os.O_WRONLY | os.O_APPEND, "a job log"), "a") as stream:
                stream.write(("" if stream.tell() == 0 else "\n") + line + "\n")


def _read_struct(connection: socket.socket, layout: struct.Struct) -> int | None:
    data = b""
    while len(data) < layout.size:
        try:
            chunk = connection.recv(layout.size - len(data))
        except InterruptedError:
            continue
        if not chunk:
            return None
        data += chunk
    return layout.unpack(data)[0]


# ---- the server's side --------------------------------------------------------------------------------------


def preload(names=PRELOAD, transformers_names=None) -> list[str]:
    """Import ``names`` (``pkg.*``: the package and all its modules), then touch ``transformers_names`` (default:
    :data:`TRANSFORMERS_NAMES` and every backend's own); return the ones that failed."""
    import pkgutil

    if transformers_names is None:
        from verbmirage.models.registry import preload_names  # deferred: jobs import this module first, light

        transformers_names = TRANSFORMERS_NAMES + preload_names()

    failed = []
    for name in names:
        targets = [name]
        if name.endswith(".*"):
            package = name[:-2]
            try:
                module = importlib.import_module(package)
            except Exception:  # noqa: BLE001 - a missing optional package is the jobs' business
                failed.append(package)
                continue
            targets = [info.name for info in pkgutil.walk_packages(module.__path__, package + ".")]
        for target in targets:
            try:
                importlib.import_module(target)
            except Exception:  # noqa: BLE001
                failed.append(target)
    if "transformers" in sys.modules:
        for attribute in transformers_names:
            try:
                getattr(sys.modules["transformers"], attribute)
            except Exception:  # noqa: BLE001
                failed.append(f"transformers.{attribute}")
    return failed


def serve(path: str | Path, parent_pid: int | None = None, names=PRELOAD, poll_seconds: float = 1.0) -> None:
    """Import ``names``, then fork a child per connection at ``path`` until SIGTERM or ``parent_pid`` exits."""
    # Listening first: jobs that load models and start meanwhile wait for the imports (``delegate(wait=True)``).
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(128)
    started = time.perf_counter()
    failed = preload(names)
    log.info("imported %d modules in %.1f s%s", len(sys.modules), time.perf_counter() - started,
             f" (not importable: {', '.join(failed)})" if failed else "")
    # Thread pools limited here, before any fork, to most jobs' count (a rule's default: 1). Limited inside a
    # forked job instead, numpy's OpenBLAS re-created its worker threads there and they spun: a job burned up to
    # 2.5x its CPU time (bench/README.md, "Demo and CI time").
    _set_threads({"OMP_NUM_THREADS": "1"})
    Path(_ready_marker(path)).touch()
    stopping = False

    def stop(_signum, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    children: dict[int, socket.socket] = {}  # job pid -> the server's end of its connection (see _reap)
    try:
        while not stopping and (parent_pid is None or os.getppid() == parent_pid):
            with contextlib.suppress(InterruptedError):
                ready, _, _ = select.select([listener], [], [], poll_seconds)
                if ready:
                    connection, _ = listener.accept()
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        listener.close()
                        for other in children.values():  # the others' ends: their scripts wait for them to close
                            other.close()
                        os._exit(_child(connection))
                    children[pid] = connection
            for pid in [pid for pid, connection in children.items() if _reap(pid, connection)]:
                del children[pid]
    finally:
        listener.close()
        for connection in children.values():
            connection.close()
        for name in (_ready_marker(path), path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
    log.info("stopped")


def _reap(pid: int, connection: socket.socket) -> bool:
    """Whether job ``pid`` has ended; if so, close the server's end of its connection, after sending minus the
    signal that killed it, if one did (a killed job sends no status: its waiting script would only see the
    connection close). The server keeps that end open until then, so the script waits for this word."""
    try:
        ended, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        ended, status = pid, 0
    if ended != pid:
        return False
    if os.WIFSIGNALED(status):
        with contextlib.suppress(OSError):
            connection.sendall(_STATUS.pack(-os.WTERMSIG(status)))
    connection.close()
    return True


def _child(connection: socket.socket) -> int:
    """Run one job in this forked process; return its exit status (also sent to the waiting script)."""
    global _serving
    _serving = True
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A process group of its own: a signal to the run's group (Ctrl-C at the terminal) reaches the job once, passed
    # on by the script that waits for it; from the server's group it came twice, and the second interrupted the
    # job while it saved its answered rows.
    os.setpgid(0, 0)
    try:
        header, fds, _flags, _address = socket.recv_fds(connection, 8, 3)
        (size,) = struct.unpack("!Q", header)
        if len(fds) != 3 or size > _MAX_REQUEST:
            return 1
        request = pickle.loads(_read_exactly(connection, size))
        if request.get("installation") != _installation():
            connection.sendall(_PID.pack(0))
            log.warning("declined %s: it runs in %s, this server in %s (Python environment, package file); it runs "
                        "itself", Path(request["argv"][0]).name, request.get("installation"), _installation())
            return 0
        server_log = os.fdopen(os.dup(2), "w", buffering=1)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        connection.sendall(_PID.pack(os.getpid()))
    except (OSError, ValueError, pickle.UnpicklingError, struct.error):
        return 1
    finished = threading.Event()
    _stop_when_orphaned(connection, finished)
    started = time.perf_counter()
    status = _run_job(request)
    finished.set()
    with contextlib.suppress(OSError):
        connection.sendall(_STATUS.pack(status))
    with contextlib.suppress(OSError):
        seconds = time.perf_counter() - started
        server_log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} job pid {os.getpid()} "
                         f"{Path(request['argv'][0]).name}: exit {status} after {seconds:.1f} s\n")
    return status


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = connection.recv(min(left, 1 << 20))
        if not chunk:
            raise OSError("the job script closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _run_job(request: dict) -> int:
    """Become the job's process (directory, environment, streams, threads) and run its script as ``__main__``."""
    import runpy

    os.chdir(request["cwd"])
    environment = dict(request["env"])
    environment.pop(ENV_VAR, None)  # processes the job starts run their own scripts themselves
    os.environ.clear()
    os.environ.update(environment)
    sys.path[:] = request["path"]
    sys.argv[:] = request["argv"]
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the job's own streams, for the rest of this process
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    _set_threads(environment)
    _fresh_global_random_state()
    try:
        runpy.run_path(request["argv"][0], run_name="__main__")
        status = 0
    except SystemExit as exit_:
        status = _exit_status(exit_.code)
    except BaseException:  # noqa: BLE001 - as Python itself would: print the traceback, exit 1
        traceback.print_exc()
        status = 1
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return status


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _stop_when_orphaned(connection: socket.socket, finished: threading.Event, grace_seconds: float = 10.0):
    """Stop this job when the script's process that waits for it is gone (killed by Snakemake or a user):
    SIGTERM first, as Snakemake would send, then SIGKILL after ``grace_seconds``."""

    def watch():
        with contextlib.suppress(OSError):
            while connection.recv(1):
                pass
        if finished.is_set():
            return
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_seconds)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="verbmirage-job-watch", daemon=True).start()


def _set_threads(environment: dict) -> None:
    """The job's thread count (Snakemake sets OMP_NUM_THREADS to the rule's threads); the server imported
    torch and the BLAS libraries before that was known. A forked job inherits the server's count and sets only
    another one (see :func:`serve`)."""
    global _threads
    try:
        threads = int(environment.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return
    if threads < 1 or threads == _threads:
        return
    _threads = threads
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    with contextlib.suppress(ImportError):
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)


def _fresh_global_random_state() -> None:
    """A new process seeds numpy's legacy global generator and torch's default one from entropy; every fork
    would otherwise share the server's state (``random`` reseeds itself after a fork)."""
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()


# ---- the run's side (the Snakefile) -------------------------------------------------------------------------


def start(log_path: str | Path, preload: tuple[str, ...] = PRELOAD) -> subprocess.Popen:
    """Start a server for this run, named in ``os.environ`` so that the jobs Snakemake starts find it.

    The server logs to ``log_path``; jobs that load models and start while it imports wait for it.
    """
    directory = tempfile.mkdtemp(prefix="verbmirage-jobs-")  # short: a socket path has at most 107 bytes
    path = os.path.join(directory, "socket")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # this copy of the package, also where the Snakefile found it on its own sys.path rather than installed
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                              environment.get("PYTHONPATH")]))
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    with os.fdopen(open_plain(log_path, flags, "the job server's log"), "a") as stream:
        process = subprocess.Popen(
            [sys.executable, "-m", "verbmirage.workflow.jobserver", path, "--parent", str(os.getpid()),
             "--preload", ",".join(preload)],
            stdin=subprocess.DEVNULL, stdout=stream, stderr=subprocess.STDOUT, env=environment,
        )
    process.socket_path, process.log_path, process.ready_marker = path, log_path, _ready_marker(path)
    os.environ[ENV_VAR] = f"{socket.gethostname()}:{path}"
    return process


def start_run(local: bool, job_server: bool, log_path: str | Path,
              preload: tuple[str, ...] = PRELOAD) -> subprocess.Popen | None:
    """What the Snakefile does as a run starts: for a local run (``local``: no cluster executor), name it for its
    jobs (:func:`mark_run`) and, with ``job_server``, start a server (:func:`start`; else None)."""
    if not local:
        return None
    mark_run()
    return start(log_path, preload) if job_server else None


def stop(process: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Stop a server from ``start`` (jobs still running keep running) and forget its name."""
    if process is None:
        return
    os.environ.pop(ENV_VAR, None)
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for name in (_ready_marker(process.socket_path), process.socket_path):
        with contextlib.suppress(OSError):
            os.unlink(name)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(process.socket_path))


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("socket", help="the Unix socket path to serve at")
    parser.add_argument("--parent", type=int, help="exit when this process (the Snakemake run) is gone")
    parser.add_argument("--preload", default=",".join(PRELOAD), help="modules to import first, comma-separated")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s job server: %(message)s")
    serve(args.socket, parent_pid=args.parent, names=tuple(filter(None, args.preload.split(","))))


if __name__ == "__main__":
    import verbmirage.workflow.jobserver  # the module the jobs import: its `_serving` is the flag that counts

    verbmirage.workflow.jobserver.main()
