"""Live play: a player's bars fed to a model as they are played, and the model's answers drawn
from the same streaming state, so an answer costs only the tokens it plays.

`Live` keeps one piece in the model's view, at a fixed tempo and meter: the player's notes, each
onset put on the tokenizer's grid (`Tokenizer.onset_grid`; the played timing stays with whoever
hears and saves it), and the model's own notes. When a bar is over (`close_bar`), the piece up to
that bar line is what `musegen sample` would read as a prompt (`prompt_from_ids`); the tokens it
has beyond what the session consumed are fed in one parallel chunk. An answer (`answer`) samples
bars from there with the settings' whole chain; `accompany` samples the next bar without the
player's instrument, for its notes to sound under the player's while the bar is played.

Each fed bar leaves a snapshot of the session; where the prompt's tokens change behind the last
one (a chord read again with the next bar's notes, an answer cut back by the sampler) the session
goes back to the latest snapshot before the change and feeds the rest again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch

from ..errors import ConfigError, MusegenError, TokenError
from ..model.torch_step import PreparedWeights
from ..music.notes import NoteTable, Track
from ..tokenizers.base import Tokenizer
from .constraints import Forbid
from .loop import Resumed, generate
from .precision import step_choice
from .prompt import Prompt, prompt_from_ids, with_ending
from .settings import SampleSettings

TPQ = 480  # ticks per quarter note of the live piece and of the notes given and returned
SNAPSHOTS = 8  # bars the session can go back
CONTEXT_BARS = 32  # a piece longer than this is read from its last CONTEXT_BARS // 2 bars again
SENTINEL_PITCH = 60  # a note that makes the encoder write the bars up to the one being continued
PROBE_BPM = 100.0  # the tempo of the pieces that try a meter: where the bars fall does not depend on it


@dataclass
class LiveNote:
    """A note of the live piece: ticks from its first bar line (TPQ to the quarter note)."""

    start: int
    end: int
    pitch: int
    velocity: int
    program: int = 0
    drum: bool = False

    def row(self) -> list[int]:
        return [self.start, self.end, self.pitch, self.velocity, self.program, int(self.drum)]


def live_notes(table: NoteTable) -> list[LiveNote]:
    """Every note of `table` in the live piece's ticks, with its track's instrument."""
    scale = lambda ticks: int(ticks) * TPQ // table.tpq  # noqa: E731
    tracks = table.tracks
    return [
        LiveNote(scale(s), scale(e), int(p), int(v), tracks[k].program, tracks[k].is_drum)
        for s, e, p, v, k in zip(table.start, table.end, table.pitch, table.velocity, table.track)
    ]


def recording(parts: dict[str, list[LiveNote]], meter: tuple[int, int], bpm: float) -> NoteTable:
    """A live piece as it sounded: a track for each part (who played it: the player, the model, a
    backing) and instrument, every note at its time; a note of the count-in (before 0) is left out."""
    tracks: dict[tuple[str, int, bool], list[tuple[int, int, int, int]]] = {}
    for who, notes in parts.items():
        for n in notes:
            if n.start >= 0:
                rows = tracks.setdefault((who, n.program, n.drum), [])
                rows.append((n.start, max(n.end, n.start + 1), n.pitch, n.velocity))
    named = [(Track(who, program, drum), sorted(rows)) for (who, program, drum), rows in tracks.items()]
    return NoteTable.of_tracks(TPQ, named, [(0, float(bpm))], [(0, *meter)])


def live_refusal(tokenizer: Tokenizer, meter: tuple[int, int]) -> str | None:
    """Why `tokenizer` cannot play live in `meter` (numerator, denominator), in one line; None where
    it can: its tokens put each onset on a grid within bars, and write each bar of the meter as a
    bar of their own (REMI writes 4/4 only: it refuses 3/4 and joins two 2/4 bars into one)."""
    if tokenizer.onset_grid is None:
        return (
            f"live play needs a model whose tokens put notes on a grid within bars (pop or song); "
            f"the {tokenizer.kind} tokenizer's do not"
        )
    bar_ticks, cell = TPQ * 4 * meter[0] // meter[1], TPQ // tokenizer.onset_grid

    def bars_written(bars: int) -> int:
        notes = [LiveNote(k * bar_ticks, k * bar_ticks + cell, SENTINEL_PITCH, 64) for k in range(bars)]
        return len(tokenizer.bar_starts(tokenizer.encode(_piece(notes, meter, PROBE_BPM).midi_bytes()).ids))

    try:
        if bars_written(4) - bars_written(2) == 2:
            return None
        why = "they join its bars into others"
    except MusegenError as exc:
        why = str(exc).splitlines()[0].removeprefix("<bytes>: ")
    return f"the {tokenizer.kind} tokens cannot play in {meter[0]}/{meter[1]} ({why})"


def _piece(notes: list[LiveNote], meter: tuple[int, int], bpm: float) -> NoteTable:
    """`notes` as a piece to encode: a track for each instrument, at one tempo and meter."""
    by_track: dict[tuple[int, bool], list[tuple[int, int, int, int]]] = {}
    for n in sorted(notes, key=lambda n: (n.start, n.pitch)):
        by_track.setdefault((n.program, n.drum), []).append((n.start, n.end, n.pitch, n.velocity))
    tracks = [(Track(None, program, drum), rows) for (program, drum), rows in by_track.items()]
    return NoteTable.of_tracks(TPQ, tracks, [(0, float(bpm))], [(0, *meter)])


@dataclass
class _Snapshot:
    fed: int  # tokens the session had consumed
    state: Any
    logits: torch.Tensor


class Live:
    """One player's piece and the model's streaming state over it (module docstring).

    `meter` (numerator, denominator) and `bpm` hold for the whole piece; `program` is the GM
    instrument the player's notes are given; `backing`: notes already in the piece before the
    player starts (a song whose other tracks an accompaniment goes on with), bars from 0."""

    def __init__(
        self,
        model,
        tokenizer: Tokenizer,
        settings: SampleSettings,
        meter: tuple[int, int] = (4, 4),
        bpm: float = 100.0,
        program: int = 0,
        weights: PreparedWeights | None = None,
        backing: list[LiveNote] = (),
        backing_bars: int = 0,
    ):
        refusal = live_refusal(tokenizer, meter)
        if refusal is not None:
            raise ConfigError(refusal)
        self.model, self.tokenizer, self.meter, self.bpm, self.program = model, tokenizer, meter, bpm, program
        one = replace(settings, bars=1, length=None, num_samples=1, prompt_bars=None, prompt_from=1)
        self.settings = one.resolved(tokenizer)
        self.weights = weights if weights is not None else PreparedWeights(model)
        # the step's path is chosen (timed, under "auto") once, here, not while a player waits
        self.path = step_choice(self.settings.precision, model, 1, quiet=True).path
        self.cell = TPQ // tokenizer.onset_grid  # ticks between two onsets the tokens can hold
        self.bar_ticks = TPQ * 4 * meter[0] // meter[1]
        self.notes: list[LiveNote] = list(backing)
        self.bars = backing_bars  # bars over, whose notes the session has consumed
        self.first_bar: int | None = 0 if self.notes else None  # where the piece begins (its first note's bar)
        self.waiting: list[LiveNote] = []  # played notes whose onset falls in a bar not over yet
        self.answers = 0
        self._restart()
        if self.notes:
            self._sync()

    # --- the player's side ----------------------------------------------------------------------
    def close_bar(self, played: list[LiveNote] = ()) -> None:
        """Bar `self.bars` is over: the notes played (those whose onset falls in a later bar wait
        for it; one in a bar already over is heard but not fed) join the piece, which is fed."""
        start, end = self.bars * self.bar_ticks, (self.bars + 1) * self.bar_ticks
        later = []
        for note in [*self.waiting, *played]:
            onset = int(round(note.start / self.cell)) * self.cell
            note = replace(note, start=onset, end=max(int(note.end), onset + self.cell), program=self.program)
            if onset >= end:
                later.append(note)
            elif onset >= start:
                self.notes.append(note)
                self.first_bar = self.bars if self.first_bar is None else self.first_bar
        self.waiting = later
        self.bars += 1
        if self.first_bar is not None:
            self._sync()

    def take_back(self, bar: int) -> None:
        """Forget the bars from `bar` on (an answer drawn ahead that the player cut short: its
        notes there never sounded); the session goes back to that bar line."""
        if self.first_bar is None or not self.first_bar < bar <= self.bars:
            raise ConfigError(
                f"bars {bar}.. cannot be taken back: the piece has bars {self.first_bar}..{self.bars - 1}"
            )
        self.notes = [n for n in self.notes if n.start < bar * self.bar_ticks]
        self.bars = bar
        self._sync()

    # --- the model's side -----------------------------------------------------------------------
    def answer(self, bars: int, on_notes: Callable[[list[LiveNote]], None] | None = None) -> list[LiveNote]:
        """Continue the piece for `bars` bars from the bar line after the last bar over; the
        answer's notes join the piece (and the bars are over). `on_notes` gets each note once, as soon
        as its last token is drawn (in the order drawn); the notes returned are in order of onset."""
        notes = self._sample(bars, on_notes, forbid_player=False)
        self.bars += bars
        self._sync()
        return notes

    def accompany(self, on_notes: Callable[[list[LiveNote]], None] | None = None) -> list[LiveNote]:
        """The next bar (`self.bars`) of every instrument but the player's, from the piece up to
        its bar line: it sounds while the player plays that bar, and both are fed when it is over."""
        return self._sample(1, on_notes, forbid_player=True)

    def check_accompany(self) -> None:
        """A one-line ConfigError where `accompany` cannot play: the tokens have no instruments of
        their own, or the piece has none but the player's."""
        self.tokenizer.program_token_ids(self.program)
        if not any(n.program != self.program or n.drum for n in self.notes):
            raise ConfigError("an accompaniment goes on with the piece's other instruments, and it has none yet")

    # --- inside -----------------------------------------------------------------------------------
    def _sample(self, bars: int, on_notes, forbid_player: bool) -> list[LiveNote]:
        if self.first_bar is None:
            raise ConfigError("nothing has been played yet: the model answers what it heard")
        forbid = ()
        if forbid_player:
            self.check_accompany()
            forbid = (Forbid(self.tokenizer.program_token_ids(self.program)),)
        settings = replace(
            self.settings,
            bars=bars,
            seed=self.settings.seed + self.answers,
            constraints=self.settings.constraints + forbid,
            # what the model gives the player's instrument is the player's part: folded, the band's
            # instrument of its family would double it
            fold_instruments=self.settings.fold_instruments and not forbid,
        )
        self.answers += 1
        snapshot = self.snapshots[-1]
        stream = _NoteStream(self, on_notes)
        with torch.inference_mode():
            samples, _ = generate(
                self.model,
                self.tokenizer,
                self.prompt,
                settings,
                progress=False,
                on_step=stream.step,
                weights=self.weights,
                resumed=Resumed(self.session, snapshot.logits),
            )
            self.session.set_state(snapshot.state)  # the answer is fed again as the prompt reads it
        notes = stream.finish(samples[0].ids)
        self.notes += notes
        return notes

    def _restart(self) -> None:
        with torch.inference_mode():
            self.session = self.model.session(1, self.path, seed=self.settings.seed, weights=self.weights)
        self.fed: list[int] = []
        self.snapshots: list[_Snapshot] = []
        self.prompt: Prompt | None = None

    def _sync(self) -> None:
        """Feed the session what the piece up to `self.bars` adds to the tokens it consumed."""
        if self.bars - self.first_bar > CONTEXT_BARS:  # read again from a later bar: time and memory stay bounded
            self.first_bar = self.bars - CONTEXT_BARS // 2
            self._restart()
        prompt = self._target()
        ids = [int(t) for t in prompt.ids]
        same = next((k for k, (a, b) in enumerate(zip(self.fed, ids)) if a != b), min(len(self.fed), len(ids)))
        while self.snapshots and self.snapshots[-1].fed > same:
            self.snapshots.pop()
        if not self.snapshots and self.fed:
            self._restart()
        with torch.inference_mode():
            if self.snapshots:
                last = self.snapshots[-1]
                self.session.set_state(last.state)
                logits, self.fed = last.logits, self.fed[: last.fed]
            if len(ids) > len(self.fed):
                chunk = torch.tensor([ids[len(self.fed) :]], dtype=torch.long)
                logits = self.session.step(chunk)[:, -1]
            snapshot = _Snapshot(len(ids), self.session.get_state(), logits)
            self.snapshots = self.snapshots[-(SNAPSHOTS - 1) :] + [snapshot]
        self.fed, self.prompt = ids, prompt

    def _target(self) -> Prompt:
        """The piece from its first bar up to the bar line `self.bars`, as the prompt that
        `musegen sample --prompt-bars` would read from it."""
        first = self.first_bar or 0
        # a note in the bar being continued makes the encoder write the silent bars before it
        sentinel = LiveNote(self.bars * self.bar_ticks, self.bars * self.bar_ticks + self.cell, SENTINEL_PITCH, 64)
        table = _piece([*self.notes, sentinel], self.meter, self.bpm).from_tick(first * self.bar_ticks)
        encoding = self.tokenizer.encode(table.midi_bytes())
        return prompt_from_ids(self.tokenizer, encoding.ids, self.bars - first, encoding.report, "the live piece")

    def piece(self) -> NoteTable:
        """The whole piece as the model heard and played it (the player's notes on the grid)."""
        return _piece(self.notes, self.meter, self.bpm)


