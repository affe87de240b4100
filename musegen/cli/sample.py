"""`musegen sample`: continue a MIDI prompt (`musegen render` lives in cli/render.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..generation.settings import SampleSettings
from .options import sampling_options


@sampling_options()
def sample(
    checkpoint: Path = typer.Option(
        ...,
        "--checkpoint",
        "-c",
        help="Checkpoint folder (model, config, tokenizer), or the name of a shipped model, e.g. pop or groove "
        "(looked for in $MUSEGEN_HOME/checkpoints when set, else in the clone or the installed copy).",
    ),
    out: Path = typer.Option(
        ...,
        "--out",
        "-o",
        help="Folder for the outputs: each prompt's in a folder of its own, OUT/<prompt name>/ "
        "(MIDI, WAV/PNG, the settings JSON).",
    ),
    prompt: Optional[Path] = typer.Option(
        None,
        help="MIDI file to continue, a MIREX 2025 task .json prompt (the "
        "continuation is also written as that task's JSON), or a "
        "folder: each such file under it (default: from scratch). A bare name that is no file here "
        "names a shipped example prompt, e.g. pop_progression.",
    ),
    audio: bool = typer.Option(False, "--audio", help="Also render each sample to WAV with FluidSynth."),
    pianoroll: bool = typer.Option(False, "--pianoroll", help="Also draw each sample as a piano-roll PNG."),
    device: str = typer.Option("auto", help="auto (CUDA when present), cpu, cuda or cuda:N."),
    threads: Optional[int] = typer.Option(
        None, help="CPU threads while sampling, 1..256 (default 1: small per-token work runs faster on one thread)."
    ),
    settings: Optional[SampleSettings] = None,  # made by @sampling_options from the flags
):
    """Continue a MIDI prompt (or start from scratch) with a trained checkpoint."""
    from musegen import home
    from musegen.generation.batch import sample_to_folder
    from musegen.music.tracker import describe

    prompt = home.prompt(prompt) if prompt is not None else None
    summary = sample_to_folder(
        checkpoint, out, settings, prompt, audio=audio, pianoroll=pianoroll, device=device, threads=threads
    )
    if "continued" in summary:
        skipped = summary["skipped"]
        typer.echo(
            "".join(
                f"{name}: written as {summary['sets'][name]}/ (its own name was taken)\n" for name in summary["renamed"]
            ),
            nl=False,
        )
        typer.echo(
            f"{summary['continued']} prompts continued, {len(skipped)} skipped"
            + "".join(f"\n  skipped {name}: {why}" for name, why in list(skipped.items())[:10])
            + (f"\n  ... and {len(skipped) - 10} more (see batch.json)" if len(skipped) > 10 else "")
        )
    elif prompt is not None:
        report = {k: v for k, v in summary["prompt_report"].items() if k not in ("meta", "grid")}
        typer.echo(f"prompt: {summary['prompt_tokens']} tokens" + "".join(f", {k} {v}" for k, v in report.items()))
        if "grid" in summary["prompt_report"]:
            typer.echo(describe(summary["prompt_report"]["grid"]))
    used, stats = summary["settings"], summary["stats"]
    typer.echo(run_line(len(summary["samples"]), stats, used))
    if stats["repeats"]:
        typer.echo(repeats_hint(stats["repeats"], len(summary["samples"]), used))
    if stats["invalid"]:
        dropped = [r["dropped_tokens"] for r in summary["samples"] if "dropped_tokens" in r]
        typer.echo(
            f"invalid samples: {stats['invalid']} of {len(summary['samples'])} "
            f"({stats['grammar_violations']} break the grammar, {stats['unfinished']} not closed); "
            f"decoded leniently, skipping {sum(dropped)} unplayable tokens"
        )
    else:
        typer.echo("invalid samples: 0")
    if "continued" in summary:
        first = out / next(iter(summary["sets"].values()))
        typer.echo(f"written to {out}/, a folder per prompt ({first}/, ...); summary {summary['file']}")
    else:
        typer.echo(f"written to {summary['folder']}/")


def run_line(samples: int, stats: dict, used: dict) -> str:
    """What the run drew, how fast, and with which settings, in one line."""
    return (
        f"{samples} samples, {stats['new_tokens']} tokens in {stats['seconds']} s "
        f"({stats['tokens_per_second']} tokens/s{reading_share(stats)}); "
        f"T={used['temperature']} by {used['temperature_by']} "
        f"top-p={used['top_p']} top-k={used['top_k']} seed={used['seed']}"
        + (f" cache={used['cache']}" if used["cache"] else "")
    )


def reading_share(stats: dict) -> str:
    """The time spent reading the prompt, where it is a second or more: a long file's prompt can
    take most of the run, which the tokens per second alone would blame on the drawing."""
    reading = stats.get("prompt_seconds", 0)
    return f", {reading:.1f} s of it reading the prompt" if reading >= 1 else ""


def repeats_hint(repeats: int, samples: int, used: dict) -> str:
    """What a user asking for several takes of one prompt reads when some came out the same."""
    if used["cache"]:
        how = (
            f"the suffix cache (weight {used['cache']}) proposes one token where the piece repeats, and the "
            f"nucleus (top-p {used['top_p']}) keeps it alone; --top-p 1 draws the model's share too and gives "
            "different takes, which may keep less of the prompt (docs/sampling.md)"
        )
    else:
        how = "the model left no choice; a higher --temperature or --top-p gives different takes"
    return f"{repeats} of {samples} samples repeat an earlier one of the same prompt note for note: {how}"


def register(app: typer.Typer) -> None:
    app.command("sample")(sample)
