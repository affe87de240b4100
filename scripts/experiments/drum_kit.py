"""What a groove model's drums keep of the prompt, from an `evaluate continuation` folder.

For the first two continued bars of each sample, and of each real continuation:
- kit kept: the share of the prompt's drum pitches that are played again;
- new pitches: the share of drum hits on a pitch the prompt never played;
- repeated hits: the share of drum hits whose (place in the bar, on a 24-step grid; pitch) the
  prompt's bars after the pickup also hold, which is what looping the prompt would give.
    python scripts/experiments/drum_kit.py RUN/mma CORPUS
"""

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from musegen.evaluation.compare import read_jsonl
from musegen.evaluation.run_continuation import PIECE_RECORD
from musegen.music.midi import read_parts
from musegen.music.notes import NoteTable

STEPS = 24  # places in a 4/4 bar: sixteenths and eighth triplets


def drum_hits(path: Path) -> dict[int, list[tuple[int, int]]]:
    """Bar -> [(place in the bar, pitch)] of the file's drum notes, read as evaluation reads it."""
    notes = NoteTable.from_parsed(read_parts(path))
    drums = np.array([t.is_drum for t in notes.tracks], dtype=bool)[notes.track]
    bar = 4 * notes.tpq
    hits = defaultdict(list)
    for start, pitch in zip(notes.start[drums].tolist(), notes.pitch[drums].tolist()):
        hits[start // bar].append((start % bar * STEPS // bar, pitch))
    return hits


def kept(hits: dict[int, list[tuple[int, int]]], first_bar: int) -> tuple[float, float, float] | None:
    kit = {pitch for b in range(first_bar) for _, pitch in hits[b]}
    pattern = {hit for b in range(1, first_bar) for hit in hits[b]}  # bar 0 is the pickup
    played = [hit for b in range(first_bar, first_bar + 2) for hit in hits[b]]
    if not kit or not played:
        return None
    return (
        len(kit & {pitch for _, pitch in played}) / len(kit),
        float(np.mean([pitch not in kit for _, pitch in played])),
        float(np.mean([hit in pattern for hit in played])),
    )


def main(run: Path, corpus: Path) -> None:
    model, real = [], []
    for row in read_jsonl(run / "pieces.jsonl", PIECE_RECORD):
        piece, first_bar = row["piece"], row["span_start_bar"]
        real.append(kept(drum_hits(corpus / "references" / f"{piece}.mid"), first_bar))
        folder, name = piece.rsplit("/", 1)
        for k in range(len(row["model"])):
            model.append(kept(drum_hits(run / "samples" / folder / f"{name}_{k:03d}.mid"), first_bar))
    print("| | spans | kit kept | hits on new pitches | hits repeating the prompt |\n|---|---|---|---|---|")
    for label, rows in (("model", model), ("real", real)):
        values = np.array([r for r in rows if r is not None])
        print(f"| {label} | {len(values)} | " + " | ".join(f"{v:.2f}" for v in values.mean(0)) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
