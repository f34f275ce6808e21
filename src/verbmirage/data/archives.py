"""Unpack downloaded archives safely (docs/downloads.md): into a staging folder renamed into place with a
completion marker recording source, archive, size and sha256 (:func:`extract`, :func:`read_marker`).

Members must be regular files or folders (links, devices and sparse files are refused: the datasets have
none), stay inside the target, and stay under a member count and a total size; zip entries must not overlap.
Tar archives are only unpacked on a Python whose ``data`` filter is fixed (CVE-2025-4517 and its siblings),
see :func:`tar_filter_is_fixed`.
"""

from __future__ import annotations

import errno
import json
import logging
import lzma
import os
import shutil
import stat
import struct
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from verbmirage.core.paths import file_digest, write_text

log = logging.getLogger(__name__)


COMPLETE_MARKER = ".extracted"


MAX_BYTES = 200 * 2**30  # default cap on what one archive unpacks to (HICO is 7.5 GB)


MAX_MEMBERS = 2_000_000  # default cap on its members (HICO has about 48 000)


# First release of each Python line whose tarfile "data" filter can no longer be bypassed through
# symlink chains longer than PATH_MAX and similar tricks (CVE-2025-4517, -4138, -4330, 2024-12718;
# CPython gh-135034, which also added os.path.ALLOW_MISSING). Later lines are fixed from the start.
TAR_FILTER_FIXED_IN = {
    9: (3, 9, 23),
    10: (3, 10, 18),
    11: (3, 11, 13),
    12: (3, 12, 11),
    13: (3, 13, 4),
    14: (3, 14, 0, "beta", 3),
}


TAR_PYTHONS = "3.11.13+, 3.12.11+, 3.13.4+ or 3.14+"


def tar_filter_is_fixed(version: tuple = tuple(sys.version_info)) -> bool:
    """Whether ``version`` (a ``sys.version_info``-like tuple) has the fixed tarfile ``data`` filter.

    Release levels compare as strings ("alpha" < "beta" < "candidate" < "final"),
    so a plain tuple comparison also orders pre-releases.
    """
    version = tuple(version)
    if version[0] != 3 or version[1] < min(TAR_FILTER_FIXED_IN):
        return version[0] > 3
    if version[1] > max(TAR_FILTER_FIXED_IN):
        return True
    return version >= TAR_FILTER_FIXED_IN[version[1]]


# A distribution may backport the fix without a new version number; the fix added ALLOW_MISSING.
TAR_EXTRACTION_ALLOWED = tar_filter_is_fixed() or hasattr(os.path, "ALLOW_MISSING")


class UnsafeArchiveError(ValueError):
    """An archive member would land outside the target folder, is a link or device, or exceeds a cap."""


class TarRefusedError(UnsafeArchiveError):
    """A tar archive on a Python whose tarfile ``data`` filter can be bypassed."""


class CorruptArchiveError(ValueError):
    """A file that is not a readable tar or zip archive (often a truncated or wrong download)."""


def _check_name(archive: Path, name: str) -> None:
    path = PurePosixPath(name)
    if (
        not name
        or name.startswith(("/", "\\"))
        or path.is_absolute()
        or ".." in path.parts
        or (path.parts and ":" in path.parts[0])  # a drive letter
    ):
        raise UnsafeArchiveError(f"{archive}: member {name!r} would be written outside the target folder")


def _check_caps(archive: Path, members: int, size: int, caps: dict[str, int], key: str) -> None:
    """``caps`` holds max_members and max_bytes; ``key`` is where they are configured (for the message)."""
    if members > caps["max_members"]:
        raise UnsafeArchiveError(f"{archive}: more than {caps['max_members']} members (cap {key}max_members); "
                                 f"raise the cap if the archive is genuine")
    if size > caps["max_bytes"]:
        raise UnsafeArchiveError(f"{archive}: unpacks to more than {caps['max_bytes']} bytes (cap {key}max_bytes); "
                                 f"raise the cap if the archive is genuine")


def _tar_members(tar: tarfile.TarFile, archive: Path, caps: dict[str, int], key: str) -> tuple[list, int]:
    """Every member, checked, read one by one so that a cap stops the scan early."""
    members, size = [], 0
    for member in tar:
        _check_name(archive, member.name)
        if member.issym() or member.islnk():
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} is a link (to {member.linkname!r}); "
                                     f"links are refused")
        if member.issparse() or not (member.isfile() or member.isdir()):
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} is not a regular file or folder")
        members.append(member)
        size += member.size
        _check_caps(archive, len(members), size, caps, key)
    return members, size


_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # signature, versions/flags/method/time/date, crc, sizes, name/extra lengths


