"""The groove grammar: which token may come next in the order the reference encoder writes
(groove_events.py), with the masks and prefixes a sampler uses on top of it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import TokenError
from ..music.roles import TRACKS
from .base import FramedGrammar
from .groove_events import (
    END,
    N_NOTES,
    N_PITCH,
    NOTE_OFF,
    NOTE_ON,
    PAD,
    PITCHED,
    START,
    TIME_SHIFT,
    UNITS_PER_BEAT,
    WIDE_SHIFT,
    shift_id,
    shift_target,
    shifts_between,
)

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


class GrooveGrammar(FramedGrammar):
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
    start_id, end_id = START, END

    def start(self) -> GrooveState:
        return GrooveState()

    def allowed_inside(self, state: GrooveState, mask: np.ndarray) -> None:
        if state.last != AFTER_FINAL:  # shifts forward: (0, t >= tick) .. (2, 0)
            mask[shift_id(0, max(1, state.time % UNITS_PER_BEAT)) : END] = True
        if state.last != AFTER_EVENT or state.time % UNITS_PER_BEAT == 0:
            self._allow_events(state, mask)
        mask[END] = state.last == AFTER_EVENT and state.begun and not state.sounding

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
        if state.mode == ONS and state.zero_slot >= 0 and PITCHED[state.zero_slot]:
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

    def step_inside(self, state: GrooveState, token: int) -> GrooveState:
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
