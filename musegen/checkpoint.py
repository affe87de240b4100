"""Self-contained checkpoint folders, loaded without unpickling anything.

A checkpoint folder holds:
- `model.safetensors`: the weights (fp32, fp16 or bf16; or int8 matrices, each row with its own
  scale stored as `<name>@int8_scale`, vectors in fp16; cast to fp32 on load);
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
from pydantic import ValidationError
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from . import home, schemas
from .checkpoint_format import CONFIG, FORMAT, TOKENIZER, VERSION, WEIGHTS, read_config, sampling_defaults
from .errors import CheckpointError, ConfigError, FormatError, MusegenError
from .io import atomic_path, printable, read_head, write_json
from .model.config import ModelConfig
from .model.transformer import MusicPerformer
from .tokenizers.base import RepresentationError, Tokenizer, load_tokenizer

SCALE_SUFFIX = "@int8_scale"  # not a Python identifier, so no module's own tensor can be named so


def save_checkpoint(
    folder: str | os.PathLike,
    model: torch.nn.Module,
    config: ModelConfig,
    tokenizer: Tokenizer,
    meta: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write the three files, each atomically. The config is written last: it marks completeness.
    A weight that `dtype` cannot hold (fp16 overflows past 65504) is refused, never written as inf.
    `torch.int8` quantises each matrix row by row (`_quantise`)."""
    folder = Path(folder)
    tensors = {}
    for name, value in model.state_dict().items():
        value = value.detach().to("cpu")
        if dtype == torch.int8 and value.is_floating_point() and value.dim() == 2:
            tensors.update(_quantise(name, value))
        else:
            tensors[name] = _cast(name, value, torch.float16 if dtype == torch.int8 else dtype)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / WEIGHTS) as tmp:
        save_file(tensors, str(tmp))
    tokenizer.save(folder / TOKENIZER)
    write_json(folder / CONFIG, {"format": FORMAT, "version": VERSION, "model": config.to_dict(), "meta": meta or {}})
    return folder


