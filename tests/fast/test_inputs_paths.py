"""Names from data files cannot lead outside their folders.

The victim files live next to the work folder, as a user's own files would:
every test checks they are neither deleted, replaced nor written through a link.
"""

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from verbmirage.data.charades import CSV_COLUMNS, extract_frames, load_split, parse_actions
from verbmirage.benchmark.conditions import MANIFEST, ImageResolver, apply_condition

VICTIM_BYTES = b"the user's own file, not an image"


@pytest.fixture()
def layout(tmp_path):
    """``data/hico`` with two images, an empty ``work/`` and a victim file beside them."""
    root = tmp_path / "data" / "hico"
    (root / "images" / "test2015").mkdir(parents=True)
    for n in (1, 2):
        Image.new("RGB", (16, 12), (40 * n, 90, 160)).save(root / "images" / "test2015" / f"HICO_test2015_{n}.jpg")
    victim = tmp_path / "victim.jpg"
    victim.write_bytes(VICTIM_BYTES)
    (tmp_path / "work").mkdir()
    return root, tmp_path / "work", victim


def _victim_intact(victim):
    return victim.is_file() and not victim.is_symlink() and victim.read_bytes() == VICTIM_BYTES


@pytest.mark.parametrize("kind", ["clean", "saltpepper"])
@pytest.mark.parametrize("name", ["../../../victim.jpg", "images/../../../victim.jpg", "/abs/victim.jpg"])
def test_condition_refuses_names_that_escape(layout, kind, name):
    root, work, victim = layout
    good = "images/test2015/HICO_test2015_1.jpg"
    with pytest.raises(ValueError, match="victim.jpg"):
        apply_condition(root, [good, name], work / kind, kind, {"type": kind})
    assert _victim_intact(victim)
    assert not (work / kind).exists(), "nothing is written before the names are checked"


@pytest.mark.parametrize("kind", ["clean", "saltpepper"])
def test_link_planted_at_the_destination_is_replaced_not_followed(layout, kind):
    """A stale link pointing outside is replaced as an entry: the victim is not deleted nor overwritten."""
    root, work, victim = layout
    image = "images/test2015/HICO_test2015_1.jpg"
    out_dir = work / kind
    destination = out_dir / (image if kind == "clean" else image.replace(".jpg", ".png"))
    destination.parent.mkdir(parents=True)
    destination.symlink_to(victim)
    manifest = apply_condition(root, [image], out_dir, kind, {"type": kind})
    assert manifest.error.isna().all()
    assert _victim_intact(victim)
    assert os.path.realpath(destination) != str(victim.resolve())
    seen = ImageResolver(out_dir).path(image)
    with Image.open(seen) as opened:
        assert opened.size == (16, 12)
    assert not [p for p in destination.parent.iterdir() if p.name.endswith(".tmp")], "no temporary file left"


def test_output_folder_that_links_outside_is_refused(layout, tmp_path):
    root, work, victim = layout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (work / "sp").mkdir()
    (work / "sp" / "images").symlink_to(elsewhere)  # planted: images/ leads out of the condition folder
    with pytest.raises(ValueError, match="outside"):
        apply_condition(root, ["images/test2015/HICO_test2015_1.jpg"], work / "sp", "saltpepper",
                        {"type": "saltpepper"})
    assert list(elsewhere.iterdir()) == []


def test_source_link_out_of_the_dataset_is_an_error_row(layout):
    """A link inside the dataset that points at the victim is not linked to, nor read."""
    root, work, victim = layout
    (root / "images" / "test2015" / "HICO_test2015_3.jpg").symlink_to(victim)
    images = ["images/test2015/HICO_test2015_1.jpg", "images/test2015/HICO_test2015_3.jpg"]
    for kind in ("clean", "saltpepper"):
        manifest = apply_condition(root, images, work / kind, kind, {"type": kind}).set_index("image")
        assert pd.isna(manifest.error[images[0]])
        assert "outside" in manifest.error[images[1]] and pd.isna(manifest.file[images[1]])
        assert not (work / kind / "images" / "test2015" / "HICO_test2015_3.jpg").exists()
    assert _victim_intact(victim)


def test_resolver_refuses_a_tampered_manifest(layout):
    root, work, victim = layout
    image = "images/test2015/HICO_test2015_1.jpg"
    apply_condition(root, [image], work / "clean", "clean", {"type": "clean"})
    manifest_path = work / "clean" / MANIFEST
    table = pq.read_table(manifest_path)
    frame = table.to_pandas()
    frame.loc[0, "file"] = "../../victim.jpg"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(table.schema.metadata),
                   manifest_path)
    with pytest.raises(ValueError, match=r"row 0, column 'file'.*'\.\./\.\./victim.jpg'"):
        ImageResolver(work / "clean")


def test_resolver_refuses_a_link_swapped_to_point_outside(layout):
    root, work, victim = layout
    image = "images/test2015/HICO_test2015_1.jpg"
    apply_condition(root, [image], work / "clean", "clean", {"type": "clean"})
    link = work / "clean" / image
    link.unlink()
    link.symlink_to(victim)
    with pytest.raises(ValueError, match="outside"):
        ImageResolver(work / "clean").path(image)


def _charades_csv(folder, video_id: str, actions: str = "c001 0.00 1.00"):
    row = {c: "" for c in CSV_COLUMNS}
    row.update(id=video_id, actions=actions, length=5.0, egocentric="No", charades_video=video_id)
    folder.mkdir(parents=True, exist_ok=True)
    good = {**row, "id": "AB123", "charades_video": "AB123"}
    pd.DataFrame([good, row], columns=CSV_COLUMNS).to_csv(folder / "CharadesEgo_v1_test.csv", index=False)
    return folder / "CharadesEgo_v1_test.csv"


@pytest.mark.parametrize("video_id", ["..", "../../victim", "/tmp/x", "AB 12"])
def test_charades_csv_id_that_escapes_is_refused(tmp_path, video_id):
    path = _charades_csv(tmp_path / "CharadesEgo", video_id)
    with pytest.raises(ValueError, match=rf"{path} row 3, column 'id': unsafe name"):
        load_split(tmp_path / "CharadesEgo", "test")


def test_charades_action_class_that_escapes_is_refused():
    with pytest.raises(ValueError, match=r"row 5: action class: unsafe name '\.\./c001'"):
        parse_actions("c000 0.0 1.0;../c001 0.50 2.00", "x.csv row 5")


def test_frames_never_write_through_a_planted_link(tmp_path):
    """The frame target is replaced as an entry, and a video name from a table is checked too."""
    from verbmirage.data.charades import _write_video

    videos, out_root = tmp_path / "videos", tmp_path / "work" / "frames"
    _write_video(videos / "AB123.mp4", 1.0, 10, (90, 120, 30), np.random.default_rng(0))
    victim = tmp_path / "victim.jpg"
    victim.write_bytes(VICTIM_BYTES)
    target = out_root / "frames" / "exo" / "AB123_c001.jpg"
    target.parent.mkdir(parents=True)
    target.symlink_to(victim)
    frames = pd.DataFrame([{"frame_id": "AB123_c001_exo", "video": "AB123", "seconds": 0.5,
                            "image": "frames/exo/AB123_c001.jpg"}])
    result = extract_frames(frames, videos, out_root)
    assert result.error.isna().all()
    assert _victim_intact(victim) and not target.is_symlink()
    with Image.open(target) as frame:
        assert frame.size == (64, 48)
    bad = frames.assign(video="../videos/AB123")
    with pytest.raises(ValueError, match=r"frame AB123_c001_exo: video: unsafe name"):
        extract_frames(bad, videos, out_root)
