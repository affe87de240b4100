"""The WAVs the page plays, rendered by FluidSynth when first asked for and kept beside the MIDI
(as `musegen sample --audio` does): RENDERS at a time in a pool of their own, so sampling and
every other request go on meanwhile; one render per file however many requests ask for it; and
a render nobody waits for any more is stopped (FluidSynth killed, its temporary file removed)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from starlette.types import Receive

from ..render import Cancelled, TooLongError, render_wav
from .runs import client_left
from .store import RequestError

RENDERS = 1  # FluidSynth processes at once: each takes a core while it runs
MAX_MINUTES = 15.0  # the longest audio a studio sample gets (a 200-bar prompt and 64 bars at 60 bpm fit)


@dataclass
class _Render:
    future: asyncio.Future
    cancel: threading.Event = field(default_factory=threading.Event)
    waiting: int = 0


class Renders:
    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=RENDERS, thread_name_prefix="studio-render")
        self._going: dict[Path, _Render] = {}  # used on the event loop only

    async def wav(self, midi: Path, receive: Receive) -> Path | None:
        """The WAV beside `midi`, rendered if it is not there yet; None if the client left first
        (`receive` tells). A render's one-line error is raised to every request waiting for it."""
        wav = midi.with_suffix(".wav")
        if wav.is_file():
            return wav
        render = self._going.get(wav) or self._start(midi, wav)
        render.waiting += 1
        gone = asyncio.ensure_future(client_left(receive))
        try:
            await asyncio.wait({render.future, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            render.waiting -= 1
            if not render.waiting and not render.future.done():
                render.cancel.set()  # nobody waits for it: FluidSynth is killed
                self._going.pop(wav, None)  # a later request starts afresh
        if not render.future.done():
            return None
        render.future.result()
        return wav

    def _start(self, midi: Path, wav: Path) -> _Render:
        cancel = threading.Event()
        future = asyncio.get_running_loop().run_in_executor(self.pool, partial(_render, midi, wav, cancel))
        render = self._going[wav] = _Render(future, cancel)
        future.add_done_callback(partial(self._ended, wav, render))
        return render

    def _ended(self, wav: Path, render: _Render, future: asyncio.Future) -> None:
        if self._going.get(wav) is render:
            del self._going[wav]
        if not future.cancelled():
            future.exception()  # a cancelled render's error is expected: nobody is told


def _render(midi: Path, wav: Path, cancel: threading.Event) -> None:
    try:
        render_wav(midi, wav, max_minutes=MAX_MINUTES, cancel=cancel)
    except TooLongError as exc:  # in the studio's words: its page has no --max-minutes to give
        raise RequestError(
            f"{midi.name}: lasts {exc.minutes:,.1f} minutes; the studio plays at most {MAX_MINUTES:g}"
        ) from None
    except Cancelled:
        pass
