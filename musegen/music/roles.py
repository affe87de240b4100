"""Which track of a piece plays bass, drums and the accompaniment ("other").

- Groove2Groove layout (every track with notes named `BB Bass`, `BB Drums`, `BB Guitar`,
  `BB Piano` or `BB Strings`): roles by name, same names merged; these files open with a 2-bar
  count-in, which `read_trio` drops as the reference does;
- musegen's own layout (`Bass`, `Drums` on the drum channel, `Other`, as the groove tokenizers
  write): by name;
- any other file: drums are the drum-channel tracks; bass is the busiest track with a GM bass
  program (32-39), else with "bass" in its name, else the lowest (mean pitch) melodic track.
The candidates for "other" are the remaining melodic tracks (`Roles.busiest` picks one).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

import numpy as np

from .midi import Parsed, Part, read_parts

BASS, DRUMS, OTHER = 1, 2, 3  # the track numbers of the groove representations
TRACKS = {BASS: "bass", DRUMS: "drums", OTHER: "other"}
ROLE_NAMES = {BASS: "Bass", DRUMS: "Drums", OTHER: "Other"}  # the track names musegen writes
BASS_PROGRAMS = range(32, 40)  # General MIDI: acoustic bass .. synth bass 2
GM_KIT = range(35, 82)  # General MIDI percussion keys: acoustic bass drum .. open triangle
GM_FAMILY_SIZE = 8  # General MIDI programs come in families of 8 (pianos, ..., guitars, basses, ...)
GM_FAMILIES = 128 // GM_FAMILY_SIZE
BASS_NAME = re.compile("bass", re.IGNORECASE)

# Groove2Groove's track names (Band-in-a-Box exports).
G2G_BASS, G2G_DRUMS = "BB Bass", "BB Drums"
G2G_HARMONIC = ("BB Guitar", "BB Piano", "BB Strings")
G2G_NAMES = frozenset((G2G_BASS, G2G_DRUMS) + G2G_HARMONIC)
COUNT_IN_BEATS = 8  # Groove2Groove files open with a 2-bar count-in
COUNT_IN_GRID = 12  # units per beat of the grid on which the reference rounds the count-in cut


def layout_of(parts: list[Part]) -> str:
    """ "g2g" (Groove2Groove names), "musegen" (the names `decode` writes) or "inferred"."""
    playing = [p for p in parts if len(p.notes)]
    names = {p.name for p in playing}
    if names and names <= G2G_NAMES:
        return "g2g"
    if names and names <= set(ROLE_NAMES.values()) and all(p.is_drum == (p.name == ROLE_NAMES[DRUMS]) for p in playing):
        return "musegen"
    return "inferred"


def drop_count_in(parsed: Parsed, beats: int = COUNT_IN_BEATS) -> tuple[Parsed, int]:
    """The file without its first `beats` beats, as the reference drops a Groove2Groove count-in
    on its 12-per-beat grid: a note is kept when its onset rounds to the cut or later (so it may
    start up to half a grid unit before it). Tempo: the one in effect at the cut starts the piece.
    Returns the shifted file and the number of notes left out."""
    cut = beats * parsed.tpq
    parts, dropped = [], 0
    for part in parsed.parts:
        keep = 2 * COUNT_IN_GRID * (part.notes[:, 0] - cut) + parsed.tpq >= 0
        dropped += int((~keep).sum())
        notes = part.notes[keep].copy()
        notes[:, :2] -= cut
        parts.append(replace(part, notes=notes))
    before = [qpm for tick, qpm in parsed.tempos if tick <= cut]
    tempos = ([(0, before[-1])] if before else []) + [(tick - cut, qpm) for tick, qpm in parsed.tempos if tick > cut]
    markers = [(tick - cut, text) for tick, text in parsed.markers if tick >= cut]
    return replace(parsed, parts=parts, tempos=tempos, markers=markers), dropped


@dataclass
class Roles:
    """Which parts play each role; `harmonic` lists the candidates for "other" (one list of
    parts per candidate track, in priority order for ties)."""

    layout: str
    bass: list[Part]
    drums: list[Part]
    harmonic: list[list[Part]]

    def busiest(self) -> list[Part]:
        """The harmonic candidate with the most notes (the first one on ties); [] if none."""
        counts = [sum(len(p.notes) for p in group) for group in self.harmonic]
        return self.harmonic[int(np.argmax(counts))] if counts and max(counts) else []


def assign_roles(parts: list[Part], layout: str | None = None) -> Roles:
    """Bass, drums and the harmonic candidates of a file's parts (see the module docstring)."""
    playing = [p for p in parts if len(p.notes)]
    layout = layout or layout_of(parts)
    if layout == "g2g":
        named = lambda name: [p for p in playing if p.name == name]
        return Roles(layout, named(G2G_BASS), named(G2G_DRUMS), [named(name) for name in G2G_HARMONIC if named(name)])
    if layout == "musegen":
        named = lambda role: [p for p in playing if p.name == ROLE_NAMES[role]]
        return Roles(layout, named(BASS), named(DRUMS), [named(OTHER)] if named(OTHER) else [])
    drums = [p for p in playing if p.is_drum]
    melodic = [p for p in playing if not p.is_drum]
    bass = _infer_bass(melodic)
    return Roles(layout, [bass] if bass else [], drums, [[p] for p in melodic if p is not bass])


def _infer_bass(melodic: list[Part]) -> Part | None:
    """A GM bass program, else "bass" in the name (the busiest of either), else the lowest."""
    for rule in (lambda p: p.program in BASS_PROGRAMS, lambda p: bool(p.name and BASS_NAME.search(p.name))):
        found = [p for p in melodic if rule(p)]
        if found:
            return max(found, key=lambda p: len(p.notes))
    return min(melodic, key=lambda p: float(np.mean(p.notes[:, 2])), default=None)


def merged_notes(parts: list[Part]) -> np.ndarray:
    """The rows of several parts as one array (onset, offset, pitch, velocity)."""
    return np.concatenate([p.notes for p in parts]) if parts else np.zeros((0, 4), dtype=np.int64)


def read_trio(source: str | os.PathLike | bytes) -> tuple[Parsed, Roles, int]:
    """A file's parts (without the count-in of a Groove2Groove file), their roles, and how many
    count-in notes were left out."""
    parsed = read_parts(source)
    layout = layout_of(parsed.parts)
    dropped = 0
    if layout == "g2g":
        parsed, dropped = drop_count_in(parsed)
    return parsed, assign_roles(parsed.parts, layout), dropped
