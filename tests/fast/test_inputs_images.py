"""An oversized image is one error row, not a crashed condition job."""

import struct
import zlib

import pytest
from PIL import Image

from verbmirage.benchmark.conditions import ImageResolver, apply_condition


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def write_one_colour_png(path, width: int, height: int) -> None:
    """A valid black 1-bit PNG, streamed row by row: a 20000x20000 file costs about 50 KB and no big buffer."""
    compressor = zlib.compressobj(9)
    row = b"\x00" + bytes((width + 7) // 8)  # filter byte "none", then all-zero pixels
    data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1 bit, greyscale
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", data)
                     + _png_chunk(b"IEND", b""))


@pytest.fixture()
def dataset(tmp_path):
    root = tmp_path / "hico"
    folder = root / "images" / "test2015"
    folder.mkdir(parents=True)
    for n in (1, 3):
        Image.new("RGB", (24, 16), (30 * n, 100, 200)).save(folder / f"HICO_test2015_{n}.jpg")
    return root


def test_twenty_thousand_squared_png_is_an_error_row(dataset, tmp_path, monkeypatch):
    bomb = "images/test2015/HICO_test2015_2.png"
    write_one_colour_png(dataset / bomb, 20000, 20000)
    with monkeypatch.context() as unlimited:  # the file is a real PNG: only its size is the problem
        unlimited.setattr(Image, "MAX_IMAGE_PIXELS", None)
        with Image.open(dataset / bomb) as header_only:
            assert header_only.format == "PNG" and header_only.size == (20000, 20000)
    images = ["images/test2015/HICO_test2015_1.jpg", bomb, "images/test2015/HICO_test2015_3.jpg"]
    manifest = apply_condition(dataset, images, tmp_path / "sp", "saltpepper", {"type": "saltpepper"})
    rows = manifest.set_index("image")
    assert "HICO_test2015_2.png" in rows.error[bomb] and "too large" in rows.error[bomb]
    assert rows.error.drop(bomb).isna().all()
    resolver = ImageResolver(tmp_path / "sp")
    with pytest.raises(FileNotFoundError, match="too large"):
        resolver.path(bomb)
    for image in images[::2]:
        with Image.open(resolver.path(image)) as noisy:
            assert noisy.size == (24, 16)


def test_image_between_one_and_two_times_the_limit_is_an_error_row(dataset, tmp_path, monkeypatch):
    """Pillow only warns there; the condition job treats it like the bomb it may be."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 24 * 16)
    big = "images/test2015/HICO_test2015_4.png"
    Image.new("RGB", (30, 20), (5, 5, 5)).save(dataset / big)  # 600 px: over the limit, under twice it
    images = ["images/test2015/HICO_test2015_1.jpg", big]
    manifest = apply_condition(dataset, images, tmp_path / "sp", "saltpepper", {"type": "saltpepper"})
    rows = manifest.set_index("image")
    assert "HICO_test2015_4.png" in rows.error[big]
    assert rows.error.isna().sum() == 1
