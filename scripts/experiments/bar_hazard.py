"""Does a song model end its bars early? Teacher-forced on the real bars that an `evaluate
continuation` run continued, the probability the model gives the bar line after each complete note
of a real bar (where the grammar allows it and the real piece plays on) is added up: the bar lines
too many a bar that sampling would draw, by quarter of the bar (an experiment script).
    python scripts/experiments/bar_hazard.py CHECKPOINT RUN SONGS      (SONGS: the MIDI folder)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from musegen import schemas
from musegen.checkpoint import load_checkpoint
from musegen.evaluation.compare import read_jsonl
from musegen.evaluation.run_continuation import EVALUATION_SETTINGS, PIECE_RECORD
from musegen.music.midi import find_midi_files
from musegen.tokenizers.song_vocab import METERS, bar_units

MAX_LEN = 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("run", type=Path, help="an evaluate continuation run on SONGS")
    parser.add_argument("songs", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)  # the model's SPE and feature draws
    model, tok = load_checkpoint(args.checkpoint)[:2]  # in eval mode
    starts_at = {r["piece"]: r["span_start_bar"] for r in read_jsonl(args.run / "pieces.jsonl", PIECE_RECORD)}
    span = schemas.read(args.run / "run.json", EVALUATION_SETTINGS)["bars"]
    extra, notes_ended, bars = np.zeros(4), np.zeros(4), 0
    for path in find_midi_files(args.songs):
        if path.stem not in starts_at:
            continue
        ids = np.asarray(tok.encode(path).ids, dtype=np.int64)
        starts, first = tok.bar_starts(ids), starts_at[path.stem]
        ids = ids[: min(starts[first + span] if first + span < len(starts) else len(ids), MAX_LEN)]
        with torch.no_grad():
            logits = model(torch.from_numpy(ids)[None])[0]
        bar_p = logits.float().softmax(-1)[:, tok.bar_id].numpy()
        position, length = 0, bar_units(4, 4)
        for i, token in enumerate(ids[:-1]):
            if tok.meter_of[token] >= 0:
                length = bar_units(*METERS[tok.meter_of[token]])
            position = tok.position_of[token] if tok.position_of[token] >= 0 else position
            if i < starts[first]:
                continue
            if ids[i + 1] == tok.bar_id:
                bars += 1
            elif tok.duration_of[token] >= 0:  # a note is complete: the grammar allows the bar line
                quarter = min(4 * position // length, 3)
                extra[quarter] += bar_p[i]
                notes_ended[quarter] += 1
    print(f"{args.checkpoint}: {bars} real bars continued")
    print(f"bar lines too many a bar: {extra.sum() / bars:.2f}; by quarter of the bar {np.round(extra / bars, 2)}")
    print(f"mean probability of the bar line after a note, by quarter: {np.round(extra / notes_ended, 3)}")


if __name__ == "__main__":
    main()
