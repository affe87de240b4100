"""What one update computes: the loss, the optimiser and the learning-rate schedule. Torch only,
so that the precision timing (musegen.precision) runs the same update as the trainer."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def next_token_nll(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """Summed NLL of `targets` [B, N] under `logits` [B, N, vocab], in fp32; with `allowed` (bool
    [B, N, grammar's vocab], CropDataset's) the softmax runs over the allowed ids only (the model's
    ids past the grammar's are never allowed). Flattened so that the log-softmax runs over
    contiguous rows (over a [B, vocab, N] view it copies the logits twice)."""
    logits = logits.float()
    if allowed is not None:
        allowed = F.pad(allowed, (0, logits.shape[-1] - allowed.shape[-1]), value=False)
        logits = logits.masked_fill(~allowed, -math.inf)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index, reduction="sum"
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
