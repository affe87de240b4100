"""Random groove loops (musegen/music/loops.py): reproducible, a real trio, periodic in the
way a copying model must exploit, and read by both groove tokenizers as they read any piece."""

from __future__ import annotations

import numpy as np
import pytest

from musegen.music.constants import BEATS_PER_BAR, TICKS_PER_BEAT
from musegen.music.loops import BARS, random_loop_piece
from musegen.music.notes import NoteTable
from musegen.tokenizers.groove import GrooveTokenizer
from musegen.tokenizers.groove_dur import GrooveDurTokenizer

PIECES = range(40)
BAR = BEATS_PER_BAR * TICKS_PER_BEAT


def bar_rows(table: NoteTable, role: str, bar: int, with_pitch: bool = True) -> list[tuple]:
    """The notes of one role in one bar, relative to the bar line, in a canonical order."""
    part = table.in_role(role)
    keep = (part.start >= bar * BAR) & (part.start < (bar + 1) * BAR)
    rows = zip(part.start[keep] - bar * BAR, part.end[keep] - part.start[keep], part.pitch[keep])
    return sorted((on, length, pitch) if with_pitch else (on, length) for on, length, pitch in rows)


def period(table: NoteTable, role: str, with_pitch: bool) -> int | None:
    """The fewest bars after which the role's bars repeat through the whole piece."""
    bars = [bar_rows(table, role, b, with_pitch) for b in range(BARS)]
    return next((p for p in range(1, BARS) if all(bars[b] == bars[b + p] for b in range(BARS - p))), None)


def test_the_same_seed_gives_the_same_piece_and_others_differ():
    assert random_loop_piece(7).midi_bytes() == random_loop_piece(7).midi_bytes()
    assert len({random_loop_piece(k).midi_bytes() for k in PIECES}) == len(PIECES)


@pytest.mark.parametrize("k", PIECES)
def test_a_loop_is_a_trio_that_repeats(k):
    """Drums repeat every 1 or 2 bars, pitches and all; bass and accompaniment repeat their rhythm
    with the drums and their pitches with the chord progression (at most 4 patterns long)."""
    table = NoteTable.read(random_loop_piece(k).midi_bytes())
    assert [t.role for t in table.tracks] == ["bass", "drums", "other"]
    assert all(len(table.in_role(role)) for role in ("bass", "drums", "other"))
    assert table.time_signatures == [(0, 4, 4)] and 70 <= table.tempos[0][1] <= 175
    assert table.end.max() <= BARS * BAR and (table.end > table.start).all()
    drums = period(table, "drums", with_pitch=True)
    assert drums in (1, 2)
    for role in ("bass", "other"):
        assert period(table, role, with_pitch=False) in (1, 2)
        assert period(table, role, with_pitch=True) in (1, 2, 4, 8)
    bass, other = table.in_role("bass").pitch, table.in_role("other").pitch
    assert 28 <= bass.min() and bass.max() <= 64 and 48 <= other.min() and other.max() <= 86
    assert bass.mean() < other.mean()


@pytest.mark.parametrize("tokenizer", [GrooveTokenizer(), GrooveDurTokenizer()], ids=lambda t: t.kind)
def test_both_groove_tokenizers_read_loops_in_their_grammar(tokenizer):
    """Every loop encodes to a sequence its grammar accepts, and decoding gives those tokens back;
    drums survive exactly (the groove grid holds the sixteenth and triplet grids)."""
    grammar = tokenizer.grammar()
    for k in range(12):
        midi = random_loop_piece(k).midi_bytes()
        ids = tokenizer.encode(midi).ids
        assert grammar.first_violation(ids) is None
        decoded = tokenizer.decode(ids)
        assert np.array_equal(ids, tokenizer.encode(decoded.midi_bytes()).ids)
        original = NoteTable.read(midi)
        assert sorted(decoded.in_role("drums").start.tolist()) == sorted(original.in_role("drums").start.tolist())
