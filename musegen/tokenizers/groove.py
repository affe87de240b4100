"""The groove representation (PAPER_NOTES §4): a bass, drums and accompaniment trio as
note_on / note_off / time_shift events on a 12-per-beat grid.

Vocabulary (794 events + PAD = 795 ids):
- `NoteOn_<track>_<pitch>`   ids 0..383    (track 1 bass, 2 drums, 3 other; pitch 0..127)
- `NoteOff_<track>_<pitch>`  ids 384..767
- `TimeShift_<units>`        ids 768..791  (1..24 units of 1/12 beat: at most 2 beats)
- `Start` 792, `End` 793, `PAD` 794.

Encoding writes, at each grid time, the note_offs before the note_ons (so a re-struck note
is released first), each group in increasing id order, and splits time shifts at bar lines
(4 beats) and at MAX_SHIFT, so every bar starts at a token boundary. The grammar accepts
exactly this canonical form, so encode(decode(ids)) == ids for every sequence it accepts.
There is no velocity and no program in the tokens: the programs and tempo found in the
input are returned in the encoding report (`report["meta"]`) and can be given back to
`decode`; otherwise the `programs` setting is used.
"""

from __future__ import annotations

import os
import random
from typing import Any

import miditoolkit
import numpy as np

from ..errors import MidiError, TokenError
from ..midi import load_score
from .base import MAX_BARS, Encoding, Grammar, Tokenizer

UNITS_PER_BEAT = 12
MAX_SHIFT = 2 * UNITS_PER_BEAT  # the longest single time shift, in units
BEATS_PER_BAR = 4
BAR = BEATS_PER_BAR * UNITS_PER_BEAT
TRACKS = {1: "bass", 2: "drums", 3: "other"}
BASS, DRUMS, OTHER = 1, 2, 3
ROLE_NAMES = {BASS: "Bass", DRUMS: "Drums", OTHER: "Other"}  # the track names `decode` writes
BASS_PROGRAMS = range(32, 40)  # General MIDI: acoustic bass .. synth bass 2

N_PITCH = 128
NOTE_ON = 0
NOTE_OFF = NOTE_ON + len(TRACKS) * N_PITCH  # 384
TIME_SHIFT = NOTE_OFF + len(TRACKS) * N_PITCH  # 768: TimeShift_1
START = TIME_SHIFT + MAX_SHIFT  # 792
END = START + 1  # 793
PAD = END + 1  # 794
N_NOTES = NOTE_OFF  # number of (track, pitch) slots

TICKS_PER_BEAT_OUT = 480  # decoded files; a multiple of UNITS_PER_BEAT
DEFAULT_VELOCITY = 100


def note_on_id(track: int, pitch: int) -> int:
    return NOTE_ON + (track - 1) * N_PITCH + pitch


def note_off_id(track: int, pitch: int) -> int:
    return NOTE_OFF + (track - 1) * N_PITCH + pitch


def _pitched_slots() -> np.ndarray:
    """Boolean mask over the 384 (track, pitch) slots: True for bass and other (transposable)."""
    mask = np.ones(N_NOTES, dtype=bool)
    mask[(DRUMS - 1) * N_PITCH:DRUMS * N_PITCH] = False
    return mask


_PITCHED = _pitched_slots()


