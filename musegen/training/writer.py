"""What a run writes into its folder (main process only; the layout is in run_folder.py): its
config, the log, validation curves, checkpoints. Nothing is written before `open`. Folders are
recorded by `recorded_name`, so the files hold no path of the machine that wrote them."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..io import write_json
from ..metrics.report import write_position_nll
from ..precision import Choice
from ..tokenizers.base import Tokenizer
from .learner import Learner
from .processes import Processes
from .run_folder import RUN_CONFIG, RunLog, clean_leftovers, recorded_name, write_checkpoint
from .settings import TrainConfig, settings_changed_on_resume


class RunWriter:
    """The run folder of `cfg.out` as one process writes it; `latest` is its newest checkpoint."""

    def __init__(self, cfg: TrainConfig, procs: Processes, tokenizer: Tokenizer, latest: Path | None):
        self.cfg, self.procs, self.tokenizer, self.latest = cfg, procs, tokenizer, latest
        self.run_dir = Path(cfg.out)
        self.init = recorded_name(cfg.init) if cfg.init else None
        self.log: RunLog | None = None

    def open(self, learner: Learner, command: str, batching: tuple[int, int], precision: Choice) -> None:
        """The first writes: the run's config, the log's start (or resume) entry, and the step-0
        checkpoint of a new run."""
        cfg, procs, resumed = self.cfg, self.procs, self.latest is not None
        changed = settings_changed_on_resume(cfg) if resumed and procs.main else []
        for change in changed:  # read before the record below replaces them
            print(f"resume: {change} (this command's)", file=sys.stderr, flush=True)
        if procs.main:
            clean_leftovers(self.run_dir)
            names = {"data": recorded_name(cfg.data), "out": recorded_name(cfg.out), "init": self.init or ""}
            write_json(
                self.run_dir / RUN_CONFIG,
                {
                    "config": {**cfg.to_dict(), **names},
                    "command": command,
                    "world_size": procs.world,
                    "micro_batch": batching[0],
                    "accumulation": batching[1],
                    "resumed_from": self.latest.relative_to(self.run_dir).as_posix() if resumed else None,
                    "init": self.init,
                },
            )
        self.log = RunLog(self.run_dir, procs.main, learner.step if resumed else None)
        record = {
            "step": learner.step,
            "event": "resume" if resumed else "start",
            "command": command,
            "parameters": learner.model.num_parameters(),
            "world_size": procs.world,
            "precision": precision.record(),
        }
        if self.init:
            record["init"] = self.init
        if changed:
            record["changed"] = changed
        if self.log.dropped:
            record["log_lines_dropped"] = self.log.dropped  # cut short by a full disk or a kill
        self.log.write(record)
        if not resumed:
            self.checkpoint(learner)

    def validation(self, step: int, sums: np.ndarray, counts: np.ndarray, result: dict[str, Any]) -> None:
        """The per-position NLL curve (CSV and PNG) and its summary in the log."""
        write_position_nll(
            self.run_dir / "valid",
            f"step-{step:08d}",
            sums,
            counts,
            self.cfg.seq_len,
            title=f"validation NLL at step {step}",
        )
        self.log.write({"step": step, "valid_loss": result["within"], "valid_extrapolation": result["extrapolation"]})

    def checkpoint(self, learner: Learner) -> None:
        """This step's checkpoint, with the metadata `musegen sample` and the loss metrics read."""
        if not self.procs.main:
            return
        cfg, loss = self.cfg, learner.last_loss
        meta = {
            "train_len": cfg.seq_len,
            "preset": cfg.preset,
            "data": recorded_name(cfg.data),
            "tokenizer": self.tokenizer.kind,
            "step": learner.step,
            "train_loss": loss if math.isfinite(loss) else None,  # JSON has no NaN
        }
        if self.init:
            meta["init"] = self.init
        self.latest = write_checkpoint(
            self.run_dir,
            learner.step,
            learner.model,
            learner.model_cfg,
            self.tokenizer,
            learner.optimizer,
            learner.scheduler,
            learner.counters,
            meta,
            cfg.keep,
        )

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
