"""Does a pop continuation keep its prompt's tempo? For POP909 songs, a 4-bar prompt continued for
64 bars with `--tempo keep` (the default) and `--tempo free` (the model's own tempo changes):
the tempo changes written after the prompt, and how far they stray from the prompt's last tempo,
both the file's own and the nearest one the tokens can name. Prints a Markdown table.
    python scripts/experiments/tempo_hold.py CHECKPOINT SONG.mid... [--bars 64] [--samples 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from musegen.checkpoint import load_checkpoint
from musegen.generation.loop import generate
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.music.notes import NoteTable

PROMPT_BARS = 4


def continuation_tempos(tok, prompt, sample) -> list[float]:
    """The tempos the sample writes after its prompt, as decoded (a repeat of the tempo in effect,
    which REMI writes 1 microsecond per quarter apart, counts as that tempo)."""
    piece = tok.decode(sample.ids)
    end = int(prompt.piece.end.max())
    return [bpm for at, bpm in piece.tempos if at >= end]


def tempo_at_prompt_end(song: NoteTable) -> float:
    """The file's tempo in effect where a prompt of its first PROMPT_BARS bars (from the bar of its
    first note) ends: 120 BPM, MIDI's default, where the file sets none by then."""
    end = (song.first_bar() + PROMPT_BARS) * 4 * song.tpq
    return ([bpm for tick, bpm in song.tempos if tick < end] or [120.0])[-1]


def run(checkpoint: str, songs: list[str], bars: int, samples: int) -> None:
    model, tok = load_checkpoint(checkpoint)[:2]
    torch.set_num_threads(2)
    print(f"{checkpoint}: {PROMPT_BARS}-bar prompts, {bars} bars continued, {samples} samples a song\n")
    print(
        "| song | prompt's last tempo (file / tokens) | --tempo | tempo changes after the prompt | range (BPM) "
        "| largest gap to the file's tempo | seconds |"
    )
    print("|---|---|---|---|---|---|---|")
    for song in songs:
        prompt = load_prompt(tok, song, bars=PROMPT_BARS)
        file_tempo = tempo_at_prompt_end(NoteTable.read(song))
        token_tempo = prompt.piece.tempos[-1][1]
        for tempo in ("keep", "free"):
            started = time.monotonic()
            settings = SampleSettings(bars=bars, num_samples=samples, seed=1, tempo=tempo, precision="fp32")
            drawn, _ = generate(model, tok, prompt, settings, progress=False)
            seconds = time.monotonic() - started
            tempos = np.array([t for s in drawn for t in continuation_tempos(tok, prompt, s)])
            distinct = np.unique(np.round(tempos, 2)) if len(tempos) else np.zeros(0)
            changes = int(
                sum(
                    np.count_nonzero(np.abs(np.diff([token_tempo, *t])) > 0.01)
                    for t in (continuation_tempos(tok, prompt, s) for s in drawn)
                )
            )
            gap = np.abs(tempos / file_tempo - 1).max() * 100 if len(tempos) else 0.0
            span = f"{distinct.min():.0f}-{distinct.max():.0f}" if len(distinct) else "-"
            print(
                f"| {song.split('/')[-1]} | {file_tempo:.1f} / {token_tempo:.0f} | {tempo} | {changes} "
                f"| {span} | {gap:.1f}% | {seconds:.0f} |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("songs", nargs="+")
    parser.add_argument("--bars", type=int, default=64)
    parser.add_argument("--samples", type=int, default=2)
    args = parser.parse_args()
    run(args.checkpoint, args.songs, args.bars, args.samples)
