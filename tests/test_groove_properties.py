"""Property-based tests of the groove tokenizer: the grammar is canonical, decoding never fails
in an unexpected way, and encoding keeps every note the representation can hold.

Each property has a fast version (CI) and a `slow` one with many more examples
(`python -m pytest tests/test_groove_properties.py -m slow --hypothesis-show-statistics`).
"""

from __future__ import annotations

import io

import miditoolkit
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tokenizer_properties import check_decode_total, closed_walk

from musegen.errors import TokenError
from musegen.tokenizers.groove import GrooveTokenizer
from musegen.tokenizers.groove_events import END, NOTE_OFF, START, TIME_SHIFT, decode_events, serialize

TOK = GrooveTokenizer()
# No explain phase: on a failure it re-runs the example thousands of times (minutes).
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
FAST = settings(deadline=None, max_examples=120, phases=PHASES, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(deadline=None, max_examples=3000, phases=PHASES, suppress_health_check=[HealthCheck.too_slow])


def dump(midi: miditoolkit.MidiFile) -> bytes:
    buffer = io.BytesIO()
    midi.dump(file=buffer)
    return buffer.getvalue()


# ---------------------------------------------------------------- (a) accepted sequences are canonical

FAMILIES = {"on": (0, NOTE_OFF), "off": (NOTE_OFF, TIME_SHIFT), "shift": (TIME_SHIFT, START), "end": (END, END + 1)}


def random_walk(data, max_steps: int) -> list[int]:
    """Start, tokens drawn among `allowed()` (End may come early), notes drawn until it can close, closed."""
    return closed_walk(data, TOK.grammar(), FAMILIES, max_steps, finishers=(0, NOTE_OFF))


def check_walk_round_trips(data, max_steps: int):
    ids = random_walk(data, max_steps)
    assert TOK.grammar().first_violation(ids) is None
    assert serialize(*decode_events(np.array(ids))).tolist() == ids  # the token level
    again = TOK.encode(TOK.decode(ids).midi_bytes()).ids  # and through a MIDI file
    assert again.tolist() == ids


@FAST
@given(st.data())
def test_grammar_walks_re_encode_to_the_same_tokens(data):
    check_walk_round_trips(data, 60)


@pytest.mark.slow
@SLOW
@given(st.data())
def test_grammar_walks_re_encode_to_the_same_tokens_many(data):
    check_walk_round_trips(data, 300)


def test_a_track_may_be_missing_and_still_round_trip():
    """Track dropout makes drum-less and drums-only pieces; decode names the tracks by role,
    so they re-encode unchanged (a foreign file without drums is still refused)."""
    for notes in ([(3, 60, 0, 12)], [(2, 36, 0, 1)], [(3, 60, 0, 12), (2, 36, 4, 6)], [(1, 40, 0, 3), (3, 40, 0, 3)]):
        ids = serialize(np.array(notes))
        assert TOK.grammar().first_violation(ids) is None
        assert TOK.encode(TOK.decode(ids).midi_bytes()).ids.tolist() == ids.tolist()
    # whatever programs decode is given, roles come back by name (other with a bass program here)
    ids = serialize(np.array([(1, 40, 0, 3), (3, 41, 0, 30), (3, 42, 0, 30), (2, 36, 0, 1)]))
    piece = TOK.decode(ids, {"bass_program": 0, "other_program": 33})
    assert TOK.encode(piece.midi_bytes()).ids.tolist() == ids.tolist()


# ---------------------------------------------------------------- (b) any sequence decodes or is a TokenError

ANY_IDS = st.one_of(
    st.lists(st.integers(0, TOK.vocab_size - 1), max_size=600),  # in range
    st.lists(st.integers(-3, TOK.vocab_size + 3), max_size=50),  # a few out of range
    # mostly shifts and a few notes: long, sparse pieces
    st.lists(
        st.sampled_from([START, END, 0, 60, 383, NOTE_OFF, NOTE_OFF + 60, 767, TIME_SHIFT, START - 1, 794]),
        max_size=600,
    ),
)


@FAST
@given(ANY_IDS)
def test_any_sequence_decodes_or_raises_token_error(ids):
    check_decode_total(TOK, ids)


@pytest.mark.slow
@SLOW
@given(ANY_IDS)
def test_any_sequence_decodes_or_raises_token_error_many(ids):
    check_decode_total(TOK, ids)


def test_decode_rejects_what_is_not_a_token_sequence():
    for bad in ([1.5], [[1]], ["a"], [10**12], [-1]):
        with pytest.raises(TokenError):
            TOK.decode(bad)
    assert len(TOK.notes([TIME_SHIFT + 23] * 20_000 + [60])) == 0  # a note never ended nor passed: no note


# ---------------------------------------------------------------- (c) encoding keeps every representable note

TPQS = st.sampled_from([96, 120, 384, 480, 960])


@st.composite
def note_tracks(draw):
    """MIDI parts [(program, is_drum, [(pitch, start, end, velocity)])] with tick times. Within
    one part a pitch never overlaps itself (MIDI could not say which note_off is whose); parts
    of the trio's drums may overlap each other."""
    tpq = draw(TPQS)
    # durations from 1 tick: miditoolkit writes a 0-tick note's off before its on, so no file holds it
    note = st.tuples(st.integers(0, 127), st.integers(0, 16 * tpq), st.integers(1, 3 * tpq), st.integers(1, 127))
    parts = [(33, False), (0, True), (0, False)] + draw(st.lists(st.sampled_from([(0, True), (48, False)]), max_size=2))
    out = []
    for k, (program, is_drum) in enumerate(parts):
        raw = draw(st.lists(note, min_size=1 if k < 2 else 0, max_size=25))
        if is_drum:  # a small kit, so drum parts collide
            raw = [(36 + p % 8, s, d, v) for p, s, d, v in raw]
        free_from: dict[int, int] = {}
        kept = []
        for pitch, start, dur, vel in sorted(raw, key=lambda n: (n[1], n[0])):
            if start >= free_from.get(pitch, 0):
                kept.append((pitch, start, start + dur, vel))
                free_from[pitch] = start + dur
        out.append((program, is_drum, kept))
    return tpq, out


def grid(ticks: int, tpq: int) -> int:
    """Nearest twelfth of a beat, as the reference rounds it (Python's round: halves to even)."""
    return round(ticks * 12 / tpq)


def expected_trio(tpq, parts) -> set[tuple[int, int, int, int]]:
    """The notes the tokens hold: parts 0 (bass program) and 2 (the most notes, ties: the
    first) as bass and other, every drum part as drums; onsets and offsets on the grid (zero
    length kept); per track and pitch the k-th onset ends at the k-th offset (first in, first
    out, as the tokens are decoded)."""
    melodic = [k for k, (_, is_drum, notes) in enumerate(parts) if not is_drum and notes and k != 0]
    other = max(melodic, key=lambda k: len(parts[k][2]), default=None)
    roles = {0: 1, **{k: 2 for k, (_, d, _) in enumerate(parts) if d}, **({other: 3} if other is not None else {})}
    times: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    for k, track in roles.items():
        for pitch, start, end, _ in parts[k][2]:
            ons, offs = times.setdefault((track, pitch), ([], []))
            ons.append(grid(start, tpq))
            offs.append(grid(end, tpq))
    return {
        (track, pitch, on, off)
        for (track, pitch), (ons, offs) in times.items()
        for on, off in zip(sorted(ons), sorted(offs))
    }


def check_notes_survive(case):
    tpq, parts = case
    midi = miditoolkit.MidiFile(ticks_per_beat=tpq)
    for k, (program, is_drum, notes) in enumerate(parts):
        inst = miditoolkit.Instrument(program, is_drum=is_drum, name=f"part{k}")
        inst.notes = [miditoolkit.Note(vel, pitch, start, end) for pitch, start, end, vel in notes]
        midi.instruments.append(inst)
    enc = TOK.encode(dump(midi))
    assert TOK.grammar().first_violation(enc.ids) is None
    assert {tuple(n) for n in TOK.notes(enc.ids).tolist()} == expected_trio(tpq, parts)
    assert TOK.encode(TOK.decode(enc.ids, enc.report["meta"]).midi_bytes()).ids.tolist() == enc.ids.tolist()


@FAST
@given(note_tracks())
def test_encoding_keeps_every_representable_note(case):
    check_notes_survive(case)


@pytest.mark.slow
@SLOW
@given(note_tracks())
def test_encoding_keeps_every_representable_note_many(case):
    check_notes_survive(case)
