"""`musegen evaluate style` (Fig. 5 style similarity), `loss` (Fig. 3 NLL, and per token type),
`continuation` (continuations beside the real ones), `copy` (whether a model keeps a groove) and
`compare` (models side by side)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from ..generation.settings import SampleSettings
from .options import sampling_options

# the continuation protocol's own: how much is sampled, from which seed, at which precision
PROTOCOL_OWN = ("length", "bars", "num_samples", "seed", "prompt_bars", "prompt_from", "grammar", "precision", "grid")
# continuation takes --grid: each file of a folder of MIDI files is a prompt
CONTINUATION_OWN = tuple(name for name in PROTOCOL_OWN if name != "grid")

evaluate_app = typer.Typer(help="Measure generated music and trained models.", no_args_is_help=True)


@evaluate_app.command("style")
def style(
    generated: Path = typer.Option(..., help="Folder of generated MIDI (e.g. the output of musegen sample)."),
    reference: Path = typer.Option(
        ...,
        help="Folder of reference MIDI: song.mid for song_000.mid, ... "
        "(a single file is the reference for everything).",
    ),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Folder for style.csv and style.png (default: the generated folder)."
    ),
    segments: str = typer.Option("4", help="Equal-duration segments the continuation is cut into (1..64)."),
    other: str = typer.Option(
        "busiest", help="Accompaniment role: the busiest harmonic track (as the paper) or all of them merged."
    ),
    baselines: bool = typer.Option(
        False, help="Also score each reference's own later bars (ceiling) and another style's reference (floor)."
    ),
):
    """Time-pitch and onset-duration style similarity per track and segment (paper Fig. 5)."""
    from musegen.evaluation.run_style import check_segments, evaluate_style

    n_segments = check_segments(segments)
    out = out or generated
    result = evaluate_style(generated, reference, out / "style.csv", out / "style.png", n_segments, other, baselines)
    typer.echo(
        f"{result['pieces']} pieces scored"
        + (
            f", {len(result['unmatched'])} without a reference: {', '.join(result['unmatched'][:5])}"
            if result["unmatched"]
            else ""
        )
    )
    for name, reason in list(result["skipped"].items())[:5]:
        typer.echo(f"  skipped {name}: {reason}")
    if len(result["skipped"]) > 5:
        typer.echo(f"  ... and {len(result['skipped']) - 5} more skipped")
    tables = {"model": result} | {kind: part for kind, part in result.get("baselines", {}).items()}
    for label, table in tables.items():
        for metric, values in table["medians"].items():
            typer.echo(
                f"  {label:8s} {metric:15s} median (empty) per segment: "
                + "  ".join(
                    "-" if math.isnan(v) else f"{v:.2f} ({e:.0%})" for v, e in zip(values, table["empty"][metric])
                )
            )
    typer.echo(
        f"wrote {out / 'style.csv'} and {out / 'style.png'}"
        + (f" and {out / 'style_baselines.csv'}" if baselines else "")
    )


@evaluate_app.command("loss")
def loss(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-c", help="Checkpoint folder, or a shipped model's name."),
    data: Path = typer.Option(..., help="Token shards folder (musegen data prepare)."),
    max_len: int = typer.Option(
        ..., help="Score positions 0..max_len-1 (e.g. 2x the training length); at most 65,536."
    ),
    split: str = typer.Option("valid", help="Which split of the shards to score."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for the CSV and PNG."),
):
    """Teacher-forced NLL per token position, within and beyond the training length (paper Fig. 3),
    and per token type beside baselines counted on the training split."""
    from musegen.evaluation.run_loss import evaluate_loss
    from musegen.metrics.report import fmt

    result = evaluate_loss(checkpoint, data, max_len, split=split, out_dir=out)
    for key, value in result.items():
        if isinstance(value, (int, float, str)):
            typer.echo(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    typer.echo("NLL per token type (nats; the baselines know the type; see token_types_<split>.md):")
    columns = (("model", 7), ("model_given_type", 16), ("unigram", 8), ("conditional", 11), ("uniform_allowed", 15))
    typer.echo(f"  {'type':12s} {'tokens':>8s} " + " ".join(f"{c[:w]:>{w}s}" for c, w in columns))
    for row in result["types"]:
        typer.echo(f"  {row['type']:12s} {row['tokens']:8d} " + " ".join(f"{fmt(row[c]):>{w}s}" for c, w in columns))


@evaluate_app.command("continuation")
@sampling_options(exclude=CONTINUATION_OWN)
def continuation(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-c", help="Checkpoint folder, or a shipped model's name."),
    data: Path = typer.Option(
        ...,
        help="Token shards folder (musegen data prepare), or a folder of MIDI files "
        "(each put on the grid --grid names and encoded by the model's tokenizer; --split is then not used).",
    ),
    out: Path = typer.Option(
        ...,
        "--out",
        "-o",
        help="Folder for the table, plot, samples and per-piece results (a rerun with the same settings resumes).",
    ),
    split: str = typer.Option("valid", help="Which split's pieces to continue."),
    prompt_bars: int = typer.Option(4, help="Prompt bars after the pickup bar (the piece's first bar with a note)."),
    bars: int = typer.Option(12, help="Bars to generate and measure after the prompt."),
    samples_per_piece: int = typer.Option(2, help="Continuations sampled per piece."),
    pieces: Optional[int] = typer.Option(None, help="Use only the first N usable pieces."),
    seed: int = typer.Option(0, help="Piece i is sampled with seed + i."),
    device: str = typer.Option("auto", help="auto (CUDA when present), cpu, cuda or cuda:N."),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads while sampling (default 1)."),
    by_quarter: bool = typer.Option(
        False,
        help="Also measure each quarter of the bars (a multiple of 4): how a "
        "long continuation holds up past the training length.",
    ),
    settings: Optional[SampleSettings] = None,  # the drawing options, made by @sampling_options
):
    """Continue held-out pieces (pickup bar + N bars in, M bars out, as MIREX 2025) and compare the
    continuations with the real bars and with another piece's: a table (CSV + Markdown) and a plot."""
    from musegen.evaluation.run_continuation import ContinuationSettings, evaluate_continuation

    sample = replace(settings, bars=bars, num_samples=samples_per_piece, seed=seed)
    settings = ContinuationSettings(prompt_bars=prompt_bars, sample=sample, by_quarter=by_quarter)
    result = evaluate_continuation(
        checkpoint, data, out, settings, split=split, limit=pieces, device=device, threads=threads
    )
    skipped = result["skipped"]
    listed = "".join(f"\n  skipped {name}: {why}" for name, why in list(skipped.items())[:5])
    more = f"\n  ... and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    typer.echo(
        f"{result['pieces']} pieces of {result['split']} continued ({result['resumed']} from an earlier run), "
        f"{len(skipped)} skipped{listed}{more}"
    )
    if result["invalid_samples"] or result["undecodable_samples"]:
        typer.echo(f"invalid samples: {result['invalid_samples']}, undecodable: {result['undecodable_samples']}")
    for table in ("md", "quarters_md", "two_sample_md"):
        if table in result["files"]:
            typer.echo(Path(result["files"][table]).read_text().rstrip() + "\n")
    typer.echo(f"wrote {', '.join(Path(f).name for f in result['files'].values())} to {out}")


