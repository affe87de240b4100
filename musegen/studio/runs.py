"""How runs share the studio: a bounded number sample or wait (in all and per session, so no one
page or script takes every place), and what a run tells its page waits in a bounded buffer (a
page that reads slowly, or not at all, gets the latest notes, never a growing backlog)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, deque
from typing import Any

from starlette.types import Receive

from .store import RequestError


class Stop(threading.Event):
    """Set when a run is to end: by the page's Stop, which keeps the bars drawn so far (`keeps`),
    or because nobody reads the run any more (its page left, the server stops)."""

    def __init__(self) -> None:
        super().__init__()
        self.keeps = False

    def press(self) -> None:
        self.keeps = True
        self.set()


class Places:
    """Places for runs sampling or waiting: `total` in all, `per_session` for one session."""

    def __init__(self, total: int, per_session: int):
        self.total, self.per_session = total, per_session
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()

    def take(self, session: str) -> None:
        with self._lock:
            if self._held[session] >= self.per_session:
                raise RequestError(f"this page already has {self.per_session} runs going; wait for one to end")
            if sum(self._held.values()) >= self.total:
                raise RequestError("the studio is busy: too many runs are waiting; try again in a minute")
            self._held[session] += 1

    def give_back(self, session: str) -> None:
        with self._lock:
            self._held[session] -= 1
            if not self._held[session]:
                del self._held[session]

    def held(self) -> int:
        with self._lock:
            return sum(self._held.values())


def notes_delta(sent: list[list[int]], now: list[list[int]]) -> dict[str, Any]:
    """What turns the notes a page has (`sent`) into `now`: keep the first `from`, then append
    `notes`. Notes are sorted by onset, so a note closed since (its end changed) or one that came
    in before others only resends the notes from there on."""
    same = 0
    for a, b in zip(sent, now):
        if a != b:
            break
        same += 1
    return {"from": same, "notes": now[same:]}


def merged_deltas(first: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """One delta doing what `first` and then `then` do (what else it carries, `then`'s)."""
    if then["from"] < first["from"]:
        return then
    return {**then, "from": first["from"], "notes": first["notes"][: then["from"] - first["from"]] + then["notes"]}


def merged_notes(first: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """One "notes" event for two in a row: the later progress, each sample's deltas merged."""
    samples = [merged_deltas(a, b) for a, b in zip(first["samples"], then["samples"])]
    return {**then, "samples": samples}


class RunEvents:
    """A run's events on their way from its worker thread to the page's stream. Events wait in
    order, except that a "notes" event joins one still waiting right before it, so at most a few
    wait, whatever the page reads; None ends the stream."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop, self._lock = loop, threading.Lock()
        self._waiting: deque[dict[str, Any] | None] = deque()
        self._ready = asyncio.Event()

    def put(self, event: dict[str, Any] | None) -> None:
        """From any thread."""
        with self._lock:
            last = self._waiting[-1] if self._waiting else None
            if event is not None and last is not None and event["event"] == last["event"] == "notes":
                self._waiting[-1] = merged_notes(last, event)
                return
            self._waiting.append(event)
            if len(self._waiting) > 1:
                return  # the page has been woken for the first one already
        self._loop.call_soon_threadsafe(self._ready.set)

    async def get(self) -> dict[str, Any] | None:
        """On the event loop: the next event, waiting for one."""
        while True:
            with self._lock:
                if self._waiting:
                    return self._waiting.popleft()
                self._ready.clear()
            await self._ready.wait()

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)


async def client_left(receive: Receive) -> None:
    """Returns when the client has closed its connection (its request body already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
