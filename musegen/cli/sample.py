"""`musegen sample`: continue a MIDI prompt (`musegen render` lives in cli/render.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

# Shared with `musegen evaluate continuation`, which samples the same way.
TEMPERATURE = typer.Option(
    None, help="Within [0.001, 100]. Default: the tokenizer's (REMI 1.2, groove 0.6, as in the paper)."
)
TEMPERATURE_BY = typer.Option(
    None,
    help="token: the temperature divides every logit (the paper's sampling); family: it shapes "
    "the choice within each token family (one track's notes, the time shifts) and leaves each "
    "family's share as the model gives it. Default: token.",
)
TOP_P = typer.Option(None, help="Nucleus mass within [1e-06, 1]. Default: REMI 0.9, groove 1.0.")
TOP_K = typer.Option(0, help="Keep only the k most likely tokens (0: off).")
KEEP_NOTE_OFFS = typer.Option(
    True,
    "--keep-note-offs/--plain-mask",
    help="Where notes end by a token of their own (groove), the grammar mask keeps the "
    "model's share of note-offs, moved onto the sounding notes; --plain-mask "
    "renormalises over all allowed tokens, as the paper does.",
)
MONO_BASS = typer.Option(
    True,
    "--mono-bass/--poly-bass",
    help="Groove: a bass note still sounding when a later bass note begins ends at the "
    "next event (2% of the MMA corpus's bass notes sound past the next bass onset); "
    "--poly-bass writes the bass as drawn.",
)

CACHE = typer.Option(
    None,
    help="Weight within [0, 1] of the suffix cache, mixed with the model before the temperature: "
    "it proposes what followed the piece's last tokens where they occurred before, so a groove "
    "keeps repeating what it played (docs/sampling.md). Default: the tokenizer's (groove-dur 0.8; "
    "REMI and groove 0, off).",
)


def drawing(temperature, temperature_by, top_p, top_k, keep_note_offs, mono_bass, cache) -> dict:
    """The drawing options that `sample` and `evaluate continuation` share, as SampleSettings fields."""
    return dict(
        temperature=temperature,
        temperature_by=temperature_by,
        top_p=top_p,
        top_k=top_k,
        keep_note_offs=keep_note_offs,
        mono_bass=mono_bass,
        cache=cache,
    )


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
    prompt_bars: Optional[int] = typer.Option(
        None, help="Keep only the prompt's first N whole bars, 1..10,000 (groove protocol: 2)."
    ),
    length: Optional[int] = typer.Option(None, help="Tokens to generate after the prompt, 1..10,240,000."),
    bars: Optional[int] = typer.Option(None, help="Or: bars to generate after the prompt, 1..10,000."),
    temperature: Optional[float] = TEMPERATURE,
    temperature_by: Optional[str] = TEMPERATURE_BY,
    top_p: Optional[float] = TOP_P,
    top_k: int = TOP_K,
    num_samples: int = typer.Option(
        1,
        "--num-samples",
        "-n",
        help="Samples generated together in one batch (at least 1, as many as the memory holds).",
    ),
    seed: Optional[int] = typer.Option(
        None, help="Random seed within 0..2**63-1 (default: drawn and recorded in the JSON)."
    ),
    audio: bool = typer.Option(False, "--audio", help="Also render each sample to WAV with FluidSynth."),
    pianoroll: bool = typer.Option(False, "--pianoroll", help="Also draw each sample as a piano-roll PNG."),
    no_grammar: bool = typer.Option(
        False,
        "--no-grammar",
        help="Sample without the grammar mask (for comparison); "
        "tokens the grammar rejects are skipped and counted "
        "when decoding.",
    ),
    keep_note_offs: bool = KEEP_NOTE_OFFS,
    mono_bass: bool = MONO_BASS,
    cache: Optional[float] = CACHE,
    device: str = typer.Option("auto", help="auto (CUDA when present), cpu, cuda or cuda:N."),
    precision: str = typer.Option(
        "auto",
        help="Precision of the model's steps: auto (the fastest of fp32, bf16 "
        "and bf16 in C, timed once per machine and batch and cached; "
        "MUSEGEN_PRECISION=measure times again), fp32 or bf16.",
    ),
    threads: Optional[int] = typer.Option(
        None, help="CPU threads while sampling, 1..256 (default 1: small per-token work runs faster on one thread)."
    ),
):
    """Continue a MIDI prompt (or start from scratch) with a trained checkpoint."""
    from musegen import home
    from musegen.generation.batch import sample_to_folder
    from musegen.generation.settings import SampleSettings

    settings = SampleSettings(
        length=length,
        bars=bars,
        num_samples=num_samples,
        seed=seed,
        grammar=not no_grammar,
        prompt_bars=prompt_bars,
        precision=precision,
        **drawing(temperature, temperature_by, top_p, top_k, keep_note_offs, mono_bass, cache),
    )
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
        report = {k: v for k, v in summary["prompt_report"].items() if k != "meta"}
        typer.echo(f"prompt: {summary['prompt_tokens']} tokens" + "".join(f", {k} {v}" for k, v in report.items()))
    used, stats = summary["settings"], summary["stats"]
    typer.echo(
        f"{len(summary['samples'])} samples, {stats['new_tokens']} tokens in {stats['seconds']} s "
        f"({stats['tokens_per_second']} tokens/s); T={used['temperature']} by {used['temperature_by']} "
        f"top-p={used['top_p']} top-k={used['top_k']} seed={used['seed']}"
        + (f" cache={used['cache']}" if used["cache"] else "")
    )
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


def register(app: typer.Typer) -> None:
    app.command("sample")(sample)
