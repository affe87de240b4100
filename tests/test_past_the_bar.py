"""Song sampling: the bar line keeps the model's probability of Bar and of every position past the
end of the current bar (a position the meter does not have means the bar is over), whatever the
meter."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_meter_spans import waltz

from musegen.generation.constraints import KeptShare, Row, Run
from musegen.tokenizers import tokenizer_from_dict
from musegen.tokenizers.song_grammar import BAR, DURATION, METER


@pytest.fixture(scope="module")
def song():
    tok = tokenizer_from_dict({"kind": "song"})
    return tok, tok.grammar()


def rows_after_notes(tok, grammar, ids, limit: int = 40) -> list[Row]:
    """A row at each point of `ids` right after a note, where Bar may come next."""
    rows = []
    for k, state in enumerate(grammar.states(ids)[1:], start=1):
        if state.after == DURATION and grammar.sampling_mask(state)[tok.bar_id] and len(rows) < limit:
            rows.append(Row(ids=list(ids[:k]), base=k, base_state=state, target_bar=None, state=state))
    return rows


@pytest.mark.parametrize("meter, units", [("3/4", 36), ("4/4", 48)])
def test_bar_takes_the_mass_of_the_positions_past_the_end(song, meter, units):
    tok, grammar = song
    piece = waltz(6, pickup=False)
    if meter == "4/4":  # the same notes across 4/4 bars
        piece = replace(piece, time_signatures=[(0, 4, 4)])
    ids = tok.encode(piece.midi_bytes()).ids
    rows = rows_after_notes(tok, grammar, ids)
    assert len(rows) >= 10
    logits = torch.randn(len(rows), tok.vocab_size, generator=torch.Generator().manual_seed(0)) * 2
    allowed = torch.from_numpy(np.stack([grammar.sampling_mask(r.state) for r in rows]))
    run = Run(tokenizer=tok, grammar=grammar, budget=100, device=torch.device("cpu"))
    moved = KeptShare().reweight(run, rows, logits, allowed).masked_fill(~allowed, -math.inf).softmax(-1)
    p = logits.softmax(-1)
    past = tok.position_ids[units:]
    assert np.array_equal(grammar.past_the_bar(rows[0].state), past)
    expected = p[:, tok.bar_id] + p[:, past].sum(-1)
    assert torch.allclose(moved[:, tok.bar_id], expected, atol=1e-5)
    # the other allowed ids share the rest in the model's proportions
    others = allowed.clone()
    others[:, tok.bar_id] = False
    ratio = moved[others] / p[others]
    rows_of = others.nonzero()[:, 0]
    for r in range(len(rows)):
        assert torch.allclose(ratio[rows_of == r], ratio[rows_of == r][0], rtol=1e-4)


def test_no_position_is_past_the_bar_before_its_meter_is_known(song):
    tok, grammar = song
    states = grammar.states(tok.encode(waltz(3).midi_bytes()).ids)
    assert all(grammar.past_the_bar(s) is None for s in states if s.after in (BAR, METER))
    assert any(grammar.past_the_bar(s) is not None for s in states)
