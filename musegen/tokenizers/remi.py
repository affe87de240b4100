"""REMI for pop piano: the Pop1K7 vocabulary and event conventions of the SPE paper's data.

A piece is a sequence of 4-beat bars. Each grid cell (a 16th note by default) that holds
something emits `Beat_k`, then at most one `Chord_<root>_<quality>`, at most one `Tempo_<bpm>`,
then one `Note_Pitch`, `Note_Velocity`, `Note_Duration` triple per note. A piece ends with
`Bar_None`, `EOS_None`. Ids are positions in the alphabetical sort of the event names; PAD
comes last.

The encoder writes what the Pop1K7 pipeline (YatingMusic/compound-word-transformer: analyzer,
midi2corpus, corpus2events) writes for a MIDI file read with miditoolkit; tests/test_golden_remi.py
compares it with that pipeline's own output on POP909. Its conventions:
- onsets and durations round to the grid half to even; durations are capped at one bar first;
- velocity goes to the nearest even value (ties down), then into 40..86;
- the first bar is the bar of the first onset (leading empty bars are dropped), the last the bar
  of the last onset;
- chords: one label (root, quality, bass) per beat, chorder's; a Chord is written where the
  label changes, so the same Chord token repeats when only the bass changed. The markers of a
  file that has chord markers are its chords (what `decode` writes);
- tempos: miditoolkit's tempo list (120 bpm at tick 0 unless the file sets one there, a tempo
  equal to the previous one dropped), binned, each written at its cell;
- whatever lies before the first bar goes to its first cell, and of several Chords or Tempos
  in one cell the first wins: a piece opens with `Bar, Beat_0, Chord, Tempo` (the chord and
  tempo at tick 0);
- inside a cell the notes come in the order of their unquantised onsets, then of falling pitch;
  notes of one pitch that overlap are all kept. Decoding keeps that order for at most
  `max_note_offset` notes of a cell not lower than the note before them (59 on the 16th grid),
  so a cell with more (61 copies of a note on 61 tracks) is written by falling pitch, one note
  per pitch, the longest then the loudest (counted as `crowded_notes_merged`).

Meter: bars hold 4 quarter notes. Time signatures of 1, 2 or 4 quarters per bar (1/4, 2/4, 2/2,
4/4, 4/8) are read as 4/4 from tick 0, as POP909 needs (it writes 1/4 or 2/4 over music in 4/4).
A 4-quarter signature that starts off that grid (after a pickup, a 2/4 bar, a 1/4 bar) starts a
new bar there: a pickup shorter than a bar sits at the end of its bar. Where that would pad a bar
with silence between notes (a lone 2/4 bar inside 4/4) the file is refused, naming the bar, as are
other meters (3/4, 6/8, 5/4, ...): never re-gridded in silence.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import symusic

from ..errors import MidiError, TokenError
from ..music.beats import round_half_even
from ..music.chords import detect_chords
from ..music.constants import BEATS_PER_BAR, DEFAULT_BPM, MAX_BARS, TICKS_PER_BEAT
from ..music.midi import read_midi, source_name
from ..music.notes import NoteTable, Track, nth_track_name
from .base import Encoding, Tokenizer
from .remi_bars import BarGrid
from .remi_grammar import RemiGrammar
from .remi_vocab import RemiSettings, RemiVocab
from .tracking import OnsetClock


class RemiTokenizer(RemiVocab, Tokenizer):
    """REMI over the vocabulary its settings make (`RemiSettings`: the constructor's arguments)."""

    kind = "remi"
    settings_schema = RemiSettings
    augmentation = {"max_shift": 6}  # transpose by -6..+6 semitones, chord roots too
    # each type is named by its prefix's last word: "Note_Pitch_" is "Pitch"
    token_types = {
        prefix.split("_")[-2]: prefix
        for prefix in ("Bar_", "Beat_", "Chord_", "Tempo_", "Note_Pitch_", "Note_Velocity_", "Note_Duration_", "EOS_")
    }
    position_type = "Beat"
    version = 2
    sampling_defaults = {"temperature": 1.2, "top_p": 0.9}  # the paper's pop samples

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def onset_grid(self) -> int:
        return self.beat_resolution

    def tempo_token_ids(self) -> np.ndarray:
        return self.tempo_ids

    def tempo_token(self, bpm: float) -> int:
        return int(self.tempo_ids[self.tempo_bins(np.array([bpm]))[0]])

    def settings(self) -> dict[str, Any]:
        return {
            "beat_resolution": self.beat_resolution,
            "pitch_range": list(self.pitch_range),
            "velocity_range": list(self.velocity_range),
            "max_duration": self.max_duration,
            "tempos": list(self.tempos),
            "chords": self.chords,
        }

    # ------------------------------------------------------------------ encode
    def encode(self, source: str | os.PathLike | bytes | symusic.Score) -> Encoding:
        """Encode a MIDI file (path or bytes) or a `symusic.Score` in memory."""
        name = source_name(source)
        score, length = read_midi(source)
        table = NoteTable.from_score(score, by_role=False)
        grid = BarGrid.of(table, name, self.beat_resolution, self.positions_per_bar)
        notes = self._notes(table, grid, name)
        first_bar, last_bar = notes.first_bar, notes.last_bar
        size = (last_bar - first_bar + 1) * self.positions_per_bar  # cells from the first bar's start
        origin = first_bar * self.positions_per_bar
        chords = self._chord_events(table, notes, grid, length) if self.chords else (np.zeros(0, np.int64),) * 2
        tempos = self._tempo_events(table, grid)
        header = {}  # cell -> [Chord id, Tempo id] (-1: none): the first event of a cell wins
        for k, (cells, tokens) in enumerate((chords, tempos)):
            cells = np.maximum(cells - origin, 0)
            cells[:1] = 0  # the first (at tick 0) opens the piece, even where a pickup moved tick 0
            cells, first = np.unique(cells, return_index=True)
            for cell, token in zip(cells.tolist(), tokens[first].tolist()):
                if cell < size:
                    header.setdefault(cell, [-1, -1])[k] = token
        out = self._events(notes, header, origin)
        report = {
            "notes": int(len(notes.cell)),
            "pitches_folded": notes.folded,
            "durations_clipped": notes.clipped,
            "crowded_notes_merged": notes.merged,
            "bars": last_bar - first_bar + 1,
            "chord_changes": sum(c >= 0 for c, _ in header.values()),
            "tempo_changes": sum(t >= 0 for _, t in header.values()),
        }
        return Encoding(np.asarray(out, dtype=np.int32), report)

    def _notes(self, table: NoteTable, grid: BarGrid, name: str) -> _Notes:
        """The non-drum notes, merged in track order, quantised and put in token order."""
        pitched = table.pitched()
        if not len(pitched):
            raise MidiError(f"{name}: only drum notes; REMI needs pitched notes")
        pitched = pitched.select(np.lexsort((-pitched.pitch, pitched.start)))  # stable: equal notes keep track order
        tpq, res = table.tpq, self.beat_resolution
        cell = grid.position(round_half_even(pitched.start * res, tpq))
        first_bar, last_bar = int(cell[0]) // self.positions_per_bar, int(cell[-1]) // self.positions_per_bar
        if last_bar - first_bar >= MAX_BARS:
            raise MidiError(
                f"{name}: notes span {last_bar - first_bar + 1} bars; longer than {MAX_BARS} bars, not a piece of music"
            )
        lo, hi = self.pitch_range
        folded = np.where(pitched.pitch < lo, pitched.pitch + 12 * ((lo - pitched.pitch + 11) // 12), pitched.pitch)
        folded = np.where(folded > hi, folded - 12 * ((folded - hi + 11) // 12), folded)
        keep, read = self._thinned(cell, folded, pitched), len(pitched)
        pitched, cell, folded = pitched.select(keep), cell[keep], folded[keep]
        duration, pitch, velocity = pitched.end - pitched.start, pitched.pitch, pitched.velocity
        vmin, _, vstep = self.velocity_range
        steps = np.minimum(duration * res, self.max_duration * tpq)  # capped before rounding
        return _Notes(
            read=pitched,
            cell=cell,
            first_bar=first_bar,
            last_bar=last_bar,
            pitch=folded - lo,
            duration=round_half_even(steps, tpq),
            # nearest bin, ties down: floor((v - vmin) / vstep + 1/2 - epsilon)
            velocity=np.clip((2 * (velocity - vmin) + vstep - 1) // (2 * vstep), 0, len(self.velocities) - 1),
            folded=int(np.count_nonzero(folded != pitch)),
            clipped=int(np.count_nonzero(duration * res > self.max_duration * tpq)),
            merged=read - len(keep),
        )

    def _thinned(self, cell: np.ndarray, folded: np.ndarray, notes: NoteTable) -> np.ndarray:
        """Indices of the notes to write, in token order. Decoding keeps the order of at most
        `max_note_offset` notes of a cell that are not lower than the note before them (the
        grammar's bound); a cell with more (e.g. 61 copies of a note on 61 tracks) is written by
        falling pitch, one note per pitch (the longest, then the loudest), so it has none."""
        n = len(cell)
        rise = np.r_[False, (cell[1:] == cell[:-1]) & (folded[1:] >= folded[:-1])]
        group = np.cumsum(np.r_[True, cell[1:] != cell[:-1]]) - 1  # the cell's index among the cells
        crowded = (np.bincount(group, weights=rise) > self.max_note_offset)[group]
        if not crowded.any():
            return np.arange(n)
        by = lambda key: np.where(crowded, -key, 0)  # noqa: E731  (crowded cells only; others keep their order)
        order = np.lexsort((np.arange(n), by(notes.velocity), by(notes.end - notes.start), by(folded), cell))
        copy = np.r_[False, (cell[order][1:] == cell[order][:-1]) & (folded[order][1:] == folded[order][:-1])]
        return order[~(copy & crowded[order])]

    def _events(self, notes: _Notes, header: dict[int, list[int]], origin: int) -> list[int]:
        triples = np.stack(
            [self.pitch_ids[notes.pitch], self.velocity_ids[notes.velocity], self.duration_ids[notes.duration]], axis=1
        )
        cell = notes.cell - origin
        cells = np.union1d(cell, np.fromiter(header, dtype=np.int64, count=len(header)))
        starts = np.searchsorted(cell, cells)
        ends = np.searchsorted(cell, cells, side="right")
        out: list[int] = []
        bar = -1
        for c, a, b in zip(cells.tolist(), starts.tolist(), ends.tolist()):
            while bar < c // self.positions_per_bar:
                out.append(self.bar_id)
                bar += 1
            out.append(int(self.beat_ids[c % self.positions_per_bar]))
            out.extend(t for t in header.get(c, ()) if t >= 0)
            out.extend(triples[a:b].ravel().tolist())
        return out + [self.bar_id, self.eos_id]

    def _chord_events(
        self, table: NoteTable, notes: _Notes, grid: BarGrid, length: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(cell, Chord id) of each chord marker, in time order: the file's chord markers when it
        has any (no chord before the first one), else chorder's labels, one marker per change of
        (root, quality, bass)."""
        tpq = table.tpq
        marked = [(tick, self._chord_of_marker(text)) for tick, text in table.markers]
        marked = sorted(((t, c) for t, c in marked if c is not None), key=lambda m: m[0])
        if marked:
            if marked[0][0] > 0:
                marked.insert(0, (0, self.no_chord_id))
            ticks, ids = (np.array(a, dtype=np.int64) for a in zip(*marked))
            beats = round_half_even(ticks, tpq)
        else:
            beats, ids = self._detected_chords(notes, tpq, length)
        return grid.position(beats * self.beat_resolution), ids

    def _detected_chords(self, notes: _Notes, tpq: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(beat, Chord id) where chorder's label changes, from beat 0 on; chorder labels the beats
        that start before the file's `length` (miditoolkit's max_tick). Only the beats that can
        reach the written bars are labelled: beat 0 (whatever comes before the first bar goes to
        its first cell, and of those the first marker wins) and the beats from two bars before
        the first onset to two bars after the last one."""
        start, end, pitch = notes.read.start, notes.read.end, notes.read.pitch
        n_beats = -(-length // tpq)
        skip = max(int(start[0]) // tpq - 2 * BEATS_PER_BAR, 0) // 2 * 2  # even: chorder scores beat pairs
        stop = min(n_beats, (int(start[-1]) // tpq + 2 * BEATS_PER_BAR) // 2 * 2)
        runs = ([(0, min(2, n_beats))] if skip > 2 else []) + [(skip if skip > 2 else 0, stop)]
        beats, labels = [], []
        for a, b in runs:
            if a < b:
                beats.append(np.arange(a, b))
                labels.append(detect_chords(start, end, pitch, tpq, max_tick=b * tpq, first_beat=a))
        beat = np.concatenate(beats)
        root, quality, bass = (
            np.concatenate([getattr(c, k) for c in labels]).astype(np.int64) for k in ("root", "quality", "bass")
        )
        complete = (root >= 0) & (quality >= 0) & (bass >= 0)
        ids = np.where(complete, self.chord_ids[np.maximum(root, 0), np.maximum(quality, 0)], self.no_chord_id)
        label = np.where(complete, (root * 16 + quality) * 16 + bass, -1)
        change = np.r_[True, (label[1:] != label[:-1]) | (beat[1:] != beat[:-1] + 1)]
        return beat[change], ids[change]

    def _chord_of_marker(self, text: str) -> int | None:
        """The Chord id of a chord marker: `C_M`, `N_N` as `decode` writes them, or the Pop1K7
        analyzer's `C_M_E`, `N_N_N` (root, quality, bass); None for any other text."""
        parts = text.split("_")
        return self.chord_of_name.get("_".join(parts[:2])) if len(parts) in (2, 3) else None

    def _tempo_events(self, table: NoteTable, grid: BarGrid) -> tuple[np.ndarray, np.ndarray]:
        """(cell, Tempo id) of the tempo list miditoolkit reads: 120 bpm at tick 0 unless the file
        sets a tempo there (the last one at tick 0 counts), then each later tempo that differs
        from the one before it."""
        ticks, bpms = [0], [DEFAULT_BPM]
        for tick, bpm in table.tempos:
            if tick == 0:
                ticks, bpms = [0], [bpm]
            elif bpm != bpms[-1]:
                ticks.append(tick)
                bpms.append(bpm)
        order = np.argsort(ticks, kind="stable")
        ticks = np.asarray(ticks, dtype=np.int64)[order]
        cells = grid.position(round_half_even(ticks * self.beat_resolution, table.tpq))
        return cells, self.tempo_ids[self.tempo_bins(np.asarray(bpms)[order])]

    # ------------------------------------------------------------------ decode
    def decode(self, ids, meta=None) -> NoteTable:
        """A piano piece at 480 ticks per beat (role "other"), with chords as markers and every Tempo
        as a tempo change, whose MIDI file (`midi_bytes()`) `encode` reads back to the same ids (for
        every sequence the grammar accepts).

        Any sequence in the REMI layout decodes (the grammar's other rules are not needed); a
        trailing unfinished note (a sampler stopped mid-triple) is dropped; any other layout
        violation is a TokenError. So that the file says what the tokens say:
        - inside a cell, a note starts a tick later than the one before it where its pitch is not
          lower, which keeps the token order (encode orders by onset, then falling pitch);
        - notes of one pitch that overlap go to separate tracks ("Piano", "Piano (2)", ...): on one
          track MIDI cannot tell which note-off ends which note;
        - a Tempo equal to the previous one is written 1 microsecond per quarter apart, since
          MIDI readers drop a tempo event that repeats the one in effect."""
        ids = self._checked_ids(ids)
        notes, tempos, chords = self._read(ids)
        start, end, pitch, velocity = np.array(notes, dtype=np.int64).reshape(-1, 4).T
        track = _voices(start, end, pitch)
        voices = range(max(track, default=0) + 1)
        pianos = [Track(nth_track_name("Piano", k), 0, False, "other") for k in voices]
        written, mspq_before = [], 0
        for tick, bpm in tempos:
            mspq = round(60e6 / bpm)
            mspq = mspq + 1 if mspq == mspq_before else mspq
            written.append((tick, 60e6 / mspq))
            mspq_before = mspq
        return NoteTable(TICKS_PER_BEAT, start, end, pitch, velocity, track, pianos, written, [(0, 4, 4)], chords)

    def _read(self, ids: np.ndarray):
        """Notes (start, end, pitch, velocity in token order), (tick, bpm) tempos and (tick, text) chords."""
        layout = self.grammar().layout
        state = layout.start()
        notes, tempos, chords = [], [], []
        bar, tick, pitch, velocity, last_pitch, offset = -1, 0, 0, 0, -1, 0
        for i, tok in enumerate(ids.tolist()):
            state = layout.step(state, tok, where=i)
            if tok == self.bar_id or self.beat_of[tok] >= 0:
                bar += tok == self.bar_id
                position = self.beat_of[tok] if tok != self.bar_id else 0
                tick = (bar * self.positions_per_bar + position) * self.ticks_per_position
                last_pitch, offset = -1, 0
            elif self.pitch_of[tok] >= 0:
                pitch = int(self.pitch_of[tok])
            elif self.velocity_of[tok] >= 0:
                velocity = self.velocities[self.velocity_of[tok]]
            elif self.duration_of[tok] >= 0:
                if last_pitch >= 0 and pitch >= last_pitch:
                    offset = min(offset + 1, self.max_note_offset)
                last_pitch = pitch
                # a zero-length note would not sound: bin 0 plays for a quarter of a grid step
                length = self.duration_of[tok] * self.ticks_per_position or max(self.ticks_per_position // 4, 1)
                notes.append((tick + offset, tick + offset + int(length), pitch, velocity))
            elif self.tempo_of[tok] >= 0:
                tempos.append((tick, self.tempos[self.tempo_of[tok]]))
            elif self.is_chord[tok]:
                chords.append((tick, self.vocab[tok][len("Chord_") :]))
        return notes, tempos, chords

    def _checked_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids).astype(np.int64, copy=False).ravel()
        bad = np.flatnonzero((ids < 0) | (ids >= self.vocab_size))
        if len(bad):
            raise TokenError(f"token {bad[0]} has id {ids[bad[0]]}, outside the vocabulary (0..{self.vocab_size - 1})")
        n = len(ids)
        while n and ids[n - 1] == self.pad_id:  # batches are right-padded
            n -= 1
        return ids[:n]

    # ------------------------------------------------------------------ the rest of the API
    def grammar(self) -> RemiGrammar:
        return self._grammar

    @functools.cached_property
    def _grammar(self) -> RemiGrammar:
        return RemiGrammar(self)

    def transpose(self, ids: np.ndarray, shift: int) -> np.ndarray | None:
        ids = np.asarray(ids)
        out = ids.copy()
        pitch = self.pitch_of[ids]
        is_pitch = pitch >= 0
        moved = pitch[is_pitch] + shift
        lo, hi = self.pitch_range
        if len(moved) and (moved.min() < lo or moved.max() > hi):
            return None
        out[is_pitch] = self.pitch_ids[moved - lo]
        root = self.chord_root_of[ids]
        is_chord = root >= 0
        out[is_chord] = self.chord_ids[(root[is_chord] + shift) % 12, self.chord_quality_of[ids[is_chord]]]
        return out

    def onsets(self, ids) -> np.ndarray:
        """The time of the last Bar or Beat token at or before each token (0 before the first
        Bar): a Bar sits on its bar line, a Beat_k k grid steps after it, and every other token
        (chord, tempo, note, EOS, PAD) at the Beat or Bar it follows."""
        ids = np.asarray(ids, dtype=np.int64)
        is_bar = ids == self.bar_id
        bar = np.maximum(np.cumsum(is_bar) - 1, 0)
        cell = np.where(is_bar, 0, self.beat_of[ids])  # -1: neither Bar nor Beat
        marked = np.where(cell >= 0, np.arange(len(ids)), -1)
        last = np.maximum.accumulate(marked) if len(ids) else marked
        cell = np.where(last >= 0, cell[np.maximum(last, 0)], 0)
        return (bar * self.positions_per_bar + cell) / self.beat_resolution

    def onset_clock(self) -> _RemiClock:
        return _RemiClock(self)

    def bar_starts(self, ids) -> list[int]:
        """Index of every Bar token (the last one, before EOS, closes the piece)."""
        return np.flatnonzero(np.asarray(ids) == self.bar_id).tolist()


class _RemiClock(OnsetClock):
    """`RemiTokenizer.onsets`, token by token: the bars begun and the cell of the last Bar or Beat."""

    def __init__(self, tok: RemiTokenizer):
        self.bar_id, self.beat_of = tok.bar_id, tok.beat_of
        self.positions_per_bar, self.beat_resolution = tok.positions_per_bar, tok.beat_resolution
        self.bars = self.cell = 0

    def advance(self, token: int) -> float:
        if token == self.bar_id:
            self.bars, self.cell = self.bars + 1, 0
        elif self.beat_of[token] >= 0:
            self.cell = int(self.beat_of[token])
        return (max(self.bars - 1, 0) * self.positions_per_bar + self.cell) / self.beat_resolution


@dataclass
class _Notes:
    """The notes of a piece in token order: as read (a NoteTable), and their tokens' values."""

    read: NoteTable
    cell: np.ndarray  # grid position from the start of the file's first bar
    first_bar: int
    last_bar: int
    pitch: np.ndarray  # index into the pitch range, after folding
    duration: np.ndarray  # grid steps
    velocity: np.ndarray  # velocity bin index
    folded: int
    clipped: int
    merged: int  # copies of a pitch left out of a crowded cell


def _voices(start: np.ndarray, end: np.ndarray, pitch: np.ndarray) -> np.ndarray:
    """For each note (in token order), the first piano track where its pitch is silent at its onset."""
    track = np.zeros(len(start), dtype=np.int64)
    sounding: list[np.ndarray] = []  # per track: the tick up to which each pitch sounds
    for i, (on, off, key) in enumerate(zip(start.tolist(), end.tolist(), pitch.tolist())):
        k = next((k for k, until in enumerate(sounding) if until[key] < on), len(sounding))
        if k == len(sounding):
            sounding.append(np.full(128, -1, dtype=np.int64))
        sounding[k][key] = max(sounding[k][key], off)
        track[i] = k
    return track
