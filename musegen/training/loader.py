"""A run's data: the pieces of the prepared shards, how a global batch splits over processes and
micro-batches, and the DataLoader that yields each update's micro-batches (musegen.data)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..data import Augmenter, CropDataset, StepBatches
from ..errors import ConfigError, DataError
from ..model.config import ModelConfig
from ..shards import Shards, resolve_split
from ..tokenizers.base import Tokenizer
from .processes import Processes, ignore_interrupts
from .settings import TrainConfig


@dataclass
class TrainingData:
    tokenizer: Tokenizer
    train: list[np.ndarray]  # pieces of two tokens or more
    valid: list[np.ndarray]  # the first `valid_pieces` of the validation split, if there is one
    augmenter: Augmenter | None  # None: `augment=false`


def load_training_data(cfg: TrainConfig) -> TrainingData:
    cfg.model.check_length(cfg.seq_len, "seq_len")
    cfg.model.check_length(cfg.valid_len, "valid_len")
    if not cfg.data:
        raise DataError("no data folder given")
    shards = Shards(cfg.data)
    train_pieces = [p for p in shards.pieces("train") if len(p) >= 2]
    if not train_pieces:
        raise DataError(f"{cfg.data}: the train split holds no pieces")
    valid_split = resolve_split(shards.splits, "valid")
    valid_pieces = shards.pieces(valid_split)[: cfg.valid_pieces] if valid_split else []
    # Made here, so that an augmentation the representation cannot do is refused before the run writes anything.
    augmenter = (
        Augmenter.for_tokenizer(
            shards.tokenizer,
            kit_shuffle=cfg.kit_shuffle,
            instrument_shuffle=cfg.instrument_shuffle,
            bass_doubling=cfg.bass_doubling,
        )
        if cfg.augment
        else None
    )
    return TrainingData(shards.tokenizer, train_pieces, valid_pieces, augmenter)


def resolve_batching(cfg: TrainConfig, world: int) -> tuple[int, int]:
    """(micro batch, accumulation) that keep the global batch for `world` processes."""
    if cfg.batch_size % world:
        raise ConfigError(f"batch_size {cfg.batch_size} is not divisible by the {world} processes")
    share = cfg.batch_size // world
    micro = cfg.micro_batch or share
    if share % micro:
        raise ConfigError(
            f"micro_batch {micro} does not divide the per-process batch {share} "
            f"(batch_size {cfg.batch_size} over {world} processes)"
        )
    return micro, share // micro


def make_loader(
    cfg: TrainConfig,
    data: TrainingData,
    batching: tuple[int, int],
    procs: Processes,
    step: int,
    device: torch.device,
    model_cfg: ModelConfig,
) -> torch.utils.data.DataLoader:
    """This process's micro-batches from update `step` on (`batching`: micro batch, accumulation),
    with what `model_cfg` needs beside the ids (data.CropDataset): each token's onset in beats for
    a model whose positions are beats, the grammar's allowed ids for one trained under it."""
    tokenizer = data.tokenizer
    crop = cfg.crop if cfg.crop != "auto" else tokenizer.default_crop
    onsets = tokenizer.onsets if model_cfg.positions == "beats" else None
    if onsets is not None:
        onsets(np.zeros(0, dtype=np.int64))  # a ConfigError here, not in a data worker, where it gives none
    grammar = tokenizer.grammar() if model_cfg.loss_over == "grammar" else None
    dataset = CropDataset(data.train, cfg.seq_len, tokenizer.pad_id, cfg.seed, data.augmenter, crop, onsets, grammar)
    micro, accumulation = batching
    batches = StepBatches(
        [len(p) for p in data.train],
        cfg.seq_len,
        micro,
        accumulation,
        procs.rank,
        procs.world,
        cfg.seed,
        cfg.sampling,
        step,
    )
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=batches,
        num_workers=cfg.workers,
        pin_memory=device.type == "cuda",
        worker_init_fn=ignore_interrupts if cfg.workers else None,
        persistent_workers=False,
    )
