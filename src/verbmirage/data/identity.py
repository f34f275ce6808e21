"""A dataset's identity, for every artifact built from it (README, "Several configs in one checkout").

An identity is a small JSON-able dict: the root as configured (a relative root stays relative, so two
checkouts agree), a SHA-256 of each annotation file the workflow reads (``anno.mat``, ``anno_bbox.mat`` or
``instances_test2015.json``, the CharadesEgo CSVs and class files, Pangea's pickles) and a digest of each
image or video folder's *listing*: every file's path relative to the folder and its size. The rules take it
as a Snakemake param (``identity``), and a changed param reruns the job: a changed root, a changed
annotation or an added, removed or resized image rebuilds what depends on it, even when the data was
replaced under the same path with older modification times (``tar x``, ``cp -a`` and ``rsync -a`` keep the
archive's dates, so Snakemake's own rule, "an input newer than the output", sees nothing). A missing file or
folder counts as ``None``: the data a download or the demo brings is absent when the run is planned, and
Snakemake evaluates the params again just before the job runs, so the identity it records is the real one.

Images: contents, cheaply (ours). A listing row is an image's path, its size and its *content version*
(:class:`ContentVersions`): a counter kept per file in a cache under ``resources/cache/contents/``, with the
file's stat stamp (size, inode, modification and change time) and, once some job has read the file, the
SHA-256 of its content. The version moves only when the content is seen to change: a file whose stamp
still matches its cache entry is not read at all (planning lists the real HICO's 47,774 images in a
fraction of a second), and one whose stamp moved is hashed again and compared with the digest on record.
The change time (``st_ctime_ns``) is set by the kernel whenever a file is written or its dates are set, and no
user tool (``touch``, ``tar x``, ``cp -a``, ``rsync -a``) can set it back, so an image rewritten in place
with its old name, size and dates is seen; a ``touch``, or a copy of the same bytes, moves the stamp but
not the version, and rebuilds nothing. The image stage (:mod:`verbmirage.benchmark.conditions`) records
the digest of each image it is asked about, so a later change to one is compared, not guessed; a file no job
has read yet has no digest on record, and a moved stamp there moves its version (it may have changed). The
version rows are written only when non-zero, so a folder whose files never changed lists as it did before
versions existed.

Annotation files are hashed in full (anno.mat is 30 MB) once per Snakemake process, and never cached on
disk. Within one process, a file's digest and a folder's listing are reused while their ``stat`` stamp
(device, inode, size, modification *and change* time) is unchanged, so a file the run itself writes (the demo
data, a download) is read again. A folder's stamp covers the folder and its sub-folders (HICO: ``images/``
and ``images/{train,test}2015/``): an image swapped in place while one Snakemake runs leaves those alone and
is seen by the next plan. Measured on a HICO-sized tree (47,774 files, a 30 MB anno.mat): listing 0.23 s,
digest 0.03 s (0.5 s in all with a 10 MB anno_bbox.mat, first call), once per plan.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from pathlib import Path

from verbmirage.core.paths import atomic_path
from verbmirage.data.hico_files import HICO_DET_MAT, hico_det_file

log = logging.getLogger(__name__)

#: Depth of the folders whose stat stamps key the in-process listing memo: 1, the folder and its sub-folders.
_STAMP_DEPTH = 1
_digests: dict[tuple, str] = {}
_listings: dict[tuple, dict] = {}


def _stamp(stat: os.stat_result) -> tuple:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def file_digest(path: str | Path) -> str | None:
    """The SHA-256 of a file's content (hex), or None when there is no such file."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    if not os.path.isfile(path):
        return None
    key = (str(path), *_stamp(stat))
    if key not in _digests:
        with open(path, "rb") as handle:
            _digests[key] = hashlib.file_digest(handle, "sha256").hexdigest()
    return _digests[key]


