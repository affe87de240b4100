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
from typing import Any, NamedTuple

import miditoolkit
import numpy as np

from ..chords import QUALITIES, ROOT_NAMES, detect_chords
from ..errors import ConfigError, MidiError, TokenError
from ..midi import load_score
from .base import MAX_BARS, Encoding, Grammar, Tokenizer

BEATS_PER_BAR = 4
OUTPUT_TPQ = 480  # decoded MIDI resolution; Pop1K7's duration names are ticks at this resolution
DEFAULT_TEMPO_BPM = 120.0  # MIDI's tempo before any tempo event
# The tempos that occur in Pop1K7: the step-3 grid from 32 to 224 bpm, kept where a value occurred.
POP1K7_TEMPOS = (*range(32, 150, 3), 155, 158, 161, 167, 170, 176, 182, 188, 194, 200, 206, 215, 221, 224)
NO_CHORD = "N_N"


class RemiTokenizer(Tokenizer):
    kind = "remi"
    version = 2
    sampling_defaults = {"temperature": 1.2, "top_p": 0.9}  # the paper's pop samples

    def __init__(self, beat_resolution: int = 4, pitch_range: tuple[int, int] = (22, 107),
                 velocity_range: tuple[int, int, int] = (40, 86, 2), max_duration: int = 16,
                 tempos: tuple[int, ...] = POP1K7_TEMPOS, chords: bool = True):
        """`beat_resolution`: grid positions per beat; `pitch_range`: lowest and highest pitch,
        others are folded in by octaves; `velocity_range`: (lowest, highest, step) of the velocity
        bins; `max_duration`: longest duration in grid steps; `tempos`: the tempo bins (bpm);
        `chords`: write Chord tokens."""
        lo, hi = pitch_range
        vmin, vmax, vstep = velocity_range
        # at most 160: a duration-0 note decodes to a quarter of a grid step (at least 1 tick),
        # which must still round back to 0 steps
        if not (isinstance(beat_resolution, int) and 1 <= beat_resolution <= 160
                and OUTPUT_TPQ % beat_resolution == 0):
            raise ConfigError(f"beat_resolution must divide {OUTPUT_TPQ} and be at most 160, got {beat_resolution!r}")
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
        self.chord_of_marker = {name[len("Chord_"):]: i for name, i in ids.items() if name.startswith("Chord_")}

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

    def name(self, token: int) -> str:
        """The event name of an id, or the id itself when it is outside the vocabulary."""
        return self.vocab[token] if 0 <= token < len(self.vocab) else str(token)

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
        position, pitch, duration, velocity, merged, cut = self._canonical_notes(notes)
        last = int(position[-1])
        if last // self.positions_per_bar >= MAX_BARS:
            raise MidiError(f"{name}: notes reach bar {last // self.positions_per_bar}; "
                            f"longer than {MAX_BARS} bars, not a piece of music")
        triples = np.stack([self.pitch_ids[pitch - self.pitch_range[0]], self.velocity_ids[velocity],
                            self.duration_ids[duration]], axis=1)

        header: dict[int, list[int]] = {}  # grid position -> Chord/Tempo ids written after its Beat
        chord_changes = self._chord_changes(score, notes["raw"], last) if self.chords else []
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
                  "notes_merged": merged, "durations_cut": cut,
                  "bars": bar + 1, "chord_changes": len(chord_changes), "tempo_changes": len(tempo_events)}
        return Encoding(np.asarray(out, dtype=np.int32), report)

    def _canonical_notes(self, notes: dict[str, np.ndarray]):
        """The quantised notes in token order (position, then pitch), made playable as MIDI: one
        note per pitch and position (the longest, then loudest, is kept) and a note cut short where
        the same pitch strikes again before it ends (a re-struck key). Returns position, pitch,
        duration and velocity arrays, and the counts of merged and cut notes."""
        position, pitch = notes["position"], notes["pitch"]
        duration, velocity = notes["duration"].copy(), notes["velocity"]
        order = np.lexsort((velocity, duration, position, pitch))
        position, pitch, duration, velocity = position[order], pitch[order], duration[order], velocity[order]
        keep = np.r_[(position[1:] != position[:-1]) | (pitch[1:] != pitch[:-1]), True]
        merged = int(len(keep) - keep.sum())
        position, pitch, duration, velocity = position[keep], pitch[keep], duration[keep], velocity[keep]
        # a note of duration 0 still sounds (a 64th), so it holds its pitch for one grid step
        gap = position[1:] - position[:-1]
        overlaps = np.flatnonzero((pitch[1:] == pitch[:-1]) & (gap < np.maximum(duration[:-1], 1)))
        duration[overlaps] = gap[overlaps]
        order = np.lexsort((pitch, position))
        return position[order], pitch[order], duration[order], velocity[order], merged, len(overlaps)

    def _chord_changes(self, score, raw: dict[str, np.ndarray], last: int) -> list[tuple[int, int]]:
        """(grid position, Chord id) at each beat whose chord differs from the previous beat's.

        The chords are the file's chord markers (`C_M`, `N_N`: what `decode` writes) when it has
        any, so a decoded piece re-encodes to its own Chord tokens; otherwise they are detected."""
        marked = self._marker_chords(score)
        if marked is None:
            beats = detect_chords(raw["time"], raw["time"] + raw["duration"], raw["pitch"], score.tpq)
            complete = (beats.root >= 0) & (beats.bass >= 0)  # chorder writes only complete chords
            marked = np.where(complete, self.chord_ids[np.maximum(beats.root, 0), np.maximum(beats.quality, 0)],
                              self.no_chord_id)
        previous = np.r_[self.no_chord_id, marked[:-1]]
        changed = np.flatnonzero(marked != previous)
        positions = changed * self.beat_resolution
        return [(int(p), int(marked[b])) for p, b in zip(positions, changed) if p <= last]

    def _marker_chords(self, score) -> np.ndarray | None:
        """One Chord id per beat from the chord markers (each holds until the next; the last
        marker of a beat wins), or None when the file has no chord marker."""
        marks = sorted((m.time, self.chord_of_marker[m.text]) for m in score.markers
                       if m.text in self.chord_of_marker)
        if not marks:
            return None
        beat = np.array([(2 * t + score.tpq) // (2 * score.tpq) for t, _ in marks])  # nearest beat, halves up
        chord = np.array([c for _, c in marks])
        last_of_beat = np.r_[beat[1:] != beat[:-1], True]
        beat, chord = beat[last_of_beat], chord[last_of_beat]
        if beat[0] != 0:  # before the first marker: no chord
            beat, chord = np.r_[0, beat], np.r_[self.no_chord_id, chord]
        return chord[np.searchsorted(beat, np.arange(beat[-1] + 1), side="right") - 1]

    @staticmethod
    def _check_meter(score, name: str) -> None:
        for ts in score.time_signatures:
            quarters = ts.numerator * 4 / ts.denominator if ts.denominator else 0
            if quarters not in (1, 2, 4):
                raise MidiError(f"{name}: time signature {ts.numerator}/{ts.denominator} at tick {ts.time}; "
                                "REMI needs 4/4 (1/4 and 2/4 are re-barred into 4/4)")

    # ------------------------------------------------------------------ decode
    def decode(self, ids, meta=None) -> miditoolkit.MidiFile:
        """A piano MIDI file at 480 ticks per beat, with chords as markers. Any sequence in the REMI
        layout decodes (the canonical order the grammar asks for is not needed); a trailing
        unfinished note (a sampler stopped mid-triple) is dropped; any other layout violation is
        a TokenError."""
        ids = self._checked_ids(ids)
        midi = miditoolkit.MidiFile(ticks_per_beat=OUTPUT_TPQ)
        midi.time_signature_changes.append(miditoolkit.TimeSignature(4, 4, 0))
        piano = miditoolkit.Instrument(program=0, is_drum=False, name="Piano")
        midi.instruments.append(piano)
        layout = self.grammar().layout
        state = layout.start()
        bar, pos, pitch, velocity = -1, 0, 0, 0
        for i, tok in enumerate(ids.tolist()):
            state = layout.step(state, tok, where=i)
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
        if self.chords and not any(m.time == 0 for m in midi.markers):
            # markers tell `encode` that the chords are given: without one it would detect chords
            midi.markers.insert(0, miditoolkit.Marker(NO_CHORD, 0))
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


# Layout state classes. A layout state is one int: class * (positions_per_bar + 1) + (beat + 1).
START, BAR, BEAT, CHORD, TEMPO, PITCH, VELOCITY, NOTE, END = range(9)
_CLASS_NAMES = ("start", "Bar", "Beat", "Chord", "Tempo", "Note_Pitch", "Note_Velocity", "Note_Duration", "EOS")


class RemiLayout:
    """The order of REMI tokens, which `decode` needs: Bar first, then Beats that only move forward
    within the bar; after a Beat an optional Chord, an optional Tempo, then complete (Pitch,
    Velocity, Duration) notes; EOS only after a Bar. Every (state, token) -> next state is one
    precomputed table, so `step` is an array lookup."""

    def __init__(self, tok: RemiTokenizer):
        self._tok = tok
        self.width = width = tok.positions_per_bar + 1
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
        table = np.full((9 * width, tok.vocab_size), -1, dtype=np.int32)
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
        self.next = table
        self.masks = table >= 0
        self.masks.setflags(write=False)

    def start(self) -> int:
        return START * self.width

    def step(self, state: int, token: int, where: int | None = None) -> int:
        nxt = int(self.next[state, token]) if 0 <= token < len(self._tok.vocab) else -1
        if nxt < 0:
            raise TokenError(f"{_at(where)}{self._tok.name(token)} may not follow {_CLASS_NAMES[state // self.width]}")
        return nxt


class RemiState(NamedTuple):
    """Where a piece stands, for the canonical grammar. Never mutated (samples share states)."""

    layout: int  # RemiLayout state
    bar: int  # index of the current bar, -1 before the first Bar
    here: int  # grid position of the current Beat from the start of the piece
    floor: int  # pitch index of the last note at this position, -1 when none
    pitch: int  # pitch index of the note being written (after its Pitch token)
    free_at: np.ndarray  # per pitch index: first grid position where that pitch may start again
    chord: int  # the Chord id in effect
    tempo: int  # the tempo bin in effect, -1 before the first Tempo
    after_note: bool  # the state is a Bar that directly follows a note: EOS may come
    lone_tempo: bool  # the piece's first Tempo, right after its Beat: a note must follow at this Beat


class RemiGrammar(Grammar):
    """Exactly the sequences `encode` writes, so that encode(decode(ids)) == ids for each of them.

    On top of the layout (`RemiLayout`):
    - notes at one position go strictly up in pitch, and a pitch may not start while an earlier
      note of that pitch still sounds (a duration-0 note holds it for one grid step);
    - the first event (a note, or a Chord) states its Tempo; a Tempo or Chord token never repeats the one in effect
      (the piece starts with no chord), and Chords sit on beats (when the tokenizer writes chords);
    - a Beat holding only Chord/Tempo needs a note at or after it before the piece ends;
    - the piece ends Bar, EOS right after a note (no trailing empty bar), within MAX_BARS bars.
    `allowed` is a copy of one table row and a few numpy masks: cheap enough per sampled token.
    """

    def __init__(self, tok: RemiTokenizer):
        self.vocab_size = tok.vocab_size
        self._tok = tok
        self.layout = RemiLayout(tok)
        self._header = (tok.tempo_of >= 0) | (tok.chord_root_of >= 0)
        self._header[tok.no_chord_id] = True
        self._is_chord = self._header & (tok.tempo_of < 0)
        self._is_pitch = tok.pitch_of >= 0
        only_eos = np.zeros(tok.vocab_size, dtype=bool)
        only_eos[tok.eos_id] = True
        self._only_eos = only_eos

    def start(self) -> RemiState:
        free_at = np.zeros(len(self._tok.pitch_ids), dtype=np.int64)
        free_at.setflags(write=False)
        return RemiState(self.layout.start(), -1, -1, -1, -1, free_at, self._tok.no_chord_id, -1, False, False)

    def allowed(self, state: RemiState) -> np.ndarray:
        tok = self._tok
        cls, here = state.layout // self.layout.width, state.here
        if state.bar >= MAX_BARS:
            return self._only_eos & self.layout.masks[state.layout]
        mask = self.layout.masks[state.layout].copy()
        if cls in (BEAT, CHORD, TEMPO, NOTE):
            pitches = state.free_at <= here
            pitches[:state.floor + 1] = False
            mask[tok.pitch_ids] &= pitches
            if state.tempo < 0:  # the first event states its tempo before anything else
                mask &= self._header
            elif state.lone_tempo:
                mask &= self._is_pitch
            else:
                mask[tok.tempo_ids[state.tempo]] = False
            if cls == BEAT:
                if tok.chords and (here % tok.beat_resolution) == 0:
                    mask[state.chord] = False
                else:
                    mask &= ~self._is_chord
        if state.bar + 1 >= MAX_BARS and cls != NOTE:  # only the closing Bar may be bar MAX_BARS
            mask[tok.bar_id] = False
        mask[tok.eos_id] &= state.after_note
        return mask

    def step(self, state: RemiState, token: int, where: int | None = None) -> RemiState:
        tok = self._tok
        layout = self.layout.step(state.layout, token, where)
        broken = self._broken_rule(state, token)
        if broken:
            raise TokenError(f"{_at(where)}{tok.name(token)} {broken}")
        bar, here, floor, pitch, free_at, chord, tempo = state[1:-2]
        cls = layout // self.layout.width
        if cls == BAR:
            bar, floor = bar + 1, -1
        elif cls == BEAT:
            here, floor = bar * tok.positions_per_bar + int(tok.beat_of[token]), -1
        elif cls == CHORD:
            chord = token
        elif cls == TEMPO:
            tempo = int(tok.tempo_of[token])
        elif cls == PITCH:
            pitch = int(tok.pitch_of[token]) - tok.pitch_range[0]
        elif cls == NOTE:
            free_at = free_at.copy()
            free_at[pitch] = here + max(int(tok.duration_of[token]), 1)
            free_at.setflags(write=False)
            floor = pitch
        before = state.layout // self.layout.width
        return RemiState(layout, bar, here, floor, pitch, free_at, chord, tempo,
                         token == tok.bar_id and before == NOTE, cls == TEMPO and before == BEAT and state.tempo < 0)

    def _broken_rule(self, state: RemiState, token: int) -> str | None:
        """The canonical rule a token the layout allows would break, or None: `allowed` one token
        at a time, with the reason for the error message."""
        tok = self._tok
        cls, here = state.layout // self.layout.width, state.here
        if token == tok.eos_id:
            return None if state.after_note else \
                "may only follow a Bar that directly follows a note (the encoder writes no trailing empty bar)"
        if state.bar >= MAX_BARS or (token == tok.bar_id and state.bar + 1 >= MAX_BARS and cls != NOTE):
            return f"would go past bar {MAX_BARS}: only the closing Bar and EOS may follow"
        if cls not in (BEAT, CHORD, TEMPO, NOTE):
            return None
        if state.tempo < 0 and not self._header[token]:
            return "comes before the first event's Tempo"
        if state.lone_tempo and not self._is_pitch[token]:
            return "leaves the first Tempo without a Chord or a note at its Beat (the first event has one)"
        if tok.tempo_of[token] >= 0:
            return "repeats the tempo in effect" if tok.tempo_of[token] == state.tempo else None
        if self._is_chord[token]:
            if not tok.chords:
                return "is a Chord, and this tokenizer writes none"
            if here % tok.beat_resolution:
                return "is off the beat (Chords sit on beats)"
            return "repeats the chord in effect" if token == state.chord else None
        pitch = tok.pitch_of[token] - tok.pitch_range[0]
        if pitch < 0:
            return None
        if state.free_at[pitch] > here:
            return "starts while the previous note of that pitch still sounds"
        if pitch <= state.floor:
            return "is not above the previous pitch at this position (notes go up in pitch)"
        return None

    def can_close(self, state: RemiState) -> bool:
        cls = state.layout // self.layout.width
        return cls in (NOTE, END) or (cls == BAR and state.after_note)

    def close(self, state: RemiState) -> list[int]:
        cls = state.layout // self.layout.width
        if not self.can_close(state):
            raise TokenError(f"cannot end the piece after {_CLASS_NAMES[cls]}"
                             + (" without a note since the last Bar" if cls == BAR else ""))
        if cls == END:
            return []
        return [self._tok.eos_id] if cls == BAR else [self._tok.bar_id, self._tok.eos_id]


def _at(where: int | None) -> str:
    return f"token {where} " if where is not None else ""


def _inverse(ids: np.ndarray, size: int, offset: int = 0) -> np.ndarray:
    """id -> index in `ids` (+ offset), -1 for ids not in the table."""
    out = np.full(size, -1)
    out[ids] = np.arange(len(ids)) + offset
    return out


def _nearest(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index of the nearest of the sorted `values` for each x (ties go to the lower value)."""
    return np.argmin(np.abs(values[None, :] - np.asarray(x, dtype=np.float64)[:, None]), axis=1)
