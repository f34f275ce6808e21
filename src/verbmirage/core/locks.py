"""One writer at a time: an OS lock (``flock``) on a small file beside what is written, naming its holder.

The lock dies with its process (a killed job never leaves it behind), works across hosts on a shared file
system that supports locks (NFS v4), and a second writer fails at once instead of waiting. While held, the
lock file says who holds it (pid, host, since when), so the second writer's error names the job to wait for or
stop; on release it is emptied again (a finished run leaves the same bytes as any other). A lock file that is a
symbolic link, a FIFO or a folder is refused (:class:`verbmirage.core.paths.NotAPlainFileError`): writing the
holder through a link would empty the link's target.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from verbmirage.core.paths import open_plain


class BusyError(RuntimeError):
    """Another process holds the lock; the message names it (pid and host) and the lock file."""


def describe_holder(text: str) -> str:
    """"pid N on host H since T" from a lock file's content; "an unknown job" when it says nothing (yet)."""
    try:
        holder = json.loads(text)
        return f"pid {int(holder['pid'])} on host {holder['host']} since {holder['since']}"
    except (ValueError, KeyError, TypeError):
        return "a job that has not said who it is yet"


class WriterLock:
    """An exclusive, non-blocking lock on ``path``; raises ``error`` (a :class:`BusyError`) naming the holder.

    ``what`` starts the error message (the thing being written, e.g. a shard's folder), ``this`` names it
    after that ("this shard"). Use as a context manager or call :meth:`release`. A second lock on the same file
    fails, in this process too, unless both are ``reentrant``: then the second is the first one again (released
    by the outermost holder), so a build that locks its output may call a function that locks it too.
    """

    _held: dict[str, list] = {}  # resolved path -> [handle, count] of the locks this process holds

    def __init__(self, path: str | Path, what: str, error: type[BusyError] = BusyError, this: str = "it",
                 advice: str = "wait for it to finish, or stop it, before rerunning", reentrant: bool = False):
        self.path = Path(path)
        self._key = str(self.path.resolve()) if reentrant else None
        self._released = False
        held = WriterLock._held.get(self._key) if reentrant else None
        if held is not None:
            held[1] += 1
            self.handle = held[0]
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            handle = os.fdopen(open_plain(self.path, os.O_RDWR | os.O_CREAT, "a lock file"), "r+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = describe_holder(handle.read(4096))
                handle.close()
                raise error(f"{what}: another job is writing {this} right now ({holder}; it holds {self.path}); "
                            f"{advice}") from None
            if _same_file(handle, self.path):
                break
            handle.close()  # the file was removed (a holder releasing it) between open and lock: lock the new one
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        handle.flush()
        self.handle = handle
        if reentrant:
            WriterLock._held[self._key] = [handle, 1]

    def release(self) -> None:
        """Empty the lock file and release the lock (only the outermost holder in this process does)."""
        if self._released:
            return
        self._released = True
        if self._key is not None:
            held = WriterLock._held.get(self._key)
            if held is None or held[0] is not self.handle:
                return
            held[1] -= 1
            if held[1]:
                return
            del WriterLock._held[self._key]
        with contextlib.suppress(OSError):
            self.handle.truncate(0)
            self.handle.flush()
        self.handle.close()

    def __enter__(self) -> "WriterLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(handle, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.lstat(path))
    except FileNotFoundError:
        return False
