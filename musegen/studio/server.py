"""The studio's web app: the page (static/), a JSON API, and a run streamed to the page as one JSON
object per line while it samples. Runs are sampled in worker processes (workers.py), WORKERS at
once, each relayed by a thread of a bounded pool, so the event loop keeps answering every page
meanwhile and each run has a core of its own. A user's input that cannot be used is answered with
{"error": one line} and status 400; no traceback reaches the page, nor where the server keeps
its files. What every request must pass first (its host, its origin, its size) is in guard.py;
how runs share the places and reach their pages, in runs.py; the WAVs, in audio.py; what the
page's own synthesiser needs, in sound.py."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import schemas
from ..errors import MusegenError
from ..io import is_disk_full
from . import jobs, workers
from .audio import Renders
from .guard import Guard
from .jobs import error_message
from .live import LiveRoutes
from .models import Models, examples
from .runs import Places, RunEvents, Stop, client_left
from .sound import Sound, SoundfontResponse
from .store import MAX_UPLOAD_BYTES, RequestError, Store

STATIC = Path(__file__).parent / "static"
WORKERS = 2  # runs sampled at once, each in a process of its own; more wait their turn (the page says so)
MAX_WAITING = 32  # runs accepted beyond those being sampled
PER_SESSION = 4  # runs one session may have sampling or waiting: the others keep their places
MAX_JSON_BYTES = 64 * 1024  # a request body other than an upload (a generation request is ~200 bytes)


class StudioEvent(BaseModel):
    """A line of the studio's generation stream, as its clients read it."""

    model_config = schemas.OPEN
    event: Literal["queued", "started", "notes", "done", "stopped", "error"]


STUDIO_EVENT = schemas.Format("studio event", None, StudioEvent)


def body_limit(path: str, query: QueryParams) -> tuple[int, str]:
    """The most bytes a request body may have on `path`, and the line that refuses more."""
    if path == "/api/prompts":
        return (
            MAX_UPLOAD_BYTES,
            f"{query.get('name') or 'the file'}: more than the {MAX_UPLOAD_BYTES:,} bytes a prompt may have",
        )
    return MAX_JSON_BYTES, f"a request body of more than {MAX_JSON_BYTES:,} bytes; the studio takes no more here"


def create_app(out: Path, models: Models, host: str = "127.0.0.1", sound: Sound | None = None) -> Starlette:
    """The studio's app, keeping what it is given and makes under `out`; `host` is the address it
    listens on (requests naming another host are refused, see guard.py); `sound`: the page's
    synthesiser and soundfont (by default those this machine has)."""
    studio = Studio(out, models, sound or Sound.find())
    routes = [
        Route("/", studio.index),
        Route("/api/models", studio.list_models),
        Route("/api/prompts", studio.upload, methods=["POST"]),
        Route("/api/generate", studio.generate, methods=["POST"]),
        Route("/api/results", studio.results),
        Route("/api/runs/{run}", studio.run_detail),
        Route("/api/runs/{run}/stop", studio.stop, methods=["POST"]),
        Route("/files/{run}/{name}", studio.run_file),
        Route("/api/live", studio.live.start, methods=["POST"]),
        Route("/api/live/{live}/bar", studio.live.bar, methods=["POST"]),
        Route("/api/live/{live}/stop", studio.live.stop, methods=["POST"]),
        Route("/api/live/{live}/live.mid", studio.live.midi),
        Route("/sound/soundfont.sf2", studio.soundfont),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        *studio.sound.routes(),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, host=host, limits=body_limit)],
        exception_handlers={MusegenError: failure, OSError: failure, Exception: failure},
    )
    app.state.pool, app.state.places, app.state.live = studio.pool, studio.places, studio.live
    app.state.end_runs = studio.end_runs
    return app


async def failure(request: Request, exc: Exception):
    status = getattr(exc, "status", 400) if isinstance(exc, MusegenError) else 507 if is_disk_full(exc) else 500
    return JSONResponse({"error": error_message(exc)}, status_code=status)


def session(request: Request) -> str:
    return request.query_params.get("session", "")


