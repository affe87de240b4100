"""`musegen train`: train a preset on prepared token shards (also under torchrun)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from musegen.errors import MusegenError


class StoppedOnRequest(MusegenError):
    """A run that Ctrl-C or SIGTERM ended after its checkpoint: exit 130, as for an interrupted command."""

    exit_code = 130


def train(
    data: Path = typer.Option(..., "--data", help="Prepared shards folder (`musegen data prepare`)."),
    out: Path = typer.Option(..., "--out", "-o", help="Run folder: config, checkpoints, logs."),
    preset: Optional[str] = typer.Option(
        None, "--preset", help="Model preset: paper-pop, paper-groove, small (the default), tiny."
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", help="YAML file of settings (a `model:` mapping for the model)."
    ),
    set_: List[str] = typer.Option(
        [],
        "--set",
        help="key=value (model.key=value for the model); repeatable. "
        "Numeric settings have bounds, e.g. lr 1e-8..1, steps "
        "1..10^9, seq_len 1..65,536, batch_size 1..65,536: "
        "docs/training.md lists them all.",
    ),
    device: Optional[str] = typer.Option(
        None, "--device", help="auto | cpu | cuda | cuda:N (default: the config's, auto)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue from the run folder's latest valid checkpoint, with the run's recorded "
        "settings (any given here replace them, and are reported).",
    ),
    init: Optional[Path] = typer.Option(
        None,
        "--init",
        help="Start from this checkpoint's weights (a run's, an "
        "exported one or a shipped model's name) with a fresh optimiser: fine-tuning. "
        "The model comes from it; the data's tokenizer must "
        "be its own.",
    ),
):
    """Train a Performer on prepared data; Ctrl-C saves a checkpoint, --resume continues exactly."""
    from musegen.training.settings import build_config
    from musegen.training.trainer import train as run_training

    cfg = build_config(preset, data, out, config, set_, device, init, resume=resume)
    command = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    result = run_training(cfg, resume=resume, command=command)
    if os.environ.get("RANK", "0") != "0":
        return  # under torchrun, the main process reports
    if result["stopped"]:
        raise StoppedOnRequest(
            f"stopped at step {result['step']} on request; checkpoint {result['checkpoint']} (add --resume to continue)"
        )
    valid = result["valid"]
    line = f"step {result['step']}: loss {result['loss']:.4f}"
    if valid and valid.get("within") is not None:
        line += f", validation {valid['within']:.4f}"
    typer.echo(f"{line}; checkpoint {result['checkpoint']}")


def register(app: typer.Typer) -> None:
    app.command("train")(train)
