"""Calibration data for the calibrated-decision variants: training images only (docs/variants.md,
"Calibrated decisions").

- :func:`build_calibration_set`: the benchmark's YN protocol on ``calibration_images`` seeded *training*
  images (never a test image, :func:`check_training_only`), for the ``threshold`` rule's cut;
- :func:`write_content_free_images`: the ``content_free`` rule's images, a grey ``blank`` and the ``mean`` of
  the same training images.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from verbmirage.benchmark.question_sets import QUESTION_SETS
from verbmirage.benchmark.questions import QuestionSettings, build_question_set
from verbmirage.core.imaging import open_rgb
from verbmirage.core.paths import atomic_path
from verbmirage.data.hico import NO_INTERACTION, HicoAnnotations

#: The blank content-free image: uniform mid grey, of the typical size of the calibration training images
#: (their median width and height; real HICO images: 640 x 480, measured on the test split's sizes).
BLANK_GREY = (128, 128, 128)


CONTENT_FREE_FILES = {"blank": "blank.png", "mean": "mean.png"}


CONTENT_FREE_INFO = "content_free.json"


CALIBRATION_STREAM = "calibration"


def calibration_images(anno: HicoAnnotations, count: int, seed: int) -> list[str]:
    """``count`` training image names (a seeded draw among those with a positive HOI), sorted.

    The same images for every calibration set and for the mean content-free image; never a test image.
    """
    hois = anno.hois
    interaction = np.asarray(hois.verb != NO_INTERACTION)
    labels = anno.labels["train"]
    usable = [name for name, row in zip(anno.images["train"], labels) if (row[interaction] == 1).any()]
    if not usable:
        raise ValueError(f"{anno.root}: no training image has a positive label: no calibration set")
    rng = np.random.default_rng([seed, zlib.crc32(CALIBRATION_STREAM.encode())])
    chosen = rng.choice(len(usable), size=min(count, len(usable)), replace=False)
    return sorted(usable[i] for i in chosen)


def check_training_only(frame: pd.DataFrame, anno: HicoAnnotations, where: str = "calibration set") -> None:
    """Raise if any row asks about a test image (by path or by name)."""
    test_paths = {anno.image_relpath("test", name) for name in anno.images["test"]}
    test_ids = {name.rsplit(".", 1)[0] for name in anno.images["test"]}
    train_paths = {anno.image_relpath("train", name) for name in anno.images["train"]}
    leaked = frame[frame.image.isin(test_paths) | frame.image_id.isin(test_ids) | ~frame.image.isin(train_paths)]
    if len(leaked):
        raise ValueError(f"{where}: {len(leaked)} rows ask about an image that is not a training image, "
                         f"e.g. {leaked.image.iloc[0]!r} (calibration must never see a test image)")


def build_calibration_set(anno: HicoAnnotations, qset: str, settings: QuestionSettings, count: int,
                          dataset: str = "hico") -> pd.DataFrame:
    """The calibration questions of a YN set: the benchmark's protocol on :func:`calibration_images`."""
    if qset not in QUESTION_SETS or QUESTION_SETS[qset].kind != "yn":
        raise ValueError(f"calibration sets are built for HICO's YN sets, not '{qset}'")
    names = calibration_images(anno, count, settings.seed)
    frame = build_question_set(anno, qset, replace(settings, split="train"), dataset, images=names)
    check_training_only(frame, anno, f"calibration set {qset}")
    return frame


def typical_size(paths: Sequence[Path]) -> tuple[int, int]:
    """The median width and height of the images (headers only)."""
    sizes = []
    for path in paths:
        with Image.open(path) as image:
            sizes.append(image.size)
    widths, heights = zip(*sizes)
    return int(np.median(widths)), int(np.median(heights))


def mean_image(paths: Sequence[Path], size: tuple[int, int]) -> Image.Image:
    """The per-pixel mean of the images, each resized (bilinear) to ``size``, rounded to 8 bits."""
    total = np.zeros((size[1], size[0], 3), dtype=np.float64)
    for path in paths:
        total += np.asarray(open_rgb(path).resize(size, Image.BILINEAR), dtype=np.float64)
    return Image.fromarray(np.rint(total / len(paths)).clip(0, 255).astype(np.uint8))


def write_content_free_images(root: str | Path, anno: HicoAnnotations, count: int, seed: int,
                              out_dir: str | Path) -> dict:
    """``blank.png`` (uniform :data:`BLANK_GREY`) and ``mean.png`` (the mean of :func:`calibration_images`),
    both of the calibration images' typical size, plus a JSON note of how they were made. Returns the note."""
    names = calibration_images(anno, count, seed)
    paths = [Path(root) / anno.image_relpath("train", name) for name in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"content-free mean image: {len(missing)} training images are missing, "
                                f"e.g. {missing[0]}")
    size = typical_size(paths)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    images = {"blank": Image.new("RGB", size, BLANK_GREY), "mean": mean_image(paths, size)}
    for name, image in images.items():
        with atomic_path(out_dir / CONTENT_FREE_FILES[name]) as tmp:
            image.save(tmp, format="PNG")
    note = {"size": list(size), "blank_grey": list(BLANK_GREY), "mean_of": len(names), "seed": seed,
            "images": [anno.image_relpath("train", name) for name in names]}
    with atomic_path(out_dir / CONTENT_FREE_INFO) as tmp:
        tmp.write_text(json.dumps(note, indent=1))
    return note


def content_free_paths(folder: str | Path, names: Sequence[str]) -> dict[str, Path]:
    """The configured content-free images (``content_free_images``) in their folder; a missing one is an error."""
    paths = {}
    for name in names:
        if name not in CONTENT_FREE_FILES:
            raise ValueError(f"decision.content_free_images: '{name}' is not one of {sorted(CONTENT_FREE_FILES)}")
        path = Path(folder) / CONTENT_FREE_FILES[name]
        if not path.is_file():
            raise FileNotFoundError(f"content-free image '{name}' not found: {path}")
        paths[name] = path
    return paths
