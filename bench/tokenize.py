"""REMI encoding throughput: musegen vs miditok, single process, chords and tempos on; and the
cost per token of the REMI grammar, which masks every sampled token.

    python bench/tokenize.py [--files 100] [--source ../shared/datasets/pop909]

Both tokenizers read the same MIDI files from disk (parse included) in one run, one after the
other; the ratio is musegen files/s over miditok files/s. The grammar walks the tokens of the
files musegen encoded (`allowed`, then `step`, per token, as the sampler calls them).
"""

from __future__ import annotations

import os
import sys

# Run as a script, this folder heads sys.path and this file's name would shadow the stdlib `tokenize`.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse
import time
from pathlib import Path

from musegen.errors import MusegenError
from musegen.music.midi import find_midi_files
from musegen.tokenizers.remi import RemiTokenizer

DEFAULT_SOURCE = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "pop909"


def throughput(encode, files) -> tuple[float, int]:
    """(files per second, number of files the encoder refused)."""
    refused = 0
    start = time.perf_counter()
    for path in files:
        try:
            encode(path)
        except MusegenError:
            refused += 1
    return len(files) / (time.perf_counter() - start), refused


def grammar_cost(tokenizer, pieces) -> tuple[float, float, int]:
    """(microseconds per token in `allowed`, in `step`, tokens walked)."""
    grammar = tokenizer.grammar()
    allowed = step = 0.0
    tokens = 0
    for ids in pieces:
        state = grammar.start()
        for token in map(int, ids):
            t0 = time.perf_counter()
            grammar.allowed(state)
            t1 = time.perf_counter()
            state = grammar.step(state, token)
            step += time.perf_counter() - t1
            allowed += t1 - t0
        tokens += len(ids)
    return 1e6 * allowed / tokens, 1e6 * step / tokens, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100, help="how many files (first in sorted order)")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="folder of MIDI files")
    args = parser.parse_args()
    files = find_midi_files(args.source)[: args.files]

    from miditok import REMI, TokenizerConfig

    miditok_remi = REMI(TokenizerConfig(use_chords=True, use_tempos=True))
    ours = RemiTokenizer()
    ours_rate, ours_refused = throughput(ours.encode, files)
    theirs_rate, _ = throughput(miditok_remi.encode, files)
    print(f"files: {len(files)} from {args.source}")
    print(f"musegen REMI: {ours_rate:7.1f} files/s ({ours_refused} refused)")
    print(f"miditok REMI: {theirs_rate:7.1f} files/s")
    print(f"ratio musegen/miditok: {ours_rate / theirs_rate:.2f}x")
    pieces = []
    for path in files[:20]:
        try:
            pieces.append(ours.encode(path).ids)
        except MusegenError:
            continue
    allowed_us, step_us, tokens = grammar_cost(ours, pieces)
    print(
        f"REMI grammar per token ({tokens:,} tokens of {len(pieces)} files): allowed {allowed_us:.1f} us, "
        f"step {step_us:.1f} us, together {allowed_us + step_us:.1f} us"
    )


if __name__ == "__main__":
    main()
