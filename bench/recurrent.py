"""Per-token generation cost: recurrent `step()` vs re-running the whole prefix per token.

paper-pop shape (24 layers, d_model 512, 8 heads, sineSPE, R = 64, 128 features), random
weights, batch 1, eval mode, no gradients. The session is advanced to each position with the
parallel chunked form (`step(ids[1, T])`), then single-token steps are timed. "prefix" is what
the reference code did: one full forward over all tokens so far for every new token.
    python -m bench.recurrent            # positions 512, 2048, 8192
    python -m bench.recurrent --quick    # positions 512, 2048; prefix re-run timed once
"""

from __future__ import annotations

import argparse

import torch

from bench.common import describe, median_seconds, peak_memory_mib
from musegen.model import MusicPerformer, preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pe", default="sine", choices=["sine", "conv", "ape"])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = MusicPerformer(preset("paper-pop", pe=args.pe)).to(device).eval()
    positions = (512, 2048) if args.quick else (512, 2048, 8192)
    tokens = torch.randint(0, model.config.vocab_size, (1, max(positions) + 64), device=device)
    print(f"# paper-pop ({args.pe}SPE) per-token cost, batch 1, {describe(device)}")
    print(f"{'position':>9} {'step ms':>9} {'step MiB':>9} {'prefix ms':>10} {'prefix MiB':>11} {'speed-up':>9}")
    rows = []
    with torch.no_grad(), model.streaming(1, seed=0):
        for position in positions:
            while model.position < position:  # advance in parallel blocks of up to 512 tokens
                model.step(tokens[:, model.position:min(position, model.position + 512)])
            next_token = tokens[:, position]
            step_s = median_seconds(lambda: model.step(next_token), device, repeats=16)
            step_mib = peak_memory_mib(lambda: model.step(next_token), device)
            prefix = tokens[:, :position + 1]
            prefix_s = median_seconds(lambda: model(prefix), device, repeats=1 if args.quick else 2, warmup=0)
            prefix_mib = peak_memory_mib(lambda: model(prefix), device)
            rows.append((position, step_s))
            print(f"{position:>9} {step_s * 1e3:>9.2f} {step_mib:>9.1f} {prefix_s * 1e3:>10.0f} "
                  f"{prefix_mib:>11.1f} {prefix_s / step_s:>8.0f}x")
    print(f"step latency at {rows[-1][0]} / at {rows[0][0]}: {rows[-1][1] / rows[0][1]:.2f}x")


if __name__ == "__main__":
    main()