def _cast(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not tensor.is_floating_point():
        return tensor.contiguous()
    cast = tensor.to(dtype).contiguous()
    overflow = torch.isinf(cast) & torch.isfinite(tensor)
    if overflow.any():
        largest = tensor[overflow].abs().max().item()
        raise CheckpointError(
            f"{name} holds values up to {largest:.6g}, beyond the range of {dtype} "
            f"(largest {torch.finfo(dtype).max:.6g}); keep fp32 or use bf16"
        )
    return cast


def _quantise(name: str, matrix: torch.Tensor) -> dict[str, torch.Tensor]:
    """A matrix as int8 steps of its row's own scale (largest |weight| / 127), so that no weight
    moves by more than half a step of its row; the scales stay fp32 (one number a row)."""
    matrix = matrix.float()
    scale = matrix.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
    steps = torch.round(matrix / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return {name: steps.contiguous(), name + SCALE_SUFFIX: scale.contiguous()}


def _dequantise(state: dict[str, torch.Tensor], weights: Path) -> dict[str, torch.Tensor]:
    """int8 matrices back to fp32 with their scales; the header check has matched names and shapes."""
    state = dict(state)
    for key in [k for k in state if k.endswith(SCALE_SUFFIX)]:
        scale, name = state.pop(key).float(), key[: -len(SCALE_SUFFIX)]
        if state[name].dtype != torch.int8 or not (torch.isfinite(scale).all() and (scale > 0).all()):
            raise CheckpointError(f"{printable(weights)}: {key} must scale an int8 matrix by positive numbers")
        state[name] = state[name].float() * scale[:, None]
    return state


def read_checkpoint_config(folder: str | os.PathLike) -> tuple[ModelConfig, dict[str, Any]]:
    """The model config and meta of a checkpoint, checked against their schema (sizes bounded by
    ModelConfig's own bounds) before anything is built. `folder` may name a shipped model (`pop`)."""
    folder = home.checkpoint(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{printable(folder)}: checkpoint folder not found")
    data = read_config(folder)
    return _model_config(data.model, folder / CONFIG), data.meta


def _model_config(settings: dict[str, Any], where: str | os.PathLike) -> ModelConfig:
    """A ModelConfig from a file's settings (defaults for those it lacks), as FormatError."""
    try:
        return ModelConfig(**settings)
    except ValidationError as exc:
        raise FormatError(f"{printable(where)}: invalid model config: {schemas.first_problem(exc)}") from None
    except (ConfigError, TypeError) as exc:  # the config's own cross-field checks; a key named like `self`
        raise FormatError(f"{printable(where)}: invalid model config: {exc}") from None


def load_checkpoint(folder: str | os.PathLike, device: str | torch.device = "cpu"):
    """Return (model in eval mode, tokenizer, config, meta) or raise CheckpointError. `folder` may
    name a shipped model (`pop`).

    Nothing is allocated from the files' word alone: the config's sizes are bounded, and the
    weight file's header (names and shapes) must match a model built on the meta device, which
    allocates nothing, before any tensor is read or the real model is built."""

    folder = home.checkpoint(folder)
    config, meta = read_checkpoint_config(folder)
    try:
        tokenizer = load_tokenizer(folder / TOKENIZER, remedy="retrain the model")
    except RepresentationError as exc:  # its own message says what to do
        raise CheckpointError(str(exc)) from None
    except FormatError:  # names the file and the field
        raise
    except MusegenError as exc:
        raise CheckpointError(f"{folder}: bad tokenizer ({exc})") from None
    tokenizer.sampling_defaults = {**tokenizer.sampling_defaults, **sampling_defaults(meta, folder)}
    if tokenizer.vocab_size != config.vocab_size:
        raise CheckpointError(
            f"{folder}: tokenizer has {tokenizer.vocab_size} tokens but the model {config.vocab_size}"
        )
    weights = folder / WEIGHTS
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in MusicPerformer(config).state_dict().items()}
    _check_header(weights, expected)
    try:
        state = _dequantise(load_file(str(weights)), weights)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{printable(weights)}: unreadable weights ({_first_line(exc)})") from None
    model = MusicPerformer(config)
    targets = model.state_dict()
    for name, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise CheckpointError(f"{printable(weights)}: {name} holds non-finite values")
        if targets[name].is_floating_point() and not tensor.is_floating_point():
            raise CheckpointError(f"{printable(weights)}: {name} is {tensor.dtype} without {name}{SCALE_SUFFIX}")
    model.load_state_dict({k: v.to(targets[k].dtype) for k, v in state.items()})
    return model.to(device).eval(), tokenizer, config, meta


def _check_header(weights: Path, expected: dict[str, tuple[int, ...]]) -> None:
    """The weight file is a regular file whose safetensors header names exactly `expected`'s
    tensors with their shapes (only the header is read)."""
    if not weights.exists() and not weights.is_symlink():
        raise CheckpointError(f"{printable(weights.parent)}: missing {WEIGHTS}")
    read_head(weights, 8, "weights file", CheckpointError)  # refuses FIFOs, devices, folders, link loops
    try:
        with safe_open(str(weights), "pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{printable(weights)}: unreadable weights ({_first_line(exc)})") from None
    for key in [k for k in shapes if k.endswith(SCALE_SUFFIX)]:  # one scale a row of its matrix
        matrix = expected.get(key[: -len(SCALE_SUFFIX)], ())
        if len(matrix) != 2 or shapes.pop(key) != matrix[:1]:
            raise CheckpointError(f"{printable(weights)}: {key} does not scale the rows of a matrix of the model")
    missing, unexpected = sorted(set(expected) - set(shapes)), sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{printable(weights)}: weights do not match the config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    for name, shape in shapes.items():
        if shape != expected[name]:
            raise CheckpointError(f"{printable(weights)}: {name} has shape {shape}, the config needs {expected[name]}")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def export_checkpoint(
    source: str | os.PathLike,
    dest: str | os.PathLike,
    dtype: torch.dtype = torch.float16,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Copy a checkpoint's model, config and tokenizer (no trainer state) with weights cast to
    `dtype`, merging `meta` into its metadata: how a run's checkpoint becomes a shipped model."""
    source = home.checkpoint(source)
    if Path(dest).exists() and os.path.samefile(source, dest):
        raise CheckpointError(f"{printable(dest)}: --out is the checkpoint itself; choose another folder")
    model, tokenizer, config, old_meta = load_checkpoint(source)
    return save_checkpoint(dest, model, config, tokenizer, {**old_meta, **(meta or {})}, dtype=dtype)
