"""The one note table: every note of a piece as columns, with its tracks, roles and meter.

Times are integer ticks at `tpq` ticks per beat, as the file has them; `beats(...)` converts.
Each note points at its track (`track`, an index into `tracks`); a track carries its MIDI name,
program, drum flag and role ("bass", "drums", "other", or "" where no role was assigned).
Tokenizers, metrics, render and data_prep all read pieces into this table.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field, replace

import miditoolkit
import numpy as np
import symusic

from .meter import bar_at, bar_start, signature_changes
from .midi import Parsed, Part, read_parts
from .roles import BASS, DRUMS, TRACKS, assign_roles

ROLES = tuple(TRACKS.values())  # ("bass", "drums", "other")
PROMPT_END_MARKER = "musegen:prompt_end"  # the marker text where a written sample's prompt ends


@dataclass(frozen=True)
class Track:
    name: str | None
    program: int
    is_drum: bool
    role: str = ""

    @property
    def instrument(self) -> str:
        """Its General MIDI instrument's name; "Drums" for a drum track."""
        import pretty_midi  # its table of names only, on first use

        return "Drums" if self.is_drum else pretty_midi.program_to_instrument_name(self.program)


def nth_track_name(name: str, k: int) -> str:
    """The name of the k-th (from 0) of several tracks of one instrument: "Violin", "Violin (2)";
    in brackets because many General MIDI names end in a number of their own ("String Ensemble 1")."""
    return name if k == 0 else f"{name} ({k + 1})"


