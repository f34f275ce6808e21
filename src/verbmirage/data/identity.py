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

Cost and caching (our choice). Image contents are not hashed: the real HICO has 47,774 images, and a
listing with sizes (one ``stat`` per file) costs a fraction of a second where hashing 40 GB would take
minutes on every plan. An image rewritten in place with the same size and name is therefore not seen (nor
is it by any tool that trusts dates). Annotation files are hashed in full (anno.mat is 30 MB)
once per Snakemake process, and never cached on disk: a cache keyed by size and modification time would be
fooled by exactly the old dates this guards against. Within one process, a file's digest and a folder's
listing are reused while their ``stat`` stamp (device, inode, size, modification *and change* time) is
unchanged; the change time (``ctime``) cannot be set back by ``utime``, so a file the run itself writes
(the demo data, a download) is read again. A folder's stamp covers the folder and its sub-folders (HICO:
``images/`` and ``images/{train,test}2015/``): an image swapped in place while one Snakemake runs leaves
those alone and is seen by the next plan. Measured on a HICO-sized tree (47,774 files, a 30 MB anno.mat):
listing 0.23 s, digest 0.03 s (0.5 s in all with a 10 MB anno_bbox.mat, first call), once per plan.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from verbmirage.data.hico import HICO_DET_MAT, hico_det_file

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


def folder_listing(folder: str | Path) -> dict | None:
    """``{"files", "bytes", "sha256"}`` of every file under ``folder`` (links followed, dot files skipped):
    the digest covers each file's path relative to ``folder`` and its size, never its content. None when
    there is no such folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    key = _folder_stamp(folder, _STAMP_DEPTH)
    if key not in _listings:
        rows, seen = [], set()

        def walk(directory: Path, prefix: str) -> None:
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
                        rows.append(f"{prefix}{entry.name}\t{entry.stat().st_size}\n")

        walk(folder, "")
        rows.sort()
        digest = hashlib.sha256("".join(rows).encode())
        _listings[key] = {"files": len(rows), "bytes": sum(int(row.rsplit("\t", 1)[1]) for row in rows),
                          "sha256": digest.hexdigest()}
    return dict(_listings[key])


def hico_annotations(root: str) -> dict:
    """HICO's labels: the root as configured and ``anno.mat``'s digest."""
    return {"root": root, "anno.mat": file_digest(Path(root) / "anno.mat")}


def hico_images(root: str) -> dict:
    """HICO's images: the root as configured and the listing of ``images/`` (train2015 and test2015)."""
    return {"root": root, "images": folder_listing(Path(root) / "images")}


def hico_boxes(det_root: str) -> dict:
    """HICO-DET's boxes: the folder as configured and the digest of the file read from it (``anno_bbox.mat``,
    else ``instances_test2015.json``); empty without a ``det_root``."""
    if not det_root:
        return {}
    path = hico_det_file(det_root) or Path(det_root) / HICO_DET_MAT
    return {"det_root": det_root, path.name: file_digest(path)}


def charades(root: str, videos: str) -> dict:
    """CharadesEgo: the root, the digest of every file of ``CharadesEgo/`` (the CSVs and class files) and the
    listing of the video folder."""
    annotations = Path(root) / "CharadesEgo"
    files = sorted(p.name for p in annotations.iterdir() if p.is_file()) if annotations.is_dir() else []
    return {"root": root, "CharadesEgo": {name: file_digest(annotations / name) for name in files} or None,
            "videos": videos, "video_files": folder_listing(videos)}


def pangea(settings: dict, file_keys) -> dict:
    """Pangea: the root, the digest of each pickle read (``file_keys`` of ``datasets.pangea``) and the listing
    of its images folder."""
    root = Path(settings["root"])
    return {"root": settings["root"], **{settings[key]: file_digest(root / settings[key]) for key in file_keys},
            "images": folder_listing(root / settings["images"])}
