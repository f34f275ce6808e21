"""Work a job does once that it used to repeat (issue 8 item 4: a fast demo), with the results unchanged."""

import pytest

import verbmirage.conditions as conditions
from verbmirage.conditions import ImageResolver, apply_condition


def test_image_paths_are_checked_once_per_image(demo_roots, tmp_path, monkeypatch):
    """An image has many questions: its containment check (two resolves) runs at its first question only,
    the path is the same every time, and a missing image is an error every time it is asked for."""
    root = demo_roots[0]
    images = sorted(str(p.relative_to(root)) for p in (root / "images" / "test2015").glob("*.jpg"))[:3]
    images.append("images/test2015/HICO_test2015_99999999.jpg")  # missing on disk: an error row
    apply_condition(root, images, tmp_path / "clean", "clean", {"type": "clean"})
    checks = []
    real_inside = conditions.inside
    monkeypatch.setattr(conditions, "inside", lambda *args: checks.append(args[1]) or real_inside(*args))
    resolver = ImageResolver(tmp_path / "clean")
    first = [resolver.path(image) for image in images[:3]]
    assert [resolver.path(image) for image in images[:3] * 4] == first * 4
    assert all(path.is_symlink() and path.resolve().is_relative_to(root.resolve()) for path in first)
    assert len(checks) == 6  # clean links: the condition folder, then the source root, once per image
    for _ in range(2):
        with pytest.raises(FileNotFoundError, match="99999999"):
            resolver.path(images[3])
