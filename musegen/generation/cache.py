"""A suffix cache: the sampler's memory of what followed the piece's recent tokens before.

A groove continuation is mostly a copy of the bars just heard, and the Performers copy poorly
(docs/results.md). The cache predicts the next token the way a copy would: it finds
the earlier places where the last tokens of the piece occurred, as long a run of them as still
occurs (an *induction* match, at least `shortest` tokens), and proposes the tokens that came
next there. The sampler mixes that with the model, as a cache language model does (Kuhn & De Mori
1990; Grave et al. 2017):

    p(t) = (1 - w) p_model(t) + w p_cache(t)    where a match is found, p_model(t) elsewhere.

The mixture is a distribution of its own, so its teacher-forced NLL on real pieces says whether
it predicts them better than the model alone (`scripts/experiments/cache_nll.py`).

Where bars are marked by a token, the cache does not go on with a loop of one to four bars
longer than the prompt does, but for a phrase of three or four bars played once more
(`loop_ends`): a bar copied once matches its own copy best, so the copy proposes itself again,
and songs got stuck on one bar, on two, or on their prompt's phrase for the rest of their
continuation (docs/sampling.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .constraints import Constraint, Row, Run

LONGEST = 64  # tokens of context matched at most: longer matches change nothing in a 2-bar loop
WINDOW = 4096  # the last tokens searched (30-60 groove bars), so every step costs the same
LOOP_PERIODS = (1, 2, 3, 4)  # loops of one to four bars (`loop_ends`)
PHRASE = 3  # a loop of this many bars or more may go round once beyond the prompt's: songs repeat phrases


def continuations(
    ids: np.ndarray,
    shortest: int,
    longest: int = LONGEST,
    keys: np.ndarray | None = None,
    barred: np.ndarray | None = None,
) -> np.ndarray:
    """The tokens that followed each earlier occurrence of the longest suffix of `ids` (of
    length `shortest`..`longest`) that occurs earlier; empty when none of `shortest` does. With
    `keys` (a key for each id), tokens are compared by their keys: tokens of one key match.
    `barred`: positions where no occurrence may end (what followed them is not proposed).

    Candidates are the positions whose token equals the last one; each is compared backwards with
    the suffix, token by token, in one array (candidates x lengths), and the longest agree."""
    ids = np.asarray(ids)
    seen = ids if keys is None else keys[ids]
    n = len(ids)
    ends = np.flatnonzero(seen[:-1] == seen[-1])  # an occurrence's last position; ends + 1 < n
    if barred is not None:
        ends = ends[~np.isin(ends, barred)]
    if not len(ends):
        return ids[:0]
    back = np.arange(min(longest, n - 1))
    at = ends[:, None] - back
    same = (at >= 0) & (seen[np.maximum(at, 0)] == seen[n - 1 - back])
    lengths = np.where(same.all(1), len(back), same.argmin(1))  # tokens agreeing before the first that differs
    k = lengths.max()
    return ids[ends[lengths == k] + 1] if k >= shortest else ids[:0]


def loop_ends(ids: np.ndarray, bar_id: int, given: int, keys: np.ndarray | None = None) -> np.ndarray | None:
    """Where the cache may not match so as not to go on with a loop of bars (one bar played again
    and again, two in turn, or a phrase of three or four: the `LOOP_PERIODS`) longer than the
    given tokens (`ids[:given]`, the prompt) do. For each period p: while the bar being written
    (after the last `bar_id`) is so far a copy of the bar p before it, and the bars already stand
    in as long a run of bars each equal to the one p before it as any run of the prompt's (none,
    for a prompt without one; p bars, once round the phrase, for p of `PHRASE` or more), the
    positions at the same place in each earlier bar like the one copied. None where nothing is
    barred."""
    ids = np.asarray(ids)
    seen = ids if keys is None else keys[ids]
    starts = np.flatnonzero(ids == bar_id)
    writing = seen[starts[-1] + 1 :] if len(starts) else seen[:0]
    heard = max(int(np.searchsorted(starts, given)) - 1, 0)  # the bars that end within the prompt
    bars = None
    barred = []
    for period in LOOP_PERIODS:
        if len(starts) <= period:
            continue
        copied = seen[starts[-period - 1] + 1 : starts[-period]]
        if len(writing) >= len(copied) or not np.array_equal(writing, copied[: len(writing)]):
            continue
        if bars is None:  # built only where the bar being written copies one
            bars = [seen[a + 1 : b] for a, b in zip(starts[:-1], starts[1:])]
        runs = np.zeros(len(bars), dtype=np.int64)  # bars in a row each equal to the one `period` before
        for k in range(period, len(bars)):
            runs[k] = runs[k - 1] + 1 if np.array_equal(bars[k], bars[k - period]) else 0
        if runs[-1] >= runs[:heard].max(initial=period if period >= PHRASE else 0):
            like = [k for k, bar in enumerate(bars) if np.array_equal(bar, copied)]
            barred.append(starts[like] + len(writing))
    return np.unique(np.concatenate(barred)) if barred else None


def cache_probs(
    ids: np.ndarray, shortest: int, width: int, keys: np.ndarray | None = None, barred: np.ndarray | None = None
) -> np.ndarray | None:
    """p_cache over `width` ids: the continuations' frequencies; None where no match is found."""
    found = continuations(ids, shortest, keys=keys, barred=barred)
    if not len(found):
        return None
    return np.bincount(found, minlength=width)[:width] / len(found)


@dataclass(frozen=True)
class SuffixCache(Constraint):
    """The model's distribution mixed with the suffix cache's at weight `weight` (0..1), before the
    temperature. The cache searches the row's last WINDOW tokens, matching them as the tokenizer
    says (`Tokenizer.cache_match`), never so as to go on with a loop of bars longer than the prompt
    does (`loop_ends`, where the tokenizer marks bars with a token: `Tokenizer.track_marks`), and
    proposes only what the masks allow (its continuations renormalised over the allowed ids);
    where it proposes nothing allowed, the row keeps the model's distribution."""

    weight: float

    def reweight(self, run: Run, rows: list[Row], logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        logp = logits.float().log_softmax(-1)
        width = logits.shape[-1]
        keys, shortest = run.tokenizer.cache_match
        marks = run.tokenizer.track_marks
        bar_id = None if marks is None else marks.bar_id
        cached = np.zeros((len(rows), width), dtype=np.float32)
        for b, row in enumerate(rows):
            if row.done:
                continue
            recent = np.asarray(row.ids[-WINDOW:])
            given = row.base - (len(row.ids) - len(recent))  # the prompt's end, counted in `recent`
            barred = None if bar_id is None else loop_ends(recent, bar_id, given, keys)
            found = cache_probs(recent, shortest, width, keys, barred)
            if found is not None:
                cached[b] = found
        proposed = torch.from_numpy(cached).to(logp.device) * allowed
        mass = proposed.sum(-1, keepdim=True)
        mixed = (1 - self.weight) * logp.exp() + self.weight * proposed / mass.clamp_min(1e-30)
        return torch.where(mass > 0, mixed.log(), logp)  # log 0 = -inf: neither proposes it
