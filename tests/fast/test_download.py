"""Downloads against a real HTTP server on loopback that misbehaves the way real servers do."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import random
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from verbmirage.data import download
from verbmirage.data.download import (
    ChecksumError,
    DownloadError,
    Source,
    completion_record,
    download_http,
    fetch,
    prepare,
)
from verbmirage.data.archives import (
    COMPLETE_MARKER,
    CorruptArchiveError,
    TarRefusedError,
    UnsafeArchiveError,
    read_marker,
)


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
    return buffer.getvalue()


ANNO = random.Random(0).randbytes(3_000_000)  # the archive is several chunks long
ARCHIVE = _zip({"hico_20150920/anno.mat": ANNO, "hico_20150920/images/test2015/a.jpg": b"jpeg" * 1000})
V1 = _zip({"VERSION": b"v1"})
V2 = _zip({"VERSION": b"v2", "NEW": b"only in v2"})


class Server:
    """Serves ``files``; each set below makes its paths misbehave in one way."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.etags, self.requests = dict(files), {}, []
        self.cut_once: set[str] = set()  # the next answer stops halfway through the body
        self.no_length: set[str] = set()  # answered without Content-Length (the end is the closed connection)
        self.wrong_offset: set[str] = set()  # a 206 that starts 100 bytes before what was asked
        self.answer_416: dict[str, str | None] = {}  # every Range request gets 416 with this Content-Range
        self.html: set[str] = set()
        self.redirects: dict[str, str] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                path, wanted = self.path, self.headers.get("Range")
                server.requests.append((path, wanted, self.headers.get("If-Range")))
                if path in server.redirects:
                    self.send_response(302)
                    self.send_header("Location", server.redirects[path])
                    self.end_headers()
                    return
                data = server.files.get(path)
                if data is None:
                    self.send_error(404)
                    return
                if path in server.html:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.end_headers()
                    self.wfile.write(b"<html><body>Sign in to continue</body></html>")
                    return
                etag = server.etags.get(path)
                if wanted and self.headers.get("If-Range") and self.headers["If-Range"] != etag:
                    wanted = None  # the file changed since the part was fetched: send all of it
                if wanted and path in server.answer_416:
                    self.send_response(416)
                    if server.answer_416[path] is not None:
                        self.send_header("Content-Range", server.answer_416[path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                if wanted:
                    start = int(wanted.removeprefix("bytes=").split("-")[0])
                    if path in server.wrong_offset:
                        start = max(0, start - 100)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                if etag:
                    self.send_header("ETag", etag)
                if path not in server.no_length:
                    self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if path in server.cut_once:
                    server.cut_once.discard(path)
                    body = body[: len(body) // 2]
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def asked(self, path: str) -> list[tuple[str | None, str | None]]:
        """(Range, If-Range) of every request for ``path``, in order."""
        return [(wanted, if_range) for asked, wanted, if_range in self.requests if asked == path]


@pytest.fixture
def server():
    s = Server({"/hico.zip": ARCHIVE, "/v1.zip": V1, "/v2.zip": V2})
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def _unpacked(target: Path) -> dict[str, bytes]:
    return {str(p.relative_to(target)): p.read_bytes() for p in sorted(target.rglob("*"))
            if p.is_file() and p.name != COMPLETE_MARKER}


def test_sources():
    assert Source.parse("https://x/y.tar.gz").kind == "http"
    assert Source.parse("gdrive:1QZcJmGVlF9f4h") == Source("gdrive", "1QZcJmGVlF9f4h")
    assert Source.parse("/data/hico_20150920.tar.gz").kind == "local"


def test_cut_transfer_resumes_with_range(server, tmp_path):
    server.files["/cut.zip"] = ARCHIVE
    server.cut_once.add("/cut.zip")
    sha256 = hashlib.sha256(ARCHIVE).hexdigest()
    target = prepare(f"{server.url}/cut.zip", tmp_path / "archives" / "hico.zip", tmp_path / "data" / "hico",
                     {"sha256": sha256})
    assert (tmp_path / "archives" / "hico.zip").read_bytes() == ARCHIVE
    ranges = [wanted for wanted, _ in server.asked("/cut.zip")]
    assert len(ranges) == 2 and ranges[0] is None
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= len(ARCHIVE) // 2  # resumed from what had arrived, not from zero
    assert (target / "hico_20150920" / "anno.mat").read_bytes() == ANNO
    assert read_marker(target)["sha256"] == sha256


def test_file_changed_between_attempts_restarts_through_if_range(server, tmp_path):
    """A part of the old file is never completed with bytes of the new one (a stale part)."""
    server.files["/moving.zip"], server.etags["/moving.zip"] = V1, '"v1"'
    server.cut_once.add("/moving.zip")
    with pytest.raises(DownloadError, match="moving.zip: gave up after 1 attempts"):
        download_http(f"{server.url}/moving.zip", tmp_path / "moving.zip", retries=0)
    server.files["/moving.zip"], server.etags["/moving.zip"] = V2, '"v2"'
    download_http(f"{server.url}/moving.zip", tmp_path / "moving.zip")
    assert (tmp_path / "moving.zip").read_bytes() == V2
    assert server.asked("/moving.zip")[1] == (f"bytes={len(V1) // 2}-", '"v1"')


def test_206_from_another_offset_starts_again(server, tmp_path):
    """Probe 11: a 206 whose Content-Range does not start where we asked is not appended."""
    server.files["/shifty.zip"] = ARCHIVE
    server.cut_once.add("/shifty.zip")
    server.wrong_offset.add("/shifty.zip")
    target = prepare(f"{server.url}/shifty.zip", tmp_path / "shifty.zip", tmp_path / "data" / "hico")
    assert (tmp_path / "shifty.zip").read_bytes() == ARCHIVE
    assert [wanted for wanted, _ in server.asked("/shifty.zip")] == [None, f"bytes={len(ARCHIVE) // 2}-", None]
    assert (target / "hico_20150920" / "anno.mat").read_bytes() == ANNO


@pytest.mark.parametrize("content_range", [None, f"bytes */{len(ARCHIVE)}", "bytes */7"])
def test_416_that_does_not_name_our_size_starts_again(server, tmp_path, content_range):
    """Probe 11: a 416 is "complete" only when its Content-Range says the file has our size."""
    server.files["/range.zip"] = ARCHIVE
    server.cut_once.add("/range.zip")
    with pytest.raises(DownloadError):
        download_http(f"{server.url}/range.zip", tmp_path / "range.zip", retries=0)
    assert (tmp_path / "range.zip.part").stat().st_size == len(ARCHIVE) // 2
    server.answer_416["/range.zip"] = content_range
    download_http(f"{server.url}/range.zip", tmp_path / "range.zip")
    assert (tmp_path / "range.zip").read_bytes() == ARCHIVE
    assert [wanted for wanted, _ in server.asked("/range.zip")] == [None, f"bytes={len(ARCHIVE) // 2}-", None]


def test_416_that_names_our_size_completes_the_part(server, tmp_path):
    """What a run killed between the last byte and the rename leaves: a whole part, completed by a 416."""
    server.files["/range.zip"] = ARCHIVE
    server.answer_416["/range.zip"] = f"bytes */{len(ARCHIVE)}"
    (tmp_path / "range.zip.part").write_bytes(ARCHIVE)
    (tmp_path / "range.zip.source.json").write_text(json.dumps({"source": f"{server.url}/range.zip"}))
    download_http(f"{server.url}/range.zip", tmp_path / "range.zip")
    assert (tmp_path / "range.zip").read_bytes() == ARCHIVE
    assert [wanted for wanted, _ in server.asked("/range.zip")] == [f"bytes={len(ARCHIVE)}-"]


def test_unknown_length_is_unverified_and_a_failed_unpack_deletes_it(server, tmp_path, caplog):
    """Probe 11: no Content-Length, then a cut: the half file fails to unpack, is deleted, and is fetched again."""
    server.files["/nolength.zip"] = ARCHIVE
    server.no_length.add("/nolength.zip")
    server.cut_once.add("/nolength.zip")
    archive, target = tmp_path / "archives" / "hico.zip", tmp_path / "data" / "hico"
    with caplog.at_level(logging.WARNING, logger="verbmirage.data.download"):
        with pytest.raises(CorruptArchiveError, match=r"hico.zip: neither a tar nor a zip"):
            prepare(f"{server.url}/nolength.zip", archive, target)
    assert "sent no length" in caplog.text and "deleting it" in caplog.text
    assert not archive.exists() and not target.exists()
    prepare(f"{server.url}/nolength.zip", archive, target)
    assert (target / "hico_20150920" / "anno.mat").read_bytes() == ANNO
    assert len(server.asked("/nolength.zip")) == 2


def test_html_page_is_refused_and_not_kept(server, tmp_path):
    server.files["/page"] = b"unused"
    server.html.add("/page")
    with pytest.raises(DownloadError, match=r"download hico: http://127\.0\.0\.1:\d+/page: the server sent an HTML"):
        prepare(f"{server.url}/page", tmp_path / "hico.zip", tmp_path / "data" / "hico")
    assert not list(tmp_path.glob("hico.zip*.part")) and not (tmp_path / "hico.zip").exists()


def test_redirect_loop_names_the_url_and_the_download(server, tmp_path):
    """Probe 25: not a bare TooManyRedirects."""
    server.redirects["/loop"] = "/loop"
    with pytest.raises(DownloadError, match=r"download hico: http://127\.0\.0\.1:\d+/loop: redirects in a loop"):
        prepare(f"{server.url}/loop", tmp_path / "hico.zip", tmp_path / "data" / "hico")
    assert not (tmp_path / "data").exists()


def test_http_error_names_the_download(server, tmp_path):
    with pytest.raises(DownloadError, match=r"download hico: .*/missing.zip: HTTP 404"):
        prepare(f"{server.url}/missing.zip", tmp_path / "hico.zip", tmp_path / "data" / "hico")


def test_checksum_mismatch_keeps_nothing(server, tmp_path):
    with pytest.raises(ChecksumError, match=r"hico.zip: sha256 is [0-9a-f]+, expected 0000"):
        prepare(f"{server.url}/hico.zip", tmp_path / "hico.zip", tmp_path / "data" / "hico", {"sha256": "0" * 64})
    assert not (tmp_path / "hico.zip").exists()
    assert not (tmp_path / "data").exists()


def test_unverified_source_warns_with_the_sha256_to_pin(server, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="verbmirage.data.download"):
        prepare(f"{server.url}/hico.zip", tmp_path / "hico.zip", tmp_path / "data" / "hico")
    assert "is unverified" in caplog.text
    assert f"add sha256: {hashlib.sha256(ARCHIVE).hexdigest()} to downloads.hico" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="verbmirage.data.download"):
        prepare(f"{server.url}/hico.zip", tmp_path / "hico.zip", tmp_path / "data" / "again",
                {"sha256": hashlib.sha256(ARCHIVE).hexdigest()})
    assert "unverified" not in caplog.text


@pytest.mark.parametrize("verified", [True, False])
def test_a_failed_unpack_deletes_only_an_unverified_archive(server, tmp_path, verified):
    """A checksum-verified archive is the right file, so it is kept; an unverified one may be a bad transfer."""
    checksums = {"sha256": hashlib.sha256(ARCHIVE).hexdigest()} if verified else {}
    with pytest.raises(UnsafeArchiveError, match=r"hico.zip: more than 1 members \(cap downloads.hico.max_members\)"):
        prepare(f"{server.url}/hico.zip", tmp_path / "hico.zip", tmp_path / "data" / "hico", checksums,
                max_members=1)
    assert (tmp_path / "hico.zip").exists() is verified
    assert not (tmp_path / "data" / "hico").exists()


def test_changed_source_fetches_and_unpacks_again(server, tmp_path):
    """Probe 10: same archive name and target, new URL: the old archive and folder are not reused."""
    archive, target = tmp_path / "archives" / "data.zip", tmp_path / "data" / "hico"
    prepare(f"{server.url}/v1.zip", archive, target)
    assert (target / "VERSION").read_bytes() == b"v1"
    prepare(f"{server.url}/v2.zip", archive, target)
    assert len(server.asked("/v2.zip")) == 1
    assert _unpacked(target) == {"VERSION": b"v2", "NEW": b"only in v2"}
    assert read_marker(target)["source"] == f"{server.url}/v2.zip"
    assert json.loads((archive.parent / "data.zip.source.json").read_text())["source"] == f"{server.url}/v2.zip"
    prepare(f"{server.url}/v2.zip", archive, target)
    assert len(server.asked("/v2.zip")) == 1  # complete and from this source: not fetched again


def test_archive_without_a_record_is_reused_only_when_its_checksum_vouches_for_it(server, tmp_path):
    """An archive left by an older version has no sidecar: a matching sha256 adopts it, otherwise it is fetched."""
    (tmp_path / "hico.zip").write_bytes(ARCHIVE)
    prepare(f"{server.url}/hico.zip", tmp_path / "hico.zip", tmp_path / "data" / "hico",
            {"sha256": hashlib.sha256(ARCHIVE).hexdigest()})
    assert server.asked("/hico.zip") == []
    (tmp_path / "other.zip").write_bytes(V1)
    prepare(f"{server.url}/hico.zip", tmp_path / "other.zip", tmp_path / "data" / "other")
    assert len(server.asked("/hico.zip")) == 1 and (tmp_path / "other.zip").read_bytes() == ARCHIVE


def test_stale_part_from_another_source_is_not_resumed(server, tmp_path):
    server.files["/cut.zip"] = V1
    server.cut_once.add("/cut.zip")
    with pytest.raises(DownloadError):
        download_http(f"{server.url}/cut.zip", tmp_path / "data.zip", retries=0)
    download_http(f"{server.url}/v2.zip", tmp_path / "data.zip")
    assert (tmp_path / "data.zip").read_bytes() == V2
    assert server.asked("/v2.zip") == [(None, None)]


def test_changed_local_archive_is_unpacked_again_and_the_marker_says_what(tmp_path):
    """Probe 10: the marker records source, archive, size and sha256; any change unpacks again."""
    archive, target = tmp_path / "data.zip", tmp_path / "data" / "hico"
    archive.write_bytes(V1)
    prepare(str(archive), tmp_path / "unused.zip", target)
    archive.write_bytes(V2)
    prepare(str(archive), tmp_path / "unused.zip", target)
    assert _unpacked(target) == {"VERSION": b"v2", "NEW": b"only in v2"}
    expected = {"source": str(archive), "archive": "data.zip", "size": len(V2),
                "sha256": hashlib.sha256(V2).hexdigest()}
    assert read_marker(target) == expected == completion_record(str(archive), target)
    assert not (tmp_path / "unused.zip").exists()


def test_local_sources_are_used_in_place_and_never_redone(tmp_path):
    archive = tmp_path / "hico_20150920.zip"
    archive.write_bytes(ARCHIVE)
    assert fetch(str(archive), tmp_path / "copy.zip") == archive  # no copy
    assert not (tmp_path / "copy.zip").exists()
    target = prepare(str(archive), tmp_path / "copy.zip", tmp_path / "data" / "hico")
    edited = target / "hico_20150920" / "anno.mat"
    edited.write_bytes(b"kept")
    prepare(str(archive), tmp_path / "copy.zip", tmp_path / "data" / "hico")
    assert edited.read_bytes() == b"kept"  # complete: not unpacked again
    folder = tmp_path / "mine"
    (folder / "hico_20150920").mkdir(parents=True)
    linked = prepare(str(folder), tmp_path / "unused", tmp_path / "data" / "mine")
    assert linked.is_symlink() and linked.resolve() == folder.resolve()
    assert completion_record(str(folder), linked) == {"source": str(folder), "folder": str(folder.resolve())}
    with pytest.raises(FileNotFoundError, match="no such file"):
        fetch(str(tmp_path / "missing.zip"), tmp_path / "x")


def test_users_own_archive_is_never_deleted_when_it_fails_to_unpack(tmp_path):
    archive = tmp_path / "hico_20150920.zip"
    archive.write_bytes(ARCHIVE[: len(ARCHIVE) // 2])
    with pytest.raises(CorruptArchiveError, match="hico_20150920.zip: neither a tar nor a zip"):
        prepare(str(archive), tmp_path / "unused", tmp_path / "data" / "hico")
    assert archive.stat().st_size == len(ARCHIVE) // 2


def test_folder_and_archive_sources_replace_each_other(tmp_path):
    """Switching a download between an archive and the user's folder never touches the user's files."""
    folder, archive, target = tmp_path / "mine", tmp_path / "data.zip", tmp_path / "data" / "hico"
    folder.mkdir()
    (folder / "VERSION").write_bytes(b"mine")
    archive.write_bytes(V1)
    prepare(str(archive), tmp_path / "unused", target)
    prepare(str(folder), tmp_path / "unused", target)
    assert target.is_symlink() and (target / "VERSION").read_bytes() == b"mine"
    prepare(str(archive), tmp_path / "unused", target)
    assert not target.is_symlink() and (target / "VERSION").read_bytes() == b"v1"
    assert (folder / "VERSION").read_bytes() == b"mine" and sorted(p.name for p in folder.iterdir()) == ["VERSION"]


def test_folder_named_like_a_tar_is_used_in_place_on_every_python(tmp_path):
    folder = tmp_path / "hico_20150920.tar"  # what a user who unpacked the tar by hand may keep
    folder.mkdir()
    (folder / "anno.mat").write_bytes(b"mat")
    linked = prepare(str(folder), tmp_path / "unused", tmp_path / "data" / "hico")
    assert (linked / "anno.mat").read_bytes() == b"mat"


def test_source_folder_that_overlaps_the_target_is_refused(tmp_path):
    (tmp_path / "data" / "hico").mkdir(parents=True)
    (tmp_path / "data" / "hico" / "keep.txt").write_text("user data")
    with pytest.raises(ValueError, match="overlaps its target"):
        prepare(str(tmp_path / "data"), tmp_path / "unused", tmp_path / "data" / "hico")
    assert (tmp_path / "data" / "hico" / "keep.txt").read_text() == "user data"


@pytest.mark.skipif(download.TAR_EXTRACTION_ALLOWED, reason="this Python unpacks tar archives")
def test_tar_source_is_refused_before_it_is_downloaded(server, tmp_path):
    with pytest.raises(TarRefusedError, match=rf"download hico: .*Python {sys.version.split()[0]}.*3\.11\.13\+"):
        prepare(f"{server.url}/hico.tar.gz", tmp_path / "hico.tar.gz", tmp_path / "data" / "hico")
    assert server.requests == []
