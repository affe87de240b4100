"""The training loop: schedule, resumable checkpoints, validation, logs, DistributedDataParallel.

A run folder holds:
- `train_config.json`: the TrainConfig and the command line that started (or resumed) the run;
- `checkpoints/step-NNNNNNNN/`: self-contained checkpoints (`musegen.checkpoint` files) plus
  `trainer_state.safetensors` (optimiser tensors, RNG states) and `trainer_state.json`
  (step, counters, optimiser groups, scheduler). Each is built in a hidden temporary folder and
  renamed into place, and old ones are pruned only after a new one landed, so from the step-0
  checkpoint on the folder always holds a complete one;
- `log.jsonl` (every logged step, validations, starts), `valid/` (per-position NLL CSV + PNG),
  `tensorboard/` when TensorBoard is installed.

Reproducibility: randomness inside a step (dropout, SPE noise, feature redraws) is reseeded from
(seed, step, micro-batch chunk) and the data from (seed, sample position), so a resumed run,
or one on another number of processes with the same global batch, repeats the same updates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .checkpoint import load_checkpoint, read_checkpoint_config, save_checkpoint
from .device import resolve_device, use_bf16
from .data import CROP_CHOICES, SAMPLING_CHOICES, Augmenter, CropDataset, StepBatches, derive_seed
from .errors import CheckpointError, ConfigError, DataError, TrainingError
from .io import read_json, write_json, write_text
from .model.config import ModelConfig, preset, replace_checked
from .shards import resolve_split

CHECKPOINTS = "checkpoints"
STATE_JSON, STATE_TENSORS = "trainer_state.json", "trainer_state.safetensors"
LOG = "log.jsonl"
RUN_CONFIG = "train_config.json"


@dataclass
class TrainConfig:
    """Every setting of a run. `--set key=value` reaches these fields (`model.<field>` the model's)."""

    model: ModelConfig = field(default_factory=lambda: preset("small"))
    preset: str = "small"
    data: str = ""
    out: str = ""
    # data
    seq_len: int = 2048  # training crop length (tokens fed to the model)
    sampling: str = "piece"  # "piece": one crop per piece per epoch | "length": pieces drawn by length
    crop: str = "auto"  # "random" | "start" | "auto": random for REMI, start for groove (the paper's)
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
    precision: str = "auto"  # "auto" (bf16 autocast where the device computes bf16 natively) | "fp32" | "bf16"
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
            (self.precision in ("auto", "fp32", "bf16"), f"precision must be auto, fp32 or bf16, got {self.precision!r}"),
            (min(self.seq_len, self.steps, self.batch_size, self.ckpt_every, self.keep, self.log_every,
                 self.max_nonfinite) > 0,
             "seq_len, steps, batch_size, ckpt_every, keep, log_every and max_nonfinite must be positive"),
            (min(self.micro_batch, self.workers, self.warmup, self.valid_every, self.valid_len,
                 self.valid_pieces, self.seed) >= 0, "counts and the seed must not be negative"),
            (self.lr > 0 and 0 <= self.lr_floor <= self.lr, "need lr > 0 and 0 <= lr_floor <= lr"),
            (self.grad_clip >= 0 and self.weight_decay >= 0, "grad_clip and weight_decay must not be negative"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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


def build_config(preset_name: str, data: str | os.PathLike, out: str | os.PathLike,
                 config_file: str | os.PathLike | None = None, sets: Iterable[str] = (),
                 device: str | None = None) -> TrainConfig:
    """Preset, then the YAML file (top-level fields and a `model:` mapping), then each `--set`."""
    import yaml

    model = preset(preset_name)
    top: dict[str, Any] = {}
    if config_file is not None:
        try:
            loaded = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ConfigError(f"{config_file}: cannot read ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{config_file}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(loaded, dict) or not isinstance(loaded.get("model", {}), dict):
            raise ConfigError(f"{config_file}: expected a mapping of settings (and a `model:` mapping)")
        model = replace_checked(model, loaded.pop("model", {}))
        top = loaded
    cfg = replace_checked(TrainConfig(model=model), {**top, "preset": preset_name, "data": str(data), "out": str(out)})
    model_sets: dict[str, Any] = {}  # applied together: settings that must agree (attention and pe)
    for item in sets:                # may then come in any order
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key = key.strip()
        if key.startswith("model."):
            name = key[len("model."):]
            model_sets[name] = _parse_value(cfg.model, name, text)
        else:
            cfg = replace_checked(cfg, {key: _parse_value(cfg, key, text)})
    cfg = replace_checked(cfg, {"model": replace_checked(cfg.model, model_sets)})
    if device is not None:
        cfg = replace_checked(cfg, {"device": device})
    return cfg


def lr_factor(update: int, warmup: int, total: int, floor_ratio: float) -> float:
    """Multiplier of the peak lr for 0-based `update`: linear warm-up, then cosine to the floor,
    reached by the last update (total - 1)."""
    if update < warmup:
        return (update + 1) / warmup
    progress = min(1.0, (update - warmup) / max(1, total - 1 - warmup))
    return floor_ratio + (1.0 - floor_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---- checkpoint folders ----------------------------------------------------------------------

def checkpoint_dirs(run: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, folder) of the run's checkpoint folders, oldest first (complete or not)."""
    root = Path(run) / CHECKPOINTS
    found = []
    for path in root.glob("step-*") if root.is_dir() else []:
        suffix = path.name[len("step-"):]
        if suffix.isdigit() and path.is_dir():
            found.append((int(suffix), path))
    return sorted(found)


def is_complete(folder: Path) -> bool:
    files = ("model.safetensors", "config.json", "tokenizer.json", STATE_JSON, STATE_TENSORS)
    return all((folder / f).is_file() for f in files)


def latest_checkpoint(run: str | os.PathLike) -> Path | None:
    """The newest checkpoint whose config reads back and whose files are all present."""
    for _, folder in reversed(checkpoint_dirs(run)):
        try:
            read_checkpoint_config(folder)
        except CheckpointError:
            continue
        if is_complete(folder):
            return folder
    return None


def _optimizer_to_files(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, slots in state["state"].items():
        for name, value in slots.items():
            if torch.is_tensor(value):
                tensors[f"optim.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_from_files(tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            index, name = key[len("optim."):].split(".", 1)
            state.setdefault(int(index), {})[name] = value
    for key, value in info["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": info["param_groups"]}


def write_checkpoint(run: Path, step: int, model: torch.nn.Module, model_cfg: ModelConfig, tokenizer,
                     optimizer, scheduler, counters: dict[str, Any], meta: dict[str, Any], keep: int) -> Path:
    """Build the checkpoint in a hidden folder, rename it into place, then prune to `keep`."""
    from safetensors.torch import save_file

    root = run / CHECKPOINTS
    final = root / f"step-{step:08d}"
    if final.exists():
        return final
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(tmp, model, model_cfg, tokenizer, meta)
    tensors, optim_info = _optimizer_to_files(optimizer)
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    save_file(tensors, str(tmp / STATE_TENSORS))
    write_json(tmp / STATE_JSON, {"step": step, **counters, "optimizer": optim_info,
                                  "scheduler": scheduler.state_dict()})
    _fsync_dir(tmp)
    os.rename(tmp, final)
    _fsync_dir(root)
    complete = [path for _, path in checkpoint_dirs(run) if is_complete(path)]
    for old in complete[:-keep]:
        trash = root / f".trash-{old.name}-{os.getpid()}"
        os.rename(old, trash)  # one atomic step out of sight, then the slow delete
        shutil.rmtree(trash, ignore_errors=True)
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _clean_leftovers(run: Path) -> None:
    """Temporary and half-deleted folders of a killed run; never a complete checkpoint."""
    root = run / CHECKPOINTS
    for path in root.glob(".tmp-step-*") if root.is_dir() else []:
        shutil.rmtree(path, ignore_errors=True)
    for path in root.glob(".trash-*") if root.is_dir() else []:
        shutil.rmtree(path, ignore_errors=True)


# ---- processes and devices -------------------------------------------------------------------

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
    procs = Processes(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                      int(os.environ.get("LOCAL_RANK", 0)))
    device = resolve_device(device_setting)
    if device.type == "cuda":
        if procs.world > 1:
            device = torch.device("cuda", procs.local_rank)
        torch.cuda.set_device(device)
    if procs.world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return procs, device


def _ignore_interrupts(_worker_id: int) -> None:
    """Data workers leave Ctrl-C to the trainer, which checkpoints before it stops them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _StopRequest:
    """SIGINT/SIGTERM set a flag read between updates (never half an update); a second one
    interrupts at once."""

    def __init__(self):
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# ---- the run ---------------------------------------------------------------------------------

class _Log:
    """log.jsonl (and TensorBoard when installed) on the main process; nothing elsewhere."""

    def __init__(self, run: Path, enabled: bool, resume_step: int | None):
        self.path, self.enabled, self.tb = run / LOG, enabled, None
        if not enabled:
            return
        if resume_step is not None and self.path.is_file():
            # entries past the checkpoint belong to updates that are about to be redone
            kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            write_text(self.path, "".join(line + "\n" for line in kept))
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(run / "tensorboard"), purge_step=resume_step)
        except ImportError:
            pass

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None and "step" in record:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _resolve_batching(cfg: TrainConfig, world: int) -> tuple[int, int]:
    """(micro batch, accumulation) that keep the global batch for `world` processes."""
    if cfg.batch_size % world:
        raise ConfigError(f"batch_size {cfg.batch_size} is not divisible by the {world} processes")
    share = cfg.batch_size // world
    micro = cfg.micro_batch or share
    if share % micro:
        raise ConfigError(f"micro_batch {micro} does not divide the per-process batch {share} "
                          f"(batch_size {cfg.batch_size} over {world} processes)")
    return micro, share // micro


def _model_differences(a: ModelConfig, b: ModelConfig) -> list[str]:
    return [k for k, v in a.to_dict().items() if b.to_dict().get(k) != v]


def train(cfg: TrainConfig, resume: bool = False, command: str = "") -> dict[str, Any]:
    """Train per `cfg`; returns {"step", "loss", "checkpoint", "valid"} of the last update."""
    from .model import MusicPerformer
    from .shards import Shards

    procs, device = _setup_processes(cfg.device)
    try:
        return _train(cfg, resume, command, procs, device, MusicPerformer, Shards)
    finally:
        if procs.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _train(cfg, resume, command, procs, device, MusicPerformer, Shards) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    cfg.model.check_length(cfg.seq_len, "seq_len")
    cfg.model.check_length(cfg.valid_len, "valid_len")
    if not cfg.data:
        raise DataError("no data folder given")
    shards = Shards(cfg.data)
    tokenizer = shards.tokenizer
    train_pieces = [p for p in shards.pieces("train") if len(p) >= 2]
    if not train_pieces:
        raise DataError(f"{cfg.data}: the train split holds no pieces")
    valid_split = resolve_split(shards.splits, "valid")
    valid_pieces = shards.pieces(valid_split)[:cfg.valid_pieces] if valid_split else []
    model_cfg = dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size)  # the data decides
    micro, accumulation = _resolve_batching(cfg, procs.world)
    run = Path(cfg.out)

    # Decide fresh start or resume before anything is written (all ranks must agree).
    source = None
    if resume:
        source = latest_checkpoint(run)
        if source is None:
            raise CheckpointError(f"{run}: no checkpoint to resume from")
        ckpt_model, ckpt_tokenizer, ckpt_cfg, _ = load_checkpoint(source)
        if ckpt_tokenizer.to_dict() != tokenizer.to_dict():
            raise CheckpointError(f"{source}: trained on another tokenizer ({ckpt_tokenizer.kind}, "
                                  f"{ckpt_tokenizer.vocab_size} tokens) than the data in {cfg.data} "
                                  f"({tokenizer.kind}, {tokenizer.vocab_size} tokens)")
        differ = _model_differences(ckpt_cfg, model_cfg)
        if differ:
            raise ConfigError(f"{source}: the checkpoint's model differs from this config in {', '.join(differ)}")
    elif latest_checkpoint(run) is not None:
        raise ConfigError(f"{run} already holds checkpoints: add --resume to continue it, or choose another --out")
    procs.barrier()

    torch.manual_seed(derive_seed(cfg.seed, 0))  # the same initial weights on every process
    raw = MusicPerformer(model_cfg).to(device)
    decay = cfg.weight_decay
    optim_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    optimizer = optim_cls(raw.parameters(), lr=cfg.lr, weight_decay=decay)
    floor_ratio = cfg.lr_floor / cfg.lr
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda u: lr_factor(u, cfg.warmup, cfg.steps, floor_ratio))
    counters = {"nonfinite_total": 0, "nonfinite_streak": 0, "tokens_seen": 0}
    start_step = 0
    if source is not None:
        raw.load_state_dict(ckpt_model.state_dict())
        try:  # a tampered or truncated state must be refused in one line, before anything is written
            state = read_json(source / STATE_JSON)
            tensors = load_file(str(source / STATE_TENSORS))
            optimizer.load_state_dict(_optimizer_from_files(tensors, state["optimizer"]))
            scheduler.load_state_dict(state["scheduler"])
            torch.set_rng_state(tensors["rng.torch"])
            start_step = int(state["step"])
        except (SafetensorError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as exc:
            raise CheckpointError(f"{source}: unreadable training state ({type(exc).__name__}: {exc})") from None
        counters = {k: state.get(k, v) for k, v in counters.items()}

    net: torch.nn.Module = raw
    if procs.world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            raw, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        net = torch.compile(net)

    crop = cfg.crop if cfg.crop != "auto" else ("start" if tokenizer.kind == "groove" else "random")
    augmenter = Augmenter.for_tokenizer(tokenizer) if cfg.augment else None
    dataset = CropDataset(train_pieces, cfg.seq_len, tokenizer.pad_id, cfg.seed, augmenter, crop)
    batches = StepBatches([len(p) for p in train_pieces], cfg.seq_len, micro, accumulation,
                          procs.rank, procs.world, cfg.seed, cfg.sampling, start_step)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=batches, num_workers=cfg.workers, pin_memory=device.type == "cuda",
        worker_init_fn=_ignore_interrupts if cfg.workers else None,
        persistent_workers=False)

    bf16 = use_bf16(cfg.precision, device)
    pad = tokenizer.pad_id
    valid_len = cfg.valid_len or min(2 * cfg.seq_len, model_cfg.max_positions or 2 * cfg.seq_len)
    meta_base = {"train_len": cfg.seq_len, "preset": cfg.preset, "data": cfg.data, "tokenizer": tokenizer.kind}
    last_loss = float("nan")

    def checkpoint(step: int) -> Path | None:
        if not procs.main:
            return None
        return write_checkpoint(run, step, raw, model_cfg, tokenizer, optimizer, scheduler, counters,
                                {**meta_base, "step": step,  # JSON has no NaN: no loss yet is null
                                 "train_loss": last_loss if math.isfinite(last_loss) else None}, cfg.keep)

    valid_result: dict[str, Any] | None = None

    def validate(step: int) -> None:
        nonlocal valid_result
        if not procs.main or not valid_pieces:
            return
        from .metrics.loss import position_nll, summarize, write_position_nll

        sums, counts = position_nll(raw, valid_pieces, valid_len, pad, seed=derive_seed(cfg.seed, 3))
        valid_result = summarize(sums, counts, cfg.seq_len)
        write_position_nll(run / "valid", f"step-{step:08d}", sums, counts, cfg.seq_len,
                           title=f"validation NLL at step {step}")
        log.write({"step": step, "valid_loss": valid_result["within"],
                   "valid_extrapolation": valid_result["extrapolation"]})

    if procs.main:
        run.mkdir(parents=True, exist_ok=True)
        _clean_leftovers(run)
        write_json(run / RUN_CONFIG, {"config": cfg.to_dict(), "command": command, "world_size": procs.world,
                                      "micro_batch": micro, "accumulation": accumulation,
                                      "resumed_from": str(source) if source else None})
    log = _Log(run, procs.main, start_step if source is not None else None)
    log.write({"step": start_step, "event": "resume" if source else "start", "command": command,
               "parameters": raw.num_parameters(), "world_size": procs.world})
    latest = checkpoint(start_step) if source is None else source

    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=start_step, disable=not procs.main, unit="step", dynamic_ncols=True)
    data = iter(loader)
    rate = None
    step = start_step
    raw.train()
    try:
        with _StopRequest() as stop:
            while step < cfg.steps:
                t0 = time.perf_counter()
                micro_batches = [next(data).to(device, non_blocking=True) for _ in range(accumulation)]
                local = sum(int((mb[:, 1:] != pad).sum()) for mb in micro_batches)
                shared = procs.sum(torch.tensor([float(local), float(stop.requested)], device=device))
                if shared[1] > 0:
                    latest = checkpoint(step) or latest
                    raise KeyboardInterrupt
                n_tokens = max(1.0, float(shared[0]))
                torch.manual_seed(derive_seed(cfg.seed, 4, step))
                raw.on_train_step(step)
                total = torch.zeros((), device=device)
                for a, mb in enumerate(micro_batches):
                    torch.manual_seed(derive_seed(cfg.seed, 5, step, a * procs.world + procs.rank))
                    sync = (net.no_sync() if procs.world > 1 and a < accumulation - 1 and hasattr(net, "no_sync")
                            else contextlib.nullcontext())
                    with sync, torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                        logits = net(mb[:, :-1])
                        nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), mb[:, 1:].reshape(-1),
                                              ignore_index=pad, reduction="sum")
                        # DDP averages gradients over processes: scale so the result is the
                        # gradient of the mean over every real target token of the global batch
                        (nll * (procs.world / n_tokens)).backward()
                    total += nll.detach()
                loss = float(procs.sum(total)) / n_tokens
                clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
                grad_norm = float(torch.nn.utils.clip_grad_norm_(raw.parameters(), clip))
                lr = scheduler.get_last_lr()[0]
                if math.isfinite(loss) and math.isfinite(grad_norm):
                    optimizer.step()
                    counters["nonfinite_streak"] = 0
                    last_loss = loss
                else:
                    counters["nonfinite_total"] += 1
                    counters["nonfinite_streak"] += 1
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                step += 1
                counters["tokens_seen"] += int(n_tokens)
                if counters["nonfinite_streak"] >= cfg.max_nonfinite:
                    log.write({"step": step, "event": "stopped", "reason": "non-finite loss"})
                    raise TrainingError(f"the loss was non-finite {counters['nonfinite_streak']} updates in a row "
                                        f"(step {step}); stopped, last good checkpoint: {latest}")
                speed = n_tokens / (time.perf_counter() - t0)
                rate = speed if rate is None else 0.9 * rate + 0.1 * speed
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{rate:,.0f}", refresh=False)
                if step % cfg.log_every == 0 or step == cfg.steps:
                    log.write({"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                               "tokens_per_s": speed, "tokens": counters["tokens_seen"],
                               "nonfinite": counters["nonfinite_total"], "time": time.time()})
                if cfg.valid_every and (step % cfg.valid_every == 0 or step == cfg.steps):
                    validate(step)
                if step % cfg.ckpt_every == 0 or step == cfg.steps:
                    latest = checkpoint(step) or latest
    finally:
        bar.close()
        log.close()
        del data
    return {"step": step, "loss": last_loss, "checkpoint": str(latest) if latest else None,
            "valid": valid_result, "nonfinite": counters["nonfinite_total"]}
