"""The training loop: schedule, resumable checkpoints, validation, logs, DistributedDataParallel.

A run reads and checks everything it needs (data, the `--init` or resume checkpoint, the whole
trainer state), takes the run folder's lock, and only then writes: `train_config.json`,
`log.jsonl`, `checkpoints/step-NNNNNNNN/` (the layout is in `musegen.run_folder`), `valid/`
(per-position NLL CSV + PNG), and `tensorboard/` when TensorBoard is installed.

Reproducibility: randomness inside a step (dropout, SPE noise, feature redraws) is reseeded from
(seed, step, micro-batch chunk) and the data from (seed, sample position), so a resumed run,
or one on another number of processes with the same global batch, repeats the same updates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from . import schemas
from .checkpoint import load_checkpoint, read_checkpoint_config
from .data import CROP_CHOICES, SAMPLING_CHOICES, Augmenter, CropDataset, StepBatches, derive_seed
from .device import check_fits, resolve_device
from .errors import CheckpointError, ConfigError, DataError, TrainingError
from .evaluation.loss import position_nll, summarize
from .evaluation.report import write_position_nll
from .io import write_json
from .model import MusicPerformer
from .model.config import ModelConfig, preset, replace_checked
from .precision import Choice, training_choice
from .run_folder import (
    RUN_CONFIG,
    RunLock,
    RunLog,
    TrainingState,
    clean_leftovers,
    latest_checkpoint,
    state_is_finite,
    write_checkpoint,
)
from .shards import Shards, resolve_split
from .tokenizers.base import Tokenizer

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
        checks = [
            (self.sampling in SAMPLING_CHOICES, f"sampling must be one of {SAMPLING_CHOICES}, got {self.sampling!r}"),
            (self.crop in CROP_CHOICES + ("auto",), f"crop must be 'auto' or one of {CROP_CHOICES}, got {self.crop!r}"),
            (self.optimizer in ("adam", "adamw"), f"optimizer must be 'adam' or 'adamw', got {self.optimizer!r}"),
            (
                self.precision in ("auto", "fp32", "bf16"),
                f"precision must be auto, fp32 or bf16, got {self.precision!r}",
            ),
        ]
        for key, (low, high) in LIMITS.items():
            value = getattr(self, key)
            checks.append(
                (low <= value <= high, f"{key} must be in {format_limit(low)}..{format_limit(high)}, got {value!r}")
            )
        checks.append((self.lr_floor <= self.lr, f"lr_floor {self.lr_floor!r} must not exceed lr {self.lr!r}"))
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- building the config ---------------------------------------------------------------------


def build_config(
    preset_name: str | None,
    data: str | os.PathLike,
    out: str | os.PathLike,
    config_file: str | os.PathLike | None = None,
    sets: Iterable[str] = (),
    device: str | None = None,
    init: str | os.PathLike | None = None,
) -> TrainConfig:
    """The model: the preset (default "small"), the YAML file's `model:` mapping, then each
    `--set model.<field>`; with `init`, the checkpoint's model instead, which those may repeat
    but not contradict. The rest: defaults, the YAML file's top level, each `--set`, `device`.
    Settings of one layer are applied together, so settings that must agree can come in any order."""
    top, model_file = _read_config_file(config_file)
    top_sets, model_sets = _parse_sets(sets)
    model_settings = {**model_file, **model_sets}
    if init is None:
        name = preset_name or "small"
        model = replace_checked(preset(name), model_settings)
    else:
        model, name = _model_of_init(Path(init), preset_name, model_settings)
    settings = {**top, **top_sets, "preset": name, "data": str(data), "out": str(out), "init": str(init or "")}
    if device is not None:
        settings["device"] = device
    return replace_checked(TrainConfig(model=model), settings)


def _read_config_file(path: str | os.PathLike | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(top-level settings, `model:` mapping) of a YAML file."""
    if path is None:
        return {}, {}
    checked = schemas.read_yaml(path, "train settings").model_dump()
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


