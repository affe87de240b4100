"""The groove tokenizer: vocabulary, track roles, exact round trip, grammar, augmentation, bad input."""

from __future__ import annotations

import io
import subprocess
import sys

import miditoolkit
import numpy as np
import pytest
import symusic
from hypothesis import given, settings
from hypothesis import strategies as st

from musegen.errors import MidiError, TokenError
from musegen.model.config import preset
from musegen.music.beats import round_half_even
from musegen.tokenizers import tokenizer_from_dict
from musegen.tokenizers.groove import GrooveTokenizer
from musegen.tokenizers.groove_events import (
    END,
    START,
    TIME_SHIFT,
    WIDE_SHIFT,
    serialize,
    shift_id,
    shift_target,
    shifts_between,
    token_times,
)

TOK = GrooveTokenizer()
TPQ = 480


def midi_bytes(parts, tpq=TPQ, time_signature=(4, 4), names=None, tempos=()) -> bytes:
    """A MIDI file from [(program, is_drum, [(pitch, start, end), ...]), ...] (ticks), tracks
    named `names` (default part0, part1, ...), tempo changes [(qpm, tick)]."""
    midi = miditoolkit.MidiFile(ticks_per_beat=tpq)
    if time_signature:
        midi.time_signature_changes = [miditoolkit.TimeSignature(*time_signature, 0)]
    midi.tempo_changes = [miditoolkit.TempoChange(qpm, tick) for qpm, tick in tempos]
    for k, (program, is_drum, notes) in enumerate(parts):
        inst = miditoolkit.Instrument(program, is_drum=is_drum, name=names[k] if names else f"part{k}")
        inst.notes = [miditoolkit.Note(90, p, s, e) for p, s, e in notes]
        midi.instruments.append(inst)
    return dump(midi)


def dump(midi: miditoolkit.MidiFile) -> bytes:
    buffer = io.BytesIO()
    midi.dump(file=buffer)
    return buffer.getvalue()


def beats(b: float) -> int:
    return int(round(b * TPQ))


DRUMS = (
    0,
    True,
    [(36, beats(b), beats(b) + 10) for b in range(8)] + [(42, beats(b + 0.5), beats(b + 0.5) + 10) for b in range(8)],
)
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
    assert (START, END) == (793, 792)  # the reference's BOS and EOS
    assert [TOK.vocab[t] for t in (768, 778, 779, 790, 791)] == [
        "TimeShift_0_1",
        "TimeShift_0_11",
        "TimeShift_1_0",
        "TimeShift_1_11",
        "TimeShift_2_0",
    ]


def test_settings_survive_json():
    tok = GrooveTokenizer(programs={"bass": 34, "other": 5}, other_seed=3)
    again = tokenizer_from_dict(tok.to_dict())
    assert isinstance(again, GrooveTokenizer) and again.settings() == tok.settings()
    with pytest.raises(TokenError):
        GrooveTokenizer(programs={"bass": 200})


# ---------------------------------------------------------------- time shifts name positions


def test_a_shift_names_a_tick_of_a_later_beat():
    assert shift_target(0, shift_id(0, 6)) == 6
    assert shift_target(6, shift_id(0, 6)) == 6, "restating the time moves nothing"
    assert shift_target(7, shift_id(1, 0)) == 12 and shift_target(11, shift_id(1, 11)) == 23
    assert shift_target(30, WIDE_SHIFT) == 48  # beat 2 tick 6 -> beat 4 tick 0
    assert shifts_between(0, 6) == [shift_id(0, 6)] and shifts_between(6, 6) == [shift_id(0, 6)]
    assert shifts_between(12, 12) == [] and shifts_between(5, 12) == [shift_id(1, 0)]
    assert shifts_between(11, 12 * 7 + 1) == [WIDE_SHIFT] * 3 + [shift_id(1, 1)]
    for before in range(0, 40):
        for after in range(before, 100):
            time = before
            for tok in shifts_between(before, after):
                time = shift_target(time, tok)
            assert time == after


