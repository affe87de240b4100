"""The groove representation (docs/method.md, experiment B): a bass, drums and accompaniment
trio as note_on / note_off / time_shift events on a 12-per-beat grid, token for token as the
SPE paper's reference pipeline writes it (aliutkus/spe, experiments/groove: MusPy 0.3.0's MIDI
reader, then `EventRepresentationProcessor` with `BeatShiftTiming(12, 2)`).

Vocabulary (794 events + PAD = 795 ids):
- `NoteOn_<track>_<pitch>`   ids 0..383    (track 1 bass, 2 drums, 3 other; pitch 0..127)
- `NoteOff_<track>_<pitch>`  ids 384..767
- `TimeShift_<b>_<t>`        ids 768..791  an absolute position: tick t (of 12) of the beat b
                                           beats after the current one: (0, 1..11), (1, 0..11),
                                           (2, 0). Id 768 + k goes to tick k + 1 counted from
                                           the start of the current beat.
- `End` 792, `Start` 793 (the reference's EOS and BOS), `PAD` 794.

Encoding, as the reference: each note gives a note_on at its onset and a note_off at its offset,
in the order of the notes sorted by (onset, pitch, duration, velocity, track); the events are
then stably sorted by time. Before every event, the shift from the previous event's time: as
many `(2, 0)` as whole pairs of beats, then `(beats mod 2, tick)` unless both are 0. So an event
on a tick other than 0 always has a shift before it, even at the time of the event before
(a "restating" shift). Same-pitch notes may overlap; decoding ends the oldest (first in, first
out), as the reference's decoder. Zero-length notes are kept.

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

import os
import random
from dataclasses import dataclass, field, replace
from typing import Any

import miditoolkit
import numpy as np

from ..errors import MidiError, TokenError
from ..music.constants import BEATS_PER_BAR, MAX_BARS, TICKS_PER_BEAT
from ..music.midi import Parsed, Part
from ..music.roles import BASS, DRUMS, OTHER, ROLE_NAMES, TRACKS, Roles, merged_notes, read_trio
from .base import Encoding, Grammar, Tokenizer

UNITS_PER_BEAT = 12
MAX_SHIFT_BEATS = 2
BAR_UNITS = BEATS_PER_BAR * UNITS_PER_BEAT

N_PITCH = 128
NOTE_ON = 0
NOTE_OFF = NOTE_ON + len(TRACKS) * N_PITCH  # 384
TIME_SHIFT = NOTE_OFF + len(TRACKS) * N_PITCH  # 768: TimeShift_0_1
N_SHIFTS = MAX_SHIFT_BEATS * UNITS_PER_BEAT  # 24
WIDE_SHIFT = TIME_SHIFT + N_SHIFTS - 1  # 791: TimeShift_2_0
END = TIME_SHIFT + N_SHIFTS  # 792, the reference's EOS
START = END + 1  # 793, the reference's BOS
PAD = START + 1  # 794
N_NOTES = NOTE_OFF  # number of (track, pitch) slots


DEFAULT_VELOCITY = 100
DEFAULT_TEMPO = 120.0


def note_on_id(track: int, pitch: int) -> int:
    return NOTE_ON + (track - 1) * N_PITCH + pitch


def note_off_id(track: int, pitch: int) -> int:
    return NOTE_OFF + (track - 1) * N_PITCH + pitch


def shift_id(beats: int, tick: int) -> int:
    """The token of time_shift(beats, tick)."""
    return TIME_SHIFT + beats * UNITS_PER_BEAT + tick - 1


def shift_target(time: int, token: int) -> int:
    """The time a shift token moves to from `time`: a position counted from the current beat."""
    return time - time % UNITS_PER_BEAT + token - TIME_SHIFT + 1


def shifts_between(before: int, after: int) -> list[int]:
    """The shift tokens the encoder writes before an event at `after` that follows one at `before`."""
    beats = after // UNITS_PER_BEAT - before // UNITS_PER_BEAT
    pairs, rest = divmod(beats, MAX_SHIFT_BEATS)
    tick = after % UNITS_PER_BEAT
    return [WIDE_SHIFT] * pairs + ([shift_id(rest, tick)] if rest or tick else [])


def round_half_even(numerator: np.ndarray, denominator: int) -> np.ndarray:
    """numerator / denominator rounded to the nearest integer, halves to even, in integers
    (Python's `round`, which the reference applies to `ticks * 12 / resolution`)."""
    quotient, remainder = np.divmod(np.asarray(numerator, dtype=np.int64), denominator)
    up = (2 * remainder > denominator) | ((2 * remainder == denominator) & (quotient % 2 == 1))
    return quotient + up


def _pitched_slots() -> np.ndarray:
    """Boolean mask over the 384 (track, pitch) slots: True for bass and other (transposable)."""
    mask = np.ones(N_NOTES, dtype=bool)
    mask[(DRUMS - 1) * N_PITCH : DRUMS * N_PITCH] = False
    return mask


_PITCHED = _pitched_slots()


def check_meter(parsed: Parsed) -> None:
    """4-beat bars only: 2/4 and 2/2 pair up into them, 3/4 or 6/8 do not."""
    for tick, numerator, denominator in parsed.time_signatures:
        if numerator <= 0 or BEATS_PER_BAR * denominator % (4 * numerator):  # 0/x: fuzzed files
            raise MidiError(
                f"{parsed.name}: time signature {numerator}/{denominator} at tick {tick}; "
                "the groove tokenizer needs 4/4 (or 2/4, 2/2)"
            )


# ---- the tokenizer ---------------------------------------------------------------------------------


class GrooveTokenizer(Tokenizer):
    """Bass / drums / other trio tokens. `other_seed`: None picks the harmonic track with the
    most notes (the reference's test-time choice); an int picks a non-empty one at random,
    reproducibly per file and seed (training variety, as the reference's random choice)."""

    kind = "groove"
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
    note_off_type = "note-off"

    def __init__(self, programs: dict[str, int] | None = None, other_seed: int | None = None):
        self.programs = {"bass": 33, "other": 0, **(programs or {})}
        for role, program in self.programs.items():
            if role not in ("bass", "other") or not isinstance(program, int) or not 0 <= program < 128:
                raise TokenError(f"invalid groove program setting {role}={program!r}")
        self.other_seed = other_seed
        self.vocab = (
            [f"NoteOn_{t}_{p}" for t in TRACKS for p in range(N_PITCH)]
            + [f"NoteOff_{t}_{p}" for t in TRACKS for p in range(N_PITCH)]
            + [f"TimeShift_0_{t}" for t in range(1, UNITS_PER_BEAT)]
            + [f"TimeShift_{b}_{t}" for b in range(1, MAX_SHIFT_BEATS) for t in range(UNITS_PER_BEAT)]
            + [f"TimeShift_{MAX_SHIFT_BEATS}_0", "End", "Start", "PAD"]
        )
        assert len(self.vocab) == PAD + 1

    @property
    def pad_id(self) -> int:
        return PAD

    def settings(self) -> dict[str, Any]:
        return {"programs": dict(self.programs), "other_seed": self.other_seed}

    def grammar(self) -> "GrooveGrammar":
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
        notes, velocities, crossing = _pair_in_order(np.concatenate(rows), np.concatenate(velocities))
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
        return decode_events(_as_ids(ids, self.vocab_size))[0]

    def decode(self, ids, meta: dict[str, Any] | None = None) -> miditoolkit.MidiFile:
        """A 3-track MIDI: Bass, Drums (channel 10), Other. `meta` (an encoding report's, or any
        dict with bass_program / other_program / tempos / tempo) gives programs and tempo
        changes; otherwise the `programs` setting and 120 bpm. A zero-length note lasts one
        tick; velocities keep the order of notes that differ only by track, so that
        `encode(decode(ids)) == ids` for every sequence the grammar accepts."""
        notes, ties = decode_events(_as_ids(ids, self.vocab_size))
        return self.trio_midi(notes, DEFAULT_VELOCITY + ties, meta)

    def trio_midi(
        self, notes: np.ndarray, velocities: np.ndarray, meta: dict[str, Any] | None = None
    ) -> miditoolkit.MidiFile:
        """Notes (track, pitch, onset, offset) in grid units as the 3-track MIDI `decode` writes,
        with programs and tempo changes from `meta` (see `decode`)."""
        meta = meta or {}
        program = {
            role: self.programs[role] if meta.get(f"{role}_program") is None else int(meta[f"{role}_program"])
            for role in ("bass", "other")
        }
        midi = miditoolkit.MidiFile(ticks_per_beat=TICKS_PER_BEAT)
        unit = TICKS_PER_BEAT // UNITS_PER_BEAT
        tempos = meta.get("tempos") or [[0, meta.get("tempo") or DEFAULT_TEMPO]]
        midi.tempo_changes = [miditoolkit.TempoChange(float(qpm), int(time) * unit) for time, qpm in tempos]
        midi.time_signature_changes = [miditoolkit.TimeSignature(BEATS_PER_BAR, 4, 0)]
        parts = {
            BASS: miditoolkit.Instrument(program["bass"], name=ROLE_NAMES[BASS]),
            DRUMS: miditoolkit.Instrument(0, is_drum=True, name=ROLE_NAMES[DRUMS]),
            OTHER: miditoolkit.Instrument(program["other"], name=ROLE_NAMES[OTHER]),
        }
        for (track, pitch, on, off), velocity in zip(notes.tolist(), np.asarray(velocities).tolist()):
            parts[track].notes.append(
                miditoolkit.Note(min(velocity, 127), pitch, on * unit, max(off * unit, on * unit + 1))
            )
        midi.instruments = [parts[BASS], parts[DRUMS], parts[OTHER]]
        return midi

    # ---- token-level operations (bars, augmentation) -------------------------------------

    def bar_starts(self, ids) -> list[int]:
        """For each bar b (4 beats) that the piece reaches, the index of its first token: the
        first whose time is 4b beats or later (a shift that lands on or past the bar line), so
        ids[:bar_starts[b]] is the piece before bar b. Bar 0 starts after Start."""
        ids = _as_ids(ids, self.vocab_size)
        return bar_starts_at(token_times(ids), _content_end(ids), bool(len(ids) and ids[0] == START))

    def to_bar_line(self, state: "GrooveState", bar: int) -> list[int]:
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
        ids = _as_ids(ids, self.vocab_size)
        slot = np.where(ids < NOTE_OFF, ids - NOTE_ON, ids - NOTE_OFF)
        moving = (ids < TIME_SHIFT) & _PITCHED[np.clip(slot, 0, N_NOTES - 1)]
        pitch = slot % N_PITCH + shift
        if np.any(moving & ((pitch < 0) | (pitch >= N_PITCH))):
            return None
        if not len(ids) or ids[0] != START or shift == 0:
            return np.where(moving, ids + shift, ids)
        return _rewrite(ids, lambda notes: notes + np.where(notes[:, [0]] != DRUMS, [0, shift, 0, 0], 0))

    def skip_bars(self, ids, n: int) -> np.ndarray | None:
        """The piece without its first `n` bars. Notes sounding across the cut are restarted at
        the new beginning. None when the piece has no more than `n` bars."""
        notes, ties = decode_events(_as_ids(ids, self.vocab_size))
        cut = n * BAR_UNITS
        if n < 0 or not len(notes) or notes[:, 3].max() <= cut:
            return None
        keep = (notes[:, 2] >= cut) | (notes[:, 3] > cut)
        kept = notes[keep].copy()
        kept[:, 2:] = np.maximum(kept[:, 2:] - cut, 0)
        return serialize(kept, ties[keep])

    def drop_tracks(self, ids, tracks) -> np.ndarray:
        """The piece without any event of `tracks` (1 bass, 2 drums, 3 other)."""
        notes, ties = decode_events(_as_ids(ids, self.vocab_size))
        keep = ~np.isin(notes[:, 0], list(tracks))
        return serialize(notes[keep], ties[keep])


def _pair_in_order(notes: np.ndarray, velocities: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The notes with, per track and pitch, the k-th onset ending at the k-th offset: what
    decoding gives back (first in, first out). This changes nothing unless notes of one track
    and pitch cross, which only merged parts can do (one MIDI channel is read first in, first
    out already); then the reference's order would not decode to its own notes, and this one
    does. Returns the notes, their velocities (they stay with their onsets) and how many
    offsets moved."""
    slot = notes[:, 0] * N_PITCH + notes[:, 1]
    by_onset = np.lexsort((velocities, notes[:, 3], notes[:, 2], slot))
    by_offset = np.lexsort((notes[:, 3], slot))
    paired = notes[by_onset].copy()
    paired[:, 3] = notes[by_offset, 3]
    return paired, velocities[by_onset], int((paired[:, 3] != notes[by_onset, 3]).sum())


def serialize(notes: np.ndarray, tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Token ids for notes (track, pitch, onset, offset): Start, events, End, as the reference
    orders them. `tiebreak` (velocities; by default all equal) orders notes that share onset,
    pitch and duration before their track does. Notes of one track and pitch that cross are
    paired first in, first out as decoding pairs them (`_pair_in_order`): a zero-length note
    begun over an older note of its pitch would otherwise end that one, an order the grammar
    rightly refuses."""
    notes = np.asarray(notes, dtype=np.int64).reshape(-1, 4)
    tiebreak = np.zeros(len(notes), dtype=np.int64) if tiebreak is None else np.asarray(tiebreak)
    notes, tiebreak, _ = _pair_in_order(notes, tiebreak)
    track, pitch, onset, offset = notes.T
    order = np.lexsort((track, tiebreak, offset - onset, pitch, onset))
    slot = ((track - 1) * N_PITCH + pitch)[order]
    times = np.stack([onset[order], offset[order]], 1).ravel()  # each note's on, then its off
    events = np.stack([NOTE_ON + slot, NOTE_OFF + slot], 1).ravel()
    by_time = np.argsort(times, kind="stable")
    times, events = times[by_time], events[by_time]
    before = np.concatenate([[0], times[:-1]])
    beats = times // UNITS_PER_BEAT - before // UNITS_PER_BEAT
    pairs, rest = np.divmod(beats, MAX_SHIFT_BEATS)
    tick = times % UNITS_PER_BEAT
    final = (rest > 0) | (tick > 0)
    ends = np.cumsum(pairs + final + 1)  # one past each event's position
    out = np.full(int(ends[-1]) if len(ends) else 0, WIDE_SHIFT, dtype=np.int64)
    out[ends - 1] = events
    out[(ends - 2)[final]] = (TIME_SHIFT + rest * UNITS_PER_BEAT + tick - 1)[final]
    return np.concatenate([[START], out, [END]]).astype(np.int32)


def decode_events(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Notes (track, pitch, onset, offset) sorted by (onset, track, pitch, offset), and for each
    its rank among the notes with the same onset, pitch and offset in note_on order (the tie
    order `serialize` needs to give the ids back). Note_offs end the oldest sounding note of
    their slot. TokenError for a note_off of a silent slot, a Start inside the piece, or a note
    that would end before it began; tokens after End and PAD are ignored."""
    sounding: dict[int, list[tuple[int, int]]] = {}
    time, found = 0, []  # (track, pitch, onset, offset, on index)
    for i, tok in enumerate(ids.tolist()):
        if tok < NOTE_OFF:
            sounding.setdefault(tok, []).append((time, i))
        elif tok < TIME_SHIFT:
            queue = sounding.get(tok - NOTE_OFF)
            if not queue:
                raise TokenError(f"token {i} (NoteOff): no note of that track and pitch is sounding")
            onset, index = queue.pop(0)
            if time < onset:
                raise TokenError(f"token {i} (NoteOff): the note would end before it began")
            found.append(((tok - NOTE_OFF) // N_PITCH + 1, tok % N_PITCH, onset, time, index))
        elif tok < END:
            time = shift_target(time, tok)
        elif tok == START and i:
            raise TokenError(f"token {i}: Start inside the piece")
        elif tok == END:
            break
    for slot, queue in sounding.items():  # unfinished (no End): ends at the last time, if it has begun
        found.extend(
            (slot // N_PITCH + 1, slot % N_PITCH, onset, time, index) for onset, index in queue if onset < time
        )
    rows = np.array(found, dtype=np.int64).reshape(-1, 5)
    rows = rows[np.lexsort((rows[:, 4], rows[:, 1], rows[:, 3], rows[:, 2]))]  # tie groups, in note_on order
    group = (
        np.concatenate([[True], np.any(rows[1:, 1:4] != rows[:-1, 1:4], axis=1)]) if len(rows) else np.zeros(0, bool)
    )
    starts = np.maximum.accumulate(np.where(group, np.arange(len(rows)), 0))
    ties = np.arange(len(rows)) - starts
    order = np.lexsort((rows[:, 3], rows[:, 1], rows[:, 0], rows[:, 2]))
    return rows[order, :4], ties[order]


def token_times(ids: np.ndarray) -> np.ndarray:
    """The time (grid units) after each token: a shift token sets the tick and moves on by whole
    beats, relative to the beat of the time before it."""
    ids = np.asarray(ids)
    is_shift = _is_shift(ids)
    units = np.where(is_shift, ids - TIME_SHIFT + 1, 0)
    beats = np.cumsum(units // UNITS_PER_BEAT)
    last_shift = np.maximum.accumulate(np.where(is_shift, np.arange(len(ids)), -1))
    ticks = np.where(last_shift >= 0, units[np.maximum(last_shift, 0)] % UNITS_PER_BEAT, 0)
    return beats * UNITS_PER_BEAT + ticks


def _rewrite(ids: np.ndarray, change) -> np.ndarray:
    """`ids` (from Start) with its notes changed by `change` and written again, same length. A
    window cut before its End keeps its trailing shifts as they are; its unfinished notes end
    one unit after its last event, so their note_offs fall outside the window."""
    end = _content_end(ids)
    if end == len(ids):
        end -= int(np.argmax(~_is_shift(ids[::-1])))
    body = ids[:end]
    sounding = np.zeros(N_NOTES, dtype=np.int64)
    np.add.at(sounding, body[body < NOTE_OFF] - NOTE_ON, 1)
    np.add.at(sounding, body[(body >= NOTE_OFF) & (body < TIME_SHIFT)] - NOTE_OFF, -1)
    unfinished = NOTE_OFF + np.repeat(np.arange(N_NOTES), np.maximum(sounding, 0))
    last = int(token_times(body)[-1])
    closed = np.concatenate([body, shifts_between(last, last + 1), unfinished, [END]]).astype(np.int64)
    notes, ties = decode_events(closed)
    return np.concatenate([serialize(change(notes), ties)[:end], ids[end:]]).astype(ids.dtype)


def bar_starts_at(times: np.ndarray, end: int, opened: bool) -> list[int]:
    """`bar_starts` from the time after each token (`token_times`), the end of the piece's
    content and whether it opens with Start (bar 0 starts after it)."""
    last = int(times[end - 1]) if end else 0
    starts = [int(opened)]
    bar = 1
    while bar * BAR_UNITS < last:
        starts.append(int(np.searchsorted(times[:end], bar * BAR_UNITS, side="left")))
        bar += 1
    return starts


def _is_shift(ids: np.ndarray) -> np.ndarray:
    return (ids >= TIME_SHIFT) & (ids < END)


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


# ---- the grammar -----------------------------------------------------------------------------------

# What the previous token was, as far as the grammar cares.
AFTER_START, AFTER_EVENT, AFTER_WIDE, AFTER_FINAL = range(4)
# What has happened so far at the current time: nothing, note_offs of earlier notes, note_ons.
FRESH, OFFS, ONS = range(3)


@dataclass(frozen=True)
class GrooveState:
    """Where a sequence stands. `sounding`: slot -> the (onset, rank) of its sounding notes,
    oldest first; `rank` numbers the note_ons at the current time. In mode OFFS, `key` is the
    (onset, pitch) of the last note ended now; in mode ONS, the pitch of the last note begun now,
    and `zero_slot` the slot whose note may still end at once (a zero-length note)."""

    phase: int = 0  # 0 before Start, 1 in the piece, 2 after End
    time: int = 0
    last: int = AFTER_START
    mode: int = FRESH
    key: Any = None
    zero_slot: int = -1
    rank: int = 0
    sounding: dict = field(default_factory=dict)
    begun: bool = False  # a note has begun
    begun_now: frozenset = frozenset()  # the slots that began a note at the current time


class GrooveGrammar(Grammar):
    """The order the reference encoder writes, so the data is accepted as it is and
    `encode(decode(ids)) == ids` for every accepted sequence.

    - Start first; End directly after an event, once nothing sounds and a note was played.
    - Shifts: `(2, 0)` repeats; after it, or after an event, one `(0, t)` or `(1, t)` may end
      the chain, and then an event must follow. A shift never goes back: `(0, t)` needs t at
      or after the current tick (equal: it restates the time). An event on a tick other than 0
      needs a shift right before it (the reference restates the time before every event).
    - At one time, the note_offs of notes begun earlier come first, ordered by (onset, pitch)
      of the note they end (first in, first out per slot); then the note_ons by pitch, each
      zero-length note's note_off right after its note_on. Notes of equal pitch begun at one
      time end in the order they began, which is also the reference's order by duration.
    """

    vocab_size = PAD + 1

    def start(self) -> GrooveState:
        return GrooveState()

    def allowed(self, state: GrooveState) -> np.ndarray:
        mask = np.zeros(self.vocab_size, dtype=bool)
        if state.phase != 1:
            mask[START] = state.phase == 0
            return mask
        if state.last != AFTER_FINAL:  # shifts forward: (0, t >= tick) .. (2, 0)
            mask[shift_id(0, max(1, state.time % UNITS_PER_BEAT)) : END] = True
        if state.last != AFTER_EVENT or state.time % UNITS_PER_BEAT == 0:
            self._allow_events(state, mask)
        mask[END] = state.last == AFTER_EVENT and state.begun and not state.sounding
        return mask

    def sampling_mask(self, state: GrooveState) -> np.ndarray:
        """`allowed` without what the data may hold but a sampler should not write:

        - a second note_on of one track and pitch at one time. The data holds such doubles
          (drum tracks merged into one; at most 2 in the reference's own files, up to 6 in the
          MMA corpus), but a sampler allowed one more repeated it without end, the time never
          moving on (measured: 8,192 tokens without reaching the next bar);
        - a shift that restates the time when no event but a double could follow it (the note_ons
          of one time rise by pitch: once the model has reached pitch 127 the only events left
          are doubles, and 13 of 48 groove samples wrote thousands of them);
        - a bass or other note of zero length: silent, 2% of the MMA corpus's bass and other
          notes (drum hits, 57% of them zero-length, stay allowed); a sampler that keeps the
          model's note-off share (`sample.keep_type_mass`) would otherwise spend it on ending the
          note it has just begun."""
        allowed = self.allowed(state)
        mask = self._sampled(state, allowed)
        tick = state.time % UNITS_PER_BEAT
        if tick and mask[shift_id(0, tick)]:  # (after a restating shift only events may come)
            after = self.step(state, shift_id(0, tick))
            mask[shift_id(0, tick)] = self._sampled(after, self.allowed(after)).any()
        return mask if mask.any() else allowed  # (only doubles left: rather a double than a stop)

    def sampling_prefix(self, state: GrooveState, token: int) -> list[int]:
        """A bass line whose notes end where the next begins, one event late: before the first
        event of a new time, the note_offs of the bass notes that a later bass note began over, in
        canonical order, an off-beat time restated before every event after the first. Why late:
        the note_offs of a time come before its first note_on, and the models begin most new bass
        notes after a lower drum or accompaniment note_on at that time, where the old note can no
        longer end; it then rang on for beats (docs/sampling.md)."""
        if state.phase != 1 or state.mode != FRESH or token >= TIME_SHIFT:
            return []
        bass = sorted(
            (onset, slot, rank) for slot, queue in state.sounding.items() if slot < N_PITCH for onset, rank in queue
        )  # bass slots are its pitches; sorted as their note_offs come
        superseded = [NOTE_OFF + slot for onset, slot, _ in bass if onset < bass[-1][0]] if bass else []
        tick = state.time % UNITS_PER_BEAT
        restate = [shift_id(0, tick)] if tick else []
        prefix, walked = [], state
        for off in superseded:
            tokens = (restate if prefix else []) + [off]
            try:
                walked = self.states(tokens, walked)[-1]
            except TokenError:  # (a note of equal onset and pitch in another track must end first)
                break
            prefix += tokens
        return prefix + restate if prefix else []

    @staticmethod
    def _sampled(state: GrooveState, allowed: np.ndarray) -> np.ndarray:
        """`allowed` without doubles and without ending a bass or other note where it begins."""
        mask = allowed.copy()
        mask[[NOTE_ON + slot for slot in state.begun_now]] = False
        if state.mode == ONS and state.zero_slot >= 0 and _PITCHED[state.zero_slot]:
            mask[NOTE_OFF + state.zero_slot] = False
        return mask

    def _allow_events(self, state: GrooveState, mask: np.ndarray) -> None:
        if state.mode == ONS:
            for track in range(len(TRACKS)):
                mask[NOTE_ON + track * N_PITCH + state.key : NOTE_ON + (track + 1) * N_PITCH] = True
            if state.zero_slot >= 0 and self._may_end(state, state.zero_slot):
                mask[NOTE_OFF + state.zero_slot] = True
            return
        mask[NOTE_ON:NOTE_OFF] = True
        for slot in state.sounding:
            mask[NOTE_OFF + slot] = self._may_end(state, slot)

    @staticmethod
    def _may_end(state: GrooveState, slot: int) -> bool:
        """Whether the oldest note of `slot` may end now: not before the notes ended before it
        at this time (by onset, pitch), nor before a note of equal onset and pitch that began
        before it."""
        onset, rank = state.sounding[slot][0]
        pitch = slot % N_PITCH
        if state.mode == OFFS and (onset, pitch) < state.key:
            return False
        for other in range(pitch, N_NOTES, N_PITCH):
            if other != slot and any(o == onset and r < rank for o, r in state.sounding.get(other, ())):
                return False
        return True

    def step(self, state: GrooveState, token: int) -> GrooveState:
        if not self.allowed(state)[token]:
            raise TokenError(f"token {token} is not allowed here")
        if token == START:
            return GrooveState(phase=1)
        if token == END:
            return replace(state, phase=2)
        if token >= TIME_SHIFT:
            time = shift_target(state.time, token)
            moved = dict(mode=FRESH, key=None, zero_slot=-1, rank=0, begun_now=frozenset()) if time > state.time else {}
            return replace(state, time=time, last=AFTER_WIDE if token == WIDE_SHIFT else AFTER_FINAL, **moved)
        sounding = dict(state.sounding)
        if token < NOTE_OFF:
            sounding[token] = sounding.get(token, ()) + ((state.time, state.rank),)
            zero = token if len(sounding[token]) == 1 else -1
            return replace(
                state,
                last=AFTER_EVENT,
                mode=ONS,
                key=token % N_PITCH,
                zero_slot=zero,
                rank=state.rank + 1,
                sounding=sounding,
                begun=True,
                begun_now=state.begun_now | {token},
            )
        slot = token - NOTE_OFF
        onset = sounding[slot][0][0]
        sounding[slot] = sounding[slot][1:]
        if not sounding[slot]:
            del sounding[slot]
        if state.mode == ONS:  # a zero-length note
            return replace(state, last=AFTER_EVENT, zero_slot=-1, sounding=sounding)
        return replace(state, last=AFTER_EVENT, mode=OFFS, key=(onset, slot % N_PITCH), sounding=sounding)

    def can_close(self, state: GrooveState) -> bool:
        """Right after an event, once a note has begun: the sounding notes can end, then End."""
        return state.phase == 1 and state.last == AFTER_EVENT and state.begun

    def close(self, state: GrooveState) -> list[int]:
        """The note_offs of every sounding note in canonical order, then End: at the current
        time when the order allows, else one unit later."""
        if not self.can_close(state):
            raise TokenError("the piece cannot be closed here (not started, or right after a time shift)")
        notes = self._sounding(state)
        now = state.mode == OFFS and (not notes or notes[0][:2] >= state.key)
        return self.release_at(state, state.time if now or not notes else state.time + 1) + [END]

    @staticmethod
    def _sounding(state: GrooveState) -> list[tuple]:
        """(onset, pitch, rank, slot) of every sounding note, in the order their note_offs come."""
        return sorted(
            (onset, slot % N_PITCH, rank, slot) for slot, queue in state.sounding.items() for onset, rank in queue
        )

    def release_at(self, state: GrooveState, time: int) -> list[int]:
        """The tokens that end every sounding note at `time` (shifts there, then the note_offs in
        canonical order); with nothing sounding, the shifts to `time` alone."""
        notes = self._sounding(state)
        if not notes:
            return shifts_between(state.time, time) if time > state.time else []
        tokens, cursor = [], state.time
        for *_, slot in notes:
            tokens += shifts_between(cursor, time) + [NOTE_OFF + slot]
            cursor = time
        return tokens
