"""Style similarity of generated continuations (Cífka et al. 2019/2020; paper Fig. 5).

A *style profile* is a 2-D histogram of note statistics; two pieces are compared by the cosine
similarity of their profiles. Times are in beats (quarter notes) and bars are 4 beats, as in the
paper's data.

- time-pitch (24 x 41): for each ordered pair of distinct notes (a, b) of one track with
  0 <= onset(b) - onset(a) < 4 beats: (onset difference in 1/6-beat bins) x (pitch(b) - pitch(a)
  in -20..20). Pairs with a larger interval are not counted.
- onset-duration (24 x 12): (onset mod 4 beats in 1/6-beat bins) x (duration over 0..2 beats
  in 1/6-beat bins; a note of exactly 2 beats counts in the last bin, longer ones are not counted).
- onset-drum (24 x 128), drums only, replacing both: (onset mod 4 beats) x (drum pitch).

Tracks are compared by *role*: drums (the drum channel), bass (GM programs 32-39) and other
(every other track, merged). This matches the groove trio and makes a one-piano REMI piece
comparable with a multi-track reference. A generated piece's continuation (the notes from
musegen's prompt-end marker on, or the whole piece without one) is cut into 4 segments of equal
duration; each segment's profile is scored against the whole reference piece of the same role.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MidiError
from ..io import write_text
from ..midi import find_midi_files, load_score
from ..plots import pyplot, save_png
from ..render import PROMPT_END_MARKER

BIN = 1 / 6  # beats
TIME_BINS = 24  # 4 beats of onset difference / onset within the bar
BAR = 4.0  # beats
PITCH_RANGE = 20
DURATION_BINS = 12  # 0..2 beats
EPS = 1e-9
METRICS = ("time-pitch", "onset-duration", "onset-drum")
ROLES = ("bass", "drums", "other")


@dataclass
class Notes:
    """One role's notes, times in beats."""

    start: np.ndarray
    duration: np.ndarray
    pitch: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    def select(self, keep: np.ndarray) -> "Notes":
        return Notes(self.start[keep], self.duration[keep], self.pitch[keep])


def time_pitch_profile(notes: Notes) -> np.ndarray:
    dt = notes.start[None, :] - notes.start[:, None]  # dt[a, b] = onset(b) - onset(a)
    interval = notes.pitch[None, :].astype(int) - notes.pitch[:, None].astype(int)
    pair = (dt >= 0) & (dt < BAR - EPS) & ~np.eye(len(notes), dtype=bool) & (np.abs(interval) <= PITCH_RANGE)
    hist = np.zeros((TIME_BINS, 2 * PITCH_RANGE + 1))
    np.add.at(hist, (_bins(dt[pair], TIME_BINS), interval[pair] + PITCH_RANGE), 1)
    return hist


def onset_duration_profile(notes: Notes) -> np.ndarray:
    keep = notes.duration <= DURATION_BINS * BIN + EPS
    hist = np.zeros((TIME_BINS, DURATION_BINS))
    np.add.at(hist, (_bins(np.mod(notes.start[keep], BAR), TIME_BINS),
                     _bins(notes.duration[keep], DURATION_BINS)), 1)
    return hist


def onset_drum_profile(notes: Notes) -> np.ndarray:
    hist = np.zeros((TIME_BINS, 128))
    np.add.at(hist, (_bins(np.mod(notes.start, BAR), TIME_BINS), notes.pitch.astype(int)), 1)
    return hist


def _bins(beats: np.ndarray, n: int) -> np.ndarray:
    # EPS absorbs float error from tick -> beat conversion (e.g. 2/6 landing at 0.33333).
    return np.clip(np.floor(beats / BIN + EPS).astype(int), 0, n - 1)


def profiles(notes: Notes, role: str) -> dict[str, np.ndarray]:
    if role == "drums":
        return {"onset-drum": onset_drum_profile(notes)}
    return {"time-pitch": time_pitch_profile(notes), "onset-duration": onset_duration_profile(notes)}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two histograms; NaN when either is empty (no notes to compare)."""
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return math.nan
    return float(np.dot(a.ravel(), b.ravel()) / (na * nb))


def track_role(is_drum: bool, program: int) -> str:
    if is_drum:
        return "drums"
    return "bass" if 32 <= program <= 39 else "other"


def read_piece(path: str | os.PathLike) -> tuple[dict[str, Notes], float | None]:
    """Notes per role (times in beats) and the prompt end in beats (None without a marker)."""
    score = load_score(path).to("quarter")
    parts: dict[str, list[dict]] = {}
    for track in score.tracks:
        if len(track.notes):
            parts.setdefault(track_role(track.is_drum, track.program), []).append(track.notes.numpy())
    by_role = {role: Notes(*(np.concatenate([a[key] for a in arrays]).astype(float if key != "pitch" else int)
                             for key in ("time", "duration", "pitch")))
               for role, arrays in parts.items()}
    ends = [m.time for m in score.markers if m.text == PROMPT_END_MARKER]
    return by_role, (float(ends[0]) if ends else None)


def continuation_segments(by_role: dict[str, Notes], prompt_end: float | None,
                          n_segments: int = 4) -> list[dict[str, Notes]]:
    """The continuation's notes cut into `n_segments` spans of equal duration (assigned by onset)."""
    start = prompt_end if prompt_end is not None else min(n.start.min() for n in by_role.values())
    cont = {role: n.select(n.start >= start - EPS) for role, n in by_role.items()}
    ends = [float((n.start + n.duration).max()) for n in cont.values() if len(n)]
    if not ends:
        return [{} for _ in range(n_segments)]
    edges = np.linspace(start, max(ends), n_segments + 1)
    edges[-1] += EPS  # the last note onset belongs to the last segment
    return [{role: n.select((n.start >= lo - EPS) & (n.start < hi - EPS)) for role, n in cont.items()}
            for lo, hi in zip(edges[:-1], edges[1:])]


