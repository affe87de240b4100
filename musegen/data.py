"""Training data: crops of token shards, the augmentation each tokenizer asks for, batches by step.

Every random choice is a pure function of (seed, sample position) or (seed, epoch), never of
a running generator. Step s trains on the global sample positions [s*B, (s+1)*B): the same
samples whatever the number of processes or data workers, and a resumed run continues exactly
where it stopped without any sampler state.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from .errors import ConfigError, DataError
from .music.roles import GM_FAMILIES, GM_FAMILY_SIZE, GM_KIT
from .tokenizers.base import Grammar, Tokenizer, methods_lacking

SAMPLING_CHOICES = ("piece", "length")
CROP_CHOICES = ("random", "start")
DOUBLED_BASS_INTERVALS = np.arange(3, 13)  # semitones above the bass (bass_doubling): a minor third to an octave


def derive_seed(*parts: int) -> int:
    """A 63-bit seed mixing all `parts` (non-negative ints): independent streams per purpose."""
    return int(np.random.SeedSequence(list(parts)).generate_state(2, np.uint64)[0] >> np.uint64(1))


class Augmenter:
    """Random rewrites of token ids that keep a piece musical; each tokenizer names the ones that
    suit its representation (`Tokenizer.augmentation`, the keyword arguments below).

    - `max_skip_bars`: skip 0..max_skip_bars bars at the start;
    - `track_dropout`: drop each track with this probability, keeping at least one;
    - `max_shift`: transpose by a shift in -max_shift..+max_shift, redrawn until in range (the
      tokenizer decides what a shift leaves alone, e.g. drums);
    - `kit_shuffle`: with this probability, play the piece's drums on a random permutation of
      the General MIDI kit, so that which drum plays what can only be learnt from the piece
      itself (a model must copy the prompt's kit rather than recall a style's);
    - `instrument_shuffle`: with this probability, play each pitched track on another instrument
      of its General MIDI family (a random permutation of each family's 8 programs, one for the
      piece), so that which instruments play is learnt from the piece itself, for every program
      of a family and not only those the data holds (a guitar stays a guitar, in its register);
    - `bass_doubling`: with this probability, double every bass note of the piece at one interval
      (DOUBLED_BASS_INTERVALS, drawn for the piece), so that a model learns from the piece itself
      whether its bass plays single notes or two at a time (4% of the MMA training grooves
      double it, a quarter of the test prompts do).
    Piece-level rewrites (bar skip, track dropout, kit, instruments, doubling) run before
    cropping, transposition after it, so the shift only has to fit the pitches of the window. The
    tokenizer methods each one calls are declared on `Tokenizer` (`skip_bars`; `notes`,
    `drop_tracks`; `map_drums`; `map_programs`; `double_bass`; `transpose`), and a tokenizer that
    names an augmentation must provide them (`tokenizers.base.AUGMENTATION_NEEDS`).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_shift: int = 0,
        max_skip_bars: int = 0,
        track_dropout: float = 0.0,
        kit_shuffle: float = 0.0,
        instrument_shuffle: float = 0.0,
        bass_doubling: float = 0.0,
    ):
        self.tokenizer = tokenizer
        self.max_shift, self.max_skip_bars, self.track_dropout = max_shift, max_skip_bars, track_dropout
        self.kit_shuffle, self.instrument_shuffle, self.bass_doubling = kit_shuffle, instrument_shuffle, bass_doubling

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer, **extra: float) -> "Augmenter":
        """The tokenizer's own augmentation, with `extra` ones a run asks for (a ConfigError when
        the representation cannot do them)."""
        for key, value in extra.items():
            if value and methods_lacking(type(tokenizer), key):
                raise ConfigError(f"{key}: the {tokenizer.kind} representation cannot do this augmentation")
        return cls(tokenizer, **{**tokenizer.augmentation, **extra})

    def before_crop(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.max_skip_bars > 0:
            n = int(rng.integers(0, self.max_skip_bars + 1))
            skipped = self.tokenizer.skip_bars(ids, n) if n else None
            ids = ids if skipped is None else skipped  # None: the piece is too short to skip n bars
        if self.track_dropout > 0:
            present = np.unique(self.tokenizer.notes(ids)[:, 0]).tolist()
            dropped = [t for t in present if rng.random() < self.track_dropout]
            if dropped and len(dropped) == len(present):
                dropped.pop(int(rng.integers(len(dropped))))  # keep one track
            if dropped:
                ids = self.tokenizer.drop_tracks(ids, dropped)
        if self.kit_shuffle > 0 and rng.random() < self.kit_shuffle:
            kit = np.arange(128)
            kit[GM_KIT.start : GM_KIT.stop] = rng.permutation(GM_KIT)
            ids = self.tokenizer.map_drums(ids, kit)
        if self.instrument_shuffle > 0 and rng.random() < self.instrument_shuffle:
            family = GM_FAMILY_SIZE * np.arange(GM_FAMILIES)
            programs = (
                family[:, None] + rng.permuted(np.tile(np.arange(GM_FAMILY_SIZE), (len(family), 1)), axis=1)
            ).ravel()
            ids = self.tokenizer.map_programs(ids, programs)
        if self.bass_doubling > 0 and rng.random() < self.bass_doubling:
            ids = self.tokenizer.double_bass(ids, int(rng.choice(DOUBLED_BASS_INTERVALS)))
        return ids

    def after_crop(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.max_shift <= 0:
            return ids
        # Trying the shifts in a random order until one fits is the same as redrawing uniformly
        # until in range, with a bounded cost; shift 0 always fits.
        for shift in rng.permutation(np.arange(-self.max_shift, self.max_shift + 1)):
            out = self.tokenizer.transpose(ids, int(shift))
            if out is not None:
                return out
        raise DataError("no transposition fits the window, not even 0 (tokenizer bug)")


class CropDataset(torch.utils.data.Dataset):
    """Keys are (sample position, piece index); an item is `length + 1` ids, PAD-filled at the end.

    The extra id makes inputs `x[:-1]` and next-token targets `x[1:]` of `length` each. With
    `onsets` (the tokenizer's, for a model whose positions are beats) an item is (ids, beats):
    each token's onset in beats (float64) from the crop's first token, the PAD after the piece
    at its last onset. With `grammar` (a model trained under it, ModelConfig.loss_over) an item
    is (ids, beats or an empty tensor, allowed): bool [length, vocab], what the grammar allows at
    each target; the crop is then transposed with the piece before it, so that the grammar's
    state where the crop begins is the transposed piece's.
    """

    def __init__(
        self,
        pieces: Sequence[np.ndarray],
        length: int,
        pad_id: int,
        seed: int = 0,
        augmenter: Augmenter | None = None,
        crop: str = "random",
        onsets: Optional[Callable[[np.ndarray], np.ndarray]] = None,
        grammar: Grammar | None = None,
    ):
        if crop not in CROP_CHOICES:
            raise ConfigError(f"crop must be one of {CROP_CHOICES}, got {crop!r}")
        self.pieces, self.length, self.pad_id = pieces, length, pad_id
        self.seed, self.augmenter, self.crop, self.onsets = seed, augmenter, crop, onsets
        self.grammar = grammar

    def __len__(self) -> int:
        return len(self.pieces)

    def __getitem__(self, key: tuple[int, int]) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        position, piece = key
        rng = np.random.default_rng(derive_seed(self.seed, 1, position))
        ids = np.asarray(self.pieces[piece])
        if self.augmenter is not None:
            ids = self.augmenter.before_crop(ids, rng)
        span = self.length + 1
        start = int(rng.integers(0, len(ids) - span + 1)) if self.crop == "random" and len(ids) > span else 0
        upto = ids[: start + span] if self.grammar is not None else ids[start : start + span]
        if self.augmenter is not None:
            upto = self.augmenter.after_crop(upto, rng)
        window = upto[start:] if self.grammar is not None else upto
        out = np.full(span, self.pad_id, dtype=np.int64)
        out[: len(window)] = window
        if self.onsets is None and self.grammar is None:
            return torch.from_numpy(out)
        beats = torch.zeros(0, dtype=torch.float64)
        if self.onsets is not None:
            # on the whole piece as augmented (a bar skipped moves every onset); transposing keeps them
            times = self.onsets(ids)[start : start + len(window)]
            beats = np.full(span, times[-1], dtype=np.float64)
            beats[: len(times)] = times
            beats = torch.from_numpy(beats - times[0])
        if self.grammar is None:
            return torch.from_numpy(out), beats
        return torch.from_numpy(out), beats, torch.from_numpy(self.grammar.allowed_after(upto, start, self.length))


def batch_inputs(batch, device: torch.device) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(ids, beats or None, allowed or None) of a collated batch of CropDataset items, on `device`."""
    ids, beats, allowed = (*batch, None)[:3] if isinstance(batch, (list, tuple)) else (batch, None, None)
    beats = None if beats is None or not beats.numel() else beats.to(device, non_blocking=True)
    return ids.to(device, non_blocking=True), beats, None if allowed is None else allowed.to(device, non_blocking=True)


class StepBatches(torch.utils.data.Sampler):
    """The micro-batches one process trains on, from `start_step` on, forever.

    Step s owns global positions [s*B, (s+1)*B) with B = micro * accumulation * world. Rank r's
    a-th micro-batch of a step is the chunk (a * world + r) of that range, so the union over
    ranks is the same global batch for any world size. Position p lies in epoch p // epoch_size:
    "piece" sampling visits every piece once per epoch in a shuffled order; "length" sampling
    draws pieces in proportion to their length, total_tokens // length draws per epoch.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        crop_length: int,
        micro: int,
        accumulation: int,
        rank: int = 0,
        world: int = 1,
        seed: int = 0,
        sampling: str = "piece",
        start_step: int = 0,
    ):
        if sampling not in SAMPLING_CHOICES:
            raise ConfigError(f"sampling must be one of {SAMPLING_CHOICES}, got {sampling!r}")
        if not len(lengths):
            raise DataError("no pieces to train on")
        self.lengths = np.asarray(lengths, dtype=np.float64)
        self.micro, self.accumulation, self.rank, self.world = micro, accumulation, rank, world
        self.seed, self.sampling, self.start_step = seed, sampling, start_step
        self.epoch_size = len(lengths) if sampling == "piece" else max(1, int(self.lengths.sum()) // crop_length)
        self._epoch, self._order = -1, np.zeros(0, dtype=np.int64)

    @property
    def global_batch(self) -> int:
        return self.micro * self.accumulation * self.world

    def order(self, epoch: int) -> np.ndarray:
        """Piece indices of one epoch's positions."""
        rng = np.random.default_rng(derive_seed(self.seed, 2, epoch))
        if self.sampling == "piece":
            return rng.permutation(len(self.lengths))
        return rng.choice(len(self.lengths), size=self.epoch_size, p=self.lengths / self.lengths.sum())

    def piece_at(self, position: int) -> int:
        epoch, offset = divmod(position, self.epoch_size)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, self.order(epoch)
        return int(self._order[offset])

    def step_batches(self, step: int) -> list[list[tuple[int, int]]]:
        """This rank's micro-batches of `step`, as lists of (position, piece) keys."""
        batches = []
        for a in range(self.accumulation):
            first = step * self.global_batch + (a * self.world + self.rank) * self.micro
            batches.append([(p, self.piece_at(p)) for p in range(first, first + self.micro)])
        return batches

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        step = self.start_step
        while True:
            yield from self.step_batches(step)
            step += 1

    def __len__(self) -> int:  # infinite; DataLoader only needs this for len(loader)
        raise TypeError("StepBatches is endless")
