"""Fetching and unpacking raw corpora: checksummed downloads and safe archive extraction.

A download goes to a temporary file beside its destination and only takes the final name
after the checksum matches, so an interrupted or corrupted transfer never looks complete.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, JsonValue
from tqdm import tqdm

from musegen import schemas
from musegen.errors import DataError
from musegen.io import atomic_path

CHUNK = 1 << 20
TIMEOUT_S = 60
ZENODO_API = "https://zenodo.org/api/records"
MAX_RECORD_BYTES = 16 * 2**20  # a record's metadata is a few kB


class ZenodoFile(BaseModel):
    model_config = schemas.OPEN
    key: schemas.Name | None = None
    filename: schemas.Name | None = None  # (older records)
    checksum: schemas.Name = ""  # "md5:<hex>"
    links: dict[str, JsonValue] = {}


class ZenodoRecord(BaseModel):
    """What Zenodo's records API says of a record (data_prep/download.py reads its files' checksums)."""

    model_config = schemas.OPEN
    files: Annotated[list[ZenodoFile], Field(max_length=100_000)] = []


ZENODO_RECORD = schemas.Format("zenodo record", None, ZenodoRecord)


def fetch(
    url: str, dest: str | os.PathLike, sha256: str | None = None, md5: str | None = None, progress: bool = True
) -> Path:
    """Download `url` to `dest`, verifying the checksum(s) given; return `dest`.

    An existing `dest` whose checksum matches is reused without downloading again.
    """
    dest = Path(dest)
    expected = {name: value.lower() for name, value in (("sha256", sha256), ("md5", md5)) if value}
    if dest.is_file() and expected and _digests(dest, expected) == expected:
        return dest
    try:
        with atomic_path(dest) as tmp:
            hashes = {name: hashlib.new(name) for name in expected}
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(tmp, "wb") as f:
                total = int(response.headers.get("Content-Length") or 0) or None
                with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, disable=not progress) as bar:
                    while chunk := response.read(CHUNK):
                        f.write(chunk)
                        for h in hashes.values():
                            h.update(chunk)
                        bar.update(len(chunk))
            for name, h in hashes.items():
                if h.hexdigest() != expected[name]:
                    raise DataError(f"{url}: {name} mismatch (expected {expected[name]}, got {h.hexdigest()})")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise DataError(f"{url}: download failed ({reason})") from None
    return dest


def zenodo_file(record: int | str, filename: str, api: str = ZENODO_API) -> tuple[str, str]:
    """(download URL, md5) of one file of a Zenodo record, read from Zenodo's records API.

    The checksum comes from the record itself, so a corrupted or substituted download is caught."""
    try:
        with urllib.request.urlopen(f"{api}/{record}", timeout=TIMEOUT_S) as response:
            text = response.read(MAX_RECORD_BYTES).decode("utf-8")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DataError(
            f"Zenodo record {record}: metadata unavailable ({getattr(exc, 'reason', None) or exc})"
        ) from None
    for entry in schemas.loads(text, ZENODO_RECORD, f"Zenodo record {record}").files:
        if (entry.key or entry.filename) == filename:
            algorithm, _, digest = entry.checksum.partition(":")
            if algorithm != "md5" or not digest:
                raise DataError(f"Zenodo record {record}: no md5 checksum for {filename}")
            link = entry.links.get("self")
            url = link if isinstance(link, str) else f"https://zenodo.org/records/{record}/files/{filename}?download=1"
            return url, digest
    raise DataError(f"Zenodo record {record} has no file {filename!r}")


def extract(archive: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Unpack a zip or tar archive into `dest`, refusing members that would land outside it."""
    archive, dest = Path(archive), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                for name in zf.namelist():
                    _check_inside(root, name, archive)
                zf.extractall(dest)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                for member in tf.getmembers():
                    _check_inside(root, member.name, archive)
                    if member.issym() or member.islnk():  # a link could point anywhere
                        raise DataError(f"{archive}: member {member.name!r} is a link; refusing to extract")
                    if not (member.isfile() or member.isdir()):
                        raise DataError(f"{archive}: member {member.name!r} is not a file or folder")
                tf.extractall(dest, filter="data")  # also strips unsafe modes/owners
        else:
            raise DataError(f"{archive}: not a zip or tar archive")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as exc:
        raise DataError(f"{archive}: corrupt archive ({exc})") from None
    return dest


def _check_inside(root: Path, name: str, archive: Path) -> None:
    target = (root / name).resolve()
    if target != root and root not in target.parents:
        raise DataError(f"{archive}: member {name!r} would be written outside {root}; refusing to extract")


def _digests(path: Path, names) -> dict[str, str]:
    hashes = {name: hashlib.new(name) for name in names}
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            for h in hashes.values():
                h.update(chunk)
    return {name: h.hexdigest() for name, h in hashes.items()}
