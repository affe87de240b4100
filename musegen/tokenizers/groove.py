"""The groove tokenizer (docs/method.md, experiment B): a bass, drums and accompaniment trio read
from MIDI and written as groove events (groove_events.py), token for token as the SPE paper's
reference pipeline (aliutkus/spe, experiments/groove: MusPy 0.3.0's MIDI reader, then
`EventRepresentationProcessor` with `BeatShiftTiming(12, 2)`).

Reading a file (`musegen.music.midi.read_parts`) follows MusPy 0.3.0; the roles of its tracks
are `musegen.music.roles`' (by Groove2Groove names, musegen's names, or inferred; a Groove2Groove
count-in is dropped). "Other" is the busiest remaining harmonic track (ties: the first by name,
or in file order). Where merged parts make notes of one track and pitch cross, they are paired
first in, first out before encoding (`crossing_notes` in the report), so that the ids decode to
the notes they came from.
The tokens hold neither velocity, programs nor tempo: `encode(...).report["meta"]` keeps the
programs and tempo changes, and `decode(ids, meta)` writes them back.
"""

from __future__ import annotations

import functools
import os
import random
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from .. import schemas
from ..errors import MidiError, TokenError
from ..music.beats import round_half_even
from ..music.constants import BEATS_PER_BAR, MAX_BARS, TICKS_PER_BEAT
from ..music.meter import bar_at, off_the_bar_lines, signature_changes
from ..music.midi import Parsed, Part
from ..music.notes import NoteTable, Track
from ..music.roles import BASS, DRUMS, OTHER, ROLE_NAMES, TRACKS, Roles, merged_notes, read_trio
from .base import Encoding, Tokenizer
from .groove_events import (
    BAR_UNITS,
    PAD,
    START,
    UNITS_PER_BEAT,
    VOCAB,
    ShiftClock,
    as_ids,
    bar_starts_at,
    content_end,
    decode_events,
    pair_in_order,
    role_marks,
    serialize,
    token_times,
    transposed,
)
from .groove_grammar import AFTER_EVENT, GrooveGrammar, GrooveState
from .tracking import TrackMarks

DEFAULT_VELOCITY = 100
DEFAULT_TEMPO = 120.0
DEFAULT_PROGRAMS = {"bass": 33, "other": 0}  # General MIDI: finger bass, piano


class GrooveSettings(BaseModel):
    """The groove tokenizers' settings: the programs their bass and other tracks are written
    with (DEFAULT_PROGRAMS for those left out), and how "other" is picked (`other_seed`)."""

    model_config = schemas.STRICT
    programs: dict[Literal["bass", "other"], Annotated[int, Field(ge=0, le=127)]] = {}
    other_seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None


def check_meter(parsed: Parsed) -> None:
    """The tokens count 4-beat bars from tick 0, so the file's bars must make those exactly: 4/4
    bars on that grid, shorter ones (2/4, 1/4, 2/8) that fill it, such as 2/4 bars in pairs. A
    longer or odd meter (3/4, 6/8), or a bar that leaves the grid (a lone 2/4 bar, a pickup), is
    refused in one line that names it, where it comes before the music's end."""
    changes = signature_changes(parsed.time_signatures)
    end = max((int(p.notes[:, 1].max()) for p in parsed.parts if len(p.notes)), default=0)
    for tick, numerator, denominator in changes:
        if tick >= end:
            break
        if numerator <= 0 or denominator % numerator:  # 0/x: fuzzed files
            bar, _ = bar_at(changes, parsed.tpq, tick)
            raise MidiError(
                f"{parsed.name}: bar {bar}: time signature {numerator}/{denominator} at tick {tick}; "
                "the groove tokenizer needs 4/4 (or 2/4, 2/2)"
            )
        if tick * denominator % (4 * parsed.tpq * numerator):  # not on a line of its own bars' grid
            raise MidiError(off_the_bar_lines(parsed.name, changes, parsed.tpq, tick, "the groove tokenizers encode"))


