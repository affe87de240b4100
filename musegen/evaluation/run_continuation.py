"""What a model's continuations look like beside the real ones: `musegen evaluate continuation`.

The protocol follows the MIREX 2025 piano continuation task (a pickup bar and 4 bars in, 12 bars
out, 4/4 on a 16th-note grid). For each held-out piece of a prepared corpus, its *pickup bar* P is
its first bar holding a note; the prompt is the piece's tokens before bar K = P + 1 + N (cut as
`musegen sample --prompt-bars` cuts); the model writes S continuations; the *span* is bars
K .. K + M - 1. Three kinds of span are measured: the model's, the real piece's (the reference,
a ceiling), and another piece's span after its own prompt (the floor: real music that ignores
this prompt; the piece half the list of usable pieces away, so that in corpora sorted by style it
is seldom of the same style). Pieces whose last note starts before bar K + M - 1 are too short
and skipped. Instead of a prepared corpus, a folder of MIDI files can give the pieces (real music
in no corpus), each encoded by the model's tokenizer.

Every span is measured by `SPAN_METRICS` (`musegen.metrics.span`: the span and role metrics;
`musegen.metrics.style`: the style similarity per quarter against the whole real piece, for
pieces with more than one track role); definitions in those modules and docs/evaluation.md.
The two-sample test (`musegen.metrics.two_sample`) asks whether a classifier tells each kind of
span's bars, and the prompt copied, from the real ones.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from pydantic import BaseModel, JsonValue
from tqdm import tqdm

from .. import schemas
from ..checkpoint import load_checkpoint
from ..device import resolve_device
from ..errors import ConfigError, DataError, MusegenError, TokenError
from ..generation.loop import generate
from ..generation.outputs import write_samples
from ..generation.prompt import encode_on_grid, prompt_from_ids
from ..generation.settings import SampleSettings, nth_seed
from ..io import write_json, write_text
from ..metrics.metric import QUARTERS, STATISTICS, Metric, Span, measure, nan_median
from ..metrics.report import fmt, json_safe, plot_boxes, plot_quarters, write_table, write_two_sample
from ..metrics.span import RoleMetrics, SpanMetrics, pitch_classes
from ..metrics.style import StyleQuarters, reference_profiles
from ..metrics.two_sample import (
    CONTINUATION_NOTE,
    Prompt,
    bar_features,
    continuation_comparisons,
    copied_prompt,
)
from ..music.midi import MIDI_SUFFIXES
from ..music.notes import NoteTable
from ..shard_midi import piece_stem
from ..shards import INDEX, Shards
from ..tokenizers.base import Tokenizer

SPAN_METRICS: tuple[Metric, ...] = (SpanMetrics(), RoleMetrics(), StyleQuarters())


# ---- the protocol over a prepared split -----------------------------------------------------------


def _default_sample() -> SampleSettings:
    return SampleSettings(bars=12, num_samples=2, seed=0)


@dataclass
class ContinuationSettings:
    """What `musegen evaluate continuation` does per piece. `sample` is how each piece is continued:
    its `bars` are generated and measured, `num_samples` per piece, piece i (in the order of the
    usable pieces) sampled with seed `nth_seed(sample.seed, i)`; sampling values None are the paper's."""

    prompt_bars: int = 4  # after the pickup bar
    sample: SampleSettings = field(default_factory=_default_sample)
    by_quarter: bool = False  # also measure each quarter of the span (how a long continuation holds up)

    def checked(self) -> ContinuationSettings:
        """The protocol's own bounds, then every sampling bound (SampleSettings), before a model is loaded."""
        s = self.sample
        if self.prompt_bars < 1:
            raise ConfigError(f"--prompt-bars must be at least 1, got {self.prompt_bars}")
        if s.num_samples < 1:
            raise ConfigError(f"--samples-per-piece must be at least 1, got {s.num_samples}")
        if s.length is not None or s.bars is None or s.seed is None:
            raise ConfigError("the continuation protocol samples a number of bars from a given seed")
        s.resolved()
        if self.by_quarter and s.bars % QUARTERS:
            raise ConfigError(f"--by-quarter needs --bars to be a multiple of {QUARTERS}, got {s.bars}")
        return self

    def record(self) -> dict[str, Any]:
        """The settings as run.json holds them: the protocol's and every sampling option's."""
        sample = self.sample.record()
        sample["samples_per_piece"] = sample.pop("num_samples")
        for decided_here in ("length", "prompt_bars", "prompt_from"):
            del sample[decided_here]
        return {"prompt_bars": self.prompt_bars, **sample, "by_quarter": self.by_quarter}


