"""Reading only regular files, bounded; atomic writes: an interrupted write never replaces or
truncates the previous file, and a full disk is one line naming the file."""

import json
import os

import pytest

from musegen import io as musegen_io
from musegen.errors import DiskFullError, MusegenError
from musegen.io import MAX_JSON_DEPTH, atomic_path, printable, read_input, read_json, write_json


def test_write_json_round_trip(tmp_path):
    write_json(tmp_path / "a" / "x.json", {"k": [1, 2]})
    assert read_json(tmp_path / "a" / "x.json") == {"k": [1, 2]}


def test_failed_write_keeps_previous_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "x.json"
    write_json(target, {"version": 1})
    with pytest.raises(DiskFullError, match=r"^disk full writing .*x\.json \(No space left on device\)$"):
        with atomic_path(target) as tmp:
            tmp.write_text('{"version": 2, "trunc')
            raise OSError(28, "No space left on device")  # as a full disk would
    assert read_json(target) == {"version": 1}
    assert os.listdir(tmp_path) == ["x.json"]


def test_written_files_get_normal_permissions(tmp_path):
    write_json(tmp_path / "x.json", {})
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o666 & ~mask


def test_read_input_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    cases = {
        tmp_path / "fifo": "is a FIFO (named pipe), not a JSON file",
        "/dev/zero": "is a character device",
        tmp_path: "is a folder",
        tmp_path / "loop": "symbolic link loop",
        tmp_path / "none": "no such file",
    }
    for path, words in cases.items():
        with pytest.raises(MusegenError) as info:
            read_input(path, "JSON file", 100)
        assert words in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(MusegenError, match="101 bytes, more than the 100 a JSON file may have"):
        read_input(tmp_path / "big", "JSON file", 100)
    assert read_input(tmp_path / "big", "JSON file", 101) == b"x" * 101


def test_read_json_refuses_deep_nesting_as_invalid_json(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        read_json(tmp_path / "deep.json")
    (tmp_path / "ok.json").write_text("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    assert read_json(tmp_path / "ok.json") is not None


def test_printable_turns_non_utf8_bytes_into_escapes_json_keeps():
    name = os.fsdecode(b"caf\xe9/\xff.mid")
    assert printable(name) == "caf\\xe9/\\xff.mid"
    assert json.loads(json.dumps(printable(name))) == "caf\\xe9/\\xff.mid"
    assert printable("Beyoncé ♪.mid") == "Beyoncé ♪.mid"  # valid UTF-8 names are left as they are


def test_a_short_write_on_a_full_disk_is_reported_as_disk_full(tmp_path, monkeypatch):
    """numpy reports a short write as `OSError("N requested and M written")`, without errno: the
    disk's free space tells."""
    monkeypatch.setattr(musegen_io.os, "statvfs", lambda path: os.statvfs_result((4096,) * 4 + (0,) * 6))
    with pytest.raises(DiskFullError, match=r"disk full writing .*x\.npy "):
        with atomic_path(tmp_path / "x.npy"):
            raise OSError("74501 requested and 34752 written")
    assert os.listdir(tmp_path) == []
