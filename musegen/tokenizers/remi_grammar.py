"""The order of REMI tokens: the layout `decode` needs, and the grammar of what `encode` writes.

The grammar is also the sampler's mask (`allowed` runs once per sampled token), so it is a
precomputed table lookup plus a few numpy assignments.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import TokenError
from ..music.constants import MAX_BARS
from .base import Grammar
from .remi_vocab import RemiVocab

# Layout state classes. A layout state is one int: class * (positions_per_bar + 1) + (beat + 1).
START, BAR, BEAT, CHORD, TEMPO, PITCH, VELOCITY, NOTE, END = range(9)
_CLASS_NAMES = ("start", "Bar", "Beat", "Chord", "Tempo", "Note_Pitch", "Note_Velocity", "Note_Duration", "EOS")


class RemiLayout:
    """The order of REMI token families, which `decode` needs: Bar first, then Beats that only move
    forward within the bar; after a Beat an optional Chord, an optional Tempo, then complete
    (Pitch, Velocity, Duration) notes; EOS only after a Bar. Every (state, token) -> next state is
    one precomputed table, so `step` is an array lookup."""

    def __init__(self, tok: RemiVocab):
        self._tok = tok
        self.width = width = tok.positions_per_bar + 1
        kind = np.full(len(tok.vocab), -1)  # token -> the class of state it leads to
        kind[tok.bar_id], kind[tok.eos_id] = BAR, END
        kind[tok.beat_of >= 0] = BEAT
        kind[tok.is_chord] = CHORD
        kind[tok.tempo_of >= 0] = TEMPO
        kind[tok.pitch_of >= 0] = PITCH
        kind[tok.velocity_of >= 0] = VELOCITY
        kind[tok.duration_of >= 0] = NOTE
        follows = {  # state class -> token classes allowed next (Beat handled with its position)
            START: {BAR},
            BAR: {BAR, BEAT, END},
            BEAT: {CHORD, TEMPO, PITCH},
            CHORD: {TEMPO, PITCH, BEAT, BAR},
            TEMPO: {PITCH, BEAT, BAR},
            PITCH: {VELOCITY},
            VELOCITY: {NOTE},
            NOTE: {PITCH, BEAT, BAR},
            END: set(),
        }
        table = np.full((9 * width, len(tok.vocab)), -1, dtype=np.int32)
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
    """Where a piece stands, for the grammar. Never mutated (samples share states)."""

    layout: int  # RemiLayout state
    opening: int  # how many tokens of the opening (Bar, Beat_0, Chord, Tempo) have come
    bar: int  # index of the current bar, -1 before the first Bar
    bar_notes: bool  # the current bar holds a note
    closed_notes: bool  # the bar the last Bar token closed held a note: EOS may come
    cell_pitch: int  # pitch of the last note in the current cell, -1 when none
    rises: int  # notes of the current cell not lower than the note before them


class RemiGrammar(Grammar):
    """Exactly the sequences `encode` can write, so that encode(decode(ids)) == ids for each.

    On top of the layout (`RemiLayout`):
    - a piece opens with Bar, Beat_0, Chord (when the tokenizer writes chords), Tempo;
    - Chords sit on beats; Chords and Tempos may repeat the one in effect;
    - notes in a cell come in any pitch order, notes of one pitch may overlap; but a cell holds
      at most `max_note_offset` notes that are not lower than the note before them (decoding
      starts each of those a tick later to keep the order, within the cell's rounding);
    - the first bar and the last bar hold a note: EOS only follows a Bar that closes a bar with
      a note, and the piece has at most MAX_BARS bars.
    """

    def __init__(self, tok: RemiVocab):
        self.vocab_size = len(tok.vocab)
        self._tok = tok
        self.layout = RemiLayout(tok)
        opening = [[tok.bar_id], [tok.beat_ids[0]]] + ([np.flatnonzero(tok.is_chord)] if tok.chords else [])
        opening.append(tok.tempo_ids)
        self._opening = []
        for tokens in opening:
            mask = np.zeros(len(tok.vocab), dtype=bool)
            mask[tokens] = True
            mask.setflags(write=False)
            self._opening.append(mask)
        self._only_eos = self._opening[0].copy()
        self._only_eos[:] = False
        self._only_eos[tok.eos_id] = True

    def start(self) -> RemiState:
        return RemiState(self.layout.start(), 0, -1, False, False, -1, 0)

    def allowed(self, state: RemiState) -> np.ndarray:
        tok = self._tok
        if state.opening < len(self._opening):
            return self._opening[state.opening].copy()
        if state.bar >= MAX_BARS:  # EOS, where the layout allows it: nothing once it has come
            return self._only_eos & self.layout.masks[state.layout]
        mask = self.layout.masks[state.layout].copy()
        cls = state.layout // self.layout.width
        if cls == BEAT and not self._chord_fits(state):
            mask &= ~tok.is_chord
        elif cls == NOTE and state.rises >= tok.max_note_offset:
            mask[tok.pitch_ids[state.cell_pitch - tok.pitch_range[0] :]] = False
        if not state.bar_notes and (state.bar == 0 or state.bar + 1 >= MAX_BARS):
            mask[tok.bar_id] = False
        mask[tok.eos_id] &= state.closed_notes
        return mask

    def _chord_fits(self, state: RemiState) -> bool:
        """A Chord may follow the Beat of `state`: chords are on, and the Beat is on a beat."""
        beat = state.layout % self.layout.width - 1
        return self._tok.chords and beat % self._tok.beat_resolution == 0

    def step(self, state: RemiState, token: int, where: int | None = None) -> RemiState:
        tok = self._tok
        layout = self.layout.step(state.layout, token, where)
        broken = self._broken_rule(state, token)
        if broken:
            raise TokenError(f"{_at(where)}{tok.name(token)} {broken}")
        opening = min(state.opening + 1, len(self._opening))
        bar, bar_notes, closed_notes, cell_pitch, rises = state[2:]
        cls = layout // self.layout.width
        if cls == BAR:
            bar, bar_notes, closed_notes = bar + 1, False, bar_notes
        if cls in (BAR, BEAT):
            cell_pitch, rises = -1, 0
        elif cls == PITCH:
            pitch = int(tok.pitch_of[token])
            rises += cell_pitch >= 0 and pitch >= cell_pitch
            cell_pitch = pitch
        elif cls == NOTE:
            bar_notes = True
        return RemiState(layout, opening, bar, bar_notes, closed_notes, cell_pitch, rises)

    def _broken_rule(self, state: RemiState, token: int) -> str | None:
        """The rule a token the layout allows would break, or None: `allowed` one token at a time,
        with the reason for the error message."""
        tok = self._tok
        if state.opening < len(self._opening):
            if self._opening[state.opening][token]:
                return None
            return "breaks the opening: a piece starts Bar, Beat_0, " + ("Chord, " if tok.chords else "") + "Tempo"
        if token == tok.eos_id:
            return (
                None
                if state.closed_notes
                else "may only follow a Bar that closes a bar with a note (the last bar holds the last note)"
            )
        if state.bar >= MAX_BARS:
            return f"would go past bar {MAX_BARS}: only EOS may follow"
        if token == tok.bar_id and not state.bar_notes:
            if state.bar == 0:
                return "closes the first bar without a note (the first bar holds the first note)"
            if state.bar + 1 >= MAX_BARS:
                return f"would open bar {MAX_BARS + 1}: only a Bar closing a bar with a note may come"
        cls = state.layout // self.layout.width
        if tok.is_chord[token] and cls == BEAT and not self._chord_fits(state):
            return (
                "is a Chord, and this tokenizer writes none"
                if not tok.chords
                else "is off the beat (Chords sit on beats)"
            )
        if (
            tok.pitch_of[token] >= 0
            and cls == NOTE
            and state.rises >= tok.max_note_offset
            and tok.pitch_of[token] >= state.cell_pitch
        ):
            return (
                f"would be note {tok.max_note_offset + 1} of this cell not lower than the one before it; "
                f"decoding keeps the order of at most {tok.max_note_offset}"
            )
        return None

    def can_close(self, state: RemiState) -> bool:
        cls = state.layout // self.layout.width
        return cls == END or (cls == BAR and state.closed_notes) or (cls in (CHORD, TEMPO, NOTE) and state.bar_notes)

    def close(self, state: RemiState) -> list[int]:
        cls = state.layout // self.layout.width
        if not self.can_close(state):
            raise TokenError(
                f"cannot end the piece after {_CLASS_NAMES[cls]}"
                + (" without a note since the last Bar" if cls in (BAR, CHORD, TEMPO) else "")
            )
        if cls == END:
            return []
        return [self._tok.eos_id] if cls == BAR else [self._tok.bar_id, self._tok.eos_id]


def _at(where: int | None) -> str:
    return f"token {where} " if where is not None else ""
