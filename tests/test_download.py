"""Downloads and extraction against a real HTTP server on loopback."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from verbmirage.download import (
    COMPLETE_MARKER,
    ChecksumError,
    UnsafeArchiveError,
    Source,
    extract,
    fetch,
    prepare,
)


def _tar(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buffer.getvalue()


ANNO = random.Random(0).randbytes(3_000_000)  # incompressible, so the archive is several chunks long
ARCHIVE = _tar({"hico_20150920/anno.mat": ANNO, "hico_20150920/images/test2015/a.jpg": b"jpeg" * 1000})


class Server:
    def __init__(self, files: dict[str, bytes]):
        self.files, self.requests, self.cut_once = files, [], {"/cut.tar.gz"}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                data = server.files.get(self.path)
                server.requests.append((self.path, self.headers.get("Range")))
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].removeprefix("bytes=").split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if self.path in server.cut_once:  # the connection drops halfway through
                    server.cut_once.discard(self.path)
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    evil = _tar({"../evil.txt": b"gotcha"})
    s = Server({"/hico.tar.gz": ARCHIVE, "/cut.tar.gz": ARCHIVE, "/evil.tar.gz": evil})
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def test_sources():
    assert Source.parse("https://x/y.tar.gz").kind == "http"
    assert Source.parse("gdrive:1QZcJmGVlF9f4h") == Source("gdrive", "1QZcJmGVlF9f4h")
    assert Source.parse("/data/hico_20150920.tar.gz").kind == "local"


def test_cut_transfer_resumes_with_range(server, tmp_path):
    sha256 = hashlib.sha256(ARCHIVE).hexdigest()
    target = prepare(f"{server.url}/cut.tar.gz", tmp_path / "archives" / "hico.tar.gz", tmp_path / "data" / "hico",
                     {"sha256": sha256})
    assert (tmp_path / "archives" / "hico.tar.gz").read_bytes() == ARCHIVE
    ranges = [r for path, r in server.requests if path == "/cut.tar.gz"]
    assert len(ranges) == 2 and ranges[0] is None
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= len(ARCHIVE) // 2  # resumed from what had arrived, not from zero
    assert (target / "hico_20150920" / "anno.mat").read_bytes() == ANNO
    assert (target / COMPLETE_MARKER).is_file()


def test_checksum_mismatch_keeps_nothing(server, tmp_path):
    with pytest.raises(ChecksumError, match=r"hico.tar.gz: sha256 is [0-9a-f]+, expected 0000"):
        prepare(f"{server.url}/hico.tar.gz", tmp_path / "hico.tar.gz", tmp_path / "data" / "hico",
                {"sha256": "0" * 64})
    assert not (tmp_path / "hico.tar.gz").exists()
    assert not (tmp_path / "data").exists()


def test_escaping_archive_is_refused(server, tmp_path):
    with pytest.raises(UnsafeArchiveError):
        prepare(f"{server.url}/evil.tar.gz", tmp_path / "evil.tar.gz", tmp_path / "data" / "evil")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "data" / "evil").exists()
    assert not list((tmp_path / "data").glob(".*extracting"))


@pytest.mark.parametrize("members, links", [({"/etc/owned": b"x"}, None), ({"ok.txt": b"x"}, {"link": "/etc/passwd"})])
def test_absolute_paths_and_outward_links_are_refused(tmp_path, members, links):
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(_tar(members, links))
    with pytest.raises(UnsafeArchiveError):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_zip_escape_is_refused(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("CharadesEgo/ok.csv", "id\n")
        zipped.writestr("../../evil.csv", "x")
    with pytest.raises(UnsafeArchiveError, match="evil.csv"):
        extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_local_sources_are_used_in_place_and_never_redone(tmp_path):
    archive = tmp_path / "hico_20150920.tar.gz"
    archive.write_bytes(ARCHIVE)
    assert fetch(str(archive), tmp_path / "copy.tar.gz") == archive  # no copy
    assert not (tmp_path / "copy.tar.gz").exists()
    target = prepare(str(archive), tmp_path / "copy.tar.gz", tmp_path / "data" / "hico")
    edited = target / "hico_20150920" / "anno.mat"
    edited.write_bytes(b"kept")
    prepare(str(archive), tmp_path / "copy.tar.gz", tmp_path / "data" / "hico")
    assert edited.read_bytes() == b"kept"  # complete: not unpacked again
    folder = tmp_path / "mine"
    (folder / "hico_20150920").mkdir(parents=True)
    linked = prepare(str(folder), tmp_path / "unused", tmp_path / "data" / "mine")
    assert linked.is_symlink() and linked.resolve() == folder.resolve()
    with pytest.raises(FileNotFoundError, match="no such file"):
        fetch(str(tmp_path / "missing.tar.gz"), tmp_path / "x")
