"""Training throughput (tokens/s) and peak memory of the `small` preset, in one run:
musegen's default causal-linear kernel vs fast-transformers' kernel vs exact softmax attention,
at sequence lengths 512, 1024 and 2048.

    python -m bench.train [--quick] [--device cpu|cuda] [--batch 2] [--steps 5]

Each measurement runs in a fresh child process, so peak memory is that configuration's own:
CUDA's max allocated bytes on a GPU; on CPU the growth of the process' peak RSS over what it
held before the first training step. Timed steps are full updates (forward, backward, Adam)
after one warm-up update. `--quick` does 2 timed steps at 512 and 1024 only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

VARIANTS = {"default kernel": dict(kernel="torch"), "fast-transformers": dict(kernel="fast-transformers"),
            "softmax": dict(attention="softmax")}


def measure(variant: str, length: int, batch: int, steps: int, device: str) -> dict:
    """One configuration, in this process."""
    import resource

    import torch
    import torch.nn.functional as F

    from musegen.model import MusicPerformer, preset
    from musegen.model.attention import fast_transformers_available

    if variant == "fast-transformers" and not fast_transformers_available():
        return {"skipped": "fast-transformers is not installed"}
    torch.manual_seed(0)
    model = MusicPerformer(preset("small", **VARIANTS[variant])).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size - 1, (batch, length + 1), device=device)
    cuda = device.startswith("cuda")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def update():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    update()  # warm-up: allocator, kernels
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        update()
    if cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / steps
    peak = (torch.cuda.max_memory_allocated() if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before)
    return {"tokens_per_s": batch * length / seconds, "peak_mib": peak / 2**20, "step_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 timed steps at 512 and 1024 only")
    parser.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = 2 if args.quick else args.steps
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.batch, steps, args.device)))
        return

    lengths = (512, 1024) if args.quick else (512, 1024, 2048)
    print(f"small preset, batch {args.batch}, {steps} timed updates, device {args.device}")
    print(f"{'length':>6}  {'variant':<18} {'tokens/s':>10} {'peak MiB':>9} {'vs default':>10}")
    for length in lengths:
        base = None
        for variant in VARIANTS:
            child = subprocess.run([sys.executable, "-m", "bench.train", "--one", variant, str(length), "--batch",
                                    str(args.batch), "--steps", str(args.steps), "--device", args.device]
                                   + (["--quick"] if args.quick else []), capture_output=True, text=True, cwd=REPO)
            if child.returncode != 0:
                print(f"{length:>6}  {variant:<18} failed: {child.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(child.stdout.strip().splitlines()[-1])
            if "skipped" in r:
                print(f"{length:>6}  {variant:<18} skipped: {r['skipped']}")
                continue
            base = base or r["tokens_per_s"]
            print(f"{length:>6}  {variant:<18} {r['tokens_per_s']:>10,.0f} {r['peak_mib']:>9,.0f} "
                  f"{r['tokens_per_s'] / base:>9.2f}x")


if __name__ == "__main__":
    main()
