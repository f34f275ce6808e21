"""Image conditions: exact noise statistics, determinism, links, missing images."""

import numpy as np
import pytest
from PIL import Image

from verbmirage.benchmark.conditions import (
    ImageResolver,
    MissingImagesError,
    apply_condition,
    condition_rng,
    require_images,
)
from verbmirage.benchmark.condition_types import CONDITIONS, salt_and_pepper


def test_salt_and_pepper_statistics():
    image = Image.new("RGB", (400, 300), (120, 60, 200))
    noisy = np.array(salt_and_pepper(image, np.random.default_rng(0), probability=0.75))
    white = (noisy == 255).all(axis=2)
    black = (noisy == 0).all(axis=2)
    untouched = (noisy == (120, 60, 200)).all(axis=2)
    assert (white | black | untouched).all()  # all channels together, never one channel alone
    assert (white | black).mean() == pytest.approx(0.75, abs=0.01)
    assert white.sum() / (white | black).sum() == pytest.approx(0.5, abs=0.02)


def test_condition_rng_is_per_image():
    a = condition_rng(0, "saltpepper", "images/test2015/x.jpg").random(5)
    b = condition_rng(0, "saltpepper", "images/test2015/x.jpg").random(5)
    c = condition_rng(0, "saltpepper", "images/test2015/y.jpg").random(5)
    assert (a == b).all() and not (a == c).all()


def test_apply_conditions(demo_roots, tmp_path):
    root = demo_roots[0]
    images = sorted(str(p.relative_to(root)) for p in (root / "images" / "test2015").glob("*.jpg"))[:5]
    images.append("images/test2015/HICO_test2015_99999999.jpg")  # missing on disk
    clean = apply_condition(root, images, tmp_path / "clean", "clean", {"type": "clean"})
    noisy = apply_condition(root, images, tmp_path / "sp", "saltpepper", {"type": "saltpepper", "probability": 0.75})
    apply_condition(root, images, tmp_path / "sp2", "saltpepper", {"type": "saltpepper", "probability": 0.75})
    assert clean.error.notna().sum() == noisy.error.notna().sum() == 1
    assert "HICO_test2015_99999999" in noisy.error.dropna().iloc[0]
    linked = ImageResolver(tmp_path / "clean").path(images[0])
    assert linked.is_symlink() and linked.read_bytes() == (root / images[0]).read_bytes()
    resolver = ImageResolver(tmp_path / "sp")
    first, second = resolver.path(images[0]), ImageResolver(tmp_path / "sp2").path(images[0])
    assert first.suffix == ".png" and first.read_bytes() == second.read_bytes()
    with Image.open(root / images[0]) as original, Image.open(first) as result:
        assert original.size == result.size
    with pytest.raises(FileNotFoundError, match="99999999"):
        resolver.path(images[-1])
    with pytest.raises(FileNotFoundError, match="not in"):
        resolver.path("images/test2015/unknown.jpg")


def test_a_relative_root_gives_the_same_condition_folder_in_any_checkout(demo_roots, tmp_path, monkeypatch):
    """With the data inside the project (a relative root, as the demo's), the links are relative and the
    manifest names the root as given: the folder is the same bytes wherever the checkout lies, and it moves
    with the project."""
    import os
    import shutil

    images = sorted(str(p.relative_to(demo_roots[0])) for p in (demo_roots[0] / "images/test2015").glob("*.jpg"))[:3]
    images.append("images/test2015/HICO_test2015_99999999.jpg")  # missing on disk: its error names no checkout
    folders = []
    for checkout in ("a", "b"):
        shutil.copytree(demo_roots[0] / "images", tmp_path / checkout / "data/hico/images")
        monkeypatch.chdir(tmp_path / checkout)
        apply_condition("data/hico", images, "results/clean", "clean", {"type": "clean"})
        folders.append(tmp_path / checkout / "results/clean")
    listing = lambda folder: {  # noqa: E731
        str(path.relative_to(folder)): os.readlink(path) if path.is_symlink() else path.read_bytes()
        for path in sorted(folder.rglob("*")) if path.is_file() or path.is_symlink()}
    assert listing(folders[0]) == listing(folders[1])
    link = folders[0] / images[0]
    assert not os.path.isabs(os.readlink(link))
    shutil.move(tmp_path / "a", tmp_path / "moved")  # the whole project moves: its links still resolve
    monkeypatch.chdir(tmp_path / "moved")
    assert ImageResolver("results/clean").path(images[0]).read_bytes() == (demo_roots[0] / images[0]).read_bytes()


def test_a_condition_with_no_readable_image_stops(tmp_path):
    """An empty or wrong images folder fails the image job, naming it, instead of a manifest of errors that
    only the model jobs would trip over later."""
    (tmp_path / "hico" / "images" / "test2015").mkdir(parents=True)
    images = ["images/test2015/HICO_test2015_00000001.jpg", "images/test2015/HICO_test2015_00000002.jpg"]
    for condition, settings in (("clean", {"type": "clean"}), ("saltpepper", {"type": "saltpepper"})):
        with pytest.raises(FileNotFoundError, match=rf"condition {condition}: none of the 2 images could be read "
                                                    rf"under .*hico .*first error: .*00000001"):
            apply_condition(tmp_path / "hico", images, tmp_path / condition, condition, settings)
        assert not (tmp_path / condition / "manifest.parquet").exists()


def test_unknown_condition_names_the_key(tmp_path):
    with pytest.raises(KeyError, match="conditions.fog.type"):
        apply_condition(tmp_path, [], tmp_path / "out", "fog", {"type": "fog"})
    assert {"clean", "saltpepper"} <= set(CONDITIONS)


def test_missing_images_stop_naming_how_many_and_the_first_few(tmp_path):
    """The image job's check before it writes anything: an incomplete images folder stops the run there, not
    as error rows of every model job."""
    (tmp_path / "images/test2015").mkdir(parents=True)
    images = [f"images/test2015/HICO_test2015_{i:08d}.jpg" for i in range(1, 11)]
    for image in images[:3]:
        (tmp_path / image).write_bytes(b"x")
    require_images(tmp_path, images[:3], "clean")  # all there: nothing happens
    with pytest.raises(MissingImagesError, match=r"condition clean: 7 of the 10 images the question sets ask about "
                                                 r"are missing under .* \(first: images/test2015/HICO_test2015_"
                                                 r"00000004.jpg, .*00000008.jpg, \.\.\.\)"):
        require_images(tmp_path, images, "clean")