@evaluate_app.command("copy")
@sampling_options(exclude=PROTOCOL_OWN)
def copy(
    checkpoint: list[str] = typer.Option(
        ...,
        "--checkpoint",
        "-c",
        help="Checkpoint folder or shipped model's name, or NAME=FOLDER; repeat to put models side by side.",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for copy.md, copy.csv, copy.json and the samples."),
    data: Optional[Path] = typer.Option(
        None,
        help="A prepared groove corpus: pieces of its split give patterns too (2 bars from the first bar with a note).",
    ),
    split: str = typer.Option("test", help="Which split's pieces give patterns."),
    pieces: int = typer.Option(4, help="Patterns taken from the corpus: one piece a style first, in split order."),
    built: bool = typer.Option(True, help="Also the grooves built in musegen (drums, bass figure, chord rhythm)."),
    bars: int = typer.Option(4, help="Bars continued and scored after the 4-bar prompt."),
    samples: int = typer.Option(2, help="Continuations sampled per pattern."),
    seed: int = typer.Option(0, help="Pattern i is sampled with seed + i (wrapping within 0..2**63-1)."),
    device: str = typer.Option("auto", help="auto (CUDA when present), cpu, cuda or cuda:N."),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads while sampling (default 1)."),
    recall_pieces: int = typer.Option(
        30, min=0, help="Also the NLL by bar on this many unseen random loops (recall.md; 0: not)."
    ),
    settings: Optional[SampleSettings] = None,  # the drawing options, made by @sampling_options
):
    """Whether a model keeps a groove: 2-bar patterns played twice, continued, and each new bar scored per
    role by how exactly it repeats the pattern (1: a perfect loop), beside the loop itself and an
    unrelated pattern; and, drawing nothing, how much the model's NLL falls on random loops once it has
    heard their pattern (recall.md)."""
    from musegen.errors import ConfigError
    from musegen.evaluation.run_copy import evaluate_copy
    from musegen.evaluation.run_recall import evaluate_recall

    checkpoints = {}
    for item in checkpoint:
        name, sep, folder = item.partition("=")
        name, folder = (name, folder) if sep else (Path(item).name, item)
        if not name or not folder or name in checkpoints:
            raise ConfigError(f"--checkpoint expects FOLDER or NAME=FOLDER with distinct names, got {item!r}")
        checkpoints[name] = folder
    result = evaluate_copy(
        checkpoints,
        out,
        data,
        split,
        pieces,
        built,
        replace(settings, bars=bars, num_samples=samples, seed=seed),
        device=device,
        threads=threads,
    )
    for name, reason in list(result["skipped"].items())[:5]:
        typer.echo(f"  skipped {name}: {reason}")
    if len(result["skipped"]) > 5:
        typer.echo(f"  ... and {len(result['skipped']) - 5} more skipped")
    typer.echo(Path(result["files"]["md"]).read_text().rstrip() + "\n")
    written = "copy.md, copy.csv, copy.json and samples/"
    if recall_pieces:
        recall = evaluate_recall(checkpoints, out, recall_pieces, device=device)
        typer.echo(Path(recall["files"]["md"]).read_text().rstrip() + "\n")
        written += ", recall.md, recall.csv, recall.png, recall.json"
    typer.echo(f"wrote {written} to {out}")


@evaluate_app.command("compare")
def compare(
    run: list[str] = typer.Option(
        ..., "--run", help="NAME=FOLDER with the model's evaluate/sample output; repeat for each model, in table order."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the tables (.md, .csv) and figures."),
    train_len: Optional[int] = typer.Option(
        None, min=1, help="Training length L: splits 'within' from 'extrapolation' in loss tables."
    ),
):
    """Several models side by side: NLL within/beyond L with all curves in one plot, style medians and box plots."""
    from musegen.errors import ConfigError
    from musegen.evaluation.compare import compare as compare_runs

    runs = {}
    for item in run:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise ConfigError(f"--run expects NAME=FOLDER, got {item!r}")
        runs[name] = folder
    report = compare_runs(runs, out, train_len)
    for kind in report:
        typer.echo((out / f"{'nll' if kind == 'loss' else kind}.md").read_text().rstrip() + "\n")
    typer.echo(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}")


def register(app: typer.Typer) -> None:
    app.add_typer(evaluate_app, name="evaluate")