def _model_of_init(init: Path, preset_name: str | None, explicit: dict[str, Any]) -> tuple[ModelConfig, str]:
    """The `--init` checkpoint's model config and preset name; a preset or model setting that
    differs from it is an error (the weights fix the model)."""
    model, meta = read_checkpoint_config(init)
    if preset_name is not None:
        wanted = preset(preset_name)
        differ = [k for k in wanted.to_dict() if k != "vocab_size" and getattr(wanted, k) != getattr(model, k)]
        if differ:
            raise ConfigError(
                f"--preset {preset_name} contradicts the --init checkpoint's model ({differ[0]}: "
                f"{getattr(wanted, differ[0])!r} vs {getattr(model, differ[0])!r}); leave it out"
            )
    replace_checked(model, explicit)  # unknown settings and wrong types: the usual errors
    for key, value in explicit.items():
        if getattr(model, key) != value:
            raise ConfigError(
                f"model.{key}={value!r} contradicts the --init checkpoint's {key}="
                f"{getattr(model, key)!r}; the model comes from the checkpoint"
            )
    meta_preset = meta.get("preset") if isinstance(meta, dict) else None
    return model, preset_name or (meta_preset if isinstance(meta_preset, str) else "")


def next_token_nll(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Summed NLL of `targets` [B, N] under `logits` [B, N, vocab], in fp32. Flattened so that the
    log-softmax runs over contiguous rows (over a [B, vocab, N] view it copies the logits twice)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index, reduction="sum"
    )


def make_optimizer(params, name: str, lr: float, weight_decay: float, device: torch.device) -> torch.optim.Optimizer:
    """Adam or AdamW; the fused kernel where torch has one (CPU, CUDA): one pass over every
    parameter instead of about ten small operations each (on CPU, 2 ms against 10 ms an update
    for the small preset)."""
    optim_cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    return optim_cls(params, lr=lr, weight_decay=weight_decay, fused=device.type in ("cpu", "cuda"))


