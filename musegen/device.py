"""One place for device decisions: which device "auto" means, and which precision "auto" means there."""

from __future__ import annotations

import functools
import os
import platform
import resource
from pathlib import Path

import torch

from .choices import PRECISIONS
from .errors import ConfigError, ResourceError

# CPU flags (Linux /proc/cpuinfo) of bf16 arithmetic in hardware: x86 AVX512-BF16 and AMX,
# Arm's BF16 extension. Without them a bf16 matmul is emulated and slower than fp32.
_BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """ "auto"/None -> cuda if available else cpu; otherwise the named device, checked to exist.
    A CUDA device always carries its index ("cuda" is the current one): torch.cuda.set_device
    refuses one without."""
    if isinstance(name, torch.device):
        device = name
    elif name in (None, "auto"):
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError):
            raise ConfigError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {str(device)!r} asked for, but CUDA is not available")
        index = torch.cuda.current_device() if device.index is None else device.index
        count = torch.cuda.device_count()
        if index >= count:
            raise ConfigError(f"device {str(device)!r} asked for, but there are {count} CUDA devices")
        device = torch.device("cuda", index)
    return device


@functools.cache
def _cpuinfo() -> dict:
    """The first processor's fields of Linux's /proc/cpuinfo (empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_flags() -> frozenset:
    """The CPU's feature flags as Linux lists them (x86 "flags", Arm "Features"); empty elsewhere."""
    info = _cpuinfo()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def cpu_name() -> str:
    """The CPU's model as Linux names it, with x86's family and model numbers (a VM often shows
    only "AMD EPYC"), else the platform's processor string."""
    info = _cpuinfo()
    name = info.get("model name") or info.get("CPU part") or platform.processor() or platform.machine()
    if "cpu family" in info:
        name += f" (family {info['cpu family']} model {info.get('model', '?')})"
    return name


@functools.cache
def _cpu_computes_bf16() -> bool:
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):  # torch's own CPU checks
        if getattr(torch.cpu, probe, lambda: False)():
            return True
    return bool(cpu_flags() & _BF16_CPU_FLAGS)


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices in hardware (so bf16 is faster than fp32 there)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and _cpu_computes_bf16()


def check_precision(precision: str) -> None:
    """A ConfigError unless `precision` is one musegen knows ("auto" is decided by
    musegen.precision; parts that need fp32 stay in fp32 either way: feature maps, attention sums)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def device_memory(device: torch.device) -> int | None:
    """Bytes the device can hold (for the CPU, the machine's memory or this process's address-space
    limit, whichever is smaller), or None when unknown."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[1])
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError, RuntimeError):
        return None
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return memory if limit == resource.RLIM_INFINITY else min(memory, limit)


def check_fits(need: int, what: str, device: torch.device, remedy: str = "") -> None:
    """ResourceError, before anything is allocated, when `need` bytes exceed the device's memory."""
    memory = device_memory(device)
    if memory and need > memory:
        raise ResourceError(
            f"{what} needs about {need / 2**30:,.1f} GiB but {device} has {memory / 2**30:,.1f} GiB"
            + (f"; {remedy}" if remedy else "")
        )
