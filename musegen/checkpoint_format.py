"""A checkpoint folder's file names and its config.json's format, apart from the model code (no
torch here): the command line's help reads the shipped models' own sampling defaults through it
before any model is loaded. Loading and saving a checkpoint is musegen/checkpoint.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, JsonValue

from . import schemas
from .errors import CheckpointError, InputFileError
from .io import printable

FORMAT = "musegen-checkpoint"
VERSION = 1
WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
MAX_CONFIG_BYTES = 2**20


class CheckpointConfig(BaseModel):
    """A checkpoint's config.json. `model` is the ModelConfig itself, bounds included."""

    model_config = schemas.STRICT
    format: Literal["musegen-checkpoint"]
    version: Literal[1]
    model: dict[str, JsonValue]  # checked by ModelConfig, which knows its defaults
    meta: dict[str, JsonValue] = {}


CHECKPOINT_CONFIG = schemas.Format("checkpoint config", VERSION, CheckpointConfig)


def read_config(folder: Path) -> CheckpointConfig:
    """`folder`'s config.json checked against its schema, or a CheckpointError naming the file."""
    path = folder / CONFIG
    if not path.exists() and not path.is_symlink():
        raise CheckpointError(f"{printable(folder)}: missing {CONFIG}")
    try:
        return schemas.read(path, CHECKPOINT_CONFIG, MAX_CONFIG_BYTES)
    except InputFileError as exc:
        raise CheckpointError(str(exc)) from None


def sampling_defaults(meta: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The sampling defaults a checkpoint names in its meta ("sampling": {"cache": 0.8}), which
    override its tokenizer's: a default tuned for one model belongs to the model. Their bounds are
    checked where they are used (SampleSettings.resolved)."""
    sampling = meta.get("sampling", {})
    if not isinstance(sampling, dict) or not all(
        isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in sampling.values()
    ):
        raise CheckpointError(f"{printable(folder / CONFIG)}: meta.sampling must map option names to numbers or text")
    return sampling
