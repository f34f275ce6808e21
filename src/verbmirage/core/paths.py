"""Names read from data files must not lead outside their folder.

Image names in ``anno.mat``/``anno_bbox.mat``, video ids in the CharadesEgo
CSVs and the ``image`` column of question tables all become file paths. A
tampered or careless file could name ``../victim.jpg`` or ``/etc/passwd``, and
the pipeline would then link, overwrite or upload a file outside its folders.
Every loader checks names with :func:`safe_name` / :func:`safe_relative_name`,
and every place that opens or writes a file checks the resolved path with
:func:`inside`.

A file the pipeline writes appears whole or not at all (:func:`atomic_path`, :func:`write_text`): a killed job
or a crashed node never leaves half a file that a later job could read.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

# letters, digits, "_", "." and "-" only: what HICO and Charades names use
_SAFE_PART = re.compile(r"[A-Za-z0-9_.-]+")


def user_file_mode() -> int:
    """0666 less the process umask: the mode ``open()`` gives a new file (``mkstemp`` gives 0600)."""
    umask = os.umask(0o022)
    os.umask(umask)  # the umask can only be read by setting it
    return 0o666 & ~umask


class UnsafePathError(ValueError):
    """A name from a data file would lead outside its folder, or has odd characters."""


class NotAPlainFileError(UnsafePathError):
    """A file the pipeline writes in place (a lock, a log) is a symbolic link, a FIFO, a folder or a device."""


def open_plain(path: str | Path, flags: int, what: str = "a file the pipeline writes") -> int:
    """``os.open(path, flags)`` for writing in place, never through a link: a descriptor of a plain file.

    Where a file is opened in place rather than written beside and renamed over (a lock, an appended log), a
    symbolic link planted at its name would make the write land in the link's target, anywhere the job's user
    can write; a FIFO would block the job. Such an entry (or a folder) is refused with
    :class:`NotAPlainFileError` naming it and what it is; nothing is written. Only the last part of ``path``
    is checked: a results folder that is itself a link (to a bigger disk) is fine. ``O_CREAT`` in ``flags``
    creates a missing file with the user's umask.
    """
    try:
        handle = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        raise NotAPlainFileError(_refusal(path, what)) from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise NotAPlainFileError(_refusal(path, what))
    os.set_blocking(handle, True)
    return handle


def _refusal(path: str | Path, what: str) -> str:
    """Why ``path`` was not opened: what sits there instead of a plain file, and what to do."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = 0
    if stat.S_ISLNK(mode):
        kind = f"a symbolic link (to {os.readlink(path)})"
    else:
        kind = next((name for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                                             (stat.S_ISSOCK, "a socket")) if test(mode)), "not a plain file")
    return (f"{path}: {what} is {kind}; it is never written through (the write would land elsewhere). "
            "Remove it and rerun")


def safe_name(name, where: str) -> str:
    """``name`` if it is one plain file name (no folder, no ``.``/``..``), else an error naming ``where``."""
    if not isinstance(name, str):
        raise UnsafePathError(f"{where}: name must be a string, got {type(name).__name__} {name!r}")
    if name in (".", "..") or not _SAFE_PART.fullmatch(name):
        raise UnsafePathError(
            f"{where}: unsafe name {name!r} (allowed: one file name of letters, digits, '_', '.', '-')"
        )
    return name


def safe_relative_name(name, where: str) -> str:
    """``name`` if it is a relative ``/``-separated path of safe names, else an error naming ``where``."""
    if not isinstance(name, str):
        raise UnsafePathError(f"{where}: path must be a string, got {type(name).__name__} {name!r}")
    if name.startswith("/") or os.path.isabs(name):
        raise UnsafePathError(f"{where}: absolute path {name!r} not allowed")
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafePathError(f"{where}: path {name!r} has an empty, '.' or '..' part")
    for part in parts:
        if not _SAFE_PART.fullmatch(part):
            raise UnsafePathError(
                f"{where}: unsafe path {name!r} (allowed: letters, digits, '_', '.', '-' and '/' between names)"
            )
    return name


def inside(root: str | Path, path: str | Path, where: str) -> Path:
    """``path`` resolved (symlinks followed); an error naming ``where`` if that is not under ``root``."""
    real_root = Path(root).resolve()
    real_path = Path(path).resolve()
    if not real_path.is_relative_to(real_root):
        raise UnsafePathError(f"{where}: {path} resolves to {real_path}, outside {real_root}")
    return real_path


def replace_entry(destination: str | Path, create: Callable[[Path], object]) -> None:
    """Make ``destination`` by creating a fresh temporary entry beside it and renaming it over.

    ``create(tmp)`` writes to (or replaces) a new, empty file that only we
    created. Whatever sat at ``destination`` (a stale file, or a symlink
    planted to point outside) is replaced as a directory entry: a link's
    target is never written to nor deleted. The file gets the usual mode
    (0666 less the umask), not mkstemp's 0600.
    """
    destination = Path(destination)
    handle, name = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".tmp")
    os.close(handle)
    tmp = Path(name)
    try:
        os.chmod(tmp, user_file_mode())
        create(tmp)
        os.replace(tmp, destination)
    finally:
        if os.path.lexists(tmp):
            tmp.unlink()


def fsync_directory(directory: str | Path) -> None:
    """Make a rename or link inside ``directory`` durable (a node crash cannot undo it)."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


@contextlib.contextmanager
def atomic_path(path: str | Path, replace: bool = True) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on success it becomes ``path``.

    The data is fsynced before the rename and the directory after it. With
    ``replace=False`` an existing ``path`` is never overwritten (the file is
    published with a hard link, which fails if the name exists:
    ``FileExistsError``). Leftover temporary files of earlier, killed writers
    of the same ``path`` are removed first; a failed write leaves none.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        stale.unlink(missing_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    tmp = Path(name)
    try:
        yield tmp
        with tmp.open("rb+") as written:
            os.fsync(written.fileno())
        os.chmod(tmp, user_file_mode())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
        fsync_directory(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """Write a small text file atomically (fsynced, user's umask)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def file_digests(path: str | Path, algorithms: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Hex digests of ``path`` for each algorithm, reading the file once in 1 MiB blocks."""
    digests = {algorithm: hashlib.new(algorithm) for algorithm in algorithms}
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            for digest in digests.values():
                digest.update(block)
    return {algorithm: digest.hexdigest() for algorithm, digest in digests.items()}


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    return file_digests(path, [algorithm])[algorithm]
