"""A dataset's identity (README, "Changed data rebuilds what was built from it"; src/verbmirage/data/identity.py)."""

import json
import os
import shutil
import time

from verbmirage.data import identity as data_identity

OLD = (1442700000, 1442700000)  # 2015-09-19, the date an archive's files keep after tar x / cp -a / rsync -a


def _dataset(root, anno=b"labels v1", images=None):
    (root / "images" / "test2015").mkdir(parents=True, exist_ok=True)
    (root / "anno.mat").write_bytes(anno)
    for name, content in (images or {"HICO_test2015_00000001.jpg": b"a" * 10}).items():
        (root / "images" / "test2015" / name).write_bytes(content)
    for path in [root, *root.rglob("*")]:
        os.utime(path, OLD)


def _new_plan():
    """What a new Snakemake process starts with: no digest or listing memo."""
    data_identity._digests.clear()
    data_identity._listings.clear()


def test_data_replaced_with_old_dates_changes_the_identity(tmp_path, monkeypatch):
    """Probe 39 in the package: the same path and old mtimes, other content (anno.mat of the same size)."""
    monkeypatch.chdir(tmp_path)
    _dataset(tmp_path / "hico")
    annotations, images = data_identity.hico_annotations("hico"), data_identity.hico_images("hico")
    assert annotations["root"] == "hico" and len(annotations["anno.mat"]) == 64
    assert images["images"]["files"] == 1 and images["images"]["bytes"] == 10
    shutil.rmtree(tmp_path / "hico")
    _dataset(tmp_path / "hico", anno=b"labels v2", images={"HICO_test2015_00000001.jpg": b"b" * 12})
    _new_plan()
    assert data_identity.hico_annotations("hico")["anno.mat"] != annotations["anno.mat"]
    assert data_identity.hico_images("hico") != images
    # an image rewritten in place under its old date and name (cp -a over the folder): its size differs
    before = data_identity.hico_images("hico")
    (tmp_path / "hico/images/test2015/HICO_test2015_00000001.jpg").write_bytes(b"c" * 13)
    os.utime(tmp_path / "hico/images/test2015/HICO_test2015_00000001.jpg", OLD)
    os.utime(tmp_path / "hico/images/test2015", OLD)
    _new_plan()
    assert data_identity.hico_images("hico") != before


def test_a_file_the_run_rewrites_is_hashed_again_in_the_same_process(tmp_path):
    """The in-process memo is keyed by the stat stamp, not by the path: the demo data a run builds after
    planning (or a download it unpacks) is read again when its jobs' params are evaluated anew."""
    path, folder = tmp_path / "anno.mat", tmp_path / "images"
    assert data_identity.file_digest(path) is None and data_identity.folder_listing(folder) is None  # at planning
    path.write_bytes(b"built by the run")
    (folder / "test2015").mkdir(parents=True)
    (folder / "test2015/a.jpg").write_bytes(b"a")
    for each in (path, folder / "test2015", folder):
        os.utime(each, OLD)
    assert data_identity.file_digest(path) is not None
    assert data_identity.folder_listing(folder)["files"] == 1
    time.sleep(0.05)  # a job runs well after the plan; the change time's clock ticks every few milliseconds
    shutil.rmtree(folder)  # rebuilt (demo_hico's output folder is removed before its job)
    (folder / "test2015").mkdir(parents=True)
    (folder / "test2015/a.jpg").write_bytes(b"a")
    (folder / "test2015/b.jpg").write_bytes(b"b")
    for each in (folder / "test2015", folder):
        os.utime(each, OLD)
    assert data_identity.folder_listing(folder)["files"] == 2


def test_the_identity_of_a_relative_root_holds_no_checkout_path(tmp_path, monkeypatch):
    """Two checkouts with the same data get the same identity (and so the same params and bytes)."""
    found = []
    for checkout in ("a", "b"):
        (tmp_path / checkout).mkdir()
        monkeypatch.chdir(tmp_path / checkout)
        _dataset(tmp_path / checkout / "data/hico")
        (tmp_path / checkout / "data/hico/images/.DS_Store").write_bytes({"a": b"x", "b": b"other"}[checkout])
        found.append({**data_identity.hico_annotations("data/hico"), **data_identity.hico_images("data/hico"),
                      **data_identity.hico_boxes("")})
    assert found[0] == found[1]
    assert str(tmp_path) not in repr(found[0])


