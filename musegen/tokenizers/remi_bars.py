"""Where REMI's bars start. REMI bars hold 4 quarter notes: time signatures of 1, 2 or 4 quarters
per bar are read as 4/4 from tick 0 (POP909 writes 1/4 or 2/4 over music in 4/4), and a 4-quarter
signature that starts off that grid begins a new bar there: after a pickup, before the first
note or after the last. Where notes come before and after it (a lone 2/4 bar inside 4/4), the
bar before it would be padded with silence, so the file is refused, naming that bar; so are
other meters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MidiError
from ..music.constants import BEATS_PER_BAR
from ..music.meter import bar_at, off_the_bar_lines, signature_changes
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
        changes = signature_changes(table.time_signatures)
        restarts = [0]
        for tick, numerator, denominator in changes:
            quarters = numerator * 4 / denominator if denominator else 0
            if quarters not in (1, 2, 4):
                raise MidiError(
                    f"{name}: bar {bar_at(changes, tpq, tick)[0]}: time signature {numerator}/{denominator} at tick "
                    f"{tick}; REMI needs 4/4 (1/4 and 2/4 are re-barred into 4/4)"
                )
            if quarters == 4 and (tick - restarts[-1]) % (BEATS_PER_BAR * tpq):
                if tick % tpq:
                    raise MidiError(
                        f"{name}: bar {bar_at(changes, tpq, tick)[0]}: time signature {numerator}/{denominator} "
                        f"at tick {tick} starts a bar off the beat; REMI bars start on beats"
                    )
                restarts.append(tick)
        starts = np.array(restarts, dtype=np.int64) // tpq * resolution
        origins = np.zeros(len(starts), dtype=np.int64)
        if len(starts) > 1 and starts[1] < bar:  # a pickup
            origins[0] = bar - starts[1]
        onsets = table.pitched().start
        first, last = (int(onsets.min()), int(onsets.max())) if len(onsets) else (0, 0)
        for k in range(1, len(starts)):
            origins[k] = -(-(origins[k - 1] + starts[k] - starts[k - 1]) // bar) * bar
            # the bar before a restart is padded with silence: exact only before or after the music
            if origins[k] > origins[k - 1] + starts[k] - starts[k - 1] and first < restarts[k] <= last:
                raise MidiError(off_the_bar_lines(name, changes, tpq, restarts[k], "REMI encodes"))
        return cls(starts, origins)

    def position(self, steps: np.ndarray) -> np.ndarray:
        segment = np.maximum(np.searchsorted(self.starts, steps, side="right") - 1, 0)
        return self.origins[segment] + np.asarray(steps) - self.starts[segment]