def test_rounding_is_pythons_round_of_the_reference():
    ticks = np.arange(0, 200_000)
    for tpq in (96, 120, 192, 480, 960, 1000):
        expected = [round(t * (12 / tpq)) for t in ticks[::97].tolist()]
        assert round_half_even(12 * ticks[::97], tpq).tolist() == expected


# ---------------------------------------------------------------- track roles


def test_bass_program_wins_over_pitch_and_other_has_most_notes():
    high_bass = (33, False, [(p + 24, s, e) for p, s, e in BASS[2]])  # bass program, above the strings' floor
    enc, notes = trio_of(midi_bytes([PIANO, DRUMS, STRINGS, high_bass]))
    meta = enc.report["meta"]
    assert meta["layout"] == "inferred"
    assert meta["bass_program"] == 33 and meta["other_program"] == 0  # piano: 24 notes > strings: 2
    assert set(notes[1][:, 1]) == {64} and set(notes[3][:, 1]) == {60, 64, 67}
    assert enc.report["tracks_left_out"] == 1


def test_without_bass_program_a_bass_name_then_the_lowest_track_is_bass():
    low_strings = (48, False, [(36, 0, beats(4)), (38, beats(4), beats(8))])
    enc, notes = trio_of(midi_bytes([PIANO, DRUMS, low_strings]))
    assert enc.report["meta"]["bass_program"] == 48 and set(notes[1][:, 1]) == {36, 38}
    assert enc.report["meta"]["other_program"] == 0
    named = (26, False, [(p + 30, s, e) for p, s, e in BASS[2]])  # a guitar program, above the strings
    enc, notes = trio_of(midi_bytes([PIANO, DRUMS, low_strings, named], names=["p", "d", "s", "Fretless bass"]))
    assert enc.report["meta"]["bass_track"] == "Fretless bass" and set(notes[1][:, 1]) == {70}


def test_groove2groove_names_decide_the_roles_and_the_count_in_is_dropped():
    """A Band-in-a-Box-like file: bass on a guitar program (as MMA's BossaNova), a 2-bar count-in
    on the drums, a tempo change; notes rounding to bar 3 or later are kept."""
    count_in = [(37, beats(b), beats(b) + 30) for b in range(8)]
    drums = (0, True, count_in + [(36, beats(8 + b), beats(8 + b) + 10) for b in range(8)])
    bass = (26, False, [(40, beats(8) - 20, beats(10)), (41, beats(8) - 21, beats(9))])  # 95.5 -> 96, 95.475 -> 95
    guitar = (24, False, [(60, beats(8 + b), beats(9 + b)) for b in range(8)])
    piano = (0, False, [(72, beats(8), beats(16))])
    data = midi_bytes(
        [drums, bass, guitar, piano],
        names=["BB Drums", "BB Bass", "BB Guitar", "BB Piano"],
        tempos=[(100, 0), (140, beats(12))],
    )
    enc, notes = trio_of(data)
    meta = enc.report["meta"]
    assert meta["layout"] == "g2g" and meta["bass_track"] == "BB Bass" and meta["bass_program"] == 26
    assert meta["other_track"] == "BB Guitar" and enc.report["count_in_notes"] == 9
    assert notes[1].tolist() == [[1, 40, 0, 24]]
    assert 37 not in notes[2][:, 1] and notes[2][:, 2].min() == 0
    assert meta["tempos"] == [[0, 100.0], [48, 140.0]]
    piece = TOK.decode(enc.ids, meta)
    assert piece.tempos == [(0, 100.0), (48 * 40, 140.0)]
    assert [(t.name, t.role) for t in piece.tracks] == [("Bass", "bass"), ("Drums", "drums"), ("Other", "other")]
    again = TOK.encode(piece.midi_bytes())  # musegen's own names: no count-in to drop
    assert np.array_equal(again.ids, enc.ids) and again.report["meta"]["tempos"] == meta["tempos"]


