"""Jamming with a model through MIDI ports, on the live engine (`musegen.generation.live`).

`Jam` keeps time: the piece's bar lines fall at fixed times on a monotonic clock, from the
tempo and meter, after a count-in. It reads the player's notes from an input port as they come,
gives each bar to the engine when it is over, and sends the model's notes to an output port at
their times (a heap of timed events; a note that arrives after its onset still sounds if its end
is ahead). Two ways to play:

- answer: call and response. A bar without a new key pressed (and none held) after the player's
  phrase hands the turn to the model, which answers from the next bar line for as many bars as the
  phrase had (at most `MAX_ANSWER_BARS`), drawing each bar while the previous one sounds. A key
  pressed during an answer hands the turn back: what the answer has after the next bar line is
  dropped.
- accompany: each bar, the model's other instruments for the next bar are drawn as soon as the
  bar before it is over, and sound under the player.

The model works on a `worker` (a thread of its own, `ThreadWorker`; `InlineWorker` runs each job at
once), the clock, the sleep and the ports are passed in: a test drives the jam in virtual time with
ports of its own, and a clock that stands still while the model samples.
"""

from __future__ import annotations

import heapq
import itertools
import math
import queue
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from ..io import write_bytes
from ..music.notes import NoteTable
from .live import TPQ, Live, LiveNote, live_notes, recording

MODES = ("answer", "accompany")
MAX_ANSWER_BARS = 4  # an answer is as long as the phrase it answers, up to this
POLL_SECONDS = 0.001  # the longest the loop sleeps between two reads of the input port
DRUM_CHANNEL = 9  # General MIDI's percussion channel (channel 10 as synths count): the click and drums
ECHO_CHANNEL = 0  # where an echoed player sounds; the model's instruments take the other channels
CLICK_PITCHES = (76, 77)  # GM hi wood block on a bar's first beat, low wood block on the others
CLICK_SECONDS = 0.05
INSTALL_HINT = "pip install 'musegen[jam]' (python-rtmidi)"


# --- ports ----------------------------------------------------------------------------------------
def _backend():
    """mido's port backend, loaded (MIDO_BACKEND names another than python-rtmidi)."""
    import mido

    try:
        mido.backend.load()
    except ImportError as exc:
        raise ConfigError(
            f"MIDI ports need mido's {mido.backend.name} backend, which is missing ({exc}): {INSTALL_HINT}"
        ) from None
    return mido.backend


def port_names() -> tuple[list[str], list[str]]:
    """The names of the MIDI input and output ports there are."""
    backend = _backend()
    return backend.get_input_names(), backend.get_output_names()


def open_ports(input_name: str | None, output_name: str | None):
    """(input, output) ports by name; None: the first of each."""
    backend = _backend()
    inputs, outputs = backend.get_input_names(), backend.get_output_names()
    names = []
    for given, there, what in ((input_name, inputs, "input"), (output_name, outputs, "output")):
        if not there:
            raise ConfigError(f"no MIDI {what} port: connect an instrument, or start a software synthesizer")
        if given is not None and given not in there:
            raise ConfigError(f"no MIDI {what} port {given!r}; there are: {', '.join(there)}")
        names.append(given if given is not None else there[0])
    return backend.open_input(names[0]), backend.open_output(names[1])


def check_mode(live: Live, mode: str) -> None:
    """A one-line ConfigError where `live` cannot be played in `mode`."""
    if mode not in MODES:
        raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {mode}")
    if mode == "accompany":
        try:
            live.check_accompany()
        except ConfigError as exc:
            raise ConfigError(
                f"--mode accompany: {exc} (--prompt gives a band besides the player's --program)"
            ) from None


