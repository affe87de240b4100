"""The REMI tokenizer: Pop1K7 vocabulary, exact round trip on POP909, grammar, transposition, bad input."""

from __future__ import annotations

import io
import math
import multiprocessing as mp
import subprocess
import sys
import tracemalloc
from collections import Counter
from fractions import Fraction

import miditoolkit
import mido
import numpy as np
import pytest
import symusic
from conftest import pop909_files

from musegen.errors import MidiError, TokenError
from musegen.music.constants import TICKS_PER_BEAT
from musegen.music.notes import NoteTable
from musegen.tokenizers import tokenizer_from_dict
from musegen.tokenizers.remi import RemiTokenizer

TOK = RemiTokenizer()


def ids_of(*names):
    return [TOK.vocab.index(n) for n in names]


# ---------------------------------------------------------------- vocabulary


def test_default_vocabulary_is_pop1k7():
    tempos = list(range(32, 150, 3)) + [155, 158, 161, 167, 170, 176, 182, 188, 194, 200, 206, 215, 221, 224]
    roots = "A A# B C C# D D# E F F# G G#".split()
    qualities = "+ /o7 7 M M7 m m7 o o7 sus2 sus4".split()
    expected = (
        ["Bar_None", "EOS_None"]
        + [f"Beat_{k}" for k in range(16)]
        + [f"Chord_{r}_{q}" for r in roots for q in qualities]
        + ["Chord_N_N"]
        + [f"Tempo_{t}" for t in tempos]
        + [f"Note_Pitch_{p}" for p in range(22, 108)]
        + [f"Note_Velocity_{v}" for v in range(40, 87, 2)]
        + [f"Note_Duration_{d}" for d in range(0, 1921, 120)]
    )
    assert len(expected) == 332 and len(tempos) == 54
    assert TOK.vocab[:332] == sorted(expected)
    assert TOK.vocab_size == 333 and TOK.pad_id == 332
    assert TOK.vocab[:4] == ["Bar_None", "Beat_0", "Beat_1", "Beat_10"]


def test_settings_rebuild_the_same_tokenizer():
    for tok in (TOK, RemiTokenizer(beat_resolution=8, max_duration=32, chords=False)):
        again = tokenizer_from_dict(tok.to_dict())
        assert isinstance(again, RemiTokenizer) and again.vocab == tok.vocab
        assert again.settings() == tok.settings()


# ---------------------------------------------------------------- round trip on every POP909 song


