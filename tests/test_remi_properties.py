"""Properties of REMI (hypothesis): the grammar accepts exactly what the encoder writes.

(a) every walk through the grammar re-encodes to itself: encode(decode(ids)) == ids;
(b) decode of any ids at all succeeds or raises TokenError, quickly;
(c) any note list encodes, the round trip keeps every note REMI can express, and the decoded
    file encodes to the same ids (overlapping notes of one pitch included).
The `slow` variants run the same checks on many more examples (`pytest -m slow`).
"""

from __future__ import annotations

import io
import time

import miditoolkit
import numpy as np
import pytest
import symusic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_remi import decoded_notes, expected_notes

from musegen.errors import MidiError, TokenError
from musegen.tokenizers.remi import RemiTokenizer

TOKENIZERS = {
    "pop1k7": RemiTokenizer(),
    "fine-grid-no-chords": RemiTokenizer(beat_resolution=8, max_duration=32, chords=False),
}
FAST, SLOW = 60, 1500  # examples per property


def midi_bytes(midi: miditoolkit.MidiFile) -> bytes:
    out = io.BytesIO()
    midi.dump(file=out)
    return out.getvalue()


def token_class(tok: RemiTokenizer, ids: np.ndarray) -> np.ndarray:
    """A coarse family per token, so a walk picks Bar, Beat, Chord... evenly, not mostly pitches."""
    families = [
        tok.beat_of >= 0,
        tok.chord_root_of >= 0,
        tok.tempo_of >= 0,
        tok.pitch_of >= 0,
        tok.velocity_of >= 0,
        tok.duration_of >= 0,
    ]
    cls = np.zeros(tok.vocab_size, dtype=np.int64)  # 0: Bar, EOS, Chord_N_N
    for k, family in enumerate(families, start=1):
        cls[family] = k
    return cls[ids]


def walk(tok: RemiTokenizer, seed: int, length: int) -> list[int]:
    """A random sequence the grammar accepts: `length` free tokens (each family equally likely),
    then notes until the piece may close, then the grammar's closing tokens. Also checks that
    `allowed` and `step` agree on a few tokens at every step."""
    rng = np.random.default_rng(seed)
    g = tok.grammar()
    state, ids = g.start(), []
    while len(ids) < length or not g.can_close(state):
        mask = g.allowed(state)
        for probe in rng.integers(0, tok.vocab_size, 4).tolist():
            try:
                g.step(state, probe)
                stepped = True
            except TokenError:
                stepped = False
            assert stepped == mask[probe], (ids, tok.vocab[probe])
        choices = np.flatnonzero(mask)
        assert len(choices), f"dead end after {len(ids)} tokens"
        if len(ids) >= length:  # finishing: head for a note (pitch, velocity, duration; a tempo first)
            families = token_class(tok, choices)
            for wanted in (6, 5, 4, 3, 1, 0):
                if (families == wanted).any():
                    choices = choices[families == wanted]
                    break
        else:
            families = token_class(tok, choices)
            choices = choices[families == rng.choice(np.unique(families))]
        token = int(rng.choice(choices))
        ids.append(token)
        state = g.step(state, token)
        if token == tok.eos_id:
            return ids
    return ids + g.close(state)


def check_walk_round_trip(tok: RemiTokenizer, seed: int, length: int) -> None:
    ids = walk(tok, seed, length)
    assert ids[-2:] == [tok.bar_id, tok.eos_id]
    again = tok.encode(tok.decode(ids).midi_bytes()).ids.tolist()
    if again != ids:
        k = next((i for i, (a, b) in enumerate(zip(again, ids)) if a != b), min(len(again), len(ids)))
        raise AssertionError(
            f"re-encoding differs at token {k}: {[tok.name(t) for t in ids[max(k - 6, 0) : k + 3]]}"
            f" became {[tok.name(t) for t in again[max(k - 6, 0) : k + 3]]}"
        )


walks = dict(kind=st.sampled_from(sorted(TOKENIZERS)), seed=st.integers(0, 2**32 - 1), length=st.integers(1, 300))


@settings(deadline=None, max_examples=FAST)
@given(**walks)
def test_grammar_walks_re_encode_to_themselves(kind, seed, length):
    check_walk_round_trip(TOKENIZERS[kind], seed, length)


