"""Two-bar groove patterns, the copy test's material (`musegen evaluate copy`): a few grooves built
here (`BUILT_GROOVES`: drums, a bass figure and a chord rhythm, at several tempos), patterns cut
from real pieces (`cut_pattern`), and a pattern played on as a loop (`looped`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .constants import BEATS_PER_BAR
from .notes import NoteTable, Track
from .roles import BASS, DRUMS, OTHER, TRACKS

PATTERN_BARS = 2
TPQ = 480  # ticks per beat of the patterns built here
DEFAULT_TEMPO = 120.0  # MIDI's tempo where a file sets none


@dataclass
class Pattern:
    """PATTERN_BARS bars of a multi-track piece (notes from tick 0, none past the pattern's end)."""

    name: str
    source: str  # "corpus" or "built"
    notes: NoteTable


def cut_pattern(notes: NoteTable, first_bar: int, name: str, source: str) -> Pattern:
    """Bars first_bar .. first_bar + PATTERN_BARS - 1 of `notes` as a pattern: the notes that start
    in them, moved to tick 0 and ended at the pattern's end at the latest, on the tracks that play
    there; the tempo in effect at its start, in 4/4."""
    bar = BEATS_PER_BAR * notes.tpq
    lo, hi = first_bar * bar, (first_bar + PATTERN_BARS) * bar
    kept = notes.select((notes.start >= lo) & (notes.start < hi))
    rows = np.stack([kept.start - lo, np.minimum(kept.end, hi) - lo, kept.pitch, kept.velocity], 1)
    tracks = [(track, rows[kept.track == k]) for k, track in enumerate(notes.tracks) if np.any(kept.track == k)]
    tempos = [(0, _tempo_at(notes, lo))]
    return Pattern(name, source, NoteTable.of_tracks(notes.tpq, tracks, tempos, [(0, BEATS_PER_BAR, 4)]))


def _tempo_at(notes: NoteTable, tick: int) -> float:
    before = [qpm for time, qpm in sorted(notes.tempos, key=lambda t: t[0]) if time <= tick]
    return float(before[-1]) if before else DEFAULT_TEMPO


def looped(pattern: Pattern, bars: int) -> NoteTable:
    """The pattern played on for `bars` bars (a whole number of repeats, or cut in the last)."""
    notes = pattern.notes
    length = PATTERN_BARS * BEATS_PER_BAR * notes.tpq
    end = bars * BEATS_PER_BAR * notes.tpq
    repeats = math.ceil(bars / PATTERN_BARS)
    tracks = []
    for k, track in enumerate(notes.tracks):
        mine = notes.select(notes.track == k)
        rows = np.stack([mine.start, mine.end, mine.pitch, mine.velocity], 1)
        copies = [rows + [r * length, r * length, 0, 0] for r in range(repeats)]
        played = np.concatenate(copies) if copies else rows[:0]
        tracks.append((track, played[played[:, 0] < end]))
    return NoteTable.of_tracks(notes.tpq, tracks, notes.tempos, notes.time_signatures)


# ---- the grooves built here ---------------------------------------------------------------------


# Each groove: tempo, then per role (program, is_drum) the notes of its 2 bars as (beat, length,
# pitch); the second bar moves to another chord, so the two bars differ.
def _groove(
    tempo: float, bass: list, drums: list, chords: list, bass_program: int = 33, chord_program: int = 0
) -> dict:
    return {"tempo": tempo, "parts": [(bass_program, False, bass), (0, True, drums), (chord_program, False, chords)]}


def _each(beats, length: float, pitches) -> list[tuple[float, float, int]]:
    return [(b, length, p) for b in beats for p in pitches]


KICK, SNARE, HAT, RIDE, RIM = 36, 38, 42, 51, 37
C_MAJOR, F_MAJOR, A_MINOR, D_MINOR = (60, 64, 67), (60, 65, 69), (57, 60, 64), (57, 62, 65)
BUILT_GROOVES = {
    "rock-8ths": _groove(
        120,
        bass=_each([0, 1.5, 2, 3], 0.5, [36]) + _each([4, 5.5, 6, 7], 0.5, [41]),
        drums=_each([0, 2.5, 4, 6.5], 0.25, [KICK])
        + _each([1, 3, 5, 7], 0.25, [SNARE])
        + _each(np.arange(0, 8, 0.5), 0.25, [HAT]),
        chords=_each([0], 4, C_MAJOR) + _each([4], 4, F_MAJOR),
    ),
    "funk-16ths": _groove(
        100,
        bass=_each([0, 0.75, 1.5], 0.25, [33])
        + _each([2.5, 3.25], 0.25, [45])
        + _each([4, 4.75, 5.5], 0.25, [38])
        + _each([6.5, 7.25], 0.25, [50]),
        drums=_each([0, 0.75, 2.5, 4, 4.75, 6.5], 0.25, [KICK])
        + _each([1, 3, 5, 7], 0.25, [SNARE])
        + _each(np.arange(0, 8, 0.25), 0.125, [HAT]),
        chords=_each([0.5, 1.75, 3.5], 0.25, A_MINOR) + _each([4.5, 5.75, 7.5], 0.25, D_MINOR),
        chord_program=27,
    ),
    "bossa": _groove(
        140,
        bass=_each([0, 1.5], 0.5, [36])
        + _each([2, 3.5], 0.5, [43])
        + _each([4, 5.5], 0.5, [38])
        + _each([6, 7.5], 0.5, [45]),
        drums=_each([0, 1.5, 2, 3.5, 4, 5.5, 6, 7.5], 0.25, [KICK])
        + _each([0, 1.5, 3, 4.5, 5.5, 6.5], 0.25, [RIM])
        + _each(np.arange(0, 8, 0.5), 0.25, [HAT]),
        chords=_each([0, 1.5, 3], 1, C_MAJOR) + _each([4.5, 5.5, 7], 1, D_MINOR),
        chord_program=24,
    ),
    "shuffle": _groove(
        90,
        bass=_each([0, 1, 2, 3], 2 / 3, [36])
        + _each([b + 2 / 3 for b in range(4)], 1 / 3, [43])
        + _each([4, 5, 6, 7], 2 / 3, [41])
        + _each([b + 2 / 3 for b in range(4, 8)], 1 / 3, [48]),
        drums=_each([0, 2, 4, 6], 0.25, [KICK])
        + _each([1, 3, 5, 7], 0.25, [SNARE])
        + _each([b + t for b in range(8) for t in (0, 2 / 3)], 0.25, [RIDE]),
        chords=_each([1, 3], 2 / 3, C_MAJOR) + _each([5, 7], 2 / 3, F_MAJOR),
    ),
}


def built_patterns() -> list[Pattern]:
    """The grooves of BUILT_GROOVES as patterns: unnamed tracks (bass, drums, other), velocity 100."""
    patterns = []
    for name, groove in BUILT_GROOVES.items():
        tracks = [
            (Track(None, program, is_drum, TRACKS[role]), [_ticks(b, d, p) for b, d, p in notes])
            for role, (program, is_drum, notes) in zip((BASS, DRUMS, OTHER), groove["parts"])
        ]
        notes = NoteTable.of_tracks(TPQ, tracks, [(0, float(groove["tempo"]))], [(0, BEATS_PER_BAR, 4)])
        patterns.append(Pattern(f"built/{name}", "built", notes))
    return patterns


def _ticks(beat: float, length: float, pitch: int) -> tuple[int, int, int, int]:
    return round(beat * TPQ), round((beat + length) * TPQ), int(pitch), 100