def _zip_members(zipped: zipfile.ZipFile, archive: Path, caps: dict[str, int], key: str) -> tuple[list, int]:
    """Every entry, checked: names, types, caps, and no two entries sharing bytes (the overlap bomb)."""
    infos = zipped.infolist()
    _check_caps(archive, len(infos), 0, caps, key)
    size = 0
    for info in infos:
        _check_name(archive, info.filename)
        kind = stat.S_IFMT(info.external_attr >> 16)
        if kind == stat.S_IFLNK:
            raise UnsafeArchiveError(f"{archive}: member {info.filename!r} is a link; links are refused")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise UnsafeArchiveError(f"{archive}: member {info.filename!r} is not a regular file or folder")
        size += info.file_size
    _check_caps(archive, len(infos), size, caps, key)
    ordered = sorted(infos, key=lambda info: info.header_offset)
    with open(archive, "rb") as handle:
        for info, following in zip(ordered, ordered[1:] + [None]):
            handle.seek(info.header_offset)
            header = handle.read(_LOCAL_HEADER.size)
            if len(header) < _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
                raise CorruptArchiveError(f"{archive}: member {info.filename!r} has no local header")
            name_length, extra_length = _LOCAL_HEADER.unpack(header)[-2:]
            end = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length + info.compress_size
            limit = following.header_offset if following is not None else zipped.start_dir
            if end > limit:
                raise UnsafeArchiveError(f"{archive}: member {info.filename!r} overlaps the next entry "
                                         f"(a zip bomb?)")
    return infos, size


def _check_space(archive: Path, size: int, folder: Path) -> None:
    free = shutil.disk_usage(folder).free
    if size > free:
        raise OSError(errno.ENOSPC, f"{archive} unpacks to {size} bytes but {folder} has {free} free")


def read_marker(target: str | Path) -> dict:
    """The completion record of an unpacked ``target`` (empty if it is not complete, or is a link)."""
    target = Path(target)
    if target.is_symlink():
        return {}
    return _read_json(target / COMPLETE_MARKER)


def _clear(target: Path) -> None:
    """Remove what is at ``target`` (a link itself, never what it points to)."""
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)


def extract(
    archive: str | Path,
    target: str | Path,
    *,
    source: str | None = None,
    sha256: str | None = None,
    max_bytes: int = MAX_BYTES,
    max_members: int = MAX_MEMBERS,
    name: str | None = None,
) -> Path:
    """Unpack ``archive`` into ``target``, unless ``target`` already holds exactly this archive.

    The marker records ``source`` (default: the archive's path), the archive's
    name, size and sha256 (computed unless given); a target whose marker
    differs in any of them is unpacked again. Every member is checked
    (:func:`_tar_members`, :func:`_zip_members`) before the first is written;
    ``name`` (a download's name) lets a cap message name its config key.
    """
    archive, target = Path(archive), Path(target)
    record = {
        "source": source if source is not None else str(archive),
        "archive": archive.name,
        "size": archive.stat().st_size,
        "sha256": sha256 or file_digest(archive, "sha256"),
    }
    if read_marker(target) == record:
        return target
    is_tar = tarfile.is_tarfile(archive)
    if is_tar and not TAR_EXTRACTION_ALLOWED:
        raise TarRefusedError(
            f"{archive}: tar archives are refused on Python {sys.version.split()[0]}: its tarfile 'data' filter "
            f"can be bypassed (CVE-2025-4517). Use Python {TAR_PYTHONS}, or unpack the archive yourself and "
            f"give the folder as the source"
        )
    caps, key = {"max_bytes": max_bytes, "max_members": max_members}, (f"downloads.{name}." if name else "")
    staging = target.with_name(f".{target.name}.extracting")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        try:
            if is_tar:
                with tarfile.open(archive) as tar:
                    members, size = _tar_members(tar, archive, caps, key)
                    _check_space(archive, size, staging)
                    try:
                        tar.extractall(staging, members=members, filter="data")
                    except tarfile.FilterError as error:
                        raise UnsafeArchiveError(f"{archive}: {error}") from error
            elif zipfile.is_zipfile(archive):
                with zipfile.ZipFile(archive) as zipped:
                    infos, size = _zip_members(zipped, archive, caps, key)
                    _check_space(archive, size, staging)
                    zipped.extractall(staging, members=infos)
            else:
                raise CorruptArchiveError(f"{archive}: neither a tar nor a zip archive (an HTML page, or a "
                                          f"truncated download?)")
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError) as error:
            raise CorruptArchiveError(f"{archive}: cannot be unpacked ({type(error).__name__}: {error}); "
                                      f"a truncated or wrong download?") from error
        except OSError as error:
            if error.errno is not None:
                raise
            raise CorruptArchiveError(f"{archive}: cannot be unpacked ({type(error).__name__}: {error}); "
                                      f"a truncated or wrong download?") from error
        _write_json(staging / COMPLETE_MARKER, record)
        _clear(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def _read_json(path: Path) -> dict:
    """A record (sidecar, completion marker); an unreadable one counts as none, so its download or unpacking
    is done again."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        log.warning("%s: unreadable record (%s: %s); treated as absent, so it is fetched or unpacked again", path,
                    type(error).__name__, error)
        return {}
    if not isinstance(data, dict):
        log.warning("%s: not a record (a JSON object); treated as absent, so it is fetched or unpacked again", path)
        return {}
    return data


def _write_json(path: Path, data: dict) -> None:
    """Write atomically, so a crash never leaves half a record."""
    write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
