"""The REMI tokenizer: Pop1K7 vocabulary, exact round trip on POP909, grammar, transposition, bad input."""

from __future__ import annotations

import math
import multiprocessing as mp
import subprocess
import sys
import time
from collections import Counter

import miditoolkit
import numpy as np
import pytest
import symusic

from musegen.errors import MidiError, TokenError
from musegen.tokenizers import tokenizer_from_dict
from musegen.tokenizers.remi import RemiTokenizer

from conftest import pop909_files

TOK = RemiTokenizer()


def ids_of(*names):
    return [TOK.vocab.index(n) for n in names]


# ---------------------------------------------------------------- vocabulary

def test_default_vocabulary_is_pop1k7():
    tempos = list(range(32, 150, 3)) + [155, 158, 161, 167, 170, 176, 182, 188, 194, 200, 206, 215, 221, 224]
    roots = "A A# B C C# D D# E F F# G G#".split()
    qualities = "+ /o7 7 M M7 m m7 o o7 sus2 sus4".split()
    expected = (["Bar_None", "EOS_None"] + [f"Beat_{k}" for k in range(16)]
                + [f"Chord_{r}_{q}" for r in roots for q in qualities] + ["Chord_N_N"]
                + [f"Tempo_{t}" for t in tempos]
                + [f"Note_Pitch_{p}" for p in range(22, 108)]
                + [f"Note_Velocity_{v}" for v in range(40, 87, 2)]
                + [f"Note_Duration_{d}" for d in range(0, 1921, 120)])
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
    (floats, per note), independent of the tokenizer's numpy code: quantised, then one note per
    (onset, pitch) (the longest, then loudest) and a note cut where its pitch strikes again."""
    score = source if isinstance(source, symusic.Score) else symusic.Score(str(source))
    res = tok.beat_resolution
    lo, hi = tok.pitch_range
    vmin, vmax, vstep = tok.velocity_range
    strongest = {}  # (onset, pitch) -> (duration, velocity)
    for track in score.tracks:
        if track.is_drum:
            continue
        for n in track.notes:
            pitch = n.pitch
            while pitch < lo:
                pitch += 12
            while pitch > hi:
                pitch -= 12
            onset = math.floor(n.time * res / score.tpq + 0.5)
            duration = min(tok.max_duration, math.floor(n.duration * res / score.tpq + 0.5))
            velocity = vmin + vstep * min(max(math.floor((n.velocity - vmin) / vstep + 0.5), 0),
                                          (vmax - vmin) // vstep)
            strongest[onset, pitch] = max(strongest.get((onset, pitch), (-1, -1)), (duration, velocity))
    notes = Counter()
    following = {}  # pitch -> the onset after the current one (each pitch walked from its end)
    for onset, pitch in sorted(strongest, key=lambda k: (k[1], -k[0])):
        nxt = following.get(pitch)
        duration, velocity = strongest[onset, pitch]
        if nxt is not None and nxt < onset + max(duration, 1):  # re-struck before it ended
            duration = nxt - onset
        following[pitch] = onset
        notes[(onset, pitch, duration, velocity)] += 1
    return notes


def decoded_notes(midi: miditoolkit.MidiFile, tok: RemiTokenizer) -> Counter:
    step = midi.ticks_per_beat // tok.beat_resolution
    notes = Counter()
    for n in midi.instruments[0].notes:
        assert n.start % step == 0
        notes[(n.start // step, n.pitch, round((n.end - n.start) / step), n.velocity)] += 1
    return notes


def _check_song(path):
    """Round trip, grammar and transposition for one song; returns a list of problems."""
    problems = []
    try:
        enc = TOK.encode(path)
    except MidiError as exc:
        return [], str(exc)
    got, want = decoded_notes(TOK.decode(enc.ids), TOK), expected_notes(path, TOK)
    if got != want:
        problems.append(f"{path}: {sum((want - got).values())} missing, {sum((got - want).values())} extra notes")
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
    # POP909 holds a few songs in triple meter (its beat annotations put a downbeat every 3 beats):
    # those, and only those, are refused
    assert len(skipped) < 0.04 * len(files) and all("time signature 3/4" in r or "6/8" in r for r in skipped), skipped


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

def make_midi(tmp_path, notes, tpq=480, time_signatures=((4, 4, 0),), tempos=((120, 0),), drum=False,
              name="x.mid"):
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
        "Bar_None", "Beat_0", "Chord_C_M", "Tempo_119",
        "Note_Pitch_60", "Note_Velocity_80", "Note_Duration_1920",
        "Note_Pitch_64", "Note_Velocity_80", "Note_Duration_1920",
        "Note_Pitch_67", "Note_Velocity_80", "Note_Duration_1920",
        "Bar_None", "Beat_0", "Chord_N_N", "Beat_8", "Tempo_89",
        "Beat_10", "Note_Pitch_67", "Note_Velocity_40", "Note_Duration_240",
        "Bar_None", "EOS_None"]
    assert enc.report["notes"] == 4 and enc.report["bars"] == 2
    midi = TOK.decode(enc.ids)
    assert [(t.time, t.tempo) for t in midi.tempo_changes] == [(0, 119), (2880, 89)]
    assert [(m.time, m.text) for m in midi.markers] == [(0, "C_M"), (1920, "N_N")]


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


def test_pop909_duple_time_signatures_are_read_as_four_four(tmp_path):
    notes = [(0, 480, 60, 64), (1920, 2400, 62, 64)]
    for num, den in ((1, 4), (2, 4), (4, 4), (2, 2)):
        enc = TOK.encode(make_midi(tmp_path, notes, time_signatures=((num, den, 0),)))
        assert names(enc.ids).count("Bar_None") == 3  # two bars of 4/4, then the closing Bar


# ---------------------------------------------------------------- grammar

def test_grammar_rules():
    g = TOK.grammar()
    ok = ids_of("Bar_None", "Beat_0", "Chord_C_M", "Tempo_119", "Note_Pitch_60", "Note_Velocity_80",
                "Note_Duration_120", "Beat_4", "Note_Pitch_62", "Note_Velocity_80", "Note_Duration_120",
                "Bar_None", "Bar_None", "Beat_2", "Tempo_89", "Bar_None", "Beat_0", "Note_Pitch_40",
                "Note_Velocity_80", "Note_Duration_0", "Note_Pitch_41", "Note_Velocity_80", "Note_Duration_0",
                "Beat_1", "Note_Pitch_40", "Note_Velocity_80", "Note_Duration_0", "Bar_None", "EOS_None")
    assert g.first_violation(ok) is None
    bad = {
        "beat goes back": ids_of("Bar_None", "Beat_4", "Tempo_89", "Note_Pitch_60", "Note_Velocity_80",
                                 "Note_Duration_120", "Beat_2"),
        "same beat twice": ids_of("Bar_None", "Beat_4", "Tempo_89", "Beat_4"),
        "note without velocity": ids_of("Bar_None", "Beat_0", "Tempo_89", "Note_Pitch_60", "Note_Duration_120"),
        "chord after a note": ids_of("Bar_None", "Beat_0", "Tempo_89", "Note_Pitch_60", "Note_Velocity_80",
                                     "Note_Duration_120", "Chord_C_M"),
        "tempo before chord": ids_of("Bar_None", "Beat_0", "Tempo_89", "Chord_C_M"),
        "empty beat": ids_of("Bar_None", "Beat_0", "Beat_1"),
        "no opening bar": ids_of("Beat_0"),
        "EOS after a beat": ids_of("Bar_None", "Beat_0", "Tempo_89", "EOS_None"),
        "token after EOS": ids_of("Bar_None", "Beat_0", "Tempo_89", "Note_Pitch_60", "Note_Velocity_80",
                                  "Note_Duration_120", "Bar_None", "EOS_None", "Bar_None"),
        "PAD inside": [TOK.bar_id, TOK.pad_id],
        # canonical rules: only what the encoder writes
        "note before the first tempo": ids_of("Bar_None", "Beat_0", "Note_Pitch_60"),
        "pitches going down": ids_of("Bar_None", "Beat_0", "Tempo_89", "Note_Pitch_60", "Note_Velocity_80",
                                     "Note_Duration_120", "Note_Pitch_59"),
        "same pitch twice at a position": ids_of("Bar_None", "Beat_0", "Tempo_89", "Note_Pitch_60",
                                                 "Note_Velocity_80", "Note_Duration_120", "Note_Pitch_60"),
        "pitch still sounding": ids_of("Bar_None", "Beat_0", "Tempo_89", "Note_Pitch_60", "Note_Velocity_80",
                                       "Note_Duration_240", "Beat_1", "Note_Pitch_60"),
        "tempo repeated": ids_of("Bar_None", "Beat_0", "Tempo_89", "Note_Pitch_60", "Note_Velocity_80",
                                 "Note_Duration_120", "Beat_4", "Tempo_89"),
        "chord off the beat": ids_of("Bar_None", "Beat_1", "Chord_C_M"),
        "chord repeated": ids_of("Bar_None", "Beat_0", "Chord_C_M", "Tempo_89", "Beat_4", "Chord_C_M"),
        "no chord at the start": ids_of("Bar_None", "Beat_0", "Chord_N_N"),
        "first tempo with no note at its beat": ids_of("Bar_None", "Beat_0", "Tempo_89", "Bar_None"),
        "EOS after a header-only beat": ids_of("Bar_None", "Beat_0", "Tempo_89", "Note_Pitch_60", "Note_Velocity_80",
                                               "Note_Duration_120", "Beat_4", "Chord_C_M", "Bar_None", "EOS_None"),
        "EOS after an empty bar": ids_of("Bar_None", "Beat_0", "Tempo_89", "Note_Pitch_60", "Note_Velocity_80",
                                         "Note_Duration_120", "Bar_None", "Bar_None", "EOS_None"),
    }
    for why, ids in bad.items():
        assert g.first_violation(ids) == len(ids) - 1, why
    # after a new Bar, any Beat is fine again
    assert g.first_violation(ids_of("Bar_None", "Beat_8", "Tempo_89", "Note_Pitch_60", "Note_Velocity_80",
                                    "Note_Duration_120", "Bar_None", "Beat_0", "Tempo_92")) is None
    state = g.start()  # step() says which rule a token breaks
    with pytest.raises(TokenError, match="still sounds"):
        for tok in bad["pitch still sounding"]:
            state = g.step(state, tok)


def test_grammar_close_and_masks():
    g = TOK.grammar()
    state = g.start()
    for tok in ids_of("Bar_None", "Beat_3", "Tempo_89", "Note_Pitch_60"):
        state = g.step(state, tok)
    assert not g.can_close(state)
    with pytest.raises(TokenError):
        g.close(state)
    with pytest.raises(TokenError, match="may not follow"):
        g.step(state, TOK.bar_id)
    for tok in ids_of("Note_Velocity_80", "Note_Duration_120"):
        state = g.step(state, tok)
    assert g.can_close(state) and names(g.close(state)) == ["Bar_None", "EOS_None"]
    mask = g.allowed(state)
    allowed = {TOK.vocab[i] for i in np.flatnonzero(mask)}
    assert allowed == ({"Bar_None"} | {f"Beat_{k}" for k in range(4, 16)}
                       | {f"Note_Pitch_{p}" for p in range(61, 108)})  # up in pitch from 60
    bar = g.step(state, TOK.bar_id)
    assert g.can_close(bar) and names(g.close(bar)) == ["EOS_None"]
    empty_bar = g.step(bar, TOK.bar_id)  # the encoder never ends on an empty bar
    assert not g.can_close(empty_bar) and not g.allowed(empty_bar)[TOK.eos_id]


def test_grammar_is_fast_enough_for_sampling(tmp_path):
    source = pop909_files(1)[0]
    ids = TOK.encode(source).ids
    g = TOK.grammar()
    t0 = time.perf_counter()
    state = g.start()
    for tok in map(int, ids):
        assert g.allowed(state)[tok]
        state = g.step(state, tok)
    per_token = (time.perf_counter() - t0) / len(ids)
    assert per_token < 50e-6, f"{per_token * 1e6:.1f} us per token"


# ---------------------------------------------------------------- transposition, bar starts, decode errors

def test_transpose_moves_pitches_and_chord_roots():
    ids = np.array(ids_of("Bar_None", "Beat_0", "Chord_B_m7", "Note_Pitch_100", "Note_Velocity_80",
                          "Note_Duration_120", "Beat_4", "Chord_N_N", "Bar_None", "EOS_None"))
    up = TOK.transpose(ids, 2)
    assert names(up) == ["Bar_None", "Beat_0", "Chord_C#_m7", "Note_Pitch_102", "Note_Velocity_80",
                         "Note_Duration_120", "Beat_4", "Chord_N_N", "Bar_None", "EOS_None"]
    assert TOK.transpose(ids, 8) is None  # 108 is out of range
    assert np.array_equal(TOK.transpose(up, -2), ids)


def test_bar_starts_and_decode_of_truncated_or_bad_ids():
    ids = ids_of("Bar_None", "Beat_0", "Note_Pitch_60", "Note_Velocity_80", "Note_Duration_120",
                 "Bar_None", "Beat_0", "Note_Pitch_62", "Note_Velocity_80")
    assert TOK.bar_starts(ids) == [0, 5]
    midi = TOK.decode(ids + [TOK.pad_id, TOK.pad_id])  # a truncated last note is dropped; padding ignored
    assert [(n.pitch, n.start) for n in midi.instruments[0].notes] == [(60, 0)]
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


MESSAGES = {"corrupt": "corrupt MIDI", "empty": "empty file", "noteless": "contains no notes",
            "three-four": "time signature 3/4", "drums-only": "only drum notes", "missing": "no such file"}


def test_bad_inputs_raise_one_line_midi_errors(bad_midis):
    for kind, path in bad_midis.items():
        with pytest.raises(MidiError) as err:
            TOK.encode(path)
        assert MESSAGES[kind] in str(err.value) and "\n" not in str(err.value), kind


def test_cli_show_reports_bad_input_in_one_line(bad_midis, pop909_songs):
    for kind, path in bad_midis.items():
        proc = subprocess.run([sys.executable, "-m", "musegen", "data", "show", str(path)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0, kind
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and MESSAGES[kind] in lines[0] and "Traceback" not in proc.stderr, (kind, proc.stderr)
    proc = subprocess.run([sys.executable, "-m", "musegen", "data", "show", str(pop909_songs[0]),
                           "--max-tokens", "8"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "remi tokens" in proc.stdout and "Bar_None" in proc.stdout
