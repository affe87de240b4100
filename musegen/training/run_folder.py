"""A training run's folder on disk: checkpoints with their trainer state, the log, the lock.

- `checkpoints/step-NNNNNNNN/`: a self-contained checkpoint (`musegen.checkpoint` files) plus
  `trainer_state.safetensors` (optimiser tensors, RNG states) and `trainer_state.json` (step,
  counters, optimiser groups, scheduler). Each is built in a hidden temporary folder and renamed
  into place, and old ones are pruned only after a new one landed, so from the step-0
  checkpoint on the folder always holds a complete one.
- `log.jsonl`: one JSON object a line, appended; a line cut short by a full disk or a kill is
  dropped when the next run opens the log.
- `.lock`: held (flock) by the run that writes the folder, so a second run refuses to start.
The trainer state is checked whole against the optimiser and scheduler it will be loaded into
before a resumed run writes anything.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, JsonValue
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .. import schemas
from ..checkpoint import read_checkpoint_config, save_checkpoint
from ..errors import CheckpointError, FormatError, TrainingError
from ..io import atomic_path, write_json, write_text

CHECKPOINTS = "checkpoints"
STATE_JSON, STATE_TENSORS = "trainer_state.json", "trainer_state.safetensors"
LOG = "log.jsonl"
RUN_CONFIG = "train_config.json"
LOCK = ".lock"
COUNTERS = ("nonfinite_total", "nonfinite_streak", "tokens_seen")


class TrainingState(BaseModel):
    """trainer_state.json beside a run's checkpoint (optimizer and scheduler: structure checked
    against the live objects when the state is loaded)."""

    model_config = schemas.OPEN
    step: schemas.Count
    nonfinite_total: schemas.Count
    nonfinite_streak: schemas.Count
    tokens_seen: schemas.Count
    optimizer: dict[str, JsonValue]
    scheduler: dict[str, JsonValue]


class LogRecord(BaseModel):
    """A line of a run's log.jsonl."""

    model_config = schemas.OPEN
    step: schemas.Count = 0


TRAINING_STATE = schemas.Format("training state", None, TrainingState)
LOG_RECORD = schemas.Format("log record", None, LogRecord)


# ---- checkpoint folders ----------------------------------------------------------------------


def recorded_name(folder: str | os.PathLike) -> str:
    """How a run's records name a folder: a run's checkpoint as `<run>/checkpoints/step-NNNNNNNN`,
    anything else (a data folder, a run, an exported model) by its own name; never an absolute path,
    which would mean nothing on another machine."""
    path = Path(folder).resolve()
    if path.parent.name == CHECKPOINTS and path.name.startswith("step-"):
        return f"{path.parent.parent.name}/{CHECKPOINTS}/{path.name}"
    return path.name


def checkpoint_dirs(run: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, folder) of the run's checkpoint folders, oldest first (complete or not)."""
    root = Path(run) / CHECKPOINTS
    found = []
    for path in root.glob("step-*") if root.is_dir() else []:
        suffix = path.name[len("step-") :]
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
        except (CheckpointError, FormatError):
            continue
        if is_complete(folder):
            return folder
    return None


def state_is_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """Every weight and optimiser moment is finite: the test a checkpoint must pass to be written."""
    tensors = [t for t in model.state_dict().values() if t.is_floating_point()]
    tensors += [
        t for slots in optimizer.state.values() for t in slots.values() if torch.is_tensor(t) and t.is_floating_point()
    ]
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def write_checkpoint(
    run: Path,
    step: int,
    model: torch.nn.Module,
    model_cfg,
    tokenizer,
    optimizer,
    scheduler,
    counters: dict[str, int],
    meta: dict[str, Any],
    keep: int,
) -> Path:
    """Build the checkpoint in a hidden folder, rename it into place, then prune to `keep`."""
    root = run / CHECKPOINTS
    final = root / f"step-{step:08d}"
    if final.exists():
        return final
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tensors, optim_info = optimizer_state_to_files(optimizer)
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    try:
        save_checkpoint(tmp, model, model_cfg, tokenizer, meta)
        with atomic_path(tmp / STATE_TENSORS) as path:
            save_file(tensors, str(path))
    except SafetensorError as exc:  # safetensors reports a full disk as its own error type
        found = re.search(r"os error (\d+)", str(exc))
        code = int(found.group(1)) if found else errno.EIO
        raise OSError(code, os.strerror(code), str(tmp)) from None
    write_json(
        tmp / STATE_JSON, {"step": step, **counters, "optimizer": optim_info, "scheduler": scheduler.state_dict()}
    )
    _fsync_dir(tmp)
    os.rename(tmp, final)
    _fsync_dir(root)
    complete = [path for _, path in checkpoint_dirs(run) if is_complete(path)]
    for old in complete[:-keep]:  # the newest, just written and checked finite, always stays
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