class _NoteStream:
    """An answer's notes while its tokens are drawn: each is passed on as soon as it is whole,
    where the grammar says the piece could end (after a note's last token), the rest when the
    answer ends."""

    def __init__(self, live: Live, on_notes):
        self.live, self.on_notes = live, on_notes
        self.tokenizer, self.grammar = live.tokenizer, live.tokenizer.grammar()
        self.origin = live.bars * live.bar_ticks  # the answer's first bar line in the live piece
        self.base = self.seen = len(live.prompt.ids)
        self.state = live.prompt.state  # the grammar's, after the tokens seen; None once it rejects one
        self.sent: set[tuple[int, ...]] = set()
        self.first_bar_end = self.answer_start = None  # where the piece's second and the answer's first bar start

    def step(self, rows: list[list[int]]) -> None:
        ids = rows[0]
        if self.on_notes is None or self.state is None or len(ids) <= self.seen:
            return  # (a row cut back at its last bar line is done: the rest comes with `finish`)
        for token in ids[self.seen :]:
            if not self.grammar.accepts(self.state, int(token)):  # sampled without the grammar
                self.state = None
                return
            self.state = self.grammar.step(self.state, int(token))
        self.seen = len(ids)
        if self.grammar.can_close(self.state):  # every note drawn so far is whole
            self._pass_on(self._decoded(list(ids)))

    def finish(self, ids) -> list[LiveNote]:
        notes = self._decoded([int(t) for t in ids], whole=True)
        self._pass_on(notes)
        return notes

    def _pass_on(self, notes: list[LiveNote]) -> None:
        new = [n for n in notes if tuple(n.row()) not in self.sent]
        if self.on_notes is not None and new:
            self.sent.update(tuple(n.row()) for n in new)
            self.on_notes(new)

    def _decoded(self, ids: list[int], whole: bool = False) -> list[LiveNote]:
        """The answer's notes in `ids` (the prompt and what was drawn), in live ticks. Only the
        piece's first bar (which opens it as its grammar wants) and the answer's bars are decoded."""
        if self.answer_start is None:
            starts = self.tokenizer.bar_starts(ids) if len(ids) > self.base else []
            if len(starts) <= self.live.prompt.bars:
                return []
            self.first_bar_end, self.answer_start = starts[1], starts[self.live.prompt.bars]
        tail = ids[: self.first_bar_end] + ids[self.answer_start :]
        closed = tail if whole else with_ending(self.tokenizer.grammar(), tail)
        try:
            piece = self.tokenizer.decode(closed, self.live.prompt.meta)
        except TokenError:  # not whole yet (a bar line with nothing after it): at the next onset
            return []
        shift = self.origin * piece.tpq // TPQ - piece.tpq * 4 * self.live.meter[0] // self.live.meter[1]
        answer = np.flatnonzero(piece.start >= piece.tpq * 4 * self.live.meter[0] // self.live.meter[1])
        answer = answer[np.lexsort((piece.pitch[answer], piece.start[answer]))]
        tracks = piece.tracks
        return [
            LiveNote(
                (int(piece.start[k]) + shift) * TPQ // piece.tpq,
                (int(piece.end[k]) + shift) * TPQ // piece.tpq,
                int(piece.pitch[k]),
                int(piece.velocity[k]),
                tracks[piece.track[k]].program,
                tracks[piece.track[k]].is_drum,
            )
            for k in answer
        ]