def test_seeded_other_track_is_random_but_reproducible():
    candidates = [
        (program, False, [(60 + program % 12, beats(b), beats(b + 1)) for b in range(2 + program % 5)])
        for program in (0, 24, 40, 56, 73)
    ]
    data = midi_bytes([BASS, DRUMS] + candidates)
    picks = {seed: GrooveTokenizer(other_seed=seed).encode(data).report["meta"]["other_program"] for seed in range(12)}
    assert len(set(picks.values())) >= 3  # really random across seeds
    assert picks[5] == GrooveTokenizer(other_seed=5).encode(data).report["meta"]["other_program"]
    assert TOK.encode(data).report["meta"]["other_program"] == 24  # unseeded: the most notes (6)


# ---------------------------------------------------------------- quantisation and round trip


def test_quantisation_rounds_halves_to_even_and_keeps_every_note():
    bass = (
        33,
        False,
        [
            (40, 19, 250),  # 19/40 -> 0 (0.475 rounds down), 250/40 = 6.25 -> 6
            (41, 20, 60),  # 0.5 rounds to 0 (even), 1.5 to 2
            (42, 100, 101),  # 2.5 -> 2, 2.525 -> 3
            (43, 0, 480),
            (43, 240, 960),  # same pitch overlapping: both kept
            (44, 0, 200),
            (44, 0, 480),  # same onset: both kept
            (45, 0, 10),
            (46, 60, 100),  # shorter than the grid: zero-length notes
        ],
    )
    drums = (0, True, [(36, 0, 1)])
    enc, notes = trio_of(midi_bytes([bass, drums]))
    got = sorted(tuple(r) for r in notes[1][:, 1:].tolist())
    assert got == [
        (40, 0, 6),
        (41, 0, 2),
        (42, 2, 3),
        (43, 0, 12),
        (43, 6, 24),
        (44, 0, 5),
        (44, 0, 12),
        (45, 0, 0),
        (46, 2, 2),
    ]
    assert notes[2].tolist() == [[2, 36, 0, 0]]


def test_crossing_notes_of_merged_parts_are_paired_first_in_first_out():
    """Two drum tracks, one pitch: a note inside another (zero-length on the grid). The reference
    would write an order that decodes to other notes; the encoder pairs them as decoding will."""
    data = midi_bytes([(33, False, [(40, 0, 1)]), (0, True, [(36, 0, 12)]), (0, True, [(36, 5, 6)])], tpq=96)
    enc, notes = trio_of(data)
    assert notes[2].tolist() == [[2, 36, 0, 1], [2, 36, 1, 2]] and enc.report["crossing_notes"] == 2
    assert TOK.grammar().first_violation(enc.ids) is None
    assert TOK.encode(TOK.decode(enc.ids).midi_bytes()).ids.tolist() == enc.ids.tolist()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.integers(30, 40), st.integers(0, 300), st.integers(0, 80)),
        min_size=1,
        max_size=60,
    )
)
def test_serialize_then_notes_ends_each_slot_first_in_first_out(raw):
    notes = np.array([(t, p, on, on + d) for t, p, on, d in raw])
    ids = serialize(notes)
    assert TOK.grammar().first_violation(ids) is None
    expected = []  # per slot, the k-th onset pairs with the k-th offset
    for track, pitch in {(t, p) for t, p, _, _ in raw}:
        same = notes[(notes[:, 0] == track) & (notes[:, 1] == pitch)]
        expected += [(track, pitch, on, off) for on, off in zip(sorted(same[:, 2]), sorted(same[:, 3]))]
    assert sorted(map(tuple, TOK.notes(ids).tolist())) == sorted(expected)
    times = token_times(ids)
    events = ids < TIME_SHIFT
    assert np.all(np.diff(times) >= 0), "time never goes back"
    assert sorted(times[events].tolist()) == sorted(notes[:, 2].tolist() + notes[:, 3].tolist())


def test_decode_writes_three_tracks_with_programs_and_drum_channel(tmp_path):
    enc, notes = trio_of(midi_bytes([PIANO, DRUMS, BASS, STRINGS]))
    piece = TOK.decode(enc.ids, enc.report["meta"])
    assert [(t.program, t.is_drum) for t in piece.tracks] == [(33, False), (0, True), (0, False)]
    default = TOK.decode(enc.ids)
    assert default.tracks[0].program == 33 and default.tracks[2].program == 0
    custom = GrooveTokenizer(programs={"other": 48}).decode(enc.ids)
    assert custom.tracks[2].program == 48
    (tmp_path / "out.mid").write_bytes(piece.midi_bytes())
    score = symusic.Score(str(tmp_path / "out.mid"))
    drums = [t for t in score.tracks if t.is_drum]
    assert len(drums) == 1 and len(drums[0].notes) == len(notes[2])
    # and the written file encodes to the same tokens
    assert np.array_equal(TOK.encode(tmp_path / "out.mid").ids, enc.ids)


