"""Can a model keep a groove it is given? `musegen evaluate copy`.

Continuing a groove is mostly copying: the drum pattern, the bass figure and the chord rhythm of
the bars just heard. This test asks for nothing else. A *pattern* is 2 bars of a multi-track
piece: the first 2 bars from the first bar holding a note of a prepared corpus's pieces (the
test styles), or one of a few grooves built by hand (`musegen.music.grooves`: drums, a bass
figure and a chord rhythm, at several tempos). The prompt is the pattern played twice (4 bars), encoded with
the model's tokenizer; the model continues it for N bars with the normal sampler and its default
settings.

Each continuation bar is scored role by role against the prompt's bar of the same phase, as the
tokenizer gave it back (`musegen.metrics.copy_score`: 1 for an exact loop, 0 for silence).

Two rows bracket the models' (per tokenizer, since they go through its encoding):
- *ceiling*: the pattern itself looped on for the same bars, encoded and decoded like the
  prompt (1 wherever the tokenizer keeps a pattern as it is);
- *floor*: an unrelated pattern looped the same way (the one half the list of patterns away),
  scored against this one.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field, JsonValue
from tqdm import tqdm

from .. import schemas
from ..checkpoint import load_checkpoint
from ..device import resolve_device
from ..errors import ConfigError, DataError, MusegenError, TokenError
from ..generation.loop import generate
from ..generation.outputs import write_samples
from ..generation.prompt import load_prompt
from ..generation.settings import SampleSettings, nth_seed
from ..io import write_json
from ..metrics.copy_score import CopyScore, Loop
from ..metrics.metric import Span, nan_mean
from ..metrics.report import fmt, json_safe, write_table
from ..music.grooves import PATTERN_BARS, TPQ, Pattern, built_patterns, cut_pattern, looped
from ..music.notes import ROLES, NoteTable
from ..shards import Shards, resolve_split
from ..tokenizers.base import Tokenizer

if TYPE_CHECKING:
    from ..generation.prompt import Prompt

PROMPT_REPEATS = 2  # the prompt: the pattern played this many times
PROMPT_BARS = PATTERN_BARS * PROMPT_REPEATS
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a model's name is a folder of samples/


class CopyRow(BaseModel):
    model_config = schemas.OPEN
    name: schemas.Name
    scored: schemas.Count
    mean: float | None


class CopyModel(BaseModel):
    model_config = schemas.OPEN
    checkpoint: schemas.Name


class CopyResult(BaseModel):
    """copy.json of `evaluate copy`, as `evaluate groove-targets` reads it."""

    model_config = schemas.OPEN
    settings: dict[str, JsonValue]
    table: Annotated[list[CopyRow], Field(max_length=schemas.MAX_ITEMS)]
    models: dict[schemas.Name, CopyModel]


COPY_RESULT = schemas.Format("copy result", None, CopyResult)


# ---- patterns -------------------------------------------------------------------------------------


def corpus_patterns(data_dir: str | os.PathLike, split: str, limit: int) -> tuple[list[Pattern], dict[str, str]]:
    """Patterns from `limit` usable pieces of a prepared corpus's split (the first 2 bars from the
    piece's first bar holding a note, both bars playing), and why others were skipped. The first
    piece of each style (the folder of its name) comes first, so few pieces cover many styles."""

    shards = Shards(data_dir)
    found = resolve_split(shards.splits, split)
    if found is None:
        raise DataError(f"{data_dir}: no split {split!r} (has {', '.join(shards.splits) or 'none'})")
    tokenizer = shards.tokenizer
    if not tokenizer.roles:
        raise DataError(
            f"{data_dir}: a {tokenizer.kind} corpus has no track roles; the copy test needs a groove corpus"
        )
    patterns, skipped = [], {}
    names, pieces = shards.names(found), shards.pieces(found)
    for index in _by_style(names):
        if len(patterns) == limit:
            break
        name, ids = names[index], pieces[index]
        notes, why = tokenizer.decode_or_skip(ids)
        if notes is None:
            skipped[name] = why
            continue
        first = notes.first_bar()
        if any(not len(notes.onsets_in(first + k, 1)) for k in range(PATTERN_BARS)):
            skipped[name] = f"fewer than {PATTERN_BARS} playing bars from its first note"
            continue
        patterns.append(cut_pattern(notes, first, name, "corpus"))
    return patterns, skipped


def _by_style(names: list[str]) -> list[int]:
    """The pieces' indices: each style's first piece in split order, then each style's second, ..."""
    taken: dict[str, int] = {}
    rank = []
    for name in names:
        style = str(PurePosixPath(name).parent)
        rank.append(taken.get(style, 0))
        taken[style] = rank[-1] + 1
    return sorted(range(len(names)), key=lambda i: (rank[i], i))


# ---- scoring --------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """A pattern as one tokenizer takes it: the prompt to continue and the loop to score against."""

    pattern: Pattern
    prompt: "Prompt"
    loop: Loop


