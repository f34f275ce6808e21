"""Image conditions (SPEC section 3): a registry of named image transforms.

A condition turns a source image into the image a model sees. Each one is a
registry entry ``name -> ImageCondition``; the config names a condition slug
and its ``type`` plus parameters, so ``saltpepper_50`` with probability 0.5 is
config only, and a new kind (blur, JPEG, ...) is one entry here.

A condition folder holds the images and ``manifest.parquet``
(``image`` -> ``file`` relative to the folder, ``error``); inference resolves
images through the manifest, never by rebuilding paths. ``clean`` links to the
source files instead of copying them. Noisy images are stored as PNG: a JPEG
would smear the exact noise the condition defines.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from tqdm import tqdm

from verbmirage.imaging import open_rgb
from verbmirage.io import atomic_path
from verbmirage.paths import UnsafePathError, inside, replace_entry, safe_relative_name

MANIFEST = "manifest.parquet"
SOURCE_ROOT_KEY = b"verbmirage.source_root"


@dataclass(frozen=True)
class ImageCondition:
    """``transform(image, rng, **params)`` or ``None`` for an untouched (linked) image."""

    transform: Callable[..., Image.Image] | None
    description: str


def salt_and_pepper(image: Image.Image, rng: np.random.Generator, probability: float = 0.75) -> Image.Image:
    """Replace each pixel (all channels together) with probability p, half black, half white."""
    pixels = np.array(image.convert("RGB"))
    height, width = pixels.shape[:2]
    hit = rng.random((height, width)) < probability
    white = rng.random((height, width)) < 0.5
    pixels[hit & white] = 255
    pixels[hit & ~white] = 0
    return Image.fromarray(pixels)


CONDITIONS: dict[str, ImageCondition] = {
    "clean": ImageCondition(None, "the original image"),
    "saltpepper": ImageCondition(salt_and_pepper, "salt-and-pepper noise, paper: 75% of pixels"),
}


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
) -> pd.DataFrame:
    """Write ``images`` (paths relative to ``source_root``) under ``out_dir``; return the manifest.

    A missing, unreadable or oversized (decompression bomb) source image, or
    one that resolves outside ``source_root``, is recorded with an ``error``
    and the others go on. An unsafe name (absolute, ``..``, odd characters)
    or a folder under ``out_dir`` that leads outside it stops the job before
    anything is written there.
    """
    kind = settings.get("type", condition)
    if kind not in CONDITIONS:
        raise KeyError(f"conditions.{condition}.type: unknown image condition '{kind}'; known: {sorted(CONDITIONS)}")
    spec = CONDITIONS[kind]
    params = {k: v for k, v in settings.items() if k != "type"}
    source_root, out_dir = Path(source_root).resolve(), Path(out_dir)
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
        error = None
        try:
            inside(source_root, source, f"condition {condition}: image {image!r}")
            if spec.transform is None:
                if not source.is_file():
                    raise FileNotFoundError(f"no such image: {source}")
                replace_entry(destination, _symlink_at(source))
            else:
                result = spec.transform(open_rgb(source), condition_rng(seed, condition, image), **params)
                replace_entry(destination, lambda tmp: result.save(tmp, format="PNG"))
        except (OSError, ValueError) as failure:
            error = f"{type(failure).__name__}: {failure}"
        rows.append({"image": image, "file": None if error else str(target), "error": error})
    manifest = pd.DataFrame(rows, columns=["image", "file", "error"])
    _write_manifest(manifest, out_dir / MANIFEST, source_root)
    return manifest


def _symlink_at(source: Path) -> Callable[[Path], None]:
    """For :func:`~verbmirage.paths.replace_entry`: swap the fresh empty file for a link to ``source``."""

    def create(tmp: Path) -> None:
        tmp.unlink()
        os.symlink(source, tmp)

    return create


def _write_manifest(manifest: pd.DataFrame, path: Path, source_root: Path) -> None:
    """The manifest, with the source root its links may point into (read back by :class:`ImageResolver`)."""
    table = pa.Table.from_pandas(manifest, preserve_index=False)
    metadata = {**(table.schema.metadata or {}), SOURCE_ROOT_KEY: str(source_root).encode()}
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
        manifest = pd.read_parquet(manifest_path)
        source_root = (pq.read_schema(manifest_path).metadata or {}).get(SOURCE_ROOT_KEY)
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

    def path(self, image: str) -> Path:
        """The file for ``image``; raises ``FileNotFoundError`` naming why it is missing."""
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
        return path