class Studio:
    """The routes' handlers, and what they share: the store, the models, the sampling workers and
    the places in their queue, the WAV renders, and what the page needs to play sound itself."""

    def __init__(self, out: Path, models: Models, sound: Sound):
        self.store, self.models, self.sound = Store(out), models, sound
        self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="studio-sample")
        self.places, self.renders = Places(WORKERS + MAX_WAITING, PER_SESSION), Renders()
        self.stops: dict[tuple[str, str], Stop] = {}  # the runs going, by session and run
        self.live = LiveRoutes(self.store, models, error_message)  # play along: live.py

    async def index(self, request: Request):
        return FileResponse(STATIC / "index.html")

    async def list_models(self, request: Request):
        return JSONResponse(
            {
                "models": self.models.describe(),
                "max_bars": jobs.MAX_BARS,
                "max_samples": jobs.MAX_SAMPLES,
                "sound_missing": self.sound.missing(),
            }
        )

    async def soundfont(self, request: Request):
        if self.sound.soundfont is None:
            return JSONResponse({"error": self.sound.missing()}, status_code=404)
        return SoundfontResponse(self.sound.soundfont)

    async def upload(self, request: Request):
        q = request.query_params
        self.models.tokenizer(q.get("model", ""))  # an unknown model is refused before anything is kept
        if q.get("prompt"):  # one kept before, read again for another model: kept whatever it gives
            path = await run_in_threadpool(self.store.prompt, session(request), q["prompt"])
            view = await run_in_threadpool(jobs.prompt_view, self.models, q.get("model", ""), path)
            return JSONResponse({"prompt": path.parent.name, "name": path.name, **view})
        body = await request.body()  # within MAX_UPLOAD_BYTES (the guard)
        name = q.get("name", "")
        if q.get("example"):
            if q["example"] not in examples():
                raise RequestError(f"no example prompt {q['example'][:80]!r}")
            name, body = q["example"], examples()[q["example"]].read_bytes()
        path = await run_in_threadpool(self.store.save_prompt, session(request), name, body)
        try:
            view = await run_in_threadpool(jobs.prompt_view, self.models, q.get("model", ""), path)
        except BaseException:  # a prompt that cannot be used is not kept
            await run_in_threadpool(shutil.rmtree, path.parent, True)
            raise
        return JSONResponse({"prompt": path.parent.name, "name": path.name, **view})

    def checked_job(self, sid: str, body: bytes) -> jobs.Request:
        job = jobs.Request.parse(body, partial(self.store.prompt, sid), partial(self.sample_of, sid))
        job.settings().resolved(
            self.models.tokenizer(job.model), jobs.SETTING_LABELS
        )  # refused before the stream starts
        return job

    async def generate(self, request: Request):
        sid = session(request)
        self.store.session(sid)  # every check before a place is taken: a refused request holds none
        job = await run_in_threadpool(self.checked_job, sid, await request.body())
        self.places.take(sid)
        try:
            run, folder = self.store.new_run(sid)
            events, stop = RunEvents(asyncio.get_running_loop()), Stop()
            self.stops[sid, run] = stop
            done = partial(self.ended, sid, run)
            self.pool.submit(_work, self.models, job, run, folder, events, stop, done)
        except BaseException:
            self.ended(sid, run)
            raise
        return RunResponse(_stream(run, events), stop)

    def sample_of(self, sid: str, run: str, index: int) -> tuple[Path, str]:
        """An earlier run's sample to extend: its MIDI file, and the name of the model that made it."""
        summary = self.store.summary(sid, run)
        if index >= len(summary["samples"]):
            raise RequestError(f"run {run} has no sample {index + 1}")
        model = self.models.name_of(summary.get("checkpoint", ""))
        if model is None:
            raise RequestError(f"run {run} was made by a model this studio no longer offers")
        return self.store.file(sid, run, summary["samples"][index]["midi"]), model

    def extended(self, sid: str, midi: Path) -> dict[str, Any] | None:
        """The run and sample index an extension continued (`midi`: its prompt), if still there."""
        try:
            records = self.store.summary(sid, midi.parent.name)["samples"]
        except MusegenError:
            return None
        index = next((r["index"] for r in records if r.get("midi") == midi.name), None)
        return {"run": midi.parent.name, "sample": index, "name": midi.name} if index is not None else None

    def end_runs(self) -> None:
        """Every run going ends at its next step, nothing kept (the studio is stopping)."""
        for stop in list(self.stops.values()):
            stop.set()

    def ended(self, sid: str, run: str) -> None:
        self.stops.pop((sid, run), None)
        self.places.give_back(sid)

    async def stop(self, request: Request):
        """The page's Stop: the run ends at its next step and keeps the bars drawn so far (a page
        that leaves instead ends its run too, and nothing is written)."""
        sid, run = session(request), request.path_params["run"]
        self.store.session(sid)
        stop = self.stops.get((sid, run))
        if stop is None:
            raise RequestError(f"no run {run[:40]!r} going in this session")
        stop.press()
        return JSONResponse({"stopping": run})

    async def results(self, request: Request):
        def listed():
            found = self.store.results(session(request))
            for result in found:  # what the page needs to set its form as it was for the run
                prompt = Path(result["prompt"]) if result.get("prompt") else None
                result["model"] = self.models.name_of(result.get("checkpoint", ""))
                result["prompt_id"] = prompt.parent.name if prompt else None
                result["prompt_name"], result["extends"] = prompt.name if prompt else None, None
                if prompt and prompt.parent.parent.name != "prompts":  # an extension: its prompt is a sample
                    result["prompt_id"], result["extends"] = None, self.extended(session(request), prompt)
            return found

        return JSONResponse({"results": await run_in_threadpool(listed)})

    async def run_detail(self, request: Request):
        def detail():
            summary = self.store.summary(session(request), request.path_params["run"])
            folder = self.store.run(session(request), request.path_params["run"])
            name = self.models.name_of(summary.get("checkpoint", ""))
            tokenizer = self.models.tokenizer(name) if name else None  # a model no longer offered: as written
            return {**summary, "views": jobs.run_view(folder, summary, tokenizer)}

        return JSONResponse(await run_in_threadpool(detail))

    async def run_file(self, request: Request):
        sid, run, name = session(request), request.path_params["run"], request.path_params["name"]
        if name.endswith(".wav"):  # rendered on first request, kept beside the MIDI as `sample --audio` does
            midi = self.store.file(sid, run, name[: -len(".wav")] + ".mid")
            if await self.renders.wav(midi, request.receive) is None:
                return Response(status_code=204)  # the client left: nobody reads this
        if name.endswith(".json") and not (self.store.run(sid, run) / name).exists():  # a MIDI prompt's sample
            midi = self.store.file(sid, run, name[: -len(".json")] + ".mid")
            body = await run_in_threadpool(jobs.mirex_generation, midi)
            return JSONResponse(body, headers={"Content-Disposition": f'attachment; filename="{midi.stem}.json"'})
        path = self.store.file(sid, run, name)
        return FileResponse(path, filename=path.name)


