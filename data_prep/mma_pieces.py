"""What each piece of the MMA corpus plays: a POP909 song's chord annotations as MMA chords,
cut to BARS_PER_PIECE bars and, beyond a style's plain pieces, varied (key, tempo, MMA
treatments, fills) by hashing, so that a rerun plans the same pieces.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musegen.errors import DataError

from .mma_styles import Style

PIECES_PER_STYLE = 4  # plain pieces per style; `scale` adds variants up to scale x this many
BARS_PER_PIECE = 32
# a variant takes at most one treatment (mma_render.TREATMENTS) of each group
TREATMENT_GROUPS = (("swing",), ("staccato", "legato"), ("inverted", "higher", "strummed"))
KEY_SHIFTS = range(-5, 7)  # semitones a variant's progression moves by
TEMPO_FACTORS = (0.85, 1.0, 1.15)


@dataclass(frozen=True)
class Piece:
    """One rendering of a style: BARS_PER_PIECE bars of a POP909 song's progression from
    `first_bar`, moved by `key` semitones, at `tempo`, played with `treatments` (names in
    mma_render.TREATMENTS) and with the `fill` groove in the last bar of every phrase."""

    style: Style
    k: int
    song: str
    first_bar: int
    tempo: int
    key: int = 0
    treatments: tuple[str, ...] = ()
    fill: str | None = None

    @property
    def name(self) -> str:
        return f"{self.style.name}/{self.k}"

    @property
    def seed(self) -> int:
        """MMA's random seed (its humanisation), so a rerun renders the same notes."""
        return stable_hash(self.style.name, self.k) % 100_000

    @property
    def variant(self) -> str:
        """What the piece plays beyond its groove ("" for the groove as its library defines it)."""
        return "+".join(self.treatments + ((f"fill:{self.fill}",) if self.fill else ()))


ROOTS = ["C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B"]
NATURAL = {"C": 0, "D": 2, "E": 4, "F": 5, "G": 7, "A": 9, "B": 11}
QUALITIES = {  # POP909 (Harte) quality -> MMA chord suffix
    "maj": "",
    "min": "m",
    "sus2": "sus2",
    "sus4": "sus4",
    "min7": "m7",
    "maj7": "M7",
    "7": "7",
    "maj6": "6",
    "min6": "m6",
    "dim": "dim",
    "dim7": "dim7",
    "hdim7": "m7b5",
    "aug": "aug",
    "minmaj7": "mM7",
    "sus4(b7)": "7sus4",
    "9": "9",
    "maj9": "M9",
    "min9": "m9",
}
CHORD_NAME = re.compile(r"([A-G][#b]?)([^/]*)(?:/([A-G][#b]?))?")  # root, quality, bass of an MMA chord
INTERVALS = {
    "b2": 1,
    "2": 2,
    "b3": 3,
    "3": 4,
    "4": 5,
    "b5": 6,
    "5": 7,
    "#5": 8,
    "b6": 8,
    "6": 9,
    "b7": 10,
    "7": 11,
    "9": 2,
}


def pitch_class(root: str) -> int:
    """0-11 of a root spelled with sharps or flats (`Bb` -> 10, `B#` -> 0)."""
    return (NATURAL[root[0]] + root[1:].count("#") - root[1:].count("b")) % 12


def mma_chord(label: str) -> str | None:
    """A POP909 chord label (`Bb:min7/b7`) as an MMA chord name (`Bbm7/Ab`); None for N/unknown."""
    root, _, rest = label.partition(":")
    if root in ("N", "X", "") or root[0] not in NATURAL:
        return None
    pc = pitch_class(root)
    quality, _, bass = rest.partition("/")
    suffix = QUALITIES.get(quality, "m" if quality.startswith("min") else "")
    name = ROOTS[pc] + suffix
    if bass in INTERVALS:
        name += "/" + ROOTS[(pc + INTERVALS[bass]) % 12]
    return name


