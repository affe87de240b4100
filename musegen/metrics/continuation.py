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

Every metric is computed on a span (bars of 4 beats; steps are 16th notes; *pitched* notes are the
non-drum ones; a note *sounds* at a step or beat it overlaps for a positive time):
- notes per bar: pitched notes with their onset in the span, divided by the span's bars;
- mean duration: the mean duration (beats) of those notes, whole even past the span's end;
- polyphony: the mean number of distinct pitched pitches sounding, over the span's steps where at
  least one sounds (muspy's `polyphony`, on the 16th grid of the span);
- polyphony rate: the share of those sounding steps where more than one pitch sounds;
- polyphony rate (muspy): the share of all the span's steps where more than two pitches sound
  (muspy's `polyphony_rate` with its default threshold, over the span);
- silent beats: the share of the span's beats where no note (drums included) sounds;
- mean pitch: the mean MIDI pitch of the pitched onsets;
- bars with a low note: the share of the span's bars holding the onset of a pitched note below
  G3 (MIDI 55);
- pitch-class entropy: Shannon entropy (bits) of the pitch-class histogram of the pitched onsets
  (muspy's `pitch_class_entropy`);
- pitch-class cosine: cosine similarity of that histogram with the prompt's (the pitched onsets
  of the source piece's prompt bars); 0 for a span without pitched notes;
- scale consistency: the largest share of pitched onsets in one major or minor scale (muspy);
- groove consistency: 1 - the mean Hamming distance between neighbouring bars' 16-step onset
  vectors (all tracks) over 16 (muspy's `groove_consistency`, over exactly the span's bars).
For pieces with more than one track role (groove corpora), also per role (bass, drums, other):
- <role> notes per bar, and <role> median duration (beats; bass and other);
- style similarity per quarter of the span (`musegen.metrics.style`): the time-pitch and
  onset-duration profiles (bass, other) and the onset-drum profile (drums) of the quarter's notes
  against the whole real piece's; a role the real piece has but the quarter lacks scores 0. The
  roles' values are pooled.
Metrics that need notes (durations, pitch statistics) are NaN for a span without them and left
out of means and medians.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import miditoolkit
import numpy as np
from tqdm import tqdm

from .. import schemas
from ..device import resolve_device
from ..errors import ConfigError, DataError, MusegenError, TokenError
from ..io import write_json, write_text
from ..music.constants import BEATS_PER_BAR
from ..music.midi import Part
from ..music.roles import assign_roles
from ..plots import pyplot, save_png
from ..shard_midi import piece_stem
from ..tokenizers.base import Tokenizer
from .style import Notes, cosine, profiles

STEPS_PER_BEAT = 4  # 16th notes
LOW_PITCH = 55  # G3: "bars with a low note" counts bars where a note below it starts
QUARTERS = 4


@dataclass
class NoteTable:
    """The notes of a piece, times in beats (exact: ticks / tpq), with the role of each note's track."""

    start: np.ndarray
    end: np.ndarray
    pitch: np.ndarray
    role: np.ndarray  # "bass" | "drums" | "other"
    tpq: int = 480  # the ticks per beat the times came from (style bins are counted in ticks)

    @classmethod
    def from_midi(cls, midi: miditoolkit.MidiFile, by_role: bool = True) -> "NoteTable":
        """`by_role`: find each track's role (bass, drums, other) as the groove tokenizer does;
        otherwise the piece is one pitched stream ("other", drums "drums")."""
        roles = instrument_roles(midi.instruments, by_role)
        rows = [(n.start, n.end, n.pitch, role) for inst, role in zip(midi.instruments, roles) for n in inst.notes]
        tpb = int(midi.ticks_per_beat)
        return cls(
            np.array([r[0] for r in rows], dtype=np.float64) / tpb,
            np.array([r[1] for r in rows], dtype=np.float64) / tpb,
            np.array([r[2] for r in rows], dtype=np.int64),
            np.array([r[3] for r in rows], dtype=object),
            tpb,
        )

    def __len__(self) -> int:
        return len(self.start)

    def select(self, keep: np.ndarray) -> "NoteTable":
        return NoteTable(self.start[keep], self.end[keep], self.pitch[keep], self.role[keep], self.tpq)

    def pitched(self) -> "NoteTable":
        return self.select(self.role != "drums")

    def onsets_in(self, first_bar: float, bars: float) -> "NoteTable":
        """The notes whose onset lies in bars [first_bar, first_bar + bars)."""
        lo, hi = first_bar * BEATS_PER_BAR, (first_bar + bars) * BEATS_PER_BAR
        return self.select((self.start >= lo) & (self.start < hi))

    def first_bar(self) -> int | None:
        return int(self.start.min() // BEATS_PER_BAR) if len(self) else None

    def last_onset_bar(self) -> int | None:
        return int(self.start.max() // BEATS_PER_BAR) if len(self) else None


def sounding(notes: NoteTable, first_bar: int, bars: int, per_beat: int = STEPS_PER_BEAT) -> np.ndarray:
    """(steps, 128) booleans over the span's grid of `per_beat` steps a beat: which pitches sound.
    A note sounds at a step it overlaps for a positive time."""
    steps = bars * BEATS_PER_BAR * per_beat
    roll = np.zeros((steps, 128), dtype=bool)
    origin = first_bar * BEATS_PER_BAR * per_beat
    first = np.floor(notes.start * per_beat - origin).astype(np.int64)
    last = np.ceil(notes.end * per_beat - origin).astype(np.int64) - 1  # the last step starting before the end
    for lo, hi, pitch in zip(np.maximum(first, 0), np.minimum(last, steps - 1), notes.pitch):
        if lo <= hi:
            roll[lo : hi + 1, pitch] = True
    return roll


def pitch_classes(notes: NoteTable) -> np.ndarray:
    """Counts of the 12 pitch classes among `notes`."""
    return np.bincount(notes.pitch % 12, minlength=12).astype(np.float64)


def _muspy_music(notes: NoteTable):
    """A muspy.Music of `notes` for its pitch metrics (which read only the pitches)."""
    import muspy

    return muspy.Music(tracks=[muspy.Track(notes=[muspy.Note(0, int(p), 1) for p in notes.pitch])])


def groove_consistency(notes: NoteTable, first_bar: int, bars: int) -> float:
    """1 - mean Hamming distance of neighbouring bars' binary 16-step onset vectors / 16."""
    if bars < 2:
        return math.nan
    per_bar = BEATS_PER_BAR * STEPS_PER_BEAT
    steps = np.floor(notes.start * STEPS_PER_BEAT + 0.5).astype(np.int64) - first_bar * per_bar  # nearest step
    steps = steps[(steps >= 0) & (steps < bars * per_bar)]
    grid = np.zeros(bars * per_bar, dtype=bool)
    grid[steps] = True
    grid = grid.reshape(bars, per_bar)
    return float(1 - np.count_nonzero(grid[1:] != grid[:-1]) / (per_bar * (bars - 1)))


def span_metrics(notes: NoteTable, first_bar: int, bars: int, prompt_classes: np.ndarray) -> dict[str, float]:
    """The metrics of the module docstring on bars first_bar .. first_bar + bars - 1 of `notes`."""
    import muspy

    pitched = notes.pitched()
    onsets = pitched.onsets_in(first_bar, bars)
    roll = sounding(pitched, first_bar, bars)
    voices = roll.sum(1)
    heard = voices[voices > 0]
    beats = sounding(notes, first_bar, bars, per_beat=1).any(1)
    low_bars = np.unique(onsets.start[onsets.pitch < LOW_PITCH] // BEATS_PER_BAR)
    classes = pitch_classes(onsets)
    music = _muspy_music(onsets) if len(onsets) else None
    return {
        "notes per bar": len(onsets) / bars,
        "mean duration": float((onsets.end - onsets.start).mean()) if len(onsets) else math.nan,
        "polyphony": float(heard.mean()) if len(heard) else math.nan,
        "polyphony rate": float((heard > 1).mean()) if len(heard) else math.nan,
        "polyphony rate (muspy)": float((voices > 2).mean()),
        "silent beats": float(1 - beats.mean()),
        "mean pitch": float(onsets.pitch.mean()) if len(onsets) else math.nan,
        "bars with a low note": len(low_bars) / bars,
        "pitch-class entropy": float(muspy.pitch_class_entropy(music)) if music else math.nan,
        "pitch-class cosine": 0.0 if not len(onsets) else _nan_to(cosine(classes, prompt_classes), 0.0),
        "scale consistency": float(muspy.scale_consistency(music)) if music else math.nan,
        "groove consistency": groove_consistency(notes, first_bar, bars),
    }


def _nan_to(value: float, fallback: float) -> float:
    return fallback if math.isnan(value) else value


def role_metrics(notes: NoteTable, first_bar: int, bars: int, roles: list[str]) -> dict[str, float]:
    """Per role of `roles`: notes per bar; for pitched roles the median duration (beats)."""
    out = {}
    for role in roles:
        mine = notes.select(notes.role == role).onsets_in(first_bar, bars)
        out[f"{role} notes per bar"] = len(mine) / bars
        if role != "drums":
            out[f"{role} median duration"] = float(np.median(mine.end - mine.start)) if len(mine) else math.nan
    return out


def reference_profiles(reference: NoteTable) -> dict[str, dict[str, np.ndarray]]:
    """The style profiles of a whole real piece, per role it has."""
    return {
        role: profiles(_style_notes(reference.select(reference.role == role)), role)
        for role in sorted(set(reference.role.tolist()))
    }


def style_metrics(
    notes: NoteTable, first_bar: int, bars: int, reference: dict[str, dict[str, np.ndarray]]
) -> dict[str, list[float]]:
    """Style similarity of each quarter of the span with the reference piece, pooled over roles:
    {"style <metric> Q<q>": [one value per role of the reference]}."""
    out: dict[str, list[float]] = {}
    edges = np.linspace(first_bar, first_bar + bars, QUARTERS + 1)
    for q, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]), start=1):
        quarter = notes.onsets_in(lo, hi - lo)
        for role, ref in reference.items():
            mine = profiles(_style_notes(quarter.select(quarter.role == role)), role)
            for metric, profile in mine.items():
                value = 0.0 if not profile.any() else cosine(profile, ref[metric])  # empty quarter: 0
                out.setdefault(f"style {metric} Q{q}", []).append(value)
    return out


def _style_notes(notes: NoteTable) -> Notes:
    start = np.rint(notes.start * notes.tpq).astype(np.int64)  # back to the exact ticks
    return Notes(notes.tpq, start, np.rint(notes.end * notes.tpq).astype(np.int64) - start, notes.pitch)


def instrument_roles(instruments: list, by_role: bool = True) -> list[str]:
    """The role of each instrument, by the groove tokenizer's rules (`musegen.tokenizers.groove`:
    track names, else programs, else the lowest track), or with `by_role` False one pitched stream
    ("other", drums "drums"), so that a piano's several tracks are never split into roles."""
    if not by_role:
        return ["drums" if inst.is_drum else "other" for inst in instruments]
    parts = [
        Part(inst.name, inst.program, inst.is_drum, np.ones((len(inst.notes), 4), dtype=np.int64))
        for inst in instruments
    ]
    roles = assign_roles(parts)
    role_of = {id(p): role for role, group in (("bass", roles.bass), ("drums", roles.drums)) for p in group}
    return [role_of.get(id(p), "other") for p in parts]


def measure(
    notes: NoteTable,
    first_bar: int,
    bars: int,
    prompt_classes: np.ndarray,
    reference: dict[str, dict[str, np.ndarray]] | None,
    by_quarter: bool = False,
) -> dict[str, list[float]]:
    """Every metric of one span, each as a list of observations (style: one per role). With
    `reference` (the real piece's style profiles, for multi-track pieces) the role and style metrics
    are added; with `by_quarter` the span and role metrics of each quarter of the span too
    ("<metric> Q<q>"; `bars` a multiple of 4)."""

    def plain(lo: int, n: int) -> dict[str, float]:
        values = span_metrics(notes, lo, n, prompt_classes)
        return values | role_metrics(notes, lo, n, list(reference)) if reference is not None else values

    values = {name: [v] for name, v in plain(first_bar, bars).items()}
    if reference is not None:
        values |= style_metrics(notes, first_bar, bars, reference)
    if by_quarter:
        size = bars // QUARTERS
        for q in range(QUARTERS):
            values |= {f"{name} Q{q + 1}": [v] for name, v in plain(first_bar + q * size, size).items()}
    return values


# ---- the protocol over a prepared split -----------------------------------------------------------


@dataclass
class ContinuationSettings:
    """What `musegen evaluate continuation` does per piece; sampling values None are the paper's."""

    prompt_bars: int = 4  # after the pickup bar
    bars: int = 12  # generated and measured
    samples_per_piece: int = 2
    seed: int = 0  # piece i (in the order of the usable pieces) is sampled with seed + i
    temperature: float | None = None
    top_p: float | None = None
    top_k: int = 0
    keep_note_offs: bool = True  # sample.SampleSettings.keep_note_offs
    mono_bass: bool = True  # sample.SampleSettings.mono_bass
    by_quarter: bool = False  # also measure each quarter of the span (how a long continuation holds up)

    def checked(self) -> "ContinuationSettings":
        for name, least in (("prompt_bars", 1), ("bars", 1), ("samples_per_piece", 1), ("top_k", 0)):
            if getattr(self, name) < least:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least {least}, got {getattr(self, name)}")
        if self.by_quarter and self.bars % QUARTERS:
            raise ConfigError(f"--by-quarter needs --bars to be a multiple of {QUARTERS}, got {self.bars}")
        return self


@dataclass
class Piece:
    """A held-out piece the protocol can use: its tokens, notes and where its span begins."""

    name: str
    ids: np.ndarray
    notes: NoteTable
    span_start: int  # bar K: the pickup bar + 1 + prompt bars

    def prompt_classes(self) -> np.ndarray:
        return pitch_classes(self.notes.pitched().onsets_in(0, self.span_start))

    def reference(self) -> dict[str, dict[str, np.ndarray]] | None:
        """Style profiles of the whole piece for multi-track pieces, else None."""
        return reference_profiles(self.notes) if len(set(self.notes.role.tolist())) > 1 else None


MIDI_SPLIT = "midi"  # the split name of a folder of MIDI files


def split_pieces(
    data_dir: str | os.PathLike, split: str, tokenizer: Tokenizer
) -> tuple[str, list[str], list[np.ndarray], dict[str, str]]:
    """(split, piece names, their ids, unreadable pieces with why) of a prepared corpus's split,
    or of every MIDI file under a folder without a shard index (real music that is not in any
    corpus; each file encoded by the model's tokenizer, named by its path in the folder; `split`
    is then not used)."""
    from ..music.midi import MIDI_SUFFIXES
    from ..shards import INDEX, Shards

    folder = Path(data_dir)
    if folder.is_dir() and not (folder / INDEX).exists():
        files = sorted(p for p in folder.rglob("*") if p.suffix in MIDI_SUFFIXES and p.is_file())
        if not files:
            raise DataError(f"{folder}: neither a prepared corpus ({INDEX}) nor a folder of MIDI files")
        names, ids, unreadable = [], [], {}
        for path in files:
            name = str(path.relative_to(folder).with_suffix(""))
            try:
                ids.append(np.asarray(tokenizer.encode(path).ids, dtype=np.int64))
                names.append(name)
            except MusegenError as exc:
                unreadable[name] = f"cannot encode: {str(exc).splitlines()[0]}"
        return MIDI_SPLIT, names, ids, unreadable
    shards = Shards(folder)
    split, ids = shards.pieces_for(split, tokenizer)
    return split, shards.names(split), ids, {}


def usable_pieces(
    tokenizer: Tokenizer, names: list[str], pieces: list[np.ndarray], settings: ContinuationSettings
) -> tuple[list[Piece], dict[str, str]]:
    """The pieces long enough for the protocol, and why each other piece was skipped."""
    usable, skipped = [], {}
    for name, ids in zip(names, pieces):
        try:
            notes = NoteTable.from_midi(tokenizer.decode(ids), by_role=bool(tokenizer.roles))
        except TokenError as exc:
            skipped[name] = f"cannot decode: {str(exc).splitlines()[0]}"
            continue
        if not len(notes):
            skipped[name] = "no notes"
            continue
        span_start = notes.first_bar() + 1 + settings.prompt_bars
        if notes.last_onset_bar() < span_start + settings.bars - 1 or len(tokenizer.bar_starts(ids)) <= span_start:
            skipped[name] = (
                f"too short: {notes.last_onset_bar() + 1} bars, the protocol needs "
                f"{span_start + settings.bars} (pickup bar at {notes.first_bar()})"
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
) -> dict[str, Any]:
    """Sample one piece's continuations, write them as MIDI, and measure them beside the real span
    and the floor: the piece's record for pieces.jsonl."""
    from ..generation.loop import generate
    from ..generation.outputs import write_samples
    from ..generation.prompt import prompt_from_ids
    from ..generation.settings import SampleSettings

    prompt = prompt_from_ids(tokenizer, piece.ids, bars=piece.span_start, source=piece.name)
    seed = settings.seed + index
    sample_settings = SampleSettings(
        bars=settings.bars,
        num_samples=settings.samples_per_piece,
        seed=seed,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        keep_note_offs=settings.keep_note_offs,
        mono_bass=settings.mono_bass,
    )
    samples, stats = generate(model, tokenizer, prompt, sample_settings, device=device, progress=False, threads=threads)
    write_samples(samples, tokenizer, prompt, samples_dir, piece_stem(piece.name))
    classes, reference, bars, quarters = piece.prompt_classes(), piece.reference(), settings.bars, settings.by_quarter
    model_values, positions, errors = [], [], 0
    for sample in samples:
        try:
            notes = NoteTable.from_midi(tokenizer.decode(sample.ids), by_role=bool(tokenizer.roles))
        except TokenError:
            errors += 1
            continue
        model_values.append(measure(notes, piece.span_start, bars, classes, reference, quarters))
        positions.append(quarter_positions(tokenizer, sample.ids, piece.span_start, bars))
    return {
        "piece": piece.name,
        "index": index,
        "seed": seed,
        "span_start_bar": piece.span_start,
        "floor_piece": floor.name if floor else None,
        "model": model_values,
        "model_positions": positions,
        "real": measure(piece.notes, piece.span_start, bars, classes, reference, quarters),
        "floor": measure(floor.notes, floor.span_start, bars, classes, reference, quarters) if floor else None,
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


class ResultLog:
    """`pieces.jsonl` in the output folder, one line per evaluated piece, rewritten atomically after
    each piece so that an interrupted run resumes where it stopped; `run.json` holds the settings
    it belongs to, and another run's settings are refused rather than mixed in."""

    def __init__(self, out_dir: Path, settings: dict[str, Any]):
        self.path, self.run = out_dir / "pieces.jsonl", out_dir / "run.json"
        self.records: dict[str, dict[str, Any]] = {}
        if self.run.is_file():
            before = schemas.read(self.run, "evaluation settings")
            if before != settings:
                changed = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
                raise ConfigError(
                    f"{out_dir} holds results of other settings ({', '.join(changed)}); choose another --out"
                )
            if self.path.is_file():
                lines = self.path.read_text(encoding="utf-8").splitlines()
                records = [schemas.loads(line, "piece record", self.path) for line in filter(None, lines)]
                self.records = {r.piece: r.model_dump() for r in records}
        else:
            write_json(self.run, settings)

    def add(self, record: dict[str, Any]) -> None:
        self.records[record["piece"]] = _json_safe(record)
        write_text(self.path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in self.records.values()))


def _json_safe(value):
    """NaN -> None (JSON has no NaN), recursively."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


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


def _mean(values: np.ndarray) -> float:
    """Mean of the finite values (NaN marks a metric a span could not have); NaN if none."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else math.nan


def _median(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if len(finite) else math.nan


# Tables give both: a few runaway samples move a mean far from what most samples do.
STATISTICS = {"mean": _mean, "median": _median}


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
    from .compare import fmt, write_table

    cells = [[r["metric"]] + [fmt(r[c]) for c in COLUMNS[1:-1]] + [str(r["model_n"])] for r in rows]
    write_table(out_dir, "continuation", list(COLUMNS), cells, note)
    quarters = per_quarter(pooled)
    # the per-quarter copies of whole-span metrics go to their own plot; the style panels stay
    copies = {f"{m} Q{q + 1}" for m in quarters if m in pooled for q in range(QUARTERS)}
    plot_continuation({m: by for m, by in pooled.items() if m not in copies}, out_dir / "continuation.png")
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
                source: {metric: [_median(part[source]) for part in parts] for metric, parts in quarters.items()}
                for source in SOURCES
            },
            out_dir / "continuation_quarters.png",
        )
        files |= {f"quarters_{kind}": out_dir / f"continuation_quarters.{kind}" for kind in ("csv", "md", "png")}
    return files


def _panel_grid(count: int):
    """A figure of `count` small panels, four to a row (the unused ones hidden): (figure, axes)."""
    columns = 4
    rows = math.ceil(count / columns)
    fig, axes = pyplot().subplots(rows, columns, figsize=(3.2 * columns, 2.4 * rows), squeeze=False)
    for ax in axes.ravel()[count:]:
        ax.axis("off")
    return fig, axes.ravel()


def plot_quarters(series: dict[str, dict[str, list[float]]], path: Path) -> None:
    """One panel per metric, one line per label ({label: {metric: [Q1..Q4 values]}}): a model's
    solid, the real spans' ("real") dashed and the floor's ("floor") dotted, in black and grey."""
    metrics = list(dict.fromkeys(m for values in series.values() for m in values))
    fig, axes = _panel_grid(len(metrics))
    x = np.arange(1, QUARTERS + 1)
    looks = {"real": dict(ls="--", marker="s", color="black"), "floor": dict(ls=":", marker="^", color="grey")}
    for ax, metric in zip(axes, metrics):
        for label, values in series.items():
            if metric in values:
                ax.plot(x, values[metric], label=label, **looks.get(label, dict(ls="-", marker="o")))
        ax.set_xticks(x, [f"Q{q}" for q in x])
        ax.set_title(metric, fontsize=9)
        ax.tick_params(labelsize=8)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


def plot_continuation(pooled: dict[str, dict[str, np.ndarray]], path: Path) -> None:
    """One panel per metric: box plots of the model's, the real and the floor spans' values."""
    fig, axes = _panel_grid(len(pooled))
    for ax, (metric, by) in zip(axes, pooled.items()):
        data = [by[s][np.isfinite(by[s])] for s in SOURCES]
        ax.boxplot([d if len(d) else [math.nan] for d in data], showfliers=False)
        ax.set_xticks(range(1, len(SOURCES) + 1), SOURCES)
        ax.set_title(metric, fontsize=9)
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    save_png(fig, path)


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
) -> dict[str, Any]:
    """The whole protocol of the module docstring on `split` (the first `limit` usable pieces).

    Writes to `out_dir`: run.json (settings), pieces.jsonl (every value of every piece, kept
    across interruptions), samples/<piece>_<i>.mid, and continuation.csv/.md/.png (the table).
    """
    from ..checkpoint import load_checkpoint

    settings = settings.checked()
    if limit is not None and limit < 1:
        raise ConfigError(f"--pieces must be at least 1, got {limit}")
    device = resolve_device(device)
    model, tokenizer, _, _ = load_checkpoint(checkpoint, device=device)
    split, names, ids, unreadable = split_pieces(data_dir, split, tokenizer)
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
            **asdict(settings),
            **_fingerprints(model, ids),
        },
    )
    todo = [(i, p) for i, p in enumerate(chosen) if p.name not in log.records]
    for i, piece in tqdm(todo, desc="continuing", unit="piece", disable=not progress):
        floor = usable[(i + max(1, len(usable) // 2)) % len(usable)] if len(usable) > 1 else None
        log.add(continue_piece(model, tokenizer, piece, floor, i, settings, device, threads, out_dir / "samples"))
    records = [log.records[p.name] for p in chosen]
    pooled = pooled_values(records)
    rows = summary_rows(pooled)
    note = (
        f"{len(chosen)} pieces of split {split!r} ({len(skipped)} skipped), {settings.samples_per_piece} samples "
        f"each; prompt: pickup bar + {settings.prompt_bars} bars; measured: the next {settings.bars} bars. "
        "model: the samples' values; real: the piece's own bars (reference); floor: another piece's bars after "
        "its own prompt. model_over_real = model_mean / real_mean; model_minus_real = model_mean - real_mean. "
        "Definitions: docs/evaluation.md."
    )
    quarter_note = ""
    if settings.by_quarter:
        means = mean_positions(records)
        quarter_note = "Means and medians per quarter of the measured bars. " + (
            ""
            if means is None
            else (
                "The model's quarters begin, on average, at token positions "
                + ", ".join(f"{v:,.0f}" for v in means[:-1])
                + f" and its span ends at {means[-1]:,.0f} (position 0: the prompt's first token)."
            )
        )
    files = write_report(out_dir, rows, pooled, note, quarter_note)
    return {
        "split": split,
        "pieces": len(chosen),
        "resumed": len(chosen) - len(todo),
        "skipped": skipped,
        "invalid_samples": sum(r["invalid_samples"] for r in records),
        "undecodable_samples": sum(r["undecodable_samples"] for r in records),
        "rows": rows,
        "files": {k: str(v) for k, v in files.items()},
    }
