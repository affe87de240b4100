"""Where the studio keeps what users give and generate: `<out>/<session>/prompts/<id>/<file>` for
prompts and `<out>/<session>/<run>/` for runs, each run folder holding what `musegen sample`
writes. Every name a request carries is matched against a pattern before it becomes a path, so
no request reaches outside its session's folder."""

from __future__ import annotations

import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from .. import schemas
from ..errors import InputFileError, MusegenError
from ..generation.outputs import SAMPLE_SUMMARY
from ..io import write_bytes
from ..music.midi import MAX_MIDI_BYTES, MIDI_SUFFIXES

SESSION = re.compile(r"[0-9a-f]{32}")  # made by the page (crypto.randomUUID without dashes)
RUN = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")  # sorts by time
PROMPT_ID = re.compile(r"[0-9a-f]{12}")
FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # no separators, no leading dot
PROMPT_SUFFIXES = (*MIDI_SUFFIXES, ".json")
MAX_UPLOAD_BYTES = MAX_MIDI_BYTES  # a MIREX task JSON of that size holds far more notes than a prompt needs
MAX_RESULTS = 200  # runs listed per session, newest first


class RequestError(MusegenError):
    """A request that names something that is not there or may not be used."""


def _matched(pattern: re.Pattern, value: str, what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise RequestError(f"not a valid {what}: {value!r}"[:200])
    return value


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)

    def session(self, session: str) -> Path:
        return self.root / _matched(SESSION, session, "session id")

    def save_prompt(self, session: str, filename: str, data: bytes) -> Path:
        """Keep an uploaded prompt under a fresh id; its name is reduced to safe characters."""
        path = Path(filename or "prompt.mid")
        if path.suffix.lower() not in [s.lower() for s in PROMPT_SUFFIXES]:
            raise InputFileError(f"{path.name}: not a MIDI file (.mid, .midi) or a MIREX task .json")
        if len(data) > MAX_UPLOAD_BYTES:
            raise InputFileError(f"{path.name}: more than the {MAX_UPLOAD_BYTES:,} bytes a prompt may have")
        if not data:
            raise InputFileError(f"{path.name}: the file is empty")
        stem = re.sub(r"[^A-Za-z0-9_-]+", "_", path.stem).strip("_")[:64] or "prompt"
        folder = self.session(session) / "prompts" / secrets.token_hex(6)
        folder.mkdir(parents=True)
        target = folder / f"{stem}{path.suffix.lower()}"
        try:
            write_bytes(target, data)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return target

    def prompt(self, session: str, prompt_id: str) -> Path:
        folder = self.session(session) / "prompts" / _matched(PROMPT_ID, prompt_id, "prompt id")
        files = sorted(folder.glob("*")) if folder.is_dir() else []
        if not files:
            raise RequestError(f"no prompt {prompt_id} in this session (upload it again)")
        return files[0]

    def new_run(self, session: str) -> tuple[str, Path]:
        """A run id and its folder (made by `musegen sample`'s writer when the run completes)."""
        now = time.time()
        # the second, then its milliseconds in 3 hex digits and 3 random ones: runs of one second
        # (a warm worker's short runs) still sort by when they started
        run = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f"-{int(now % 1 * 1000):03x}{secrets.token_hex(2)[:3]}"
        return run, self.session(session) / run

    def run(self, session: str, run: str) -> Path:
        folder = self.session(session) / _matched(RUN, run, "run id")
        if not folder.is_dir():
            raise RequestError(f"no run {run} in this session")
        return folder

    def file(self, session: str, run: str, name: str) -> Path:
        path = self.run(session, run) / _matched(FILE, name, "file name")
        if not path.is_file():
            raise RequestError(f"no file {name} in run {run}")
        return path

    def summary(self, session: str, run: str) -> dict[str, Any]:
        """A run's summary as `musegen sample` wrote it (`<stem>.json`), with the run id."""
        folder = self.run(session, run)
        for path in sorted(folder.glob("*.json")):
            try:
                summary = schemas.read(path, SAMPLE_SUMMARY)
            except MusegenError:  # a MIREX continuation beside it, not the summary
                continue
            return {"run": run, "stem": path.stem, **summary.model_dump(mode="json", by_alias=True)}
        raise RequestError(f"run {run} has no summary (it did not complete)")

    def results(self, session: str) -> list[dict[str, Any]]:
        """The session's completed runs, newest first."""
        folder = self.session(session)
        runs = (
            sorted((p.name for p in folder.iterdir() if RUN.fullmatch(p.name)), reverse=True) if folder.is_dir() else []
        )
        found = []
        for run in runs:
            if len(found) == MAX_RESULTS:
                break
            try:
                found.append(self.summary(session, run))
            except MusegenError:
                continue
        return found
