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
from PIL import Image
from tqdm import tqdm

MANIFEST = "manifest.parquet"


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

    A missing or unreadable source image is recorded with an ``error`` and the
    others go on.
    """
    kind = settings.get("type", condition)
    if kind not in CONDITIONS:
        raise KeyError(f"conditions.{condition}.type: unknown image condition '{kind}'; known: {sorted(CONDITIONS)}")
    spec = CONDITIONS[kind]
    params = {k: v for k, v in settings.items() if k != "type"}
    source_root, out_dir = Path(source_root).resolve(), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for image in tqdm(sorted(set(images)), desc=f"condition {condition}", unit="img"):
        source = source_root / image
        target = Path(image) if spec.transform is None else Path(image).with_suffix(".png")
        destination = out_dir / target
        destination.parent.mkdir(parents=True, exist_ok=True)
        error = None
        try:
            if spec.transform is None:
                if not source.is_file():
                    raise FileNotFoundError(f"no such image: {source}")
                if destination.is_symlink() or destination.exists():
                    destination.unlink()
                os.symlink(source, destination)
            else:
                with Image.open(source) as original:
                    result = spec.transform(original, condition_rng(seed, condition, image), **params)
                result.save(destination, format="PNG")
        except (OSError, ValueError) as failure:
            error = f"{type(failure).__name__}: {failure}"
        rows.append({"image": image, "file": None if error else str(target), "error": error})
    manifest = pd.DataFrame(rows, columns=["image", "file", "error"])
    manifest.to_parquet(out_dir / MANIFEST, index=False)
    return manifest


class ImageResolver:
    """Finds the file a model sees for a question's ``image`` under one condition."""

    def __init__(self, condition_dir: str | Path):
        self.root = Path(condition_dir)
        manifest = pd.read_parquet(self.root / MANIFEST)
        self._files = {i: (None if pd.isna(f) else f) for i, f in zip(manifest.image, manifest.file)}
        self._errors = dict(zip(manifest.image, manifest.error))

    def path(self, image: str) -> Path:
        """The file for ``image``; raises ``FileNotFoundError`` naming why it is missing."""
        if image not in self._files:
            raise FileNotFoundError(f"{image} is not in {self.root / MANIFEST}")
        if self._files[image] is None:
            raise FileNotFoundError(f"{image}: {self._errors[image]}")
        return self.root / self._files[image]
