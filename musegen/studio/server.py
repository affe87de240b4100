"""The studio's web app: the page (static/), a JSON API, and a run streamed to the page as one JSON
object per line while it samples. Sampling runs in a bounded pool of worker threads, so the event
loop keeps answering every page meanwhile. A user's input that cannot be used is answered with
{"error": one line} and status 400; no traceback reaches the page."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import MusegenError
from ..io import is_disk_full
from ..render import render_wav
from . import jobs
from .models import Models, examples
from .store import MAX_UPLOAD_BYTES, RequestError, Store

STATIC = Path(__file__).parent / "static"
WORKERS = 2  # generations sampled at once; more wait their turn (the page says so)
MAX_WAITING = 32  # runs accepted beyond those being sampled


def error_message(exc: BaseException) -> str:
    """One line for the page: a MusegenError's own, a full disk, or an internal error by type."""
    if isinstance(exc, MusegenError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if is_disk_full(exc):
        return "disk full: the studio's --out folder has no space left"
    return f"internal error: {type(exc).__name__} (see the studio's console)"


def create_app(out: Path, models: Models) -> Starlette:
    store = Store(out)
    pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="studio-sample")
    pending = threading.BoundedSemaphore(WORKERS + MAX_WAITING)

    def session(request: Request) -> str:
        return request.query_params.get("session", "")

    async def index(request: Request):
        return FileResponse(STATIC / "index.html")

    async def list_models(request: Request):
        return JSONResponse(
            {
                "models": models.describe(),
                "examples": list(examples()),
                "max_bars": jobs.MAX_BARS,
                "max_samples": jobs.MAX_SAMPLES,
            }
        )

    async def upload(request: Request):
        q = request.query_params
        models.tokenizer(q.get("model", ""))  # an unknown model is refused before anything is kept
        name, length = q.get("name", ""), request.headers.get("content-length", "")
        too_big = f"{name or 'the file'}: more than the {MAX_UPLOAD_BYTES:,} bytes a prompt may have"
        if length.isdigit() and int(length) > MAX_UPLOAD_BYTES:
            raise RequestError(too_big)  # refused before it is read
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_UPLOAD_BYTES:
                raise RequestError(too_big)
        if q.get("example"):
            if q["example"] not in examples():
                raise RequestError(f"no example prompt {q['example'][:80]!r}")
            name, body = q["example"], examples()[q["example"]].read_bytes()
        path = await run_in_threadpool(store.save_prompt, session(request), name, bytes(body))
        try:
            view = await run_in_threadpool(jobs.prompt_view, models, q.get("model", ""), path)
        except MusegenError as exc:  # named as the user named it, not by the folder it is kept in
            raise type(exc)(error_message(exc).replace(str(path), path.name)) from None
        return JSONResponse({"prompt": path.parent.name, "name": path.name, **view})

    async def generate(request: Request):
        job = jobs.Request.parse(await request.body(), lambda prompt: store.prompt(session(request), prompt))
        job.settings().resolved(models.tokenizer(job.model))  # refused here, before the stream starts
        if not pending.acquire(blocking=False):
            raise RequestError("the studio is busy: too many runs are waiting; try again in a minute")
        run, folder = store.new_run(session(request))
        loop, events, stop = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()
        put = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)

        def work() -> None:
            try:
                put({"event": "started"})
                summary = jobs.generate_run(models, job, folder, lambda e: put({"event": "notes", **e}), stop)
                put({"event": "done", "run": run, "samples": jobs.run_view(folder, summary), "stats": summary["stats"]})
            except jobs.Stopped:
                put({"event": "stopped"})
            except Exception as exc:  # every failure becomes one line in the page
                put({"event": "error", "error": error_message(exc)})
            finally:
                pending.release()
                put(None)

        pool.submit(work)  # here, not in the stream: its slot is given back even if the stream never starts
        return StreamingResponse(_stream(run, events, stop), media_type="application/x-ndjson")

    async def _stream(run: str, events: asyncio.Queue, stop: threading.Event):
        try:
            yield _line({"event": "queued", "run": run})
            while (event := await events.get()) is not None:
                yield _line(event)
        finally:
            stop.set()  # the page left or pressed Stop: the worker ends at its next step

    async def results(request: Request):
        return JSONResponse({"results": await run_in_threadpool(store.results, session(request))})

    async def run_detail(request: Request):
        def detail():
            summary = store.summary(session(request), request.path_params["run"])
            folder = store.run(session(request), request.path_params["run"])
            return {**summary, "views": jobs.run_view(folder, summary)}

        return JSONResponse(await run_in_threadpool(detail))

    async def run_file(request: Request):
        sid, run, name = session(request), request.path_params["run"], request.path_params["name"]
        if name.endswith(".wav"):  # rendered on first request, kept beside the MIDI as `sample --audio` does
            midi = store.file(sid, run, name[: -len(".wav")] + ".mid")
            if not midi.with_suffix(".wav").is_file():
                await run_in_threadpool(render_wav, midi, midi.with_suffix(".wav"))
        if name.endswith(".json") and not (store.run(sid, run) / name).exists():  # a MIDI prompt's sample
            midi = store.file(sid, run, name[: -len(".json")] + ".mid")
            body = await run_in_threadpool(jobs.mirex_generation, midi)
            return JSONResponse(body, headers={"Content-Disposition": f'attachment; filename="{midi.stem}.json"'})
        path = store.file(sid, run, name)
        return FileResponse(path, filename=path.name)

    async def failure(request: Request, exc: Exception):
        status = 400 if isinstance(exc, MusegenError) else 507 if is_disk_full(exc) else 500
        return JSONResponse({"error": error_message(exc)}, status_code=status)

    routes = [
        Route("/", index),
        Route("/api/models", list_models),
        Route("/api/prompts", upload, methods=["POST"]),
        Route("/api/generate", generate, methods=["POST"]),
        Route("/api/results", results),
        Route("/api/runs/{run}", run_detail),
        Route("/files/{run}/{name}", run_file),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={MusegenError: failure, OSError: failure, Exception: failure})
    app.state.pool = pool
    return app


def _line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, separators=(",", ":")) + "\n").encode()
