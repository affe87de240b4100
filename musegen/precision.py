"""What precision "auto" runs in here: decided by timing the candidates once, then remembered.

A CPU's flags do not say whether bf16 pays. With AVX512-BF16 listed, AMD's Zen 4 and Zen 5
multiply bf16 matrices 2-4x faster than fp32, while an Intel Xeon without AMX does it no faster
and trains at 0.70x fp32 in bf16 (docs/performance.md). So on first use on a machine:
- training times full updates (the trainer's loss and optimiser) of a fresh model of the run's
  config, at the run's batch and length, in fp32 and under bf16 autocast (musegen.training.precision);
- sampling times the single-token step at the session's batch in fp32, in bf16 as PyTorch runs
  it, and in bf16 through step.c (musegen/model/c_step.py) where it builds
  (musegen.generation.precision);
and the fastest is kept in `~/.cache/musegen/precision.json`, keyed by the CPU, the torch
threads, the torch and musegen versions and the shapes. A measurement takes seconds on an idle
machine (a few updates, a few dozen steps) and says so on stderr. `MUSEGEN_PRECISION=fp32` or
`bf16` makes "auto" mean that without timing; `MUSEGEN_PRECISION=measure` times again and
replaces the cached choice. Not timed: CPUs that list no bf16 arithmetic (bf16 is emulated
there: fp32) and GPUs (bf16 where supported).

This module is the policy alone: the callers build what is timed (`choose`'s candidates), so it
imports nothing of the model, and the model runs whichever path its caller names.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable, Literal

import torch
from pydantic import BaseModel, Field

from . import __version__, schemas
from .device import check_precision, cpu_flags, cpu_name, native_bf16
from .errors import ConfigError, MusegenError
from .io import write_json

ENV = "MUSEGEN_PRECISION"
ENV_VALUES = ("fp32", "bf16", "measure")


@dataclass(frozen=True)
class Choice:
    path: str  # "fp32" or the caller's bf16 path ("bf16", or sampling's "bf16-step.c")
    reason: str
    seconds: dict = field(default_factory=dict)  # each candidate's median time, when timed

    @property
    def bf16(self) -> bool:
        return self.path != "fp32"

    def record(self) -> dict:
        """For the training log and the sample JSON."""
        return {"path": self.path, "reason": self.reason, "seconds": self.seconds, "cpu": cpu_name()}

    def __str__(self) -> str:
        return f"{self.path} ({self.reason})"


def cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "musegen" / "precision.json"


def machine() -> str:
    """What a timing depends on besides the shapes: the CPU, the threads, the versions."""
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:8]
    return (
        f"{cpu_name()}, flags {flags}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"musegen {__version__}"
    )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def choose(
    precision: str,
    device: torch.device,
    what: str,
    bf16_path: str,
    candidates,
    rounds: tuple[int, int],
    budget: float,
    quiet: bool,
) -> Choice:
    """The choice for `precision`: as asked, as forced by the environment, by rule where nothing
    is timed, else cached or timed now (`candidates()` builds name -> one run)."""
    check_precision(precision)
    forced = os.environ.get(ENV, "")
    if forced and forced not in ENV_VALUES:
        raise ConfigError(f"{ENV} must be one of {', '.join(ENV_VALUES)} (or unset), got {forced!r}")
    if precision != "auto":
        return Choice(bf16_path if precision == "bf16" else "fp32", "asked for")
    if forced in ("fp32", "bf16"):
        return Choice(bf16_path if forced == "bf16" else "fp32", f"{ENV}={forced}")
    if device.type == "cuda":
        return Choice(
            bf16_path if native_bf16(device) else "fp32", "on CUDA: bf16 where the GPU supports it, not timed"
        )
    if not native_bf16(device):
        return Choice("fp32", "this CPU lists no bf16 arithmetic, not timed")
    if candidates is None:
        return Choice(bf16_path, "no fast step for this attention: bf16 as the CPU lists bf16 arithmetic, not timed")
    key = f"{machine()}; {what}"
    cache = _read_cache()
    if forced != "measure" and key in cache:
        hit = cache[key]
        return Choice(hit["path"], f"timed on {hit['date']} on this machine, cached", hit["seconds"])
    say = (lambda line: None) if quiet else _say
    say(f"precision auto: timing fp32 and bf16 for {what}, once on this machine (cached in {cache_file()})")
    with torch.random.fork_rng(devices=[]):  # the run's own random draws stay as they were
        seconds = measure(candidates(), rounds, budget)
    path = min(seconds, key=seconds.get)
    say(f"precision auto: {path} ({', '.join(f'{name} {1e3 * s:.1f} ms' for name, s in seconds.items())})")
    cache[key] = {"path": path, "seconds": seconds, "date": datetime.date.today().isoformat()}
    try:
        write_json(cache_file(), cache)
    except (OSError, MusegenError) as exc:  # a read-only or full home: time again next run
        say(f"precision auto: could not cache the choice ({exc})")
    return Choice(path, "timed now", seconds)


def measure(candidates: dict[str, Callable[[], object]], rounds: tuple[int, int], budget: float) -> dict[str, float]:
    """Median seconds of each candidate: one warm-up call each, then interleaved rounds (so a
    change in the machine's load hits all alike), at least rounds[0] and at most rounds[1],
    stopping once `budget` seconds have gone."""
    for run in candidates.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    start = time.perf_counter()
    while len(times[next(iter(times))]) < rounds[1]:
        for name, run in candidates.items():
            began = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - began)
        if len(times[name]) >= rounds[0] and time.perf_counter() - start > budget:
            break
    return {name: statistics.median(t) for name, t in times.items()}


class PrecisionChoice(BaseModel):
    """One entry of ~/.cache/musegen/precision.json (musegen.precision): the path timed fastest."""

    model_config = schemas.STRICT
    path: Literal["fp32", "bf16", "bf16-step.c"]
    seconds: dict[schemas.Name, Annotated[float, Field(ge=0)]]
    date: schemas.Name


PRECISION_CACHE = schemas.Format("precision cache", None, dict[schemas.Name, PrecisionChoice])


def _read_cache() -> dict:
    try:
        entries = schemas.read(cache_file(), PRECISION_CACHE)
    except (OSError, MusegenError):  # none yet, or unreadable: time again and write it anew
        return {}
    return {key: entry.model_dump() for key, entry in entries.items()}


def digest(config: dict) -> str:
    """A short name for a model config, for the cache's keys."""
    return "model " + hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]