@dataclass
class Piece:
    """A held-out piece the protocol can use: its tokens, notes and where its span begins."""

    name: str
    ids: np.ndarray
    notes: NoteTable
    span_start: int  # bar K: the pickup bar + 1 + prompt bars

    def context(self) -> dict[str, Any]:
        """What a span continuing this piece is compared with: its prompt's pitch classes; for a
        multi-track piece its roles, and the style profiles of those the prompt plays."""
        prompt = self.notes.onsets_in(0, self.span_start)
        context: dict[str, Any] = {"prompt_classes": pitch_classes(prompt.pitched())}
        if len(roles := sorted(set(self.notes.role.tolist()))) > 1:
            context.update(roles=roles, reference=reference_profiles(self.notes, played=set(prompt.role.tolist())))
        return context


MIDI_SPLIT = "midi"  # the split name of a folder of MIDI files


def split_pieces(
    data_dir: str | os.PathLike, split: str, tokenizer: Tokenizer, grid: str = "file"
) -> tuple[str, list[str], list[np.ndarray], dict[str, str]]:
    """(split, piece names, their ids, unreadable pieces with why) of a prepared corpus's split,
    or of every MIDI file under a folder without a shard index (real music that is not in any
    corpus; each file put on the grid `grid` names and encoded by the model's tokenizer, named by
    its path in the folder; `split` is then not used). A corpus is on its grid: `auto` keeps it."""

    folder = Path(data_dir)
    if folder.is_dir() and not (folder / INDEX).exists():
        files = sorted(p for p in folder.rglob("*") if p.suffix in MIDI_SUFFIXES and p.is_file())
        if not files:
            raise DataError(f"{folder}: neither a prepared corpus ({INDEX}) nor a folder of MIDI files")
        names, ids, unreadable = [], [], {}
        for path in files:
            name = str(path.relative_to(folder).with_suffix(""))
            try:
                ids.append(np.asarray(encode_on_grid(tokenizer, path, grid).ids, dtype=np.int64))
                names.append(name)
            except MusegenError as exc:
                unreadable[name] = f"cannot encode: {str(exc).splitlines()[0]}"
        return MIDI_SPLIT, names, ids, unreadable
    if grid == "track":  # auto keeps a corpus as it is
        raise ConfigError(
            "--grid track: a prepared corpus's tokens are on their grid already; it is for a folder of MIDI files"
        )
    shards = Shards(folder)
    split, ids = shards.pieces_for(split, tokenizer)
    return split, shards.names(split), ids, {}


def usable_pieces(
    tokenizer: Tokenizer, names: list[str], pieces: list[np.ndarray], settings: ContinuationSettings
) -> tuple[list[Piece], dict[str, str]]:
    """The pieces long enough for the protocol, and why each other piece was skipped."""
    usable, skipped = [], {}
    for name, ids in zip(names, pieces):
        notes, why = tokenizer.decode_or_skip(ids)
        if notes is None:
            skipped[name] = why
            continue
        span_start, bars = notes.first_bar() + 1 + settings.prompt_bars, settings.sample.bars
        if notes.last_onset_bar() < span_start + bars - 1 or len(tokenizer.bar_starts(ids)) <= span_start:
            skipped[name] = (
                f"too short: {notes.last_onset_bar() + 1} bars, the protocol needs "
                f"{span_start + bars} (pickup bar at {notes.first_bar()})"
            )
            continue
        usable.append(Piece(name, np.asarray(ids), notes, span_start))
    return usable, skipped


