"""Image conditions (paper "High-Quality and Low-Quality Images", FOV): a condition's images and their manifest.

A condition turns a source image into the image a model sees. Each one is a
registry entry ``name -> ImageCondition`` (:mod:`verbmirage.benchmark.condition_types`);
this module makes a condition's images.

A condition folder holds the images and ``manifest.parquet``
(``image`` -> ``file`` relative to the folder, ``error``, ``sha256`` of the
file a model sees); inference resolves images through the manifest, never by
rebuilding paths, and stores each answer with the digest of the image it was
asked on, so an image that changes later has exactly its questions asked again. ``clean`` links to the
source files instead of copying them. Noisy images are stored as PNG: a JPEG
would smear the exact noise the condition defines.

A condition that needs boxes (``crop``: the field-of-view study) covers only
the images it is given a box for (HICO-DET ``single_instance`` images); its
manifest lists only those and is marked partial, and inference and metrics
under it use only the questions on those images (:func:`condition_questions`).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from verbmirage.benchmark.condition_types import CONDITIONS, image_settings
from verbmirage.core.imaging import open_rgb
from verbmirage.core.io import read_schema, read_table
from verbmirage.core.paths import UnsafePathError, atomic_path, file_digest, inside, replace_entry, safe_relative_name

MANIFEST = "manifest.parquet"
SOURCE_ROOT_KEY = b"verbmirage.source_root"
PARTIAL_KEY = b"verbmirage.partial"  # the manifest covers only some images: ask only their questions


def condition_rng(seed: int, condition: str, image: str) -> np.random.Generator:
    """Per-image random stream: reruns and any image order give identical images."""
    return np.random.default_rng([seed, zlib.crc32(condition.encode()), zlib.crc32(image.encode())])


def apply_condition(
    source_root: str | Path,
    images: Iterable[str],
    out_dir: str | Path,
    condition: str,
    settings: dict,
    seed: int = 0,
    boxes: dict | None = None,
    digest: Callable[[Path], str] = file_digest,
) -> pd.DataFrame:
    """Write ``images`` (paths relative to ``source_root``) under ``out_dir``; return the manifest.

    Each manifest row holds the SHA-256 of the file a model will see (``sha256``): the source's, taken with
    ``digest`` (the workflow passes :meth:`verbmirage.data.identity.ContentVersions.digest`, which reads a
    file only when it changed since it was last hashed), or the written PNG's.

    A condition that needs boxes gets ``boxes`` (image -> (x1, y1, x2, y2))
    and covers only the images that have one; its manifest also stores
    ``crop_area_frac`` (output area / source area).

    A missing, unreadable or oversized (decompression bomb) source image, or
    one that resolves outside ``source_root``, is recorded with an ``error``
    and the others go on (the workflow's job first stops on missing images:
    :func:`require_images`). An unsafe name (absolute, ``..``, odd characters)
    or a folder under ``out_dir`` that leads outside it stops the job before
    anything is written there.
    """
    kind = settings.get("type", condition)
    if kind not in CONDITIONS:
        raise KeyError(f"conditions.{condition}.type: unknown image condition '{kind}'; known: {sorted(CONDITIONS)}")
    spec = CONDITIONS[kind]
    params = {k: v for k, v in image_settings(settings).items() if k != "type"}
    if spec.needs_boxes:
        if boxes is None:
            raise ValueError(f"conditions.{condition}: type '{kind}' needs boxes (datasets.hico.det_root)")
        images = [image for image in images if image in boxes]
    # the root as given is what the manifest records and errors name: a relative root (inside the project) keeps
    # the condition folder free of this checkout's location, so two checkouts build the same bytes
    given_root, source_root, out_dir = Path(source_root), Path(source_root).resolve(), Path(out_dir)
    targets = {}
    for image in sorted(set(images)):  # a bad name stops the job before anything is written
        where = f"condition {condition}: image {image!r}"
        target = Path(safe_relative_name(image, where))
        targets[image] = target if spec.transform is None else target.with_suffix(".png")
        inside(out_dir, out_dir / targets[image].parent, where)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for image, target in tqdm(targets.items(), desc=f"condition {condition}", unit="img"):
        source = source_root / image
        destination = out_dir / target
        inside(out_dir, destination.parent, f"condition {condition}: image {image!r}")  # again, before mkdir
        destination.parent.mkdir(parents=True, exist_ok=True)
        error, area_frac, sha256 = None, math.nan, None
        try:
            inside(source_root, source, f"condition {condition}: image {image!r}")
            if spec.transform is None:
                if not source.is_file():
                    raise FileNotFoundError(f"no such image: {given_root / image}")
                sha256 = digest(source)
                replace_entry(destination, _symlink_at(source, relative=not given_root.is_absolute()))
            else:
                original = open_rgb(source)
                extra = {"box": boxes[image]} if spec.needs_boxes else {}
                result = spec.transform(original, condition_rng(seed, condition, image), **extra, **params)
                area_frac = result.width * result.height / (original.width * original.height)
                encoded = io.BytesIO()
                result.save(encoded, format="PNG")
                sha256 = hashlib.sha256(encoded.getbuffer()).hexdigest()
                replace_entry(destination, lambda tmp: tmp.write_bytes(encoded.getbuffer()))
        except (OSError, ValueError) as failure:
            error, sha256 = f"{type(failure).__name__}: {failure}", None
        rows.append({"image": image, "file": None if error else str(target), "error": error, "sha256": sha256,
                     "crop_area_frac": area_frac})
    if rows and all(row["error"] for row in rows):  # a wrong or empty images folder, not a few bad files
        raise FileNotFoundError(f"condition {condition}: none of the {len(rows)} images could be read under "
                                f"{given_root} (check the dataset's images folder); first error: {rows[0]['error']}")
    columns = ["image", "file", "error", "sha256"] + (["crop_area_frac"] if spec.needs_boxes else [])
    manifest = pd.DataFrame(rows, columns=columns)
    _write_manifest(manifest, out_dir / MANIFEST, given_root, partial=spec.needs_boxes)
    return manifest


class MissingImagesError(FileNotFoundError):
    """Images the question sets ask about are not under the dataset's root."""


