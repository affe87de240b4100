"""Training throughput (tokens/s) and peak memory of the `small` preset: fp32, bf16 and the default
precision ("auto": the faster of the two as musegen.precision timed it on this machine and shape),
side by side in one run, with fast-transformers' kernel and exact softmax attention as further rows.

    python -m bench.train [--quick] [--device cpu|cuda] [--threads 2] [--batch 8] [--steps 7]
                          [--lengths 512 2048] [--variants fp32 bf16 default]
    python -m bench.train --curves [--curve-steps 500]   # loss curves: fp32 vs the default

Throughput: every variant is built in this process and timed in interleaved rounds of full
updates (forward, backward, Adam; dropout on; the trainer's loss and optimiser), after two
warm-up updates, so a change in the machine's load hits every variant alike; the median update
is reported. The header names the CPU; each length's last line compares the default with the
faster fixed precision (target: within 5%) and with fp32. Peak memory is one update's growth of
the resident set (bench/common.py) or CUDA's max allocated bytes.
`--quick`: 3 rounds at lengths 512 and 1024 only.

Loss curves (`--curves`): `musegen train` on real POP909 shards (prepared from the repository's
tests/data/pop909, or --source) for --curve-steps updates, three runs: fp32 seed 0, the
default precision seed 0 (same initial weights and batches) and fp32 seed 1 (the seed-to-seed
noise). It prints the curves every 50 steps, smoothed over 50 steps, and the mean absolute gap
default - fp32 against the gap seed 1 - seed 0 (target: within it).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import add_machine_options, apply_machine_options, describe, peak_memory_mib, seconds
from musegen.evaluation.compare import read_jsonl
from musegen.model.attention import fast_transformers_available
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.training.precision import training_choice, training_update
from musegen.training.run_folder import LOG_RECORD

REPO = Path(__file__).resolve().parents[1]
# name: (model overrides, precision)
VARIANTS = {
    "fp32": (dict(kernel="torch"), "fp32"),
    "bf16": (dict(kernel="torch"), "bf16"),
    "default": (dict(kernel="torch"), "auto"),
    "fast-transformers": (dict(kernel="fast-transformers"), "fp32"),
    "softmax": (dict(attention="softmax"), "auto"),
}
TARGET = 2.5  # default over fp32, tokens/s, where bf16 arithmetic is fast


def update_fn(variant: str, length: int, batch: int, device: torch.device):
    """(a closure running one full training update of `variant` at `length`, its precision's Choice)."""
    overrides, precision = VARIANTS[variant]
    config = preset("small", **overrides)
    choice = training_choice(precision, config, batch, length, device)
    torch.manual_seed(0)
    model = MusicPerformer(config).to(device).train()
    ids = torch.randint(0, model.config.vocab_size - 1, (batch, length + 1), device=device)
    return training_update(model, ids, choice.bf16), choice


def throughput(args, device: torch.device) -> None:
    lengths = (512, 1024) if args.quick else args.lengths
    rounds = 3 if args.quick else args.steps
    names = [v for v in args.variants if v != "fast-transformers" or fast_transformers_available()]
    print(f"# small preset, batch {args.batch}, {describe(device)}; median of {rounds} interleaved updates")
    print(f"{'length':>6}  {'variant':<18} {'precision':>9} {'tokens/s':>10} {'peak MiB':>9} {'vs fp32':>8}")
    for length in lengths:
        built = {name: update_fn(name, length, args.batch, device) for name in names}
        for update, _ in built.values():
            update(), update()  # warm-up: allocator, kernels
        times = {name: [] for name in names}
        for _ in range(rounds):
            for name, (update, _) in built.items():
                times[name].append(seconds(update, device))
        rates = {name: args.batch * length / statistics.median(t) for name, t in times.items()}
        for name, (update, choice) in built.items():
            print(
                f"{length:>6}  {name:<18} {choice.path:>9} {rates[name]:>10,.0f} "
                f"{peak_memory_mib(update, device):>9,.0f} {rates[name] / rates['fp32']:>7.2f}x"
            )
        default = built["default"][1]
        print(
            f"{'':>6}  default at {length}: {default}; {rates['default'] / max(rates['fp32'], rates['bf16']):.2f}x "
            f"the faster fixed precision (target >= 0.95x), {rates['default'] / rates['fp32']:.2f}x fp32 "
            f"(target >= {TARGET}x where bf16 arithmetic is fast)"
        )
        del built


def run_training(data: Path, out: Path, precision: str, seed: int, args) -> list[float]:
    """`musegen train` with these settings; the logged loss of every step."""
    settings = {
        "precision": precision,
        "seed": seed,
        "steps": args.curve_steps,
        "seq_len": args.curve_len,
        "batch_size": 4,
        "log_every": 1,
        "valid_every": 0,
        "ckpt_every": args.curve_steps,
        "workers": 0,
    }
    command = [
        sys.executable,
        "-m",
        "musegen",
        "train",
        "--data",
        str(data),
        "--out",
        str(out),
        "--preset",
        "small",
        "--device",
        args.device,
    ] + [x for key, value in settings.items() for x in ("--set", f"{key}={value}")]
    subprocess.run(command, check=True, cwd=REPO, capture_output=True)
    rows = read_jsonl(out / "log.jsonl", LOG_RECORD)
    return [row["loss"] for row in rows if "loss" in row]


def smoothed(curve: list[float], window: int = 50) -> list[float]:
    return [statistics.fmean(curve[max(0, i - window + 1) : i + 1]) for i in range(len(curve))]


def curves(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "shards"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "musegen",
                "data",
                "prepare",
                "pop909",
                "--source",
                str(args.source),
                "--out",
                str(data),
            ],
            check=True,
            cwd=REPO,
            capture_output=True,
        )
        runs = {
            name: smoothed(run_training(data, Path(tmp) / name.replace(" ", "-"), precision, seed, args))
            for name, precision, seed in (
                ("fp32 seed 0", "fp32", 0),
                ("default seed 0", "auto", 0),
                ("fp32 seed 1", "fp32", 1),
            )
        }
    device = torch.device(args.device if args.device != "auto" else "cpu")
    default = training_choice("auto", preset("small"), 4, args.curve_len, device)
    print(
        f"# small preset on POP909 ({args.source}), seq_len {args.curve_len}, batch 4, {args.curve_steps} updates;"
        f" {describe(device)}; default precision here: {default}; training loss smoothed over 50 steps"
    )
    print(f"{'step':>6}" + "".join(f" {name:>15}" for name in runs))
    for i in range(49, args.curve_steps, 50):
        print(f"{i + 1:>6}" + "".join(f" {curve[i]:>15.4f}" for curve in runs.values()))
    base = runs["fp32 seed 0"]

    def gap(other):
        return statistics.fmean(abs(a - b) for a, b in zip(other[49:], base[49:]))

    precision_gap, seed_gap = gap(runs["default seed 0"]), gap(runs["fp32 seed 1"])
    print(
        f"mean |default - fp32| {precision_gap:.4f}; seed-to-seed mean |seed 1 - seed 0| {seed_gap:.4f}: "
        f"{'within' if precision_gap <= seed_gap else 'NOT within'} the noise"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds at 512 and 1024 only")
    parser.add_argument("--batch", type=int, default=8, help="sequences an update (8: as the shipped models trained)")
    parser.add_argument("--steps", type=int, default=7, help="timed rounds")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048], help="sequence lengths")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        choices=list(VARIANTS),
        help="rows to time (fp32, bf16 and default always)",
    )
    parser.add_argument("--curves", action="store_true", help="loss curves: fp32 vs the default precision")
    parser.add_argument("--curve-steps", type=int, default=500)
    parser.add_argument("--curve-len", type=int, default=512)
    parser.add_argument("--source", type=Path, default=REPO / "tests" / "data" / "pop909")
    add_machine_options(parser, "torch CPU threads (default 2)")
    parser.set_defaults(threads=2)
    args = parser.parse_args()
    args.variants = ["fp32", "bf16", "default"] + [v for v in args.variants if v not in ("fp32", "bf16", "default")]
    device = apply_machine_options(args)
    if args.curves:
        curves(args)
    else:
        throughput(args, device)


if __name__ == "__main__":
    main()
