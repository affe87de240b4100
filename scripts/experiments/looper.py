"""The looper baseline of issue #28's protocol: a "continuation" that replays the prompt's last
two bars four times, measured as `evaluate continuation` measures a model's, on the same pieces
(read from a run's pieces.jsonl) beside the same real and floor spans. It is what a perfect copy
scores, and so how far the style and density criteria reward copying alone.
    python scripts/experiments/looper.py RUN_DIR CORPUS_OR_MIDI_FOLDER SPLIT OUT_DIR
then `python scripts/experiments/groove_targets.py --mma OUT_DIR --out OUT_DIR` gives its criteria table.
"""

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from musegen import schemas
from musegen.evaluation.run_continuation import EVALUATION_SETTINGS, PIECE_RECORD, SPAN_METRICS, Piece, split_pieces
from musegen.metrics.metric import Span, measure
from musegen.metrics.report import json_safe
from musegen.music.constants import BEATS_PER_BAR
from musegen.music.notes import NoteTable
from musegen.shards import Shards
from musegen.tokenizers import tokenizer_from_dict

LOOP_BARS = 2


def looped(notes: NoteTable, span_start: int, bars: int) -> NoteTable:
    """The notes before bar `span_start`, then the two bars before it played again until
    `span_start + bars`."""
    bar = BEATS_PER_BAR * notes.tpq
    prompt = notes.select(notes.start < span_start * bar)
    loop = prompt.select(prompt.start >= (span_start - LOOP_BARS) * bar)
    copies = [prompt] + [
        replace(loop, start=loop.start + k * LOOP_BARS * bar, end=loop.end + k * LOOP_BARS * bar)
        for k in range(1, bars // LOOP_BARS + 1)
    ]
    fields = ("start", "end", "pitch", "velocity", "track")
    return replace(notes, **{f: np.concatenate([getattr(c, f) for c in copies]) for f in fields})


def main(run: str, data: str, split: str, out: str) -> None:
    settings = schemas.read(Path(run) / "run.json", EVALUATION_SETTINGS)
    pieces_file = Path(run) / "pieces.jsonl"
    lines_read = filter(None, pieces_file.read_text().splitlines())
    records = [schemas.loads(line, PIECE_RECORD, pieces_file).model_dump() for line in lines_read]
    index = Path(data) / "index.json"
    tok = Shards(data).tokenizer if index.exists() else tokenizer_from_dict({"kind": "groove-dur"})
    _, names, pieces, _ = split_pieces(data, split, tok)
    ids_of = dict(zip(names, pieces))
    Path(out).mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(run) / "run.json", Path(out) / "run.json")
    with open(Path(out) / "pieces.jsonl", "w") as lines:
        for record in records:
            ids = ids_of[record["piece"]]
            notes = tok.decode(ids)
            piece = Piece(record["piece"], ids, notes, record["span_start_bar"])
            span = Span(
                looped(notes, piece.span_start, settings["bars"]), piece.span_start, settings["bars"], piece.context()
            )
            record |= {"model": [measure(SPAN_METRICS, span)], "model_positions": [], "seconds": 0.0}
            lines.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
    print(f"{len(records)} pieces looped into {out}")


if __name__ == "__main__":
    main(*sys.argv[1:5])
