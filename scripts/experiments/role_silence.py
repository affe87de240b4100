"""How often a role that plays in the prompt is silent in a continued bar, for runs of `musegen
evaluate continuation` on a folder of MIDI files (issue #42: "no role that plays in the prompt is
left silent in more than 5% of the continued bars").

    python scripts/experiments/role_silence.py RUN [RUN ...]

Each piece is read as the run's tokenizer reads it (its tokenized bars: the roles bass, drums and
other that the model was given); a role plays in the prompt when it has an onset in the prompt's
bars. For each such role and sample, each continued bar counts as silent when the sample has no
onset of that role there. The real continuation's bars are counted the same way (a song's own
rests), so the two columns read side by side. Prints a markdown table, a row per run.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from musegen import schemas
from musegen.evaluation.compare import read_jsonl
from musegen.evaluation.run_continuation import EVALUATION_SETTINGS, PIECE_RECORD
from musegen.music.notes import NoteTable
from musegen.tokenizers.base import load_tokenizer

ROLES = ("bass", "drums", "other")


def count(run: Path) -> tuple[Counter, Counter, Counter]:
    """(bars counted, bars silent in the samples, bars silent in the real continuation), by role."""
    settings = schemas.read(run / "run.json", EVALUATION_SETTINGS)
    data, bars, prompt_bars = Path(settings["data"]), settings["bars"], settings["prompt_bars"]
    tokenizer = load_tokenizer(Path(settings["checkpoint"]) / "tokenizer.json")
    counted, silent, real_silent = Counter(), Counter(), Counter()
    for row in read_jsonl(run / "pieces.jsonl", PIECE_RECORD):
        start = row["span_start_bar"]
        real = tokenizer.decode(tokenizer.encode(data / f"{row['piece']}.mid").ids)
        samples = sorted((run / "samples").glob(f"{row['piece']}_[0-9][0-9][0-9].mid"))
        generated = [NoteTable.read(sample).with_roles_of(real) for sample in samples]
        continued = range(start, start + bars)
        for role in ROLES:
            played = real.in_role(role)
            if not len(played.onsets_in(start - prompt_bars, prompt_bars)):
                continue
            real_rests = sum(not len(played.onsets_in(bar, 1)) for bar in continued)
            for sample in generated:  # the real bars are counted once a sample, as the samples' are
                notes = sample.in_role(role)
                counted[role] += bars
                silent[role] += sum(not len(notes.onsets_in(bar, 1)) for bar in continued)
                real_silent[role] += real_rests
    return counted, silent, real_silent


def main(runs: list[str]) -> None:
    print("| run | " + " | ".join(f"{r}: silent bars (real)" for r in ROLES) + " | worst |")
    print("|---" * (len(ROLES) + 2) + "|")
    for run in map(Path, runs):
        counted, silent, real_silent = count(run)
        cells, worst = [], 0.0
        for role in ROLES:
            if not counted[role]:
                cells.append("-")
                continue
            share = silent[role] / counted[role]
            worst = max(worst, share)
            cells.append(f"{share:.1%} ({real_silent[role] / counted[role]:.1%}; {counted[role]} bars)")
        print(f"| {run.name} | " + " | ".join(cells) + f" | {worst:.1%} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