def _work(models: Models, job: jobs.Request, run: str, folder: Path, events: RunEvents, stop: Stop, done) -> None:
    """A run, relayed by a sampling thread from its worker process: its events for the page, then
    None; `done` when it ends."""
    try:
        workers.sample(models.folders, job, run, folder, events.put, stop)
    except Exception as exc:  # the process could not start, or ended: one line in the page too
        events.put({"event": "error", "error": error_message(exc)})
    finally:
        done()
        events.put(None)


async def _stream(run: str, events: RunEvents):
    yield _line({"event": "queued", "run": run})
    while (event := await events.get()) is not None:
        yield _line(event)


class RunResponse(StreamingResponse):
    """A run's events as NDJSON; however the response ends (the run is done, the page pressed
    Stop or left, the server stops), `stop` is set, so the run's worker ends at its next step."""

    def __init__(self, content, stop: threading.Event):
        super().__init__(content, media_type="application/x-ndjson")
        self.stop = stop

    async def __call__(self, scope, receive, send) -> None:
        # watched from the start, as Starlette does only under ASGI 2.3: a run may send nothing for
        # minutes (waiting for a worker, or feeding a long prompt to the model)
        left = asyncio.ensure_future(client_left(receive))
        left.add_done_callback(lambda task: task.cancelled() or self.stop.set())
        try:
            await super().__call__(scope, receive, send)
        finally:
            left.cancel()
            self.stop.set()


def _line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, separators=(",", ":")) + "\n").encode()
