"""A run's settings: `TrainConfig`, its bounds, and how `musegen train` builds it from a preset,
a YAML file, `--set` items and an `--init` checkpoint."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, JsonValue

from .. import schemas
from ..checkpoint import read_checkpoint_config
from ..choices import PRECISIONS
from ..data import CROP_CHOICES, SAMPLING_CHOICES
from ..errors import ConfigError, FormatError
from ..model.config import ModelConfig, preset, replace_checked
from .run_folder import RUN_CONFIG, latest_checkpoint

# Inclusive bounds of the numeric settings. Values past them are typos, or runs that can only
# diverge (lr=1e30) or never end (steps=1e12). docs/training.md lists them (a test compares).
LIMITS: dict[str, tuple[float, float]] = {
    "seq_len": (1, 65536),
    "workers": (0, 64),
    "steps": (1, 10**9),
    "batch_size": (1, 65536),
    "micro_batch": (0, 65536),
    "lr": (1e-8, 1.0),
    "lr_floor": (0.0, 1.0),
    "warmup": (0, 10**9),
    "kit_shuffle": (0.0, 1.0),
    "instrument_shuffle": (0.0, 1.0),
    "bass_doubling": (0.0, 1.0),
    "weight_decay": (0.0, 1.0),
    "grad_clip": (0.0, 1e6),
    "ckpt_every": (1, 10**9),
    "keep": (1, 1000),
    "valid_every": (0, 10**9),
    "valid_len": (0, 262144),
    "valid_pieces": (0, 10**6),
    "log_every": (1, 10**9),
    "max_nonfinite": (1, 10**6),
    "seed": (0, 2**63 - 1),
}


def format_limit(value: float) -> str:
    """1,000 for ints, 1e-8 for floats: how the bounds are written in messages and docs."""
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:g}".replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")


@dataclass
class TrainConfig:
    """Every setting of a run. `--set key=value` reaches these fields (`model.<field>` the model's)."""

    model: ModelConfig = field(default_factory=lambda: preset("small"))
    preset: str = "small"
    data: str = ""
    out: str = ""
    init: str = ""  # checkpoint whose weights start the run (`--init`); empty: random weights
    # data
    seq_len: int = 2048  # training crop length (tokens fed to the model)
    sampling: str = "piece"  # "piece": one crop per piece per epoch | "length": pieces drawn by length
    crop: str = "auto"  # "random" | "start" | "auto": the tokenizer's `default_crop`
    augment: bool = True
    kit_shuffle: float = 0.0  # share of pieces whose drums get a random kit (groove-dur; needs augment)
    instrument_shuffle: float = 0.0  # share of pieces played on other instruments of their families (song)
    bass_doubling: float = 0.0  # share of pieces whose bass notes are doubled at an interval (groove-dur)
    workers: int = 2  # DataLoader worker processes (0: load in the training process)
    # optimisation
    steps: int = 10000  # optimiser updates in total
    batch_size: int = 4  # global batch: sequences per update over all processes
    micro_batch: int = 0  # sequences per forward pass; 0: the whole per-process share
    optimizer: str = "adam"  # "adam" | "adamw"
    lr: float = 2e-4
    lr_floor: float = 5e-6  # the cosine decays to this
    warmup: int = 200  # linear warm-up updates
    weight_decay: float = 0.0
    grad_clip: float = 0.5  # max global gradient norm; 0 disables clipping
    # hardware
    device: str = "auto"  # "auto" (cuda when available) | "cpu" | "cuda" | "cuda:N"
    precision: str = "auto"  # "auto" (the faster of fp32 and bf16, timed once: musegen.precision) | "fp32" | "bf16"
    compile: bool = False  # torch.compile the model
    # checkpoints, validation, logs
    ckpt_every: int = 1000
    keep: int = 3  # checkpoints kept
    valid_every: int = 1000  # 0: never
    valid_len: int = 0  # positions scored by validation; 0: twice seq_len (synthesizer: at most max_len)
    valid_pieces: int = 32  # first N pieces of the validation split
    log_every: int = 10
    max_nonfinite: int = 20  # consecutive non-finite updates that stop the run
    seed: int = 0

    def __post_init__(self):
        choices = [
            (self.sampling in SAMPLING_CHOICES, f"sampling must be one of {SAMPLING_CHOICES}, got {self.sampling!r}"),
            (self.crop in CROP_CHOICES + ("auto",), f"crop must be 'auto' or one of {CROP_CHOICES}, got {self.crop!r}"),
            (self.optimizer in ("adam", "adamw"), f"optimizer must be 'adam' or 'adamw', got {self.optimizer!r}"),
            (
                self.precision in PRECISIONS,
                f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}",
            ),
        ]
        for ok, message in choices:
            if not ok:
                raise ConfigError(message)
        # A number out of its bounds is a FormatError (exit 2), as a ModelConfig's is.
        for key, (low, high) in LIMITS.items():
            value = getattr(self, key)
            if not low <= value <= high:
                raise FormatError(f"{key} must be in {format_limit(low)}..{format_limit(high)}, got {value!r}")
        for augmentation in ("kit_shuffle", "instrument_shuffle", "bass_doubling"):
            if getattr(self, augmentation) and not self.augment:
                raise ConfigError(f"{augmentation} is an augmentation: it needs augment=true")
        if not self.lr_floor <= self.lr:
            raise FormatError(f"lr_floor {self.lr_floor!r} must not exceed lr {self.lr!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def build_config(
    preset_name: str | None,
    data: str | os.PathLike,
    out: str | os.PathLike,
    config_file: str | os.PathLike | None = None,
    sets: Iterable[str] = (),
    device: str | None = None,
    init: str | os.PathLike | None = None,
    resume: bool = False,
) -> TrainConfig:
    """The model: the preset (default "small"), the YAML file's `model:` mapping, then each
    `--set model.<field>`; with `init`, the checkpoint's model instead, which those may repeat
    but not contradict. The rest: defaults, the YAML file's top level, each `--set`, `device`.
    With `resume`, the run folder's recorded settings come before the YAML file and the model is
    its latest checkpoint's, so `--resume` alone continues the run as it was set.
    Settings of one layer are applied together, so settings that must agree can come in any order."""
    top, model_file = _read_config_file(config_file)
    top_sets, model_sets = _parse_sets(sets)
    model_settings = {**model_file, **model_sets}
    recorded = recorded_settings(out) if resume else {}
    latest = latest_checkpoint(out) if resume else None
    if latest is not None:
        model, name = _model_of_init(latest, preset_name, model_settings, "the checkpoint being resumed")
    elif init is None:
        name = preset_name or "small"
        model = replace_checked(preset(name), model_settings)
    else:
        model, name = _model_of_init(Path(init), preset_name, model_settings)
    names = {"preset": name, "data": str(data), "out": str(out), "init": str(init or recorded.pop("init", ""))}
    settings = {**recorded, **top, **top_sets, **names}
    if device is not None:
        settings["device"] = device
    return replace_checked(TrainConfig(model=model), settings)