@pytest.mark.slow
@settings(deadline=None, max_examples=SLOW)
@given(**walks)
def test_grammar_walks_re_encode_to_themselves_many(kind, seed, length):
    check_walk_round_trip(TOKENIZERS[kind], seed, length)


# ---------------------------------------------------------------- (b) decode of anything


def any_ids(vocab_size: int):
    """Arbitrary ints around the vocabulary, and grammar walks with a few tokens replaced."""
    arbitrary = st.lists(st.integers(-3, vocab_size + 3), max_size=400)
    corrupted = st.builds(
        lambda seed, length, edits: _corrupt(walk(TOKENIZERS["pop1k7"], seed, length), edits),
        st.integers(0, 2**32 - 1),
        st.integers(1, 200),
        st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(-1, vocab_size)), max_size=4),
    )
    return st.one_of(arbitrary, corrupted)


def _corrupt(ids: list[int], edits) -> list[int]:
    ids = list(ids)
    for where, token in edits:
        ids[int(where * len(ids))] = token
    return ids


def check_decode_of_anything(ids: list[int]) -> None:
    tok = TOKENIZERS["pop1k7"]
    started = time.perf_counter()
    try:
        piece = tok.decode(ids)
    except TokenError as exc:
        assert "\n" not in str(exc)
        return
    assert time.perf_counter() - started < 1.0
    data = piece.midi_bytes()  # whatever decodes is a MIDI file that loads back
    try:
        tok.encode(data)
    except MidiError as exc:  # e.g. a layout with no note at all
        assert "no notes" in str(exc) or "only drum" in str(exc), exc


@settings(deadline=None, max_examples=4 * FAST, suppress_health_check=[HealthCheck.too_slow])
@given(any_ids(TOKENIZERS["pop1k7"].vocab_size))
def test_decode_of_any_ids_succeeds_or_raises_token_error(ids):
    check_decode_of_anything(ids)


@pytest.mark.slow
@settings(deadline=None, max_examples=SLOW, suppress_health_check=[HealthCheck.too_slow])
@given(any_ids(TOKENIZERS["pop1k7"].vocab_size))
def test_decode_of_any_ids_succeeds_or_raises_token_error_many(ids):
    check_decode_of_anything(ids)


# ---------------------------------------------------------------- (c) any note list

note = st.tuples(st.integers(0, 20_000), st.integers(0, 3_000), st.integers(0, 127), st.integers(1, 127))
note_lists = dict(
    kind=st.sampled_from(sorted(TOKENIZERS)),
    tpq=st.sampled_from([96, 220, 384, 480, 1000]),
    tracks=st.lists(st.tuples(st.booleans(), st.lists(note, max_size=80)), min_size=1, max_size=3),
)


def check_note_list(kind: str, tpq: int, tracks) -> None:
    """tracks: (is_drum, [(start, length, pitch, velocity)]), ticks at `tpq` per beat."""
    tok = TOKENIZERS[kind]
    midi = miditoolkit.MidiFile(ticks_per_beat=tpq)
    for is_drum, notes in tracks:
        inst = miditoolkit.Instrument(program=0, is_drum=is_drum)
        inst.notes = [miditoolkit.Note(v, p, s, s + n) for s, n, p, v in notes]
        midi.instruments.append(inst)
    data = midi_bytes(midi)
    score = symusic.Score.from_midi(data)
    if not any(len(t.notes) and not t.is_drum for t in score.tracks):
        with pytest.raises(MidiError):
            tok.encode(data)
        return
    enc = tok.encode(data)
    assert tok.grammar().first_violation(enc.ids) is None
    piece = tok.decode(enc.ids)
    assert decoded_notes(piece, tok) == expected_notes(score, tok)
    assert np.array_equal(tok.encode(piece.midi_bytes()).ids, enc.ids)


@settings(deadline=None, max_examples=FAST, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(**note_lists)
def test_any_note_list_encodes_and_keeps_every_expressible_note(kind, tpq, tracks):
    check_note_list(kind, tpq, tracks)


@pytest.mark.slow
@settings(deadline=None, max_examples=SLOW, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(**note_lists)
def test_any_note_list_encodes_and_keeps_every_expressible_note_many(kind, tpq, tracks):
    check_note_list(kind, tpq, tracks)
