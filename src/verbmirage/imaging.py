"""Opening image files safely; shared by the image conditions and every backend."""

from __future__ import annotations

import warnings
from pathlib import Path

from PIL import Image


def open_rgb(path: Path) -> Image.Image:
    """An image file as RGB, fully loaded (the file is closed again).

    An image over Pillow's pixel limit (a decompression bomb, or a huge file)
    becomes a ``ValueError`` naming the file, so it is one error row and not a
    crashed job: Pillow raises ``DecompressionBombError`` (not an OSError)
    above twice the limit and only warns between one and two times it.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                return image.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ValueError(f"{path}: image too large to open safely ({error})") from None
