"""Generation cost per token: the step against the memory bound, step vs prefix re-running, the sampler.

paper-pop shape (24 layers, d_model 512, 8 heads, sineSPE, R = 64, 128 features), random
weights, eval mode, no gradients, all in one run so the ratios share the machine's load.
    python -m bench.generate            # positions 512, 2048, 8192; sampler over 2048 tokens
    python -m bench.generate --quick    # prefix re-runs timed once, sampler over 512 tokens
    python -m bench.generate --step-only   # part 1 alone: the step's paths and auto's choices
(-m from the repository root keeps bench/ off sys.path: bench/tokenize.py would shadow the
standard library's tokenize.)

1. step vs bound: single-token `step()` at position 512 on each path (fp32; where the CPU lists
   bf16 arithmetic, bf16 in PyTorch and in step.c), batch 1 and 8, timed in interleaved rounds
   with a memory copy that measures the bandwidth on the spot. A step reads every weight once,
   so weight bytes / bandwidth is the least a step can take: "step/bound" is how far from it.
   "products": the step's matrices alone, applied as the step applies them (packed bf16 on
   CPU), in the same rounds: the part of the step that the matrix kernels set, whatever the
   rest of the step does. Then what "auto" picks at each batch (musegen.precision's own short
   timing, cached per machine) against the fastest path of the table.
2. step vs prefix, in the default precision ("auto"): the session is advanced to each position
   with the parallel `step(ids[1, T])` and snapshotted (`get_state`); single-token steps from
   each snapshot (`set_state`) are timed in interleaved rounds. "prefix" is what the reference
   code did: one full forward over all tokens so far for every new token (fp32), timed at 512
   and 2048 only (at 8192 one re-run alone takes minutes on a CPU).
3. sampler: `musegen.generation.loop.generate` (grammar mask, nucleus sampling, REMI) from scratch in the
   default precision; the time of every model step is recorded, so the per-token rate of the
   first and the last quarter of one run can be compared: flat when the state has constant size.
4. families: the same step latencies for each other attention family (relative, synthesizer,
   aaren; paper-pop shape with APE), next to the performer's: relative and synthesizer read a
   growing key/value cache, aaren a constant-size state.
5. threads (CPU): step latency at 512 with 1 thread vs all cores, alternating; this is why
   the sampler and these benchmarks default to 1 thread (docs/performance.md).
6. suffix cache: the sampler's whole time per token (model step, masks, draw) with the cache at
   0.8 (musegen.generation.cache), and the cache's own part of it, over the first and the last
   quarter of one run (2 samples from the example pop prompt): what the cache adds, and whether
   the step stays flat with it.
7. positions and window: the step at 512 and 8192 (--quick: 512 only) (batch 1, auto's path)
   of the same weights with positions in beats, with an exact window of W tokens (--window,
   default 16), and with both, next to token positions without a window, in interleaved rounds
   and the step state's MiB at each position (run by --step-only too).
Exits non-zero if a flatness target fails: step latency at the last position over 1.2x that
at the first, or the sampler's last quarter over 1.2x slower than its first, without the cache
or with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench.common import (
    CopyBandwidth,
    add_machine_options,
    apply_machine_options,
    describe,
    peak_memory_mib,
    seconds,
    timed_peak,
)
from musegen.device import native_bf16
from musegen.generation.cache import SuffixCache
from musegen.generation.loop import generate
from musegen.generation.precision import step_choice
from musegen.generation.prompt import Prompt, load_prompt
from musegen.generation.settings import SampleSettings
from musegen.model.c_step import step_kernels
from musegen.model.config import preset
from musegen.model.families import FAMILIES
from musegen.model.torch_step import PreparedWeights
from musegen.model.transformer import FP32, STEP_C, MusicPerformer
from musegen.precision import Choice
from musegen.tokenizers import tokenizer_from_dict

POSITIONS = (512, 2048, 8192)
PREFIX_POSITIONS = (512, 2048)
BATCHES = (1, 8)
FLAT = 1.2  # latency at 8192 within 1.2x of latency at 512


def snapshots(model: MusicPerformer, tokens: torch.Tensor, positions, batch: int = 1, path: str = FP32) -> dict:
    """{position: the session's state there}, advancing in parallel blocks of up to 512 tokens."""
    states = {}
    session = model.session(batch, path, seed=0)
    with torch.no_grad():
        for position in positions:
            while session.position < position:
                session.step(tokens[:batch, session.position : min(position, session.position + 512)])
            states[position] = session.get_state()
    return states


def step_seconds(
    model: MusicPerformer,
    device: torch.device,
    state,
    tokens: torch.Tensor,
    steps: int = 3,
    path: str = FP32,
) -> float:
    """Median time of `steps` single-token steps continuing from `state` (its session opened
    and restored untimed)."""
    batch, position = state.batch_size, state.position
    session = model.session(batch, path)
    with torch.no_grad():
        session.set_state(state)
        return statistics.median(
            seconds(lambda t=t: session.step(tokens[:batch, position + t]), device) for t in range(steps)
        )


def weight_bytes(model: MusicPerformer, bf16: bool) -> int:
    """Bytes one step reads: the layers' matrices in the step's precision, the head in fp32."""
    layers = sum(m.weight.numel() for m in model.layers.modules() if isinstance(m, torch.nn.Linear))
    return layers * (2 if bf16 else 4) + model.head.weight.nbytes


def products_fn(model: MusicPerformer, device: torch.device, path: str, batch: int):
    """A closure applying every matrix a step reads (each layer's four, then the head) once to a
    [batch, width] input, as the step of `path` prepares and applies them: what the step would
    cost if it did nothing else."""
    dtype = torch.float32 if path == "fp32" else torch.bfloat16
    *layers, head = PreparedWeights(model).get(dtype, step_kernels(device) if path == STEP_C else None)
    c = model.config
    narrow, wide = (torch.randn(batch, n, device=device) for n in (c.d_model, c.d_ff))  # fp32, as the step's

    def products():
        for weights in layers:
            weights.qkv(narrow), weights.out(narrow), weights.ff_in(narrow), weights.ff_out(wide)
        head(narrow)

    return products


def step_vs_bound(model: MusicPerformer, device: torch.device, paths, tokens, rounds: int) -> tuple[dict, dict, float]:
    """({(path, batch): median step seconds at 512}, {(path, batch): median seconds of the
    step's matrix products alone}, median bandwidth in bytes/s)."""
    states, products = {}, {}
    for path in paths:
        for batch in BATCHES:
            states[(path, batch)] = snapshots(model, tokens, (512,), batch, path)[512]
            products[(path, batch)] = products_fn(model, device, path, batch)
    bandwidth, times, product_times = CopyBandwidth(device), defaultdict(list), defaultdict(list)
    with torch.no_grad():
        for run in products.values():
            run()  # warm-up
    for _ in range(rounds):  # rounds over every case, so a change in load hits all alike
        bandwidth.measure()
        for (path, batch), state in states.items():
            times[(path, batch)].append(step_seconds(model, device, state, tokens, path=path))
            with torch.no_grad():
                product_times[(path, batch)].append(seconds(products[(path, batch)], device))
    median = {key: statistics.median(t) for key, t in times.items()}
    return median, {key: statistics.median(t) for key, t in product_times.items()}, bandwidth.median()


def print_bound_table(model: MusicPerformer, times: dict, products: dict, bandwidth: float) -> None:
    print(
        f"# step() at position 512 vs the memory bound (weight bytes / copy bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s, read + write, measured in the same rounds) and vs its matrix "
        f"products alone"
    )
    print(
        f"{'path':>11} {'batch':>5} {'step ms':>8} {'ms/seq':>7} {'weights MB':>10} {'bound ms':>8} "
        f"{'step/bound':>10} {'products ms':>11} {'prod/bound':>10} {'vs batch 1':>10}"
    )
    for (path, batch), step_s in times.items():
        weights = weight_bytes(model, path != "fp32")
        bound, alone = weights / bandwidth, products[(path, batch)]
        print(
            f"{path:>11} {batch:>5} {step_s * 1e3:>8.2f} {step_s * 1e3 / batch:>7.2f} "
            f"{weights / 1e6:>10.0f} {bound * 1e3:>8.2f} {step_s / bound:>9.2f}x "
            f"{alone * 1e3:>11.2f} {alone / bound:>9.2f}x {step_s / times[(path, 1)]:>9.2f}x"
        )


def print_auto_choices(model: MusicPerformer, times: dict) -> Choice:
    """What "auto" picks at each batch (musegen.precision's short timing) against the table's
    timings; returns batch 1's choice."""
    choices = {batch: step_choice("auto", model, batch) for batch in BATCHES}
    for batch, choice in choices.items():
        fixed = {path: t for (path, b), t in times.items() if b == batch}
        fastest = min(fixed, key=fixed.get)
        print(
            f"auto at batch {batch}: {choice}; its step {fixed[choice.path] / fixed[fastest]:.2f}x the fastest "
            f"path's ({fastest}; target <= 1.05x), {fixed['fp32'] / fixed[choice.path]:.2f}x faster than fp32"
        )
    one, eight = choices[1].path, choices[max(BATCHES)].path
    print(f"auto: batch {max(BATCHES)} / batch 1 {times[(eight, max(BATCHES))] / times[(one, 1)]:.2f}x (target <= 2x)")
    return choices[1]


def step_latencies(model: MusicPerformer, device: torch.device, tokens: torch.Tensor, path: str) -> dict[int, tuple]:
    """{position: (median seconds, peak MiB) of one single-token step on `path` there} for POSITIONS."""
    states = snapshots(model, tokens, POSITIONS, path=path)
    times = {position: [] for position in POSITIONS}
    for _ in range(8):
        for position, state in states.items():
            times[position].append(step_seconds(model, device, state, tokens, steps=2, path=path))

    def one_step(state):
        session = model.session(1, path)
        with torch.no_grad():
            session.set_state(state)
            return peak_memory_mib(lambda: session.step(tokens[:1, state.position]), device)

    return {position: (statistics.median(times[position]), one_step(states[position])) for position in POSITIONS}


def step_vs_prefix(model: MusicPerformer, device: torch.device, tokens, path: str, prefix_repeats: int) -> list[tuple]:
    rows = []
    for position, (step_s, step_mib) in step_latencies(model, device, tokens, path).items():
        prefix_s = prefix_mib = None
        if position in PREFIX_POSITIONS:
            prefix = tokens[:1, : position + 1]
            with torch.no_grad():
                runs = [timed_peak(lambda: model(prefix), device) for _ in range(prefix_repeats)]
            prefix_s = statistics.median(s for s, _ in runs)
            prefix_mib = max(m for _, m in runs)
        rows.append((position, step_s, step_mib, prefix_s, prefix_mib))
    return rows


def family_steps(device: torch.device, vocab_size: int, tokens: torch.Tensor) -> dict[str, dict[int, tuple]]:
    """step_latencies of each attention family at the paper-pop shape with APE (the synthesizer's
    max_len stretched to reach the last position), in the default precision."""
    latencies = {}
    for name in FAMILIES:
        torch.manual_seed(0)
        model = (
            MusicPerformer(
                preset("paper-pop", attention=name, pe="ape", vocab_size=vocab_size, max_len=max(POSITIONS) + 8)
            )
            .to(device)
            .eval()
        )
        latencies[name] = step_latencies(model, device, tokens, step_choice("auto", model, 1).path)
    return latencies


def variant_steps(
    model: MusicPerformer, device: torch.device, tokens, path: str, window: int, rounds: int, positions
) -> dict:
    """{(variant, position): (median single-token step seconds, the step's state bytes)} at
    `positions`, batch 1, on `path`, for `model`'s weights with token positions, beats, a window,
    and both; the sessions are advanced in parallel blocks and the steps timed in interleaved rounds."""
    variants = {
        "tokens": {},
        "beats": dict(positions="beats"),
        f"window {window}": dict(window=window),
        f"beats + window {window}": dict(positions="beats", window=window),
    }
    onsets = torch.arange(tokens.shape[1], device=device, dtype=torch.float64)[None] / 4  # one token a 16th
    sessions = {}
    for name, overrides in variants.items():
        variant = MusicPerformer(dataclasses.replace(model.config, **overrides)).to(device).eval()
        variant.load_state_dict(model.state_dict())
        beats = onsets if variant.config.positions == "beats" else None
        for position in positions:
            session = variant.session(1, path, seed=0)
            with torch.no_grad():
                while session.position < position:
                    a, b = session.position, min(position, session.position + 512)
                    session.step(tokens[:1, a:b], None if beats is None else beats[:, a:b])
            sessions[(name, position)] = (session, beats)
    times = defaultdict(list)
    for _ in range(rounds):
        for key, (session, beats) in sessions.items():
            t = session.position
            at = None if beats is None else beats[0, t : t + 1]
            times[key].append(seconds(lambda: session.step(tokens[:1, t], at), device))
    return {key: (statistics.median(values), sessions[key][0].state_bytes) for key, values in times.items()}


def print_variant_table(steps: dict, path: str) -> None:
    positions = list(dict.fromkeys(position for _, position in steps))
    first, last = positions[0], positions[-1]
    print(f"# positions and window ({path}, batch 1): step ms and / token positions without a window; state MiB")
    print(
        f"{'variant':>24}"
        + "".join(f" {f'{p} ms':>9} {'/ tokens':>9}" for p in positions)
        + "".join(f" {f'MiB {p}':>9}" for p in positions)
        + (f" {f'{last}/{first}':>10}" if last != first else "")
    )
    for name in dict.fromkeys(name for name, _ in steps):
        cells = ((steps[(name, p)][0], steps[(name, p)][0] / steps[("tokens", p)][0]) for p in positions)
        memory = [steps[(name, p)][1] / 2**20 for p in positions]
        print(
            f"{name:>24}"
            + "".join(f" {s * 1e3:>9.2f} {ratio:>8.2f}x" for s, ratio in cells)
            + "".join(f" {mib:>9.2f}" for mib in memory)
            + (f" {memory[-1] / memory[0]:>9.2f}x" if last != first else "")
        )


def thread_comparison(model: MusicPerformer, device: torch.device, threads: int, tokens, path: str) -> dict[int, float]:
    """Median step latency on `path` at position 512 with 1 thread and with `threads`, in alternating rounds."""
    state = snapshots(model, tokens, (512,), path=path)[512]
    before = torch.get_num_threads()
    times: dict[int, list[float]] = {1: [], threads: []}
    for _ in range(8):
        for n in times:
            torch.set_num_threads(n)
            times[n].append(step_seconds(model, device, state, tokens, steps=2, path=path))
    torch.set_num_threads(before)
    return {n: statistics.median(t) for n, t in times.items()}


def sampler_rates(model: MusicPerformer, device: torch.device, length: int) -> tuple[float, float, float]:
    """(tokens/s reported by the sampler, s/token over the first quarter, over the last quarter)."""
    tok = tokenizer_from_dict({"kind": "remi"})
    step_times: list[float] = []
    open_session = model.session

    def timed_session(*args, **kwargs):  # its steps, every one of the sampling loop's, are timed
        session = open_session(*args, **kwargs)
        step = session.step

        def timed_step(tokens):
            out = []
            step_times.append(seconds(lambda: out.append(step(tokens)), device))
            return out[0]

        session.step = timed_step
        return session

    model.session = timed_session
    try:
        _, stats = generate(
            model,
            tok,
            Prompt(np.zeros(0, dtype=np.int64)),
            SampleSettings(length=length, seed=0),
            device=device,
            progress=False,
            threads=torch.get_num_threads(),
        )
    finally:
        del model.session  # back to the class's method
    single = step_times[1:]  # the first call ingests the one-token start
    quarter = len(single) // 4
    return stats["tokens_per_second"], statistics.median(single[:quarter]), statistics.median(single[-quarter:])


@dataclass(frozen=True)
class TimedCache(SuffixCache):
    """The suffix cache, recording the seconds of each of its steps."""

    seconds: list = field(default_factory=list, compare=False)

    def reweight(self, run, rows, logits, allowed):
        started = time.perf_counter()
        out = super().reweight(run, rows, logits, allowed)
        self.seconds.append(time.perf_counter() - started)
        return out


def cache_cost(model: MusicPerformer, device: torch.device, length: int, weight: float = 0.8) -> dict[str, tuple]:
    """Median seconds of one sampling step (all of it: model, constraints, draw) and of the suffix
    cache's part of it, over the first and the last quarter of `length` tokens continuing the
    example pop prompt, 2 samples, the cache at `weight`."""
    tok = tokenizer_from_dict({"kind": "remi"})
    prompt = load_prompt(tok, Path(__file__).resolve().parents[1] / "checkpoints" / "prompts" / "pop_progression.mid")
    cache, stamps = TimedCache(weight), []
    generate(
        model,
        tok,
        prompt,
        SampleSettings(length=length, num_samples=2, seed=0, cache=0.0, constraints=(cache,)),
        device=device,
        progress=False,
        threads=torch.get_num_threads(),
        on_step=lambda _: stamps.append(time.perf_counter()),
    )
    quarters = {"step": np.diff(stamps), "cache": np.array(cache.seconds[1:])}  # (the first step follows the prompt)
    return {name: (np.median(x[: len(x) // 4]), np.median(x[-(len(x) // 4) :])) for name, x in quarters.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="prefix re-runs timed once, sampler over 512 tokens")
    parser.add_argument("--pe", default="sine", choices=["sine", "conv", "ape"])
    parser.add_argument("--step-only", action="store_true", help="the step tables and auto's choices only (parts 1, 7)")
    parser.add_argument("--window", type=int, default=16, help="the exact window of part 7 (tokens)")
    add_machine_options(parser, "torch CPU threads (default 1, the sampler's default: see docs/performance.md)")
    args = parser.parse_args()
    device = apply_machine_options(args)
    torch.manual_seed(0)
    model = MusicPerformer(preset("paper-pop", pe=args.pe, vocab_size=tokenizer_from_dict({"kind": "remi"}).vocab_size))
    model = model.to(device).eval()
    tokens = torch.randint(0, model.config.vocab_size, (max(BATCHES), max(POSITIONS) + 64), device=device)
    paths = ["fp32"] + (["bf16"] if native_bf16(device) else []) + ([STEP_C] if step_kernels(device) else [])
    print(f"# paper-pop ({args.pe}), {describe(device)}; step paths: {', '.join(paths)}")

    times, products, bandwidth = step_vs_bound(model, device, paths, tokens, rounds=7 if args.quick else 15)
    print_bound_table(model, times, products, bandwidth)
    default = print_auto_choices(model, times).path
    bare = times[(default, 1)]
    variant_positions = (512,) if args.quick else (512, max(POSITIONS))
    rounds = 7 if args.quick else 15
    print_variant_table(variant_steps(model, device, tokens, default, args.window, rounds, variant_positions), default)
    if args.step_only:
        return

    print(f"# per-token cost by position ({default}, batch 1): step, and re-running the prefix (fp32)")
    print(f"{'position':>9} {'step ms':>9} {'step MiB':>9} {'prefix ms':>10} {'prefix MiB':>11} {'prefix/step':>12}")
    rows = step_vs_prefix(model, device, tokens, default, prefix_repeats=1 if args.quick else 3)
    for position, step_s, step_mib, prefix_s, prefix_mib in rows:
        prefix = (
            f"{prefix_s * 1e3:>10.0f} {prefix_mib:>11.1f} {prefix_s / step_s:>11.0f}x"
            if prefix_s
            else f"{'-':>10} {'-':>11} {'-':>12}"
        )
        print(f"{position:>9} {step_s * 1e3:>9.2f} {step_mib:>9.1f} {prefix}")
    latency_ratio = rows[-1][1] / rows[0][1]
    print(f"step latency at {rows[-1][0]} / at {rows[0][0]}: {latency_ratio:.2f}x (target <= {FLAT}x)")

    length = 512 if args.quick else 2048
    rate, first, last = sampler_rates(model, device, length)
    print(
        f"sampler ({default}): {length} tokens at {rate:.1f} tokens/s; per-token step {first * 1e3:.2f} ms over "
        f"the first quarter, {last * 1e3:.2f} ms over the last: {last / first:.2f}x (target <= {FLAT}x)"
    )
    print(f"sampler time per token / bare step() at 512 (table above): {1 / (rate * bare):.2f}x")

    print(f"# attention families (paper-pop shape, APE, {default}): step ms, and / the {args.pe} performer's step")
    print(f"{'position':>9}" + "".join(f" {name + ' ms':>15} {'MiB':>7} {'/ perf.':>8}" for name in FAMILIES))
    families = family_steps(device, model.config.vocab_size, tokens)
    for position, step_s, *_ in rows:
        cells = (families[name][position] for name in FAMILIES)
        print(f"{position:>9}" + "".join(f" {s * 1e3:>15.2f} {mib:>7.1f} {s / step_s:>7.2f}x" for s, mib in cells))

    if device.type == "cpu" and (os.cpu_count() or 1) > 1:
        by_threads = thread_comparison(model, device, os.cpu_count(), tokens, default)
        many = max(by_threads)
        print(
            f"step at 512 with {many} threads: {by_threads[many] * 1e3:.2f} ms, with 1 thread: "
            f"{by_threads[1] * 1e3:.2f} ms ({by_threads[many] / by_threads[1]:.2f}x)"
        )
    print(f"# suffix cache at 0.8 ({default}, 2 samples, {length} tokens after the pop prompt): ms per sampling step")
    cost = cache_cost(model, device, length)
    (step_first, step_last), (cache_first, cache_last) = cost["step"], cost["cache"]
    print(
        f"whole step: first quarter {step_first * 1e3:.2f}, last {step_last * 1e3:.2f} ({step_last / step_first:.2f}x)"
    )
    print(
        f"the cache's part: first quarter {cache_first * 1e3:.3f} ({cache_first / step_first:.1%} of the step), "
        f"last {cache_last * 1e3:.3f} ({cache_last / step_last:.1%})"
    )
    if latency_ratio > FLAT or last / first > FLAT or step_last / step_first > FLAT:
        raise SystemExit("per-token cost grows with the position")


if __name__ == "__main__":
    main()
