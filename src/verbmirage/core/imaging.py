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


def expand_to_square(image: Image.Image, background: tuple[int, ...]) -> Image.Image:
    """``image`` centred on a square of its longer side filled with ``background`` (the short side's margin split
    with the extra pixel after it), as the original LLaVA-1.5's ``expand2square``."""
    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    square = Image.new(image.mode, (side, side), background)
    square.paste(image, ((side - width) // 2, (side - height) // 2))
    return square


def size_field(size, key: str):
    """A field of an image processor's ``size``/``crop_size`` (a SizeDict or a plain dict), or None."""
    if size is None:
        return None
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def square_input_side(image_processor) -> int:
    """The side of the square a CLIP-style processor hands the vision tower: its crop size when it crops, else
    its target size."""
    if getattr(image_processor, "do_center_crop", False) and size_field(image_processor.crop_size, "height"):
        return int(size_field(image_processor.crop_size, "height"))
    size = image_processor.size
    return int(size_field(size, "height") or size_field(size, "shortest_edge"))