class TrainSettings(BaseModel):
    """A `train --config` YAML file: TrainConfig's fields, and `model:` ModelConfig's (both checked,
    bounds included, where the configs are made)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    model: dict[str, JsonValue] = {}


TRAIN_SETTINGS = schemas.Format("train settings", None, TrainSettings)


def _read_config_file(path: str | os.PathLike | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(top-level settings, `model:` mapping) of a YAML file."""
    if path is None:
        return {}, {}
    checked = schemas.read_yaml(path, TRAIN_SETTINGS).model_dump()
    model = checked.pop("model")
    return checked, model


def _parse_sets(sets: Iterable[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`--set` items as (training settings, model settings), each value of its field's type."""
    top: dict[str, Any] = {}
    model: dict[str, Any] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key = key.strip()
        if key in ("preset", "data", "out", "init"):
            raise ConfigError(f"{key} is set with --{key}, not --set")
        if key.startswith("model."):
            model[key[len("model.") :]] = _parse_value(ModelConfig(), key[len("model.") :], text)
        else:
            top[key] = _parse_value(TrainConfig(), key, text)
    return top, model


def _parse_value(obj, key: str, text: str):
    """A `--set` string converted to the type of `obj.key`, or a ConfigError naming both."""
    names = {f.name for f in dataclasses.fields(obj)}
    if key not in names or key == "model":
        raise ConfigError(f"unknown setting {key!r} for {type(obj).__name__}")
    expected = type(getattr(obj, key))
    try:
        if expected is bool:
            flag = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
            return flag[text.strip().lower()]
        return expected(text) if expected in (int, float) else text
    except (KeyError, ValueError):
        raise ConfigError(f"setting {key!r} expects {expected.__name__}, got {text!r}") from None


class RunRecord(BaseModel):
    """The part of a run folder's train_config.json that a resumed run reads: its settings."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    config: dict[str, JsonValue]


RUN_RECORD = schemas.Format("run record", None, RunRecord)
# given again on the command line, the checkpoint's, or this machine's (a run may resume elsewhere)
NOT_RECORDED = ("model", "preset", "data", "out", "device")


def recorded_settings(out: str | os.PathLike) -> dict[str, Any]:
    """The training settings a run folder was last run with (train_config.json), less the model
    and the folders; settings this version no longer has are left out. Empty when the folder holds
    no record (a run without a checkpoint: the trainer refuses to resume it)."""
    path = Path(out) / RUN_CONFIG
    if not path.is_file():
        return {}
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    config = schemas.read(path, RUN_RECORD).config
    return {k: v for k, v in config.items() if k in fields and k not in NOT_RECORDED}


def settings_changed_on_resume(cfg: TrainConfig) -> list[str]:
    """`key: recorded -> now` for each setting that the resuming command changes."""
    recorded = recorded_settings(cfg.out)
    recorded.pop("init", None)
    return [f"{k}: {v!r} -> {getattr(cfg, k)!r}" for k, v in recorded.items() if getattr(cfg, k) != v]


def _model_of_init(
    init: Path, preset_name: str | None, explicit: dict[str, Any], source: str = "the --init checkpoint"
) -> tuple[ModelConfig, str]:
    """The checkpoint's model config and preset name; a preset or model setting that differs
    from it is an error (the weights fix the model)."""
    model, meta = read_checkpoint_config(init)
    if preset_name is not None:
        wanted = preset(preset_name)
        differ = [k for k in wanted.to_dict() if k != "vocab_size" and getattr(wanted, k) != getattr(model, k)]
        if differ:
            raise ConfigError(
                f"--preset {preset_name} contradicts {source}'s model ({differ[0]}: "
                f"{getattr(wanted, differ[0])!r} vs {getattr(model, differ[0])!r}); leave it out"
            )
    replace_checked(model, explicit)  # unknown settings and wrong types: the usual errors
    for key, value in explicit.items():
        if getattr(model, key) != value:
            raise ConfigError(
                f"model.{key}={value!r} contradicts {source}'s {key}="
                f"{getattr(model, key)!r}; the model comes from the checkpoint"
            )
    meta_preset = meta.get("preset") if isinstance(meta, dict) else None
    return model, preset_name or (meta_preset if isinstance(meta_preset, str) else "")
