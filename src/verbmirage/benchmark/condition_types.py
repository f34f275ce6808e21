"""The image conditions a config can name (paper "High-Quality and Low-Quality Images", FOV): ``type`` -> its
transform, its parameters and their ranges.

A config names a condition slug and its ``type`` plus parameters, so ``saltpepper_50`` with probability 0.5 is
config only, and a new kind (blur, JPEG, ...) is one entry of :data:`CONDITIONS`. The registry is read when a run
is planned (a parameter's name and range are checked there); the images are made by
:mod:`verbmirage.benchmark.conditions`. Nothing here imports an image library until a transform runs.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image


@dataclass(frozen=True)
class ImageCondition:
    """``transform(image, rng, **params)`` or ``None`` for an untouched (linked) image."""

    transform: Callable[..., Image.Image] | None
    description: str
    needs_boxes: bool = False  # transform(image, rng, box=(x1, y1, x2, y2), **params); images without a box skipped
    #: parameter -> (lowest, highest) value it may take (inclusive; None: unbounded), checked when planning
    ranges: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def parameters(self) -> list[str]:
        """The settings a config entry of this type may give (the transform's own keywords): what is checked
        when the run is planned, so a misspelled one stops it there and not in the image job."""
        if self.transform is None:
            return []
        given_by_the_job = {"image", "rng", "box"}
        return [name for name in inspect.signature(self.transform).parameters if name not in given_by_the_job]

    def value_problems(self, settings: dict) -> list[str]:
        """One line per parameter of ``settings`` that is not a number in its range (``key: problem``)."""
        problems = []
        for key, (low, high) in self.ranges.items():
            if key not in settings:
                continue
            value = settings[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                problems.append(f"{key}: {value!r} is not a number")
            elif (low is not None and value < low) or (high is not None and value > high):
                bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
                problems.append(f"{key}: {value!r} is not in {bounds}")
        return problems


def salt_and_pepper(image: Image.Image, rng: np.random.Generator, probability: float = 0.75) -> Image.Image:
    """Replace each pixel (all channels together) with probability p, half black, half white."""
    import numpy as np  # deferred: imports numpy and Pillow, which planning (it reads this registry) never needs
    from PIL import Image

    pixels = np.array(image.convert("RGB"))
    height, width = pixels.shape[:2]
    hit = rng.random((height, width)) < probability
    white = rng.random((height, width)) < 0.5
    pixels[hit & white] = 255
    pixels[hit & ~white] = 0
    return Image.fromarray(pixels)


def crop_box(box, width: int, height: int, margin: float = 0.1) -> tuple[int, int, int, int]:
    """PIL crop box (left, upper, right, lower) of a 1-based inclusive box grown by ``margin`` x its size.

    The box (x1, y1, x2, y2) covers the continuous area [x1-1, x2] x [y1-1, y2];
    it grows by ``margin`` times its width/height on every side, outwards to
    whole pixels, and is clipped to the image.
    """
    x1, y1, x2, y2 = (float(v) for v in box)
    if not (math.isfinite(x1 + y1 + x2 + y2) and x1 <= x2 and y1 <= y2) or margin < 0:
        raise ValueError(f"crop: bad box {box!r} or margin {margin!r}")
    w, h = x2 - x1 + 1, y2 - y1 + 1
    left, upper = max(0, math.floor(x1 - 1 - margin * w)), max(0, math.floor(y1 - 1 - margin * h))
    right, lower = min(width, math.ceil(x2 + margin * w)), min(height, math.ceil(y2 + margin * h))
    if right <= left or lower <= upper:
        raise ValueError(f"crop: box {box!r} lies outside the {width}x{height} image")
    return left, upper, right, lower


def crop_to_box(image: Image.Image, rng: np.random.Generator, box, margin: float = 0.1) -> Image.Image:
    """The interaction's union box plus a margin (paper: field of view); ``rng`` unused."""
    return image.convert("RGB").crop(crop_box(box, *image.size, margin=margin))


CONDITIONS: dict[str, ImageCondition] = {
    "clean": ImageCondition(None, "the original image"),
    "saltpepper": ImageCondition(salt_and_pepper, "salt-and-pepper noise, paper: 75% of pixels",
                                 ranges={"probability": (0.0, 1.0)}),
    "crop": ImageCondition(crop_to_box, "the union box of the human-object pair plus a margin (single-instance "
                                        "images only)", needs_boxes=True, ranges={"margin": (0.0, None)}),
}


# Keys of a condition entry that choose what is asked under it, not how its images look: they never reach a
# transform or an inference fingerprint, so changing them does not remake images or answers already given.
PLANNING_KEYS = frozenset({"qsets"})


def image_settings(settings: dict) -> dict:
    """A condition entry as its images are made from it (``type`` and parameters; no planning keys)."""
    return {key: value for key, value in settings.items() if key not in PLANNING_KEYS}
