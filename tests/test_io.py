"""Atomic writes: an interrupted write never replaces or truncates the previous file."""

import os

import pytest

from musegen.io import atomic_path, read_json, write_json


def test_write_json_round_trip(tmp_path):
    write_json(tmp_path / "a" / "x.json", {"k": [1, 2]})
    assert read_json(tmp_path / "a" / "x.json") == {"k": [1, 2]}


def test_failed_write_keeps_previous_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "x.json"
    write_json(target, {"version": 1})
    with pytest.raises(OSError):
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
