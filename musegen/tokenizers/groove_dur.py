"""The groove trio with durations: each note carries its length, so nothing has to
end. The MIDI is read exactly as the groove tokenizer reads it (`GrooveTokenizer.trio`: the same
roles, count-in handling, 12-per-beat grid, programs and tempo in `meta`), and time moves by
groove's own shift tokens; only the notes are written differently.

Vocabulary (439 ids):
- `Note_<track>_<pitch>`  ids 0..383    (track 1 bass, 2 drums, 3 other; pitch 0..127): an onset;
- `Duration_<units>`      ids 384..411  the length of the bass or other note just before it, in
                                        1/12 beats, on the grid DURATIONS (every unit up to a
                                        beat, then coarser, ratio at most 1.25, up to 4 bars);
- `TimeShift_<b>_<t>`     ids 412..435  groove's shifts: tick t of the beat b beats on;
- `End` 436, `Start` 437, `PAD` 438.

A drum note has no Duration: drums are hits, decoded DRUM_UNITS long (a 16th). A bass or other
note's duration goes to the nearest grid value in log scale (ties up); zero-length notes last
one unit, longer than 4 bars are held 4 bars.

Encoding: Start, then the notes by onset and, at one onset, by id (bass by pitch, then drums,
then other), a shift before a note only where time moves (never restated), End. A slot (track
and pitch) holds one note at a time, as a synthesiser plays it: of notes that share slot and
onset the longest is kept (`merged_notes`), and a note is cut where the next note of its slot
begins (`cut_notes`: its duration rounds down on the grid where rounding would overlap), so
`encode(decode(ids)) == ids` for every sequence the grammar accepts.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import TokenError
from ..music.notes import NoteTable
from ..music.roles import BASS, DRUMS, TRACKS
from .base import Encoding, FramedGrammar, Tokenizer
from .groove import DEFAULT_VELOCITY, GrooveTokenizer
from .groove_events import (
    BAR_UNITS,
    N_NOTES,
    N_PITCH,
    N_SHIFTS,
    TIME_SHIFT,
    UNITS_PER_BEAT,
    ShiftClock,
    bar_starts_at,
    content_end,
    role_marks,
    shift_target,
    shifts_between,
    token_times,
)
from .tracking import TrackMarks

DURATIONS = np.array(list(range(1, 13)) + [15, 18, 21, 24, 30, 36, 42, 48, 60, 72, 84, 96, 120, 144, 168, 192])
# d rounds up from DURATIONS[i] to DURATIONS[i + 1] where d * d >= their product (log midpoint)
_ROUND_UP_AT = DURATIONS[:-1] * DURATIONS[1:]
DRUM_UNITS = 3  # a drum hit's length when decoded

NOTE = 0
DURATION = NOTE + N_NOTES  # 384
SHIFT = DURATION + len(DURATIONS)  # 412
END = SHIFT + N_SHIFTS  # 436
START = END + 1
PAD = START + 1
TO_GROOVE_SHIFT = TIME_SHIFT - SHIFT  # a shift token's id in the groove vocabulary, less its id here


def quantise(units: np.ndarray) -> np.ndarray:
    """Indices into DURATIONS of the nearest durations in log scale (ties up); below 1 unit: 1."""
    units = np.maximum(np.asarray(units, dtype=np.int64), 1)
    return np.searchsorted(_ROUND_UP_AT, units * units, side="right")


def shifts(before: int, after: int) -> list[int]:
    """The shift tokens from time `before` to `after` (none when they are equal)."""
    return [tok - TO_GROOVE_SHIFT for tok in shifts_between(before, after)] if after > before else []


def is_pitched(track: np.ndarray) -> np.ndarray:
    return np.asarray(track) != DRUMS


def fitted(notes: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Notes (track, pitch, onset, offset) as the representation holds them, sorted as they are
    written (by onset, then slot): one note per slot at a time, durations on the grid. Returns
    the notes, their duration indices (-1 for drums) and the counts of what changed."""
    notes = np.asarray(notes, dtype=np.int64).reshape(-1, 4)
    track, pitch, onset, offset = notes.T
    slot = (track - 1) * N_PITCH + pitch
    order = np.lexsort((-offset, onset, slot))  # per slot by onset, the longest first
    notes, slot = notes[order], slot[order]
    first = np.r_[True, (slot[1:] != slot[:-1]) | (notes[1:, 2] != notes[:-1, 2])]
    merged = int((~first).sum())
    notes, slot = notes[first], slot[first]
    onset, length = notes[:, 2], notes[:, 3] - notes[:, 2]
    followed = np.r_[slot[1:] == slot[:-1], False]  # by a later note of its slot
    room = np.where(followed, np.r_[onset[1:], 0] - onset, np.iinfo(np.int64).max)  # until its slot's next onset
    held = np.minimum(length, room)
    index = quantise(held)
    over = DURATIONS[index] > room
    index[over] = np.searchsorted(DURATIONS, room[over], side="right") - 1
    pitched = is_pitched(notes[:, 0])
    counts = {
        "merged_notes": merged,
        "cut_notes": int((pitched & (length > room)).sum()),
        "long_notes": int((pitched & (held > DURATIONS[-1])).sum()),
    }
    index = np.where(pitched, index, -1)
    notes[:, 3] = onset + np.where(pitched, DURATIONS[index], DRUM_UNITS)
    by_time = np.lexsort((slot, onset))
    return notes[by_time], index[by_time], counts