def test_notes_rejects_ids_that_cannot_be_decoded():
    with pytest.raises(TokenError):
        TOK.notes([START, 384 + 60, END])  # note_off of a silent note
    with pytest.raises(TokenError):
        TOK.notes([START, 60, START])
    with pytest.raises(TokenError):
        TOK.notes([START, 795])
    with pytest.raises(TokenError):
        TOK.notes([[1, 2]])
    with pytest.raises(TokenError):  # a shift back before the note began, then its note_off
        TOK.notes([START, shift_id(0, 6), 60, shift_id(0, 2), 384 + 60])
    # a piece cut before its End still decodes: the sounding note ends at the last time
    assert TOK.notes([START, 60, shift_id(1, 0)]).tolist() == [[1, 60, 0, 12]]


# ---------------------------------------------------------------- grammar


def state_after(ids):
    return TOK.grammar().states(ids)[-1]


def test_grammar_rules():
    g = TOK.grammar()
    assert np.flatnonzero(g.allowed(g.start())).tolist() == [START]
    mask = g.allowed(state_after([START]))
    assert mask[:384].all() and not mask[384:768].any() and mask[768:792].all()
    assert not mask[END], "a piece holds at least one note"
    mask = g.allowed(state_after([START, 128 + 36]))  # drums note_on 36 at time 0
    ons = mask[:384].reshape(3, 128)
    assert not ons[:, :36].any() and ons[:, 36:].all(), "note_ons of one time rise by pitch, across tracks"
    assert mask[384 + 128 + 36] and mask[384:768].sum() == 1, "only a zero-length note may end now"
    assert not mask[END], "End only when nothing sounds"
    s = state_after([START, 128 + 36, shift_id(0, 6), 40])  # bass 40 at tick 6
    mask = g.allowed(s)
    assert not mask[:768].any(), "an event on tick 6 needs a (restating) shift before it"
    assert np.flatnonzero(mask[768:792]).tolist() == list(range(5, 24)), "no shift back"
    s = g.step(s, shift_id(0, 6))  # restate: still time 6, note_ons may go on rising
    mask = g.allowed(s)
    assert not mask[768:792].any() and mask[41] and not mask[39] and mask[384 + 40]
    assert not mask[384 + 128 + 36], "an earlier note may not end after a note_on at this time"
    s = g.step(state_after([START, 40]), WIDE_SHIFT)
    assert g.allowed(s)[768:792].all(), "(2, 0) may be followed by any shift"
    s = g.step(s, 384 + 40)
    assert g.allowed(s)[END]
    assert not g.allowed(g.step(s, END)).any()
    assert g.first_violation([START, 60, 384 + 61]) == 2
    assert g.first_violation([60]) == 0


def test_the_sampling_mask_writes_no_silent_bass_or_other_note():
    """The grammar accepts a zero-length note on any track (the data holds them); the sampler
    writes them on drums only, where a hit's length does not matter."""
    g = TOK.grammar()
    for track, sampled in ((0, False), (1, True), (2, False)):  # bass, drums, other
        s = state_after([START, track * 128 + 40])
        assert g.allowed(s)[384 + track * 128 + 40]
        assert g.sampling_mask(s)[384 + track * 128 + 40] == sampled
        later = g.step(s, WIDE_SHIFT)  # a time later the note may end whatever its track
        assert g.sampling_mask(later)[384 + track * 128 + 40]


