"""The order of song tokens, as `SongTokenizer.encode` writes them, and what a sampler may write.

    Start
    Bar TimeSig Position_0 Tempo ...          the first bar opens with the piece's tempo
    Bar TimeSig [Position [Tempo] (Program (Pitch|Drum Velocity Duration)+)+ ]*
    ...
    End                                       right after the last note

Positions rise inside a bar and stay inside its meter, so no note starts past a bar line the
meter does not have. In a cell the Program tokens rise and, after each, the pitches rise; a
Tempo is written only where it changes, and a track's note of a pitch ends by the next one
(a MIDI file cannot nest them). The first bar holds a note, and so does the last (End
follows a note). A sampler (`sampling_mask`) also keeps the meter (`held_meter`: that of the
last two bars in a row that shared one, so that a lone bar of 2 beats closing a phrase of 4/4
does not set the meter of all that follows; the bar before's, until two have) and, after the
first bar, plays only the tracks already heard: a continuation goes on with the prompt's band,
in its meter. It writes no empty bar and no Tempo without a note after it, so each bar it
writes ends on a note, where the piece may end.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import TokenError
from ..music.constants import MAX_BARS
from .base import FramedGrammar
from .song_vocab import DRUM_PROGRAM, DRUMS, DURATIONS, PITCHES, SongVocab

OPEN, BAR, METER, POSITION, TEMPO, PROGRAM, PITCH, VELOCITY, DURATION = range(9)


@dataclass(frozen=True, slots=True)
class SongState:
    phase: int = 0  # 0 before Start, 1 in the piece, 2 after End
    after: int = OPEN  # the kind of the last token
    bar: int = -1  # index of the current bar
    meter: int = -1  # index in METERS of the current bar's meter (the last bar's, after a Bar)
    run_meter: int = -1  # the meter of the last two bars in a row that had the same one; -1 before
    position: int = -1  # the current cell's onset in units
    tempo: int = -1  # the tempo in effect (index in TEMPOS); -1 until the opening's Tempo
    program: int = -1  # the current track (index in SongVocab.programs)
    pitch: int = -1  # the last pitch written in this track and cell
    bar_notes: bool = False  # the current bar holds a note
    heard: frozenset = frozenset()  # the tracks (indices in SongVocab.programs) that have played
    bar_start: int = 0  # the current bar's line, in units from the first
    sounding: dict = field(default_factory=dict)  # (track, pitch) -> the unit its note ends at


def held_meter(state: SongState) -> int:
    """The meter a continuation from `state` keeps (index in METERS; -1 before any bar): that of
    the last two bars in a row that shared one, else the last bar's."""
    return state.run_meter if state.run_meter >= 0 else state.meter