def _folder_stamp(folder: Path, depth: int) -> tuple:
    """Stat stamps of ``folder`` and its sub-folders down to ``depth`` (links followed)."""
    stamps = [(str(folder), *_stamp(folder.stat()))]
    if depth:
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir():
                    stamps.extend(_folder_stamp(Path(entry.path), depth - 1))
    return tuple(stamps)


def folder_listing(folder: str | Path, versions: ContentVersions | None = None) -> dict | None:
    """``{"files", "bytes", "sha256"}`` of every file under ``folder`` (links followed, dot files skipped):
    the digest covers each file's path relative to ``folder``, its size and, with ``versions``, its content
    version (:class:`ContentVersions`; whatever ``versions`` learns is saved before this returns). None when
    there is no such folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    key = (_folder_stamp(folder, _STAMP_DEPTH), None if versions is None else str(versions.cache_dir))
    if key not in _listings:
        rows, seen, total = [], set(), 0

        def walk(directory: Path, prefix: str) -> None:
            nonlocal total
            stat = directory.stat()
            if (stat.st_dev, stat.st_ino) in seen:  # a link back up the tree
                return
            seen.add((stat.st_dev, stat.st_ino))
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    if entry.is_dir():
                        walk(Path(entry.path), f"{prefix}{entry.name}/")
                    elif entry.is_file():
                        stat = entry.stat()
                        version = versions.version(Path(entry.path), stat) if versions is not None else 0
                        rows.append(f"{prefix}{entry.name}\t{stat.st_size}" + (f"\t{version}" if version else ""))
                        total += stat.st_size

        walk(folder, "")
        if versions is not None:
            versions.save()
        rows.sort()
        digest = hashlib.sha256("".join(row + "\n" for row in rows).encode())
        _listings[key] = {"files": len(rows), "bytes": total, "sha256": digest.hexdigest()}
    return dict(_listings[key])


class ContentVersions:
    """Each file's content version, kept in ``cache_dir`` (one JSON file per folder of files) across processes.

    An entry is the file's stat stamp (size, inode, modification and change time, in nanoseconds), the SHA-256
    of its content once known, and its version. :meth:`version` (planning) reads no file whose stamp matches
    its entry; :meth:`digest` (a job that reads the file anyway) hashes it once and records the digest. A moved
    stamp is checked against the recorded digest: the version moves when the content differs, or when no
    digest was recorded (unknown, so assumed changed). The device is left out of the stamp: a shared file
    system may number it differently on each host. Writes (:meth:`save`) merge with what other processes
    saved meanwhile, under a lock, keeping the higher version of each file.
    """

    def __init__(self, cache_dir: str | Path):
        self.cache_dir = Path(cache_dir)
        self._folders: dict[str, dict[str, list]] = {}  # real folder -> file name -> entry
        self._changed: dict[str, set[str]] = {}  # real folder -> names whose entry this process changed

    def version(self, path: Path, stat: os.stat_result) -> int:
        """The content version of ``path`` (``stat``: its ``os.stat``, links followed)."""
        return self._refresh(Path(path), stat, need_digest=False)[1]

    def digest(self, path: str | Path) -> str:
        """The SHA-256 of ``path``'s content, read only when its stamp moved since it was last hashed."""
        return self._refresh(Path(path), os.stat(path), need_digest=True)[0]

    def _refresh(self, path: Path, stat: os.stat_result, need_digest: bool) -> tuple[str | None, int]:
        real = os.path.realpath(path.parent)
        entries = self._entries(real)
        stamp = [stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns]
        entry = entries.get(path.name)
        if entry is not None and entry[:4] == stamp:
            if not need_digest or entry[4] is not None:
                return entry[4], entry[5]
            entry = [*stamp, _sha256(path), entry[5]]
        elif entry is None:
            entry = [*stamp, _sha256(path) if need_digest else None, 0]
        elif entry[4] is not None:  # moved: compare with the content on record
            digest = _sha256(path)
            entry = [*stamp, digest, entry[5] + (digest != entry[4])]
        else:  # moved, and the old content was never read: it may have changed
            entry = [*stamp, _sha256(path) if need_digest else None, entry[5] + 1]
        entries[path.name] = entry
        self._changed.setdefault(real, set()).add(path.name)
        return entry[4], entry[5]

    def _entries(self, real: str) -> dict[str, list]:
        if real not in self._folders:
            self._folders[real] = self._load(real)
        return self._folders[real]

    def _file(self, real: str) -> Path:
        return self.cache_dir / f"{hashlib.sha256(real.encode()).hexdigest()[:24]}.json"

    def _load(self, real: str) -> dict[str, list]:
        path = self._file(real)
        try:
            stored = json.loads(path.read_text())
            if stored["folder"] != real:
                return {}
            return {name: list(entry) for name, entry in stored["files"].items() if _valid_entry(entry)}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("%s: unreadable content cache (%s: %s); its files are read again as they change", path,
                        type(error).__name__, error)
            return {}

    def save(self) -> None:
        """Write the entries this process changed, merged into what the cache holds now. A cache that cannot be
        written (a read-only checkout) is said in the log; this process's versions stand, later ones are
        learned again."""
        for real, names in self._changed.items():
            path = self._file(real)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with _exclusive(path.with_suffix(".lock")):
                    stored = self._load(real)
                    for name in names:
                        mine, theirs = self._folders[real][name], stored.get(name)
                        if theirs is None or (mine[5], mine[4] is not None) >= (theirs[5], theirs[4] is not None):
                            stored[name] = mine
                    with atomic_path(path) as tmp:
                        tmp.write_text(json.dumps({"folder": real, "files": stored}, separators=(",", ":")))
            except OSError as error:
                log.warning("%s: the content cache cannot be written (%s: %s)", path, type(error).__name__, error)
                continue
            self._folders[real] = stored
        self._changed.clear()