def test_the_sampling_mask_never_restates_the_time_into_a_dead_end():
    """On tick 6 every event needs a restating shift before it, and the note_ons of one time rise
    by pitch. Once pitch 127 has begun on every track, a restating shift could only be followed
    by a double, so the sampler may not write it (the grammar may) and moves the time on."""
    g = TOK.grammar()
    s = state_after([START, 40, shift_id(0, 6), 127, shift_id(0, 6), 128 + 127, shift_id(0, 6), 256 + 127])
    restate = shift_id(0, 6)
    assert g.allowed(s)[restate] and not g.sampling_mask(s)[restate]
    assert g.sampling_mask(s)[shift_id(0, 7)], "a shift forward stays"
    s = state_after([START, 40, shift_id(0, 6), 127])  # drums and other may still begin 127
    assert g.sampling_mask(s)[restate]


S = shift_id


def test_a_superseded_bass_note_ends_at_the_next_event():
    """Bass 40 sounds when bass 43 begins at beat 1, after a kick there: 40 can no longer end at
    beat 1. At the next time the sampler writes its note_off before the drawn event, the
    off-beat time restated before that event; the grammar accepts the whole."""
    g = TOK.grammar()
    kick_then_bass = [START, 40, S(1, 0), 128 + 36, 43]
    assert not g.allowed(state_after(kick_then_bass))[384 + 40], "40 cannot end at beat 1 any more"
    s = state_after(kick_then_bass + [S(0, 6)])  # beat 1, tick 6
    drawn = 128 + 42  # a hi-hat
    prefix = g.sampling_prefix(s, drawn)
    assert prefix == [384 + 40, S(0, 6)]
    assert g.first_violation(kick_then_bass + [S(0, 6)] + prefix + [drawn]) is None
    on_the_beat = state_after(kick_then_bass + [S(1, 0)])
    assert g.sampling_prefix(on_the_beat, drawn) == [384 + 40], "no restating shift on a beat"
    assert g.sampling_prefix(on_the_beat, S(0, 3)) == [], "only before an event"
    assert g.sampling_prefix(g.step(on_the_beat, 384 + 43), 384 + 40) == [], "only before a time's first event"
    lone = state_after([START, 40, S(1, 0), 128 + 36, 256 + 60, S(1, 0)])
    assert g.sampling_prefix(lone, 128 + 42) == [], "a bass note nothing began over rings on"
    older = state_after([START, 38, S(1, 0), 40, S(1, 0), 43, S(0, 6)])  # two notes under 43
    assert g.sampling_prefix(older, 128 + 42) == [384 + 38, S(0, 6), 384 + 40, S(0, 6)]


@pytest.mark.parametrize(
    "ids, bad, why",
    [
        ([START, 60, 40], 2, "note_ons of a time step rise"),
        ([START, 40, 60, S(1, 0), 384 + 60, 384 + 40], 5, "note_offs of a time step by (onset, pitch)"),
        ([START, 40, S(1, 0), 60, 384 + 40], 4, "note_offs before note_ons"),
        ([START, 40, S(0, 3), S(0, 4)], 3, "a chain ends with its first shift that is not (2, 0)"),
        ([START, 40, S(0, 6), 384 + 40, S(0, 5)], 4, "no shift back"),
        ([START, 40, S(0, 6), 384 + 40, 41], 4, "an event off the beat has a shift before it"),
        ([START, 40, S(1, 0), 384 + 40, S(1, 0), END], 5, "no trailing shift"),
        ([START, END], 1, "no empty piece"),
        ([START, 40, 256 + 40, S(1, 0), 384 + 256 + 40], 4, "equal notes end in the order they began"),
        ([START, 40, 41, 384 + 40], 3, "a zero-length note ends right after it begins"),
        ([START, 40, S(1, 0), 40, 384 + 40], 4, "... and only when no older note of its pitch sounds"),
    ],
)
def test_grammar_accepts_only_the_canonical_order(ids, bad, why):
    assert TOK.grammar().first_violation(ids) == bad, why


