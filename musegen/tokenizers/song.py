"""`song`: a multi-track song with its meters and tempos, each track with its instrument.

The tokens (song_vocab.py) and their order (song_grammar.py) follow REMI+ (FIGARO) and MidiTok's
REMI with programs, time signatures and tempos: a Bar with the bar's TimeSig, then Position
cells with an optional Tempo and the notes as Program, Pitch (Drum for drums), Velocity,
Duration. Where it differs, docs/tokenizers.md says why: a Program is written once per track
and cell rather than before every note, a fifth of a quarter is not a position (12 units per
quarter note in every meter), and tracks of one program keep apart (`Program_0.1`).

Encoding, exactly or refused in one line:
- bars follow the file's time signatures: each starts a bar, a bar cut short by the next one is
  written with the meter of its length (a 4/4 bar cut after two beats is a 2/4 bar); a meter
  or a cut bar that is not a whole number of 8ths (at most 8 quarter notes) is refused, naming
  the bar;
- onsets and durations round to the 12-per-quarter grid each on its own, halves up (MidiTok's
  rule: a duration is not the difference of two rounded times); a duration longer
  than 8 quarters rounds to a whole quarter, at most 16 (`durations_clipped` beyond);
- pitches fold into 21..108 by octaves (`pitches_folded`); drum notes outside 27..87 are left
  out (`drums_dropped`); of notes that share track, cell and pitch the longest is kept
  (`notes_merged`), and a note ends by the next one of its track and pitch (`notes_cut`), as a
  MIDI file can hold them; a fifth track of one program joins the fourth (`tracks_merged`), every drum
  track joins one;
- the first bar is the bar of the first note and the last the bar of the last; the opening
  Tempo is the one in effect at the first bar line, later ones sit at their cells.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pretty_midi
import symusic

from ..errors import MidiError, TokenError
from ..music.constants import DEFAULT_BPM, MAX_BARS, TICKS_PER_BEAT
from ..music.meter import signature_changes
from ..music.midi import read_midi, source_name
from ..music.notes import ROLES, NoteTable, Track, nth_track_name
from ..music.roles import GM_FAMILY_SIZE
from .base import Encoding, Tokenizer
from .song_grammar import SongGrammar
from .song_vocab import (
    DRUM_PROGRAM,
    DRUMS,
    DURATIONS,
    MAX_BAR_UNITS,
    METERS,
    PAD,
    PITCHES,
    SLOTS,
    TEMPOS,
    UNITS_PER_BEAT,
    VELOCITY_BIN,
    SongVocab,
    bar_units,
)
from .tracking import OnsetClock, TrackMarks

TICKS_PER_UNIT = TICKS_PER_BEAT // UNITS_PER_BEAT


@dataclass
class Bars:
    """The bar lines of a piece in units from tick 0, and each bar's meter (index in METERS)."""

    starts: np.ndarray
    meters: np.ndarray

    def of(self, units: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, units, side="right") - 1


