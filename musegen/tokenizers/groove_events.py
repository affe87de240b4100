"""The groove vocabulary and its event order (docs/method.md, experiment B): note_on / note_off /
time_shift events of a bass, drums and accompaniment trio on a 12-per-beat grid, as the SPE
paper's reference pipeline writes them (aliutkus/spe, experiments/groove:
`EventRepresentationProcessor` with `BeatShiftTiming(12, 2)`).

Vocabulary (794 events + PAD = 795 ids):
- `NoteOn_<track>_<pitch>`   ids 0..383    (track 1 bass, 2 drums, 3 other; pitch 0..127)
- `NoteOff_<track>_<pitch>`  ids 384..767
- `TimeShift_<b>_<t>`        ids 768..791  an absolute position: tick t (of 12) of the beat b
                                           beats after the current one: (0, 1..11), (1, 0..11),
                                           (2, 0). Id 768 + k goes to tick k + 1 counted from
                                           the start of the current beat.
- `End` 792, `Start` 793 (the reference's EOS and BOS), `PAD` 794.

Serialising, as the reference: each note gives a note_on at its onset and a note_off at its
offset, in the order of the notes sorted by (onset, pitch, duration, velocity, track); the events
are then stably sorted by time. Before every event, the shift from the previous event's time: as
many `(2, 0)` as whole pairs of beats, then `(beats mod 2, tick)` unless both are 0. So an event
on a tick other than 0 always has a shift before it, even at the time of the event before
(a "restating" shift). Same-pitch notes may overlap; decoding ends the oldest (first in, first
out), as the reference's decoder. Zero-length notes are kept.

This module knows ids and notes (rows track, pitch, onset, offset in grid units), not MIDI: the
tokenizer (groove.py) reads and writes files, the grammar (groove_grammar.py) checks the order.
"""

from __future__ import annotations

import numpy as np

from ..errors import TokenError
from ..music.constants import BEATS_PER_BAR
from ..music.roles import DRUMS, TRACKS
from .tracking import OnsetClock, TrackMarks

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


# The event name of every id.
VOCAB = (
    [f"NoteOn_{t}_{p}" for t in TRACKS for p in range(N_PITCH)]
    + [f"NoteOff_{t}_{p}" for t in TRACKS for p in range(N_PITCH)]
    + [f"TimeShift_0_{t}" for t in range(1, UNITS_PER_BEAT)]
    + [f"TimeShift_{b}_{t}" for b in range(1, MAX_SHIFT_BEATS) for t in range(UNITS_PER_BEAT)]
    + [f"TimeShift_{MAX_SHIFT_BEATS}_0", "End", "Start", "PAD"]
)
assert len(VOCAB) == PAD + 1


def note_on_id(track: int, pitch: int) -> int:
    return NOTE_ON + (track - 1) * N_PITCH + pitch


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


def _pitched_slots() -> np.ndarray:
    """Boolean mask over the 384 (track, pitch) slots: True for bass and other (transposable)."""
    mask = np.ones(N_NOTES, dtype=bool)
    mask[(DRUMS - 1) * N_PITCH : DRUMS * N_PITCH] = False
    return mask


PITCHED = _pitched_slots()