class SongGrammar(FramedGrammar):
    def __init__(self, vocab: SongVocab):
        self.v = vocab
        self.vocab_size = len(vocab.vocab)
        self.start_id, self.end_id = vocab.start_id, vocab.end_id
        self._drum = np.array([p == DRUM_PROGRAM for p, _ in vocab.programs])
        # a program's next slot (-1: none), which may play once the slot before it has
        index = {track: k for k, track in enumerate(vocab.programs)}
        self._next_slot = np.array([index.get((p, s + 1), -1) for p, s in vocab.programs])
        self._first_slots = np.array([s == 0 for _, s in vocab.programs])

    def start(self) -> SongState:
        return SongState()

    def _positions_after(self, state: SongState, mask: np.ndarray) -> None:
        mask[self.v.position_ids[state.position + 1 : self.v.bar_units_table[state.meter]]] = True

    def _programs(self, state: SongState, mask: np.ndarray, after: int = -1) -> None:
        """The tracks that may start after track index `after` in this cell: the first slot of a
        program, or a later one once the slot before it has played (slots in order of entry)."""
        ok = self._first_slots.copy()
        later = self._next_slot[sorted(state.heard)] if state.heard else self._next_slot[:0]
        ok[later[later >= 0]] = True
        ok[: after + 1] = False
        mask[self.v.program_ids[ok]] = True

    def _pitches(self, state: SongState, mask: np.ndarray, above: int) -> None:
        """The current track's pitches (Drum for drums) above `above` whose last note has ended."""
        ids, lowest = (self.v.drum_ids, DRUMS[0]) if self._drum[state.program] else (self.v.pitch_ids, PITCHES[0])
        mask[ids[max(above - lowest + 1, 0) :]] = True
        time = state.bar_start + state.position
        busy = [p - lowest for (track, p), end in state.sounding.items() if track == state.program and end > time]
        mask[ids[busy]] = False

    def _may_close_bar(self, state: SongState) -> bool:
        return (state.bar > 0 or state.bar_notes) and state.bar + 1 < MAX_BARS

    def allowed_inside(self, state: SongState, mask: np.ndarray) -> None:
        v, after = self.v, state.after
        if after == OPEN:
            mask[v.bar_id] = True
        elif after == BAR:
            mask[v.meter_ids] = True
        elif after == METER:
            if state.tempo < 0:
                mask[v.position_ids[0]] = True
            else:
                self._positions_after(state, mask)
                mask[v.bar_id] = self._may_close_bar(state)
        elif after == POSITION:
            mask[v.tempo_ids] = True
            if state.tempo >= 0:
                mask[v.tempo_ids[state.tempo]] = False
                self._programs(state, mask)
        elif after == TEMPO:
            self._programs(state, mask)
            self._positions_after(state, mask)
            mask[v.bar_id] = self._may_close_bar(state)
        elif after == PROGRAM:
            self._pitches(state, mask, -1)
        elif after == PITCH:
            mask[v.velocity_ids] = True
        elif after == VELOCITY:
            mask[v.duration_ids] = True
        else:  # DURATION: a higher pitch in the track, a later track, a later cell, a bar, the end
            self._pitches(state, mask, state.pitch)
            self._programs(state, mask, state.program)
            self._positions_after(state, mask)
            mask[v.bar_id] = self._may_close_bar(state)
            mask[v.end_id] = True

    def step_inside(self, state: SongState, token: int) -> SongState:
        v = self.v
        if token == v.bar_id:
            start = state.bar_start + (int(v.bar_units_table[state.meter]) if state.bar >= 0 else 0)
            return replace(state, after=BAR, bar=state.bar + 1, position=-1, bar_notes=False, bar_start=start)
        if v.meter_of[token] >= 0:
            meter = int(v.meter_of[token])
            run_meter = meter if meter == state.meter else state.run_meter  # state.meter: the bar before's
            return replace(state, after=METER, meter=meter, run_meter=run_meter)
        if v.position_of[token] >= 0:
            position = int(v.position_of[token])
            time = state.bar_start + position
            sounding = {key: end for key, end in state.sounding.items() if end > time}
            return replace(state, after=POSITION, position=position, program=-1, sounding=sounding)
        if v.tempo_of[token] >= 0:
            return replace(state, after=TEMPO, tempo=int(v.tempo_of[token]))
        if v.program_of[token] >= 0:
            program = int(v.program_of[token])
            return replace(state, after=PROGRAM, program=program, pitch=-1, heard=state.heard | {program})
        if v.pitch_of[token] >= 0 or v.drum_of[token] >= 0:
            return replace(state, after=PITCH, pitch=int(max(v.pitch_of[token], v.drum_of[token])))
        if v.velocity_of[token] >= 0:
            return replace(state, after=VELOCITY)
        end = state.bar_start + state.position + int(DURATIONS[v.duration_of[token]])
        sounding = {**state.sounding, (state.program, state.pitch): end}
        return replace(state, after=DURATION, bar_notes=True, sounding=sounding)

    def sampling_mask(self, state: SongState) -> np.ndarray:
        mask = self.allowed(state)
        if state.phase != 1:
            return mask
        if state.after == BAR and state.meter >= 0:  # the meter goes on
            mask[self.v.meter_ids] = False
            mask[self.v.meter_ids[held_meter(state)]] = True
        if state.after in (METER, TEMPO):  # no empty bar, no Tempo without a note: every bar can end the piece
            mask[self.v.bar_id] = False
            mask[self.v.position_ids] &= state.after == METER
        if state.bar > 0 and state.after in (POSITION, TEMPO, DURATION):  # the band goes on
            heard = self.v.program_ids[sorted(state.heard)]
            kept = mask[heard]
            mask[self.v.program_ids] = False
            mask[heard] = kept
        return mask

    def past_the_bar(self, state: SongState) -> np.ndarray | None:
        if state.meter < 0 or state.after in (BAR, METER):
            return None
        return self.v.position_ids[self.v.bar_units_table[state.meter] :]

    def can_close(self, state: SongState) -> bool:
        return state.phase == 2 or (state.phase == 1 and state.after == DURATION)

    def close(self, state: SongState) -> list[int]:
        if not self.can_close(state):
            raise TokenError("the piece cannot end here: End comes right after a note")
        return [] if state.phase == 2 else [self.v.end_id]
