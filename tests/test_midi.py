"""MIDI loading: real files parse; bad, extreme or odd files give one-line MidiErrors."""

import os
import struct

import extreme
import miditoolkit
import pytest
import symusic

from musegen.errors import MidiError
from musegen.music.midi import MAX_MIDI_BYTES, find_midi_files, load_score, read_midi


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


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda p: p / "missing.mid", "no such file"),
        (lambda p: p, "is a folder"),
        (lambda p: _write(p / "e.mid", b""), "empty file"),
        (lambda p: _write(p / "t.mid", b"hello"), "not a MIDI file"),
        (lambda p: _noteless_midi(p / "n.mid"), "contains no notes"),
    ],
)
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


# ---- bounds: the time a file reaches is summed exactly, before the 32-bit parser sees it --------------


def test_ticks_are_summed_exactly_and_refused_past_2_31():
    """Where symusic's 32-bit ticks wrap (the note written at 2^32 + 1,920 lands on tick 1,920),
    the file is refused, and the refusal names the exact tick summed from its delta-times."""
    wrapped = symusic.Score.from_midi(extreme.deltas_past_2_32())
    assert max(n.time for n in wrapped.tracks[0].notes) == 1920  # (what the parser alone gives)
    with pytest.raises(MidiError, match=r"events past tick 2\^31 \(tick 4,294,969,696\)"):
        load_score(extreme.deltas_past_2_32())
    for case in ("deltas_past_2_31", "long_note_past_2_32"):
        with pytest.raises(MidiError, match=r"events past tick 2\^31"):
            load_score(extreme.MIDI_CASES[case]())


def test_long_files_below_2_31_ticks_are_read_with_their_exact_length():
    """How many bars a piece may have is the tokenizers' business; the reader keeps the length."""
    assert read_midi(extreme.tpq1_long_note())[1] == 10**6 + 1
    assert read_midi(extreme.far_marker())[1] == 8 * 480 + extreme.VLQ_MAX + 1
    score, length = read_midi(extreme.note_39000_beats())
    assert score.tpq == 32767 and score.end() == length - 1 == 32767 * (4 + 39_000)
    assert read_midi(extreme.thousand_tracks())[1] == 63 * 240 + 480 + 1


def test_smpte_division_and_oversized_input_are_refused(tmp_path):
    with pytest.raises(MidiError, match="SMPTE time division"):
        load_score(extreme.division_65535())
    big = tmp_path / "big.mid"
    with open(big, "wb") as f:
        f.write(extreme.tpq1_melody())
        f.truncate(MAX_MIDI_BYTES + 1)
    with pytest.raises(MidiError, match=r"16,777,217 bytes, more than the 16,777,216"):
        load_score(big)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda p: os.mkfifo(p / "f.mid") or p / "f.mid", "is a FIFO (named pipe), not a MIDI file"),
        (lambda p: (p / "z.mid").symlink_to("/dev/zero") or p / "z.mid", "is a character device, not a MIDI file"),
        (lambda p: (p / "l.mid").symlink_to(p / "l.mid") or p / "l.mid", "symbolic link loop"),
        (lambda p: (p / "b.mid").symlink_to(p / "gone.mid") or p / "b.mid", "no such file (a broken symbolic link)"),
    ],
)
def test_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path, make, reason):
    with pytest.raises(MidiError) as info:
        load_score(make(tmp_path))  # (a FIFO opened the ordinary way would block here for ever)
    assert reason in str(info.value)


def test_find_midi_files_lists_odd_entries_for_the_reader_to_refuse(tmp_path):
    (tmp_path / "d.mid").mkdir()  # a folder with a MIDI name: looked into, not listed
    (tmp_path / "d.mid" / "a.mid").write_bytes(b"MThd")
    os.mkfifo(tmp_path / "f.mid")
    (tmp_path / "loop.midi").symlink_to(tmp_path / "loop.midi")
    (tmp_path / "notes.txt").write_text("no")
    names = [p.relative_to(tmp_path).as_posix() for p in find_midi_files(tmp_path)]
    assert names == ["d.mid/a.mid", "f.mid", "loop.midi"]


def test_header_says_ticks_per_beat_and_an_error_names_a_non_utf8_file_printably(tmp_path):
    path = os.fsencode(tmp_path) + b"/\xff.mid"
    with open(path, "wb") as f:
        f.write(b"hello")
    with pytest.raises(MidiError) as info:
        load_score(os.fsdecode(path))
    assert str(info.value).endswith("\\xff.mid: not a MIDI file (no MThd header)")
    assert struct.unpack(">H", extreme.tpq_max_melody()[12:14])[0] == load_score(extreme.tpq_max_melody()).tpq
