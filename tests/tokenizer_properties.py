"""Properties every trio tokenizer has, for the property-based tests (hypothesis): random walks
through its grammar, and decoding that never fails in an unexpected way."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from musegen.errors import TokenError


def closed_walk(
    data, grammar, families: dict[str, tuple[int, int]], max_steps: int, finishers: tuple[int, int]
) -> list[int]:
    """A piece the grammar accepts: its first token, then up to `max_steps` tokens drawn among
    `allowed()` (a family, a range of ids, first, then a token of it, which keeps the walks
    musical: uniform over the tokens would almost always pick a note); where it has not ended,
    tokens drawn among the allowed ids in `finishers` until it can close, then its closing."""
    state = grammar.start()
    first = int(np.flatnonzero(grammar.allowed(state))[0])
    ids, state = [first], grammar.step(state, first)

    def draw(low: int, high: int, label: str) -> None:
        nonlocal state
        tok = low + data.draw(st.sampled_from(np.flatnonzero(grammar.allowed(state)[low:high]).tolist()), label=label)
        ids.append(tok)
        state = grammar.step(state, tok)

    for _ in range(data.draw(st.integers(0, max_steps), label="steps")):
        mask = grammar.allowed(state)
        if not mask.any():  # ended
            return ids
        family = data.draw(st.sampled_from([f for f, (a, b) in families.items() if mask[a:b].any()]), label="family")
        draw(*families[family], "token")
    if not grammar.allowed(state).any():
        return ids
    while not grammar.can_close(state):
        draw(*finishers, "finish")
    return ids + [int(t) for t in grammar.close(state)]


def check_decode_total(tok, ids) -> None:
    """`ids` decode to the three tracks, or raise a one-line TokenError."""
    try:
        piece = tok.decode(ids)
    except TokenError as err:
        assert str(err) and "\n" not in str(err)
    else:
        assert len(piece.tracks) == 3
