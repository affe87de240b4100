"""Sampling speed of an untrained model: tokens/s, and whether the per-token cost stays flat.

    python -P bench/generate.py [--preset paper-pop] [--tokens 2048] [--device cpu] [--threads N]

(-P keeps bench/ off sys.path: bench/tokenize.py would shadow the standard library's tokenize.)
Runs the real sampler (`musegen.sample.generate`, grammar mask on, batch of 1) for a quarter of
the length and for the whole length. With a recurrent state of constant size, tokens/s is the
same for both; a sampler that re-read the prefix would slow down in proportion to the length.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from musegen.model import MusicPerformer, preset
from musegen.sample import Prompt, SampleSettings, generate
from musegen.tokenizers import tokenizer_from_dict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="paper-pop")
    parser.add_argument("--tokenizer", default="remi")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tok = tokenizer_from_dict({"kind": args.tokenizer})
    model = MusicPerformer(preset(args.preset, vocab_size=tok.vocab_size)).to(args.device).eval()
    empty = Prompt(np.zeros(0, dtype=np.int64))
    rates = {}
    for length in (args.tokens // 4, args.tokens):
        _, stats = generate(model, tok, empty, SampleSettings(length=length, seed=0), device=args.device)
        rates[length] = stats["tokens_per_second"]
        print(f"{args.preset} on {args.device} ({torch.get_num_threads()} threads): {length} tokens "
              f"at {rates[length]:.1f} tokens/s")
    short, full = rates[args.tokens // 4], rates[args.tokens]
    print(f"flatness: tokens/s over {args.tokens} tokens is {full / short:.2f}x that over {args.tokens // 4}")
    if full < 0.8 * short:
        raise SystemExit("per-token cost grows with the length")


if __name__ == "__main__":
    main()