@dataclass
class NoteTable:
    tpq: int
    start: np.ndarray  # int64 ticks
    end: np.ndarray
    pitch: np.ndarray
    velocity: np.ndarray
    track: np.ndarray  # index into `tracks`
    tracks: list[Track] = field(default_factory=list)
    tempos: list[tuple[int, float]] = field(default_factory=list)  # (tick, quarter notes per minute)
    time_signatures: list[tuple[int, int, int]] = field(default_factory=list)  # (tick, numerator, denominator)
    markers: list[tuple[int, str]] = field(default_factory=list)

    # ---- building ----------------------------------------------------------------------------------

    @classmethod
    def empty(cls, tpq: int) -> NoteTable:
        none = np.zeros(0, dtype=np.int64)
        return cls(tpq, none, none, none, none, none)

    @classmethod
    def of_tracks(
        cls,
        tpq: int,
        tracks: list[tuple[Track, list[tuple[int, int, int, int]]]],
        tempos: list[tuple[int, float]] = (),
        time_signatures: list[tuple[int, int, int]] = (),
        markers: list[tuple[int, str]] = (),
    ) -> NoteTable:
        """A piece written by hand: each track with its notes as (start, end, pitch, velocity) rows."""
        rows = [np.array(notes, dtype=np.int64).reshape(-1, 4) for _, notes in tracks]
        notes = np.concatenate(rows) if rows else np.zeros((0, 4), dtype=np.int64)
        track = np.repeat(np.arange(len(rows), dtype=np.int64), [len(r) for r in rows])
        return cls(
            tpq,
            *(notes[:, k] for k in range(4)),
            track,
            [t for t, _ in tracks],
            list(tempos),
            list(time_signatures),
            list(markers),
        )

    @classmethod
    def from_parsed(cls, parsed: Parsed, by_role: bool = True) -> NoteTable:
        """A file read by `read_parts`, one track per part. `by_role`: each track gets its role by
        `musegen.music.roles`; otherwise the piece is one pitched stream ("other", drums "drums"),
        so that a piano's several tracks are never split into roles."""
        roles = _part_roles(parsed, by_role)
        tracks = [Track(p.name, p.program, p.is_drum, role) for p, role in zip(parsed.parts, roles)]
        rows = [p.notes for p in parsed.parts]
        index = [np.full(len(p.notes), i, dtype=np.int64) for i, p in enumerate(parsed.parts)]
        notes = np.concatenate(rows) if rows else np.zeros((0, 4), dtype=np.int64)
        track = np.concatenate(index) if index else np.zeros(0, dtype=np.int64)
        return cls(
            parsed.tpq,
            notes[:, 0],
            notes[:, 1],
            notes[:, 2],
            notes[:, 3],
            track,
            tracks,
            list(parsed.tempos),
            list(parsed.time_signatures),
            list(parsed.markers),
        )

    @classmethod
    def read(cls, source: str | os.PathLike | bytes, by_role: bool = True) -> NoteTable:
        """A MIDI file (path or bytes); a one-line MidiError for unusable input."""
        return cls.from_parsed(read_parts(source), by_role)

    @classmethod
    def from_score(cls, score: symusic.Score, by_role: bool = True) -> NoteTable:
        """A score parsed by symusic (`musegen.music.midi.load_score`), one track per score track.
        Symusic pairs note-ons and note-offs as miditoolkit does, which REMI's reference pipeline
        read its files with; tempos are exact (60e6 / microseconds per quarter), those of 0
        microseconds left out as `read_parts` leaves them out."""
        parts = []
        for track in score.tracks:
            notes = track.notes.numpy()
            time = notes["time"].astype(np.int64)
            rows = [time, time + notes["duration"], notes["pitch"], notes["velocity"]]
            parts.append(Part(track.name, int(track.program), bool(track.is_drum), np.stack(rows, 1).astype(np.int64)))
        parsed = Parsed(
            "<score>",
            int(score.tpq),
            parts,
            [(int(t.time), 60e6 / t.mspq) for t in score.tempos if t.mspq > 0],
            [(int(t.time), int(t.numerator), int(t.denominator)) for t in score.time_signatures],
            [(int(m.time), m.text) for m in score.markers],
        )
        return cls.from_parsed(parsed, by_role)

    # ---- writing -----------------------------------------------------------------------------------

    def to_miditoolkit(self) -> miditoolkit.MidiFile:
        """The table as a `miditoolkit.MidiFile`, ready to `dump` as the reference pipelines wrote
        their files: one instrument per track in `tracks` order, empty tracks included, each
        holding its notes in table order; tempos, time signatures and markers as listed."""
        midi = miditoolkit.MidiFile(ticks_per_beat=self.tpq)
        midi.instruments = [
            miditoolkit.Instrument(program=t.program, is_drum=t.is_drum, name=t.name or "") for t in self.tracks
        ]
        columns = (self.velocity, self.pitch, self.start, self.end, self.track)
        for velocity, pitch, start, end, track in zip(*(c.tolist() for c in columns)):
            midi.instruments[track].notes.append(miditoolkit.Note(velocity, pitch, start, end))
        midi.tempo_changes = [miditoolkit.TempoChange(float(qpm), int(tick)) for tick, qpm in self.tempos]
        midi.time_signature_changes = [
            miditoolkit.TimeSignature(n, d, int(tick)) for tick, n, d in self.time_signatures
        ]
        midi.markers = [miditoolkit.Marker(text, int(tick)) for tick, text in self.markers]
        midi.max_tick = int(self.end.max()) if len(self) else 0
        return midi

    def midi_bytes(self) -> bytes:
        """The table as a standard MIDI file (`to_miditoolkit`, dumped)."""
        buffer = io.BytesIO()
        self.to_miditoolkit().dump(file=buffer)
        return buffer.getvalue()

    # ---- reading -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.start)

    def beats(self, ticks: np.ndarray) -> np.ndarray:
        """Ticks as (float) beats."""
        return ticks / self.tpq

    @property
    def role(self) -> np.ndarray:
        """Each note's role (its track's)."""
        roles = np.array([t.role for t in self.tracks], dtype=object)
        return roles[self.track] if len(self) else np.zeros(0, dtype=object)

    def select(self, keep: np.ndarray) -> NoteTable:
        """The notes where `keep` (a mask or indices) holds; tracks and meter stay."""
        return replace(
            self,
            start=self.start[keep],
            end=self.end[keep],
            pitch=self.pitch[keep],
            velocity=self.velocity[keep],
            track=self.track[keep],
        )

    def with_roles(self) -> NoteTable:
        """The table with each track's role ("bass", "drums", "other") as `musegen.music.roles`
        assigns it to a file's tracks: how the style metrics read a song of many tracks."""
        parts = [
            Part(t.name, t.program, t.is_drum, np.stack([c[self.track == k] for c in self.columns()], 1))
            for k, t in enumerate(self.tracks)
        ]
        roles = _part_roles(Parsed("<table>", self.tpq, parts), by_role=True)
        return replace(self, tracks=[replace(t, role=role) for t, role in zip(self.tracks, roles)])

    def with_roles_of(self, piece: NoteTable) -> NoteTable:
        """The table with each track in the role that `piece`'s track of the same instrument (name,
        program, drums) plays there; a track the piece lacks keeps its own. How a continuation is
        read beside the piece it continues: inferred alone, a sample without the piece's bass
        track would call its lowest guitar the bass and measure it against the piece's bass."""
        role_in_piece = {(t.name, t.program, t.is_drum): t.role for t in piece.tracks}
        tracks = [replace(t, role=role_in_piece.get((t.name, t.program, t.is_drum), t.role)) for t in self.tracks]
        return replace(self, tracks=tracks)

    def columns(self) -> tuple[np.ndarray, ...]:
        """(start, end, pitch, velocity): a note's row as `Part.notes` holds it."""
        return self.start, self.end, self.pitch, self.velocity

    def in_role(self, role: str) -> NoteTable:
        return self.select(self.role == role)

    def pitched(self) -> NoteTable:
        drums = np.array([t.is_drum for t in self.tracks], dtype=bool)
        return self.select(~drums[self.track]) if len(self) else self

    def onsets_in(self, first_bar: float, bars: float) -> NoteTable:
        """The notes whose onset lies in bars [first_bar, first_bar + bars)."""
        lo, hi = self.bar_tick(first_bar), self.bar_tick(first_bar + bars)
        return self.select((self.start >= lo) & (self.start < hi))

    def from_tick(self, tick: int) -> NoteTable:
        """The piece from `tick` on, moved to begin at 0: a note sounding across `tick` starts
        there, and the tempo, meter and marker (REMI's chord) in effect at `tick` hold from 0."""
        later = self.select((self.end > tick) | (self.start >= tick))
        return replace(
            later,
            start=np.maximum(later.start, tick) - tick,
            end=later.end - tick,
            tempos=_changes_from(self.tempos, tick),
            time_signatures=_changes_from(self.time_signatures, tick),
            markers=_changes_from(self.markers, tick),
        )

    def prompt_end(self) -> int | None:
        return prompt_end(self.markers)

    def after_prompt(self) -> NoteTable:
        """The notes a sample added to its prompt: those that start at its prompt-end marker or
        later (`musegen.generation.outputs.with_prompt_end` places it); all of them without one."""
        end = self.prompt_end()
        return self if end is None else self.select(self.start >= end)

    def first_bar(self) -> int | None:
        return int(self.bar_of(self.start.min())) if len(self) else None

    def last_onset_bar(self) -> int | None:
        return int(self.bar_of(self.start.max())) if len(self) else None

    # Bars are the piece's own, counted from 0 at tick 0: each time signature starts a bar and its
    # bars follow at its length, 4/4 before the first (as the tokenizers and `musegen.music.meter`
    # count them); a piece without time signatures has 4-beat bars.

    def bar_tick(self, bar: float) -> float:
        """The tick where bar `bar` starts; a fractional bar lies that share into its bar."""
        changes = signature_changes(self.time_signatures)
        whole = math.floor(bar)
        start = bar_start(changes, self.tpq, whole + 1)
        if bar == whole:
            return start
        return start + (bar - whole) * (bar_start(changes, self.tpq, whole + 2) - start)

    def bar_of(self, ticks) -> np.ndarray:
        """The bar that holds each tick (ticks at or after 0)."""
        ticks = np.asarray(ticks)
        return np.searchsorted(self._bar_lines(ticks), ticks, side="right") - 1

    def in_bar(self, ticks) -> np.ndarray:
        """Each tick's distance from the line of the bar that holds it, in ticks."""
        ticks = np.asarray(ticks)
        lines = self._bar_lines(ticks)
        return ticks - lines[np.searchsorted(lines, ticks, side="right") - 1]

    def _bar_lines(self, ticks: np.ndarray) -> np.ndarray:
        """The ticks of the bar lines from 0 to the last of `ticks`."""
        changes = signature_changes(self.time_signatures)
        last = bar_at(changes, self.tpq, int(ticks.max(initial=0)))[0]
        return np.array([bar_start(changes, self.tpq, bar) for bar in range(1, last + 1)], dtype=np.int64)


def _changes_from(changes: list[tuple], tick: int) -> list[tuple]:
    """(tick, ...) changes from `tick` on, moved back by it; the last one before it, at 0."""
    ordered = sorted(changes, key=lambda change: change[0])
    before = [change for change in ordered if change[0] <= tick][-1:]
    return [(0, *c[1:]) for c in before] + [(c[0] - tick, *c[1:]) for c in ordered if c[0] > tick]


def prompt_end(markers: list[tuple[int, str]]) -> int | None:
    """The tick of the first prompt-end marker among (tick, text) markers; None without one."""
    return next((tick for tick, text in markers if text == PROMPT_END_MARKER), None)


def _part_roles(parsed: Parsed, by_role: bool) -> list[str]:
    if not by_role:
        return ["drums" if p.is_drum else "other" for p in parsed.parts]
    roles = assign_roles(parsed.parts)
    role_of = {id(p): TRACKS[r] for r, group in ((BASS, roles.bass), (DRUMS, roles.drums)) for p in group}
    return [role_of.get(id(p), "other") for p in parsed.parts]