def serialize(notes: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """Token ids (Start .. End) of notes (track, pitch, onset, offset), and what `fitted` changed."""
    notes, index, counts = fitted(notes)
    ids, time = [START], 0
    for (track, pitch, onset, _), duration in zip(notes.tolist(), index.tolist()):
        ids += shifts(time, onset)
        time = onset
        ids.append(NOTE + (track - 1) * N_PITCH + pitch)
        if duration >= 0:
            ids.append(DURATION + duration)
    return np.array(ids + [END], dtype=np.int32), counts


def decode_notes(ids: np.ndarray) -> np.ndarray:
    """The notes (track, pitch, onset, offset) of ids, sorted by (onset, track, pitch, offset).
    TokenError for a Duration without its note, a bass or other note without its Duration, or a
    Start inside the piece; a note cut off before its Duration is left out, PAD is ignored, and
    so is what follows End."""
    time, waiting, found = 0, None, []  # waiting: (track, pitch) of a note before its Duration
    for i, tok in enumerate(ids.tolist()):
        if waiting is not None and DURATION <= tok < SHIFT:
            found.append((*waiting, time, time + int(DURATIONS[tok - DURATION])))
            waiting = None
        elif waiting is not None and tok < END:
            raise TokenError(f"token {i}: a bass or other note must be followed by its Duration")
        elif tok < DURATION:
            track, pitch = tok // N_PITCH + 1, tok % N_PITCH
            if track == DRUMS:
                found.append((track, pitch, time, time + DRUM_UNITS))
            else:
                waiting = (track, pitch)
        elif tok < SHIFT:
            raise TokenError(f"token {i} (Duration): no bass or other note before it")
        elif tok < END:
            time = shift_target(time, tok + TO_GROOVE_SHIFT)
        elif tok == START and i:
            raise TokenError(f"token {i}: Start inside the piece")
        elif tok == END:
            break
    rows = np.array(found, dtype=np.int64).reshape(-1, 4)
    return rows[np.lexsort((rows[:, 3], rows[:, 1], rows[:, 0], rows[:, 2]))]


def times_after(ids: np.ndarray) -> np.ndarray:
    """The time (grid units) after each token."""
    is_shift = (ids >= SHIFT) & (ids < END)
    return token_times(np.where(is_shift, ids + TO_GROOVE_SHIFT, NOTE))


# ---- the grammar -----------------------------------------------------------------------------------

# What the previous token was, as far as the grammar cares.
AFTER_START, AFTER_EVENT, AFTER_NOTE, AFTER_WIDE, AFTER_FINAL = range(5)
WIDE = END - 1  # TimeShift_2_0, the shift that may repeat


@dataclass(frozen=True)
class DurState:
    """Where a sequence stands. `slot`: the last note's slot at the current time (-1: none yet);
    `busy`: slot -> the time its note ends, for the notes still sounding."""

    phase: int = 0  # 0 before Start, 1 in the piece, 2 after End
    time: int = 0
    last: int = AFTER_START
    slot: int = -1
    busy: dict = field(default_factory=dict)
    begun: bool = False  # a note is complete


class GrooveDurGrammar(FramedGrammar):
    """The order `serialize` writes, so every accepted sequence is the encoding of its notes.

    - Start first; End right after a complete note (a drum's Note, or a Duration).
    - A bass or other Note is followed by its Duration, and by nothing else.
    - Shifts: `(2, 0)` repeats; after it, Start or a complete note, one `(0, t)` (t after the
      current tick) or `(1, t)` may end the chain, and then a note must follow.
    - At one time, note ids rise; a slot whose note still sounds takes no new note.
    """

    vocab_size = PAD + 1
    start_id, end_id = START, END

    def start(self) -> DurState:
        return DurState()

    def allowed_inside(self, state: DurState, mask: np.ndarray) -> None:
        if state.last == AFTER_NOTE:
            mask[DURATION:SHIFT] = True
            return
        if state.last != AFTER_FINAL:  # forward: from the next tick of this beat to (2, 0)
            mask[SHIFT + state.time % 12 : END] = True
        mask[NOTE + state.slot + 1 : DURATION] = True
        mask[[slot for slot, end in state.busy.items() if end > state.time]] = False
        mask[END] = state.last == AFTER_EVENT and state.begun

    def step_inside(self, state: DurState, token: int) -> DurState:
        if token >= SHIFT:
            time = shift_target(state.time, token + TO_GROOVE_SHIFT)
            busy = {slot: end for slot, end in state.busy.items() if end > time}
            return replace(state, time=time, last=AFTER_WIDE if token == WIDE else AFTER_FINAL, slot=-1, busy=busy)
        if token >= DURATION:
            busy = {**state.busy, state.slot: state.time + int(DURATIONS[token - DURATION])}
            return replace(state, last=AFTER_EVENT, busy=busy, begun=True)
        pitched = token // N_PITCH + 1 != DRUMS
        return replace(state, last=AFTER_NOTE if pitched else AFTER_EVENT, slot=token, begun=state.begun or not pitched)

    def can_close(self, state: DurState) -> bool:
        """Right after a complete note: End may come."""
        return state.phase == 1 and state.last == AFTER_EVENT and state.begun

    def close(self, state: DurState) -> list[int]:
        if not self.can_close(state):
            raise TokenError("the piece cannot be closed here (not started, inside a note, or after a shift)")
        return [END]


# ---- the tokenizer ---------------------------------------------------------------------------------


class GrooveDurTokenizer(Tokenizer):
    """Bass / drums / other trio tokens with durations; settings as GrooveTokenizer's."""

    kind = "groove-dur"
    settings_schema = GrooveTokenizer.settings_schema
    version = 2  # its first: v1 is what tokenizer files from before versions count as
    augmentation = GrooveTokenizer.augmentation
    default_crop = GrooveTokenizer.default_crop
    roles = GrooveTokenizer.roles
    # The paper's groove temperature; a suffix cache weight tuned for a model is in its checkpoint
    # (checkpoints/groove-dur: meta.sampling.cache, chosen on the validation styles).
    sampling_defaults = GrooveTokenizer.sampling_defaults
    token_types = {"note": "Note_", "duration": "Duration_", "time shift": "TimeShift_", "Start": "Start", "End": "End"}
    position_type = "time shift"

    def __init__(self, programs: dict[str, int] | None = None, other_seed: int | None = None):
        self.reader = GrooveTokenizer(programs, other_seed)  # reads MIDI and writes it back
        self.vocab = (
            [f"Note_{t}_{p}" for t in TRACKS for p in range(N_PITCH)]
            + [f"Duration_{d}" for d in DURATIONS]
            + self.reader.vocab[TIME_SHIFT : TIME_SHIFT + N_SHIFTS]
            + ["End", "Start", "PAD"]
        )
        assert len(self.vocab) == PAD + 1

    @property
    def pad_id(self) -> int:
        return PAD

    def settings(self) -> dict[str, Any]:
        return self.reader.settings()

    def grammar(self) -> GrooveDurGrammar:
        return GrooveDurGrammar()

    def encode(self, source: str | os.PathLike | bytes) -> Encoding:
        notes, _, report = self.reader.trio(source)
        ids, counts = serialize(notes)
        return Encoding(ids=ids, report={**report, **counts})

    def notes(self, ids) -> np.ndarray:
        """The notes as rows (track, pitch, onset, offset) in grid units (see `decode_notes`)."""
        return decode_notes(self.check_ids(ids))

    def decode(self, ids, meta: dict[str, Any] | None = None) -> NoteTable:
        """The 3-track piece groove's `decode` returns (Bass, Drums on channel 10, Other), with
        programs and tempo changes from `meta`."""
        notes = self.notes(ids)
        return self.reader.trio_piece(notes, np.full(len(notes), DEFAULT_VELOCITY), meta)

    def bar_starts(self, ids) -> list[int]:
        """For each bar the piece reaches, the index of its first token (a shift landing on or
        past its line); bar 0 starts after Start."""
        ids = self.check_ids(ids)
        return bar_starts_at(times_after(ids), content_end(ids, END), bool(len(ids) and ids[0] == START))

    def onsets(self, ids) -> np.ndarray:
        """Each token's time in beats as decoding reads it: a shift's is where it moves to, a
        Note's and its Duration's is the note's start, Start's is 0."""
        return times_after(self.check_ids(ids)) / UNITS_PER_BEAT

    def onset_clock(self) -> ShiftClock:
        return ShiftClock(SHIFT)

    @functools.cached_property
    def track_marks(self) -> TrackMarks:
        return role_marks(self.vocab_size)

    def to_bar_line(self, state: DurState, bar: int) -> list[int]:
        """The shifts that move a piece cut where bar `bar` starts to that bar line. Its notes
        keep their durations: one held across the line goes on sounding into the bar."""
        if state.phase != 1 or state.last in (AFTER_NOTE, AFTER_FINAL):
            return []
        return shifts(state.time, bar * BAR_UNITS)

    def transpose(self, ids, shift: int) -> np.ndarray | None:
        """Bass and other moved by `shift` semitones, drums untouched; None if a pitch leaves
        0..127. Notes keep their order (ids rise by track, then pitch), so any window works."""
        ids = self.check_ids(ids)
        moving = (ids < DURATION) & is_pitched(ids // N_PITCH + 1)
        pitch = ids % N_PITCH + shift
        if np.any(moving & ((pitch < 0) | (pitch >= N_PITCH))):
            return None
        return np.where(moving, ids + shift, ids)

    def skip_bars(self, ids, n: int) -> np.ndarray | None:
        """The piece without its first `n` bars; notes sounding across the cut start again at the
        new beginning. None when the piece has no more than `n` bars."""
        notes = self.notes(ids)
        cut = n * BAR_UNITS
        if n < 0 or not len(notes) or notes[:, 3].max() <= cut:
            return None
        kept = notes[(notes[:, 2] >= cut) | (notes[:, 3] > cut)]
        kept[:, 2:] = np.maximum(kept[:, 2:] - cut, 0)
        return serialize(kept)[0]

    def map_drums(self, ids, kit: np.ndarray) -> np.ndarray:
        """The piece with its drum pitches p moved to kit[p] (a permutation: no two hits merge),
        rewritten in the representation's order, where a moved hit may change place at its onset."""
        notes = self.notes(ids)
        drums = notes[:, 0] == DRUMS
        notes[drums, 1] = np.asarray(kit)[notes[drums, 1]]
        return serialize(notes)[0]

    def double_bass(self, ids, interval: int) -> np.ndarray:
        """The piece with a second bass note `interval` semitones above each bass note (where that
        stays within MIDI's pitches), struck and held with it, as the bass of some grooves plays
        in octaves or sixths; a doubled note on a bass note of its slot merges with it."""
        notes = self.notes(ids)
        bass = notes[(notes[:, 0] == BASS) & (notes[:, 1] + interval < N_PITCH)]
        return serialize(np.concatenate([notes, bass + [0, interval, 0, 0]]))[0]

    def drop_tracks(self, ids, tracks) -> np.ndarray:
        """The piece without the notes of `tracks` (1 bass, 2 drums, 3 other)."""
        notes = self.notes(ids)
        return serialize(notes[~np.isin(notes[:, 0], list(tracks))])[0]
