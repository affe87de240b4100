"""Training's precision under "auto": fp32 or bf16 autocast, timed on full updates by musegen.precision."""

from __future__ import annotations

from typing import Callable

import torch

from ..model.transformer import MusicPerformer
from ..precision import Choice, choose, digest
from .optim import make_optimizer, next_token_nll


def training_choice(
    precision: str, config, batch: int, length: int, device: torch.device, quiet: bool = False
) -> Choice:
    """fp32 or bf16 autocast for training `config` at batch x length on `device` (`quiet`:
    nothing on stderr while timing)."""

    def candidates():
        torch.manual_seed(0)
        model = MusicPerformer(config).to(device).train()
        ids = torch.randint(0, config.vocab_size - 1, (batch, length + 1), device=device)
        return {"fp32": training_update(model, ids, False), "bf16": training_update(model, ids, True)}

    what = f"training {digest(config.to_dict())} at batch {batch} x {length}"
    return choose(precision, device, what, "bf16", candidates, rounds=(2, 5), budget=3.0, quiet=quiet)


def training_update(model, ids: torch.Tensor, bf16: bool) -> Callable[[], None]:
    """One full update of `model` on `ids` [B, N + 1] as `musegen train` runs it (its loss, its
    optimiser, dropout on), with its own optimiser."""
    optimizer = make_optimizer(model.parameters(), "adam", 1e-4, 0.0, ids.device)

    # a model of beats times on one onset a token: the cost does not depend on their values
    beats = torch.arange(ids.shape[1] - 1, device=ids.device).expand(len(ids), -1)
    beats = beats if model.config.positions == "beats" else None

    def update():
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(ids[:, :-1], beats)
        (next_token_nll(logits, ids[:, 1:]) / ids[:, 1:].numel()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update
