"""Fetch and unpack the datasets safely: resumable, verified, never half-used.

A source is an http(s) URL (resumed with HTTP Range requests), a Google
Drive id written ``gdrive:<id>`` (through gdown, which handles Drive's
confirmation pages and resumes), or a file or folder the user already has
(used in place, never copied). What is checked, and why (docs/downloads.md):

- A configured sha256 or md5 is checked before anything is unpacked; a file
  that fails it is deleted. Without one the download is *unverified* and the
  job says so, but a transfer is still held to HTTP: a ``206`` must start at
  the offset asked for, a ``416`` must name the size we have, a body without
  a length is recorded as unverified, an HTML page is refused, and an archive
  that fails to unpack is deleted so the next run fetches it again.
- A sidecar ``<archive>.source.json`` records where the archive (or its
  ``.part``) came from, so a file fetched from another source is never reused.
- Archives are unpacked into a staging folder and renamed into place with a
  completion marker that records source, archive, size and sha256; a target
  whose marker differs is unpacked again, so a changed source or archive is
  never hidden by an old folder.
- Members are checked as they are unpacked (:mod:`verbmirage.data.archives`).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests
import urllib3
from tqdm import tqdm

from verbmirage.core.paths import file_digest, file_digests, open_plain  # noqa: F401  (file_digest is public here too)
from verbmirage.data.archives import (
    COMPLETE_MARKER,
    MAX_BYTES,
    MAX_MEMBERS,
    TAR_EXTRACTION_ALLOWED,
    TAR_PYTHONS,
    TAR_SUFFIXES,
    CorruptArchiveError,
    TarRefusedError,
    UnsafeArchiveError,
    _clear,
    _read_json,
    _write_json,
    extract,
    read_marker,
)

log = logging.getLogger(__name__)
CHUNK = 1 << 20
TRANSIENT_STATUS = {429, 500, 502, 503, 504}


class ChecksumError(ValueError):
    """A file does not have the configured checksum."""


class DownloadError(RuntimeError):
    """A download that cannot complete: the message names the download and the URL."""


class _Transient(DownloadError):
    """A server error worth retrying (429, 5xx)."""


@dataclass(frozen=True)
class Source:
    kind: str  # "http", "gdrive" or "local"
    location: str

    @classmethod
    def parse(cls, text: str) -> "Source":
        if text.startswith(("http://", "https://")):
            return cls("http", text)
        if text.startswith("gdrive:"):
            return cls("gdrive", text.removeprefix("gdrive:"))
        return cls("local", text)


def verify(path: str | Path, checksums: dict[str, str]) -> dict[str, str]:
    """Raise :class:`ChecksumError` unless every configured checksum (sha256, md5) matches.

    Returns the digests it computed, sha256 always (the completion marker records it).
    """
    wanted = {algorithm: (checksums.get(algorithm) or "").lower() for algorithm in ("sha256", "md5")}
    digests = file_digests(path, ["sha256"] + (["md5"] if wanted["md5"] else []))
    for algorithm, expected in wanted.items():
        if expected and digests[algorithm] != expected:
            raise ChecksumError(f"{path}: {algorithm} is {digests[algorithm]}, expected {expected}")
    return digests


def _matches(path: Path, checksums: dict[str, str]) -> bool:
    try:
        verify(path, checksums)
    except ChecksumError:
        return False
    return True


def _sidecar(archive: Path) -> Path:
    """Where the source of ``archive`` (and of its ``.part``) is recorded."""
    return archive.with_name(archive.name + ".source.json")


def _partial(archive: Path) -> Path:
    return archive.with_name(archive.name + ".part")


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*$", re.IGNORECASE)


def _content_range(value: str | None) -> tuple[int | None, int | None] | None:
    """``(start, total)`` of a Content-Range header (None for ``*``), or None when absent or malformed."""
    match = _CONTENT_RANGE.match(value or "")
    if not match:
        return None
    start = int(match.group(1)) if match.group(1) is not None else None
    total = int(match.group(3)) if match.group(3) != "*" else None
    return start, total


def download_http(
    url: str,
    destination: str | Path,
    retries: int = 5,
    timeout: float = 60.0,
    *,
    name: str | None = None,
    backoff: float = 1.0,
) -> Path:
    """Download ``url`` to ``destination``, resuming ``<destination>.part`` with Range requests.

    The sidecar records the source, the server's validators (ETag or
    Last-Modified, sent back as If-Range so a changed file restarts from
    zero), the announced size and whether the size could be checked. A
    ``.part`` from another source is discarded. A response that does not fit
    what was asked (a ``206`` from another offset or of another size, a
    ``416`` that does not name our size) discards the part and starts again.
    """
    destination = Path(destination)
    label = f"download {name or destination.name}: {url}"
    partial, sidecar = _partial(destination), _sidecar(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    state = _read_json(sidecar) if partial.exists() else {}
    if state.get("source") != url or state.get("complete"):
        if partial.exists():
            log.warning("%s: %s was started from %s; starting again", label, partial, state.get("source"))
        partial.unlink(missing_ok=True)
        state = {"source": url}
    _write_json(sidecar, state)  # before the first byte, so a .part always names its source
    for attempt in range(retries + 1):
        offset = partial.stat().st_size if partial.exists() else 0
        headers = {"Accept-Encoding": "identity"}  # the bytes of the file, not a re-compressed stream
        if offset:
            headers["Range"] = f"bytes={offset}-"
            validator = state.get("etag") or state.get("last_modified")
            if validator:
                headers["If-Range"] = validator
        try:
            with requests.get(url, headers=headers, stream=True, timeout=timeout) as response:
                status = response.status_code
                if status == 416 and offset:
                    announced = _content_range(response.headers.get("Content-Range"))
                    if announced and announced[1] == offset and state.get("total") in (None, offset):
                        state.update(total=offset, length_verified=True)
                        break  # the part already is the whole file
                    log.warning("%s: answered 416 with Content-Range %r, which does not match the %d bytes "
                                "of %s; starting again", label, response.headers.get("Content-Range"), offset, partial)
                    partial.unlink()
                    continue
                if status == 206:
                    announced = _content_range(response.headers.get("Content-Range"))
                    start, total = announced if announced else (None, None)
                    known_total = state.get("total")
                    if start != offset or (known_total is not None and total not in (None, known_total)):
                        log.warning("%s: asked for bytes %d- and got Content-Range %r; starting again", label,
                                    offset, response.headers.get("Content-Range"))
                        partial.unlink(missing_ok=True)
                        continue
                    mode = "ab"
                elif status == 200:
                    mode, offset = "wb", 0  # no range, or the file changed (If-Range): start again
                    length = response.headers.get("Content-Length")
                    total = int(length) if length is not None and length.isdigit() else None
                    state = {"source": url}
                elif status in TRANSIENT_STATUS:
                    raise _Transient(f"{label}: HTTP {status} {response.reason}")
                else:
                    raise DownloadError(f"{label}: HTTP {status} {response.reason}")
                if response.headers.get("Content-Type", "").lower().startswith("text/html"):
                    partial.unlink(missing_ok=True)
                    raise DownloadError(f"{label}: the server sent an HTML page, not an archive (a login, quota or "
                                        f"confirmation page?); check the URL")
                etag = response.headers.get("ETag")
                state.update(
                    total=total if total is not None else state.get("total"),
                    etag=etag if etag and not etag.startswith("W/") else None,  # If-Range needs a strong ETag
                    last_modified=response.headers.get("Last-Modified"),
                )
                _write_json(sidecar, state)
                flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "ab" else os.O_TRUNC)
                with os.fdopen(open_plain(partial, flags, "a partial download"), mode) as handle, tqdm(
                    total=state["total"], initial=offset, unit="B", unit_scale=True, desc=destination.name
                ) as progress:
                    for block in response.raw.stream(CHUNK, decode_content=False):
                        handle.write(block)
                        progress.update(len(block))
            size = partial.stat().st_size
            if state["total"] is None:
                log.warning("%s: the server sent no length; the transfer cannot be checked for completeness", label)
                state["length_verified"] = False
                break
            if size < state["total"]:
                raise requests.ConnectionError(f"transfer ended at {size} of {state['total']} bytes")
            if size > state["total"]:
                log.warning("%s: got %d bytes, more than the %d announced; starting again", label, size, state["total"])
                partial.unlink()
                continue
            state["length_verified"] = True
            break
        except requests.TooManyRedirects as error:
            raise DownloadError(f"{label}: redirects in a loop ({error}); check the URL") from error
        except (
            requests.ConnectionError,
            requests.Timeout,
            requests.exceptions.ChunkedEncodingError,
            urllib3.exceptions.HTTPError,
            _Transient,
        ) as error:
            if attempt == retries:
                raise DownloadError(f"{label}: gave up after {retries + 1} attempts: {error}") from error
            wait = min(60.0, backoff * 2**attempt)
            log.warning("%s: %s; resuming in %.0fs (attempt %d/%d)", label, error, wait, attempt + 1, retries)
            time.sleep(wait)
    else:
        raise DownloadError(f"{label}: no consistent answer in {retries + 1} attempts")
    os.replace(partial, destination)
    state.update(complete=True, size=destination.stat().st_size)
    _write_json(sidecar, state)
    return destination


def download_gdrive(file_id: str, destination: str | Path, *, name: str | None = None) -> Path:
    """A Google Drive file through gdown (confirmation pages, resume); the sidecar records the id."""
    import gdown

    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    source, sidecar = f"gdrive:{file_id}", _sidecar(destination)
    if _read_json(sidecar).get("source") != source:  # gdown resumes <name>XXXXXXXX.part: not another file's
        for stale in destination.parent.glob(f"{glob.escape(destination.name)}*.part"):
            stale.unlink()
        _write_json(sidecar, {"source": source})
    gdown.download(id=file_id, output=str(destination), resume=True, quiet=False)
    if not destination.is_file():
        raise DownloadError(f"download {name or destination.name}: {source}: nothing was downloaded to {destination}")
    _write_json(sidecar, {"source": source, "complete": True, "size": destination.stat().st_size,
                          "length_verified": False})
    return destination


@dataclass(frozen=True)
class Fetched:
    """What :func:`fetch` found or brought, and how far it could be checked."""

    path: Path
    local: bool  # the user's own file or folder: never deleted
    sha256: str | None  # None for a folder
    checksum_verified: bool  # a configured sha256/md5 matched
    length_verified: bool  # the transfer's size was announced and matched (always true for local files)


def _fetch(source: str, destination: Path, checksums: dict[str, str], name: str) -> Fetched:
    parsed = Source.parse(source)
    configured = any(checksums.get(algorithm) for algorithm in ("sha256", "md5"))
    if parsed.kind == "local":
        path = Path(parsed.location).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"download {name}: {source}: no such file or folder")
        if path.is_dir():
            return Fetched(path, True, None, False, True)
        return Fetched(path, True, verify(path, checksums)["sha256"], configured, True)
    sidecar = _sidecar(destination)
    record = _read_json(sidecar)
    if destination.exists() and not (
        record.get("source") == source and record.get("complete") and record.get("size") == destination.stat().st_size
    ):
        if not record and configured and _matches(destination, checksums):
            log.info("download %s: %s has no record but matches the configured checksum; using it", name, destination)
            record = {"source": source, "complete": True, "size": destination.stat().st_size}
        else:
            log.warning("download %s: %s was not fetched from %s (its record says %r); fetching again",
                        name, destination, source, record.get("source"))
            destination.unlink()
    if not destination.is_file():
        if parsed.kind == "http":
            download_http(parsed.location, destination, name=name)
        else:
            download_gdrive(parsed.location, destination, name=name)
        record = _read_json(sidecar)
    try:
        digests = verify(destination, checksums)
    except ChecksumError:
        destination.unlink()
        sidecar.unlink(missing_ok=True)
        raise
    record.update(source=source, complete=True, size=destination.stat().st_size, sha256=digests["sha256"])
    _write_json(sidecar, record)
    return Fetched(destination, False, digests["sha256"], configured, bool(record.get("length_verified")))


def fetch(source: str, destination: str | Path, checksums: dict[str, str] | None = None, *,
          name: str | None = None) -> Path:
    """The archive (or folder) for ``source``: downloaded to ``destination``, or the user's own path.

    A file already at ``destination`` is reused only if its sidecar says it
    came, complete, from this same source. A downloaded file that fails its
    checksum is deleted; a local one is left alone.
    """
    destination = Path(destination)
    return _fetch(source, destination, checksums or {}, name or destination.name).path


def _blames_archive(error: BaseException) -> bool:
    """Whether an extraction failure says the archive is bad (not the Python, the disk or the user)."""
    if isinstance(error, TarRefusedError):
        return False
    if isinstance(error, OSError):
        return error.errno is None
    return isinstance(error, (UnsafeArchiveError, CorruptArchiveError))


def _link_folder(folder: Path, target: Path, name: str) -> Path:
    """Use the user's ``folder`` in place: ``target`` becomes a link to it."""
    folder = folder.resolve()
    where = target.parent.resolve() / target.name  # the link's own place, not what it points to
    if folder == where or folder in where.parents or where in folder.parents:
        raise ValueError(f"download {name}: the source folder {folder} overlaps its target {target}")
    if target.is_symlink() and target.resolve() == folder:
        return target
    _clear(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(folder, target_is_directory=True)
    return target


def prepare(
    source: str,
    archive_path: str | Path,
    target: str | Path,
    checksums: dict | None = None,
    *,
    name: str | None = None,
    max_bytes: int = MAX_BYTES,
    max_members: int = MAX_MEMBERS,
) -> Path:
    """Fetch then unpack (a local folder source is linked as the target instead: used in place).

    ``name`` (default: the target's folder name) is the download's name in
    messages. Without a configured checksum the source is unverified: the
    job warns, with the sha256 to pin, and a downloaded archive that fails to
    unpack is deleted so that the next run fetches it again.
    """
    target, archive_path = Path(target), Path(archive_path)
    name = name or target.name
    checksums = {key: value for key, value in (checksums or {}).items() if value}
    parsed = Source.parse(source)
    local = Path(parsed.location).expanduser() if parsed.kind == "local" else None
    file_name = local.name if local is not None else archive_path.name
    if not TAR_EXTRACTION_ALLOWED and file_name.lower().endswith(TAR_SUFFIXES) and not (local and local.is_dir()):
        raise TarRefusedError(
            f"download {name}: {file_name} is a tar archive, and tar archives are refused on Python "
            f"{sys.version.split()[0]}: its tarfile 'data' filter can be bypassed (CVE-2025-4517). Use Python "
            f"{TAR_PYTHONS}, or unpack it yourself and give the folder as the source"
        )
    fetched = _fetch(source, archive_path, checksums, name)
    if fetched.path.is_dir():
        return _link_folder(fetched.path, target, name)
    if not fetched.checksum_verified and not fetched.local:
        log.warning("download %s: no sha256/md5 is configured, so %s is unverified (a wrong or truncated file only "
                    "shows when it fails to unpack); to pin what was fetched, add sha256: %s to downloads.%s",
                    name, source, fetched.sha256, name)
    try:
        return extract(fetched.path, target, source=source, sha256=fetched.sha256,
                       max_bytes=max_bytes, max_members=max_members, name=name)
    except Exception as error:
        if not fetched.local and not fetched.checksum_verified and _blames_archive(error):
            log.warning("download %s: %s could not be unpacked; deleting it so that the next run fetches it again",
                        name, fetched.path)
            fetched.path.unlink(missing_ok=True)
            _sidecar(fetched.path).unlink(missing_ok=True)
        raise


def completion_record(source: str, target: str | Path) -> dict:
    """What a finished :func:`prepare` left at ``target``: its marker, or the folder it links to."""
    target = Path(target)
    if target.is_symlink():
        return {"source": source, "folder": str(target.resolve())}
    record = read_marker(target)
    if not record:
        raise FileNotFoundError(f"{target}: no completion marker {COMPLETE_MARKER}; prepare() did not finish")
    return record
