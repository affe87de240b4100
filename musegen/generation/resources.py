"""What a sampling run may use: the device, torch CPU threads and the memory its batch needs."""

from __future__ import annotations

import contextlib

import torch

from ..device import check_fits, device_memory, resolve_device
from ..errors import ConfigError
from ..model.torch_step import PreparedWeights

MAX_THREADS = 256
# CPU threads while sampling, unless asked otherwise. A step is many small ops; on a busy machine
# extra threads oversubscribe the cores and slow each step several times over (docs/performance.md).
# One thread also keeps a seed's output independent of the machine's core count.
DEFAULT_CPU_THREADS = 1


@contextlib.contextmanager
def cpu_threads(threads: int | None):
    """Run the block with `threads` torch CPU threads (None: leave as is), then restore."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_threads(threads: int | None) -> None:
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"--threads must be within 1..{MAX_THREADS}, got {threads}")


def checked_device(device: str | torch.device | None) -> torch.device:
    """The device to sample on: auto, cpu, cuda or cuda:N (ConfigError for anything else)."""
    resolved = resolve_device(device)
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {str(resolved)!r} is not supported for sampling; use auto, cpu, cuda or cuda:N")
    return resolved


def probe_onsets(model, batch: int) -> torch.Tensor | None:
    """Onsets for steps that only measure the model (its memory, its speed): zeros for a model
    whose positions are beats, none for one of token positions."""
    if model.config.positions != "beats":
        return None
    return torch.zeros(batch, dtype=torch.float64, device=model.device)


def check_memory(model, num_samples: int, tokens: int, device: torch.device, weights: PreparedWeights) -> None:
    """ConfigError when `num_samples` sequences of `tokens` tokens cannot fit in the device's
    memory: per sample, the model's streaming state (measured on two steps, so a cache that
    grows per token is counted at full length), the logits' working copies and the tokens.
    The state is the same size on every precision path, so fp32 is used untimed: the session's
    own choice is timed later, at its batch size, only once the batch is known to fit."""
    with torch.inference_mode():
        session = model.session(1, seed=0, weights=weights)
        one, beats = torch.zeros(1, dtype=torch.long, device=device), probe_onsets(model, 1)
        session.step(one, beats)
        first = session.state_bytes
        session.step(one, beats)
        growth = session.state_bytes - first
    per_sample = first + growth * tokens + 64 * model.config.vocab_size + 64 * tokens
    memory = device_memory(device) or 0
    check_fits(
        num_samples * per_sample,
        f"--num-samples {num_samples}",
        device,
        f"{per_sample / 2**20:,.2f} MiB per sample: at most {memory // per_sample:,} fit",
    )