def prepare(tokenizer: Tokenizer, pattern: Pattern) -> Prepared:
    """The pattern's prompt (played PROMPT_REPEATS times, encoded) and its loop; DataError when
    the tokenizer does not keep its PROMPT_BARS bars."""

    prompt = load_prompt(tokenizer, looped(pattern, PROMPT_BARS).midi_bytes())
    if prompt.bars != PROMPT_BARS:
        raise DataError(f"the {tokenizer.kind} tokenizer keeps {prompt.bars} of its {PROMPT_BARS} prompt bars")
    return Prepared(pattern, prompt, Loop.of(prompt.piece, PROMPT_BARS - PATTERN_BARS, PATTERN_BARS, tokenizer.roles))


def loop_scores(tokenizer: Tokenizer, loop: Loop, pattern: Pattern, bars: int) -> dict[str, float]:
    """The scores of `pattern` played on past the prompt (encoded and decoded by the tokenizer),
    measured against `loop`: the ceiling for the loop's own pattern, a floor for another."""
    notes = tokenizer.decode(tokenizer.encode(looped(pattern, PROMPT_BARS + bars).midi_bytes()).ids)
    return loop.scores(notes, PROMPT_BARS, bars)


# ---- the test over checkpoints --------------------------------------------------------------------


COPY_SAMPLING = SampleSettings(bars=4, num_samples=2, seed=0)  # bars continued and scored; pattern i: seed + i


def checked(settings: SampleSettings) -> SampleSettings:
    """The copy test samples a number of bars from a given seed; every other bound is SampleSettings'."""
    if settings.length is not None or settings.bars is None or settings.seed is None:
        raise ConfigError("the copy test samples a number of bars from a given seed")
    settings.resolved()
    return settings


