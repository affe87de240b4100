"""Data preparation: downloads, archives, and the corpora that feed the REMI tokenizer."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from data_prep.download import extract, fetch
from musegen.errors import DataError


# ---------------------------------------------------------------- download / extract

def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fetch_verifies_checksum_and_writes_atomically(tmp_path):
    payload = b"musegen" * 1000
    src = tmp_path / "src.bin"
    src.write_bytes(payload)
    dest = tmp_path / "out" / "copy.bin"
    fetch(src.as_uri(), dest, sha256=_sha256(payload), md5=hashlib.md5(payload).hexdigest(), progress=False)
    assert dest.read_bytes() == payload

    bad = tmp_path / "bad.bin"
    with pytest.raises(DataError, match="sha256 mismatch"):
        fetch(src.as_uri(), bad, sha256="0" * 64, progress=False)
    assert not bad.exists()
    assert not list(tmp_path.glob(".bad.bin.*"))  # no temporary left behind


def test_fetch_reuses_a_verified_file_and_reports_network_failure(tmp_path):
    dest = tmp_path / "have.bin"
    dest.write_bytes(b"already here")
    # the URL does not exist: a matching local file must be reused without touching it
    fetch((tmp_path / "missing").as_uri(), dest, sha256=_sha256(b"already here"), progress=False)
    with pytest.raises(DataError, match="download failed"):
        fetch((tmp_path / "missing").as_uri(), tmp_path / "x.bin", progress=False)
    with pytest.raises(DataError, match="download failed"):
        fetch("http://127.0.0.1:9/nothing", tmp_path / "y.bin", progress=False)  # port 9: refused


def test_fetch_over_local_http(tmp_path):
    import http.server
    import threading
    from functools import partial

    (tmp_path / "f.txt").write_bytes(b"hello over http")
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/f.txt"
        out = fetch(url, tmp_path / "got.txt", sha256=_sha256(b"hello over http"), progress=False)
        assert out.read_bytes() == b"hello over http"
        with pytest.raises(DataError, match="download failed"):
            fetch(url.replace("f.txt", "nope.txt"), tmp_path / "nope.txt", progress=False)
    finally:
        server.shutdown()
        server.server_close()


def test_extract_zip_and_tar(tmp_path):
    zpath = tmp_path / "a.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("top/song.mid", b"MThd")
    assert (extract(zpath, tmp_path / "z") / "top" / "song.mid").read_bytes() == b"MThd"

    tpath = tmp_path / "a.tar.gz"
    with tarfile.open(tpath, "w:gz") as tf:
        info = tarfile.TarInfo("dir/x.txt")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    assert (extract(tpath, tmp_path / "t") / "dir" / "x.txt").read_bytes() == b"abc"


def test_extract_refuses_escaping_members(tmp_path):
    zpath = tmp_path / "evil.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("../escaped.txt", b"x")
    with pytest.raises(DataError, match="outside"):
        extract(zpath, tmp_path / "z")
    assert not (tmp_path / "escaped.txt").exists()

    tpath = tmp_path / "evil.tar"
    with tarfile.open(tpath, "w") as tf:
        link = tarfile.TarInfo("link")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tf.addfile(link)
    with pytest.raises(DataError, match="link"):
        extract(tpath, tmp_path / "t")

    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not an archive")
    with pytest.raises(DataError, match="not a zip or tar"):
        extract(junk, tmp_path / "j")
