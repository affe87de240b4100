"""The training run: set-up, the loop, validation, checkpoints, stop requests and divergence.

A run reads and checks everything it needs (data, the `--init` or resume checkpoint, the whole
trainer state), takes the run folder's lock, and only then writes: `train_config.json`,
`log.jsonl`, `checkpoints/step-NNNNNNNN/` (the layout is in run_folder.py), `valid/`
(per-position NLL CSV + PNG), and `tensorboard/` when TensorBoard is installed.

The data is drawn from (seed, sample position) and each update's randomness from (seed, step),
so a resumed run, or one on another number of processes with the same global batch, repeats the
same updates.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from tqdm import tqdm

from ..data import batch_inputs, derive_seed
from ..device import check_fits
from ..errors import CheckpointError, ConfigError, TrainingError
from ..metrics.loss import position_sums, scoring_inputs, summarize, token_nll
from ..model.config import ModelConfig
from ..model.transformer import MusicPerformer
from ..precision import Choice
from .learner import Learner, compatible_weights
from .loader import TrainingData, load_training_data, make_loader, resolve_batching
from .precision import training_choice
from .processes import Processes, StopRequest, setup_processes
from .run_folder import RunLock, latest_checkpoint
from .settings import TrainConfig
from .writer import RunWriter


def train(cfg: TrainConfig, resume: bool = False, command: str = "") -> dict[str, Any]:
    """Train per `cfg`. Returns {"step", "loss", "checkpoint", "valid", "nonfinite", "stopped"}
    of the last update; `stopped` is True when a stop request (Ctrl-C, SIGTERM) ended the run
    early, after a checkpoint. A run that diverges raises TrainingError."""
    procs, device = setup_processes(cfg.device)
    try:
        data = load_training_data(cfg)
        model_cfg = dataclasses.replace(cfg.model, vocab_size=data.tokenizer.vocab_size)  # the data decides
        _check_model_fits(model_cfg, device)
        init = None
        if cfg.init and not resume:
            init = compatible_weights(Path(cfg.init), data.tokenizer, model_cfg, cfg.data)
        if resume:
            _latest_or_refuse(Path(cfg.out))  # before the lock creates the folder
        with RunLock(Path(cfg.out), enabled=procs.main):
            return Trainer(cfg, procs, device, data, model_cfg, init, resume, command).run()
    finally:
        procs.close()


def _check_model_fits(model_cfg: ModelConfig, device: torch.device) -> None:
    """ResourceError before the model is built when its weights, gradients and Adam's two moments
    (16 bytes a parameter, activations not counted) cannot fit; counted on the meta device."""
    with torch.device("meta"):
        params = sum(p.numel() for p in MusicPerformer(model_cfg).parameters())
    check_fits(16 * params, f"training a model of {params:,} parameters", device, "choose a smaller model")


def _latest_or_refuse(run: Path) -> Path:
    source = latest_checkpoint(run)
    if source is None:
        raise CheckpointError(f"{run}: no checkpoint to resume from")
    return source


def _refuse_used_folder(run: Path) -> None:
    if latest_checkpoint(run) is not None:
        raise ConfigError(f"{run} already holds checkpoints: add --resume to continue it, or choose another --out")


def _choose_precision(cfg: TrainConfig, procs: Processes, model_cfg: ModelConfig, micro: int, device) -> Choice:
    """What cfg.precision means here (musegen.precision: "auto" is timed once per machine and
    shape). Rank 0 decides for all ranks, so that they run alike; the others wait while it times."""
    choice = training_choice(cfg.precision, model_cfg, micro, cfg.seq_len, device) if procs.main else None
    bf16 = procs.main_flag(bool(choice and choice.bf16), device)
    return choice or Choice("bf16" if bf16 else "fp32", "rank 0's choice")


class Trainer:
    """One process's share of a run. Constructing it reads and checks everything (the resume
    checkpoint and trainer state, the batching) and writes nothing; `run()` chooses the precision,
    opens the run folder and trains to `cfg.steps` updates or a stop request."""

    def __init__(
        self,
        cfg: TrainConfig,
        procs: Processes,
        device: torch.device,
        data: TrainingData,
        model_cfg: ModelConfig,
        init: dict[str, Any] | None,
        resume: bool,
        command: str,
    ):
        self.cfg, self.procs, self.device, self.data, self.command = cfg, procs, device, data, command
        self.batching = resolve_batching(cfg, procs.world)
        run_dir = Path(cfg.out)
        source = _latest_or_refuse(run_dir) if resume else _refuse_used_folder(run_dir)
        self.learner = Learner(cfg, model_cfg, procs, device, init)
        if source is not None:
            self.learner.restore(source, data.tokenizer)
        procs.barrier()  # every process has read and checked its state
        self.learner.distribute()
        self.loader = make_loader(cfg, data, self.batching, procs, self.learner.step, device, model_cfg)
        self.writer = RunWriter(cfg, procs, data.tokenizer, source)
        self.rate: float | None = None  # tokens a second, smoothed
        self.valid_result: dict[str, Any] | None = None
        self.stopped = False

    def run(self) -> dict[str, Any]:
        # chosen here, not at construction: timing "auto" writes the machine's cache of choices
        precision = _choose_precision(self.cfg, self.procs, self.learner.model_cfg, self.batching[0], self.device)
        try:
            self.writer.open(self.learner, self.command, self.batching, precision)
            self._loop(precision.bf16)
        finally:
            self.writer.close()
        learner = self.learner
        streak = learner.counters["nonfinite_streak"]
        if streak and not self.stopped:
            self._diverged(f"the run ended diverged: its last {streak} updates were non-finite and skipped")
        latest = self.writer.latest
        return {
            "step": learner.step,
            "loss": learner.last_loss,
            "checkpoint": str(latest) if latest else None,
            "valid": self.valid_result,
            "nonfinite": learner.counters["nonfinite_total"],
            "stopped": self.stopped,
        }

    def _loop(self, bf16: bool) -> None:
        bar = tqdm(
            total=self.cfg.steps,
            initial=self.learner.step,
            disable=not self.procs.main,
            unit="step",
            dynamic_ncols=True,
        )
        batches = iter(self.loader)
        self.learner.model.train()
        try:
            with StopRequest() as stop:
                while self.learner.step < self.cfg.steps and not self.stopped:
                    self._train_step(batches, stop, bar, bf16)
        finally:
            bar.close()
            del batches  # stops the data workers

    def _train_step(self, batches: Iterator, stop: StopRequest, bar: tqdm, bf16: bool) -> None:
        """One update (in bf16 autocast if `bf16`), or the checkpoint that answers a stop request;
        then logs, validation and checkpoints as scheduled."""
        cfg, learner, started = self.cfg, self.learner, time.perf_counter()
        pad_id = self.data.tokenizer.pad_id
        micro_batches = [batch_inputs(next(batches), self.device) for _ in range(self.batching[1])]
        local = sum(int((ids[:, 1:] != pad_id).sum()) for ids, *_ in micro_batches)
        shared = self.procs.sum(torch.tensor([float(local), float(stop.requested)], device=self.device))
        if shared[1] > 0:  # every process stops at the same update
            self._checkpoint()
            self.writer.log.write({"step": learner.step, "event": "stopped", "reason": "stop request"})
            self.stopped = True
            return
        n_tokens = max(1.0, float(shared[0]))
        loss, grad_norm, lr = learner.update(micro_batches, n_tokens, pad_id, bf16)
        self._report(bar, loss, lr, grad_norm, n_tokens / (time.perf_counter() - started))
        streak = learner.counters["nonfinite_streak"]
        if streak >= cfg.max_nonfinite:
            self._diverged(f"the loss was non-finite {streak} updates in a row (step {learner.step}); stopped")
        last = learner.step == cfg.steps
        if cfg.valid_every and (learner.step % cfg.valid_every == 0 or last):
            self._validate()
        if learner.step % cfg.ckpt_every == 0 or last:
            self._checkpoint()

    def _report(self, bar: tqdm, loss: float, lr: float, grad_norm: float, speed: float) -> None:
        step = self.learner.step
        self.rate = speed if self.rate is None else 0.9 * self.rate + 0.1 * speed
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{self.rate:,.0f}", refresh=False)
        if step % self.cfg.log_every == 0 or step == self.cfg.steps:
            counters = self.learner.counters
            self.writer.log.write(
                {
                    "step": step,
                    "loss": loss,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens_per_s": speed,
                    "tokens": counters["tokens_seen"],
                    "nonfinite": counters["nonfinite_total"],
                    "time": time.time(),
                }
            )

    def _validate(self) -> None:
        """Per-position NLL of the validation pieces, on the main process."""
        if not self.procs.main or not self.data.valid:
            return
        cfg, model = self.cfg, self.learner.model
        valid_len = cfg.valid_len or min(2 * cfg.seq_len, self.learner.model_cfg.max_positions or 2 * cfg.seq_len)
        tokenizer = self.data.tokenizer
        inputs = scoring_inputs(model, tokenizer)
        seed = derive_seed(cfg.seed, 3)
        per_piece = token_nll(model, self.data.valid, valid_len, tokenizer.pad_id, seed=seed, **inputs)
        sums, counts = position_sums(per_piece, valid_len)
        self.valid_result = summarize(sums, counts, cfg.seq_len)
        self.writer.validation(self.learner.step, sums, counts, self.valid_result)

    def _checkpoint(self) -> None:
        """This step's checkpoint, unless the state went non-finite: such a checkpoint is never
        written, so every one on disk is good and pruning keeps the newest."""
        if not self.learner.is_finite():
            self._diverged(f"the weights or optimiser moments became non-finite by step {self.learner.step}; not saved")
        self.writer.checkpoint(self.learner)

    def _diverged(self, what: str) -> None:
        self.writer.log.write({"step": self.learner.step, "event": "stopped", "reason": "non-finite"})
        raise TrainingError(f"{what}; last good checkpoint: {self.writer.latest}")