def evaluate_copy(
    checkpoints: dict[str, str | os.PathLike],
    out_dir: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    split: str = "test",
    pieces: int = 4,
    built: bool = True,
    settings: SampleSettings = COPY_SAMPLING,
    device: str = "auto",
    threads: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """The copy test of every checkpoint ({name: folder}) on the same patterns, beside the ceiling
    and floor of each tokenizer. Writes copy.md / copy.csv (the table), copy.json (settings,
    every score, the table) and samples/<model>/ (the continuations as MIDI)."""

    settings = checked(settings)
    if pieces < 0:
        raise ConfigError(f"--pieces must be at least 0, got {pieces}")
    patterns, skipped = corpus_patterns(data_dir, split, pieces) if data_dir is not None and pieces else ([], {})
    patterns += built_patterns() if built else []
    if not patterns:
        raise ConfigError("no patterns to continue: give --data with a groove corpus (and --pieces > 0), or --built")
    device = resolve_device(device)
    out_dir = Path(out_dir)
    models, baselines, prepared_by = {}, {}, {}
    for name in checkpoints:  # each name is a folder under samples/: refused before anything is written
        if not MODEL_NAME.fullmatch(name):
            raise ConfigError(f"model name {name[:80]!r}: use letters, digits, '.', '_' and '-', not starting with '.'")
    for name, folder in checkpoints.items():
        model, tokenizer, _, _ = load_checkpoint(folder, device=device)
        if not tokenizer.roles:
            raise ConfigError(
                f"{folder}: a {tokenizer.kind} model plays no track roles; the copy test needs a "
                "multi-track (groove) model"
            )
        key = tokenizer.kind + repr(sorted(tokenizer.settings().items()))
        if key not in prepared_by:
            prepared_by[key] = _prepare_all(tokenizer, patterns, skipped)
            baselines[key] = (tokenizer.kind, _baselines(tokenizer, prepared_by[key], settings.bars))
        rows, started = [], time.perf_counter()
        for i, item in enumerate(
            tqdm(prepared_by[key], desc=f"copy test: {name}", unit="pattern", disable=not progress)
        ):
            samples, _ = generate(
                model,
                tokenizer,
                item.prompt,
                replace(settings, seed=nth_seed(settings.seed, i)),
                device=device,
                progress=False,
                threads=threads,
            )
            write_samples(samples, tokenizer, item.prompt, out_dir / "samples" / name, _stem(item.pattern.name))
            for j, sample in enumerate(samples):
                try:
                    notes = tokenizer.decode(sample.ids)
                except TokenError:  # nothing usable written: no credit
                    notes = NoteTable.empty(TPQ)
                span = Span(notes, item.prompt.bars, settings.bars, {"loop": item.loop})
                rows.append(_row(item.pattern, j, CopyScore().compute(span)))
        models[name] = {
            "checkpoint": str(folder),
            "tokenizer": tokenizer.kind,
            "rows": rows,
            "seconds": round(time.perf_counter() - started, 1),
        }
    return _report(out_dir, patterns, skipped, models, baselines, settings, data_dir, split)


def _stem(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _row(pattern: Pattern, sample: int, scores: dict[str, float]) -> dict[str, Any]:
    return {"pattern": pattern.name, "source": pattern.source, "sample": sample} | scores


def _prepare_all(tokenizer: Tokenizer, patterns: list[Pattern], skipped: dict[str, str]) -> list[Prepared]:
    """Every pattern the tokenizer takes; the others go to `skipped` with the reason."""
    prepared = []
    for pattern in patterns:
        try:
            prepared.append(prepare(tokenizer, pattern))
        except MusegenError as exc:
            skipped[f"{pattern.name} ({tokenizer.kind})"] = str(exc).splitlines()[0]
    return prepared


def _baselines(tokenizer: Tokenizer, prepared: list[Prepared], bars: int) -> dict[str, list[dict[str, Any]]]:
    """Ceiling rows (each pattern's own loop) and floor rows (the pattern half the list away)."""
    n = len(prepared)
    ceiling = [_row(p.pattern, 0, loop_scores(tokenizer, p.loop, p.pattern, bars)) for p in prepared]
    floor = (
        [
            _row(p.pattern, 0, loop_scores(tokenizer, p.loop, prepared[(i + max(1, n // 2)) % n].pattern, bars))
            for i, p in enumerate(prepared)
        ]
        if n > 1
        else []
    )
    return {"ceiling": ceiling, "floor": floor}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean per role over the rows that score it; `mean`: the mean over rows of each row's mean
    over its scored roles, also per source (`mean, corpus`, `mean, built`); for model rows also
    `by_bar`, that mean for each continued bar."""
    per_row = [nan_mean([r[role] for role in ROLES if role in r]) for r in rows]
    out: dict[str, Any] = {role: nan_mean([r[role] for r in rows if role in r]) for role in ROLES}
    out["mean"] = nan_mean(per_row)
    for source in ("corpus", "built"):
        out[f"mean, {source}"] = nan_mean([v for v, r in zip(per_row, rows) if r["source"] == source])
    if rows and "by_bar" in rows[0]:
        out["by_bar"] = [nan_mean(bar) for bar in zip(*(r["by_bar"] for r in rows))]
    return out


def _report(
    out_dir: Path,
    patterns: list[Pattern],
    skipped: dict[str, str],
    models: dict,
    baselines: dict,
    settings: SampleSettings,
    data_dir,
    split: str,
) -> dict[str, Any]:
    several = len({kind for kind, _ in baselines.values()}) > 1
    table = []
    for name, run in models.items():
        table.append({"name": name, "scored": len(run["rows"]), **summary(run["rows"]), "seconds": run["seconds"]})
    for kind, rows in baselines.values():
        for label, part in (
            ("ceiling: the prompt's own loop", rows["ceiling"]),
            ("floor: an unrelated pattern's loop", rows["floor"]),
        ):
            if part:
                table.append(
                    {
                        "name": label + (f" ({kind})" if several else ""),
                        "scored": len(part),
                        **summary(part),
                        "seconds": math.nan,
                    }
                )
    columns = ["scored", *ROLES, "mean", "mean, corpus", "mean, built", "seconds"]
    cells = [
        [r["name"], str(r["scored"])] + [fmt(r[c], 2) for c in columns[1:-1]] + [fmt(r["seconds"], 1)] for r in table
    ]
    corpus = sum(p.source == "corpus" for p in patterns)
    note = (
        f"{len(patterns)} patterns ({corpus} from {data_dir or '-'} split {split!r}, one piece a style first; "
        f"{len(patterns) - corpus} built), each played {PROMPT_REPEATS} times as the prompt; {settings.bars} bars "
        f"continued, {settings.num_samples} samples a pattern, the tokenizer's sampling defaults"
        + (f", the suffix cache at {settings.cache:g}" if settings.cache is not None else "")
        + ". Scores: per role, "
        "the F1 of each bar's (onset, pitch) set against the prompt bar of the same phase, averaged over bars "
        "(1: an exact loop; 0: silence). scored: patterns x samples; seconds: sampling and scoring. "
        "Definitions: docs/evaluation.md."
    )
    note += (
        f" Models' mean by continued bar (1..{settings.bars}): "
        + "; ".join(f"{r['name']} " + " ".join(fmt(v, 2) for v in r["by_bar"]) for r in table if "by_bar" in r)
        + "."
    )
    write_table(out_dir, "copy", ["model"] + columns, cells, note)
    result = {
        "settings": {
            "sample": settings.record(),
            "data": str(data_dir) if data_dir else None,
            "split": split,
            "prompt_bars": PROMPT_BARS,
            "pattern_bars": PATTERN_BARS,
        },
        "patterns": [p.name for p in patterns],
        "skipped": skipped,
        "table": table,
        "models": models,
        "baselines": {kind: rows for kind, rows in baselines.values()},
    }
    write_json(out_dir / "copy.json", json_safe(result))
    return result | {"files": {kind: str(out_dir / f"copy.{kind}") for kind in ("md", "csv", "json")}}