def beat_chords(song_dir: Path) -> tuple[list[float], list[bool], list[str | None]]:
    """A song's annotated beats: their times (seconds), downbeat flags and the MMA chord sounding
    at each (None where the annotation has no chord)."""
    beats, downbeat = [], []
    for line in (song_dir / "beat_midi.txt").read_text().splitlines():
        cols = line.split()
        if len(cols) >= 3:
            beats.append(float(cols[0]))
            downbeat.append(float(cols[2]) == 1.0)
    segments = []
    for line in (song_dir / "chord_midi.txt").read_text().splitlines():
        cols = line.split()
        if len(cols) >= 3:
            segments.append((float(cols[0]), float(cols[1]), mma_chord(cols[2])))
    chords, k = [], 0
    for t in beats:
        t += 0.05  # annotation boundaries sit on beats up to a few ms
        while k < len(segments) - 1 and segments[k][1] <= t:
            k += 1
        chords.append(segments[k][2] if segments and segments[k][0] <= t < segments[k][1] else None)
    return beats, downbeat, chords


def song_bars(song_dir: Path) -> list[list[str]]:
    """A song's chords, one per beat, grouped in bars of 4 from its first downbeat. Bars with no
    chord at the start are dropped; a no-chord beat holds the chord before it (or, at the very
    start, the first chord)."""
    beats, downbeat, chords = beat_chords(song_dir)
    if not beats or True not in downbeat:
        return []
    chords = chords[downbeat.index(True) :]
    labelled = [i for i, c in enumerate(chords) if c is not None]
    if not labelled:
        return []
    first_bar = labelled[0] // 4 * 4  # keep the bar lines where the annotation has them
    held = chords[labelled[0]]
    for i in range(first_bar, len(chords)):
        held = chords[i] = chords[i] or held
    return [chords[i : i + 4] for i in range(first_bar, len(chords) - 3, 4)]


def progressions(pop909: Path) -> list[tuple[str, list[list[str]]]]:
    """(song, bars) for every POP909 song with at least BARS_PER_PIECE bars of chords."""
    if not pop909.is_dir():
        raise DataError(
            f"{pop909}: POP909 folder not found (its chord annotations drive the "
            f"MMA corpus); pass --source, or prepare pop909 with --download first"
        )
    found = []
    for song_dir in sorted(p for p in pop909.iterdir() if (p / "chord_midi.txt").is_file()):
        try:
            bars = song_bars(song_dir)
        except (OSError, ValueError):
            continue
        if len(bars) >= BARS_PER_PIECE:
            found.append((song_dir.name, bars))
    if not found:
        raise DataError(f"{pop909}: no song with {BARS_PER_PIECE} bars of chord annotations")
    return found


def stable_hash(*parts: Any) -> int:
    """The same number for the same parts on every run and machine (unlike the salted `hash`)."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big")


def piece_plan(
    style: Style, k: int, songs: list[tuple[str, list[list[str]]]], fills: list[str] = ()
) -> tuple[Piece, list[list[str]]]:
    """Piece k of a style and its bars of chords. The first PIECES_PER_STYLE pieces play the
    groove as it is; the others are variants, each chosen by hashing: a key (-5..+6), a tempo
    around the style's, at most one treatment of each group and, for half of them, the fill of
    the groove's family whose name is closest to the groove's."""
    song, bars = songs[stable_hash(style.name, k) % len(songs)]
    first = stable_hash(style.name, k, "bar") % (len(bars) - BARS_PER_PIECE + 1)
    bars = bars[first : first + BARS_PER_PIECE]
    if k < PIECES_PER_STYLE:
        return Piece(style, k, song, first, style.tempo), bars
    draw = lambda what, n: stable_hash(style.name, k, what) % n
    key = KEY_SHIFTS[draw("key", len(KEY_SHIFTS))]
    tempo = round(style.tempo * TEMPO_FACTORS[draw("tempo", len(TEMPO_FACTORS))])
    treatments = tuple(
        group[i]
        for group in TREATMENT_GROUPS
        if (i := draw(group[0], len(group) + 2)) < len(group) and (style.swings or group[i] != "swing")
    )
    fill = None
    if fills and draw("fill", 2):
        fill = max(fills, key=lambda f: len(os.path.commonprefix([f.lower(), style.groove.lower()])))
    return (
        Piece(style, k, song, first, tempo, key, treatments, fill),
        [[transpose_chord(c, key) for c in bar] for bar in bars],
    )


def transpose_chord(name: str, semitones: int) -> str:
    """An MMA chord name moved by `semitones` (`Bbm7/Ab` + 2 -> `Cm7/Bb`); `/` (hold) stays."""

    def move(root: str) -> str:
        return ROOTS[(pitch_class(root) + semitones) % 12]

    match = CHORD_NAME.fullmatch(name)
    if not match:
        return name
    root, quality, bass = match.groups()
    return move(root) + quality + (f"/{move(bass)}" if bass else "")
