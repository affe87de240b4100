"""MIDI loading: real files parse, bad files give one-line MidiErrors."""

import miditoolkit
import pytest

from musegen.errors import MidiError
from musegen.midi import find_midi_files, load_score


def test_loads_real_pop909_song(pop909_songs):
    score = load_score(pop909_songs[0])
    assert score.tpq == 480
    assert [t.name for t in score.tracks] == ["MELODY", "BRIDGE", "PIANO"]
    assert sum(len(t.notes) for t in score.tracks) > 100


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _noteless_midi(path):
    midi = miditoolkit.MidiFile()
    midi.instruments = [miditoolkit.Instrument(0)]
    midi.dump(str(path))
    return path


@pytest.mark.parametrize("make, reason", [
    (lambda p: p / "missing.mid", "no such file"),
    (lambda p: p, "is a folder"),
    (lambda p: _write(p / "e.mid", b""), "empty file"),
    (lambda p: _write(p / "t.mid", b"hello"), "not a MIDI file"),
    (lambda p: _noteless_midi(p / "n.mid"), "contains no notes"),
])
def test_bad_files_raise_one_line(tmp_path, make, reason):
    with pytest.raises(MidiError) as info:
        load_score(make(tmp_path))
    assert reason in str(info.value) and "\n" not in str(info.value)


def test_truncated_real_file_is_rejected(tmp_path, pop909_songs):
    data = pop909_songs[0].read_bytes()
    with pytest.raises(MidiError, match="corrupt MIDI"):
        load_score(data[: len(data) // 3])


def test_find_midi_files(tmp_path):
    with pytest.raises(MidiError, match="no MIDI files"):
        find_midi_files(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.mid").write_bytes(b"MThd")
    assert find_midi_files(tmp_path) == [tmp_path / "sub" / "a.mid"]