#: How many missing images a :class:`MissingImagesError` names.
MISSING_SHOWN = 5


def require_images(source_root: str | Path, images: Iterable[str], condition: str) -> None:
    """Stop when any of ``images`` (paths relative to ``source_root``) is not a file there, naming how many
    and the first :data:`MISSING_SHOWN`, before any image is written and so before any model job starts: an
    incomplete images folder would otherwise surface only as error rows of every inference job."""
    images = sorted(set(images))
    missing = [image for image in images if not (Path(source_root) / image).is_file()]
    if missing:
        shown = ", ".join(missing[:MISSING_SHOWN]) + (", ..." if len(missing) > MISSING_SHOWN else "")
        raise MissingImagesError(
            f"condition {condition}: {len(missing)} of the {len(images)} images the question sets ask about are "
            f"missing under {source_root} (first: {shown}); complete the images folder, or point the dataset's "
            "root at the complete one")


def condition_questions(questions: pd.DataFrame, condition_dir: str | Path) -> pd.DataFrame:
    """The questions asked under a condition: all, or for a partial one (``crop``) those on its images."""
    path = Path(condition_dir) / MANIFEST
    if (read_schema(path).metadata or {}).get(PARTIAL_KEY) != b"true":
        return questions
    covered = set(pd.read_parquet(path, columns=["image"]).image)
    return questions[questions.image.isin(covered)].reset_index(drop=True)


def _symlink_at(source: Path, relative: bool) -> Callable[[Path], None]:
    """For :func:`~verbmirage.core.paths.replace_entry`: swap the fresh empty file for a link to ``source`` (a real
    path), ``relative`` to the link's real folder (the project can move with its data) or absolute."""

    def create(tmp: Path) -> None:
        tmp.unlink()
        os.symlink(os.path.relpath(source, tmp.parent.resolve()) if relative else source, tmp)

    return create


def _write_manifest(manifest: pd.DataFrame, path: Path, source_root: Path, partial: bool = False) -> None:
    """The manifest, with the source root its links may point into (read back by :class:`ImageResolver`)."""
    table = pa.Table.from_pandas(manifest, preserve_index=False)
    metadata = {**(table.schema.metadata or {}), SOURCE_ROOT_KEY: str(source_root).encode(),
                PARTIAL_KEY: b"true" if partial else b"false"}
    table = table.replace_schema_metadata(metadata)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


class ImageResolver:
    """Finds the file a model sees for a question's ``image`` under one condition.

    Every path it returns stays inside the condition folder or, for the links
    of ``clean``, inside the source root recorded in the manifest: a tampered
    manifest or a planted link cannot hand a model (or an API) another file.
    """

    def __init__(self, condition_dir: str | Path):
        self.root = Path(condition_dir)
        manifest_path = self.root / MANIFEST
        manifest = read_table(manifest_path)
        source_root = (read_schema(manifest_path).metadata or {}).get(SOURCE_ROOT_KEY)
        if source_root is None:
            raise ValueError(f"{manifest_path}: no recorded source root (written by an older version); "
                             "delete the condition folder to rebuild it")
        self.source_root = Path(source_root.decode())
        self._files = {}
        for row, (image, file) in enumerate(zip(manifest.image, manifest.file)):
            if not pd.isna(file):
                safe_relative_name(file, f"{manifest_path} row {row}, column 'file'")
            self._files[image] = None if pd.isna(file) else file
        self._errors = dict(zip(manifest.image, manifest.error))
        # a manifest written before images were hashed has no digests: its answers carry none
        self._digests = dict(zip(manifest.image, manifest.sha256)) if "sha256" in manifest.columns else {}
        self._checked: dict[str, Path] = {}  # image -> its checked path: an image has many questions

    def path(self, image: str) -> Path:
        """The file for ``image``; raises ``FileNotFoundError`` naming why it is missing.

        The containment check (two ``resolve`` calls, symlinks followed) runs once per image, not once
        per question asked about it.
        """
        checked = self._checked.get(image)
        if checked is not None:
            return checked
        if image not in self._files:
            raise FileNotFoundError(f"{image} is not in {self.root / MANIFEST}")
        if self._files[image] is None:
            raise FileNotFoundError(f"{image}: {self._errors[image]}")
        path = self.root / self._files[image]
        where = f"{self.root / MANIFEST}: image {image!r}"
        try:
            inside(self.root, path, where)
        except UnsafePathError:  # a clean link: it must point into the source root
            inside(self.source_root, path, where)
        self._checked[image] = path
        return path

    def digest(self, image: str) -> str | None:
        """The SHA-256 of the file a model sees for ``image`` (None: unreadable, or not recorded)."""
        digest = self._digests.get(image)
        return None if digest is None or pd.isna(digest) else digest