def expected_notes(source, tok: RemiTokenizer) -> Counter:
    """The notes of a MIDI file (path, or a symusic.Score) as REMI keeps them, computed by hand
    (exact fractions, per note), independent of the tokenizer's numpy code: onset and duration
    (capped at max_duration first) rounded half to even, velocity to the nearest bin (ties
    down), pitch folded into range, onsets counted from the first onset's bar (4/4 from tick 0)."""
    score = source if isinstance(source, symusic.Score) else symusic.Score(str(source))
    res, tpq = tok.beat_resolution, score.tpq
    lo, hi = tok.pitch_range
    vmin, vmax, vstep = tok.velocity_range
    notes = []
    for track in score.tracks:
        if track.is_drum:
            continue
        for n in track.notes:
            pitch = n.pitch
            while pitch < lo:
                pitch += 12
            while pitch > hi:
                pitch -= 12
            onset = round(Fraction(n.time * res, tpq))
            duration = round(min(Fraction(n.duration * res, tpq), tok.max_duration))
            bin_ = min(max(math.ceil(Fraction(n.velocity - vmin, vstep) - Fraction(1, 2)), 0), (vmax - vmin) // vstep)
            notes.append((onset, pitch, duration, vmin + vstep * bin_))
    first_bar = min(n[0] for n in notes) // tok.positions_per_bar
    return Counter((onset - first_bar * tok.positions_per_bar, *rest) for onset, *rest in notes)


def decoded_notes(piece: NoteTable, tok: RemiTokenizer) -> Counter:
    """(grid position, pitch, duration, velocity) of every decoded note, over all its tracks."""
    step = piece.tpq // tok.beat_resolution
    notes = Counter()
    columns = (piece.start, piece.end, piece.pitch, piece.velocity)
    for start, end, pitch, velocity in zip(*(c.tolist() for c in columns)):
        assert start % step <= tok.max_note_offset  # a cell's notes start a few ticks apart at most
        notes[(start // step, pitch, round((end - start) / step), velocity)] += 1
    return notes


def _check_song(path):
    """Round trips, grammar and transposition for one song; returns a list of problems."""
    problems = []
    try:
        enc = TOK.encode(path)
    except MidiError as exc:
        return [], str(exc)
    piece = TOK.decode(enc.ids)
    got, want = decoded_notes(piece, TOK), expected_notes(path, TOK)
    if got != want:
        problems.append(f"{path}: {sum((want - got).values())} missing, {sum((got - want).values())} extra notes")
    if not np.array_equal(TOK.encode(piece.midi_bytes()).ids, enc.ids):
        problems.append(f"{path}: decode then encode changes the ids")
    violation = TOK.grammar().first_violation(enc.ids)
    if violation is not None:
        problems.append(f"{path}: grammar rejects token {violation}")
    for shift in (-6, -1, 5):
        moved = TOK.transpose(enc.ids, shift)
        if moved is not None and not np.array_equal(TOK.transpose(moved, -shift), enc.ids):
            problems.append(f"{path}: transpose {shift:+d} then back is not the identity")
    return problems, None


def _check_songs(files):
    with mp.get_context("fork").Pool(2) as pool:
        results = pool.map(_check_song, files, chunksize=8)
    problems = [p for song_problems, _ in results for p in song_problems]
    skipped = [reason for _, reason in results if reason is not None]
    assert problems == [], "\n".join(problems[:10])
    # POP909 declares 3/4 or 6/8 in a few files: those, and only those, are refused
    assert len(skipped) < 0.02 * len(files) and all("time signature 3/4" in r or "6/8" in r for r in skipped), skipped


def test_round_trip_grammar_and_transpose_on_pop909_songs(pop909_dir):
    files = pop909_files()
    assert len(files) == 34
    _check_songs(files)


@pytest.mark.slow
def test_round_trip_grammar_and_transpose_on_every_pop909_song(full_pop909):
    files = pop909_files(folder=full_pop909)
    assert len(files) > 800
    _check_songs(files)


# ---------------------------------------------------------------- encoding details, on MIDI built here


def make_midi(tmp_path, notes, tpq=480, time_signatures=((4, 4, 0),), tempos=((120, 0),), drum=False, name="x.mid"):
    """notes: (start, end, pitch, velocity) in ticks."""
    midi = miditoolkit.MidiFile(ticks_per_beat=tpq)
    inst = miditoolkit.Instrument(program=0, is_drum=drum, name="t")
    inst.notes = [miditoolkit.Note(v, p, s, e) for s, e, p, v in notes]
    midi.instruments.append(inst)
    midi.time_signature_changes = [miditoolkit.TimeSignature(n, d, t) for n, d, t in time_signatures]
    midi.tempo_changes = [miditoolkit.TempoChange(bpm, t) for bpm, t in tempos]
    path = tmp_path / name
    midi.dump(str(path))
    return path


def names(ids):
    return [TOK.vocab[i] for i in ids]


def test_encoding_layout_chords_and_tempo_changes(tmp_path):
    # Bar 0: C major triad on beat 0 (one bar long); bar 1: a short G (too short to be a chord for
    # chorder) on the "and" of beat 3, after a tempo change on beat 3.
    notes = [(0, 1920, 60, 80), (0, 1920, 64, 80), (0, 1920, 67, 80), (1920 + 960 + 240, 1920 + 960 + 480, 67, 30)]
    path = make_midi(tmp_path, notes, tempos=((120, 0), (90, 1920 + 960)))
    enc = TOK.encode(path)
    assert names(enc.ids) == [
        "Bar_None",
        "Beat_0",
        "Chord_C_M",
        "Tempo_119",
        "Note_Pitch_67",
        "Note_Velocity_80",
        "Note_Duration_1920",  # falling pitch inside a cell
        "Note_Pitch_64",
        "Note_Velocity_80",
        "Note_Duration_1920",
        "Note_Pitch_60",
        "Note_Velocity_80",
        "Note_Duration_1920",
        "Bar_None",
        "Beat_0",
        "Chord_N_N",
        "Beat_8",
        "Tempo_89",
        "Beat_10",
        "Note_Pitch_67",
        "Note_Velocity_40",
        "Note_Duration_240",
        "Bar_None",
        "EOS_None",
    ]
    assert enc.report["notes"] == 4 and enc.report["bars"] == 2
    piece = TOK.decode(enc.ids)
    assert [(tick, round(qpm, 3)) for tick, qpm in piece.tempos] == [(0, 119), (2880, 89)]
    assert piece.markers == [(0, "C_M"), (1920, "N_N")]


def test_reference_conventions(tmp_path):
    """Rounding half to even, velocity ties down, leading empty bars dropped, tempos as miditoolkit
    reads them (repeats of the raw value dropped, equal bins kept), the first of a cell's
    tempos wins, and what precedes the first bar lands in its first cell."""
    notes = [
        (1920 * 2 + 60, 1920 * 2 + 60 + 180, 60, 41),  # onset 16.5 -> 16 (even), 1.5 steps -> 2
        (1920 * 2 + 180, 1920 * 2 + 180 + 60, 62, 43),
    ]  # onset 17.5 -> 18, 0.5 steps -> 0
    tempos = (
        (100, 0),
        (130, 960),
        (100, 1920 * 2 + 1),
        (100, 1920 * 2 + 240),  # the raw value repeated: miditoolkit drops it
        (101, 1920 * 2 + 480),  # another raw value in the same bin: kept
        (70, 1920 * 2 + 600),
        (71, 1920 * 2 + 605),  # one cell: the first wins
        (152.5, 1920 * 2 + 720),
    )  # 152 on the 3-bpm grid, not a Pop1K7 tempo: 149 (tie, lower)
    enc = TOK.encode(make_midi(tmp_path, notes, tempos=tempos))
    assert names(enc.ids) == [
        "Bar_None",
        "Beat_0",
        "Chord_N_N",
        "Tempo_101",  # the tempo at tick 0, not the one in effect
        "Note_Pitch_60",
        "Note_Velocity_40",
        "Note_Duration_240",
        "Beat_2",
        "Note_Pitch_62",
        "Note_Velocity_42",
        "Note_Duration_0",
        "Beat_4",
        "Tempo_101",
        "Beat_5",
        "Tempo_71",
        "Beat_6",
        "Tempo_149",
        "Bar_None",
        "EOS_None",
    ]


def test_same_pitch_notes_are_all_kept_and_round_trip(tmp_path):
    # melody and piano doubling a pitch, with other lengths and loudness, and a re-struck key
    notes = [
        (0, 960, 60, 80),
        (0, 480, 60, 50),
        (10, 1920, 64, 70),
        (0, 240, 67, 60),
        (480, 600, 64, 90),
        (470, 960, 60, 100),
    ]
    path = make_midi(tmp_path, notes)
    enc = TOK.encode(path)
    assert enc.report["notes"] == 6
    cell0 = [n for n in names(enc.ids)[4:] if n.startswith("Note_Pitch")][:4]
    assert cell0 == ["Note_Pitch_67", "Note_Pitch_60", "Note_Pitch_60", "Note_Pitch_64"]  # onset, then falling pitch
    piece = TOK.decode(enc.ids)
    assert [t.name for t in piece.tracks] == ["Piano", "Piano (2)", "Piano (3)"]  # 60 sounds three times at once
    assert decoded_notes(piece, TOK) == expected_notes(path, TOK)
    assert np.array_equal(TOK.encode(piece.midi_bytes()).ids, enc.ids)


def test_pitches_out_of_range_are_folded_and_counted(tmp_path):
    path = make_midi(tmp_path, [(0, 480, 10, 64), (0, 480, 120, 64), (480, 960, 60, 64)])
    enc = TOK.encode(path)
    pitches = sorted(int(TOK.pitch_of[i]) for i in enc.ids if TOK.pitch_of[i] >= 0)
    assert pitches == [22, 60, 96]
    assert enc.report["pitches_folded"] == 2


def test_long_notes_are_clipped_and_counted(tmp_path):
    path = make_midi(tmp_path, [(0, 480 * 8, 60, 64), (0, 480, 64, 64)])
    enc = TOK.encode(path)
    assert "Note_Duration_1920" in names(enc.ids) and enc.report["durations_clipped"] == 1


def test_other_resolutions_and_grids(tmp_path):
    # 96 ticks per beat in, 8 positions per beat: a 32nd-note run survives the round trip
    notes = [(12 * i, 12 * i + 12, 60 + i, 70) for i in range(16)]
    path = make_midi(tmp_path, notes, tpq=96)
    tok = RemiTokenizer(beat_resolution=8, max_duration=32)
    enc = tok.encode(path)
    assert decoded_notes(tok.decode(enc.ids), tok) == expected_notes(path, tok)
    assert tok.grammar().first_violation(enc.ids) is None
    # the same music at 960 ticks per beat encodes the same: REMI counts beats, not ticks
    again = make_midi(tmp_path, [(10 * s, 10 * e, p, v) for s, e, p, v in notes], tpq=960, name="y.mid")
    assert np.array_equal(tok.encode(again).ids, enc.ids)


# ---------------------------------------------------------------- meter


def bar_of_each_note(ids) -> list[tuple[int, int]]:
    """(bar, position) of every note of an encoding, in token order."""
    out, bar, pos = [], -1, 0
    for name in names(ids):
        if name == "Bar_None":
            bar += 1
        elif name.startswith("Beat_"):
            pos = int(name[5:])
        elif name.startswith("Note_Pitch"):
            out.append((bar, pos))
    return out


def test_pop909_duple_time_signatures_are_read_as_four_four(tmp_path):
    notes = [(0, 480, 60, 64), (1920, 2400, 62, 64)]
    for num, den in ((1, 4), (2, 4), (4, 4), (2, 2)):
        enc = TOK.encode(make_midi(tmp_path, notes, time_signatures=((num, den, 0),)))
        assert names(enc.ids).count("Bar_None") == 3  # two bars of 4/4, then the closing Bar
    # a 2/4 that starts off the beat, as in POP909's song 043, moves no bar line either
    enc = TOK.encode(make_midi(tmp_path, notes, time_signatures=((4, 4, 0), (2, 4, 1001))))
    assert bar_of_each_note(enc.ids) == [(0, 0), (1, 0)]


def test_a_pickup_ends_at_the_first_bar_line(tmp_path):
    # one beat of pickup (1/4), then 4/4: the downbeat after it opens bar 1
    notes = [(0, 480, 67, 64), (480, 960, 72, 64), (480 + 1920, 480 + 2400, 71, 64)]
    enc = TOK.encode(make_midi(tmp_path, notes, time_signatures=((1, 4, 0), (4, 4, 480))))
    assert bar_of_each_note(enc.ids) == [(0, 12), (1, 0), (2, 0)]
    assert TOK.grammar().first_violation(enc.ids) is None


def test_a_lone_short_bar_inside_four_four_is_refused_naming_it(tmp_path):
    # 4/4, one bar of 2/4, 4/4 again: REMI could only pad the short bar with silence (issue 44)
    notes = [(0, 480, 60, 64), (1920, 2400, 62, 64), (1920 + 960, 1920 + 1440, 64, 64), (1920 * 2 + 960, 5280, 65, 64)]
    signatures = ((4, 4, 0), (2, 4, 1920), (4, 4, 1920 + 960))
    with pytest.raises(MidiError, match=r"bar 2 is in 2/4 and ends off the 4/4 bar lines \(at tick 2880\)"):
        TOK.encode(make_midi(tmp_path, notes, time_signatures=signatures))
    # before the first note the padding is silence that is not written: the bar after it opens the piece
    later = [(s + 4800, e + 4800, p, v) for s, e, p, v in notes]
    enc = TOK.encode(make_midi(tmp_path, later, time_signatures=signatures, name="y.mid"))
    assert bar_of_each_note(enc.ids) == [(0, 0), (1, 0), (1, 8), (2, 8)]
    assert TOK.grammar().first_violation(enc.ids) is None


def test_a_bar_starting_off_the_beat_is_refused(tmp_path):
    path = make_midi(tmp_path, [(0, 480, 60, 64)], time_signatures=((4, 4, 0), (4, 4, 1000)))
    with pytest.raises(MidiError, match="time signature 4/4 at tick 1000 starts a bar off the beat"):
        TOK.encode(path)


# ---------------------------------------------------------------- grammar

OPENING = ("Bar_None", "Beat_0", "Chord_C_M", "Tempo_119")
NOTE = ("Note_Velocity_80", "Note_Duration_120")


def test_grammar_accepts_what_pop1k7_writes():
    g = TOK.grammar()
    ok = ids_of(
        *OPENING,
        "Note_Pitch_60",
        *NOTE,
        "Note_Pitch_64",
        *NOTE,  # pitch going up
        "Note_Pitch_60",
        *NOTE,
        "Note_Pitch_60",
        *NOTE,  # one pitch twice in a cell
        "Beat_1",
        "Note_Pitch_60",
        *NOTE,  # while the earlier 60 still sounds
        "Beat_4",
        "Chord_C_M",
        "Tempo_119",  # the chord and tempo in effect, repeated
        "Note_Pitch_50",
        *NOTE,
        "Note_Pitch_40",
        *NOTE,
        "Bar_None",
        "Bar_None",
        "Beat_2",
        "Tempo_89",
        "Bar_None",
        "Beat_0",
        "Note_Pitch_40",
        *NOTE,
        "Beat_8",
        "Chord_N_N",  # after the last note, in its bar
        "Bar_None",
        "EOS_None",
    )
    assert g.first_violation(ok) is None
    assert ok[-2:] == g.close(_walk(g, ok[:-2]))
    tok = RemiTokenizer(chords=False)
    assert (
        tok.grammar().first_violation(
            [
                tok.vocab.index(n)
                for n in ("Bar_None", "Beat_0", "Tempo_119", "Note_Pitch_60", *NOTE, "Bar_None", "EOS_None")
            ]
        )
        is None
    )


def _walk(g, ids):
    """The state after `ids`, stepped one by one so that `step`'s own error says what is wrong
    (`Grammar.states` checks `accepts` first and says only where)."""
    state = g.start()
    for tok in ids:
        state = g.step(state, tok)
    return state


def test_grammar_rules():
    g = TOK.grammar()
    bad = {
        "beat goes back": ids_of(*OPENING, "Beat_4", "Note_Pitch_60", *NOTE, "Beat_2"),
        "same beat twice": ids_of(*OPENING, "Beat_4", "Tempo_89", "Beat_4"),
        "note without velocity": ids_of(*OPENING, "Note_Pitch_60", "Note_Duration_120"),
        "chord after a note": ids_of(*OPENING, "Note_Pitch_60", *NOTE, "Chord_C_M"),
        "tempo before chord": ids_of(*OPENING, "Note_Pitch_60", *NOTE, "Beat_4", "Tempo_89", "Chord_C_M"),
        "empty beat": ids_of(*OPENING, "Note_Pitch_60", *NOTE, "Beat_1", "Beat_2"),
        "no opening bar": ids_of("Beat_0"),
        "EOS after a beat": ids_of(*OPENING, "Note_Pitch_60", *NOTE, "Beat_4", "Tempo_89", "EOS_None"),
        "token after EOS": ids_of(*OPENING, "Note_Pitch_60", *NOTE, "Bar_None", "EOS_None", "Bar_None"),
        "PAD inside": [TOK.bar_id, TOK.pad_id],
        # the encoder's own rules
        "opening off beat 0": ids_of("Bar_None", "Beat_4"),
        "opening without a chord": ids_of("Bar_None", "Beat_0", "Tempo_119"),
        "opening without a tempo": ids_of("Bar_None", "Beat_0", "Chord_C_M", "Note_Pitch_60"),
        "chord off the beat": ids_of(*OPENING, "Note_Pitch_60", *NOTE, "Beat_1", "Chord_C_M"),
        "first bar without a note": ids_of(*OPENING, "Bar_None"),
        "EOS after an empty bar": ids_of(*OPENING, "Note_Pitch_60", *NOTE, "Bar_None", "Bar_None", "EOS_None"),
        "EOS after a bar of only a chord": ids_of(
            *OPENING, "Note_Pitch_60", *NOTE, "Bar_None", "Beat_4", "Chord_D_m", "Bar_None", "EOS_None"
        ),
    }
    for why, ids in bad.items():
        assert g.first_violation(ids) == len(ids) - 1, why
    # a cell keeps the order of at most 59 notes that rise: decoding starts each a tick later
    rising = ids_of(*OPENING) + [t for p in range(22, 22 + 61) for t in ids_of(f"Note_Pitch_{p}", *NOTE)]
    assert g.first_violation(rising) == len(rising) - 3
    assert g.first_violation(rising[:-3] + ids_of("Note_Pitch_30")) is None  # a falling one is fine
    with pytest.raises(TokenError, match="off the beat"):
        _walk(g, bad["chord off the beat"])
    with pytest.raises(TokenError, match="first bar"):
        _walk(g, bad["first bar without a note"])


def test_grammar_close_and_masks():
    g = TOK.grammar()
    state = _walk(g, ids_of(*OPENING, "Note_Pitch_60"))
    assert not g.can_close(state)
    with pytest.raises(TokenError):
        g.close(state)
    with pytest.raises(TokenError, match="may not follow"):
        g.step(state, TOK.bar_id)
    state = _walk(g, ids_of(*OPENING, "Note_Pitch_60", *NOTE))
    assert g.can_close(state) and names(g.close(state)) == ["Bar_None", "EOS_None"]
    allowed = {TOK.vocab[i] for i in np.flatnonzero(g.allowed(state))}
    assert allowed == ({"Bar_None"} | {f"Beat_{k}" for k in range(1, 16)} | {f"Note_Pitch_{p}" for p in range(22, 108)})
    assert {TOK.vocab[i] for i in np.flatnonzero(g.allowed(g.step(state, TOK.beat_ids[4])))} == (
        {n for n in TOK.vocab if n.startswith(("Chord_", "Tempo_", "Note_Pitch_"))}
    )
    assert not any(TOK.vocab[i].startswith("Chord") for i in np.flatnonzero(g.allowed(g.step(state, TOK.beat_ids[5]))))
    bar = g.step(state, TOK.bar_id)
    assert g.can_close(bar) and names(g.close(bar)) == ["EOS_None"]
    empty_bar = g.step(bar, TOK.bar_id)  # the encoder never ends on an empty bar
    assert not g.can_close(empty_bar) and not g.allowed(empty_bar)[TOK.eos_id]
    opening = _walk(g, ids_of("Bar_None", "Beat_0"))
    chords = {n for n in TOK.vocab if n.startswith("Chord_")}
    assert {TOK.vocab[i] for i in np.flatnonzero(g.allowed(opening))} == chords


# ---------------------------------------------------------------- transposition, bar starts, decode errors


def test_transpose_moves_pitches_and_chord_roots():
    ids = np.array(
        ids_of(
            "Bar_None",
            "Beat_0",
            "Chord_B_m7",
            "Note_Pitch_100",
            "Note_Velocity_80",
            "Note_Duration_120",
            "Beat_4",
            "Chord_N_N",
            "Bar_None",
            "EOS_None",
        )
    )
    up = TOK.transpose(ids, 2)
    assert names(up) == [
        "Bar_None",
        "Beat_0",
        "Chord_C#_m7",
        "Note_Pitch_102",
        "Note_Velocity_80",
        "Note_Duration_120",
        "Beat_4",
        "Chord_N_N",
        "Bar_None",
        "EOS_None",
    ]
    assert TOK.transpose(ids, 8) is None  # 108 is out of range
    assert np.array_equal(TOK.transpose(up, -2), ids)


def test_bar_starts_and_decode_of_truncated_or_bad_ids():
    ids = ids_of(
        "Bar_None",
        "Beat_0",
        "Note_Pitch_60",
        "Note_Velocity_80",
        "Note_Duration_120",
        "Bar_None",
        "Beat_0",
        "Note_Pitch_62",
        "Note_Velocity_80",
    )
    assert TOK.bar_starts(ids) == [0, 5]
    piece = TOK.decode(ids + [TOK.pad_id, TOK.pad_id])  # a truncated last note is dropped; padding ignored
    assert list(zip(piece.pitch.tolist(), piece.start.tolist())) == [(60, 0)]
    with pytest.raises(TokenError, match="outside the vocabulary"):
        TOK.decode([0, 999])
    with pytest.raises(TokenError, match="may not follow"):
        TOK.decode(ids_of("Bar_None", "Beat_4", "Tempo_89", "Beat_2"))


# ---------------------------------------------------------------- bad input


@pytest.fixture
def bad_midis(tmp_path):
    files = {
        "corrupt": tmp_path / "corrupt.mid",
        "empty": tmp_path / "empty.mid",
        "noteless": make_midi(tmp_path, [], name="noteless.mid"),
        "three-four": make_midi(tmp_path, [(0, 480, 60, 64)], time_signatures=((3, 4, 0),), name="waltz.mid"),
        "drums-only": make_midi(tmp_path, [(0, 480, 36, 100)], drum=True, name="drums.mid"),
        "missing": tmp_path / "missing.mid",
    }
    files["corrupt"].write_bytes(b"MThd\x00\x00\x00\x06\x00\x01\x00\x05garbage")
    files["empty"].write_bytes(b"")
    return files


MESSAGES = {
    "corrupt": "corrupt MIDI",
    "empty": "empty file",
    "noteless": "contains no notes",
    "three-four": "time signature 3/4",
    "drums-only": "only drum notes",
    "missing": "no such file",
}


def test_bad_inputs_raise_one_line_midi_errors(bad_midis):
    for kind, path in bad_midis.items():
        with pytest.raises(MidiError) as err:
            TOK.encode(path)
        assert MESSAGES[kind] in str(err.value) and "\n" not in str(err.value), kind


def raw_midi(tpq: int, messages) -> bytes:
    """A one-track MIDI file from (delta ticks, mido message) pairs; long gaps are chains of
    markers, since one delta time holds at most 2^28 - 1 ticks."""
    track = mido.MidiTrack()
    for delta, message in messages:
        while delta > 2**27:
            track.append(mido.MetaMessage("marker", text="", time=2**27))
            delta -= 2**27
        track.append(message.copy(time=delta))
    out = io.BytesIO()
    mido.MidiFile(ticks_per_beat=tpq, tracks=[track]).save(file=out)
    return out.getvalue()


def on(pitch):
    return mido.Message("note_on", note=pitch, velocity=64)


def off(pitch):
    return mido.Message("note_off", note=pitch)


def peak_memory(encode) -> int:
    tracemalloc.start()  # numpy reports its arrays to tracemalloc
    try:
        encode()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_far_ticks_are_bounded_by_what_the_representation_holds():
    # a 52-byte file: one note held for 2^28 - 1 beats at 1 tick per beat; chords used to be
    # labelled for every beat of it (16 GiB)
    tiny = raw_midi(1, [(0, on(60)), (2**28 - 1, off(60))])
    assert len(tiny) <= 52
    assert peak_memory(lambda: TOK.encode(tiny)) < 50e6
    assert names(TOK.encode(tiny).ids)[4:7] == ["Note_Pitch_60", "Note_Velocity_64", "Note_Duration_1920"]
    # a chord marker, a tempo and the end of the track far after the notes: nothing past the last bar is kept
    far = raw_midi(
        480,
        [
            (0, on(60)),
            (480, off(60)),
            (2**29, mido.MetaMessage("marker", text="C_M")),
            (0, mido.MetaMessage("set_tempo", tempo=400_000)),
            (2**27, mido.MetaMessage("end_of_track")),
        ],
    )
    assert peak_memory(lambda: TOK.encode(far)) < 50e6
    assert names(TOK.encode(far).ids) == [
        "Bar_None",
        "Beat_0",
        "Chord_N_N",
        "Tempo_119",
        "Note_Pitch_60",
        "Note_Velocity_64",
        "Note_Duration_480",
        "Bar_None",
        "EOS_None",
    ]
    # notes 2^30 ticks apart: refused before anything is sized by the gap
    apart = raw_midi(480, [(0, on(60)), (480, off(60)), (2**30, on(62)), (480, off(62))])
    with pytest.raises(MidiError, match="longer than 10000 bars"):
        TOK.encode(apart)
    # past 2^31 ticks the parser's 32-bit times wrap around to negative ones
    wrapped = raw_midi(480, [(0, on(60)), (480, off(60)), (2**31, on(62)), (480, off(62))])
    with pytest.raises(MidiError, match="past tick 2\\^31"):
        TOK.encode(wrapped)


def test_cli_show_reports_bad_input_in_one_line(bad_midis, pop909_songs):
    for kind, path in bad_midis.items():
        proc = subprocess.run(
            [sys.executable, "-m", "musegen", "data", "show", str(path)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode != 0, kind
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and MESSAGES[kind] in lines[0] and "Traceback" not in proc.stderr, (kind, proc.stderr)
    proc = subprocess.run(
        [sys.executable, "-m", "musegen", "data", "show", str(pop909_songs[0]), "--max-tokens", "8"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "remi tokens" in proc.stdout and "Bar_None" in proc.stdout


def test_onsets_are_the_time_of_the_last_bar_or_beat_and_match_the_decoded_notes():
    tok = RemiTokenizer()
    ids = tok.encode(pop909_files(1)[0]).ids
    onsets = tok.onsets(ids)
    assert onsets.dtype == np.float64 and len(onsets) == len(ids)
    assert onsets[0] == 0 and (np.diff(onsets) >= 0).all()
    bars = np.flatnonzero(ids == tok.bar_id)
    assert (onsets[bars] == 4 * np.arange(len(bars))).all()  # a Bar sits on its bar line
    beat = tok.beat_of[ids]
    at_beat = np.flatnonzero(beat >= 0)
    assert (onsets[at_beat] % 4 == beat[at_beat] / tok.beat_resolution).all()
    assert len(np.unique(onsets)) > 100  # the song's many grid cells, not one onset per bar
    # every note starts at its tokens' onset, less the small offset REMI adds to notes of a cell
    durations = np.flatnonzero(tok.duration_of[ids] >= 0)
    starts = np.sort(tok.decode(ids).start) / TICKS_PER_BEAT
    gap = starts - np.sort(onsets[durations])
    assert len(starts) == len(durations) and (gap >= 0).all()
    assert gap.max() * TICKS_PER_BEAT <= tok.max_note_offset
