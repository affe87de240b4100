"""`musegen export`: turn a training checkpoint into a small, self-contained model folder."""

from __future__ import annotations

from pathlib import Path

import typer

DTYPES = ("fp32", "fp16", "bf16", "int8")


def export(
    checkpoint: Path = typer.Argument(
        ..., help="A checkpoint folder (e.g. runs/pop/checkpoints/step-00003000), or a shipped model's name."
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Folder to write model.safetensors, config.json, tokenizer.json."
    ),
    dtype: str = typer.Option(
        "fp16",
        help="Weight precision: fp32, fp16, bf16, or int8 (each matrix row with its own scale, vectors fp16); "
        "loaded back as fp32.",
    ),
):
    """Copy a checkpoint without its optimiser state, with weights stored in a smaller precision."""
    import torch

    from musegen.checkpoint import export_checkpoint, read_checkpoint_config
    from musegen.errors import ConfigError
    from musegen.training.run_folder import recorded_name

    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8}[dtype]
    _, meta = read_checkpoint_config(checkpoint)
    source = meta.get("exported_from", recorded_name(checkpoint))  # re-exported, it still names its run
    folder = export_checkpoint(checkpoint, out, torch_dtype, {"exported_from": source, "dtype": dtype})
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    typer.echo(f"wrote {folder} ({size / 2**20:.1f} MiB)")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
