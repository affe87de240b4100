"""`musegen inspect`: positional templates, attention maps, PE probes and sparsity of a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def inspect(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-c", help="Checkpoint folder, or a shipped model's name."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the PNGs, summary.csv and inspect.json."),
    length: Optional[int] = typer.Option(
        None, min=2, help="Tokens generated for the attention maps and probed (default: 1.5x the training length)."
    ),
    data: Optional[Path] = typer.Option(
        None, help="Token shards for the sparsity measure (default: the generated sequence)."
    ),
    split: str = typer.Option("valid", help="Split of --data to measure."),
    pieces: int = typer.Option(4, min=1, help="Pieces of --data measured (each cut to the training length)."),
    train_len: Optional[int] = typer.Option(
        None, min=4, help="Training length, for checkpoints whose metadata lacks it."
    ),
    seed: int = typer.Option(0, help="Seed of the generated sequence and of the model's noise."),
    device: str = typer.Option("auto", help="auto (CUDA when present), cpu, cuda or cuda:N."),
    threads: int = typer.Option(
        0,
        min=0,
        help="CPU threads for torch (0: torch's default). On a busy "
        "machine 1 is much faster: sampling is many small steps.",
    ),
):
    """Figures of what the positional encoding and attention do (templates, maps, probes, sparsity)."""
    import torch

    from musegen.inspect import inspect_checkpoint

    if threads:
        torch.set_num_threads(threads)

    # (the options in inspect_checkpoint's order, under its names)
    result = inspect_checkpoint(checkpoint, out, length, data, split, pieces, seed, train_len, device, progress=True)
    typer.echo(f"{result['pe']} model, training length {result['train_len']}, probed to {result['length']} tokens")
    for note in result["notes"]:
        typer.echo(f"  note: {note}")
    for name, best in result["best_heads"].items():
        typer.echo(f"  best head for {name.replace('_', ' ')}: {best['head']} ({best['value']:.3f})")
    typer.echo(f"wrote {', '.join(result['files'])} to {out} in {result['seconds']:.1f} s")


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect)