def test_charadesego_and_pangea_identities_see_their_files(tmp_path):
    root = tmp_path / "charades"
    (root / "CharadesEgo").mkdir(parents=True)
    (root / "videos").mkdir()
    (root / "CharadesEgo/CharadesEgo_v1_test.csv").write_text("id,actions\nAB12,c001 0.0 1.0\n")
    (root / "videos/AB12.mp4").write_bytes(b"v" * 5)
    first = data_identity.charades(str(root), str(root / "videos"))
    (root / "CharadesEgo/CharadesEgo_v1_test.csv").write_text("id,actions\nAB12,c002 0.0 1.0\n")
    assert data_identity.charades(str(root), str(root / "videos"))["CharadesEgo"] != first["CharadesEgo"]
    assert first["video_files"]["files"] == 1
    pangea = tmp_path / "pangea"
    (pangea / "Images").mkdir(parents=True)
    (pangea / "samples.pkl").write_bytes(b"s")
    settings = {"root": str(pangea), "samples": "samples.pkl", "images": "Images"}
    assert data_identity.pangea(settings, ["samples"])["samples.pkl"] == data_identity.file_digest(
        pangea / "samples.pkl")


def test_an_image_rewritten_in_place_under_its_old_name_size_and_dates_is_seen(tmp_path, monkeypatch):
    """Content versions: once a job has hashed an image (the image stage does), a rewrite that keeps its name,
    size and dates changes the listing; a touch, or a copy of the same bytes, does not; and the hashing
    itself changes nothing (a plan after the image stage equals the plan before it)."""
    monkeypatch.chdir(tmp_path)
    _dataset(tmp_path / "hico", images={"HICO_test2015_00000001.jpg": b"a" * 10,
                                         "HICO_test2015_00000002.jpg": b"z" * 10})
    image = tmp_path / "hico/images/test2015/HICO_test2015_00000001.jpg"

    def plan():
        _new_plan()
        return data_identity.hico_images("hico", data_identity.ContentVersions(tmp_path / "cache"))

    first = plan()
    assert first == data_identity.hico_images("hico")  # no change seen yet: as without versions
    stage = data_identity.ContentVersions(tmp_path / "cache")  # the image stage, in another process
    assert stage.digest(image) == data_identity.file_digest(image)
    stage.save()
    assert plan() == first
    os.utime(image)  # touch: a new modification and change time, the same bytes
    assert plan() == first
    copy = image.read_bytes()
    image.unlink()
    image.write_bytes(copy)  # a new inode, the same bytes (cp -a, rsync -a)
    os.utime(image, OLD)
    assert plan() == first
    image.write_bytes(b"b" * 10)  # the same name, size and dates, other content
    os.utime(image, OLD)
    os.utime(image.parent, OLD)
    changed = plan()
    assert changed != first and changed["images"]["files"] == 2 and changed["images"]["bytes"] == 20
    assert plan() == changed  # seen once, and stable after
    stage = data_identity.ContentVersions(tmp_path / "cache")
    assert stage.digest(image) == data_identity.file_digest(image)
    stage.save()
    assert plan() == changed


def test_a_moved_stamp_on_a_file_never_hashed_counts_as_a_change(tmp_path):
    """No job has read the file, so there is no content to compare with: it may have changed."""
    folder = tmp_path / "videos"
    folder.mkdir()
    (folder / "a.mp4").write_bytes(b"v" * 5)
    versions = data_identity.ContentVersions(tmp_path / "cache")
    first = data_identity.folder_listing(folder, versions)
    (folder / "a.mp4").write_bytes(b"w" * 5)
    os.utime(folder / "a.mp4", OLD)
    os.utime(folder, OLD)
    _new_plan()
    assert data_identity.folder_listing(folder, data_identity.ContentVersions(tmp_path / "cache")) != first


def test_content_versions_merge_what_two_processes_saved(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("a.jpg", "b.jpg"):
        (folder / name).write_bytes(name.encode())
    one, two = (data_identity.ContentVersions(tmp_path / "cache") for _ in range(2))
    one.digest(folder / "a.jpg")
    two.digest(folder / "b.jpg")
    one.save()
    two.save()
    stored = json.loads(next((tmp_path / "cache").glob("*.json")).read_text())
    assert stored["folder"] == os.path.realpath(folder)
    assert {name: entry[4] for name, entry in stored["files"].items()} == {
        name: data_identity.file_digest(folder / name) for name in ("a.jpg", "b.jpg")}


def test_a_damaged_content_cache_is_named_and_read_afresh(tmp_path, caplog):
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"a")
    versions = data_identity.ContentVersions(tmp_path / "cache")
    versions.digest(folder / "a.jpg")
    versions.save()
    cache = next((tmp_path / "cache").glob("*.json"))
    cache.write_text("{not json")
    with caplog.at_level("WARNING"):
        assert data_identity.ContentVersions(tmp_path / "cache").digest(folder / "a.jpg") == \
            data_identity.file_digest(folder / "a.jpg")
    assert f"{cache}: unreadable content cache" in caplog.text


def test_a_cache_that_cannot_be_written_is_said_and_planning_goes_on(tmp_path, caplog):
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"a")
    (tmp_path / "cache").write_text("a file where the cache folder would be")  # as unwritable as a read-only disk
    with caplog.at_level("WARNING"):
        listing = data_identity.folder_listing(folder, data_identity.ContentVersions(tmp_path / "cache"))
    assert listing["files"] == 1 and "the content cache cannot be written" in caplog.text