def score_piece(generated: str | os.PathLike, reference: str | os.PathLike, n_segments: int = 4) -> list[dict]:
    """One row per (role, metric, segment): the similarity and the note counts behind it."""
    gen_roles, prompt_end = read_piece(generated)
    ref_roles, _ = read_piece(reference)
    segments = continuation_segments(gen_roles, prompt_end, n_segments)
    rows = []
    for role in ROLES:
        if role not in ref_roles:
            continue  # nothing to compare this role's output with
        ref_profiles = profiles(ref_roles[role], role)
        for index, segment in enumerate(segments, start=1):
            notes = segment.get(role, Notes(np.zeros(0), np.zeros(0), np.zeros(0, dtype=int)))
            for metric, profile in profiles(notes, role).items():
                rows.append({"generated": Path(generated).name, "reference": Path(reference).name,
                             "track": role, "metric": metric, "segment": index,
                             "similarity": cosine(profile, ref_profiles[metric]),
                             "generated_notes": len(notes), "reference_notes": len(ref_roles[role])})
    return rows


def match_reference(generated: str, references: dict[str, Path]) -> Path | None:
    """The reference for a generated file, both named by their paths relative to their folders.

    `musegen sample --prompt song.mid` writes song_000.mid, song_001.mid, ...: the reference in the
    same sub-folder whose stem is the longest prefix of the generated stem matches them (so a
    folder of prompts sampled as a batch matches the folder of references it came from). A single
    reference matches every generated file.
    """
    if len(references) == 1:
        return next(iter(references.values()))
    folder, stem = Path(generated).parent, Path(generated).stem
    candidates = [(Path(rel).stem, path) for rel, path in references.items() if Path(rel).parent == folder
                  and (stem == Path(rel).stem or stem.startswith(Path(rel).stem + "_"))]
    return max(candidates, key=lambda c: len(c[0]), default=(None, None))[1]


def _relative_names(folder: Path) -> dict[str, Path]:
    root = folder if folder.is_dir() else folder.parent
    return {str(p.relative_to(root)): p for p in find_midi_files(folder)}


def evaluate_style(generated_dir: str | os.PathLike, reference_dir: str | os.PathLike,
                   out_csv: str | os.PathLike, out_png: str | os.PathLike | None = None,
                   n_segments: int = 4) -> dict:
    """Score every generated file against its reference; write the CSV (and box plot)."""
    generated = _relative_names(Path(generated_dir))
    references = _relative_names(Path(reference_dir))
    rows, unmatched = [], []
    for name, path in generated.items():
        reference = match_reference(name, references)
        if reference is None:
            unmatched.append(name)
            continue
        rows.extend(row | {"generated": name} for row in score_piece(path, reference, n_segments))
    if not rows:
        raise MidiError(f"{generated_dir}: no generated file matches a reference in {reference_dir} "
                        "(name references like the prompt: song.mid for song_000.mid)")
    write_csv(out_csv, rows)
    if out_png is not None:
        boxplot_png(rows, out_png, n_segments)
    return {"pieces": len(generated) - len(unmatched), "unmatched": unmatched, "rows": len(rows),
            "medians": medians(rows, n_segments)}


def medians(rows: list[dict], n_segments: int = 4) -> dict[str, list[float]]:
    """Median similarity per metric and segment, ignoring empty (NaN) comparisons."""
    out = {}
    for metric in METRICS:
        per_segment = [[r["similarity"] for r in rows if r["metric"] == metric and r["segment"] == s
                        and not math.isnan(r["similarity"])] for s in range(1, n_segments + 1)]
        if any(per_segment):
            out[metric] = [float(np.median(v)) if v else math.nan for v in per_segment]
    return out


def write_csv(path: str | os.PathLike, rows: list[dict]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buffer.getvalue())


def boxplot_png(rows: list[dict], path: str | os.PathLike, n_segments: int = 4) -> None:
    """One panel per metric, one box per segment of the continuation (paper Fig. 5)."""
    plt = pyplot()

    metrics = [m for m in METRICS if any(r["metric"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.5), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        data = [[r["similarity"] for r in rows if r["metric"] == metric and r["segment"] == s
                 and not math.isnan(r["similarity"])] for s in range(1, n_segments + 1)]
        ax.boxplot([d if d else [math.nan] for d in data], showfliers=False)
        ax.set_xticks(range(1, n_segments + 1), [f"Q{s}" for s in range(1, n_segments + 1)])
        ax.set_ylim(0, 1)
        ax.set_title(metric)
        ax.set_xlabel("segment of the continuation")
    axes[0][0].set_ylabel("cosine similarity to reference")
    fig.tight_layout()
    save_png(fig, path)
