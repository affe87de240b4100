"""Synchronising a score to annotated beats, so that its bars are the music's bars.

The Pop1K7 pipeline re-timed every transcription to tracked beats before tokenising: 480 ticks
between consecutive beats, the tempo from the beat intervals, the first downbeat at bar 1. A
MIDI file's own grid can be offset from the music's (POP909's is, which is why it ships beat
annotations), and then every REMI bar line and 16th falls in the wrong place.

`synchronise` does what that pipeline did, bar by bar: each annotated bar (downbeat to next
downbeat) of k beats becomes max(1, round(k / 4)) bars of 4/4 with its k beats spread evenly,
so every annotated downbeat is a bar line; a regular bar gets 480 ticks per beat, an irregular
one (2, 3, 5, 6 beats) is stretched or squeezed. Beats before the first downbeat (a pickup) and
after the last one get 480 ticks each, and time outside the annotated beats follows the nearest
beat interval. The tempo changes at every beat to the rate that beat needs, so every note keeps
its time in seconds, up to one constant: the re-timed score starts at the bar line at or before
the first note or beat, at the first beat interval's tempo, so its tick 0 is not at 0 s.
"""

from __future__ import annotations

import numpy as np
import symusic

from ..errors import DataError
from .constants import BEATS_PER_BAR, TICKS_PER_BEAT


def round_half_even(numerator, denominator: int) -> np.ndarray:
    """numerator / denominator rounded to the nearest integer, halves to even, exactly, in integers:
    Python's `round` and numpy's rule, which the reference pipelines apply to tick ratios (groove:
    `ticks * 12 / resolution`; REMI: onsets and durations on its grid)."""
    quotient, remainder = np.divmod(np.asarray(numerator, dtype=np.int64), denominator)
    up = (2 * remainder > denominator) | ((2 * remainder == denominator) & (quotient % 2 == 1))
    return quotient + up


def beat_ticks(downbeat: np.ndarray, tpq: int = TICKS_PER_BEAT) -> np.ndarray:
    """The tick of every annotated beat (first downbeat at tick 0, a pickup before it negative)."""
    downbeats = np.flatnonzero(downbeat)
    n, bar = len(downbeat), BEATS_PER_BAR * tpq
    if len(downbeats) == 0:
        raise DataError("the beat annotations mark no downbeat")
    ticks = np.zeros(n, dtype=np.float64)
    first, last = downbeats[0], downbeats[-1]
    ticks[:first] = (np.arange(first) - first) * tpq
    at = 0
    for a, b in zip(downbeats[:-1], downbeats[1:]):
        bars = max(1, round((b - a) / BEATS_PER_BAR))
        ticks[a:b] = at + np.arange(b - a) * (bars * bar / (b - a))
        at += bars * bar
    ticks[last:] = at + np.arange(n - last) * tpq
    return np.round(ticks).astype(np.int64)


def synchronise(
    score: symusic.Score, seconds: np.ndarray, downbeat: np.ndarray, tpq: int = TICKS_PER_BEAT, meters: bool = False
) -> symusic.Score:
    """`score` re-timed so that the beats at `seconds` (with `downbeat` flags) lie on its grid at
    `tpq` ticks per beat, in 4/4 from tick 0; see the module's docstring. With `meters`, every
    beat is `tpq` ticks long instead and each annotated bar of k beats is a bar of k/4 (time
    signatures where k changes; music before the first downbeat is a pickup bar). Drum and
    pitched tracks are kept as they are, notes included; markers, lyrics and pedals are left out."""
    seconds = np.asarray(seconds, dtype=np.float64)
    downbeat = np.asarray(downbeat, dtype=bool)
    if len(seconds) < 2 or len(seconds) != len(downbeat) or not (np.diff(seconds) > 0).all():
        raise DataError("beat annotations need at least two beats, in increasing time")
    if meters and not downbeat.any():
        raise DataError("the beat annotations mark no downbeat")
    beats = (np.arange(len(seconds)) - np.argmax(downbeat)) * tpq if meters else beat_ticks(downbeat, tpq)
    timed = score.to("second")

    def ticks_at(t: np.ndarray) -> np.ndarray:
        """Piecewise linear through the beats, extended by the first and last interval."""
        k = np.clip(np.searchsorted(seconds, t, side="right") - 1, 0, len(seconds) - 2)
        return beats[k] + (t - seconds[k]) * (beats[k + 1] - beats[k]) / (seconds[k + 1] - seconds[k])

    starts = [ticks_at(t.notes.numpy()["time"].astype(np.float64)) for t in timed.tracks]
    earliest = min([beats[0]] + [s.min() for s in starts if len(s)])
    step = tpq if meters else BEATS_PER_BAR * tpq  # a pickup is whole beats, or whole 4/4 bars
    shift = step * max(0, -int(np.floor(earliest / step)))  # nothing before tick 0
    out = symusic.Score(tpq)
    signatures = annotated_meters(downbeat, shift // tpq) if meters else [(0, 4)]
    for beat, numerator in signatures:
        out.time_signatures.append(symusic.TimeSignature(beat * tpq, numerator, 4))
    mspq = np.round(1e6 * np.diff(seconds) * tpq / np.diff(beats)).astype(np.int64)
    at = np.r_[0, beats[1:-1] + shift]  # tick 0 takes the first interval's tempo
    keep = np.r_[True, mspq[1:] != mspq[:-1]]
    for tick, value in zip(at[keep].tolist(), mspq[keep].tolist()):
        out.tempos.append(symusic.Tempo(tick, mspq=value))
    for track, start in zip(timed.tracks, starts):
        notes = track.notes.numpy()
        begin = np.round(start + shift).astype(np.int64)
        end = np.round(ticks_at(notes["time"] + notes["duration"].astype(np.float64)) + shift).astype(np.int64)
        copy = symusic.Track(track.name, track.program, track.is_drum)
        copy.notes = symusic.Note.from_numpy(
            begin.astype(np.int32), np.maximum(end - begin, 0).astype(np.int32), notes["pitch"], notes["velocity"]
        )
        out.tracks.append(copy)
    return out


def annotated_meters(downbeat: np.ndarray, pickup: int) -> list[tuple[int, int]]:
    """(beat, beats per bar) where the annotated bar length changes, the first downbeat at beat
    `pickup`: the beats before it are a bar of their own (4/4 bars, then the rest, when longer
    than a bar); the last bar is as long as the one before it."""
    bars = np.diff(np.r_[np.flatnonzero(downbeat), len(downbeat)])
    if len(bars) > 1:
        bars[-1] = bars[-2]
    whole, rest = divmod(pickup, BEATS_PER_BAR)
    out = ([(0, rest)] if rest else []) + ([(rest, BEATS_PER_BAR)] if whole else [])
    for at, length in zip((pickup + np.r_[0, np.cumsum(bars)[:-1]]).tolist(), bars.tolist()):
        if not out or out[-1][1] != length:
            out.append((at, length))
    return out