class GrooveTokenizer(Tokenizer):
    """Bass / drums / other trio tokens. `other_seed`: None picks the accompaniment track with
    the most notes; an int picks one at random (reproducibly per file and seed)."""

    kind = "groove"
    augmentation = {"max_shift": 5, "max_skip_bars": 4, "track_dropout": 0.2}  # drums never transposed
    default_crop = "start"  # sequences cut to the first N tokens, as in the paper (bar skips vary them)
    token_types = {"note-on": "NoteOn_", "note-off": "NoteOff_", "time shift": "TimeShift_", "Start": "Start",
                   "End": "End"}
    position_type = "time shift"
    version = 2
    sampling_defaults = {"temperature": 0.6, "top_p": 1.0}  # the paper's groove samples

    def __init__(self, programs: dict[str, int] | None = None, other_seed: int | None = None):
        self.programs = {"bass": 33, "other": 0, **(programs or {})}
        for role, program in self.programs.items():
            if role not in ("bass", "other") or not isinstance(program, int) or not 0 <= program < 128:
                raise TokenError(f"invalid groove program setting {role}={program!r}")
        self.other_seed = other_seed
        self.vocab = ([f"NoteOn_{t}_{p}" for t in TRACKS for p in range(N_PITCH)]
                      + [f"NoteOff_{t}_{p}" for t in TRACKS for p in range(N_PITCH)]
                      + [f"TimeShift_{u}" for u in range(1, MAX_SHIFT + 1)]
                      + ["Start", "End", "PAD"])
        assert len(self.vocab) == PAD + 1

    @property
    def pad_id(self) -> int:
        return PAD

    def settings(self) -> dict[str, Any]:
        return {"programs": dict(self.programs), "other_seed": self.other_seed}

    def grammar(self) -> "GrooveGrammar":
        return GrooveGrammar()

    # ---- encoding -------------------------------------------------------------------------

    def trio(self, source: str | os.PathLike | bytes) -> tuple[np.ndarray, dict[str, Any]]:
        """The quantised trio of a MIDI file: an int array of rows (track, pitch, onset, offset)
        in grid units, and facts about the choice (tracks, programs, tempo, dropped notes)."""
        score = load_score(source)
        name = "<bytes>" if isinstance(source, (bytes, bytearray)) else str(source)
        for ts in score.time_signatures:  # 2/4 and 2/2 pair up into 4-beat bars; 3/4, 6/8 do not
            if ts.numerator <= 0 or BEATS_PER_BAR * ts.denominator % (4 * ts.numerator):  # 0/x: fuzzed files
                raise MidiError(f"{name}: time signature {ts.numerator}/{ts.denominator} at tick "
                                f"{ts.time}; the groove tokenizer needs 4/4 (or 2/4, 2/2)")
        tracks = list(score.tracks)  # one wrapper per track, so `is` and index() hold
        drums = [t for t in tracks if t.is_drum and len(t.notes)]
        melodic = [t for t in tracks if not t.is_drum and len(t.notes)]
        own = _roles_by_name(drums + melodic)
        if own is not None:  # a file `decode` wrote: roles by name, so a missing role stays missing
            bass, drums, other = own
        else:
            if not drums:
                raise MidiError(f"{name}: no drum track (channel 10); the groove tokenizer needs drums")
            if not melodic:
                raise MidiError(f"{name}: no bass or accompaniment track, only drums")
            bass = self._pick_bass(melodic)
            rest = [t for t in melodic if t is not bass]
            other = self._pick_other(rest) if rest else None
        chosen = ([(BASS, bass)] if bass else []) + [(DRUMS, t) for t in drums] + ([(OTHER, other)] if other else [])

        rows = []
        for track, part in chosen:
            arr = part.notes.numpy()
            start = arr["time"].astype(np.int64)
            end = start + arr["duration"].astype(np.int64)
            on, off = _to_grid(start, score.tpq), _to_grid(end, score.tpq)
            off = np.maximum(off, on + 1)  # a note shorter than half a unit still sounds for one
            rows.append(np.stack([np.full_like(on, track), arr["pitch"].astype(np.int64), on, off], 1))
        notes, merged = _resolve_overlaps(np.concatenate(rows))
        if notes[:, 3].max() // BAR >= MAX_BARS:  # e.g. a huge delta-time: millions of time shifts
            raise MidiError(f"{name}: longer than {MAX_BARS} bars, not a piece of music")
        tempos = score.tempos
        index = lambda track: next(i for i, t in enumerate(tracks) if t is track)  # names may repeat
        meta = {
            "bass_track": bass.name if bass else None, "bass_index": index(bass) if bass else None,
            "bass_program": int(bass.program) if bass else None,
            "other_track": other.name if other else None,
            "other_index": index(other) if other else None,
            "other_program": int(other.program) if other else None,
            "tempo": round(float(tempos[0].qpm), 2) if len(tempos) else 120.0,
        }
        counts = {"notes": int(len(notes)), "notes_merged": merged,
                  "tracks_left_out": len(melodic) - (bass is not None) - (other is not None)}
        return notes, {"meta": meta, **counts}

    def encode(self, source: str | os.PathLike | bytes) -> Encoding:
        notes, report = self.trio(source)
        return Encoding(ids=serialize(notes), report=report)

    @staticmethod
    def _pick_bass(melodic):
        """A GM bass program (most notes first), else the track with the lowest mean pitch."""
        bass_like = [t for t in melodic if t.program in BASS_PROGRAMS]
        if bass_like:
            return max(bass_like, key=lambda t: len(t.notes))
        return min(melodic, key=lambda t: float(np.mean(t.notes.numpy()["pitch"])))

    def _pick_other(self, candidates):
        if self.other_seed is None:
            return max(candidates, key=lambda t: len(t.notes))
        # Seeded by the file's content too, so files with the same track count differ.
        rng = random.Random(f"{self.other_seed}:{[(t.program, len(t.notes)) for t in candidates]}")
        return rng.choice(candidates)

    # ---- decoding -------------------------------------------------------------------------

    def notes(self, ids) -> np.ndarray:
        """The notes of a token sequence as rows (track, pitch, onset, offset) in grid units,
        sorted by onset. Raises TokenError for a sequence the grammar would reject; a missing
        End is tolerated (notes still sounding end at the last time)."""
        ids = _as_ids(ids, self.vocab_size)
        onset = np.full(N_NOTES, -1, dtype=np.int64)
        time, out = 0, []
        for i, tok in enumerate(ids.tolist()):
            if tok < NOTE_OFF:
                if onset[tok] >= 0:
                    raise TokenError(f"token {i} ({self.vocab[tok]}): note already sounding")
                onset[tok] = time
            elif tok < TIME_SHIFT:
                slot = tok - NOTE_OFF
                if onset[slot] < 0 or onset[slot] == time:
                    raise TokenError(f"token {i} ({self.vocab[tok]}): no note sounding to end")
                out.append((slot // N_PITCH + 1, slot % N_PITCH, onset[slot], time))
                onset[slot] = -1
            elif tok < START:
                time += tok - TIME_SHIFT + 1
            elif tok == START:
                if i != 0:
                    raise TokenError(f"token {i}: Start inside the piece")
            elif tok == END:
                break
            # PAD is padding: ignored
        for slot in np.flatnonzero(onset >= 0):
            if onset[slot] < time:
                out.append((slot // N_PITCH + 1, slot % N_PITCH, onset[slot], time))
        rows = np.array(out, dtype=np.int64).reshape(-1, 4)
        return rows[np.lexsort((rows[:, 1], rows[:, 0], rows[:, 2]))]

    def decode(self, ids, programs: dict[str, int | None] | None = None,
               tempo: float = 120.0) -> miditoolkit.MidiFile:
        """A 3-track MIDI (bass, drums on channel 10, other). `programs` (e.g. an encoding
        report's meta: bass_program/other_program) overrides the `programs` setting."""
        given = programs or {}
        prog = {role: given.get(f"{role}_program", given.get(role)) for role in ("bass", "other")}
        prog = {role: self.programs[role] if p is None else int(p) for role, p in prog.items()}
        midi = miditoolkit.MidiFile(ticks_per_beat=TICKS_PER_BEAT_OUT)
        midi.tempo_changes = [miditoolkit.TempoChange(float(tempo), 0)]
        midi.time_signature_changes = [miditoolkit.TimeSignature(BEATS_PER_BAR, 4, 0)]
        parts = {BASS: miditoolkit.Instrument(prog["bass"], name=ROLE_NAMES[BASS]),
                 DRUMS: miditoolkit.Instrument(0, is_drum=True, name=ROLE_NAMES[DRUMS]),
                 OTHER: miditoolkit.Instrument(prog["other"], name=ROLE_NAMES[OTHER])}
        unit = TICKS_PER_BEAT_OUT // UNITS_PER_BEAT
        for track, pitch, on, off in self.notes(ids).tolist():
            parts[track].notes.append(miditoolkit.Note(DEFAULT_VELOCITY, pitch, on * unit, off * unit))
        midi.instruments = [parts[BASS], parts[DRUMS], parts[OTHER]]
        return midi

    # ---- token-level operations (bars, augmentation) -------------------------------------

    def bar_starts(self, ids) -> list[int]:
        """For each bar b (4 beats), the index of the first token at time >= 4b beats, i.e.
        ids[:bar_starts[b]] is the piece before bar b. Bar 0 starts after Start."""
        ids = _as_ids(ids, self.vocab_size)
        shifts = np.where((ids >= TIME_SHIFT) & (ids < START), ids - TIME_SHIFT + 1, 0)
        after = np.cumsum(shifts)  # time after each token
        starts = [1 if len(ids) and ids[0] == START else 0]
        end = _content_end(ids)
        bar = 1
        while bar * BAR < (after[end - 1] if end else 0):
            starts.append(int(np.searchsorted(after, bar * BAR, side="left")) + 1)
            bar += 1
        return starts

    def transpose(self, ids, shift: int) -> np.ndarray | None:
        """Bass and other moved by `shift` semitones; drums untouched. None if out of 0..127."""
        ids = _as_ids(ids, self.vocab_size)
        slot = np.where(ids < NOTE_OFF, ids - NOTE_ON, ids - NOTE_OFF)
        moving = (ids < TIME_SHIFT) & _PITCHED[np.clip(slot, 0, N_NOTES - 1)]
        pitch = slot % N_PITCH + shift
        if np.any(moving & ((pitch < 0) | (pitch >= N_PITCH))):
            return None
        return np.where(moving, ids + shift, ids)

    def skip_bars(self, ids, n: int) -> np.ndarray | None:
        """The piece without its first `n` bars. Notes sounding across the cut are restarted at
        the new beginning. None when the piece has no more than `n` bars."""
        notes = self.notes(ids)
        cut = n * BAR
        if n < 0 or not len(notes) or notes[:, 3].max() <= cut:
            return None
        kept = notes[notes[:, 3] > cut].copy()
        kept[:, 2:] = np.maximum(kept[:, 2:] - cut, 0)
        return serialize(kept)

    def drop_tracks(self, ids, tracks) -> np.ndarray:
        """The piece without any event of `tracks` (1 bass, 2 drums, 3 other)."""
        notes = self.notes(ids)
        return serialize(notes[~np.isin(notes[:, 0], list(tracks))])


def serialize(notes: np.ndarray) -> np.ndarray:
    """Token ids for notes (track, pitch, onset, offset): Start, events, End. At each time the
    note_offs come first; time shifts are split at bar lines and at MAX_SHIFT."""
    notes = np.asarray(notes, dtype=np.int64).reshape(-1, 4)
    slot = (notes[:, 0] - 1) * N_PITCH + notes[:, 1]
    times = np.concatenate([notes[:, 3], notes[:, 2]])
    toks = np.concatenate([NOTE_OFF + slot, NOTE_ON + slot])
    is_on = np.arange(len(toks)) >= len(slot)  # at equal times the offs (False) come first
    order = np.lexsort((toks, is_on, times))
    times, toks = times[order], toks[order]
    out, now = [START], 0
    for t, tok in zip(times.tolist(), toks.tolist()):
        while now < t:
            step = min(t - now, MAX_SHIFT, BAR - now % BAR)
            out.append(TIME_SHIFT + step - 1)
            now += step
        out.append(tok)
    out.append(END)
    return np.array(out, dtype=np.int32)


def _roles_by_name(tracks):
    """(bass, drums, other) of a file whose tracks with notes all bear distinct role names as
    `decode` writes them (drums on the drum channel); None for any other file. Roles missing
    from the file are None (drums: an empty list)."""
    names = [t.name for t in tracks]
    by_name = {ROLE_NAMES[r]: r for r in TRACKS}
    if len(set(names)) != len(names) or any(
            n not in by_name or t.is_drum != (by_name[n] == DRUMS) for n, t in zip(names, tracks)):
        return None
    role = {by_name[t.name]: t for t in tracks}
    return role.get(BASS), [role[DRUMS]] if DRUMS in role else [], role.get(OTHER)


def _to_grid(ticks: np.ndarray, tpq: int) -> np.ndarray:
    """Nearest grid unit, halves rounded up: floor(ticks * 12 / tpq + 1/2) in integers."""
    return (2 * UNITS_PER_BEAT * ticks + tpq) // (2 * tpq)


def _resolve_overlaps(notes: np.ndarray) -> tuple[np.ndarray, int]:
    """One sounding note per (track, pitch): notes with the same onset merge (longest kept), and
    a note still sounding when the next one of its pitch starts is cut there. Returns the
    notes sorted by (track, pitch, onset) and how many were merged away."""
    if not len(notes):
        return notes, 0
    order = np.lexsort((-notes[:, 3], notes[:, 2], notes[:, 1], notes[:, 0]))
    notes = notes[order]
    same_key = np.all(notes[1:, :3] == notes[:-1, :3], axis=1)
    keep = np.concatenate([[True], ~same_key])  # the first of equal onsets is the longest
    notes = notes[keep].copy()
    same_slot = np.all(notes[1:, :2] == notes[:-1, :2], axis=1)
    cut = same_slot & (notes[:-1, 3] > notes[1:, 2])
    notes[:-1, 3] = np.where(cut, notes[1:, 2], notes[:-1, 3])
    return notes, int((~keep).sum())


def _as_ids(ids, vocab_size: int) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TokenError("token ids must be a 1-D sequence of integers")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise TokenError(f"token id out of range 0..{vocab_size - 1}")
    return arr


def _content_end(ids: np.ndarray) -> int:
    """Index just past the last token that belongs to the piece (before End and padding)."""
    ends = np.flatnonzero(ids == END)
    return int(ends[0]) if len(ends) else len(ids)


class GrooveGrammar(Grammar):
    """The canonical token order `serialize` writes, and nothing else.

    State: (phase, sounding, last, pos). phase 0: before Start, 1: in the piece, 2: ended;
    sounding: boolean array over the 384 (track, pitch) slots; last: the previous token;
    pos: the grid position within the bar. Within one time step the note_offs come first,
    then the note_ons, each in increasing id order (so a note never ends where it began). A
    shift stops at the next bar line and is at most MAX_SHIFT long; a second shift may only
    follow a shift that went as far as it could. End follows a note_off and nothing sounds
    (a piece holds at least one note, and trailing silence is no token the encoder writes).
    """

    vocab_size = PAD + 1

    def start(self):
        return (0, np.zeros(N_NOTES, dtype=bool), -1, 0)

    def allowed(self, state) -> np.ndarray:
        phase, sounding, last, pos = state
        mask = np.zeros(self.vocab_size, dtype=bool)
        if phase == 0:
            mask[START] = True
        if phase != 1:
            return mask
        shift_fits = TIME_SHIFT + min(MAX_SHIFT, BAR - pos)  # one past the longest allowed shift
        if last < NOTE_OFF:  # after a note_on: only higher note_ons at this time
            mask[last + 1:NOTE_OFF] = ~sounding[last + 1:]
            mask[TIME_SHIFT:shift_fits] = True
        elif last < TIME_SHIFT:  # after a note_off: higher note_offs, any note_on
            mask[NOTE_ON:NOTE_OFF] = ~sounding
            mask[last + 1:TIME_SHIFT] = sounding[last + 1 - NOTE_OFF:]
            mask[TIME_SHIFT:shift_fits] = True
            mask[END] = not sounding.any()
        else:  # after Start or a shift: any note_off or note_on
            mask[NOTE_ON:NOTE_OFF] = ~sounding
            mask[NOTE_OFF:TIME_SHIFT] = sounding
            if last == TIME_SHIFT + MAX_SHIFT - 1 or pos == 0:  # Start, or a shift that went all the way
                mask[TIME_SHIFT:shift_fits] = True
        return mask

    def step(self, state, token: int):
        phase, sounding, last, pos = state
        if not self.allowed(state)[token]:
            raise TokenError(f"token {token} is not allowed here")
        if token == START:
            return (1, sounding, START, 0)
        if token == END:
            return (2, sounding, END, pos)
        if token >= TIME_SHIFT:
            return (1, sounding, token, (pos + token - TIME_SHIFT + 1) % BAR)
        sounding = sounding.copy()
        sounding[token % N_NOTES] = token < NOTE_OFF
        return (1, sounding, token, pos)

    def can_close(self, state) -> bool:
        """In the piece, with a note sounding or just ended (not after silence, not empty)."""
        phase, sounding, last, _ = state
        return phase == 1 and (last < TIME_SHIFT or bool(sounding.any()))

    def close(self, state) -> list[int]:
        """The note_offs of every sounding note, End. They come one unit later when the last
        token was a note_on or a note_off above one of them (the order within a time step)."""
        if not self.can_close(state):
            raise TokenError("the piece cannot be closed here (not started, silent, or already ended)")
        _, sounding, last, _ = state
        offs = [NOTE_OFF + int(s) for s in np.flatnonzero(sounding)]
        wait = last < NOTE_OFF or (last < TIME_SHIFT and offs and offs[0] < last)
        return ([TIME_SHIFT] if wait else []) + offs + [END]
