"""Does the model read a long prompt well? The NLL of the same real tokens given all of the piece
before them, or only its bars of about the last C tokens (a cut at a bar line, as a sampler could
feed a long prompt's tail to a fresh session).

For each piece of a prepared split long enough, the 512 tokens from position AT are scored with
the whole piece before them (positions AT.. of one pass, past the model's training length when
AT is) and from the last bar line at least C tokens before AT (C = 256, 512, 896).
    python scripts/experiments/long_context.py CHECKPOINT DATA SPLIT AT [AT ...]
    python scripts/experiments/long_context.py song data/freedoom test 1536 4096 7168
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from musegen.checkpoint import load_checkpoint
from musegen.metrics.loss import token_nll
from musegen.shards import Shards, resolve_split

SPAN = 512  # tokens scored at each AT
CONTEXTS = (256, 512, 896)  # at least this many tokens before AT, from a bar line


def scored(model, pad_id: int, piece: np.ndarray, start: int, at: int) -> float:
    """Mean NLL of piece[at : at + SPAN] given piece[start:at] (teacher-forced, one pass)."""
    crop = piece[start : at + SPAN + 1]
    nll = token_nll(model, [crop], len(crop) - 1, pad_id, batch_size=1)[0]
    return float(nll[at - start - 1 : at - start - 1 + SPAN].mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("data")
    parser.add_argument("split")
    parser.add_argument("at", type=int, nargs="+")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tok, _, meta = load_checkpoint(args.checkpoint)
    shards = Shards(args.data)
    pieces = [np.asarray(p) for p in shards.pieces(resolve_split(shards.splits, args.split))]
    print(f"training length {meta.get('train_len')}; mean NLL (nats/token) of tokens AT..AT+{SPAN}")
    head = " | ".join(f"last bars, >= {c} tokens" for c in CONTEXTS)
    print(f"| AT | pieces | whole piece before | {head} | pieces lower from >= 512 |")
    print("|---|---|---|" + "---|" * (len(CONTEXTS) + 1))
    for at in args.at:
        rows = []
        for piece in (p for p in pieces if len(p) > at + SPAN):
            bars = np.asarray(tok.bar_starts(piece[:at]))
            rows.append([scored(model, tok.pad_id, piece, 0, at)])
            rows[-1] += [scored(model, tok.pad_id, piece, int(bars[bars <= at - c][-1]), at) for c in CONTEXTS]
        rows = np.array(rows)
        better = (rows[:, 2] < rows[:, 0]).mean()
        cells = " | ".join(f"{m:.3f}" for m in rows.mean(0))
        print(f"| {at} | {len(rows)} | {cells} | {better:.0%} |")


if __name__ == "__main__":
    main()