def clean_leftovers(run: Path) -> None:
    """Temporary and half-deleted folders of a killed run; never a complete checkpoint."""
    root = run / CHECKPOINTS
    for pattern in (".tmp-step-*", ".trash-*"):
        for path in root.glob(pattern) if root.is_dir() else []:
            shutil.rmtree(path, ignore_errors=True)


# ---- the trainer state beside a checkpoint --------------------------------------------------


def optimizer_state_to_files(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, slots in state["state"].items():
        for name, value in slots.items():
            if torch.is_tensor(value):
                tensors[f"optim.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_state_from_files(tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Per-parameter slots; ValueError on a malformed name."""
    state: dict[int, dict[str, Any]] = {}
    named = [(key[len("optim.") :], value) for key, value in tensors.items() if key.startswith("optim.")]
    for key, value in named + list(info["scalars"].items()):
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    return state


@dataclass
class TrainingState:
    """A checkpoint's trainer state, checked against the optimiser and scheduler it goes into."""

    step: int
    counters: dict[str, int]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: torch.Tensor

    @classmethod
    def read(cls, folder: Path, optimizer: torch.optim.Optimizer, scheduler) -> "TrainingState":
        """Read and check everything, or raise CheckpointError naming the first problem."""
        info = schemas.read(folder / STATE_JSON, TRAINING_STATE).model_dump()
        try:
            tensors = load_file(str(folder / STATE_TENSORS))
        except (OSError, SafetensorError, ValueError, UnicodeDecodeError, RecursionError) as exc:
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise CheckpointError(f"{folder}: unreadable training state ({type(exc).__name__}: {detail})") from None
        step = int(folder.name[len("step-") :])
        if "param_groups" in info["optimizer"]:
            info["optimizer"]["param_groups"] = _with_kernels_of(optimizer, info["optimizer"]["param_groups"])
        problem = (
            _info_problem(info, step)
            or _scheduler_problem(info["scheduler"], scheduler, step)
            or _tensor_names_problem(tensors)
            or _optimizer_problem(tensors, info["optimizer"], optimizer)
        )
        if problem:
            raise CheckpointError(f"{folder}: invalid training state: {problem}")
        return cls(
            step,
            {k: info[k] for k in COUNTERS},
            {
                "state": _optimizer_state_from_files(tensors, info["optimizer"]),
                "param_groups": info["optimizer"]["param_groups"],
            },
            info["scheduler"],
            tensors["rng.torch"],
        )

    def apply(self, optimizer: torch.optim.Optimizer, scheduler) -> None:
        optimizer.load_state_dict(self.optimizer)
        scheduler.load_state_dict(self.scheduler)
        torch.set_rng_state(self.rng)


def _info_problem(info: dict[str, Any], step: int) -> str | None:
    if info["step"] != step:
        return f"step {info['step']} in the folder of step {step}"
    if info["nonfinite_streak"] > info["nonfinite_total"]:
        return "more non-finite updates in a row than in total"
    return None


def _like(value: Any, reference: Any) -> bool:
    """`value` (read back from JSON) has the structure of `reference`: the same keys and lengths,
    the same types, finite numbers where numbers are."""
    if isinstance(reference, (bool, str)) or reference is None:
        return type(value) is type(reference)
    if isinstance(reference, int):
        return type(value) is int
    if isinstance(reference, float):
        return type(value) in (int, float) and math.isfinite(value)
    if isinstance(reference, (list, tuple)):
        return isinstance(value, (list, tuple)) and len(value) == len(reference) and all(map(_like, value, reference))
    if isinstance(reference, dict):
        return (
            isinstance(value, dict)
            and value.keys() == reference.keys()
            and all(_like(value[k], reference[k]) for k in reference)
        )
    return value == reference


def _scheduler_problem(saved: Any, scheduler, step: int) -> str | None:
    if not _like(saved, scheduler.state_dict()):
        return "the scheduler state does not fit this scheduler"
    if saved["last_epoch"] != step:
        return f"the scheduler is at update {saved['last_epoch']}, the checkpoint at step {step}"
    return None


def _tensor_names_problem(tensors: dict[str, torch.Tensor]) -> str | None:
    rng = tensors.get("rng.torch")
    if rng is None or rng.dtype != torch.uint8 or rng.shape != torch.get_rng_state().shape:
        return "no valid torch RNG state"
    other = [
        k
        for k in tensors
        if not (
            k.startswith("optim.")
            or k == "rng.torch"
            or (re.fullmatch(r"rng\.cuda\.\d+", k) and tensors[k].dtype == torch.uint8)
        )
    ]
    return f"unexpected tensor {other[0]!r}" if other else None


# How the optimiser computes, not what it has learnt: the resuming process decides (a run saved
# with other kernel settings, e.g. `fused: null`, or on another device, resumes with its own).
KERNEL_KEYS = ("fused", "foreach", "capturable", "differentiable")


def _with_kernels_of(optimizer: torch.optim.Optimizer, groups: Any) -> Any:
    """Saved param groups with `optimizer`'s kernel settings; anything malformed as it is, for the
    checks to name."""
    fresh = optimizer.state_dict()["param_groups"]
    if not (isinstance(groups, list) and len(groups) == len(fresh) and all(isinstance(g, dict) for g in groups)):
        return groups
    return [{**g, **{k: f[k] for k in KERNEL_KEYS if k in f}} for g, f in zip(groups, fresh)]


def _optimizer_problem(tensors: dict[str, torch.Tensor], saved: Any, optimizer: torch.optim.Optimizer) -> str | None:
    fresh = optimizer.state_dict()["param_groups"]
    if not isinstance(saved, dict) or saved.keys() != {"param_groups", "scalars"}:
        return "malformed optimizer entry"
    if not isinstance(saved["scalars"], dict):
        return "malformed optimizer entry"
    groups = saved["param_groups"]
    if not _like(groups, fresh) or any(g["params"] != f["params"] for g, f in zip(groups, fresh)):
        return "the optimizer groups do not fit this model's parameters"
    try:
        state = _optimizer_state_from_files(tensors, saved)
    except ValueError:
        return "malformed optimizer slot name"
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, slots in sorted(state.items()):
        if not 0 <= index < len(params):
            return f"optimizer state for parameter {index}; the model has {len(params)}"
        amsgrad = next(g for g in groups if index in g["params"]).get("amsgrad", False)
        problem = _moments_problem(slots, params[index], amsgrad)
        if problem:
            return f"parameter {index}: {problem}"
    return None


def _moments_problem(slots: dict[str, Any], param: torch.Tensor, amsgrad: bool) -> str | None:
    """Adam's slots: a step count and moments shaped like the parameter (second ones >= 0)."""
    expected = {"step", "exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if amsgrad else set())
    if set(slots) != expected:
        return f"optimizer slots {sorted(slots)}, expected {sorted(expected)}"
    count = slots["step"]
    if torch.is_tensor(count):
        count = float(count) if count.numel() == 1 else None
    if type(count) not in (int, float) or not 0 <= count < math.inf:
        return "invalid optimizer step count"
    for name in sorted(expected - {"step"}):
        moment = slots[name]
        if not torch.is_tensor(moment) or moment.shape != param.shape or moment.dtype != param.dtype:
            return f"{name} is not a {param.dtype} tensor of shape {tuple(param.shape)}"
        if not torch.isfinite(moment).all() or (name != "exp_avg" and (moment < 0).any()):
            return f"{name} holds {'non-finite' if not torch.isfinite(moment).all() else 'negative'} values"
    return None


# ---- the log and the lock -------------------------------------------------------------------


class RunLog:
    """log.jsonl (and TensorBoard when installed) on the main process; nothing elsewhere."""

    def __init__(self, run: Path, enabled: bool, resume_step: int | None):
        self.path, self.enabled, self.tb, self.dropped = run / LOG, enabled, None, 0
        if not enabled:
            return
        if self.path.is_file():
            self._repair(resume_step)
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run / "tensorboard"), purge_step=resume_step)
        except ImportError:
            pass

    def _repair(self, resume_step: int | None) -> None:
        """Drop lines that do not parse (cut short by a full disk or a kill) and, on resume, the
        entries past the checkpoint: those updates are about to be redone."""
        lines = self.path.read_bytes().decode("utf-8", errors="replace").splitlines()
        kept = []
        for line in filter(str.strip, lines):
            try:
                step = schemas.loads(line, LOG_RECORD, self.path).step
            except FormatError:
                self.dropped += 1
                continue
            if resume_step is None or step <= resume_step:
                kept.append(line)
        if self.dropped or len(kept) != len(lines):
            write_text(self.path, "".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        data = (json.dumps(record) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        if self.tb is not None and "step" in record:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


class RunLock:
    """An exclusive flock on `<run>/.lock` for the life of a run, so that two runs never write
    one folder; the kernel releases it when the process ends, however it ends."""

    def __init__(self, run: Path, enabled: bool = True):
        self.path, self.enabled, self.fd = run / LOCK, enabled, None

    def __enter__(self) -> "RunLock":
        if not self.enabled:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise TrainingError(
                f"{self.path.parent} is in use by another `musegen train` (process {holder}); "
                f"wait for it to end or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor releases the lock
            self.fd = None
