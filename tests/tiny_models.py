"""Untrained tiny models and their checkpoints, for tests that sample (fast on one CPU thread)."""

from __future__ import annotations

from pathlib import Path

import torch

from musegen.checkpoint import save_checkpoint
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.tokenizers import Tokenizer, tokenizer_from_dict


def tiny_model(kind: str, seed: int = 0, **config) -> tuple[MusicPerformer, Tokenizer]:
    """A tiny model (in eval mode) for the default tokenizer of `kind`, and that tokenizer;
    `config`: settings of the model beside the tiny preset's (e.g. positions="beats")."""
    tok = tokenizer_from_dict({"kind": kind})
    torch.manual_seed(seed)
    return MusicPerformer(preset("tiny", vocab_size=tok.vocab_size, **config)).eval(), tok


def tiny_checkpoint(kind: str, folder: Path, meta: dict | None = None, **config) -> Path:
    """A checkpoint folder of `tiny_model(kind, **config)`."""
    model, tok = tiny_model(kind, **config)
    return save_checkpoint(folder, model, model.config, tok, meta)


def onsets(tokens: torch.Tensor, seed: int = 3) -> torch.Tensor:
    """Onsets in beats [B, T] (float64) for tokens [B, T], as a tokenizer gives them: non-decreasing,
    several tokens at one onset (steps of 0, 1/4, 1/3 and 1 beat: off any grid of token counts)."""
    steps = torch.tensor([0.0, 0.25, 1 / 3, 1.0], dtype=torch.float64)
    drawn = torch.randint(0, len(steps), tokens.shape, generator=torch.Generator().manual_seed(seed))
    return steps[drawn].cumsum(1) + 0.5