# --- the model's work, away from the clock -------------------------------------------------------
class ThreadWorker:
    """Runs the model's jobs one after another on a thread of its own; a job's error is raised
    again in the loop by `check`."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None
        threading.Thread(target=self._run, name="musegen-jam-model", daemon=True).start()

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if self.error is None:
                try:
                    job()
                except BaseException as exc:  # handed to the loop's thread, which stops the jam
                    self.error = exc


class InlineWorker:
    """Runs each job as it is submitted: with a virtual clock, the model takes no time."""

    def submit(self, job: Callable[[], None]) -> None:
        job()

    def check(self) -> None:
        pass


# --- the jam --------------------------------------------------------------------------------------
@dataclass
class Played:
    """A note the player played: seconds on the jam's clock (`end` None while held)."""

    start: float
    pitch: int
    velocity: int
    end: float | None = None


@dataclass
class _Answer:
    first: int  # its first bar
    end: int  # the bar after its last: after a hand-back, the bar after the one the player came back in
    next: int  # the next bar to draw
    drawing: bool = False  # a bar is being drawn


@dataclass
class Jam:
    """The jam's loop (module docstring). `clock()` reads seconds on a monotonic clock and
    `sleep(seconds)` waits; `inport` has `iter_pending()` (mido messages) and `outport` `send()`.
    `answer_bars` None: as many as the phrase's; `bars` None: until interrupted."""

    live: Live
    inport: object
    outport: object
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    worker: object = field(default_factory=InlineWorker)
    mode: str = "answer"
    answer_bars: int | None = None
    click: bool = True
    count_in: int = 1
    echo: bool = False
    bars: int | None = None

    def __post_init__(self):
        check_mode(self.live, self.mode)
        self.tick_seconds = 60.0 / (self.live.bpm * TPQ)
        self.bar_seconds = self.live.bar_ticks * self.tick_seconds
        self.first_bar = self.live.bars  # the player's first bar (a --prompt's bars come before it)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # the worker's notes and news, for the loop
        self.events: list = []  # heap of (seconds, order, what, payload)
        self.order = itertools.count()
        self.channels: dict[tuple[int, bool], int] = {}
        self.played: list[Played] = []
        self.held: dict[int, Played] = {}
        self.unfed = 0  # self.played[unfed:] are not given to the engine yet
        self.model_notes: list[LiveNote] = []  # the model's notes sent to the output port
        self.next_bar = self.live.bars  # the engine's bar once every job submitted has run
        self.phrase: int | None = None  # the bar the player's phrase began in
        self.last_onset_bar = -1
        self.answer: _Answer | None = None

    # --- time ------------------------------------------------------------------------------------
    def line(self, bar: int) -> float:
        """When bar `bar` of the piece begins."""
        return self.origin + bar * self.bar_seconds

    def bar_at(self, seconds: float) -> int:
        return math.floor((seconds - self.origin) / self.bar_seconds)

    # --- the loop --------------------------------------------------------------------------------
    def run(self, save: str | Path | None = None) -> None:
        """Play until `bars` bars are over, or until interrupted (KeyboardInterrupt); then every
        note still sounding is ended, and the jam is written to `save` (MIDI), interrupted or not."""
        start = self.clock()
        self.origin = start + (self.count_in - self.first_bar) * self.bar_seconds
        bar = self.first_bar - self.count_in  # the next bar line's bar
        if self.echo:
            self.outport.send(_message("program_change", channel=ECHO_CHANNEL, program=self.live.program))
        if self.mode == "accompany":  # the first bar is drawn during the count-in
            self._submit(self._accompany)
        last = None if self.bars is None else self.first_bar + self.bars  # the bar line the jam ends at
        try:
            while True:
                now = self.clock()
                for message in self.inport.iter_pending():
                    self._heard(message, now)
                while self.line(bar) <= now:
                    if bar == last:
                        return
                    self._bar_line(bar)
                    bar += 1
                self._work(now)
                self._send_due(now)
                wake = min(self.line(bar), now + POLL_SECONDS, self.events[0][0] if self.events else math.inf)
                self.sleep(max(wake - self.clock(), 0.0))
        finally:
            self._silence()
            if save is not None:
                write_bytes(save, self.recording().midi_bytes())

    def _bar_line(self, bar: int) -> None:
        """Bar `bar` begins (and bar - 1 is over)."""
        if self.click or bar < self.first_bar:
            beats = self.live.meter[0]
            for beat in range(beats):
                pitch = CLICK_PITCHES[0] if beat == 0 else CLICK_PITCHES[1]
                self._at(self.line(bar) + beat * self.bar_seconds / beats, "click", pitch)
        over = bar - 1
        if over < self.first_bar:
            return
        self._close_bars(over)
        if self.mode == "accompany":
            self._submit(self._accompany)
        elif self._phrase_over(over):
            bars = self.answer_bars or min(MAX_ANSWER_BARS, self.last_onset_bar - self.phrase + 1)
            self.answer = _Answer(self.next_bar, self.next_bar + bars, self.next_bar)
            self.phrase = None

    def _phrase_over(self, bar: int) -> bool:
        """The player played a phrase, and bar `bar`, not one of an answer, passed without a key
        pressed or held."""
        answering = self.answer is not None and bar < self.answer.end
        return self.phrase is not None and self.last_onset_bar < bar and not self.held and not answering

    def _close_bars(self, over: int) -> None:
        """Give the engine every bar up to `over` that it has not had, with the notes played."""
        while self.next_bar <= over:
            now = self.clock()
            notes = [self._live_note(p, now) for p in self.played[self.unfed :]]
            self.unfed = len(self.played)
            self._submit(lambda notes=notes: self.live.close_bar(notes))
            self.next_bar += 1

    def _work(self, now: float) -> None:
        """Take in what the worker has done, and give it the answer's next bar when it is due."""
        self.worker.check()
        self._take_in()
        while self._draw_due(now):
            self._take_in()  # an inline worker has drawn it already

    def _take_in(self) -> None:
        while True:
            try:
                news, answer, notes = self.inbox.get_nowait()
            except queue.Empty:
                return
            if news == "drawn":
                answer.drawing = False
            for note in notes:
                self._at(self.origin + note.start * self.tick_seconds, "note", (note, answer))

    def _draw_due(self, now: float) -> bool:
        """Submit the answer's next bar if it is due: each bar is drawn once the one before it
        starts sounding, so that it is there at its bar line."""
        answer = self.answer
        if answer is None or answer.drawing or answer.next >= answer.end or now < self.line(answer.next - 1):
            return False
        if answer.next < self.next_bar:  # the model fell behind: that bar went by, given to the engine as the player's
            answer.end = answer.next
            return False
        answer.drawing = True
        self._submit(lambda: self._draw(answer))
        answer.next += 1
        self.next_bar += 1
        return True

    def _draw(self, answer: _Answer) -> None:  # on the worker
        self.live.answer(1, lambda notes: self.inbox.put(("notes", answer, notes)))
        self.inbox.put(("drawn", answer, []))

    def _accompany(self) -> None:  # on the worker
        self.live.accompany(lambda notes: self.inbox.put(("notes", None, notes)))

    def _submit(self, job: Callable[[], None]) -> None:
        self.worker.submit(job)

    # --- the player ------------------------------------------------------------------------------
    def _heard(self, message, now: float) -> None:
        pedal = message.type == "control_change" and message.control == 64
        if message.type not in ("note_on", "note_off") and not pedal:
            return
        if self.echo:
            self.outport.send(message.copy(channel=ECHO_CHANNEL))
        if message.type == "control_change":
            return
        if message.type == "note_on" and message.velocity > 0:
            self._note_off(message.note, now)
            note = Played(now, message.note, message.velocity)
            self.played.append(note)
            self.held[message.note] = note
            bar = self.bar_at(now)
            if bar >= self.first_bar:
                self.phrase = bar if self.phrase is None else self.phrase
                self.last_onset_bar = bar
                self._hand_back(bar)
        else:
            self._note_off(message.note, now)

    def _note_off(self, pitch: int, now: float) -> None:
        note = self.held.pop(pitch, None)
        if note is not None:
            note.end = now

    def _hand_back(self, bar: int) -> None:
        """The player plays during an answer: it ends at the next bar line."""
        answer = self.answer
        if answer is not None and answer.first <= bar < answer.end:
            answer.end = bar + 1
            if answer.next > answer.end:  # a bar drawn ahead will not sound: the model forgets it
                self._submit(lambda end=answer.end: self.live.take_back(end))
                answer.next = self.next_bar = answer.end

    def _live_note(self, played: Played, now: float) -> LiveNote:
        """A played note in the piece's ticks; one still held lasts until now, as far as is known."""
        end = played.end if played.end is not None else now
        ticks = lambda seconds: round((seconds - self.origin) / self.tick_seconds)  # noqa: E731
        return LiveNote(ticks(played.start), ticks(end), played.pitch, played.velocity, self.live.program)

    # --- the output port -------------------------------------------------------------------------
    def _at(self, seconds: float, what: str, payload) -> None:
        heapq.heappush(self.events, (seconds, next(self.order), what, payload))

    def _send_due(self, now: float) -> None:
        while self.events and self.events[0][0] <= now:
            seconds, _, what, payload = heapq.heappop(self.events)
            if what == "off":
                channel, pitch = payload
                self.outport.send(_message("note_off", channel=channel, note=pitch, velocity=0))
            elif what == "click":
                velocity = 100 if payload == CLICK_PITCHES[0] else 70
                self.outport.send(_message("note_on", channel=DRUM_CHANNEL, note=payload, velocity=velocity))
                self._at(seconds + CLICK_SECONDS, "off", (DRUM_CHANNEL, payload))
            else:
                note, answer = payload
                end = self.origin + note.end * self.tick_seconds
                handed_back = answer is not None and seconds >= self.line(answer.end)
                if handed_back or end <= now:  # or too late to sound
                    continue
                channel = self._channel(note)
                self.outport.send(_message("note_on", channel=channel, note=note.pitch, velocity=note.velocity))
                self._at(end, "off", (channel, note.pitch))
                self.model_notes.append(note)

    def _channel(self, note: LiveNote) -> int:
        """The output channel of the model's instrument: its program is set on first use."""
        key = (note.program, note.drum)
        if key not in self.channels:
            if note.drum:
                self.channels[key] = DRUM_CHANNEL
            else:
                free = [c for c in range(16) if c not in (ECHO_CHANNEL, DRUM_CHANNEL)]
                taken = sum(1 for program, drum in self.channels if not drum)
                self.channels[key] = free[taken % len(free)]
                self.outport.send(_message("program_change", channel=self.channels[key], program=note.program))
        return self.channels[key]

    def _silence(self) -> None:
        """End every note the output port still sounds."""
        for _, _, what, payload in sorted(self.events):
            if what == "off":
                channel, pitch = payload
                self.outport.send(_message("note_off", channel=channel, note=pitch, velocity=0))
        self.events = []

    # --- the record ------------------------------------------------------------------------------
    def recording(self) -> NoteTable:
        """The jam from the player's first bar line: the player's notes at the times they were
        played, the model's at the times it gave them (those handed back left out)."""
        now, origin = self.clock(), self.line(self.first_bar)
        ticks = lambda seconds: round((seconds - origin) / self.tick_seconds)  # noqa: E731
        player = [
            LiveNote(ticks(n.start), ticks(n.end if n.end is not None else now), n.pitch, n.velocity, self.live.program)
            for n in self.played
        ]
        shift = self.first_bar * self.live.bar_ticks
        model = [replace(n, start=n.start - shift, end=n.end - shift) for n in self.model_notes]
        return recording({"player": player, "model": model}, self.live.meter, self.live.bpm)


def _message(type_: str, **fields):
    import mido

    return mido.Message(type_, **fields)


def backing_from(table: NoteTable, meter: tuple[int, int]) -> tuple[list[LiveNote], int]:
    """A --prompt's notes in the live piece's ticks, and its bars in `meter` (up to its last onset's)."""
    bar_ticks = TPQ * 4 * meter[0] // meter[1]
    notes = live_notes(table)
    return notes, max((n.start // bar_ticks + 1 for n in notes), default=0)
