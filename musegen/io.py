"""Reading the files a user names, and writing atomically.

Reading: `read_input` (and `read_head`, for a signature) is the one way musegen opens a file
given by path (MIDI, checkpoint and shard JSON, soundfonts). It accepts only regular files,
so a FIFO, a device such as /dev/zero, a folder or a symlink loop is refused in one line instead
of blocking or filling memory, and it refuses files over a size bound before reading them.
`read_json` adds a nesting bound.

Writing: a reader never sees a partial file under its final name. Everything musegen writes
(shards, checkpoints, samples, reports) goes through `atomic_path`, so an interrupted process
leaves either the previous complete file or nothing, and a full disk is reported in one line
naming the file ("disk full writing X"), whichever library was writing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .errors import DiskFullError, InputFileError, MusegenError

UMASK = os.umask(0)
os.umask(UMASK)

MAX_JSON_BYTES = 256 * 2**20  # the largest shard index (names and offsets of every piece) is a few MB
MAX_JSON_DEPTH = 64  # musegen's own JSON nests 5 deep; more is not a file musegen wrote
_KINDS = (
    (stat.S_ISDIR, "is a folder"),
    (stat.S_ISFIFO, "is a FIFO (named pipe)"),
    (stat.S_ISCHR, "is a character device"),
    (stat.S_ISBLK, "is a block device"),
    (stat.S_ISSOCK, "is a socket"),
)


def printable(text: str | os.PathLike) -> str:
    """`text` (a path, or a message holding one) safe to print and to store in JSON: bytes of a
    non-UTF-8 file name, which Python keeps as lone surrogates, become `\\xNN` escapes."""
    return os.fspath(text).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def read_input(
    path: str | os.PathLike,
    what: str = "file",
    max_bytes: int = MAX_JSON_BYTES,
    error: type[MusegenError] = InputFileError,
) -> bytes:
    """The bytes of the regular file at `path`, or `error` with one line saying why not."""
    fd, size = _open_regular(path, what, error)
    with os.fdopen(fd, "rb") as f:
        if size > max_bytes:
            raise error(f"{printable(path)}: {size:,} bytes, more than the {max_bytes:,} a {what} may have")
        data = f.read(max_bytes + 1)  # (a file still growing is cut off here, not read forever)
    if len(data) > max_bytes:
        raise error(f"{printable(path)}: more than the {max_bytes:,} bytes a {what} may have")
    return data


def check_regular(path: str | os.PathLike, what: str = "file", error: type[MusegenError] = InputFileError) -> None:
    """`error` with one line unless `path` is a regular file this process can open for reading."""
    fd, _ = _open_regular(path, what, error)
    os.close(fd)


def read_head(path: str | os.PathLike, n: int, what: str = "file", error: type[MusegenError] = InputFileError) -> bytes:
    """The first `n` bytes of the regular file at `path` (to check a format's signature)."""
    fd, _ = _open_regular(path, what, error)
    with os.fdopen(fd, "rb") as f:
        return f.read(n)


def _open_regular(path: str | os.PathLike, what: str, error: type[MusegenError]) -> tuple[int, int]:
    """(descriptor, size) of the regular file at `path`. It is opened without blocking (a plain
    open of a FIFO waits for a writer) and checked on the descriptor, so what is checked is what
    is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"{printable(path)}: {_open_failure(exc, what)}") from None
    info = os.fstat(fd)
    for test, kind in _KINDS:
        if test(info.st_mode):
            os.close(fd)
            raise error(f"{printable(path)}: {kind}, not a {what}")
    return fd, info.st_size


def _open_failure(exc: OSError, what: str) -> str:
    if exc.errno == errno.ENOENT:
        return "no such file" + (" (a broken symbolic link)" if os.path.islink(exc.filename or "") else "")
    if exc.errno == errno.ELOOP:
        return "symbolic link loop"
    if exc.errno in (errno.EACCES, errno.EPERM):
        if os.path.isdir(exc.filename or ""):
            return "permission denied (a folder that cannot be read: its files were not seen)"
        return f"permission denied (cannot read this {what})"
    return f"cannot open ({exc.strerror})"


def read_json(path: str | os.PathLike, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parse a JSON file: InputFileError (a MusegenError and an OSError) for a file that is missing,
    not a regular file or too big; ValueError (as for any invalid JSON) for bad text or nesting
    deeper than MAX_JSON_DEPTH."""
    return parse_json(read_input(path, "JSON file", max_bytes).decode("utf-8"))


def parse_json(text: str) -> Any:
    """`json.loads` with the nesting bound (ValueError past it)."""
    _check_depth(text)
    return json.loads(text)


def _check_depth(text: str) -> None:
    """ValueError when brackets nest deeper than MAX_JSON_DEPTH (the parser, and code walking the
    result, would recurse to Python's stack limit). Brackets inside strings count too: harmless,
    musegen's strings hold few."""
    depth = 0
    for char in re.sub(r"[^\[\]{}]+", "", text):
        if char in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        elif char in "]}":
            depth -= 1


NAME_MAX = 255  # bytes in one file or folder name, on Linux's file systems
TEMP_NAME_EXTRA = len("..") + 8 + len(".tmp")  # what atomic_path's temporary name adds to a name


def name_fits(name: str) -> bool:
    """Whether `atomic_path` can write a file of this name (its temporary name is longer)."""
    return len(os.fsencode(name)) + TEMP_NAME_EXTRA <= NAME_MAX


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp (and some writers that replace the file) leave 0600; give the usual permissions
        os.chmod(tmp_path, 0o666 & ~UMASK)
        with open(tmp_path, "rb") as f:  # make the bytes durable before they get the real name
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except Exception as exc:
        if is_disk_full(exc) or _no_space_left(path.parent):  # (numpy reports a short write without errno)
            raise DiskFullError(f"disk full writing {printable(path)} (No space left on device)") from None
        raise
    finally:
        tmp_path.unlink(missing_ok=True)


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC (or a quota) from Python's own writes, or wrapped by a library that writes itself:
    safetensors 0.8 reports "I/O error: No space left on device (os error 28)", older ones
    `IoError(Os { code: 28, kind: StorageFull, ... })`."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(exc)
    return "StorageFull" in text or "QuotaExceeded" in text or "No space left on device" in text


def _no_space_left(folder: Path) -> bool:
    try:
        return os.statvfs(folder).f_bavail == 0
    except OSError:
        return False


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")
