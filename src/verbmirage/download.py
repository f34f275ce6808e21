"""Fetch and unpack the datasets safely: resumable, verified, never half-used.

A source is an http(s) URL (resumed with HTTP Range requests), a Google
Drive id written ``gdrive:<id>`` (through gdown, which handles Drive's
confirmation pages and resumes), or a file or folder the user already has
(used in place, never copied). A configured sha256 or md5 is checked before
anything is unpacked; a file that fails it is deleted. Archives are unpacked
into a temporary folder with tarfile's ``data`` filter (no absolute paths, no
``..``, no links or devices that lead outside; zip members get the same
checks) and renamed into place with a completion marker only when the whole
archive succeeded, so a folder either is complete or does not exist.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import requests
from tqdm import tqdm

log = logging.getLogger(__name__)
COMPLETE_MARKER = ".extracted"
CHUNK = 1 << 20


class ChecksumError(ValueError):
    """A file does not have the configured checksum."""


class UnsafeArchiveError(ValueError):
    """An archive member would land outside the target folder (or is a link or device)."""


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


def file_digest(path: str | Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: str | Path, checksums: dict[str, str]) -> None:
    """Raise :class:`ChecksumError` unless every configured checksum (sha256, md5) matches."""
    for algorithm in ("sha256", "md5"):
        expected = (checksums.get(algorithm) or "").lower()
        if expected:
            actual = file_digest(path, algorithm)
            if actual != expected:
                raise ChecksumError(f"{path}: {algorithm} is {actual}, expected {expected}")


def download_http(url: str, destination: str | Path, retries: int = 5, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``destination``, resuming ``<destination>.part`` with a Range request."""
    destination = Path(destination)
    partial = destination.with_name(destination.name + ".part")
    destination.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(retries + 1):
        offset = partial.stat().st_size if partial.exists() else 0
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            with requests.get(url, headers=headers, stream=True, timeout=timeout) as response:
                if offset and response.status_code == 206:
                    mode = "ab"
                elif response.status_code == 200:
                    mode, offset = "wb", 0  # the server ignored the range: start again
                elif offset and response.status_code == 416:  # nothing left to send
                    break
                else:
                    response.raise_for_status()
                    raise requests.HTTPError(f"unexpected HTTP {response.status_code} for {url}")
                size = response.headers.get("Content-Length")
                total = offset + int(size) if size is not None else None
                with open(partial, mode) as handle, tqdm(
                    total=total, initial=offset, unit="B", unit_scale=True, desc=destination.name
                ) as progress:
                    for block in response.iter_content(CHUNK):
                        handle.write(block)
                        progress.update(len(block))
                if total is not None and partial.stat().st_size < total:
                    raise requests.ConnectionError(f"{url}: transfer ended at {partial.stat().st_size} of {total} bytes")
            break
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as error:
            if attempt == retries:
                raise
            wait = min(60, 2**attempt)
            log.warning("%s: %s; resuming in %ds (attempt %d/%d)", url, error, wait, attempt + 1, retries)
            time.sleep(wait)
    os.replace(partial, destination)
    return destination


def download_gdrive(file_id: str, destination: str | Path) -> Path:
    """A Google Drive file through gdown (confirmation pages, resume)."""
    import gdown

    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    gdown.download(id=file_id, output=str(destination), resume=True, quiet=False)
    if not destination.is_file():
        raise FileNotFoundError(f"gdrive:{file_id}: nothing was downloaded to {destination}")
    return destination


def fetch(source: str, destination: str | Path, checksums: dict[str, str] | None = None) -> Path:
    """The archive (or folder) for ``source``: downloaded to ``destination``, or the user's own path.

    A downloaded file that fails its checksum is deleted; a local one is left alone.
    """
    parsed = Source.parse(source)
    if parsed.kind == "local":
        path = Path(parsed.location).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{source}: no such file or folder")
        if path.is_file():
            verify(path, checksums or {})
        return path
    destination = Path(destination)
    if not destination.is_file():
        (download_http if parsed.kind == "http" else download_gdrive)(parsed.location, destination)
    try:
        verify(destination, checksums or {})
    except ChecksumError:
        destination.unlink()
        raise
    return destination


def _check_zip_member(info: zipfile.ZipInfo, archive: Path) -> None:
    name = PurePosixPath(info.filename)
    mode = info.external_attr >> 16
    if name.is_absolute() or ".." in name.parts or info.filename.startswith(("/", "\\")) or ":" in name.parts[0]:
        raise UnsafeArchiveError(f"{archive}: member {info.filename!r} would be written outside the target folder")
    if stat.S_ISLNK(mode):
        raise UnsafeArchiveError(f"{archive}: member {info.filename!r} is a symbolic link")


def extract(archive: str | Path, target: str | Path) -> Path:
    """Unpack ``archive`` into ``target`` once; a complete target is never unpacked again."""
    archive, target = Path(archive), Path(target)
    if (target / COMPLETE_MARKER).is_file():
        return target
    staging = target.with_name(f".{target.name}.extracting")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tar:
                for member in tar.getmembers():  # the data filter would strip the "/"; refuse instead
                    if member.name.startswith(("/", "\\")):
                        raise UnsafeArchiveError(f"{archive}: member {member.name!r} has an absolute path")
                try:
                    tar.extractall(staging, filter="data")
                except tarfile.FilterError as error:
                    raise UnsafeArchiveError(f"{archive}: {error}") from error
        elif zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zipped:
                for info in zipped.infolist():
                    _check_zip_member(info, archive)
                zipped.extractall(staging)
        else:
            raise ValueError(f"{archive}: neither a tar nor a zip archive")
        (staging / COMPLETE_MARKER).write_text(json.dumps({"archive": archive.name}))
        if target.exists():
            if any(target.iterdir()):
                shutil.rmtree(target)  # an earlier attempt without a marker: incomplete by construction
            else:
                target.rmdir()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def prepare(source: str, archive_path: str | Path, target: str | Path, checksums: dict | None = None) -> Path:
    """Fetch then unpack; a local folder source is linked as the target instead (used in place)."""
    fetched = fetch(source, archive_path, checksums)
    target = Path(target)
    if fetched.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or (target.exists() and not any(target.iterdir())):
            target.unlink() if target.is_symlink() else target.rmdir()
        target.symlink_to(fetched.resolve(), target_is_directory=True)
        return target
    return extract(fetched, target)
