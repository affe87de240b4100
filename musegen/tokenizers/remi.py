"""REMI for pop piano, with the Pop1K7 vocabulary of the SPE paper's reference code by default.

A piece is a sequence of bars of 4 beats. Each non-empty grid position (16th note by
default) of a bar emits `Beat_k`, then an optional `Chord_<root>_<quality>` (when the
detected chord changes), an optional `Tempo_<bpm>` (when the binned tempo changes), then one
`Note_Pitch`, `Note_Velocity`, `Note_Duration` triple per note. A piece ends with `Bar_None`,
`EOS_None`. Ids are positions in the alphabetical sort of the event names; PAD comes last.

Meter: only pieces whose bars are 4/4, or whose time signatures group quarter notes in ones
or twos (1/4, 2/4, 2/2, 4/8), are accepted; the latter re-bar into 4/4 without moving any note.
POP909 writes 1/4 or 2/4 at tick 0 for music that is in 4/4, so its songs pass; triple and
compound meters (3/4, 6/8, 12/8, ...) are refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import miditoolkit
import numpy as np

from ..chords import QUALITIES, ROOT_NAMES, detect_chords
from ..errors import ConfigError, MidiError, TokenError
from ..midi import load_score
from .base import Encoding, Grammar, Tokenizer

BEATS_PER_BAR = 4
OUTPUT_TPQ = 480  # decoded MIDI resolution; Pop1K7's duration names are ticks at this resolution
DEFAULT_TEMPO_BPM = 120.0  # MIDI's tempo before any tempo event
MAX_BARS = 10_000  # about 5 hours at 120 bpm: anything longer is a broken file, not music
# The tempos that occur in Pop1K7: the step-3 grid from 32 to 224 bpm, kept where a value occurred.
POP1K7_TEMPOS = (*range(32, 150, 3), 155, 158, 161, 167, 170, 176, 182, 188, 194, 200, 206, 215, 221, 224)
NO_CHORD = "N_N"


class RemiTokenizer(Tokenizer):
    kind = "remi"

    def __init__(self, beat_resolution: int = 4, pitch_range: tuple[int, int] = (22, 107),
                 velocity_range: tuple[int, int, int] = (40, 86, 2), max_duration: int = 16,
                 tempos: tuple[int, ...] = POP1K7_TEMPOS, chords: bool = True):
        """`beat_resolution`: grid positions per beat; `pitch_range`: lowest and highest pitch,
        others are folded in by octaves; `velocity_range`: (lowest, highest, step) of the velocity
        bins; `max_duration`: longest duration in grid steps; `tempos`: the tempo bins (bpm);
        `chords`: write Chord tokens."""
        lo, hi = pitch_range
        vmin, vmax, vstep = velocity_range
        if not (isinstance(beat_resolution, int) and 1 <= beat_resolution and OUTPUT_TPQ % beat_resolution == 0):
            raise ConfigError(f"beat_resolution must divide {OUTPUT_TPQ}, got {beat_resolution!r}")
        if not (0 <= lo and hi <= 127 and hi - lo >= 11):
            raise ConfigError(f"pitch_range must lie in 0..127 and span an octave, got {pitch_range!r}")
        if not (0 < vstep and 0 <= vmin <= vmax <= 127 and (vmax - vmin) % vstep == 0):
            raise ConfigError(f"velocity_range must be (low, high, step) within 0..127, got {velocity_range!r}")
        if not (isinstance(max_duration, int) and max_duration >= 1):
            raise ConfigError(f"max_duration must be a positive number of grid steps, got {max_duration!r}")
        if not tempos or list(tempos) != sorted(set(tempos)) or min(tempos) <= 0:
            raise ConfigError("tempos must be increasing positive bpm values")
        self.beat_resolution = beat_resolution
        self.pitch_range = (int(lo), int(hi))
        self.velocity_range = (int(vmin), int(vmax), int(vstep))
        self.max_duration = max_duration
        self.tempos = tuple(int(t) for t in tempos)
        self.chords = bool(chords)
        self.positions_per_bar = BEATS_PER_BAR * beat_resolution
        self.ticks_per_position = OUTPUT_TPQ // beat_resolution
        self.velocities = list(range(vmin, vmax + 1, vstep))
        self._build_vocab()
        self._grammar: RemiGrammar | None = None

    # ------------------------------------------------------------------ vocabulary
    def _build_vocab(self) -> None:
        lo, hi = self.pitch_range
        chord_names = [f"{r}_{q}" for r in ROOT_NAMES for q in QUALITIES] + [NO_CHORD]
        names = (["Bar_None", "EOS_None"]
                 + [f"Beat_{k}" for k in range(self.positions_per_bar)]
                 + [f"Chord_{c}" for c in chord_names]
                 + [f"Tempo_{t}" for t in self.tempos]
                 + [f"Note_Pitch_{p}" for p in range(lo, hi + 1)]
                 + [f"Note_Velocity_{v}" for v in self.velocities]
                 + [f"Note_Duration_{d * self.ticks_per_position}" for d in range(self.max_duration + 1)])
        self.vocab = sorted(names) + ["PAD_None"]
        ids = {name: i for i, name in enumerate(self.vocab)}
        self.bar_id, self.eos_id = ids["Bar_None"], ids["EOS_None"]
        self._pad_id = ids["PAD_None"]
        self.beat_ids = np.array([ids[f"Beat_{k}"] for k in range(self.positions_per_bar)])
        self.tempo_ids = np.array([ids[f"Tempo_{t}"] for t in self.tempos])
        self.pitch_ids = np.array([ids[f"Note_Pitch_{p}"] for p in range(lo, hi + 1)])
        self.velocity_ids = np.array([ids[f"Note_Velocity_{v}"] for v in self.velocities])
        self.duration_ids = np.array([ids[f"Note_Duration_{d * self.ticks_per_position}"]
                                      for d in range(self.max_duration + 1)])
        # chord_ids[root, quality]; the no-chord token sits at [12, 0]
        self.chord_ids = np.full((13, len(QUALITIES)), -1)
        for r, root in enumerate(ROOT_NAMES):
            for q, quality in enumerate(QUALITIES):
                self.chord_ids[r, q] = ids[f"Chord_{root}_{quality}"]
        self.no_chord_id = self.chord_ids[12, 0] = ids[f"Chord_{NO_CHORD}"]

        # Reverse tables: id -> value (or -1), used by decode, transpose and the grammar.
        size = len(self.vocab)
        self.beat_of = _inverse(self.beat_ids, size)
        self.pitch_of = _inverse(self.pitch_ids, size, offset=lo)
        self.velocity_of = _inverse(self.velocity_ids, size)
        self.duration_of = _inverse(self.duration_ids, size)
        self.tempo_of = _inverse(self.tempo_ids, size)
        self.chord_root_of = np.full(size, -1)
        self.chord_quality_of = np.full(size, -1)
        for r in range(12):
            self.chord_root_of[self.chord_ids[r]] = r
            self.chord_quality_of[self.chord_ids[r]] = np.arange(len(QUALITIES))

    @property
    def pad_id(self) -> int:
        return self._pad_id

    def settings(self) -> dict[str, Any]:
        return {"beat_resolution": self.beat_resolution, "pitch_range": list(self.pitch_range),
                "velocity_range": list(self.velocity_range), "max_duration": self.max_duration,
                "tempos": list(self.tempos), "chords": self.chords}

    # ------------------------------------------------------------------ quantisation
    def quantise(self, score) -> dict[str, np.ndarray]:
        """The notes of a checked `symusic.Score` on the grid: position (grid steps from the start),
        pitch (folded into range), duration bin, velocity bin, plus the raw ticks chords need."""
        tracks = [t.notes.numpy() for t in score.tracks if not t.is_drum and len(t.notes)]
        raw = {k: np.concatenate([t[k] for t in tracks]).astype(np.int64)
               for k in ("time", "duration", "pitch", "velocity")}
        tpq, res = score.tpq, self.beat_resolution
        lo, hi = self.pitch_range
        vmin, _, vstep = self.velocity_range
        pitch = raw["pitch"]
        pitch = np.where(pitch < lo, pitch + 12 * ((lo - pitch + 11) // 12), pitch)
        pitch = np.where(pitch > hi, pitch - 12 * ((pitch - hi + 11) // 12), pitch)
        duration = (2 * raw["duration"] * res + tpq) // (2 * tpq)
        return {
            # round half up, in integers: (2 t res + tpq) // (2 tpq) == floor(t res / tpq + 1/2)
            "position": (2 * raw["time"] * res + tpq) // (2 * tpq),
            "pitch": pitch,
            "duration": np.minimum(duration, self.max_duration),
            "clipped": duration > self.max_duration,
            "velocity": np.clip((2 * (raw["velocity"] - vmin) + vstep) // (2 * vstep), 0, len(self.velocities) - 1),
            "raw": raw,
        }

    def _tempo_changes(self, score) -> tuple[np.ndarray, np.ndarray]:
        """(grid position, tempo bin index) at each change of the binned tempo, starting at 0."""
        tempos = score.tempos.numpy()
        valid = tempos["mspq"] > 0
        times, mspq = tempos["time"][valid].astype(np.int64), tempos["mspq"][valid].astype(np.float64)
        # MIDI's default tempo holds until the first tempo event
        pos = np.r_[0, (2 * times * self.beat_resolution + score.tpq) // (2 * score.tpq)]
        bins = _nearest(np.array(self.tempos, dtype=np.float64), np.r_[DEFAULT_TEMPO_BPM, 60e6 / mspq])
        last_at_pos = np.r_[pos[1:] != pos[:-1], True]  # several events in one grid cell: the last wins
        pos, bins = pos[last_at_pos], bins[last_at_pos]
        change = np.r_[True, bins[1:] != bins[:-1]]
        return pos[change], bins[change]

    # ------------------------------------------------------------------ encode
    def encode(self, source: str | os.PathLike | bytes) -> Encoding:
        name = "<bytes>" if isinstance(source, (bytes, bytearray)) else str(source)
        score = load_score(source)
        self._check_meter(score, name)
        if all(t.is_drum or not len(t.notes) for t in score.tracks):
            raise MidiError(f"{name}: only drum notes; REMI needs pitched notes")
        notes = self.quantise(score)
        position = notes["position"]
        order = np.lexsort((notes["velocity"], notes["duration"], notes["pitch"], position))
        position = position[order]
        last = int(position[-1])
        if last // self.positions_per_bar >= MAX_BARS:
            raise MidiError(f"{name}: notes reach bar {last // self.positions_per_bar}; "
                            f"longer than {MAX_BARS} bars, not a piece of music")
        triples = np.stack([self.pitch_ids[notes["pitch"][order] - self.pitch_range[0]],
                            self.velocity_ids[notes["velocity"][order]],
                            self.duration_ids[notes["duration"][order]]], axis=1)

        header: dict[int, list[int]] = {}  # grid position -> Chord/Tempo ids written after its Beat
        chord_changes = self._chord_changes(notes["raw"], score.tpq, last) if self.chords else []
        for pos, chord_id in chord_changes:
            header.setdefault(pos, []).append(chord_id)
        tempo_pos, tempo_bin = self._tempo_changes(score)
        # the tempo in effect at the first event is written there; later changes where they happen
        first = min([int(position[0])] + [p for p, _ in chord_changes[:1]])
        current = int(np.searchsorted(tempo_pos, first, side="right")) - 1
        tempo_events = [(first, tempo_bin[current])] + [
            (int(p), b) for p, b in zip(tempo_pos[current + 1:], tempo_bin[current + 1:]) if p <= last]
        for pos, b in tempo_events:
            header.setdefault(pos, []).append(int(self.tempo_ids[b]))

        starts = np.searchsorted(position, np.arange(last + 2))  # notes of position p: starts[p]:starts[p+1]
        event_positions = sorted(set(np.unique(position).tolist()) | set(header))
        out: list[int] = []
        bar = -1
        for pos in event_positions:
            while bar < pos // self.positions_per_bar:
                out.append(self.bar_id)
                bar += 1
            out.append(int(self.beat_ids[pos % self.positions_per_bar]))
            out.extend(header.get(pos, ()))
            out.extend(triples[starts[pos]:starts[pos + 1]].ravel().tolist())
        out += [self.bar_id, self.eos_id]
        report = {"notes": int(len(position)),
                  "pitches_folded": int(np.count_nonzero(notes["pitch"] != notes["raw"]["pitch"])),
                  "durations_clipped": int(np.count_nonzero(notes["clipped"])),
                  "bars": bar + 1, "chord_changes": len(chord_changes), "tempo_changes": len(tempo_events)}
        return Encoding(np.asarray(out, dtype=np.int32), report)

    def _chord_changes(self, raw: dict[str, np.ndarray], tpq: int, last: int) -> list[tuple[int, int]]:
        """(grid position, Chord id) at each beat whose chord differs from the previous beat's."""
        beats = detect_chords(raw["time"], raw["time"] + raw["duration"], raw["pitch"], tpq)
        complete = (beats.root >= 0) & (beats.bass >= 0)  # chorder writes only complete chords
        ids = np.where(complete, self.chord_ids[np.maximum(beats.root, 0), np.maximum(beats.quality, 0)],
                       self.no_chord_id)
        previous = np.r_[self.no_chord_id, ids[:-1]]
        changed = np.flatnonzero(ids != previous)
        positions = changed * self.beat_resolution
        return [(int(p), int(ids[b])) for p, b in zip(positions, changed) if p <= last]

    @staticmethod
    def _check_meter(score, name: str) -> None:
        for ts in score.time_signatures:
            quarters = ts.numerator * 4 / ts.denominator if ts.denominator else 0
            if quarters not in (1, 2, 4):
                raise MidiError(f"{name}: time signature {ts.numerator}/{ts.denominator} at tick {ts.time}; "
                                "REMI needs 4/4 (1/4 and 2/4 are re-barred into 4/4)")

    # ------------------------------------------------------------------ decode
    def decode(self, ids) -> miditoolkit.MidiFile:
        """A piano MIDI file at 480 ticks per beat, with chords as markers. A trailing unfinished
        note (a sampler stopped mid-triple) is dropped; any other grammar violation is an error."""
        ids = self._checked_ids(ids)
        midi = miditoolkit.MidiFile(ticks_per_beat=OUTPUT_TPQ)
        midi.time_signature_changes.append(miditoolkit.TimeSignature(4, 4, 0))
        piano = miditoolkit.Instrument(program=0, is_drum=False, name="Piano")
        midi.instruments.append(piano)
        grammar, state = self.grammar(), self.grammar().start()
        bar, pos, pitch, velocity = -1, 0, 0, 0
        for i, tok in enumerate(ids.tolist()):
            state = grammar.step(state, tok, where=i)
            if tok == self.bar_id:
                bar += 1
            elif self.beat_of[tok] >= 0:
                pos = self.beat_of[tok]
            tick = int(bar * self.positions_per_bar + pos) * self.ticks_per_position
            if self.pitch_of[tok] >= 0:
                pitch = self.pitch_of[tok]
            elif self.velocity_of[tok] >= 0:
                velocity = self.velocities[self.velocity_of[tok]]
            elif self.duration_of[tok] >= 0:
                # a zero-length note would not sound: bin 0 plays for a quarter of a grid step
                length = self.duration_of[tok] * self.ticks_per_position or self.ticks_per_position // 4 or 1
                piano.notes.append(miditoolkit.Note(velocity, int(pitch), tick, tick + length))
            elif self.tempo_of[tok] >= 0:
                midi.tempo_changes.append(miditoolkit.TempoChange(self.tempos[self.tempo_of[tok]], tick))
            elif self.chord_root_of[tok] >= 0 or tok == self.no_chord_id:
                midi.markers.append(miditoolkit.Marker(self.vocab[tok][len("Chord_"):], tick))
        if not midi.tempo_changes:
            midi.tempo_changes.append(miditoolkit.TempoChange(DEFAULT_TEMPO_BPM, 0))
        midi.max_tick = max([n.end for n in piano.notes] + [0])
        return midi

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
    def grammar(self) -> "RemiGrammar":
        if self._grammar is None:
            self._grammar = RemiGrammar(self)
        return self._grammar

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

    def bar_starts(self, ids) -> list[int]:
        """Index of every Bar token (the last one, before EOS, closes the piece)."""
        return np.flatnonzero(np.asarray(ids) == self.bar_id).tolist()


