"""What a sampler follows token by token as a piece grows, declared by each tokenizer: its onset
in beats (`OnsetClock`, for positions in beats) and which tokens name which track
(`TrackMarks`, for `KeepTracks`)."""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np


class OnsetClock(abc.ABC):
    """A piece's onset in beats, kept token by token (`Tokenizer.onset_clock`): the sampler holds
    one per sample and advances it on each token written, in constant time, where `onsets` of
    the whole sequence would cost its length at every step. It holds a few numbers, so
    `copy.copy` forks it (one prompt, several samples)."""

    @abc.abstractmethod
    def advance(self, token: int) -> float:
        """The onset of `token`, appended to the tokens advanced so far."""


@dataclass(frozen=True)
class TrackMarks:
    """`track_of[id]`: the track a token names (-1: none); bars are counted at `bar_id` tokens,
    or without one as `beats_per_bar` beats of the onset clock (groove's fixed 4/4)."""

    track_of: np.ndarray
    bar_id: int | None = None
    beats_per_bar: float = 4.0
