"""Archive members that cannot fool the extraction: links, caps, zip overlaps, the tar gate."""

from __future__ import annotations

import io
import os
import stat
import struct
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from verbmirage.data import archives, download
from verbmirage.data.download import prepare
from verbmirage.data.archives import (
    CorruptArchiveError,
    TarRefusedError,
    UnsafeArchiveError,
    extract,
    read_marker,
    tar_filter_is_fixed,
)

THIS_PYTHON = sys.version.split()[0]
# Our own member checks and caps do not depend on tarfile's data filter, so the tar tests below run on every
# Python with the gate held open; whether the gate opens for a given Python is tested on its own
# (test_tar_gate_follows_the_fixed_releases, test_tar_is_refused_on_this_python_and_says_which_work).
tar_gate_open = pytest.mark.usefixtures("open_tar_gate")


@pytest.fixture
def open_tar_gate(monkeypatch):
    monkeypatch.setattr(download, "TAR_EXTRACTION_ALLOWED", True)  # the gate of prepare()
    monkeypatch.setattr(archives, "TAR_EXTRACTION_ALLOWED", True)  # the gate of extract()


refused_here = pytest.mark.skipif(download.TAR_EXTRACTION_ALLOWED, reason=f"Python {THIS_PYTHON} unpacks tar")


def _tar(members: dict[str, bytes], special: list[tarfile.TarInfo] = ()) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in special:
            tar.addfile(info)
    return buffer.getvalue()


