"""One place that turns a device name into a torch.device: "auto" picks CUDA when present."""

from __future__ import annotations

import torch

from .errors import ConfigError


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """"auto"/None -> cuda if available else cpu; otherwise the named device, checked to exist."""
    if isinstance(name, torch.device):
        device = name
    elif name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError):
            raise ConfigError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {str(device)!r} asked for, but CUDA is not available")
    return device