def test_close_ends_with_the_canonical_order():
    g = TOK.grammar()
    # just begun: a unit later, each note_off on tick 1 with its shift
    assert g.close(state_after([START, 40, 60])) == [S(0, 1), 384 + 40, S(0, 1), 384 + 60, END]
    assert g.close(state_after([START, 40, 60, S(1, 0), 384 + 60])) == [S(0, 1), 384 + 40, END]
    assert g.close(state_after([START, 40, 60, S(1, 0), 384 + 40])) == [384 + 60, END]  # at once
    assert g.close(state_after([START, 40, S(1, 3), 384 + 40])) == [END]
    assert not g.can_close(state_after([START])) and not g.can_close(state_after([START, 40, S(0, 6)]))


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
        assert np.array_equal(after[after[:, 0] == 2], before[drums])
        moved = before[~drums].copy()
        moved[:, 1] += k
        assert sorted(map(tuple, after[after[:, 0] != 2].tolist())) == sorted(map(tuple, moved.tolist()))
        assert TOK.grammar().first_violation(up) is None
    assert TOK.transpose(piece, 127 - 67) is not None  # the piano's 67 (other) may reach 127
    assert TOK.transpose(piece, 128 - 67) is None  # but not 128
    assert TOK.transpose(piece, -41) is None  # the bass' 40 would go below 0


def test_transpose_keeps_the_canonical_order_where_drums_and_pitches_cross():
    ids = serialize(np.array([(1, 40, 0, 12), (2, 42, 0, 0), (3, 41, 6, 12)]))
    assert ids[1:3].tolist() == [40, 128 + 42]  # bass 40 before drums 42
    up = TOK.transpose(ids, 5)
    assert up[1:4].tolist() == [128 + 42, 384 + 128 + 42, 45]  # drums 42 (zero-length) before bass 45
    assert TOK.grammar().first_violation(up) is None and len(up) == len(ids)


def test_transpose_of_a_window_cut_at_a_bar_line_is_a_prefix(piece):
    whole = TOK.transpose(piece, 3)
    starts = TOK.bar_starts(piece)
    for cut in (starts[1], starts[1] + 1, len(piece) - 1):  # before the bar's shift, after it, before End
        assert TOK.transpose(piece[:cut], 3).tolist() == whole[:cut].tolist()
    middle = piece[5:200]  # not from Start: only the pitches move
    moved = TOK.transpose(middle, 3)
    assert len(moved) == len(middle) and np.array_equal(moved < 384, middle < 384)


def test_bar_starts_cut_prompts_at_bar_lines(piece):
    starts = TOK.bar_starts(piece)
    assert starts[0] == 1 and len(starts) == 2  # 8 beats: two bars
    prompt = piece[: starts[1]]
    notes = TOK.notes(prompt)
    full = TOK.notes(piece)
    assert notes[:, 2].max() < 48 and len(notes) == int((full[:, 2] < 48).sum())
    assert token_times(prompt).max() < 48 and token_times(piece[: starts[1] + 1])[-1] >= 48


def test_bar_starts_when_a_shift_jumps_over_the_bar_line():
    ids = serialize(np.array([(1, 40, 0, 42), (1, 41, 54, 60), (1, 42, 100, 101)]))
    starts = TOK.bar_starts(ids)
    assert len(starts) == 3
    for bar, index in enumerate(starts[1:], start=1):
        assert token_times(ids[:index]).max() < 48 * bar <= token_times(ids[: index + 1])[-1]


def test_skip_bars_restarts_sounding_notes(piece):
    skipped = TOK.skip_bars(piece, 1)
    assert TOK.grammar().first_violation(skipped) is None
    notes, full = TOK.notes(skipped), TOK.notes(piece)
    assert notes[:, 2].min() == 0
    expected = full[(full[:, 3] > 48) | (full[:, 2] >= 48)].copy()
    expected[:, 2:] = np.maximum(expected[:, 2:] - 48, 0)
    assert sorted(map(tuple, notes.tolist())) == sorted(map(tuple, expected.tolist()))
    assert TOK.skip_bars(piece, 2) is None  # nothing left after two bars
    crossing = serialize(
        np.array([(1, 40, 0, 10), (3, 72, 40, 60), (2, 36, 50, 51), (2, 38, 48, 48), (1, 41, 96, 100)])
    )
    assert TOK.notes(TOK.skip_bars(crossing, 1)).tolist() == [
        [2, 38, 0, 0],
        [3, 72, 0, 12],
        [2, 36, 2, 3],
        [1, 41, 48, 52],
    ]