def pair_in_order(notes: np.ndarray, velocities: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
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
    paired first in, first out as decoding pairs them (`pair_in_order`): a zero-length note
    begun over an older note of its pitch would otherwise end that one, an order the grammar
    rightly refuses."""
    notes = np.asarray(notes, dtype=np.int64).reshape(-1, 4)
    tiebreak = np.zeros(len(notes), dtype=np.int64) if tiebreak is None else np.asarray(tiebreak)
    notes, tiebreak, _ = pair_in_order(notes, tiebreak)
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
    shift = is_shift(ids)
    units = np.where(shift, ids - TIME_SHIFT + 1, 0)
    beats = np.cumsum(units // UNITS_PER_BEAT)
    last_shift = np.maximum.accumulate(np.where(shift, np.arange(len(ids)), -1))
    ticks = np.where(last_shift >= 0, units[np.maximum(last_shift, 0)] % UNITS_PER_BEAT, 0)
    return beats * UNITS_PER_BEAT + ticks


def role_marks(vocab_size: int) -> TrackMarks:
    """`Tokenizer.track_marks` of both groove vocabularies, whose first N_NOTES ids are the notes
    (note-ons in groove) of bass, drums and other, 128 pitches each: a note names its role's
    track number; bars are 4 beats of the shift clock."""
    track_of = np.full(vocab_size, -1, dtype=np.int64)
    track_of[:N_NOTES] = np.arange(N_NOTES) // N_PITCH + min(TRACKS)
    return TrackMarks(track_of, beats_per_bar=BEATS_PER_BAR)


class ShiftClock(OnsetClock):
    """`token_times` in beats, token by token, for a vocabulary whose shift tokens start at
    `first_shift` (groove-dur's sit elsewhere) and mean what groove's do."""

    def __init__(self, first_shift: int = TIME_SHIFT):
        self.first_shift, self.time = first_shift, 0

    def advance(self, token: int) -> float:
        if 0 <= token - self.first_shift < N_SHIFTS:
            self.time = shift_target(self.time, token - self.first_shift + TIME_SHIFT)
        return self.time / UNITS_PER_BEAT


def rewrite(ids: np.ndarray, change) -> np.ndarray:
    """`ids` (from Start) with its notes changed by `change` and written again, same length. A
    window cut before its End keeps its trailing shifts as they are; its unfinished notes end
    one unit after its last event, so their note_offs fall outside the window."""
    end = content_end(ids)
    if end == len(ids):
        end -= int(np.argmax(~is_shift(ids[::-1])))
    body = ids[:end]
    sounding = np.zeros(N_NOTES, dtype=np.int64)
    np.add.at(sounding, body[body < NOTE_OFF] - NOTE_ON, 1)
    np.add.at(sounding, body[(body >= NOTE_OFF) & (body < TIME_SHIFT)] - NOTE_OFF, -1)
    unfinished = NOTE_OFF + np.repeat(np.arange(N_NOTES), np.maximum(sounding, 0))
    last = int(token_times(body)[-1])
    closed = np.concatenate([body, shifts_between(last, last + 1), unfinished, [END]]).astype(np.int64)
    notes, ties = decode_events(closed)
    return np.concatenate([serialize(change(notes), ties)[:end], ids[end:]]).astype(ids.dtype)


def transposed(ids: np.ndarray, shift: int) -> np.ndarray | None:
    """`GrooveTokenizer.transpose` of checked ids: bass and other moved, drums untouched."""
    slot = np.where(ids < NOTE_OFF, ids - NOTE_ON, ids - NOTE_OFF)
    moving = (ids < TIME_SHIFT) & PITCHED[np.clip(slot, 0, N_NOTES - 1)]
    pitch = slot % N_PITCH + shift
    if np.any(moving & ((pitch < 0) | (pitch >= N_PITCH))):
        return None
    if not len(ids) or ids[0] != START or shift == 0:
        return np.where(moving, ids + shift, ids)
    return rewrite(ids, lambda notes: notes + np.where(notes[:, [0]] != DRUMS, [0, shift, 0, 0], 0))


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


def is_shift(ids: np.ndarray) -> np.ndarray:
    return (ids >= TIME_SHIFT) & (ids < END)


def as_ids(ids, vocab_size: int) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TokenError("token ids must be a 1-D sequence of integers")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise TokenError(f"token id out of range 0..{vocab_size - 1}")
    return arr


def content_end(ids: np.ndarray, end: int = END) -> int:
    """Index just past the last token that belongs to the piece (before `end`, the End id, and padding)."""
    ends = np.flatnonzero(ids == end)
    return int(ends[0]) if len(ends) else len(ids)