def _valid_entry(entry) -> bool:
    return (isinstance(entry, list) and len(entry) == 6 and all(isinstance(v, int) for v in entry[:4] + entry[5:])
            and (entry[4] is None or isinstance(entry[4], str)))


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@contextlib.contextmanager
def _exclusive(lock: Path):
    """Wait for, then hold, an OS lock on ``lock`` (never a link: O_NOFOLLOW)."""
    handle = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def hico_annotations(root: str) -> dict:
    """HICO's labels: the root as configured and ``anno.mat``'s digest."""
    return {"root": root, "anno.mat": file_digest(Path(root) / "anno.mat")}


def hico_images(root: str, versions: ContentVersions | None = None) -> dict:
    """HICO's images: the root as configured and the listing of ``images/`` (train2015 and test2015)."""
    return {"root": root, "images": folder_listing(Path(root) / "images", versions)}


def hico_boxes(det_root: str) -> dict:
    """HICO-DET's boxes: the folder as configured and the digest of the file read from it (``anno_bbox.mat``,
    else ``instances_test2015.json``); empty without a ``det_root``."""
    if not det_root:
        return {}
    path = hico_det_file(det_root) or Path(det_root) / HICO_DET_MAT
    return {"det_root": det_root, path.name: file_digest(path)}


def charades(root: str, videos: str, versions: ContentVersions | None = None) -> dict:
    """CharadesEgo: the root, the digest of every file of ``CharadesEgo/`` (the CSVs and class files) and the
    listing of the video folder."""
    annotations = Path(root) / "CharadesEgo"
    files = sorted(p.name for p in annotations.iterdir() if p.is_file()) if annotations.is_dir() else []
    return {"root": root, "CharadesEgo": {name: file_digest(annotations / name) for name in files} or None,
            "videos": videos, "video_files": folder_listing(videos, versions)}


def pangea(settings: dict, file_keys, versions: ContentVersions | None = None) -> dict:
    """Pangea: the root, the digest of each pickle read (``file_keys`` of ``datasets.pangea``) and the listing
    of its images folder."""
    root = Path(settings["root"])
    return {"root": settings["root"], **{settings[key]: file_digest(root / settings[key]) for key in file_keys},
            "images": folder_listing(root / settings["images"], versions)}
