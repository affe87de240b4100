"""The copy score (`musegen evaluate copy`): how exactly each bar of a continuation repeats the bar
of the prompt's loop with the same phase.

Per role (bass, drums, other, `musegen.music.roles`), a bar is compared with the loop's bar of
phase b mod `pattern_bars` by the F1 of their (onset tick within the bar, pitch) sets,
2 |A & B| / (|A| + |B|); a bar where neither plays in that role is left out (NaN), a role's score
is the mean over the other bars: a loop played exactly scores 1, silence or a transposed copy 0,
a copy one step late 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..music.notes import NoteTable
from .metric import Metric, Span, nan_mean


def bar_keys(notes: NoteTable, role: str, bar: int, tpq: int) -> set[tuple[int, int]]:
    """(onset tick within the bar at `tpq` ticks a beat, pitch) of `role`'s notes starting in `bar`."""
    mine = notes.in_role(role).onsets_in(bar, 1)
    ticks = np.rint(mine.beats(mine.start - notes.bar_tick(bar)) * tpq).astype(np.int64)
    return set(zip(ticks.tolist(), mine.pitch.tolist()))


def f1(found: set, wanted: set) -> float:
    """2 |found & wanted| / (|found| + |wanted|); NaN when both are empty."""
    total = len(found) + len(wanted)
    return 2 * len(found & wanted) / total if total else math.nan


@dataclass
class Loop:
    """What a continuation should repeat: per role, the (onset, pitch) set of each bar of the loop,
    from bar `first_bar` of a piece (the prompt's last repeat, as the tokenizer gave it back)."""

    tpq: int
    bars: dict[str, list[set[tuple[int, int]]]]

    @classmethod
    def of(cls, notes: NoteTable, first_bar: int, pattern_bars: int, roles: tuple[str, ...]) -> Loop:
        """`first_bar`: a multiple of `pattern_bars`, so that bar b has phase b mod pattern_bars."""
        keys = {role: [bar_keys(notes, role, first_bar + k, notes.tpq) for k in range(pattern_bars)] for role in roles}
        return cls(notes.tpq, keys)

    def bar_scores(self, notes: NoteTable, first_bar: int, bars: int) -> dict[str, list[float]]:
        """Per role: the F1 of each bar first_bar .. first_bar + bars - 1 against the loop's bar
        of the same phase (NaN where neither plays)."""
        return {
            role: [
                f1(bar_keys(notes, role, b, self.tpq), wanted[b % len(wanted)])
                for b in range(first_bar, first_bar + bars)
            ]
            for role, wanted in self.bars.items()
        }

    def scores(self, notes: NoteTable, first_bar: int, bars: int) -> dict[str, float]:
        """Per role: the mean of `bar_scores` over the bars where either plays (NaN where neither
        ever does)."""
        return {role: nan_mean(values) for role, values in self.bar_scores(notes, first_bar, bars).items()}


class CopyScore(Metric):
    """The copy score of a span against `context["loop"]` (a `Loop`): per role, and "by_bar" the
    mean over roles of each bar."""

    needs = ("loop",)

    def compute(self, span: Span) -> dict[str, float | list[float]]:
        by_bar = span.context["loop"].bar_scores(span.notes, span.first_bar, span.bars)
        return {role: nan_mean(v) for role, v in by_bar.items()} | {
            "by_bar": [nan_mean(bar) for bar in zip(*by_bar.values())]
        }
