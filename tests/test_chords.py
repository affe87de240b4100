"""musegen.music.chords must label beats as chorder's Dechorder does (Pop1K7's chords came from it)."""

from __future__ import annotations

import numpy as np
import pytest
import symusic
from chorder import Dechorder
from conftest import pop909_files
from miditoolkit.midi import containers, parser

from musegen.music.chords import QUALITIES, detect_chords


def _notes_of(path):
    score = symusic.Score(str(path))
    arrays = [t.notes.numpy() for t in score.tracks if not t.is_drum]
    start = np.concatenate([a["time"] for a in arrays]).astype(np.int64)
    end = start + np.concatenate([a["duration"] for a in arrays])
    pitch = np.concatenate([a["pitch"] for a in arrays])
    return start, end, pitch, score.tpq


def _chorder_labels(start, end, pitch, tpq):
    """chorder on a miditoolkit file holding exactly these notes: (root, quality, bass) per beat, -1 for None."""
    midi = parser.MidiFile()
    midi.ticks_per_beat = tpq
    piano = containers.Instrument(program=0)
    piano.notes = [containers.Note(64, int(p), int(s), int(e)) for s, e, p in zip(start, end, pitch)]
    midi.instruments = [piano]
    midi.max_tick = int(max(end))
    out = []
    for c in Dechorder.dechord(midi):
        out.append(
            (
                -1 if c.root_pc is None else c.root_pc,
                -1 if c.quality is None else QUALITIES.index(c.quality),
                -1 if c.bass_pc is None else c.bass_pc,
            )
        )
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def _ours(start, end, pitch, tpq):
    beats = detect_chords(start, end, pitch, tpq)
    return np.stack([beats.root, beats.quality, beats.bass], axis=1).astype(np.int64)


def _agreement(paths):
    agree = total = 0
    for path in paths:
        notes = _notes_of(path)
        ref, ours = _chorder_labels(*notes), _ours(*notes)
        assert ref.shape == ours.shape
        agree += int((ref == ours).all(axis=1).sum())
        total += len(ref)
    return agree, total


def test_agrees_with_chorder_on_pop909(pop909_songs):
    agree, total = _agreement(pop909_songs)
    assert total > 5000
    assert agree / total >= 0.99, f"{agree}/{total} beats agree"


@pytest.mark.slow
def test_agrees_with_chorder_on_every_pop909_song(full_pop909):
    agree, total = _agreement(pop909_files(folder=full_pop909))
    print(f"chord agreement: {agree}/{total} beats = {100 * agree / total:.3f}%")
    assert agree / total >= 0.99


def _triad(pitches, beats, tpq=480, offset=0):
    start = np.full(len(pitches), offset)
    return start, start + beats * tpq, np.array(pitches)


@pytest.mark.parametrize(
    "pitches, expected",
    [
        ([60, 64, 67], (0, "M", 0)),  # C major
        ([57, 60, 64], (9, "m", 9)),  # A minor
        ([60, 64, 67, 70], (0, "7", 0)),  # C7: the minor seventh turns M into 7
        ([60, 64, 67, 71], (0, "M7", 0)),
        ([57, 60, 64, 67], (9, "m7", 9)),
        ([48, 64, 67, 69], (9, "m7", 0)),  # C bass under E G A: chorder's re-rooting applies
        ([60, 62, 67], (0, "sus2", 0)),
        ([62, 65, 68], (2, "o", 2)),
        ([44, 71, 74, 77], (2, "o", 8)),  # symmetric diminished seventh: first root in chorder's order, G# bass
    ],
)
def test_labels_of_simple_chords_match_chorder(pitches, expected):
    notes = _triad(pitches, beats=4)
    ours = _ours(*notes, 480)
    ref = _chorder_labels(*notes, 480)
    np.testing.assert_array_equal(ours, ref)
    root, quality, bass = expected
    assert tuple(ours[0]) == (root, QUALITIES.index(quality), bass)


def test_lookback_quirk_ignores_a_long_note_started_many_onsets_earlier():
    # A C2 pedal held for 8 beats, then 12 short onsets of an E minor triad: chorder's window search
    # starts 10 onset times back, so late beats no longer see the pedal.
    start, end, pitch = [0], [8 * 480], [36]
    for i in range(12):
        for p in (64, 67, 71):
            start.append(120 * i + 10)
            end.append(120 * i + 130)
            pitch.append(p)
    start, end, pitch = (np.array(a) for a in (start, end, pitch))
    np.testing.assert_array_equal(_ours(start, end, pitch, 480), _chorder_labels(start, end, pitch, 480))


def test_silence_and_empty_input():
    start, end, pitch = _triad([60, 64, 67], beats=1, offset=4 * 480)
    beats = detect_chords(start, end, pitch, 480)
    assert len(beats) == 5 and (beats.root[:4] == -1).all()
    assert (beats.root[4], beats.quality[4], beats.bass[4]) == (0, QUALITIES.index("M"), 0)
    assert len(detect_chords([], [], [], 480)) == 0


def test_a_range_of_beats_gets_the_labels_the_whole_song_gives_them(pop909_songs):
    start, end, pitch, tpq = _notes_of(pop909_songs[0])
    whole = _ours(start, end, pitch, tpq)
    part = detect_chords(start, end, pitch, tpq, max_tick=100 * tpq, first_beat=40)
    np.testing.assert_array_equal(np.stack([part.root, part.quality, part.bass], axis=1), whole[40:100])
    assert len(set(map(tuple, whole[40:100]))) > 5  # real chord changes, not a silent stretch
    with pytest.raises(ValueError, match="even"):
        detect_chords(start, end, pitch, tpq, first_beat=41)


def test_windows_counted_in_small_chunks_give_the_same_labels(pop909_songs, monkeypatch):
    from musegen.music import chords

    notes = _notes_of(pop909_songs[1])
    whole = _ours(*notes)
    monkeypatch.setattr(chords, "_PAIRS_PER_CHUNK", 64)  # hundreds of chunks instead of one
    np.testing.assert_array_equal(_ours(*notes), whole)
