"""Where a groove-dur model's teacher-forced NLL goes: note tokens by track, in the first three
bars of a test piece (the prompt and its pickup, as `evaluate continuation` cuts them) and in
the bars after them (what a continuation must get right).
    python scripts/experiments/track_nll.py CORPUS PIECES NAME=CHECKPOINT...
"""

import sys

import numpy as np

from musegen.checkpoint import load_checkpoint
from musegen.metrics.loss import token_nll
from musegen.music.roles import TRACKS
from musegen.shards import Shards
from musegen.tokenizers.groove_dur import DURATION, N_PITCH

PROMPT_BARS = 3  # pickup + 2 prompt bars
MAX_LEN = 1024


def main(corpus: str, n_pieces: int, models: list[str]) -> None:
    shards = Shards(corpus)
    pieces = [np.asarray(p[: MAX_LEN + 1], dtype=np.int64) for p in shards.pieces("test")[:n_pieces]]
    tok = shards.tokenizer
    heads = [f"{name} {part}" for name in TRACKS.values() for part in ("prompt", "after")]
    print("| model | " + " | ".join(heads) + " |\n|---|" + "---|" * len(heads))
    for spec in models:
        name, _, path = spec.partition("=")
        model = load_checkpoint(path)[0]
        sums = np.zeros((len(TRACKS), 2))
        counts = np.zeros((len(TRACKS), 2))
        for ids, nll in zip(pieces, token_nll(model, pieces, MAX_LEN, tok.pad_id)):
            targets = ids[1 : len(nll) + 1]
            bar = np.searchsorted(np.array(tok.bar_starts(ids)), np.arange(1, len(nll) + 1), side="right") - 1
            after = (bar >= PROMPT_BARS).astype(int)
            notes = targets < DURATION
            track = targets // N_PITCH
            np.add.at(sums, (track[notes], after[notes]), nll[notes])
            np.add.at(counts, (track[notes], after[notes]), 1)
        print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in (sums / counts).ravel()) + " |")
    print(f"\nNLL (nats) of note tokens, {len(pieces)} test pieces of {corpus}, positions up to {MAX_LEN}.")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
