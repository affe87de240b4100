"""The groove tokenizer: vocabulary, track roles, exact round trip, grammar, augmentation, bad input."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import miditoolkit
import numpy as np
import pytest
import symusic
from hypothesis import given, settings, strategies as st

from musegen.errors import MidiError, TokenError
from musegen.model.config import preset
from musegen.tokenizers import tokenizer_from_dict
from musegen.tokenizers.groove import END, START, GrooveTokenizer, serialize

TOK = GrooveTokenizer()
TPQ = 480


def midi_bytes(parts, tpq=TPQ, time_signature=(4, 4)) -> bytes:
    """A MIDI file from [(program, is_drum, [(pitch, start, end), ...]), ...] (ticks)."""
    midi = miditoolkit.MidiFile(ticks_per_beat=tpq)
    if time_signature:
        midi.time_signature_changes = [miditoolkit.TimeSignature(*time_signature, 0)]
    for k, (program, is_drum, notes) in enumerate(parts):
        inst = miditoolkit.Instrument(program, is_drum=is_drum, name=f"part{k}")
        inst.notes = [miditoolkit.Note(90, p, s, e) for p, s, e in notes]
        midi.instruments.append(inst)
    buffer = io.BytesIO()
    midi.dump(file=buffer)
    return buffer.getvalue()


def beats(b: float) -> int:
    return int(round(b * TPQ))


DRUMS = (0, True, [(36, beats(b), beats(b) + 10) for b in range(8)] + [(42, beats(b + 0.5), beats(b + 0.5) + 10) for b in range(8)])
PIANO = (0, False, [(p, beats(b), beats(b + 1)) for b in range(8) for p in (60, 64, 67)])
STRINGS = (48, False, [(72, 0, beats(4)), (76, beats(4), beats(8))])
BASS = (33, False, [(40, beats(b), beats(b + 0.9)) for b in range(8)])


def trio_of(data, tok=TOK):
    enc = tok.encode(data)
    notes = tok.notes(enc.ids)
    return enc, {t: notes[notes[:, 0] == t] for t in (1, 2, 3)}


# ---------------------------------------------------------------- vocabulary and settings

def test_vocabulary_matches_paper_and_preset():
    assert TOK.vocab_size == 795 == preset("paper-groove").vocab_size
    assert TOK.pad_id == 794 and TOK.vocab[TOK.pad_id] == "PAD"
    assert len(set(TOK.vocab)) == 795
    kinds = [name.split("_")[0] for name in TOK.vocab[:794]]
    assert kinds.count("NoteOn") == kinds.count("NoteOff") == 3 * 128
    assert kinds.count("TimeShift") == 24 and TOK.vocab[START] == "Start" and TOK.vocab[END] == "End"


def test_settings_survive_json():
    tok = GrooveTokenizer(programs={"bass": 34, "other": 5}, other_seed=3)
    again = tokenizer_from_dict(tok.to_dict())
    assert isinstance(again, GrooveTokenizer) and again.settings() == tok.settings()
    with pytest.raises(TokenError):
        GrooveTokenizer(programs={"bass": 200})


# ---------------------------------------------------------------- track roles

def test_bass_program_wins_over_pitch_and_other_has_most_notes():
    high_bass = (33, False, [(p + 24, s, e) for p, s, e in BASS[2]])  # bass program, above the strings' floor
    enc, notes = trio_of(midi_bytes([PIANO, DRUMS, STRINGS, high_bass]))
    meta = enc.report["meta"]
    assert meta["bass_program"] == 33 and meta["other_program"] == 0  # piano: 24 notes > strings: 2
    assert set(notes[1][:, 1]) == {64} and set(notes[3][:, 1]) == {60, 64, 67}
    assert enc.report["tracks_left_out"] == 1


def test_without_bass_program_the_lowest_track_is_bass():
    low_strings = (48, False, [(36, 0, beats(4)), (38, beats(4), beats(8))])
    enc, notes = trio_of(midi_bytes([PIANO, DRUMS, low_strings]))
    assert enc.report["meta"]["bass_program"] == 48 and set(notes[1][:, 1]) == {36, 38}
    assert enc.report["meta"]["other_program"] == 0


def test_seeded_other_track_is_random_but_reproducible():
    candidates = [(program, False, [(60 + program % 12, beats(b), beats(b + 1)) for b in range(2 + program % 5)])
                  for program in (0, 24, 40, 56, 73)]
    data = midi_bytes([BASS, DRUMS] + candidates)
    picks = {seed: GrooveTokenizer(other_seed=seed).encode(data).report["meta"]["other_program"] for seed in range(12)}
    assert len(set(picks.values())) >= 3  # really random across seeds
    assert picks[5] == GrooveTokenizer(other_seed=5).encode(data).report["meta"]["other_program"]
    assert TOK.encode(data).report["meta"]["other_program"] == 24  # unseeded: the most notes (6)


# ---------------------------------------------------------------- quantisation and round trip

def test_quantisation_rounds_to_twelfths_and_resolves_overlaps():
    bass = (33, False, [
        (40, 19, 250),           # 19/40 -> 0 (0.475 rounds down), 250/40 = 6.25 -> 6
        (41, 20, 60),            # 0.5 rounds up -> 1; 1.5 -> 2
        (42, 100, 101),          # shorter than a unit: kept one unit long (3 -> 4)
        (43, 0, 480), (43, 240, 960),  # same pitch overlapping: the first is cut at 6
        (44, 0, 200), (44, 0, 480),    # same onset: merged, the longer kept
    ])
    drums = (0, True, [(36, 0, 1)])
    enc, notes = trio_of(midi_bytes([bass, drums]))
    got = {tuple(r) for r in notes[1][:, 1:].tolist()}
    assert got == {(40, 0, 6), (41, 1, 2), (42, 3, 4), (43, 0, 6), (43, 6, 24), (44, 0, 12)}
    assert enc.report["notes_merged"] == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 127), st.integers(0, 300), st.integers(1, 80)),
                min_size=1, max_size=60, unique_by=lambda n: (n[0], n[1], n[2])))
def test_serialize_then_notes_is_identity_for_non_overlapping_notes(raw):
    rows = sorted((t, p, on, on + d) for t, p, on, d in raw)
    clean, last_off = [], {}
    for t, p, on, off in rows:  # make them non-overlapping per (track, pitch), as encode does
        if on >= last_off.get((t, p), 0):
            clean.append((t, p, on, off))
            last_off[(t, p)] = off
    ids = serialize(np.array(clean))
    assert TOK.grammar().first_violation(ids) is None
    got = TOK.notes(ids)
    assert sorted(map(tuple, got.tolist())) == sorted(clean)
    shifts = ids[(ids >= 768) & (ids < 792)] - 767
    times = np.cumsum(np.where((ids >= 768) & (ids < 792), ids - 767, 0))
    assert shifts.max(initial=1) <= 24
    # time shifts never cross a bar line: every multiple of 48 below the end is reached exactly
    reached = set(times.tolist())
    assert all(b in reached for b in range(48, int(times[-1]), 48))


def test_decode_writes_three_tracks_with_programs_and_drum_channel(tmp_path):
    enc, notes = trio_of(midi_bytes([PIANO, DRUMS, BASS, STRINGS]))
    midi = TOK.decode(enc.ids, enc.report["meta"])
    assert [(i.program, i.is_drum) for i in midi.instruments] == [(33, False), (0, True), (0, False)]
    default = TOK.decode(enc.ids)
    assert default.instruments[0].program == 33 and default.instruments[2].program == 0
    custom = GrooveTokenizer(programs={"other": 48}).decode(enc.ids)
    assert custom.instruments[2].program == 48
    midi.dump(str(tmp_path / "out.mid"))
    score = symusic.Score(str(tmp_path / "out.mid"))
    drums = [t for t in score.tracks if t.is_drum]
    assert len(drums) == 1 and len(drums[0].notes) == len(notes[2])
    # and the written file encodes to the same tokens
    assert np.array_equal(TOK.encode(tmp_path / "out.mid").ids, enc.ids)


def test_notes_rejects_ungrammatical_ids():
    with pytest.raises(TokenError):
        TOK.notes([START, 384 + 60, END])  # note_off of a silent note
    with pytest.raises(TokenError):
        TOK.notes([START, 60, 60, END])
    with pytest.raises(TokenError):
        TOK.notes([START, 795])
    with pytest.raises(TokenError):
        TOK.notes([[1, 2]])
    # a piece cut before its End still decodes: the sounding note ends at the last time
    assert TOK.notes([START, 60, 768 + 11]).tolist() == [[1, 60, 0, 12]]


# ---------------------------------------------------------------- grammar

def test_grammar_rules():
    g = TOK.grammar()
    s = g.start()
    assert np.flatnonzero(g.allowed(s)).tolist() == [START]
    s = g.step(s, START)
    mask = g.allowed(s)
    assert mask[:384].all() and not mask[384:768].any() and mask[768:792].all()
    assert not mask[END], "a piece holds at least one note"
    s = g.step(s, 128 + 36)  # drums note_on 36
    mask = g.allowed(s)
    assert not mask[128 + 36] and not mask[384 + 128 + 36], "no re-strike, no zero-length note"
    assert not mask[:128 + 36].any() and mask[128 + 37:384].all(), "note_ons of one time step in id order"
    assert not mask[END], "End only when nothing sounds"
    s = g.step(s, 768)  # one unit later
    assert g.allowed(s)[384 + 128 + 36] and not g.allowed(s)[384 + 36]
    with pytest.raises(TokenError):
        g.step(s, 384 + 36)
    s = g.step(g.step(s, 384 + 128 + 36), END)
    assert not g.allowed(s).any()
    assert g.first_violation([START, 60, 384 + 60]) == 2
    assert g.first_violation([60]) == 0


@pytest.mark.parametrize("ids, bad, why", [
    ([START, 60, 40], 2, "note_ons of a time step rise"),
    ([START, 40, 60, 768, 384 + 60, 384 + 40], 5, "note_offs of a time step rise"),
    ([START, 40, 768, 60, 384 + 40], 4, "note_offs before note_ons"),
    ([START, 40, 768 + 3, 768, 384 + 40], 3, "a short shift is not followed by another"),
    ([START, 40, 768 + 19, 384 + 40, 768 + 23, 768 + 23], 5, "a shift does not cross the bar line"),
    ([START, 40, 768 + 23, 384 + 40, 768, END], 5, "no trailing silence"),
    ([START, END], 1, "no empty piece"),
])
def test_grammar_accepts_only_the_canonical_order(ids, bad, why):
    assert TOK.grammar().first_violation(ids) == bad, why


def test_shifts_follow_the_bar_lines():
    g = TOK.grammar()
    s = g.step(g.step(g.start(), START), 40)
    s = g.step(s, 768 + 23)  # 24 units: half a bar; a full shift may be followed by another
    assert np.flatnonzero(g.allowed(s)[768:792]).tolist() == list(range(24))
    s = g.step(s, 768 + 19)  # 20 units: 4 before the bar line, which is as far as a shift may go next
    assert not g.allowed(s)[768:792].any()
    s = g.step(s, 384 + 40)
    assert np.flatnonzero(g.allowed(s)[768:792]).tolist() == [0, 1, 2, 3], "four units left in the bar"
    s = g.step(s, 768 + 3)  # on the bar line: a short shift may be followed by another
    assert g.allowed(s)[768:792].all()
    ids = serialize(np.array([(1, 40, 0, 44), (1, 41, 50, 120)]))
    # Start On40 | 24 20 Off40 4 | 2 On41 24 22 | 24 Off41 End: shifts split at 48 and 96
    assert ids[2:7].tolist() == [768 + 23, 768 + 19, 384 + 40, 768 + 3, 768 + 1]
    assert TOK.bar_starts(ids) == [1, 6, 10] and g.first_violation(ids) is None


def test_close_ends_with_the_canonical_order():
    g = TOK.grammar()
    state = lambda ids: [s := g.start()] and [s := g.step(s, t) for t in ids][-1]
    assert g.close(state([START, 40, 60])) == [768, 384 + 40, 384 + 60, END]  # just begun: wait a unit
    assert g.close(state([START, 40, 60, 768])) == [384 + 40, 384 + 60, END]
    assert g.close(state([START, 40, 60, 768, 384 + 60])) == [768, 384 + 40, END]  # 40 may not follow 60
    assert g.close(state([START, 40, 60, 768, 384 + 40])) == [384 + 60, END]
    assert not g.can_close(state([START])) and not g.can_close(state([START, 40, 768, 384 + 40, 768]))


def test_close_ends_any_prefix_cleanly():
    rng = np.random.default_rng(0)
    g = TOK.grammar()
    for _ in range(30):
        s, ids = g.start(), []
        for _ in range(int(rng.integers(1, 60))):
            tok = int(rng.choice(np.flatnonzero(g.allowed(s))))
            if tok == END:
                break
            ids.append(tok)
            s = g.step(s, tok)
        if not g.can_close(s):
            continue
        full = ids + g.close(s)
        assert g.first_violation(full) is None and full[-1] == END
        TOK.decode(full)


def test_grammar_is_fast_enough_for_sampling():
    g = TOK.grammar()
    ids = serialize(np.array([(t, p, b * 6, b * 6 + 5) for b in range(200) for t, p in ((1, 40), (2, 36), (3, 64))]))
    s = g.start()
    started = time.perf_counter()
    for tok in ids.tolist():
        g.allowed(s)
        s = g.step(s, tok)
    per_token = (time.perf_counter() - started) / len(ids)
    assert per_token < 200e-6, f"{per_token * 1e6:.0f} us per token"


# ---------------------------------------------------------------- augmentation and bars

@pytest.fixture(scope="module")
def piece():
    return TOK.encode(midi_bytes([PIANO, DRUMS, BASS, STRINGS])).ids


def test_transpose_round_trip_and_drums_untouched(piece):
    for k in range(1, 6):
        up = TOK.transpose(piece, k)
        assert np.array_equal(TOK.transpose(up, -k), piece)
        before, after = TOK.notes(piece), TOK.notes(up)
        drums = before[:, 0] == 2
        assert np.array_equal(after[drums], before[drums])
        assert np.array_equal(after[~drums][:, 1], before[~drums][:, 1] + k)
        assert TOK.grammar().first_violation(up) is None
    assert TOK.transpose(piece, 127 - 67) is not None  # the piano's 67 (other) may reach 127
    assert TOK.transpose(piece, 128 - 67) is None  # but not 128
    assert TOK.transpose(piece, -41) is None  # the bass' 40 would go below 0


def test_bar_starts_cut_prompts_at_bar_lines(piece):
    starts = TOK.bar_starts(piece)
    assert starts[0] == 1 and len(starts) == 2  # 8 beats: two bars
    prompt = piece[:starts[1]]
    notes = TOK.notes(prompt)
    full = TOK.notes(piece)
    assert notes[:, 2].max() < 48 and len(notes) == int((full[:, 2] < 48).sum())


def test_skip_bars_restarts_sounding_notes(piece):
    skipped = TOK.skip_bars(piece, 1)
    assert TOK.grammar().first_violation(skipped) is None
    notes, full = TOK.notes(skipped), TOK.notes(piece)
    assert notes[:, 2].min() == 0
    expected = full[full[:, 3] > 48].copy()
    expected[:, 2:] = np.maximum(expected[:, 2:] - 48, 0)
    assert sorted(map(tuple, notes.tolist())) == sorted(map(tuple, expected.tolist()))
    assert TOK.skip_bars(piece, 2) is None  # nothing left after two bars
    crossing = serialize(np.array([(1, 40, 0, 10), (3, 72, 40, 60), (2, 36, 50, 51), (1, 41, 96, 100)]))
    assert TOK.notes(TOK.skip_bars(crossing, 1)).tolist() == [[3, 72, 0, 12], [2, 36, 2, 3], [1, 41, 48, 52]]


def test_drop_tracks(piece):
    for tracks in ([1], [2], [3], [1, 3]):
        dropped = TOK.drop_tracks(piece, tracks)
        assert TOK.grammar().first_violation(dropped) is None
        notes, full = TOK.notes(dropped), TOK.notes(piece)
        assert not np.isin(notes[:, 0], tracks).any()
        assert np.array_equal(notes, full[~np.isin(full[:, 0], tracks)])


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("data, message", [
    (lambda: midi_bytes([PIANO, BASS]), "no drum track"),
    (lambda: midi_bytes([DRUMS]), "only drums"),
    (lambda: midi_bytes([(0, False, [])]), "contains no notes"),
    (lambda: midi_bytes([PIANO, DRUMS], time_signature=(3, 4)), "needs 4/4"),
    (lambda: b"MThd\x00\x00\x00\x06garbage", "corrupt"),
    (lambda: b"", "empty"),
])
def test_bad_input_is_a_one_line_midi_error(data, message):
    with pytest.raises(MidiError) as err:
        TOK.encode(data())
    assert message in str(err.value) and "\n" not in str(err.value)


def test_pop909_piano_songs_are_refused_for_lack_of_drums(pop909_songs):
    with pytest.raises(MidiError, match="no drum track"):
        TOK.encode(pop909_songs[0])


def test_cli_show_reports_bad_file_in_one_line(tmp_path):
    path = tmp_path / "nodrums.mid"
    path.write_bytes(midi_bytes([PIANO, BASS]))
    proc = subprocess.run([sys.executable, "-m", "musegen", "data", "show", str(path), "--tokenizer", "groove"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "no drum track" in proc.stderr


def test_a_piece_longer_than_max_bars_is_refused_quickly():
    from musegen.tokenizers.base import MAX_BARS

    far = beats(4 * MAX_BARS)  # one bass note held past bar MAX_BARS: a fuzzed huge delta-time
    data = midi_bytes([DRUMS, (33, False, [(40, 0, far)])])
    started = time.perf_counter()
    with pytest.raises(MidiError, match=f"longer than {MAX_BARS} bars"):
        TOK.encode(data)
    assert time.perf_counter() - started < 5
    assert TOK.encode(midi_bytes([DRUMS, (33, False, [(40, 0, far - beats(8))])])).ids.size > 0
