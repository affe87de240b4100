"""One generation run of the studio, done in a worker process (workers.py): the prompt is continued
and written as `musegen sample` writes it (musegen.generation.batch.sample_prompt), and while the
samples are drawn their notes so far are reported a few times a second; what the page is told of
it (run_events), a failure in one line (error_message)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Protocol

import numpy as np
from pydantic import BaseModel, Field, ValidationError, model_validator

from .. import mirex, schemas
from ..errors import ConfigError, MusegenError, ResourceError
from ..generation.batch import Loaded, sample_prompt, write_set
from ..generation.loop import Sample
from ..generation.prompt import load_prompt
from ..generation.settings import SampleSettings
from ..io import is_disk_full
from ..music.constants import MAX_PROMPT_BARS
from ..music.meter import signature_changes
from ..music.midi import load_score
from ..music.notes import NoteTable
from ..tokenizers.base import Tokenizer
from .models import Models, OnDemand
from .runs import notes_delta

MAX_BARS = 64  # a page's run: long enough to listen to, short enough to wait for
MAX_SAMPLES = 8
REPORT_EVERY = 0.1  # seconds between two reports of the notes drawn so far
# POP909's longest song has ~4,000 notes; the red team's 200 dense bars (153,600) took minutes to
# encode and, for 8 samples, half an hour to feed to the model
MAX_PROMPT_NOTES = 20_000
# beyond 3 every token is nearly as likely as any other (noise, not music); below 0.1 each is the
# most likely one alone: the command line's wider bounds (SampleSettings) are for experiments
TEMPERATURE_RANGE = (0.1, 3.0)
# each request field by its label in the page, which its messages use; and the settings' fields
LABELS = {"model": "Model", "prompt": "Prompt", "bars": "Bars", "samples": "Samples", "seed": "Seed"}
LABELS |= {"temperature": "Temperature", "top_p": "Top-p", "tempo": "Tempo"}
SETTING_LABELS = {**LABELS, "num_samples": LABELS["samples"]}
# an absolute path in a message: the page is told the file's name only, not where the server keeps it
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:[^\s/'\"]+/)+(?=[^\s/'\"])")


def error_message(exc: BaseException) -> str:
    """One line for the page: a MusegenError's own, a full disk, or an internal error by type."""
    if isinstance(exc, MusegenError):
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return ABSOLUTE_PATH.sub("", line)
    if is_disk_full(exc):
        return "disk full: the studio's --out folder has no space left"
    return f"internal error: {type(exc).__name__} (see the studio's console)"


class Stopped(Exception):
    """The page went away or pressed Stop: the run ends. `summary`: what a Stop kept of it (the
    bars drawn so far, written as a finished run is), or None."""

    def __init__(self, summary: dict[str, Any] | None = None):
        super().__init__()
        self.summary = summary


class PageRequest(BaseModel):
    """A request body of the page: a field left empty (null or "") takes its default. `labels`
    name the fields as the page does, for `problem`'s messages."""

    model_config = schemas.STRICT
    what: ClassVar[str] = "a request"
    labels: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _empty_fields_take_defaults(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None and v != ""} if isinstance(data, dict) else data

    @classmethod
    def problem(cls, exc: ValidationError) -> str:
        """The first thing wrong with a body of this request, in the page's words: the field by its
        label, a bounded number with both its bounds where the field has them."""
        error = exc.errors(include_url=False)[0]
        loc, kind = error["loc"], error["type"]
        if not loc:
            return f"{cls.what} must be a JSON object"
        field = cls.model_fields.get(str(loc[0])) if len(loc) == 1 else None
        name = cls.labels.get(str(loc[0]), str(loc[0])) + "".join(f"[{part}]" for part in loc[1:])
        got = repr(error.get("input"))[:60]
        special = cls._problem_of(kind, name, got)
        if special:
            return special
        if kind in ("greater_than_equal", "less_than_equal"):
            limits = field.metadata if field else ()
            bounds = {k: getattr(m, k) for m in limits for k in ("ge", "le") if hasattr(m, k)}
            if len(bounds) == 2:
                return f"{name} must be within {bounds['ge']}..{bounds['le']} in the studio, got {got}"
            bound = error["ctx"].get("ge", error["ctx"].get("le"))
            return f"{name} must be {bound} or {'more' if kind == 'greater_than_equal' else 'less'}, got {got}"
        if kind in ("int_type", "int_from_float"):
            return f"{name} must be a whole number, got {got}"
        if kind == "float_type":
            return f"{name} must be a number, got {got}"
        if kind == "string_type":
            return f"{name} must be text, got {got}"
        return f"{name}: {error['msg'][0].lower() + error['msg'][1:]}"[:200]

    @classmethod
    def _problem_of(cls, kind: str, name: str, got: str) -> str | None:
        """A request's own words for an error of this `kind` (pydantic's), or None for `problem`'s."""
        return None


