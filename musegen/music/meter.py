"""A MIDI file's own bars, from its time signatures: so that a tokenizer refusing a meter it cannot
write names the bar, as the file's reader counts it."""

from __future__ import annotations

import math


def signature_changes(time_signatures) -> list[tuple[int, int, int]]:
    """(tick, numerator, denominator) of each change, in time order: the last one at a tick wins,
    and 4/4 (MIDI's default) holds until the first."""
    at = {0: (4, 4)}
    for tick, numerator, denominator in sorted(time_signatures, key=lambda ts: ts[0]):
        at[int(tick)] = int(numerator), int(denominator)
    return [(tick, n, d) for tick, (n, d) in sorted(at.items())]


def main_signature(changes: list[tuple[int, int, int]], end: int) -> tuple[int, int]:
    """(numerator, denominator) of the signature that holds the most ticks up to `end`, all its
    changes summed (a pickup bar of 1/4 does not name the file's meter); a signature of no beats
    (0/4, 4/0: a broken file) names nothing, and 4/4 stands where nothing else is named."""
    held: dict[tuple[int, int], int] = {}
    for k, (tick, numerator, denominator) in enumerate(changes):
        stop = changes[k + 1][0] if k + 1 < len(changes) else max(end, tick)
        if numerator > 0 and denominator > 0:
            held[(numerator, denominator)] = held.get((numerator, denominator), 0) + stop - tick
    return max(held, key=held.get) if held else (4, 4)


def bar_at(changes: list[tuple[int, int, int]], tpq: int, tick: int) -> tuple[int, str]:
    """The file's bar (counted from 1) that holds `tick`, and its meter ("2/4"): each time signature
    starts a bar, and its bars follow at its length."""
    bar, (start, numerator, denominator) = 1, changes[0]
    for change in changes[1:]:
        if change[0] > tick:
            break
        bar += math.ceil((change[0] - start) / _length(numerator, denominator, tpq))
        start, numerator, denominator = change
    return bar + int((tick - start) // _length(numerator, denominator, tpq)), f"{numerator}/{denominator}"


def bar_start(changes: list[tuple[int, int, int]], tpq: int, bar: int) -> int:
    """The tick where the file's bar `bar` (counted from 1) starts, as `bar_at` counts bars."""
    first, (start, numerator, denominator) = 1, changes[0]
    for change in changes[1:]:
        bars = math.ceil((change[0] - start) / _length(numerator, denominator, tpq))
        if first + bars > bar:
            break
        first += bars
        start, numerator, denominator = change
    return round(start + (bar - first) * _length(numerator, denominator, tpq))


def off_the_bar_lines(name: str, changes: list[tuple[int, int, int]], tpq: int, tick: int, who: str) -> str:
    """The one-line refusal of a file whose bars leave the 4/4 grid at `tick`: names the bar before it."""
    bar, meter = bar_at(changes, tpq, tick - 1)
    return (
        f"{name}: bar {bar} is in {meter} and ends off the 4/4 bar lines (at tick {tick}); "
        f"{who} 4/4 bars only (2/4 bars in pairs)"
    )


def _length(numerator: int, denominator: int, tpq: int) -> float:
    """Ticks per bar; a bar of no length (a fuzzed 0/x) counts as one tick, so counting ends."""
    return max(numerator * 4 * tpq / denominator if denominator else 0, 1)
