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

Where bars are marked by a token, the cache does not copy a bar straight after itself more
times in a row than the prompt does (`loop_ends`): a bar copied once matches its own copy
best, so the copy proposes itself again and a song got stuck on one bar for the rest of its
continuation (docs/sampling.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .constraints import Constraint, Row, Run

LONGEST = 64  # tokens of context matched at most: longer matches change nothing in a 2-bar loop
WINDOW = 4096  # the last tokens searched (30-60 groove bars), so every step costs the same


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
    """Where the cache may not match so as not to copy the last bar once more: while the bar
    being written (after the last `bar_id`) is so far a copy of the bar before it, and that bar
    already stands as many times in a row as any bar of the given tokens (`ids[:given]`, the
    prompt) does, at least once, the positions at the same place in each earlier bar like it.
    None where nothing is barred."""
    ids = np.asarray(ids)
    seen = ids if keys is None else keys[ids]
    starts = np.flatnonzero(ids == bar_id)
    if len(starts) < 2:
        return None
    writing = seen[starts[-1] + 1 :]
    last = seen[starts[-2] + 1 : starts[-1]]
    if len(writing) >= len(last) or not np.array_equal(writing, last[: len(writing)]):
        return None
    bars = [seen[a + 1 : b].tobytes() for a, b in zip(starts[:-1], starts[1:])]
    runs = np.ones(len(bars), dtype=np.int64)  # how many times in a row each bar has stood
    for k in range(1, len(bars)):
        runs[k] = runs[k - 1] + 1 if bars[k] == bars[k - 1] else 1
    in_prompt = runs[: max(int(np.searchsorted(starts, given)) - 1, 0)]  # the bars that end within the prompt
    if runs[-1] < in_prompt.max(initial=1):
        return None
    return starts[:-1][[bar == bars[-1] for bar in bars]] + len(writing)


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
    says (`Tokenizer.cache_match`), never so as to copy a bar once more than the prompt repeats
    one (`loop_ends`, where the tokenizer marks bars with a token: `Tokenizer.track_marks`), and
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
