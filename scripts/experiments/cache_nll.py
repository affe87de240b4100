"""Does the suffix cache (musegen/generation/cache.py) predict real pieces better than the model
alone? Teacher-forced NLL of the mixture (1 - w) p_model + w p_cache on a split's pieces, for a grid
of weights w and shortest matches, in the bars after the prompt (bar 3 on: what a continuation
must get right) and by token kind there (drum, bass and other notes, the rest). Choose the
settings on the validation split, and report them on the test split.
    python scripts/experiments/cache_nll.py CORPUS SPLIT PIECES NAME=CHECKPOINT...
"""

import sys

import numpy as np

from musegen.checkpoint import load_checkpoint
from musegen.generation.cache import cache_probs
from musegen.metrics.loss import token_nll
from musegen.music.roles import TRACKS
from musegen.shards import Shards
from musegen.tokenizers.groove_dur import DURATION, N_PITCH

PROMPT_BARS = 3  # pickup + 2 prompt bars, as `evaluate continuation` cuts them
MAX_LEN = 1024
WEIGHTS = (0.0, 0.1, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9)
SHORTEST = (1, 2, 4, 8, 16)
KINDS = [*TRACKS.values(), "rest"]


def cache_hits(ids: np.ndarray, n_targets: int, shortest: int, width: int) -> np.ndarray:
    """p_cache (the sampler's own, `cache_probs`) of each target token ids[1..n_targets] given the
    tokens before it; NaN: no match."""
    out = np.full(n_targets, np.nan)
    for i in range(n_targets):
        probs = cache_probs(ids[: i + 1], shortest, width)
        if probs is not None:
            out[i] = probs[ids[i + 1]]
    return out


def main(corpus: str, split: str, n_pieces: int, models: list[str]) -> None:
    shards = Shards(corpus)
    tok = shards.tokenizer
    pieces = [np.asarray(p[: MAX_LEN + 1], dtype=np.int64) for p in shards.pieces(split)[:n_pieces]]
    kinds, after = [], []
    for ids in pieces:
        targets = ids[1:]
        bar = np.searchsorted(np.array(tok.bar_starts(ids)), np.arange(1, len(ids)), side="right") - 1
        after.append(bar >= PROMPT_BARS)
        kinds.append(np.where(targets < DURATION, targets // N_PITCH, len(TRACKS)))
    hits = {s: [cache_hits(ids, len(ids) - 1, s, tok.vocab_size) for ids in pieces] for s in SHORTEST}
    for s in SHORTEST:
        h = np.concatenate(hits[s])[np.concatenate(after)]
        print(
            f"shortest {s}: a match at {np.mean(~np.isnan(h)):.1%} of the continued tokens, "
            f"the true token's cache probability {np.nanmean(h):.3f} where matched"
        )
    print()
    heads = ["model", "shortest", "w", "after the prompt"] + [f"{k} after" for k in KINDS]
    print("| " + " | ".join(heads) + " |\n|" + "---|" * len(heads))
    for spec in models:
        name, _, path = spec.partition("=")
        model = load_checkpoint(path)[0]
        p_model = np.exp(-np.concatenate(token_nll(model, pieces, MAX_LEN, tok.pad_id)))
        where, kind = np.concatenate(after), np.concatenate(kinds)
        for s in SHORTEST:
            h = np.concatenate(hits[s])
            for w in WEIGHTS if s == SHORTEST[0] else WEIGHTS[1:]:
                mixed = np.where(np.isnan(h), p_model, (1 - w) * p_model + w * np.nan_to_num(h))
                nll = -np.log(mixed)
                by_kind = [nll[where & (kind == k)].mean() for k in range(len(KINDS))]
                cells = [name, str(s), f"{w:g}", f"{nll[where].mean():.3f}"] + [f"{v:.3f}" for v in by_kind]
                print("| " + " | ".join(cells) + " |")
    print(
        f"\nNLL (nats a token), {len(pieces)} {split} pieces of {corpus}, positions up to {MAX_LEN}; "
        f"w = 0 is the model alone."
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:])