def lr_factor(update: int, warmup: int, total: int, floor_ratio: float) -> float:
    """Multiplier of the peak lr for 0-based `update`: linear warm-up, then cosine to the floor,
    reached by the last update (total - 1)."""
    if update < warmup:
        return (update + 1) / warmup
    progress = min(1.0, (update - warmup) / max(1, total - 1 - warmup))
    return floor_ratio + (1.0 - floor_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---- processes, signals, data ----------------------------------------------------------------


@dataclass
class Processes:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(tensor)
        return tensor

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def _setup_processes(device_setting: str) -> tuple[Processes, torch.device]:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; NCCL on GPUs, gloo on CPU."""
    procs = Processes(
        int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    )
    device = resolve_device(device_setting)
    if device.type == "cuda":
        if procs.world > 1:
            device = torch.device("cuda", procs.local_rank)
        torch.cuda.set_device(device)
    if procs.world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return procs, device


def _ignore_interrupts(_worker_id: int) -> None:
    """Data workers leave Ctrl-C and SIGTERM to the trainer, which checkpoints before it stops
    them: both reach the whole process group (a terminal, a job scheduler), and a worker that
    died of one would end the run with a DataLoader error instead of a checkpoint."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class _StopRequest:
    """SIGINT/SIGTERM set `requested`, which the loop reads between updates (never half an
    update). The first one also hands the signals back to their previous handlers, so that a
    second one stops the process at once, the usual way."""

    def __init__(self):
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopRequest":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous = {}

    def __exit__(self, *exc) -> None:
        self._restore()


@dataclass
class TrainingData:
    tokenizer: Tokenizer
    train: list[np.ndarray]  # pieces of two tokens or more
    valid: list[np.ndarray]  # the first `valid_pieces` of the validation split, if there is one


def load_training_data(cfg: TrainConfig) -> TrainingData:
    cfg.model.check_length(cfg.seq_len, "seq_len")
    cfg.model.check_length(cfg.valid_len, "valid_len")
    if not cfg.data:
        raise DataError("no data folder given")
    shards = Shards(cfg.data)
    train_pieces = [p for p in shards.pieces("train") if len(p) >= 2]
    if not train_pieces:
        raise DataError(f"{cfg.data}: the train split holds no pieces")
    valid_split = resolve_split(shards.splits, "valid")
    valid_pieces = shards.pieces(valid_split)[: cfg.valid_pieces] if valid_split else []
    return TrainingData(shards.tokenizer, train_pieces, valid_pieces)


def _resolve_batching(cfg: TrainConfig, world: int) -> tuple[int, int]:
    """(micro batch, accumulation) that keep the global batch for `world` processes."""
    if cfg.batch_size % world:
        raise ConfigError(f"batch_size {cfg.batch_size} is not divisible by the {world} processes")
    share = cfg.batch_size // world
    micro = cfg.micro_batch or share
    if share % micro:
        raise ConfigError(
            f"micro_batch {micro} does not divide the per-process batch {share} "
            f"(batch_size {cfg.batch_size} over {world} processes)"
        )
    return micro, share // micro


def _latest_or_refuse(run: Path) -> Path:
    source = latest_checkpoint(run)
    if source is None:
        raise CheckpointError(f"{run}: no checkpoint to resume from")
    return source


def _compatible_weights(folder: Path, tokenizer: Tokenizer, model_cfg: ModelConfig, data: str) -> dict[str, Any]:
    """A checkpoint's weights (fp32, whatever precision they were stored in), once its tokenizer
    and model are those of this run."""
    model, ckpt_tokenizer, ckpt_cfg, _ = load_checkpoint(folder)
    if ckpt_tokenizer.to_dict() != tokenizer.to_dict():
        raise CheckpointError(
            f"{folder}: trained on another tokenizer ({ckpt_tokenizer.kind}, "
            f"{ckpt_tokenizer.vocab_size} tokens) than the data in {data} "
            f"({tokenizer.kind}, {tokenizer.vocab_size} tokens)"
        )
    differ = [k for k, v in ckpt_cfg.to_dict().items() if model_cfg.to_dict().get(k) != v]
    if differ:
        raise ConfigError(f"{folder}: the checkpoint's model differs from this config in {', '.join(differ)}")
    return model.state_dict()


# ---- the run ---------------------------------------------------------------------------------


def train(cfg: TrainConfig, resume: bool = False, command: str = "") -> dict[str, Any]:
    """Train per `cfg`. Returns {"step", "loss", "checkpoint", "valid", "nonfinite", "stopped"}
    of the last update; `stopped` is True when a stop request (Ctrl-C, SIGTERM) ended the run
    early, after a checkpoint. A run that diverges raises TrainingError."""
    procs, device = _setup_processes(cfg.device)
    try:
        data = load_training_data(cfg)
        model_cfg = dataclasses.replace(cfg.model, vocab_size=data.tokenizer.vocab_size)  # the data decides
        _check_model_fits(model_cfg, device)
        init = None
        if cfg.init and not resume:
            init = _compatible_weights(Path(cfg.init), data.tokenizer, model_cfg, cfg.data)
        if resume:
            _latest_or_refuse(Path(cfg.out))  # before the lock creates the folder
        with RunLock(Path(cfg.out), enabled=procs.main):
            return Trainer(cfg, procs, device, data, model_cfg, init, resume, command).run()
    finally:
        if procs.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _check_model_fits(model_cfg: ModelConfig, device: torch.device) -> None:
    """ResourceError before the model is built when its weights, gradients and Adam's two moments
    (16 bytes a parameter, activations not counted) cannot fit; counted on the meta device."""
    with torch.device("meta"):
        params = sum(p.numel() for p in MusicPerformer(model_cfg).parameters())
    check_fits(16 * params, f"training a model of {params:,} parameters", device, "choose a smaller model")


class Trainer:
    """One process's share of a run: `__init__` sets up (resume state, model, optimiser, data,
    run folder), `run()` trains to `cfg.steps` updates or a stop request."""

    def __init__(
        self,
        cfg: TrainConfig,
        procs: Processes,
        device: torch.device,
        data: TrainingData,
        model_cfg: ModelConfig,
        init: dict[str, Any] | None,
        resume: bool,
        command: str,
    ):
        self.cfg, self.procs, self.device, self.command = cfg, procs, device, command
        self.run_dir, self.tokenizer, self.model_cfg = Path(cfg.out), data.tokenizer, model_cfg
        self.valid_pieces = data.valid
        self.micro, self.accumulation = _resolve_batching(cfg, procs.world)
        # Everything is read and checked before the first write (and all ranks must agree).
        source = _latest_or_refuse(self.run_dir) if resume else self._refuse_used_folder()
        self._build(init)
        self.step, self.counters = 0, {"nonfinite_total": 0, "nonfinite_streak": 0, "tokens_seen": 0}
        if source is not None:
            self._restore(source)
        procs.barrier()
        self.net = self._wrap()
        self.loader = self._make_loader(data.train)
        self.precision = self._choose_precision()
        self.bf16 = self.precision.bf16
        self.latest, self.last_loss, self.rate = source, math.nan, None
        self.valid_result: dict[str, Any] | None = None
        self.stopped = False
        self._open_run_folder(source)

    # -- set-up and resume --

    def _choose_precision(self) -> Choice:
        """What cfg.precision means here (musegen.precision: "auto" timed once per machine and
        shape). Rank 0 decides for all ranks, so that they run alike."""
        cfg, procs = self.cfg, self.procs
        choice = (
            training_choice(cfg.precision, self.model_cfg, self.micro, cfg.seq_len, self.device) if procs.main else None
        )
        if procs.world > 1:  # the other ranks wait here while rank 0 times
            bf16 = torch.tensor([choice.bf16 if procs.main else 0], dtype=torch.int32, device=self.device)
            dist.broadcast(bf16, src=0)
            choice = choice or Choice("bf16" if bool(bf16) else "fp32", "rank 0's choice")
        return choice

    def _refuse_used_folder(self) -> None:
        if latest_checkpoint(self.run_dir) is not None:
            raise ConfigError(
                f"{self.run_dir} already holds checkpoints: add --resume to continue it, or choose another --out"
            )

    def _build(self, init: dict[str, Any] | None) -> None:
        cfg = self.cfg
        torch.manual_seed(derive_seed(cfg.seed, 0))  # the same initial weights on every process
        self.raw = MusicPerformer(self.model_cfg).to(self.device)
        if init is not None:
            self.raw.load_state_dict(init)
        self.optimizer = make_optimizer(self.raw.parameters(), cfg.optimizer, cfg.lr, cfg.weight_decay, self.device)
        floor_ratio = cfg.lr_floor / cfg.lr
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda u: lr_factor(u, cfg.warmup, cfg.steps, floor_ratio)
        )

    def _restore(self, source: Path) -> None:
        """Load the checkpoint's weights and trainer state, all checked before anything is set."""
        weights = _compatible_weights(source, self.tokenizer, self.model_cfg, self.cfg.data)
        state = TrainingState.read(source, self.optimizer, self.scheduler)
        self.raw.load_state_dict(weights)
        state.apply(self.optimizer, self.scheduler)
        self.step, self.counters = state.step, dict(state.counters)
        self._apply_schedule_settings()

    def _apply_schedule_settings(self) -> None:
        """This run's lr, schedule and weight decay replace the checkpoint's (the optimiser's
        moments and the update count carry over): `--set lr=...` on resume takes effect."""
        cfg = self.cfg
        factor = lr_factor(self.step, cfg.warmup, cfg.steps, cfg.lr_floor / cfg.lr)
        for group in self.optimizer.param_groups:
            group.update(lr=cfg.lr * factor, initial_lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.scheduler.base_lrs = [cfg.lr for _ in self.optimizer.param_groups]

    def _wrap(self) -> torch.nn.Module:
        net: torch.nn.Module = self.raw
        if self.procs.world > 1:
            net = torch.nn.parallel.DistributedDataParallel(
                self.raw, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        return torch.compile(net) if self.cfg.compile else net

    def _make_loader(self, pieces: list[np.ndarray]) -> torch.utils.data.DataLoader:
        cfg, procs = self.cfg, self.procs
        crop = cfg.crop if cfg.crop != "auto" else self.tokenizer.default_crop
        augmenter = Augmenter.for_tokenizer(self.tokenizer) if cfg.augment else None
        dataset = CropDataset(pieces, cfg.seq_len, self.tokenizer.pad_id, cfg.seed, augmenter, crop)
        batches = StepBatches(
            [len(p) for p in pieces],
            cfg.seq_len,
            self.micro,
            self.accumulation,
            procs.rank,
            procs.world,
            cfg.seed,
            cfg.sampling,
            self.step,
        )
        return torch.utils.data.DataLoader(
            dataset,
            batch_sampler=batches,
            num_workers=cfg.workers,
            pin_memory=self.device.type == "cuda",
            worker_init_fn=_ignore_interrupts if cfg.workers else None,
            persistent_workers=False,
        )

    def _open_run_folder(self, source: Path | None) -> None:
        """The first writes: the run's config, the log's start (or resume) entry, the step-0 checkpoint."""
        cfg, procs = self.cfg, self.procs
        if procs.main:
            clean_leftovers(self.run_dir)
            write_json(
                self.run_dir / RUN_CONFIG,
                {
                    "config": cfg.to_dict(),
                    "command": self.command,
                    "world_size": procs.world,
                    "micro_batch": self.micro,
                    "accumulation": self.accumulation,
                    "resumed_from": str(source) if source else None,
                    "init": cfg.init or None,
                },
            )
        self.log = RunLog(self.run_dir, procs.main, self.step if source is not None else None)
        record = {
            "step": self.step,
            "event": "resume" if source else "start",
            "command": self.command,
            "parameters": self.raw.num_parameters(),
            "world_size": procs.world,
            "precision": self.precision.record(),
        }
        if cfg.init:
            record["init"] = cfg.init
        if self.log.dropped:
            record["log_lines_dropped"] = self.log.dropped  # cut short by a full disk or a kill
        self.log.write(record)
        if source is None:
            self._checkpoint()

    # -- training --

    def run(self) -> dict[str, Any]:
        bar = tqdm(
            total=self.cfg.steps, initial=self.step, disable=not self.procs.main, unit="step", dynamic_ncols=True
        )
        batches = iter(self.loader)
        self.raw.train()
        try:
            with _StopRequest() as stop:
                while self.step < self.cfg.steps and not self.stopped:
                    self._train_step(batches, stop, bar)
        finally:
            bar.close()
            self.log.close()
            del batches
        streak = self.counters["nonfinite_streak"]
        if streak and not self.stopped:
            self._diverged(f"the run ended diverged: its last {streak} updates were non-finite and skipped")
        return {
            "step": self.step,
            "loss": self.last_loss,
            "checkpoint": str(self.latest) if self.latest else None,
            "valid": self.valid_result,
            "nonfinite": self.counters["nonfinite_total"],
            "stopped": self.stopped,
        }

    def _train_step(self, batches: Iterator[torch.Tensor], stop: _StopRequest, bar: tqdm) -> None:
        """One update, or the checkpoint that answers a stop request; then logs, validation and
        checkpoints as scheduled."""
        cfg, started = self.cfg, time.perf_counter()
        micro_batches = [next(batches).to(self.device, non_blocking=True) for _ in range(self.accumulation)]
        local = sum(int((mb[:, 1:] != self.tokenizer.pad_id).sum()) for mb in micro_batches)
        shared = self.procs.sum(torch.tensor([float(local), float(stop.requested)], device=self.device))
        if shared[1] > 0:  # every process stops at the same update
            self._checkpoint()
            self.log.write({"step": self.step, "event": "stopped", "reason": "stop request"})
            self.stopped = True
            return
        n_tokens = max(1.0, float(shared[0]))
        loss, grad_norm, lr = self._update(micro_batches, n_tokens)
        self._report(bar, loss, lr, grad_norm, n_tokens / (time.perf_counter() - started))
        if self.counters["nonfinite_streak"] >= cfg.max_nonfinite:
            self._diverged(
                f"the loss was non-finite {self.counters['nonfinite_streak']} updates in a row "
                f"(step {self.step}); stopped"
            )
        last = self.step == cfg.steps
        if cfg.valid_every and (self.step % cfg.valid_every == 0 or last):
            self._validate()
        if self.step % cfg.ckpt_every == 0 or last:
            self._checkpoint()

    def _update(self, micro_batches: list[torch.Tensor], n_tokens: float) -> tuple[float, float, float]:
        """Forward and backward over the micro-batches, then the optimiser step unless the loss or
        the gradient is non-finite (that update is skipped and counted). Returns (loss, grad norm, lr)."""
        cfg, procs, step = self.cfg, self.procs, self.step
        torch.manual_seed(derive_seed(cfg.seed, 4, step))
        self.raw.on_train_step(step)
        total = torch.zeros((), device=self.device)
        for a, mb in enumerate(micro_batches):
            torch.manual_seed(derive_seed(cfg.seed, 5, step, a * procs.world + procs.rank))
            sync = (
                self.net.no_sync()
                if procs.world > 1 and a < self.accumulation - 1 and hasattr(self.net, "no_sync")
                else contextlib.nullcontext()
            )
            with sync, torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.net(mb[:, :-1])
                nll = next_token_nll(logits, mb[:, 1:], self.tokenizer.pad_id)
                # DDP averages gradients over processes: scale so the result is the
                # gradient of the mean over every real target token of the global batch
                (nll * (procs.world / n_tokens)).backward()
            total += nll.detach()
        loss = float(procs.sum(total)) / n_tokens
        clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.raw.parameters(), clip))
        lr = self.optimizer.param_groups[0]["lr"]
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        if finite:
            self.optimizer.step()
            self.last_loss = loss
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        self.counters["nonfinite_streak"] = 0 if finite else self.counters["nonfinite_streak"] + 1
        self.counters["nonfinite_total"] += not finite
        self.counters["tokens_seen"] += int(n_tokens)
        return loss, grad_norm, lr

    def _report(self, bar: tqdm, loss: float, lr: float, grad_norm: float, speed: float) -> None:
        self.rate = speed if self.rate is None else 0.9 * self.rate + 0.1 * speed
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{self.rate:,.0f}", refresh=False)
        if self.step % self.cfg.log_every == 0 or self.step == self.cfg.steps:
            self.log.write(
                {
                    "step": self.step,
                    "loss": loss,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens_per_s": speed,
                    "tokens": self.counters["tokens_seen"],
                    "nonfinite": self.counters["nonfinite_total"],
                    "time": time.time(),
                }
            )

    def _validate(self) -> None:
        if not self.procs.main or not self.valid_pieces:
            return
        cfg, step = self.cfg, self.step
        valid_len = cfg.valid_len or min(2 * cfg.seq_len, self.model_cfg.max_positions or 2 * cfg.seq_len)
        sums, counts = position_nll(
            self.raw, self.valid_pieces, valid_len, self.tokenizer.pad_id, seed=derive_seed(cfg.seed, 3)
        )
        self.valid_result = summarize(sums, counts, cfg.seq_len)
        write_position_nll(
            self.run_dir / "valid",
            f"step-{step:08d}",
            sums,
            counts,
            cfg.seq_len,
            title=f"validation NLL at step {step}",
        )
        self.log.write(
            {
                "step": step,
                "valid_loss": self.valid_result["within"],
                "valid_extrapolation": self.valid_result["extrapolation"],
            }
        )

    def _checkpoint(self) -> None:
        """Write this step's checkpoint (main process), unless the state went non-finite: such a
        checkpoint is never written, so every one on disk is good and pruning keeps the newest."""
        if not state_is_finite(self.raw, self.optimizer):
            self._diverged(f"the weights or optimiser moments became non-finite by step {self.step}; not saved")
        if not self.procs.main:
            return
        cfg, loss = self.cfg, self.last_loss
        meta = {
            "train_len": cfg.seq_len,
            "preset": cfg.preset,
            "data": cfg.data,
            "tokenizer": self.tokenizer.kind,
            "step": self.step,
            "train_loss": loss if math.isfinite(loss) else None,
        }  # JSON has no NaN
        if cfg.init:
            meta["init"] = cfg.init
        self.latest = write_checkpoint(
            self.run_dir,
            self.step,
            self.raw,
            self.model_cfg,
            self.tokenizer,
            self.optimizer,
            self.scheduler,
            self.counters,
            meta,
            cfg.keep,
        )

    def _diverged(self, what: str) -> None:
        self.log.write({"step": self.step, "event": "stopped", "reason": "non-finite"})
        raise TrainingError(f"{what}; last good checkpoint: {self.latest}")