class StudioRequest(PageRequest):
    """The body of the studio's generation request; temperature, top_p, seed and tempo are bounded
    by SampleSettings, which the request becomes."""

    what: ClassVar[str] = "a generation request"
    labels: ClassVar[dict[str, str]] = LABELS

    model: schemas.Name = ""  # one of the studio's models (checked by its list)
    prompt: schemas.Name | None = None  # a prompt id of the session (checked by the store's pattern)
    # the prompt's bars from..to (1-based, as the page draws them; default: all of it, as None says)
    prompt_from: Annotated[int, Field(ge=1, le=MAX_PROMPT_BARS)] = 1
    prompt_to: Annotated[int, Field(ge=1, le=MAX_PROMPT_BARS)] = None
    # or a sample of an earlier run of the session, continued whole ("Extend"), by its run and index
    extend_run: schemas.Name | None = None
    extend_sample: Annotated[int, Field(ge=0, le=MAX_SAMPLES - 1)] = 0
    bars: Annotated[int, Field(ge=1, le=MAX_BARS)] = 8
    samples: Annotated[int, Field(ge=1, le=MAX_SAMPLES)] = 1
    seed: int | None = None
    temperature: Annotated[float | None, Field(ge=TEMPERATURE_RANGE[0], le=TEMPERATURE_RANGE[1])] = None
    top_p: float | None = None
    tempo: Annotated[str, Field(max_length=32)] | None = None  # keep, free or BPM (SampleSettings.tempo)


STUDIO_REQUEST = schemas.Format("studio request", None, StudioRequest)


@dataclass
class Request:
    """A checked request (`StudioRequest` holds the defaults and bounds), its prompt as a file: an
    uploaded prompt's, or an earlier sample's MIDI file, which an extension continues as
    `musegen sample --prompt <that file>` would."""

    model: str
    prompt: Path | None
    prompt_from: int
    prompt_to: int | None
    bars: int
    temperature: float | None
    top_p: float | None
    samples: int
    seed: int | None
    tempo: str | None

    @classmethod
    def parse(
        cls, body: bytes, prompt_of: Callable[[str], Path], sample_of: Callable[[str, int], tuple[Path, str]]
    ) -> "Request":
        """A request from the page's JSON text, checked against its schema (`studio request`); a
        value that breaks it is a FormatError of one line. `prompt_of` finds the prompt id's file,
        `sample_of` an earlier run's sample: its MIDI file and the name of the model that made it
        (an extension is sampled by that model, whatever the request names)."""
        checked = schemas.loads(body, STUDIO_REQUEST, "the generation request", explain=StudioRequest.problem)
        if checked.prompt and checked.extend_run:
            raise ConfigError("a request continues either a prompt or an earlier sample (extend_run), not both")
        if checked.extend_run and (checked.prompt_from > 1 or checked.prompt_to):
            raise ConfigError("an extension continues the whole sample: prompt_from and prompt_to are not used")
        first, last = checked.prompt_from, checked.prompt_to
        if last and last < first:
            raise ConfigError(f"prompt_to must be prompt_from ({first}) or later, got {last}")
        fields = checked.model_dump(exclude={"prompt", "extend_run", "extend_sample"})
        if checked.extend_run:
            prompt, fields["model"] = sample_of(checked.extend_run, checked.extend_sample)
        else:
            prompt = prompt_of(checked.prompt) if checked.prompt else None
        return cls(prompt=prompt, **fields)

    def settings(self) -> SampleSettings:
        tempo = {"tempo": self.tempo} if self.tempo else {}  # else SampleSettings' own default
        return SampleSettings(
            bars=self.bars,
            temperature=self.temperature,
            top_p=self.top_p,
            num_samples=self.samples,
            seed=self.seed,
            prompt_from=self.prompt_from,
            prompt_bars=self.prompt_to - self.prompt_from + 1 if self.prompt_to else None,
            **tempo,
        )