def bar_lines(changes: list[tuple[int, int, int]], first: int, last: int, name: str) -> Bars:
    """The bars that hold units `first`..`last`, from the time signature `changes` given in units
    (the first at 0). Each change starts a bar; a bar it cuts short takes the meter of its length."""
    starts: list[np.ndarray] = []
    meters: list[np.ndarray] = []
    counted = 0  # the file's bars before this change, to name a bar in an error
    for k, (at, numerator, denominator) in enumerate(changes):
        if at > last:
            break
        meter = SongVocab.meter_index(numerator, denominator)
        if meter < 0:
            raise MidiError(
                f"{name}: bar {counted + 1} is in {numerator}/{denominator}, a meter the song tokens do not have "
                "(bars of whole 8ths, at most 8 quarter notes)"
            )
        length = bar_units(numerator, denominator)
        following = changes[k + 1][0] if k + 1 < len(changes) else last + 1
        count, rest = divmod(following - at, length) if following <= last else ((last - at) // length + 1, 0)
        skip = min(count, max(0, (first - at) // length))  # whole bars before the first note
        starts.append(at + length * np.arange(skip, count))
        meters.append(np.full(count - skip, meter))
        if rest:
            cut = _meter_lasting(rest)
            if cut < 0:
                raise MidiError(
                    f"{name}: bar {counted + count + 1} is cut to {rest / UNITS_PER_BEAT:g} beats by the next time "
                    "signature; the song tokens hold bars of whole 8ths"
                )
            starts.append(np.array([at + count * length]))
            meters.append(np.array([cut]))
        counted += count + (rest > 0)
    starts_, meters_ = np.concatenate(starts), np.concatenate(meters)
    keep = starts_ + SongVocab.bar_units_table[meters_] > first  # bars that end after the first note
    return Bars(starts_[keep], meters_[keep])


def _meter_lasting(units: int) -> int:
    """The meter whose bar lasts `units` (x/4, else x/8), -1 when none does."""
    for denominator in (4, 8):
        per = 4 * UNITS_PER_BEAT // denominator
        if units % per == 0:
            return SongVocab.meter_index(units // per, denominator)
    return -1


class SongTokenizer(SongVocab, Tokenizer):
    """Every track of a song, in its meters and tempos (module docstring)."""

    kind = "song"
    version = 1
    augmentation = {"max_shift": 6}
    token_types = {
        name: f"{name}_" for name in ("Bar", "TimeSig", "Position", "Tempo", "Program", "Pitch", "Drum", "Velocity")
    } | {"Duration": "Duration_", "End": "End"}
    position_type = "Position"
    kept_share_type = "Bar"  # the sampler keeps the bar line's share (generation.constraints.KeptShare)
    roles = ROLES  # as the style metrics map a song's tracks (`NoteTable.with_roles`)
    sampling_defaults = {"temperature": 1.0, "top_p": 0.95}
    onset_grid = UNITS_PER_BEAT
    holds_meters = True

    @property
    def pad_id(self) -> int:
        return PAD

    def settings(self) -> dict[str, Any]:
        return {}

    def grammar(self) -> SongGrammar:
        return SongGrammar(self)

    def tempo_token_ids(self) -> np.ndarray:
        return self.tempo_ids

    def tempo_token(self, bpm: float) -> int:
        return int(self.tempo_ids[self.tempo_bin(np.array([bpm]))[0]])

    # ------------------------------------------------------------------ encode
    def encode(self, source: str | os.PathLike | bytes | symusic.Score) -> Encoding:
        name = source_name(source)
        score, _ = read_midi(source)
        table = NoteTable.from_score(score, by_role=False)
        to_units = lambda ticks: (2 * UNITS_PER_BEAT * np.asarray(ticks, dtype=np.int64) + table.tpq) // (2 * table.tpq)  # noqa: E731
        report = {"pitches_folded": 0, "drums_dropped": 0, "durations_clipped": 0}
        program, report["tracks_merged"] = self._track_programs(table)
        drum = program[table.track] == 0
        keep = ~drum | ((table.pitch >= DRUMS[0]) & (table.pitch <= DRUMS[-1]))
        report["drums_dropped"] = int(np.count_nonzero(~keep))
        notes = table.select(keep)
        if not len(notes):
            raise MidiError(f"{name}: no notes the song tokens can hold")
        onset = to_units(notes.start)
        first, last = int(onset.min()), int(onset.max())
        if last - first > MAX_BARS * MAX_BAR_UNITS:
            raise MidiError(f"{name}: notes span more than {MAX_BARS} bars; not a piece of music")
        changes = {}
        for tick, numerator, denominator in signature_changes(table.time_signatures):
            changes[int(to_units(tick))] = (numerator, denominator)
        bars = bar_lines([(u, n, d) for u, (n, d) in sorted(changes.items())], first, last, name)
        if len(bars.starts) > MAX_BARS:
            raise MidiError(
                f"{name}: notes span {len(bars.starts)} bars; longer than {MAX_BARS} bars, not a piece of music"
            )

        track = program[notes.track]
        pitch = notes.pitch.copy()
        pitched = track > 0
        lo, hi = PITCHES[0], PITCHES[-1]
        folded = np.where(pitch < lo, pitch + 12 * ((lo - pitch + 11) // 12), pitch)
        folded = np.where(folded > hi, folded - 12 * ((folded - hi + 11) // 12), folded)
        report["pitches_folded"] = int(np.count_nonzero(pitched & (folded != pitch)))
        pitch = np.where(pitched, folded, pitch)
        length = np.maximum(to_units(notes.end - notes.start), 1)
        report["durations_clipped"] = int(np.count_nonzero(length > DURATIONS[-1]))
        velocity = np.clip(notes.velocity // VELOCITY_BIN, 0, len(self.velocity_ids) - 1)
        # one note per (cell, track, pitch): the longest, then the loudest
        order = np.lexsort((-notes.velocity, -length, onset, pitch, track))
        keys = np.stack([track[order], pitch[order], onset[order]])
        order = order[np.r_[True, np.diff(keys, axis=1).any(axis=0)]]  # by track, pitch, onset
        report["notes_merged"] = len(onset) - len(order)
        duration, report["notes_cut"] = self._durations(track[order], pitch[order], onset[order], length[order])
        by_time = np.lexsort((pitch[order], track[order], onset[order]))
        order, duration = order[by_time], duration[by_time]
        report["notes"] = len(order)
        tempo_at = self._tempo_cells(table, to_units, bars, last)
        ids = self._tokens(bars, onset[order], track[order], pitch[order], velocity[order], duration, tempo_at)
        report["bars"] = len(bars.starts)
        report["meters"] = sorted({f"{n}/{d}" for n, d in (METERS[m] for m in bars.meters)})
        report["tempo_changes"] = len(tempo_at) - 1
        return Encoding(np.asarray(ids, dtype=np.int32), report)

    def _track_programs(self, table: NoteTable) -> tuple[np.ndarray, int]:
        """For each track of `table`, the index of its Program token (0: drums), and how many
        tracks had to join another of their program. Tracks of one program take their slots in
        the order they begin to play (then in file order), as `decode` lists them."""
        first = np.full(len(table.tracks), np.iinfo(np.int64).max)
        np.minimum.at(first, table.track, table.start)
        out, slots, merged = np.zeros(len(table.tracks), dtype=np.int64), {}, 0
        for k in np.lexsort((np.arange(len(first)), first)).tolist():
            t = table.tracks[k]
            if t.is_drum:
                continue
            slot = slots.get(t.program, 0)
            merged += slot >= SLOTS
            slots[t.program] = slot + 1
            out[k] = int(self.program_of[self.program_token(t.program, min(slot, SLOTS - 1))])
        return out, merged

    @staticmethod
    def _durations(track, pitch, onset, length) -> tuple[np.ndarray, int]:
        """Each note's index in DURATIONS, for notes sorted by track, pitch and onset: the nearest
        (exact up to 8 quarters, then whole quarters; ties up), or the longest that ends by the
        next note of its track and pitch, so that a MIDI file never holds one note inside
        another. Also how many notes were cut so."""
        index = np.searchsorted(DURATIONS, length)
        below, above = np.clip(index - 1, 0, len(DURATIONS) - 1), np.clip(index, 0, len(DURATIONS) - 1)
        nearest = np.where(length - DURATIONS[below] < DURATIONS[above] - length, below, above)
        same = (track[1:] == track[:-1]) & (pitch[1:] == pitch[:-1])
        gap = np.r_[np.where(same, onset[1:] - onset[:-1], DURATIONS[-1]), DURATIONS[-1]]
        fits = DURATIONS[nearest] <= gap
        return np.where(fits, nearest, np.searchsorted(DURATIONS, gap, side="right") - 1), int(np.count_nonzero(~fits))

    def _tempo_cells(self, table: NoteTable, to_units, bars: Bars, last: int) -> dict[int, int]:
        """unit -> tempo index at each change, the first at the first bar line; equal ones left out."""
        tempos = sorted(table.tempos, key=lambda change: change[0]) or [(0, DEFAULT_BPM)]  # of one tick, the last
        units = to_units([t for t, _ in tempos])
        bins = self.tempo_bin(np.array([q for _, q in tempos]))
        begin = int(bars.starts[0])
        before = np.flatnonzero(units <= begin)
        cells = {begin: int(bins[before[-1]]) if len(before) else int(self.tempo_bin(np.array([DEFAULT_BPM]))[0])}
        for unit, tempo in zip(units.tolist(), bins.tolist()):
            if begin < unit <= last:
                cells[unit] = tempo  # of several in a cell, the last
        out, current = {}, -1
        for unit in sorted(cells):
            if cells[unit] != current:
                out[unit] = current = int(cells[unit])
        return out

    def _tokens(self, bars, onset, track, pitch, velocity, duration, tempo_at) -> list[int]:
        out = [self.start_id]
        cells = np.union1d(onset, np.fromiter(tempo_at, dtype=np.int64))
        bar_of = bars.of(cells)
        at = np.searchsorted(onset, cells)
        upto = np.searchsorted(onset, cells, side="right")
        bar = -1
        for cell, b, i, j in zip(cells.tolist(), bar_of.tolist(), at.tolist(), upto.tolist()):
            while bar < b:
                bar += 1
                out += [self.bar_id, int(self.meter_ids[bars.meters[bar]])]
            out.append(int(self.position_ids[cell - bars.starts[b]]))
            if cell in tempo_at:
                out.append(int(self.tempo_ids[tempo_at[cell]]))
            current = -1
            for k in range(i, j):
                if track[k] != current:
                    current = track[k]
                    out.append(int(self.program_ids[current]))
                notes = self.drum_ids[pitch[k] - DRUMS[0]] if current == 0 else self.pitch_ids[pitch[k] - PITCHES[0]]
                out += [int(notes), int(self.velocity_ids[velocity[k]]), int(self.duration_ids[duration[k]])]
        out.append(self.end_id)
        return out

    # ------------------------------------------------------------------ decode
    def decode(self, ids, meta: Mapping[str, Any] | None = None) -> NoteTable:
        ids = self.check_ids(ids)
        grammar = self.grammar()
        state = grammar.start()
        rows: list[tuple[int, int, int, int, int]] = []  # program index, start, end, pitch, velocity
        tempos, meters = [], []
        bar_start = bar_length = 0
        onset = pitch = velocity = 0
        for i, token in enumerate(ids.tolist()):
            if not grammar.accepts(state, token):
                raise TokenError(f"token {i} ({self.name(token)}) may not come there in a song")
            state = grammar.advance(state, token)
            if token == self.bar_id:
                bar_start += bar_length if state.bar > 0 else 0
            elif self.meter_of[token] >= 0:
                bar_length = int(self.bar_units_table[state.meter])
                if not meters or meters[-1][1:] != METERS[state.meter]:
                    meters.append((bar_start, *METERS[state.meter]))
            elif self.position_of[token] >= 0:
                onset = bar_start + state.position
            elif self.tempo_of[token] >= 0:
                tempos.append((onset, float(TEMPOS[state.tempo])))
            elif self.pitch_of[token] >= 0 or self.drum_of[token] >= 0:
                pitch = state.pitch
            elif self.velocity_of[token] >= 0:
                velocity = int(self.velocity_of[token]) * VELOCITY_BIN + VELOCITY_BIN // 2
            elif self.duration_of[token] >= 0:
                rows.append((state.program, onset, onset + int(DURATIONS[self.duration_of[token]]), pitch, velocity))
        used = sorted({r[0] for r in rows})
        tracks = [
            (self._track(k), [(s * TICKS_PER_UNIT, e * TICKS_PER_UNIT, p, v) for t, s, e, p, v in rows if t == k])
            for k in used
        ]
        return NoteTable.of_tracks(
            TICKS_PER_BEAT,
            tracks,
            tempos=[(u * TICKS_PER_UNIT, bpm) for u, bpm in tempos],
            time_signatures=[(u * TICKS_PER_UNIT, n, d) for u, n, d in meters],
        ).with_roles()

    def _track(self, index: int) -> Track:
        program, slot = self.programs[index]
        if program == DRUM_PROGRAM:
            return Track("Drums", 0, True)
        return Track(nth_track_name(pretty_midi.program_to_instrument_name(program), slot), program, False)

    # ------------------------------------------------------------------ editing
    def bar_starts(self, ids) -> list[int]:
        return np.flatnonzero(self.check_ids(ids) == self.bar_id).tolist()

    def program_token_ids(self, program: int) -> np.ndarray:
        return np.array([i for i, (p, _) in zip(self.program_ids, self.programs) if p == program], dtype=np.int64)

    @functools.cached_property
    def track_marks(self) -> TrackMarks:
        track_of = np.full(self.vocab_size, -1, dtype=np.int64)
        track_of[self.program_ids] = self.program_ids  # a track is its track token
        return TrackMarks(track_of, bar_id=self.bar_id)

    @functools.cached_property
    def instrument_families(self) -> tuple[np.ndarray, np.ndarray]:
        pitched = np.array([program != DRUM_PROGRAM for program, _ in self.programs])
        family = np.array([program // GM_FAMILY_SIZE for program, _ in self.programs])
        return self.program_ids[pitched], family[pitched]

    @functools.cached_property
    def cache_match(self) -> tuple[np.ndarray, int]:
        """Velocities are matched as one key and durations as another, and a match needs 6 tokens
        (two notes or so). Why: a played part repeats its onsets, tracks and pitches but seldom
        its velocities and lengths, so a match on every token broke within a note or two, and a
        match that short proposed the bar line anywhere (docs/sampling.md has the sweep)."""
        keys = np.arange(len(self.vocab))
        keys[self.velocity_ids] = self.velocity_ids[0]
        keys[self.duration_ids] = self.duration_ids[0]
        return keys, 6

    def position_phases(self) -> tuple[np.ndarray, np.ndarray]:
        return self.position_ids, np.arange(len(self.position_ids)) % UNITS_PER_BEAT  # a Position counts units

    def to_bar_line(self, state, bar: int) -> list[int]:
        """A piece cut at a bar line goes on from the next Bar (its meter comes next)."""
        return [self.bar_id]

    def transpose(self, ids, shift: int) -> np.ndarray | None:
        ids = np.asarray(ids)
        pitch = self.pitch_of[ids]
        moved = pitch[pitch >= 0] + shift
        if len(moved) and (moved.min() < PITCHES[0] or moved.max() > PITCHES[-1]):
            return None
        out = ids.copy()
        out[pitch >= 0] = self.pitch_ids[moved - PITCHES[0]]
        return out

    def map_programs(self, ids, programs: np.ndarray) -> np.ndarray:
        """Each Program token of program p and slot s becomes that of programs[p] and slot s
        (drums stay); where that changes the order of a cell's tracks, their notes move with them
        into the order `encode` writes (by track index), which the grammar asks for."""
        ids = np.asarray(ids)
        track = self.program_of[ids]  # index in `programs` of (program, slot); 0 is the drums
        pitched = track > 0
        slot, program = np.divmod(track[pitched] - 1, 128)
        track[pitched] = 1 + slot * 128 + np.asarray(programs)[program]
        out = ids.copy()
        out[pitched] = self.program_ids[track[pitched]]
        # A cell's notes run from its first Program to the next Position, Bar or end; every token
        # of a note is one of these kinds.
        note_kinds = (self.program_of, self.pitch_of, self.drum_of, self.velocity_of, self.duration_of)
        in_cell = np.logical_or.reduce([kind[ids] >= 0 for kind in note_kinds])
        cell = np.cumsum(~in_cell)
        starts = np.flatnonzero(track >= 0)
        unsorted = (cell[starts[1:]] == cell[starts[:-1]]) & (track[starts[1:]] < track[starts[:-1]])
        for c in np.unique(cell[starts[1:][unsorted]]).tolist():
            lo, hi = np.searchsorted(cell, [c, c + 1])  # the cell's opening token, then its notes
            heads = starts[(starts > lo) & (starts < hi)]
            groups = sorted(zip(track[heads].tolist(), heads.tolist(), [*heads[1:].tolist(), hi]))
            out[heads[0] : hi] = np.concatenate([out[a:b] for _, a, b in groups])
        return out

    def onsets(self, ids) -> np.ndarray:
        """Each token's onset in beats (quarter notes) from the first bar line: a Bar's is its bar
        line, a Position's its cell, and every other token's that of the Bar or Position before
        it; bars last as their TimeSig says."""
        ids = np.asarray(ids, dtype=np.int64)
        is_bar = ids == self.bar_id
        meters = self.meter_of[ids]
        lengths = self.bar_units_table[meters[meters >= 0]]  # one TimeSig per bar, after its Bar
        bar_start = np.r_[0, np.cumsum(lengths)][np.maximum(np.cumsum(is_bar) - 1, 0)]
        cell = np.where(is_bar, 0, self.position_of[ids])
        marked = np.where(is_bar | (cell >= 0), np.arange(len(ids)), -1)
        last = np.maximum.accumulate(marked) if len(ids) else marked
        return (bar_start + np.where(last >= 0, cell[last], 0)) / UNITS_PER_BEAT

    def onset_clock(self) -> _SongClock:
        return _SongClock(self)

    def meter_of_bars(self, ids) -> list[tuple[int, int]]:
        """The meter of each bar of a piece, in order."""
        ids = self.check_ids(ids)
        return [METERS[m] for m in self.meter_of[ids[self.meter_of[ids] >= 0]]]


class _SongClock(OnsetClock):
    """`SongTokenizer.onsets`, token by token: the current bar's line (the lengths of the TimeSigs
    before it: one per bar, right after its Bar, in a sequence the grammar accepts) and the cell
    of the last Bar or Position, in units."""

    def __init__(self, tok: SongTokenizer):
        self.bar_id, self.meter_of, self.position_of = tok.bar_id, tok.meter_of, tok.position_of
        self.bar_start = self.meters_length = self.cell = 0

    def advance(self, token: int) -> float:
        if token == self.bar_id:
            self.bar_start, self.cell = self.meters_length, 0
        elif self.meter_of[token] >= 0:
            self.meters_length += int(SongTokenizer.bar_units_table[self.meter_of[token]])
        elif self.position_of[token] >= 0:
            self.cell = int(self.position_of[token])
        return (self.bar_start + self.cell) / UNITS_PER_BEAT