def continue_piece(
    model,
    tokenizer: Tokenizer,
    piece: Piece,
    floor: Piece | None,
    index: int,
    settings: ContinuationSettings,
    device,
    threads: int | None,
    samples_dir: Path,
    metrics: Sequence[Metric] = SPAN_METRICS,
) -> dict[str, Any]:
    """Sample one piece's continuations, write them as MIDI, and measure them beside the real span
    and the floor: the piece's record for pieces.jsonl."""

    prompt = prompt_from_ids(tokenizer, piece.ids, bars=piece.span_start, source=piece.name)
    seed = nth_seed(settings.sample.seed, index)
    sample_settings = replace(settings.sample, seed=seed)
    samples, stats = generate(model, tokenizer, prompt, sample_settings, device=device, progress=False, threads=threads)
    write_samples(samples, tokenizer, prompt, samples_dir, piece_stem(piece.name))
    context, bars, quarters = piece.context(), settings.sample.bars, settings.by_quarter

    def measured(notes: NoteTable, first_bar: int) -> dict[str, list[float]]:
        return measure(metrics, Span(notes, first_bar, bars, context), quarters)

    # every bar's features for the two-sample test, against this piece's prompt (4 decimals: pieces.jsonl's size)
    given = Prompt.of(piece.notes, piece.span_start - settings.prompt_bars, settings.prompt_bars)

    def featured(notes: NoteTable, first_bar: int) -> list[list[float]]:
        return bar_features(notes, first_bar, bars, given).round(4).tolist()

    bar_sets = {
        "generated": [],
        "real": featured(piece.notes, piece.span_start),
        "copy prompt": copied_prompt(piece.notes, piece.span_start, settings.prompt_bars, bars, given)
        .round(4)
        .tolist(),
        **({"another song": featured(floor.notes, floor.span_start)} if floor else {}),
    }
    model_values, positions, errors = [], [], 0
    for sample in samples:
        try:
            notes = tokenizer.decode(sample.ids).with_roles_of(piece.notes)
        except TokenError:
            errors += 1
            continue
        model_values.append(measured(notes, piece.span_start))
        bar_sets["generated"] += featured(notes, piece.span_start)
        positions.append(quarter_positions(tokenizer, sample.ids, piece.span_start, bars))
    return {
        "piece": piece.name,
        "index": index,
        "seed": seed,
        "span_start_bar": piece.span_start,
        "floor_piece": floor.name if floor else None,
        "model": model_values,
        "model_positions": positions,
        "real": measured(piece.notes, piece.span_start),
        "floor": measured(floor.notes, floor.span_start) if floor else None,
        "bar_features": bar_sets,
        "undecodable_samples": errors,
        "invalid_samples": stats["invalid"],
        "seconds": stats["seconds"],
    }


def quarter_positions(tokenizer: Tokenizer, ids, first_bar: int, bars: int) -> list[int]:
    """The token positions where each quarter of the span begins, and where the span ends (the
    last sampled token when the sampler stopped inside the span's last bar): which part of the
    continuation lies within the training length and which beyond it."""
    starts = tokenizer.bar_starts(ids)
    edges = [first_bar + q * bars // QUARTERS for q in range(QUARTERS + 1)]
    return [starts[b] if b < len(starts) else len(ids) for b in edges]


def mean_positions(records: list[dict[str, Any]]) -> np.ndarray | None:
    """Over every sample of the records (`quarter_positions`'): the mean token position where each
    quarter begins and where the span ends; None when no record has them."""
    positions = [p for record in records for p in record.get("model_positions", [])]
    return np.array(positions, dtype=np.float64).mean(0) if positions else None


class PieceRecord(BaseModel):
    """A line of `evaluate continuation`'s pieces.jsonl."""

    model_config = schemas.OPEN
    piece: schemas.Name


PIECE_RECORD = schemas.Format("piece record", None, PieceRecord)
EVALUATION_SETTINGS = schemas.Format("evaluation settings", None, dict[str, JsonValue])  # run.json


class ResultLog:
    """`pieces.jsonl` in the output folder, one line per evaluated piece, rewritten atomically after
    each piece so that an interrupted run resumes where it stopped; `run.json` holds the settings
    it belongs to, and another run's settings are refused rather than mixed in."""

    def __init__(self, out_dir: Path, settings: dict[str, Any]):
        self.path, self.run = out_dir / "pieces.jsonl", out_dir / "run.json"
        self.records: dict[str, dict[str, Any]] = {}
        if self.run.is_file():
            before = schemas.read(self.run, EVALUATION_SETTINGS)
            if before != settings:
                changed = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
                raise ConfigError(
                    f"{out_dir} holds results of other settings ({', '.join(changed)}); choose another --out"
                )
            if self.path.is_file():
                lines = self.path.read_text(encoding="utf-8").splitlines()
                records = [schemas.loads(line, PIECE_RECORD, self.path) for line in filter(None, lines)]
                self.records = {r.piece: r.model_dump() for r in records}
        else:
            write_json(self.run, settings)

    def add(self, record: dict[str, Any]) -> None:
        self.records[record["piece"]] = json_safe(record)
        write_text(self.path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in self.records.values()))


SOURCES = ("model", "real", "floor")
COLUMNS = (
    "metric",
    "model_mean",
    "model_median",
    "real_mean",
    "real_median",
    "floor_mean",
    "floor_median",
    "model_over_real",
    "model_minus_real",
    "model_n",
)