def notes_of(table: NoteTable) -> list[list[int]]:
    """[start, end, pitch, track, drum (1 for a drum track's note, else 0), velocity] of every
    note, by onset (then end, pitch, track)."""
    drums = np.array([t.is_drum for t in table.tracks] or [False], dtype=np.int64)
    rows = np.stack([table.start, table.end, table.pitch, table.track, drums[table.track], table.velocity], 1)
    return rows[np.lexsort(rows.T[::-1])].tolist()


def tracks_of(table: NoteTable) -> list[list[Any]]:
    """[program, drum (1 or 0), instrument name (Track.instrument)] of every track: the roll's
    legend names the instruments, the page's synthesiser reads the first two."""
    return [[t.program, int(t.is_drum), t.instrument] for t in table.tracks]


def meters_of(table: NoteTable) -> list[list[int]]:
    """[tick, numerator, denominator] of each time signature, 4/4 from tick 0 until the first: the
    page draws its bar lines from them."""
    return [list(change) for change in signature_changes(table.time_signatures)]


def as_drawn(table: NoteTable, tokenizer: Tokenizer | None) -> NoteTable:
    """The piece as the page draws it: the tracks of one instrument of a single-stream tokenizer
    (REMI's, whose decoder splits a piano only so that overlapping notes of one pitch survive in
    MIDI) as one track; a tokenizer with tracks of their own keeps them (song's melody, bridge
    and piano). Without a tokenizer, as written."""
    if tokenizer is None or tokenizer.roles or len(table.tracks) < 2:
        return table
    instruments = [(t.program, t.is_drum) for t in table.tracks]
    first: dict[tuple[int, bool], int] = {}
    lane = np.array([first.setdefault(key, len(first)) for key in instruments], dtype=np.int64)
    tracks = [table.tracks[instruments.index(key)] for key in first]
    return replace(table, track=lane[table.track], tracks=tracks)


def piece_view(table: NoteTable) -> dict[str, Any]:
    """What the page draws of a piece besides its notes: its tracks and meters."""
    return {"tracks": tracks_of(table), "meters": meters_of(table)}


def prompt_view(models: Models, model: str, path: Path) -> dict[str, Any]:
    """What the page draws of a prompt: its notes as the model's tokenizer reads them. A prompt of
    more than MAX_PROMPT_NOTES notes is refused before it is encoded."""
    tokenizer = models.tokenizer(model)
    if path.suffix == ".json":
        notes = len(mirex.read_prompt(path))
    else:
        notes = sum(len(track.notes) for track in load_score(path).tracks)
    if notes > MAX_PROMPT_NOTES:
        raise ResourceError(f"{path.name}: {notes:,} notes; a prompt in the studio has at most {MAX_PROMPT_NOTES:,}")
    prompt = load_prompt(tokenizer, path, grid=SampleSettings().grid)  # the grid the page's runs use
    piece = as_drawn(prompt.piece, tokenizer)
    return {"notes": notes_of(piece), **piece_view(piece), "ticks_per_beat": piece.tpq, "bars": int(prompt.bars)}


def run_view(folder: Path, summary: dict[str, Any], tokenizer: Tokenizer | None) -> list[dict[str, Any]]:
    """Each sample of a finished run as the page draws and plays it: its notes (from its MIDI
    file), its tracks (tracks_of; as_drawn by the run's `tokenizer`) and meters, its tempos [tick,
    quarter notes per minute] (what the page's synthesiser needs besides the notes), where the
    prompt ends in ticks, and its files."""
    views = []
    for record in summary["samples"]:
        score = load_score(folder / record["midi"])
        table = as_drawn(NoteTable.from_score(score, by_role=False), tokenizer)
        views.append(
            {
                "index": record["index"],
                "notes": notes_of(table),
                "ticks_per_beat": table.tpq,
                **piece_view(table),
                "tempos": [[tick, qpm] for tick, qpm in table.tempos],
                "prompt_end": table.prompt_end(),
                "files": {k: record[k] for k in ("midi", "json") if record.get(k)},
            }
        )
    return views


def mirex_generation(midi_path: Path) -> dict[str, Any]:
    """A sample's continuation as MIREX task JSON, for a sample whose prompt was a MIDI file (a
    task prompt's run has its own, written by `musegen sample`): the notes from the prompt-end
    marker on, in 16ths from the piece's start."""
    return {"generation": mirex.generation(NoteTable.read(midi_path, by_role=False).after_prompt(), 0)}


class StopFlag(Protocol):
    """What a run reads of its page's Stop (runs.Stop, or its copy in a worker process)."""

    keeps: bool

    def is_set(self) -> bool: ...


