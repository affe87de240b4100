"""Generation cost per token: recurrent `step()`, prefix re-running, and the real sampler.

paper-pop shape (24 layers, d_model 512, 8 heads, sineSPE, R = 64, 128 features), random
weights, batch 1, eval mode, no gradients, all in one run so the ratios share the machine's load.
    python -m bench.generate            # positions 512, 2048, 8192; sampler over 2048 tokens
    python -m bench.generate --quick    # same positions, one timing of each prefix re-run,
                                        # sampler over 512 tokens
(-m from the repository root keeps bench/ off sys.path: bench/tokenize.py would shadow the
standard library's tokenize.)

1. step vs prefix: the session is advanced to each position with the parallel chunked form
   (`step(ids[1, T])`) and its state kept; single-token steps from each kept state are then
   timed in interleaved rounds. "prefix" is what the reference code
   did: one full forward over all tokens so far for every new token; it is timed at 512 and
   2048 only (at 8192 one re-run alone takes minutes on a CPU).
2. sampler: `musegen.sample.generate` (grammar mask, nucleus sampling, REMI) from scratch; the
   time of every model step is recorded, so the per-token rate of the first and the last
   quarter of one run can be compared: flat when the state has constant size.
3. families: the same step latencies for each other attention family (relative, synthesizer,
   aaren; paper-pop shape with APE), next to the performer's: relative and synthesizer read a
   growing key/value cache, aaren a constant-size state.
4. threads (CPU): step latency at 512 with 1 thread vs all cores, alternating; this is why
   the sampler and these benchmarks default to 1 thread (docs/performance.md).
Exits non-zero if a flatness target fails: step latency at the last position over 1.2x that
at the first, or the sampler's last quarter over 1.2x slower than its first.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

import numpy as np
import torch

from bench.common import add_machine_options, apply_machine_options, describe, peak_memory_mib, seconds, timed_peak
from musegen.model import MusicPerformer, preset
from musegen.model.families import FAMILIES
from musegen.sample import Prompt, SampleSettings, generate
from musegen.tokenizers import tokenizer_from_dict

POSITIONS = (512, 2048, 8192)
PREFIX_POSITIONS = (512, 2048)
FLAT = 1.2  # issue 3: latency at 8192 within 1.2x of latency at 512


def step_latencies(model: MusicPerformer, device: torch.device, tokens: torch.Tensor) -> dict[int, tuple]:
    """{position: (median seconds, peak MiB) of one single-token step() there} for POSITIONS."""
    with torch.no_grad(), model.streaming(1, seed=0):
        snapshots = {}
        for position in POSITIONS:
            while model.position < position:  # advance in parallel blocks of up to 512 tokens
                model.step(tokens[:, model.position:min(position, model.position + 512)])
            # step() replaces the session's state list instead of mutating it, so a shallow
            # copy of the session is a snapshot we can step from again and again.
            snapshots[position] = dataclasses.replace(model._session)

        def step_at(position: int) -> None:
            model._session = dataclasses.replace(snapshots[position])
            model.step(tokens[:, position])

        # Rounds over all positions, so a change in the machine's load hits every position alike.
        times = {position: [] for position in POSITIONS}
        for _ in range(16):
            for position in POSITIONS:
                times[position].append(seconds(lambda: step_at(position), device))
        return {position: (statistics.median(times[position]), peak_memory_mib(lambda: step_at(position), device))
                for position in POSITIONS}


def step_vs_prefix(model: MusicPerformer, device: torch.device, prefix_repeats: int) -> list[tuple]:
    tokens = torch.randint(0, model.config.vocab_size, (1, max(POSITIONS) + 64), device=device)
    rows = []
    for position, (step_s, step_mib) in step_latencies(model, device, tokens).items():
        prefix_s = prefix_mib = None
        if position in PREFIX_POSITIONS:
            prefix = tokens[:, :position + 1]
            with torch.no_grad():
                runs = [timed_peak(lambda: model(prefix), device) for _ in range(prefix_repeats)]
            prefix_s = statistics.median(s for s, _ in runs)
            prefix_mib = max(m for _, m in runs)
        rows.append((position, step_s, step_mib, prefix_s, prefix_mib))
    return rows


def family_steps(device: torch.device, vocab_size: int) -> dict[str, dict[int, tuple]]:
    """step_latencies of each attention family at the paper-pop shape with APE (the synthesizer's
    max_len stretched to reach the last position)."""
    tokens = torch.randint(0, vocab_size, (1, max(POSITIONS) + 64), device=device)
    latencies = {}
    for name in FAMILIES:
        torch.manual_seed(0)
        model = MusicPerformer(preset("paper-pop", attention=name, pe="ape", vocab_size=vocab_size,
                                      max_len=max(POSITIONS) + 1)).to(device).eval()
        latencies[name] = step_latencies(model, device, tokens)
    return latencies


def thread_comparison(model: MusicPerformer, device: torch.device, threads: int) -> dict[int, float]:
    """Median step latency at position 512 with 1 thread and with `threads`, in alternating rounds."""
    tokens = torch.randint(0, model.config.vocab_size, (1, 513), device=device)
    before = torch.get_num_threads()
    times: dict[int, list[float]] = {1: [], threads: []}
    with torch.no_grad(), model.streaming(1, seed=0):
        model.step(tokens[:, :512])
        kept = dataclasses.replace(model._session)

        def step() -> None:
            model._session = dataclasses.replace(kept)
            model.step(tokens[:, 512])

        for _ in range(8):
            for n in times:
                torch.set_num_threads(n)
                times[n].append(seconds(step, device))
    torch.set_num_threads(before)
    return {n: statistics.median(t) for n, t in times.items()}


def sampler_rates(model: MusicPerformer, device: torch.device, length: int) -> tuple[float, float, float]:
    """(tokens/s reported by the sampler, s/token over the first quarter, over the last quarter)."""
    tok = tokenizer_from_dict({"kind": "remi"})
    step_times: list[float] = []
    step = model.step

    def timed_step(tokens):  # record every single-token step of the sampling loop
        out = []
        step_times.append(seconds(lambda: out.append(step(tokens)), device))
        return out[0]

    model.step = timed_step
    try:
        _, stats = generate(model, tok, Prompt(np.zeros(0, dtype=np.int64)), SampleSettings(length=length, seed=0),
                            device=device, progress=False, threads=torch.get_num_threads())
    finally:
        del model.step  # back to the class's method
    single = step_times[1:]  # the first call ingests the one-token start
    quarter = len(single) // 4
    return stats["tokens_per_second"], statistics.median(single[:quarter]), statistics.median(single[-quarter:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="prefix re-runs timed once, sampler over 512 tokens")
    parser.add_argument("--pe", default="sine", choices=["sine", "conv", "ape"])
    add_machine_options(parser, "torch CPU threads (default 1, the sampler's default: see docs/performance.md)")
    args = parser.parse_args()
    device = apply_machine_options(args)
    torch.manual_seed(0)
    model = MusicPerformer(preset("paper-pop", pe=args.pe, vocab_size=tokenizer_from_dict({"kind": "remi"}).vocab_size))
    model = model.to(device).eval()

    print(f"# paper-pop ({args.pe}) per-token cost, batch 1, {describe(device)}")
    print(f"{'position':>9} {'step ms':>9} {'step MiB':>9} {'prefix ms':>10} {'prefix MiB':>11} {'prefix/step':>12}")
    rows = step_vs_prefix(model, device, prefix_repeats=1 if args.quick else 3)
    for position, step_s, step_mib, prefix_s, prefix_mib in rows:
        prefix = (f"{prefix_s * 1e3:>10.0f} {prefix_mib:>11.1f} {prefix_s / step_s:>11.0f}x" if prefix_s
                  else f"{'-':>10} {'-':>11} {'-':>12}")
        print(f"{position:>9} {step_s * 1e3:>9.2f} {step_mib:>9.1f} {prefix}")
    latency_ratio = rows[-1][1] / rows[0][1]
    print(f"step latency at {rows[-1][0]} / at {rows[0][0]}: {latency_ratio:.2f}x (target <= {FLAT}x)")

    length = 512 if args.quick else 2048
    rate, first, last = sampler_rates(model, device, length)
    print(f"sampler: {length} tokens at {rate:.1f} tokens/s; per-token step {first * 1e3:.1f} ms over the "
          f"first quarter, {last * 1e3:.1f} ms over the last: {last / first:.2f}x (target <= {FLAT}x)")
    print(f"sampler time per token / bare step() latency at {rows[0][0]}: {1 / (rate * rows[0][1]):.2f}x")

    print(f"# attention families (paper-pop shape, APE): step ms, and / the {args.pe} performer's step above")
    print(f"{'position':>9}" + "".join(f" {name + ' ms':>15} {'MiB':>7} {'/ perf.':>8}" for name in FAMILIES))
    families = family_steps(device, model.config.vocab_size)
    for position, step_s, *_ in rows:
        cells = (families[name][position] for name in FAMILIES)
        print(f"{position:>9}" + "".join(f" {s * 1e3:>15.2f} {mib:>7.1f} {s / step_s:>7.2f}x" for s, mib in cells))

    if device.type == "cpu" and (os.cpu_count() or 1) > 1:
        by_threads = thread_comparison(model, device, os.cpu_count())
        many = max(by_threads)
        print(f"step at 512 with {many} threads: {by_threads[many] * 1e3:.1f} ms, with 1 thread: "
              f"{by_threads[1] * 1e3:.1f} ms ({by_threads[many] / by_threads[1]:.2f}x)")
    if latency_ratio > FLAT or last / first > FLAT:
        raise SystemExit("per-token cost grows with the position")


if __name__ == "__main__":
    main()