def pooled_values(records: list[dict[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
    """{metric: {source: all observations}} over the records (NaN for missing ones), metrics in
    the order they first appear."""
    pooled: dict[str, dict[str, list[float]]] = {}
    for record in records:
        spans = {
            "model": record["model"],
            "real": [record["real"]],
            "floor": [record["floor"]] if record["floor"] else [],
        }
        for source, measured in spans.items():
            for values in measured:
                for metric, observed in values.items():
                    cell = pooled.setdefault(metric, {s: [] for s in SOURCES})[source]
                    cell.extend(math.nan if v is None else float(v) for v in observed)
    return {m: {s: np.array(v, dtype=np.float64) for s, v in by.items()} for m, by in pooled.items()}


def summary_rows(pooled: dict[str, dict[str, np.ndarray]]) -> list[dict[str, Any]]:
    """Per metric: mean and median of the model's, the real and the floor spans' values (NaN left
    out), the model's mean over the real mean and minus it, and how many model values there are."""
    rows = []
    for metric, by in pooled.items():
        row: dict[str, Any] = {"metric": metric}
        for source in SOURCES:
            for name, statistic in STATISTICS.items():
                row[f"{source}_{name}"] = statistic(by[source])
        real = row["real_mean"]
        row["model_over_real"] = row["model_mean"] / real if real and not math.isnan(real) else math.nan
        row["model_minus_real"] = row["model_mean"] - real
        row["model_n"] = int(np.isfinite(by["model"]).sum())
        rows.append(row)
    return rows


def per_quarter(pooled: dict[str, dict[str, np.ndarray]]) -> dict[str, list[dict[str, np.ndarray]]]:
    """{metric: [its values in Q1, Q2, Q3, Q4]} for every metric measured per quarter (the
    `--by-quarter` copies of the span metrics, and the style similarity)."""
    quarters: dict[str, list[dict[str, np.ndarray]]] = {}
    for metric, by in pooled.items():
        base, _, q = metric.rpartition(" Q")
        if base and q.isdigit():
            quarters.setdefault(base, []).append(by)
    return {m: values for m, values in quarters.items() if len(values) == QUARTERS}


def write_report(
    out_dir: Path,
    rows: list[dict[str, Any]],
    pooled: dict[str, dict[str, np.ndarray]],
    note: str,
    quarter_note: str = "",
) -> dict[str, Path]:
    """continuation.csv, continuation.md (the table, then `note`) and continuation.png; with
    per-quarter span metrics also continuation_quarters.csv/.md (means and medians per quarter)
    and .png (the medians)."""
    cells = [[r["metric"]] + [fmt(r[c]) for c in COLUMNS[1:-1]] + [str(r["model_n"])] for r in rows]
    write_table(out_dir, "continuation", list(COLUMNS), cells, note)
    quarters = per_quarter(pooled)
    # the per-quarter copies of whole-span metrics go to their own plot; the style panels stay
    copies = {f"{m} Q{q + 1}" for m in quarters if m in pooled for q in range(QUARTERS)}
    plot_boxes({m: by for m, by in pooled.items() if m not in copies}, SOURCES, out_dir / "continuation.png")
    files = {kind: out_dir / f"continuation.{kind}" for kind in ("csv", "md", "png")}
    if copies:
        header = ["metric", "statistic"] + [f"{source} Q{q + 1}" for source in SOURCES for q in range(QUARTERS)]
        cells = [
            [metric, name] + [fmt(statistic(part[source])) for source in SOURCES for part in parts]
            for metric, parts in quarters.items()
            for name, statistic in STATISTICS.items()
        ]
        write_table(out_dir, "continuation_quarters", header, cells, quarter_note)
        plot_quarters(
            {
                source: {metric: [nan_median(part[source]) for part in parts] for metric, parts in quarters.items()}
                for source in SOURCES
            },
            out_dir / "continuation_quarters.png",
        )
        files |= {f"quarters_{kind}": out_dir / f"continuation_quarters.{kind}" for kind in ("csv", "md", "png")}
    return files


def _fingerprints(model, pieces: list[np.ndarray]) -> dict[str, str]:
    """Digests of the weights and of the split's tokens: a model re-exported, or a corpus
    re-prepared, at the same path must not resume the results of the one before."""
    weights = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        weights.update(name.encode())
        weights.update(tensor.detach().float().cpu().numpy().tobytes())
    tokens = hashlib.sha256()
    for ids in pieces:
        tokens.update(np.ascontiguousarray(ids, dtype=np.int64).tobytes())
        tokens.update(b"|")
    return {"weights_sha256": weights.hexdigest()[:16], "pieces_sha256": tokens.hexdigest()[:16]}


def _quarter_note(records: list[dict[str, Any]]) -> str:
    means = mean_positions(records)
    return "Means and medians per quarter of the measured bars. " + (
        ""
        if means is None
        else (
            "The model's quarters begin, on average, at token positions "
            + ", ".join(f"{v:,.0f}" for v in means[:-1])
            + f" and its span ends at {means[-1]:,.0f} (position 0: the prompt's first token)."
        )
    )


def evaluate_continuation(
    checkpoint: str | os.PathLike,
    data_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    settings: ContinuationSettings,
    split: str = "valid",
    limit: int | None = None,
    device: str = "auto",
    threads: int | None = None,
    progress: bool = True,
    metrics: Sequence[Metric] = SPAN_METRICS,
) -> dict[str, Any]:
    """The whole protocol of the module docstring on `split` (the first `limit` usable pieces),
    each span measured by `metrics`.

    Writes to `out_dir`: run.json (settings; the metrics' class names too when they are not
    `SPAN_METRICS`, so that a run resumes only with its own), pieces.jsonl (every value of every piece,
    kept across interruptions), samples/<piece>_<i>.mid, continuation.csv/.md/.png (the table) and
    two_sample.md/.csv/.json (the two-sample test).
    """

    settings = settings.checked()
    if limit is not None and limit < 1:
        raise ConfigError(f"--pieces must be at least 1, got {limit}")
    device = resolve_device(device)
    model, tokenizer, _, _ = load_checkpoint(checkpoint, device=device)
    settings = replace(settings, sample=settings.sample.resolved(tokenizer))  # the model's defaults, recorded
    split, names, ids, unreadable = split_pieces(data_dir, split, tokenizer, settings.sample.grid)
    usable, skipped = usable_pieces(tokenizer, names, ids, settings)
    skipped = unreadable | skipped
    if not usable:
        why = next(iter(skipped.values()), "the split is empty")
        raise DataError(f"{data_dir}: no piece of split {split!r} can be used ({len(skipped)} skipped; {why})")
    chosen = usable[:limit]
    out_dir = Path(out_dir)
    log = ResultLog(
        out_dir,
        {
            "checkpoint": str(Path(checkpoint).resolve()),
            "data": str(Path(data_dir).resolve()),
            "split": split,
            **settings.record(),
            **_fingerprints(model, ids),
            **({} if metrics is SPAN_METRICS else {"metrics": [type(m).__name__ for m in metrics]}),
        },
    )
    todo = [(i, p) for i, p in enumerate(chosen) if p.name not in log.records]
    for i, piece in tqdm(todo, desc="continuing", unit="piece", disable=not progress):
        floor = usable[(i + max(1, len(usable) // 2)) % len(usable)] if len(usable) > 1 else None
        samples_dir = out_dir / "samples"
        log.add(continue_piece(model, tokenizer, piece, floor, i, settings, device, threads, samples_dir, metrics))
    records = [log.records[p.name] for p in chosen]
    pooled = pooled_values(records)
    rows = summary_rows(pooled)
    sample = settings.sample
    note = (
        f"{len(chosen)} pieces of split {split!r} ({len(skipped)} skipped), {sample.num_samples} samples "
        f"each; prompt: pickup bar + {settings.prompt_bars} bars; measured: the next {sample.bars} bars. "
        "model: the samples' values; real: the piece's own bars (reference); floor: another piece's bars after "
        "its own prompt. model_over_real = model_mean / real_mean; model_minus_real = model_mean - real_mean. "
        "Definitions: docs/evaluation.md."
    )
    quarter_note = _quarter_note(records) if settings.by_quarter else ""
    files = write_report(out_dir, rows, pooled, note, quarter_note)
    songs = [r["bar_features"] for r in records if "bar_features" in r]  # not in an earlier version's records
    two_sample = continuation_comparisons(songs)
    write_two_sample(out_dir, two_sample, CONTINUATION_NOTE.format(songs=len(songs)))
    files |= {f"two_sample_{kind}": out_dir / f"two_sample.{kind}" for kind in ("md", "csv", "json")}
    return {
        "split": split,
        "pieces": len(chosen),
        "resumed": len(chosen) - len(todo),
        "skipped": skipped,
        "invalid_samples": sum(r["invalid_samples"] for r in records),
        "undecodable_samples": sum(r["undecodable_samples"] for r in records),
        "rows": rows,
        "two_sample": {name: {"auc": r.auc, "low": r.low, "high": r.high} for name, r in two_sample.items()},
        "files": {k: str(v) for k, v in files.items()},
    }
