"""Causal attention forward+backward: musegen's chunked kernel vs fast-transformers vs SDPA.

B = 1, 8 heads, 128 random features (FAVOR+ widths), head width 64, fp32. The other attention
families (musegen/model/families.py: relative, synthesizer "dense" with max_len = N, aaren) are
rows of the same table; relative and synthesizer hold N x N tensors, so on a CPU they stop at
N = 2048.
    python -m bench.attention            # N = 512, 2048, 8192 (run from the repository root)
    python -m bench.attention --quick    # N = 512, 2048, fewer repeats
Ratios are measured in the same run, timing the methods in interleaved rounds (median per
method), so changes in machine load affect all columns alike.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.nn import functional as F

from bench.common import add_machine_options, apply_machine_options, describe, peak_memory_mib, seconds
from musegen.model.attention import causal_linear_attention, fast_transformers_available
from musegen.model.config import preset
from musegen.model.families import FAMILIES

HEADS, FEATURES, WIDTH = 8, 128, 64
QUADRATIC = {"relative", "synthesizer"}  # N x N logits: too much memory at 8192 on a CPU


def family_case(name: str, n: int, device: torch.device):
    """A closure running one forward+backward of the attention family `name` at length n."""
    config = preset("tiny", d_model=HEADS * WIDTH, n_heads=HEADS, attention=name, pe="none", max_len=n)
    family = FAMILIES[name](config).to(device)
    g = torch.Generator(device=device).manual_seed(0)
    inputs = [
        torch.randn(1, HEADS, n, WIDTH, generator=g, device=device).requires_grad_() if part in family.inputs else None
        for part in "qkv"
    ]

    def run():
        out, _ = family(*inputs, None)
        out.sum().backward()
        for x in inputs:
            if x is not None:
                x.grad = None

    return run


def make_case(method: str, n: int, device: torch.device):
    """A closure running one forward+backward of `method` at length n."""
    g = torch.Generator(device=device).manual_seed(0)
    feature_width = WIDTH if method == "sdpa" else FEATURES
    # Positive inputs stand in for phi(q), phi(k); SDPA gets raw q, k of the head width.
    q = torch.rand(1, HEADS, n, feature_width, generator=g, device=device).requires_grad_()
    k = torch.rand(1, HEADS, n, feature_width, generator=g, device=device).requires_grad_()
    v = torch.randn(1, HEADS, n, WIDTH, generator=g, device=device).requires_grad_()

    def run():
        if method == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out, _ = causal_linear_attention(q, k, v, kernel=method)
        out.sum().backward()
        q.grad = k.grad = v.grad = None

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 512, 2048 only, fewer repeats")
    add_machine_options(parser, "torch CPU threads (default 1: steadier on a shared machine)")
    args = parser.parse_args()
    device = apply_machine_options(args)
    lengths = (512, 2048) if args.quick else (512, 2048, 8192)
    repeats = 5 if args.quick else 9
    methods = ["torch"] + (["fast-transformers"] if fast_transformers_available() else []) + ["sdpa"] + list(FAMILIES)
    print(f"# causal attention fwd+bwd, B=1 H={HEADS} M={FEATURES} D={WIDTH}, {describe(device)}")
    print(f"{'N':>6} {'method':>18} {'time ms':>10} {'peak MiB':>10} {'time vs torch':>14}")
    for n in lengths:
        runs = {
            method: family_case(method, n, device) if method in FAMILIES else make_case(method, n, device)
            for method in methods
            if not (method in QUADRATIC and n > 2048 and device.type == "cpu")
        }
        slow = {"sdpa"} if n > 2048 and device.type == "cpu" else set()  # quadratic: one timing is enough
        times = {method: [] for method in runs}
        for run in runs.values():  # warm-up
            run()
        # Rounds over all methods, so a change in the machine's load hits every method alike.
        for round_ in range(repeats):
            for method, run in runs.items():
                if round_ == 0 or method not in slow:
                    times[method].append(seconds(run, device))
        results = {method: (statistics.median(times[method]), peak_memory_mib(runs[method], device)) for method in runs}
        for method, (secs, mib) in results.items():
            ratio = secs / results["torch"][0]
            print(f"{n:>6} {method:>18} {secs * 1e3:>10.1f} {mib:>10.1f} {ratio:>13.2f}x")
        if "fast-transformers" in results:
            print(
                f"{'':>6} musegen is {results['fast-transformers'][0] / results['torch'][0]:.2f}x faster "
                f"than fast-transformers at N={n}"
            )


if __name__ == "__main__":
    main()