def test_drop_tracks(piece):
    for tracks in ([1], [2], [3], [1, 3]):
        dropped = TOK.drop_tracks(piece, tracks)
        assert TOK.grammar().first_violation(dropped) is None
        notes, full = TOK.notes(dropped), TOK.notes(piece)
        assert not np.isin(notes[:, 0], tracks).any()
        assert np.array_equal(notes, full[~np.isin(full[:, 0], tracks)])


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "data, message",
    [
        (lambda: midi_bytes([PIANO, BASS]), "no drum track"),
        (lambda: midi_bytes([DRUMS]), "only drums"),
        (lambda: midi_bytes([(0, False, [])]), "contains no notes"),
        (lambda: midi_bytes([PIANO, DRUMS], time_signature=(3, 4)), "needs 4/4"),
        (lambda: b"MThd\x00\x00\x00\x06garbage", "corrupt"),
        (lambda: b"", "empty"),
    ],
)
def test_bad_input_is_a_one_line_midi_error(data, message):
    with pytest.raises(MidiError) as err:
        TOK.encode(data())
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_lone_2_4_bar_inside_4_4_is_refused_and_a_pair_kept():
    """The tokens count 4-beat bars from tick 0: 2/4 bars in pairs make them, a lone 2/4 bar moves
    every later bar line (issue 44: a prompt cut mid-bar, a continuation 2 beats off), and a 3/4
    bar cannot be written in 4-beat bars; both are refused, naming the bar."""
    midi = miditoolkit.MidiFile(file=io.BytesIO(midi_bytes([DRUMS, BASS])))
    midi.time_signature_changes += [
        miditoolkit.TimeSignature(2, 4, beats(4)),
        miditoolkit.TimeSignature(4, 4, beats(8)),
    ]
    _, notes = trio_of(dump(midi))
    assert notes[1][:, 2].tolist() == [12 * b for b in range(8)]  # bass onsets, 12 grid units a beat
    midi.time_signature_changes[2] = miditoolkit.TimeSignature(4, 4, beats(6))
    with pytest.raises(MidiError, match=r"bar 2 is in 2/4 and ends off the 4/4 bar lines \(at tick 2880\)"):
        TOK.encode(dump(midi))
    midi.time_signature_changes[1] = miditoolkit.TimeSignature(3, 4, beats(4))
    with pytest.raises(MidiError, match="bar 2: time signature 3/4 at tick 1920"):
        TOK.encode(dump(midi))


def test_a_zero_tempo_event_is_ignored():
    import mido

    midi = mido.MidiFile(file=io.BytesIO(midi_bytes([PIANO, DRUMS, BASS], tempos=[(90, 0)])))
    midi.tracks[0].insert(1, mido.MetaMessage("set_tempo", tempo=0, time=0))  # a fuzzed file's
    buffer = io.BytesIO()
    midi.save(file=buffer)
    assert TOK.encode(buffer.getvalue()).report["meta"]["tempos"] == [[0, 90.0]]


def test_pop909_piano_songs_are_refused_for_lack_of_drums(pop909_songs):
    with pytest.raises(MidiError, match="no drum track"):
        TOK.encode(pop909_songs[0])


def test_cli_show_reports_bad_file_in_one_line(tmp_path):
    path = tmp_path / "nodrums.mid"
    path.write_bytes(midi_bytes([PIANO, BASS]))
    proc = subprocess.run(
        [sys.executable, "-m", "musegen", "data", "show", str(path), "--tokenizer", "groove"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "no drum track" in proc.stderr


def test_a_piece_longer_than_max_bars_is_refused():
    from musegen.music.constants import MAX_BARS

    far = beats(4 * MAX_BARS)  # one bass note held past bar MAX_BARS: a fuzzed huge delta-time
    data = midi_bytes([DRUMS, (33, False, [(40, 0, far)])])
    with pytest.raises(MidiError, match=f"longer than {MAX_BARS} bars"):
        TOK.encode(data)
    assert TOK.encode(midi_bytes([DRUMS, (33, False, [(40, 0, far - beats(8))])])).ids.size > 0