def _entry(name: str, kind: bytes, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def _path_max_escape(staging: Path) -> bytes:
    """A tar that leaves ``staging`` through a symlink chain longer than PATH_MAX (after CPython's CVE-2025-4517 test).

    Short links ``a``..``p`` each name a long folder, so ``a/b/.../p`` is short
    to write but longer than PATH_MAX once resolved. Past that length the
    unfixed ``os.path.realpath`` stops resolving, and the data filter takes a
    link at the end of the chain, which climbs back up 16 levels (to
    ``staging``), for a harmless one; ``escape`` then points at its parent. A
    hard link through ``escape`` replaces ``victim.txt`` next to the staging
    folder, and a plain member writes ``planted.txt`` there.
    """
    steps = "abcdefghijklmnop"
    long_name = "d" * ((os.pathconf(staging.parent, "PC_PATH_MAX") - len(str(staging)) - 1) // (len(steps) + 1))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b"") -> None:
            info = _entry(name, kind, link)
            info.mode, info.size = (0o777 if kind == tarfile.DIRTYPE else 0o644), len(data)
            tar.addfile(info, io.BytesIO(data))

        folder = ""
        for step in steps:
            add(os.path.join(folder, long_name), tarfile.DIRTYPE)
            add(os.path.join(folder, step), tarfile.SYMTYPE, long_name)
            folder = os.path.join(folder, long_name)
        climb = os.path.join(*steps, "l" * 254)
        add(climb, tarfile.SYMTYPE, os.path.join(*[".."] * len(steps)))
        add("escape", tarfile.SYMTYPE, os.path.join(climb, ".."))
        add("victim_link", tarfile.LNKTYPE, "escape/victim.txt")
        add("victim_link", data=b"overwritten")
        add("escape/planted.txt", data=b"planted")
    return buffer.getvalue()


def _attack(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The PATH_MAX tar as ``archive``, its ``target``, and the ``victim`` file next to the staging folder."""
    target = tmp_path / "resources" / "data" / "hico"
    target.parent.mkdir(parents=True)
    victim = target.parent / "victim.txt"
    victim.write_text("precious")
    archive = tmp_path / "attack.tar"
    archive.write_bytes(_path_max_escape(target.with_name(f".{target.name}.extracting")))
    return archive, target, victim


def _nothing_escaped(tmp_path: Path, target: Path, victim: Path) -> None:
    assert victim.read_text() == "precious"
    assert not list(tmp_path.rglob("planted.txt"))
    assert not target.exists() and not list(target.parent.glob(".*extracting"))


@pytest.mark.parametrize(
    "version, fixed",
    [
        ((3, 11, 7, "final", 0), False),
        ((3, 11, 12, "final", 0), False),
        ((3, 11, 13, "final", 0), True),
        ((3, 12, 10, "final", 0), False),
        ((3, 12, 11, "final", 0), True),
        ((3, 13, 3, "final", 0), False),
        ((3, 13, 4, "final", 0), True),
        ((3, 14, 0, "beta", 2), False),
        ((3, 14, 0, "beta", 3), True),
        ((3, 15, 0, "alpha", 1), True),
        ((3, 10, 18, "final", 0), True),
        ((3, 8, 20, "final", 0), False),
    ],
)
def test_tar_gate_follows_the_fixed_releases(version, fixed):
    assert tar_filter_is_fixed(version) is fixed


def test_path_max_symlink_tar_writes_nothing_outside(tmp_path):
    """Probe 4 on every Python: refused (the tar gate here; the link check on a fixed Python)."""
    archive, target, victim = _attack(tmp_path)
    with pytest.raises(UnsafeArchiveError):
        extract(archive, target)
    _nothing_escaped(tmp_path, target, victim)


def test_links_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    """Even a Python that passes the tar gate never reaches extractall with a link member (the attack is real here)."""
    monkeypatch.setattr(download, "TAR_EXTRACTION_ALLOWED", True)  # the gate of prepare()
    monkeypatch.setattr(archives, "TAR_EXTRACTION_ALLOWED", True)  # the gate of extract()
    archive, target, victim = _attack(tmp_path)
    with pytest.raises(UnsafeArchiveError, match=r"attack.tar: member '.*' is a link"):
        extract(archive, target)
    _nothing_escaped(tmp_path, target, victim)


@refused_here
def test_tar_is_refused_on_this_python_and_says_which_work(tmp_path):
    archive = tmp_path / "hico_20150920.tar.gz"
    archive.write_bytes(_tar({"hico_20150920/anno.mat": b"mat"}))
    with pytest.raises(TarRefusedError, match=rf"download hico: .*Python {THIS_PYTHON}.*3\.11\.13\+, 3\.12\.11\+, "
                       rf"3\.13\.4\+ or 3\.14\+, or unpack it yourself"):
        prepare(str(archive), tmp_path / "unused", tmp_path / "data" / "hico")
    disguised = tmp_path / "hico.bin"  # refused by content too, whatever the name
    disguised.write_bytes(archive.read_bytes())
    with pytest.raises(TarRefusedError, match=rf"hico.bin: tar archives are refused on Python {THIS_PYTHON}"):
        prepare(str(disguised), tmp_path / "unused", tmp_path / "data" / "hico")
    assert archive.is_file() and disguised.is_file()  # the user's archives are never deleted
    assert not (tmp_path / "data").exists()


@tar_gate_open
def test_tar_unpacks_when_the_gate_is_open(tmp_path):
    archive = tmp_path / "hico_20150920.tar.gz"
    archive.write_bytes(_tar({"hico_20150920/anno.mat": b"mat", "hico_20150920/images/a.jpg": b"jpg"}))
    target = prepare(str(archive), tmp_path / "unused", tmp_path / "data" / "hico")
    assert (target / "hico_20150920" / "anno.mat").read_bytes() == b"mat"
    assert read_marker(target)["archive"] == "hico_20150920.tar.gz"


@tar_gate_open
@pytest.mark.parametrize(
    "members, special, message",
    [
        ({"../evil.txt": b"x"}, [], "outside the target"),
        ({"/etc/owned": b"x"}, [], "outside the target"),
        ({"ok.txt": b"x"}, [_entry("link", tarfile.SYMTYPE, "/etc/passwd")], "is a link"),
        ({"ok.txt": b"x"}, [_entry("inward", tarfile.SYMTYPE, "ok.txt")], "is a link"),
        ({"ok.txt": b"x"}, [_entry("hard", tarfile.LNKTYPE, "ok.txt")], "is a link"),
        ({"ok.txt": b"x"}, [_entry("fifo", tarfile.FIFOTYPE)], "not a regular file or folder"),
        ({"ok.txt": b"x"}, [_entry("tty", tarfile.CHRTYPE)], "not a regular file or folder"),
    ],
)
def test_tar_members_other_than_files_and_folders_inside_are_refused(tmp_path, members, special, message):
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(_tar(members, special))
    with pytest.raises(UnsafeArchiveError, match=message):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "evil.txt").exists()


@tar_gate_open
def test_tar_caps(tmp_path):
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(_tar({f"f{i}": b"\0" * 1000 for i in range(20)}))
    with pytest.raises(UnsafeArchiveError, match="max_members"):
        extract(archive, tmp_path / "out", max_members=10)
    with pytest.raises(UnsafeArchiveError, match="max_bytes"):
        extract(archive, tmp_path / "out", max_bytes=10_000)
    assert not (tmp_path / "out").exists()
    extract(archive, tmp_path / "out", max_members=20, max_bytes=20_000)
    assert len(list((tmp_path / "out").glob("f*"))) == 20


def test_zip_escape_is_refused(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("CharadesEgo/ok.csv", "id\n")
        zipped.writestr("../../evil.csv", "x")
    with pytest.raises(UnsafeArchiveError, match="evil.csv"):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_members_written_from_dot_unpack(tmp_path):
    """``tar -C dir .`` style names ("./", "./a/b") are inside the target."""
    archive = tmp_path / "dots.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("./", b"")
        zipped.writestr("./hico_20150920/anno.mat", b"mat")
    extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "hico_20150920" / "anno.mat").read_bytes() == b"mat"


@tar_gate_open
def test_tar_members_written_from_dot_unpack(tmp_path):
    archive = tmp_path / "dots.tar.gz"
    archive.write_bytes(_tar({"./hico_20150920/anno.mat": b"mat"}, [_entry(".", tarfile.DIRTYPE)]))
    extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "hico_20150920" / "anno.mat").read_bytes() == b"mat"


@pytest.mark.parametrize("mode, message", [(stat.S_IFLNK | 0o777, "is a link"),
                                           (stat.S_IFCHR | 0o644, "is not a regular file or folder")])
def test_zip_links_and_devices_are_refused(tmp_path, mode, message):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("ok.csv", "id\n")
        special = zipfile.ZipInfo("special")
        special.external_attr = mode << 16
        zipped.writestr(special, "/etc/passwd")
    with pytest.raises(UnsafeArchiveError, match=rf"a.zip: member 'special' {message}"):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_zip_bomb_is_stopped_by_the_caps_before_a_byte_is_written(tmp_path):
    """Probe 23: the declared sizes and the member count are summed first (small caps make the bomb cheap)."""
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr("zeros", b"\0" * 4_000_000)
        for i in range(30):
            zipped.writestr(f"small/{i}", b"x")
    assert archive.stat().st_size < 20_000
    with pytest.raises(UnsafeArchiveError, match=r"bomb.zip: unpacks to more than 1000000 bytes \(cap max_bytes\)"):
        extract(archive, tmp_path / "out", max_bytes=1_000_000)
    with pytest.raises(UnsafeArchiveError, match=r"bomb.zip: more than 10 members \(cap max_members\)"):
        extract(archive, tmp_path / "out", max_members=10)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    extract(archive, tmp_path / "out", max_members=31, max_bytes=4_000_030)  # exactly at the caps: fine
    assert (tmp_path / "out" / "zeros").stat().st_size == 4_000_000


def test_overlapping_zip_entries_are_refused(tmp_path):
    """An entry whose data runs into the next entry's bytes (the overlap bomb) is refused before unpacking."""
    archive = tmp_path / "overlap.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zipped:
        zipped.writestr("first", b"a" * 100)
        zipped.writestr("second", b"b" * 100)
    data = bytearray(archive.read_bytes())
    central = data.index(b"PK\x01\x02")  # the first central directory record: enlarge its compressed size
    struct.pack_into("<I", data, central + 20, 400)
    archive.write_bytes(bytes(data))
    with pytest.raises(UnsafeArchiveError, match=r"overlap.zip: member 'first' overlaps the next entry"):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_zip_is_named(tmp_path):
    archive = tmp_path / "cut.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("a.csv", "id\n" * 1000)
    archive.write_bytes(archive.read_bytes()[:200])
    with pytest.raises(CorruptArchiveError, match=r"cut.zip: neither a tar nor a zip archive"):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_damaged_completion_marker_is_named_and_the_archive_unpacked_again(tmp_path, caplog):
    archive = tmp_path / "hico.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("hico/VERSION", "v1")
    target = tmp_path / "data" / "hico"
    extract(archive, target)
    marker = target / download.COMPLETE_MARKER
    marker.write_text('{"source": ')  # cut short
    (target / "hico" / "VERSION").write_text("changed")  # so the second unpacking shows
    with caplog.at_level("WARNING", logger="verbmirage.data.download"):
        extract(archive, target)
    assert f"{marker}: unreadable record (JSONDecodeError" in caplog.text
    assert (target / "hico" / "VERSION").read_text() == "v1" and read_marker(target)["archive"] == "hico.zip"
