"""Live play in the studio: a page plays bars into a model's streaming state (generation/live.py)
and hears its answers, or its accompaniment, as their notes become final.

A page session has at most one live session, and the studio MAX_LIVE in all; one not used for
IDLE_SECONDS ends, as Stop ends it. Each keeps a worker thread of its own, so its engine work is
done in order, off the event loop, whatever the sampling runs do meanwhile. What the player
played is kept at its played time (the engine hears it on the tokens' grid), the model's notes at
theirs, and the whole is written as `live.mid` in a run folder of the page's session."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable, ClassVar, Literal

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, StreamingResponse

from .. import schemas
from ..errors import ConfigError
from ..generation.live import TPQ, Live, LiveNote, live_notes, recording
from ..generation.prompt import load_prompt
from ..generation.resources import DEFAULT_CPU_THREADS, cpu_threads
from ..generation.settings import SampleSettings
from ..io import write_bytes
from .jobs import TEMPERATURE_RANGE, PageRequest
from .models import Models
from .store import RequestError, Store

MAX_LIVE = 4  # live sessions in the studio at once: each holds a model's streaming state and a thread
IDLE_SECONDS = 10 * 60  # a live session nobody plays into for this long ends (its piece is written)
MAX_ANSWER_BARS = 8
MAX_BAR_NOTES = 512  # notes in one bar's post: far more than ten fingers play in a bar
# bars posted and not yet done, per session: a page posts one a bar, whose answer takes less than a
# bar; more are a script's, whose queue would grow without end
MAX_PENDING = 2
MIDI_NAME = "live.mid"
# each field by its label in the page's Live panel, which the messages use
LABELS = {"model": "Model", "mode": "Mode", "bpm": "Tempo", "meter": "Meter", "program": "Instrument"}
LABELS |= {"prompt": "Backing", "answer_bars": "Answer bars", "seed": "Seed", "temperature": "Temperature"}
LABELS |= {"top_p": "Top-p", "bar": "Bar", "notes": "Notes", "answer": "Answer bars", "accompany": "Accompany"}
LABELS |= {"hand_back": "Hand back"}

# [start, end, pitch, velocity]: ticks at TPQ from the piece's first bar line, as played
Note = Annotated[list[int], Field(min_length=4, max_length=4)]


class LiveRequest(PageRequest):
    """A request of the page's Live panel, its fields by the panel's labels."""

    what: ClassVar[str] = "a live request"
    labels: ClassVar[dict[str, str]] = LABELS

    @classmethod
    def _problem_of(cls, kind: str, name: str, got: str) -> str | None:
        if kind == "string_pattern_mismatch":
            return f"{name} must be a time signature such as 4/4, got {got}"
        if kind in ("too_long", "too_short"):  # a bar's list of notes, or one note's four numbers
            if "[" not in name:
                return f"{name}: at most {MAX_BAR_NOTES} in a bar"
            return f"{name} must be [start, end, pitch, velocity], got {got}"
        return None


class LiveStart(LiveRequest):
    """A live session's settings, as the page's Live panel sends them."""

    model: schemas.Name = ""
    mode: Literal["answer", "accompany"] = "answer"  # call and response, or a band under the player
    bpm: Annotated[float, Field(ge=30, le=300)] = 100.0
    meter: Annotated[str, Field(pattern=r"^\d{1,2}/\d{1,2}$")] = "4/4"
    program: Annotated[int, Field(ge=0, le=127)] = 0  # the player's General MIDI instrument
    prompt: schemas.Name | None = None  # a prompt id of the session: its bars open the piece
    answer_bars: Annotated[int, Field(ge=1, le=MAX_ANSWER_BARS)] = 2  # the page's, as Space asks
    seed: int | None = None
    temperature: Annotated[float | None, Field(ge=TEMPERATURE_RANGE[0], le=TEMPERATURE_RANGE[1])] = None
    top_p: float | None = None


class LiveBar(LiveRequest):
    """A bar the player has just played: its notes, and what the model is to do from its end."""

    bar: Annotated[int, Field(ge=0)] | None = None  # the bar that is over (0: the piece's first); None: none
    notes: Annotated[list[Note], Field(max_length=MAX_BAR_NOTES)] = []
    answer: Annotated[int, Field(ge=0, le=MAX_ANSWER_BARS)] = 0  # bars to answer from the next bar line
    accompany: bool = False  # the next bar's accompaniment
    # the player came in over an answer in this bar: the answer's bars after it are dropped
    hand_back: bool = False


class LiveEvent(BaseModel):
    """A line of a live bar's stream, as its clients read it: notes as they become final, the bar
    done (and the next bar to post), or one line of error."""

    model_config = schemas.OPEN
    event: Literal["notes", "done", "error"]


LIVE_START = schemas.Format("studio live start", None, LiveStart)
LIVE_BAR = schemas.Format("studio live bar", None, LiveBar)
LIVE_EVENT = schemas.Format("studio live event", None, LiveEvent)


@dataclass
class Session:
    """One live session: the engine, its one worker thread, and the piece as it sounded."""

    id: str  # the name of the run folder its piece is written to, too
    page: str  # the page session it belongs to
    folder: Path
    mode: str
    worker: ThreadPoolExecutor
    live: Live | None = None
    next_bar: int = 0  # the bar the page is to send next
    answered: range = range(0)  # the bars of the last answer, where the player may come back in
    pending: list[Future] = field(default_factory=list)  # the bars posted, in the worker
    backing: list[LiveNote] = field(default_factory=list)
    played: list[LiveNote] = field(default_factory=list)  # the player's notes, as played
    heard: list[LiveNote] = field(default_factory=list)  # the model's notes, as they sounded
    used: float = field(default_factory=time.monotonic)

    def hand_back(self, bar: int) -> None:
        """In the worker: the player came in over the answer in bar `bar`; the answer stops at the
        line after it, and the model forgets what it drew beyond (it never sounded). The notes
        played over the answer are kept as played, and not fed, as `musegen jam` does."""
        cut = (bar + 1) * self.live.bar_ticks
        self.heard = [n for n in self.heard if n.start < cut]
        if self.live.bars > bar + 1:
            self.live.take_back(bar + 1)

    def write(self) -> Path | None:
        """The piece so far as a MIDI file in the session's run folder, every note at its time;
        None while nothing has been played or answered."""
        if not (self.played or self.heard):
            return None
        parts = {"backing": self.backing, "player": self.played, "musegen": self.heard}
        table = recording(parts, self.live.meter, self.live.bpm)
        path = self.folder / MIDI_NAME
        self.folder.mkdir(parents=True, exist_ok=True)
        write_bytes(path, table.midi_bytes())
        return path


class LiveRoutes:
    """The live routes' handlers and the live sessions going, by id."""

    def __init__(self, store: Store, models: Models, describe: Callable[[BaseException], str]):
        self.store, self.models, self.describe = store, models, describe  # describe: a failure in one line
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    # --- the routes ---------------------------------------------------------------------------
    async def start(self, request: Request):
        """A new live session for the page (its earlier one ends): {"live": its id, "bar": the
        player's first, "bar_ticks", "cell": ticks between two onsets the model hears, "tpq", "bpm",
        "meter": [numerator, denominator], "answer_bars", "backing": the backing's notes as the stream's}."""
        page = request.query_params.get("session", "")
        self.store.session(page)
        start = schemas.loads(await request.body(), LIVE_START, "the live request", explain=LiveStart.problem)
        self._end_idle()
        for old in [s for s in self.sessions.values() if s.page == page]:
            await self._end(old)
        with self._lock:
            if len(self.sessions) >= MAX_LIVE:
                raise RequestError(f"the studio has {MAX_LIVE} live sessions going; try again when one ends")
            run, folder = self.store.new_run(page)
            worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="studio-live")
            session = Session(run, page, folder, start.mode, worker)
            self.sessions[session.id] = session
        try:
            await self._in_worker(session, self._build, session, start)
        except BaseException:
            await self._end(session, write=False)
            raise
        live = session.live
        body = {"live": session.id, "bar": live.bars, "bar_ticks": live.bar_ticks, "cell": live.cell, "tpq": TPQ}
        body |= {"bpm": live.bpm, "meter": list(live.meter), "answer_bars": start.answer_bars}
        body["backing"] = [n.row() for n in session.backing]
        return JSONResponse(body)

    async def bar(self, request: Request):
        """Bar `bar` is over: its notes are fed; the answer's or the accompaniment's notes are
        streamed as NDJSON ({"event": "notes", "notes": [[start, end, pitch, velocity, program,
        drum], ...]}) as they become final, then {"event": "done", "bar": the next bar to send}."""
        session = self._session(request)
        played = schemas.loads(await request.body(), LIVE_BAR, "the live bar", explain=LiveBar.problem)
        notes = self._checked(session, played)
        if played.accompany and session.mode != "accompany":
            raise ConfigError("this live session answers; start one in accompany mode for an accompaniment")
        if played.bar is None and not (played.accompany and not played.notes and not played.answer):
            raise RequestError("Bar: a post that ends no bar only asks for the next bar's accompaniment")
        if played.hand_back and played.bar not in session.answered:
            raise RequestError(f"Hand back: bar {played.bar} is not one of the model's answer")
        if played.bar is not None and not played.hand_back and played.bar != session.next_bar:
            raise RequestError(f"Bar must be {session.next_bar}, the bar being played, got {played.bar}")
        session.pending = [f for f in session.pending if not f.done()]
        if len(session.pending) >= MAX_PENDING:
            raise RequestError(f"the model is still at work on the {MAX_PENDING} bars before; this one was not taken")
        if played.bar is not None:
            session.next_bar = played.bar + 1 + played.answer
            session.answered = range(played.bar + 1, session.next_bar)
        session.used = time.monotonic()
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        put = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)  # noqa: E731
        session.pending.append(session.worker.submit(_one_thread, self._play, session, played, notes, put))
        return StreamingResponse(_stream(events), media_type="application/x-ndjson")

    async def stop(self, request: Request):
        """Ends the live session; its piece is written: {"run", "midi"} (served by /files)."""
        session = self._session(request)
        path = await self._end(session)
        return JSONResponse({"run": session.id, "midi": path.name if path else None})

    async def midi(self, request: Request):
        """The piece so far as a MIDI file (written into the session's run folder)."""
        session = self._session(request)
        path = await self._in_worker(session, session.write)
        if path is None:
            raise RequestError("nothing has been played yet: the piece has no notes")
        return FileResponse(path, filename=path.name, media_type="audio/midi")

    # --- inside -------------------------------------------------------------------------------
    def _build(self, session: Session, start: LiveStart) -> None:
        model, tokenizer, weights = self.models.shared(start.model)
        numerator, denominator = (int(x) for x in start.meter.split("/"))
        if denominator not in (1, 2, 4, 8, 16, 32) or numerator < 1:
            raise ConfigError(f"Meter must be a time signature such as 4/4, got {start.meter!r}")
        backing, bars = [], 0
        if start.prompt:
            backing, bars = _backing(tokenizer, self.store.prompt(session.page, start.prompt), (numerator, denominator))
        elif start.mode == "accompany":
            raise ConfigError("an accompaniment goes on with a backing: choose a prompt whose bars open the piece")
        settings = SampleSettings(bars=1, seed=start.seed, temperature=start.temperature, top_p=start.top_p)
        settings.resolved(tokenizer, LABELS)  # a bad value is refused in the panel's words
        session.live = Live(
            model, tokenizer, settings, (numerator, denominator), start.bpm, start.program, weights, backing, bars
        )
        if start.mode == "accompany":
            session.live.check_accompany()  # refused at Start, not at the first bar
        session.next_bar, session.backing = bars, backing

    def _play(self, session: Session, played: LiveBar, notes: list[LiveNote], put) -> None:
        """In the session's worker: the bar fed, then the model's notes passed on as they come."""
        try:
            if played.hand_back:
                session.hand_back(played.bar)
            elif played.bar is not None:
                while session.live.bars < played.bar:  # the bars of an answer that failed: silent
                    session.live.close_bar()
                session.live.close_bar(notes)
            session.played += notes
            on_notes = lambda found: put({"event": "notes", "notes": [n.row() for n in found]})  # noqa: E731
            if played.answer:
                session.heard += session.live.answer(played.answer, on_notes)
            elif played.accompany:
                session.heard += session.live.accompany(on_notes)
            put({"event": "done", "bar": session.live.bars})
        except Exception as exc:  # one line for the page
            put({"event": "error", "error": self.describe(exc)})
        finally:
            put(None)

    def _checked(self, session: Session, played: LiveBar) -> list[LiveNote]:
        """The bar's notes: each starts within a bar of the one played, ends after it starts, and
        has MIDI's pitch and velocity."""
        if played.bar is None:
            return []
        bar_ticks = session.live.bar_ticks
        low, high = (played.bar - 1) * bar_ticks, (played.bar + 2) * bar_ticks
        for k, (start, end, pitch, velocity) in enumerate(played.notes):
            if not low <= start < high:
                raise RequestError(f"Notes[{k}] starts at tick {start}, not within a bar of bar {played.bar}")
            if end <= start:
                raise RequestError(f"Notes[{k}] ends at tick {end}, not after its start ({start})")
            if not (0 <= pitch <= 127 and 1 <= velocity <= 127):
                raise RequestError(f"Notes[{k}]: pitch {pitch} and velocity {velocity} must be MIDI's (0..127, 1..127)")
        return [
            LiveNote(start, end, pitch, velocity, session.live.program) for start, end, pitch, velocity in played.notes
        ]

    def _session(self, request: Request) -> Session:
        self.store.session(request.query_params.get("session", ""))
        self._end_idle()
        session = self.sessions.get(request.path_params["live"])
        if session is None or session.page != request.query_params["session"]:
            raise RequestError(f"no live session {request.path_params['live'][:40]!r} going in this page (Start one)")
        return session

    async def _in_worker(self, session: Session, fn, *args):
        return await asyncio.wrap_future(session.worker.submit(_one_thread, fn, *args))

    async def _end(self, session: Session, write: bool = True) -> Path | None:
        with self._lock:
            if self.sessions.pop(session.id, None) is None:
                return None
        try:
            return await self._in_worker(session, session.write) if write and session.live else None
        finally:
            session.worker.shutdown(wait=False)

    def _end_idle(self) -> None:
        """Ends the sessions nobody has played into for IDLE_SECONDS (their pieces written)."""
        now = time.monotonic()
        for session in [s for s in self.sessions.values() if now - s.used > IDLE_SECONDS]:
            with self._lock:
                self.sessions.pop(session.id, None)
            if session.live:
                session.worker.submit(session.write)
            session.worker.shutdown(wait=True)  # nothing else is in flight: it was idle


def _backing(tokenizer, path: Path, meter: tuple[int, int]) -> tuple[list[LiveNote], int]:
    """A prompt's notes in the live piece's ticks (its bars open the piece), and its bars."""
    prompt = load_prompt(tokenizer, path)
    piece = prompt.piece
    if piece is None or not len(piece):
        raise ConfigError(f"{path.name}: no notes to play along with")
    first = tuple(piece.time_signatures[0][1:]) if piece.time_signatures else (4, 4)
    if first != meter:
        raise ConfigError(f"{path.name} is in {first[0]}/{first[1]}: play along in that meter, or choose another")
    return live_notes(piece), int(prompt.bars)


def _one_thread(fn, *args):
    """`fn(*args)` with the torch threads sampling uses: a bar fed on two busy cores took 131 ms
    with two threads, 37 ms with one."""
    with cpu_threads(DEFAULT_CPU_THREADS):
        return fn(*args)


async def _stream(events: asyncio.Queue):
    while (event := await events.get()) is not None:
        yield (json.dumps(event, separators=(",", ":")) + "\n").encode()