class GrooveTokenizer(Tokenizer):
    """Bass / drums / other trio tokens. `other_seed`: None picks the harmonic track with the
    most notes (the reference's test-time choice); an int picks a non-empty one at random,
    reproducibly per file and seed (training variety, as the reference's random choice)."""

    kind = "groove"
    settings_schema = GrooveSettings
    augmentation = {"max_shift": 5, "max_skip_bars": 4, "track_dropout": 0.2}  # drums never transposed
    default_crop = "start"  # sequences cut to the first N tokens, as in the paper (bar skips vary them)
    roles = ("bass", "drums", "other")
    token_types = {
        "note-on": "NoteOn_",
        "note-off": "NoteOff_",
        "time shift": "TimeShift_",
        "Start": "Start",
        "End": "End",
    }
    position_type = "time shift"
    version = 2
    sampling_defaults = {"temperature": 0.6, "top_p": 1.0}  # the paper's groove samples
    kept_share_type = "note-off"

    def __init__(self, programs: dict[str, int] | None = None, other_seed: int | None = None):
        try:
            checked = GrooveSettings(programs=programs or {}, other_seed=other_seed)
        except ValidationError as exc:
            raise TokenError(f"invalid groove settings: {schemas.first_problem(exc)}") from None
        self.programs = {**DEFAULT_PROGRAMS, **checked.programs}
        self.other_seed = checked.other_seed
        self.vocab = list(VOCAB)

    @property
    def pad_id(self) -> int:
        return PAD

    def settings(self) -> dict[str, Any]:
        return {"programs": dict(self.programs), "other_seed": self.other_seed}

    def grammar(self) -> GrooveGrammar:
        return GrooveGrammar()

    # ---- encoding -------------------------------------------------------------------------

    def trio(self, source: str | os.PathLike | bytes) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """The trio of a MIDI file on the grid: int rows (track, pitch, onset, offset), the
        notes' velocities (the reference's tie-break), and the encoding report."""
        parsed, roles, dropped = read_trio(source)
        check_meter(parsed)
        if roles.layout == "inferred" and not roles.drums:
            raise MidiError(f"{parsed.name}: no drum track (channel 10); the groove tokenizer needs drums")
        if roles.layout == "inferred" and not roles.bass:
            raise MidiError(f"{parsed.name}: no bass or accompaniment track, only drums")
        other = self._pick_other(roles)
        rows, velocities = [], []
        for track, parts in ((BASS, roles.bass), (DRUMS, roles.drums), (OTHER, other)):
            notes = merged_notes(parts)
            onset = round_half_even(UNITS_PER_BEAT * notes[:, 0], parsed.tpq)
            offset = round_half_even(UNITS_PER_BEAT * notes[:, 1], parsed.tpq)
            rows.append(np.stack([np.full_like(onset, track), notes[:, 2], onset, offset], 1))
            velocities.append(notes[:, 3])
        notes, velocities, crossing = pair_in_order(np.concatenate(rows), np.concatenate(velocities))
        if not len(notes):
            raise MidiError(f"{parsed.name}: no notes after the count-in")
        if notes[:, 3].max() // BAR_UNITS >= MAX_BARS:  # e.g. a huge delta-time: millions of time shifts
            raise MidiError(f"{parsed.name}: longer than {MAX_BARS} bars, not a piece of music")
        left_out = len(roles.harmonic) - bool(other)
        return (
            notes,
            velocities,
            {
                "meta": self._meta(parsed, roles, other),
                "notes": int(len(notes)),
                "count_in_notes": dropped,
                "crossing_notes": crossing,
                "tracks_left_out": left_out,
            },
        )

    def encode(self, source: str | os.PathLike | bytes) -> Encoding:
        notes, velocities, report = self.trio(source)
        return Encoding(ids=serialize(notes, velocities), report=report)

    def _pick_other(self, roles: Roles) -> list[Part]:
        if self.other_seed is None:
            return roles.busiest()
        candidates = [g for g in roles.harmonic if sum(len(p.notes) for p in g)]
        if not candidates:
            return []
        # Seeded by the file's content too, so files with the same track count differ.
        rng = random.Random(f"{self.other_seed}:{[(g[0].program, sum(len(p.notes) for p in g)) for g in candidates]}")
        return rng.choice(candidates)

    @staticmethod
    def _meta(parsed: Parsed, roles: Roles, other: list[Part]) -> dict[str, Any]:
        """What `decode` needs to give the trio back its sound: programs, names, tempo changes."""
        tempos = [
            [int(round_half_even(UNITS_PER_BEAT * tick, parsed.tpq)), round(qpm, 2)] for tick, qpm in parsed.tempos
        ]
        tempos = [t for i, t in enumerate(tempos) if i + 1 == len(tempos) or tempos[i + 1][0] != t[0]]
        if not tempos or tempos[0][0] > 0:  # MIDI's default until the first tempo event
            tempos.insert(0, [0, DEFAULT_TEMPO])
        return {
            "layout": roles.layout,
            "bass_track": roles.bass[0].name if roles.bass else None,
            "bass_program": int(roles.bass[0].program) if roles.bass else None,
            "other_track": other[0].name if other else None,
            "other_program": int(other[0].program) if other else None,
            "tempo": tempos[0][1],
            "tempos": tempos,  # [time in 1/12 beats, quarter notes per minute]
        }

    # ---- decoding -------------------------------------------------------------------------

    def notes(self, ids) -> np.ndarray:
        """The notes of a token sequence as rows (track, pitch, onset, offset) in grid units,
        sorted by (onset, track, pitch, offset). Raises TokenError for ids that cannot be
        decoded; a missing End is tolerated (notes still sounding end at the last time)."""
        return decode_events(as_ids(ids, self.vocab_size))[0]

    def decode(self, ids, meta: dict[str, Any] | None = None) -> NoteTable:
        """A 3-track piece: Bass, Drums (channel 10), Other, with their roles. `meta` (an encoding report's, or any
        dict with bass_program / other_program / tempos / tempo) gives programs and tempo
        changes; otherwise the `programs` setting and 120 bpm. A zero-length note lasts one
        tick; velocities keep the order of notes that differ only by track, so that
        `encode(decode(ids)) == ids` for every sequence the grammar accepts."""
        notes, ties = decode_events(as_ids(ids, self.vocab_size))
        return self.trio_piece(notes, DEFAULT_VELOCITY + ties, meta)

    def trio_piece(self, notes: np.ndarray, velocities: np.ndarray, meta: dict[str, Any] | None = None) -> NoteTable:
        """Notes (track, pitch, onset, offset) in grid units as the 3-track piece `decode` returns,
        with programs and tempo changes from `meta` (see `decode`)."""
        meta = meta or {}
        program = {
            role: self.programs[role] if meta.get(f"{role}_program") is None else int(meta[f"{role}_program"])
            for role in ("bass", "other")
        }
        unit = TICKS_PER_BEAT // UNITS_PER_BEAT
        tempos = meta.get("tempos") or [[0, meta.get("tempo") or DEFAULT_TEMPO]]
        tracks = [  # indexed by track number - 1
            Track(ROLE_NAMES[BASS], program["bass"], False, TRACKS[BASS]),
            Track(ROLE_NAMES[DRUMS], 0, True, TRACKS[DRUMS]),
            Track(ROLE_NAMES[OTHER], program["other"], False, TRACKS[OTHER]),
        ]
        track, pitch, on, off = np.asarray(notes, dtype=np.int64).reshape(-1, 4).T
        return NoteTable(
            TICKS_PER_BEAT,
            on * unit,
            np.maximum(off * unit, on * unit + 1),  # a zero-length note lasts one tick
            pitch,
            np.minimum(np.asarray(velocities, dtype=np.int64), 127),
            track - 1,
            tracks,
            [(int(time) * unit, float(qpm)) for time, qpm in tempos],
            [(0, BEATS_PER_BAR, 4)],
        )

    # ---- token-level operations (bars, augmentation) -------------------------------------

    def bar_starts(self, ids) -> list[int]:
        """For each bar b (4 beats) that the piece reaches, the index of its first token: the
        first whose time is 4b beats or later (a shift that lands on or past the bar line), so
        ids[:bar_starts[b]] is the piece before bar b. Bar 0 starts after Start."""
        ids = as_ids(ids, self.vocab_size)
        return bar_starts_at(token_times(ids), content_end(ids), bool(len(ids) and ids[0] == START))

    def onsets(self, ids) -> np.ndarray:
        """Each token's time in beats as decoding reads it: a shift's is where it moves to, a
        note event's is its note's start (or end), Start's is 0."""
        return token_times(as_ids(ids, self.vocab_size)) / UNITS_PER_BEAT

    def onset_clock(self) -> ShiftClock:
        return ShiftClock()

    @functools.cached_property
    def track_marks(self) -> TrackMarks:
        return role_marks(self.vocab_size)

    def to_bar_line(self, state: GrooveState, bar: int) -> list[int]:
        """Appended to a piece cut where bar `bar` starts (`ids[:bar_starts[bar]]`, in grammar state
        `state`): the tokens that move time to that bar line and end there every note still
        sounding, so a continuation begins exactly at the bar."""
        if state.phase != 1 or state.last != AFTER_EVENT:
            return []
        return self.grammar().release_at(state, bar * BAR_UNITS)

    def transpose(self, ids, shift: int) -> np.ndarray | None:
        """Bass and other moved by `shift` semitones, drums untouched; None if a pitch leaves
        0..127. A sequence from Start (a piece, or a window cropped at its start) is written
        again in canonical order (notes at one time sort by pitch, so drums and pitched notes
        may change places); another window only has its pitches moved."""
        return transposed(as_ids(ids, self.vocab_size), shift)

    def skip_bars(self, ids, n: int) -> np.ndarray | None:
        """The piece without its first `n` bars. Notes sounding across the cut are restarted at
        the new beginning. None when the piece has no more than `n` bars."""
        notes, ties = decode_events(as_ids(ids, self.vocab_size))
        cut = n * BAR_UNITS
        if n < 0 or not len(notes) or notes[:, 3].max() <= cut:
            return None
        keep = (notes[:, 2] >= cut) | (notes[:, 3] > cut)
        kept = notes[keep].copy()
        kept[:, 2:] = np.maximum(kept[:, 2:] - cut, 0)
        return serialize(kept, ties[keep])

    def drop_tracks(self, ids, tracks) -> np.ndarray:
        """The piece without any event of `tracks` (1 bass, 2 drums, 3 other)."""
        notes, ties = decode_events(as_ids(ids, self.vocab_size))
        keep = ~np.isin(notes[:, 0], list(tracks))
        return serialize(notes[keep], ties[keep])