def run_events(
    models: Models | OnDemand,
    request: Request,
    run: str,
    out_dir: Path,
    send: Callable[[dict[str, Any]], None],
    stop: StopFlag,
) -> None:
    """Run `request` into `out_dir` (run `run`), each event for its page given to `send`: started,
    notes while sampling, then done, stopped (with what Stop kept) or error (one line)."""
    try:
        send({"event": "started"})
        summary = generate_run(models, request, out_dir, lambda e: send({"event": "notes", **e}), stop)
        tokenizer = models.shared(request.model)[1]
        send({"event": "done", "run": run, "samples": run_view(out_dir, summary, tokenizer), "stats": summary["stats"]})
    except Stopped as stopped:
        kept, tokenizer = stopped.summary, models.shared(request.model)[1]
        views = {}
        if kept:
            views = {"run": run, "samples": run_view(out_dir, kept, tokenizer), "bars": kept["stopped_at_bars"]}
        send({"event": "stopped", **views})
    except Exception as exc:  # every failure becomes one line in the page
        send({"event": "error", "error": error_message(exc)})


def generate_run(
    models: Models | OnDemand,
    request: Request,
    out_dir: Path,
    report: Callable[[dict[str, Any]], None],
    stop: StopFlag,
) -> dict[str, Any]:
    """Continue `request.prompt` into `out_dir`; `report` gets {"progress", "samples": a delta per
    sample (runs.notes_delta) from the notes reported before, with its tracks and meters} while
    sampling. Ends with Stopped as soon as `stop` is set, while the prompt is fed to the model
    too; when the page pressed Stop (runs.Stop.keeps) the bars drawn so far are written first, if
    they hold a note. Returns the run's summary (as `musegen sample` writes it)."""

    def go_on() -> None:
        if stop.is_set():
            raise Stopped

    go_on()  # a run whose page left while it waited is not started
    model, tokenizer, weights = models.shared(request.model)
    settings = request.settings().resolved(tokenizer, SETTING_LABELS)
    prompt = load_prompt(tokenizer, request.prompt, settings.prompt_bars, settings.grid, settings.prompt_from)
    last, sent, started = 0.0, [[] for _ in range(settings.num_samples)], time.perf_counter()
    stem = request.prompt.stem if request.prompt else "sample"
    loaded = Loaded(model, tokenizer, models.folders[request.model], "cpu", weights=weights)

    def kept(rows: list[list[int]]) -> dict[str, Any] | None:
        """The rows drawn so far written as the run's set, unless they hold no note of their own."""
        grammar, start = tokenizer.grammar(), len(prompt.ids)
        pieces = [tokenizer.decode(grammar.repair(ids)[0], prompt.meta) for ids in rows]
        before = len(prompt.piece) if prompt.piece is not None else 0
        if not any(len(piece) > before for piece in pieces):
            return None
        samples = [Sample(np.array(ids, dtype=np.int64), start, len(ids) - start, False, None) for ids in rows]
        new, seconds = sum(s.new_tokens for s in samples), time.perf_counter() - started
        stats = {"seconds": round(seconds, 3), "new_tokens": new, "tokens_per_second": round(new / seconds, 1)}
        bars = max(len(tokenizer.bar_starts(ids)) for ids in rows) - (prompt.bars or 0)
        return write_set(
            loaded, out_dir, stem, settings, request.prompt, prompt, samples, stats, stopped=True, stopped_at_bars=bars
        )

    def on_step(rows: list[list[int]]) -> None:
        nonlocal last
        if stop.is_set():
            raise Stopped(kept([list(ids) for ids in rows]) if stop.keeps else None)
        now = time.monotonic()
        if now - last < REPORT_EVERY and last:
            return
        last = now
        drawn = min(len(tokenizer.bar_starts(ids)) for ids in rows) - (prompt.bars or 0)
        try:
            pieces = [as_drawn(tokenizer.decode(ids, prompt.meta), tokenizer) for ids in rows]
        except MusegenError:  # a note cut open by the step: shown at the next report
            return
        samples = [notes_of(piece) for piece in pieces]
        deltas = [
            {**notes_delta(before, notes), **piece_view(piece)} for before, notes, piece in zip(sent, samples, pieces)
        ]
        sent[:] = samples
        report({"progress": max(0.0, min(1.0, drawn / settings.bars)), "samples": deltas})

    return sample_prompt(
        loaded, out_dir, stem, settings, request.prompt, on_step=on_step, prompt=prompt, on_ingest=go_on
    )
