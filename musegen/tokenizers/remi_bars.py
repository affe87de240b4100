"""Where REMI's bars start. REMI bars hold 4 quarter notes: time signatures of 1, 2 or 4 quarters
per bar are read as 4/4 from tick 0 (POP909 writes 1/4 or 2/4 over music in 4/4), and a 4-quarter
signature that starts off that grid begins a new bar there. Other meters are refused."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MidiError
from ..music.constants import BEATS_PER_BAR
from ..music.notes import NoteTable


@dataclass
class BarGrid:
    """Where bars start: grid steps (from tick 0) map to positions of a grid in which every bar
    has `bar` cells. A time signature change that moves the bar lines starts a segment: its
    first step opens a new bar, and the bar before it stays short (padded with silence). A first
    segment shorter than a bar is a pickup: it ends at the first bar line instead."""

    starts: np.ndarray  # first grid step of each segment
    origins: np.ndarray  # position of each segment's first step

    @classmethod
    def of(cls, table: NoteTable, name: str, resolution: int, bar: int) -> BarGrid:
        """The grid of `table`'s time signatures, `resolution` steps per beat, `bar` cells per bar."""
        tpq = table.tpq
        signatures = {}  # tick -> the last (numerator, denominator) at that tick
        for tick, numerator, denominator in sorted(table.time_signatures, key=lambda ts: ts[0]):
            signatures[tick] = numerator, denominator
        restarts = [0]
        for tick, (numerator, denominator) in signatures.items():
            quarters = numerator * 4 / denominator if denominator else 0
            if quarters not in (1, 2, 4):
                raise MidiError(
                    f"{name}: time signature {numerator}/{denominator} at tick {tick}; "
                    "REMI needs 4/4 (1/4 and 2/4 are re-barred into 4/4)"
                )
            if quarters == 4 and (tick - restarts[-1]) % (BEATS_PER_BAR * tpq):
                if tick % tpq:
                    raise MidiError(
                        f"{name}: time signature {numerator}/{denominator} at tick {tick} "
                        "starts a bar off the beat; REMI bars start on beats"
                    )
                restarts.append(tick)
        starts = np.array(restarts, dtype=np.int64) // tpq * resolution
        origins = np.zeros(len(starts), dtype=np.int64)
        if len(starts) > 1 and starts[1] < bar:  # a pickup
            origins[0] = bar - starts[1]
        for k in range(1, len(starts)):
            origins[k] = -(-(origins[k - 1] + starts[k] - starts[k - 1]) // bar) * bar
        return cls(starts, origins)

    def position(self, steps: np.ndarray) -> np.ndarray:
        segment = np.maximum(np.searchsorted(self.starts, steps, side="right") - 1, 0)
        return self.origins[segment] + np.asarray(steps) - self.starts[segment]
