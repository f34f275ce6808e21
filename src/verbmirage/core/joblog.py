"""Send a workflow job's logging and progress bars to its Snakemake log file; one job writes a log at a time."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import resource
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from verbmirage.core.paths import open_plain

#: ``.<log name>.<pid>@<host>.writer``: a second name (a hard link) of a running job's log, beside it.
_WRITER = ".{name}.{pid}@{host}.writer"


class LogBusyError(RuntimeError):
    """The job that writes this log is still running elsewhere (the message names its pid and host)."""


@contextlib.contextmanager
def job_log(path: str | Path) -> Iterator[logging.Logger]:
    """Route ``logging`` and stderr (tqdm's progress bars) to ``path`` for the job's duration.

    An exception is logged with its traceback before it propagates, so the log
    says why the job failed. The last line gives the job's wall time, CPU time and peak memory, measured in
    its own process (right also when the local job server ran it, where ``benchmarks/`` measures the script
    that waited).

    One writer per log: Snakemake removes a job's log before it runs the job again, also while an earlier run
    of the same job still writes it (an orphan of a killed Snakemake, a cluster job that outlived its run).
    The running job keeps a second name for its log beside it and a lock on it; a job that finds that lock
    held puts the running job's log back at ``path`` and stops with :class:`LogBusyError` on stderr, touching
    neither the log nor the job's outputs. Neither name is written or linked through a symbolic link: a log or a
    second name that is not a plain file is refused (:class:`verbmirage.core.paths.NotAPlainFileError`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stream, writer = _claim(path)
    with stream, contextlib.redirect_stderr(stream):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        started = time.perf_counter()
        try:
            yield logging.getLogger("verbmirage.job")
        except BaseException:
            logging.getLogger("verbmirage.job").exception("job failed")
            raise
        finally:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            logging.getLogger("verbmirage.job").info(
                "job resources: %.1f s, CPU %.1f s, peak RSS %.0f MiB", time.perf_counter() - started,
                usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
            )
            root.removeHandler(handler)
            _let_go(path, writer)


def _claim(path: Path):
    """Open ``path`` to append, locked, with a second name beside it; :class:`LogBusyError` if a live job holds
    an earlier log of this path (whose log is put back at ``path`` first)."""
    for other in path.parent.glob(_WRITER.format(name=glob.escape(path.name), pid="*", host="*")):
        try:
            handle = os.fdopen(open_plain(other, os.O_RDONLY, "a running job's second name of its log"), "rb")
        except FileNotFoundError:  # its job just ended
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _put_back(other, path)
                raise LogBusyError(
                    f"{path}: the job that writes this log is still running ({_holder(other, path)}), from an "
                    "earlier run; this one stops without touching its log or outputs. Wait for that job to finish, "
                    "or stop it, then rerun") from None
            other.unlink(missing_ok=True)  # left by a killed job
    stream = os.fdopen(open_plain(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "a job log"), "a", buffering=1)
    try:
        fcntl.flock(stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another job opened this very file a moment ago
        stream.close()
        raise LogBusyError(f"{path}: another job started writing this log a moment ago; wait for it to finish, "
                           "or stop it, then rerun") from None
    writer = path.with_name(_WRITER.format(name=path.name, pid=os.getpid(), host=socket.gethostname()))
    try:
        writer.unlink(missing_ok=True)
        os.link(path, writer, follow_symlinks=False)
    except OSError:  # a file system without hard links: the log is written, only unprotected
        writer = None
    return stream, writer


def _let_go(path: Path, writer: Path | None) -> None:
    """The job is done with its log: put it back if it was removed meanwhile, drop the second name."""
    if writer is None:
        return
    with contextlib.suppress(OSError):
        if not path.exists():
            _put_back(writer, path)
        writer.unlink()


def _put_back(writer: Path, path: Path) -> None:
    """Make ``path`` name the same file as ``writer`` again (a link under a temporary name, then a rename)."""
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        os.unlink(name)
        os.link(writer, name, follow_symlinks=False)
        os.replace(name, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _holder(writer: Path, path: Path) -> str:
    """"pid N on host H" from a second name (:data:`_WRITER`)."""
    middle = writer.name[len(f".{path.name}."): -len(".writer")]
    pid, _, host = middle.partition("@")
    return f"pid {pid} on host {host}"