# Grammar state classes. A state is one int: class * (positions_per_bar + 1) + (beat + 1).
START, BAR, BEAT, CHORD, TEMPO, PITCH, VELOCITY, NOTE, END = range(9)
_CLASS_NAMES = ("start", "Bar", "Beat", "Chord", "Tempo", "Note_Pitch", "Note_Velocity", "Note_Duration", "EOS")


class RemiGrammar(Grammar):
    """Bar, then Beats that only move forward within the bar; after a Beat an optional Chord,
    an optional Tempo, then complete (Pitch, Velocity, Duration) notes; EOS only after a Bar.

    Every (state, token) -> next state is precomputed in one table, so `allowed` and `step` are
    array lookups cheap enough to call once per sampled token.
    """

    def __init__(self, tok: RemiTokenizer):
        self.vocab_size = tok.vocab_size
        self._tok = tok
        width = tok.positions_per_bar + 1
        self._width = width
        n_states = 9 * width
        kind = np.full(tok.vocab_size, -1)  # token -> the class of state it leads to
        kind[tok.bar_id], kind[tok.eos_id] = BAR, END
        kind[tok.beat_of >= 0] = BEAT
        kind[(tok.chord_root_of >= 0)] = CHORD
        kind[tok.no_chord_id] = CHORD
        kind[tok.tempo_of >= 0] = TEMPO
        kind[tok.pitch_of >= 0] = PITCH
        kind[tok.velocity_of >= 0] = VELOCITY
        kind[tok.duration_of >= 0] = NOTE
        follows = {  # state class -> token classes allowed next (Beat handled with its position)
            START: {BAR}, BAR: {BAR, BEAT, END}, BEAT: {CHORD, TEMPO, PITCH},
            CHORD: {TEMPO, PITCH, BEAT, BAR}, TEMPO: {PITCH, BEAT, BAR}, PITCH: {VELOCITY},
            VELOCITY: {NOTE}, NOTE: {PITCH, BEAT, BAR}, END: set(),
        }
        table = np.full((n_states, tok.vocab_size), -1, dtype=np.int32)
        for cls, allowed in follows.items():
            for beat in range(-1, tok.positions_per_bar):
                state = cls * width + beat + 1
                for nxt in allowed:
                    tokens = np.flatnonzero(kind == nxt)
                    if nxt == BEAT:  # a new Beat must lie after the current one in this bar
                        tokens = tokens[tok.beat_of[tokens] > (beat if cls != BAR else -1)]
                        table[state, tokens] = BEAT * width + tok.beat_of[tokens] + 1
                    elif nxt in (BAR, END):
                        table[state, tokens] = nxt * width
                    else:
                        table[state, tokens] = nxt * width + beat + 1
        self._next = table
        self._masks = table >= 0
        self._masks.setflags(write=False)

    def start(self) -> int:
        return START * self._width

    def allowed(self, state: int) -> np.ndarray:
        return self._masks[state]

    def step(self, state: int, token: int, where: int | None = None) -> int:
        nxt = int(self._next[state, token]) if 0 <= token < self.vocab_size else -1
        if nxt < 0:
            at = f"token {where} " if where is not None else ""
            name = self._tok.vocab[token] if 0 <= token < self.vocab_size else str(token)
            raise TokenError(f"{at}{name} may not follow {_CLASS_NAMES[state // self._width]}")
        return nxt

    def can_close(self, state: int) -> bool:
        return state // self._width in (START, BAR, CHORD, TEMPO, NOTE, END)

    def close(self, state: int) -> list[int]:
        cls = state // self._width
        if not self.can_close(state):
            raise TokenError(f"cannot end the piece after {_CLASS_NAMES[cls]}")
        if cls == END:
            return []
        return [self._tok.eos_id] if cls == BAR else [self._tok.bar_id, self._tok.eos_id]


def _inverse(ids: np.ndarray, size: int, offset: int = 0) -> np.ndarray:
    """id -> index in `ids` (+ offset), -1 for ids not in the table."""
    out = np.full(size, -1)
    out[ids] = np.arange(len(ids)) + offset
    return out


def _nearest(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index of the nearest of the sorted `values` for each x (ties go to the lower value)."""
    return np.argmin(np.abs(values[None, :] - np.asarray(x, dtype=np.float64)[:, None]), axis=1)
