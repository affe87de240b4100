"""Self-contained checkpoint folders, loaded without unpickling anything.

A checkpoint folder holds:
- `model.safetensors`: the weights (fp32, fp16 or bf16; cast to fp32 on load);
- `config.json`: {"format", "version", "model": ModelConfig fields, "meta": free-form info};
- `tokenizer.json`: the tokenizer that made the training tokens, with its representation
  version (a checkpoint of another version is refused: the model must be retrained).
`musegen sample` needs nothing else. Training state for `--resume` lives beside these files
and is the trainer's business.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .errors import CheckpointError, MusegenError
from .io import atomic_path, read_json, write_json
from .model.config import ModelConfig
from .tokenizers.base import RepresentationError, Tokenizer, load_tokenizer

FORMAT = "musegen-checkpoint"
VERSION = 1
WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"


def save_checkpoint(folder: str | os.PathLike, model: torch.nn.Module, config: ModelConfig,
                    tokenizer: Tokenizer, meta: dict[str, Any] | None = None,
                    dtype: torch.dtype = torch.float32) -> Path:
    """Write the three files, each atomically. The config is written last: it marks completeness."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
               for k, v in model.state_dict().items()}
    with atomic_path(folder / WEIGHTS) as tmp:
        save_file(tensors, str(tmp))
    tokenizer.save(folder / TOKENIZER)
    write_json(folder / CONFIG, {"format": FORMAT, "version": VERSION,
                                 "model": config.to_dict(), "meta": meta or {}})
    return folder


def read_checkpoint_config(folder: str | os.PathLike) -> tuple[ModelConfig, dict[str, Any]]:
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder not found")
    path = folder / CONFIG
    if not path.is_file():
        raise CheckpointError(f"{folder}: missing {CONFIG}")
    try:
        data = read_json(path)
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: not valid JSON") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a musegen checkpoint config")
    if data.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {data.get('version')!r}, expected {VERSION}")
    if not isinstance(data.get("model"), dict):
        raise CheckpointError(f"{path}: invalid model config (no settings object)")
    try:
        config = ModelConfig.from_dict(data["model"])
    except MusegenError as exc:
        raise CheckpointError(f"{path}: invalid model config ({exc})") from None
    return config, data.get("meta", {})


def load_checkpoint(folder: str | os.PathLike, device: str | torch.device = "cpu"):
    """Return (model in eval mode, tokenizer, config, meta) or raise CheckpointError."""
    from .model import MusicPerformer

    folder = Path(folder)
    config, meta = read_checkpoint_config(folder)
    try:
        tokenizer = load_tokenizer(folder / TOKENIZER, remedy="retrain the model")
    except RepresentationError as exc:  # its own message says what to do
        raise CheckpointError(str(exc)) from None
    except MusegenError as exc:
        raise CheckpointError(f"{folder}: bad tokenizer ({exc})") from None
    if tokenizer.vocab_size != config.vocab_size:
        raise CheckpointError(f"{folder}: tokenizer has {tokenizer.vocab_size} tokens "
                              f"but the model {config.vocab_size}")
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{folder}: missing {WEIGHTS}")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights}: unreadable weights ({exc})") from None
    model = MusicPerformer(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{weights}: weights do not match the config "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(f"{weights}: {name} has shape {tuple(tensor.shape)}, "
                                  f"the config needs {tuple(expected[name].shape)}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise CheckpointError(f"{weights}: {name} holds non-finite values")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
    return model.to(device).eval(), tokenizer, config, meta


def export_checkpoint(source: str | os.PathLike, dest: str | os.PathLike, dtype: torch.dtype = torch.float16,
                      meta: dict[str, Any] | None = None) -> Path:
    """Copy a checkpoint's model, config and tokenizer (no trainer state) with weights cast to
    `dtype`, merging `meta` into its metadata: how a run's checkpoint becomes a shipped model."""
    model, tokenizer, config, old_meta = load_checkpoint(source)
    return save_checkpoint(dest, model, config, tokenizer, {**old_meta, **(meta or {})}, dtype=dtype)
