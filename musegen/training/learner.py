"""The model with its optimiser, schedule and counters: what one process updates and what a
checkpoint saves. Randomness inside an update (dropout, SPE noise, feature redraws) is reseeded
from (seed, step, micro-batch chunk), so a resumed run, or one on another number of processes
with the same global batch, repeats the same updates."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import load_checkpoint
from ..data import derive_seed
from ..errors import CheckpointError, ConfigError
from ..model.config import ModelConfig
from ..model.transformer import MusicPerformer
from ..tokenizers.base import Tokenizer
from .optim import lr_factor, make_optimizer, next_token_nll
from .processes import Processes
from .run_folder import TrainingState, state_is_finite
from .settings import TrainConfig


def compatible_weights(folder: Path, tokenizer: Tokenizer, model_cfg: ModelConfig, data: str) -> dict[str, Any]:
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


class Learner:
    """`model` (the weights), `net` (what the forward pass runs: the model, under DDP and
    torch.compile when asked), the optimiser and scheduler, the update count `step` and the
    counters a checkpoint keeps. The initial weights are `init`'s, or random and the same on
    every process; `restore` then `distribute` finish the set-up."""

    def __init__(
        self, cfg: TrainConfig, model_cfg: ModelConfig, procs: Processes, device: torch.device, init: dict | None
    ):
        self.cfg, self.model_cfg, self.procs, self.device = cfg, model_cfg, procs, device
        torch.manual_seed(derive_seed(cfg.seed, 0))
        self.model = MusicPerformer(model_cfg).to(device)
        if init is not None:
            self.model.load_state_dict(init)
        self.net: torch.nn.Module = self.model
        self.optimizer = make_optimizer(self.model.parameters(), cfg.optimizer, cfg.lr, cfg.weight_decay, device)
        floor_ratio = cfg.lr_floor / cfg.lr
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda u: lr_factor(u, cfg.warmup, cfg.steps, floor_ratio)
        )
        self.step = 0
        self.counters = {"nonfinite_total": 0, "nonfinite_streak": 0, "tokens_seen": 0}
        self.last_loss = math.nan  # of the last finite update

    def restore(self, source: Path, tokenizer: Tokenizer) -> None:
        """Load the checkpoint's weights and trainer state, all checked before anything is set;
        this run's lr, schedule and weight decay then replace the checkpoint's (the optimiser's
        moments and the update count carry over), so `--set lr=...` on resume takes effect."""
        cfg = self.cfg
        weights = compatible_weights(source, tokenizer, self.model_cfg, cfg.data)
        state = TrainingState.read(source, self.optimizer, self.scheduler)
        self.model.load_state_dict(weights)
        state.apply(self.optimizer, self.scheduler)
        self.step, self.counters = state.step, dict(state.counters)
        factor = lr_factor(self.step, cfg.warmup, cfg.steps, cfg.lr_floor / cfg.lr)
        for group in self.optimizer.param_groups:
            group.update(lr=cfg.lr * factor, initial_lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.scheduler.base_lrs = [cfg.lr for _ in self.optimizer.param_groups]

    def distribute(self) -> None:
        """Wrap the model for the forward pass once its weights are final: DDP copies rank 0's."""
        if self.procs.world > 1:
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        if self.cfg.compile:
            self.net = torch.compile(self.net)

    def is_finite(self) -> bool:
        return state_is_finite(self.model, self.optimizer)

    def update(
        self, micro_batches: list[tuple[torch.Tensor, ...]], n_tokens: float, pad_id: int, bf16: bool
    ) -> tuple[float, float, float]:
        """Forward and backward over the micro-batches, each (ids, onsets in beats or None, the
        grammar's allowed ids or None: data.batch_inputs), then
        the optimiser step unless the loss or the gradient is non-finite (that update is skipped
        and counted). `n_tokens`: the real target tokens of the global batch. Returns (loss, grad
        norm, lr)."""
        cfg, procs, step = self.cfg, self.procs, self.step
        torch.manual_seed(derive_seed(cfg.seed, 4, step))
        self.model.on_train_step(step)
        total = torch.zeros((), device=self.device)
        for a, (mb, beats, allowed) in enumerate(micro_batches):
            torch.manual_seed(derive_seed(cfg.seed, 5, step, a * procs.world + procs.rank))
            sync = (
                self.net.no_sync()
                if procs.world > 1 and a < len(micro_batches) - 1 and hasattr(self.net, "no_sync")
                else contextlib.nullcontext()
            )
            with sync:
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
                    logits = self.net(mb[:, :-1], None if beats is None else beats[:, :-1])
                    nll = next_token_nll(logits, mb[:, 1:], pad_id, allowed)
                # DDP averages gradients over processes: scale so the result is the
                # gradient of the mean over every real target token of the global batch.
                # Outside autocast, as PyTorch advises: backward ops take their forward's dtypes.
                (nll * (procs.world / n_tokens)).backward()
            total += nll.detach()
        loss = float(procs.sum(total)) / n_tokens
        clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
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
