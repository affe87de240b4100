"""Style similarity (Cífka et al. 2019/2020; paper Fig. 5; docs/method.md): the profiles, and the
per-quarter metric of a continuation span.

A *style profile* is a 2-D histogram of note statistics; two pieces are compared by the cosine
similarity of their profiles. Times are integer ticks and every bin is computed exactly from
them (a 1/6-beat bin is `6 * ticks // ticks_per_beat`), so notes on a triplet or 1/12-beat grid
never slip into the bin below. Bars are the piece's own, from its time signatures (4 beats, as
in the paper's data, where it has none).

- time-pitch (24 x 41): for each ordered pair of distinct notes (a, b) of one track with
  0 <= onset(b) - onset(a) < 4 beats: (onset difference in 1/6-beat bins) x (pitch(b) - pitch(a)
  in -20..20); notes that start together count in both orders. Only notes within 4 beats of
  each other are paired, so time and memory grow with those pairs, not with the square of the
  notes.
- onset-duration (24 x 12): (onset within its bar in 1/6-beat bins, modulo 4 beats) x (duration over 0..2 beats in
  1/6-beat bins; exactly 2 beats counts in the last bin, longer notes are not counted). The
  reference code took the onset in ticks here; it is in beats.
- onset-drum (24 x 128), drums only, replacing both: (onset within its bar) x (drum pitch).

`StyleQuarters` scores each quarter of a span against the whole real piece, per role the real
piece has; `musegen.evaluation.run_style` scores generated files against reference files.
"""

from __future__ import annotations

import math

import numpy as np

from ..music.notes import NoteTable, Track
from .metric import Metric, Span, cosine, quarter_edges

BINS_PER_BEAT = 6
TIME_BINS = 24  # 4 beats of onset difference / onset within the bar
WINDOW_BEATS = 4
PITCH_RANGE = 20
DURATION_BINS = 12  # 0..2 beats
STYLE_METRICS = ("time-pitch", "onset-duration", "onset-drum")
ROLES = ("bass", "drums", "other")
GRID_WHEN = 4  # pairs per grid cell above which the grid's FFT is the cheaper count
GRID_CELLS_MAX = 1 << 24  # (tick, pitch) cells the FFT may take: about 0.5 GB with its buffers


def role_notes(role: str, tpq: int, start: np.ndarray, end: np.ndarray, pitch: np.ndarray) -> NoteTable:
    """One role's notes (ticks) as a one-track table; the profiles do not read velocities."""
    track = np.zeros(len(start), dtype=np.int64)
    return NoteTable(tpq, start, end, pitch, np.zeros_like(track), track, [Track(role, 0, role == "drums", role)])


def time_pitch_profile(notes: NoteTable) -> np.ndarray:
    """Pairs within 4 beats, swept by lag over notes sorted by onset; notes with the same onset
    and pitch are counted once with their multiplicity, so stacked duplicates cost nothing.
    Where the notes are so dense that the pairs outnumber the cells of their (tick, pitch) grid,
    the pairs are counted on that grid instead (`_grid_pairs`), with the same result."""
    keys, counts = np.unique(np.stack([notes.start, notes.pitch], 1), axis=0, return_counts=True)
    start, pitch = keys[:, 0], keys[:, 1]  # sorted by onset, then pitch
    window = WINDOW_BEATS * notes.tpq
    if len(keys):
        pairs = int((np.searchsorted(start, start + window) - np.arange(1, len(keys) + 1)).sum())
        cells = (int(start[-1] - start[0]) + 1 + window) * 128
        if pairs > GRID_WHEN * cells and cells <= GRID_CELLS_MAX:  # (a long piece with one dense bar: sweep)
            return _grid_pairs(start - start[0], pitch, counts, notes.tpq)
    hist = np.zeros((TIME_BINS, 2 * PITCH_RANGE + 1), dtype=np.int64)
    _add_pairs(
        hist, np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=np.int64), counts * (counts - 1), notes.tpq
    )  # equal notes: every ordered pair of them
    for lag in range(1, len(keys)):
        dt = start[lag:] - start[:-lag]
        near = dt < window
        if not near.any():
            break  # onsets are sorted: a longer lag only moves further apart
        weight = (counts[lag:] * counts[:-lag])[near]
        interval = (pitch[lag:] - pitch[:-lag])[near]
        _add_pairs(hist, dt[near], interval, weight, notes.tpq)
        together = dt[near] == 0  # notes that start together also pair the other way round
        _add_pairs(hist, dt[near][together], -interval[together], weight[together], notes.tpq)
    return hist


def _grid_pairs(start: np.ndarray, pitch: np.ndarray, counts: np.ndarray, tpq: int) -> np.ndarray:
    """The time-pitch histogram of dense notes: the pairs' counts by (tick difference, interval)
    are the cross-correlation of the note counts on a (tick, pitch) grid with itself, taken by
    FFT and rounded back to integers (exact: every count is far below float64's 2**53), then
    binned as `_add_pairs` bins them. Pairs of a note with itself are taken out at lag 0."""
    window = WINDOW_BEATS * tpq
    grid = np.zeros((int(start[-1]) + 1, 128))
    grid[start, pitch] = counts
    shape = (grid.shape[0] + window, 128 + PITCH_RANGE)  # zero padding: no lag wraps around
    spectrum = np.fft.rfft2(grid, shape)
    correlation = np.fft.irfft2(np.conj(spectrum) * spectrum, shape)  # [dt, dp mod width]
    intervals = np.arange(-PITCH_RANGE, PITCH_RANGE + 1)
    by_tick = np.rint(correlation[:window, intervals % shape[1]]).astype(np.int64)  # [dt, interval]
    by_tick[0, PITCH_RANGE] -= int(counts.sum())  # a note is not its own pair
    hist = np.zeros((TIME_BINS, 2 * PITCH_RANGE + 1), dtype=np.int64)
    np.add.at(hist, _bins(np.arange(window), tpq), by_tick)
    return hist


def _add_pairs(hist: np.ndarray, dt: np.ndarray, interval: np.ndarray, weight: np.ndarray, tpq: int) -> None:
    keep = (np.abs(interval) <= PITCH_RANGE) & (weight > 0)
    np.add.at(hist, (_bins(dt[keep], tpq), interval[keep] + PITCH_RANGE), weight[keep])


def onset_duration_profile(notes: NoteTable) -> np.ndarray:
    duration = notes.end - notes.start
    keep = duration <= 2 * notes.tpq
    hist = np.zeros((TIME_BINS, DURATION_BINS), dtype=np.int64)
    durations = np.minimum(_bins(duration[keep], notes.tpq), DURATION_BINS - 1)  # 2 beats: last bin
    np.add.at(hist, (_onset_bins(notes.select(keep)), durations), 1)
    return hist


def onset_drum_profile(notes: NoteTable) -> np.ndarray:
    hist = np.zeros((TIME_BINS, 128), dtype=np.int64)
    np.add.at(hist, (_onset_bins(notes), notes.pitch), 1)
    return hist


def _bins(ticks: np.ndarray, tpq: int) -> np.ndarray:
    """1/6-beat bins of non-negative tick counts, exactly."""
    return (BINS_PER_BEAT * np.asarray(ticks, dtype=np.int64)) // tpq


def _onset_bins(notes: NoteTable) -> np.ndarray:
    return _bins(notes.in_bar(notes.start), notes.tpq) % TIME_BINS  # a 6/4 bar's last 2 beats wrap


def profiles(notes: NoteTable, role: str) -> dict[str, np.ndarray]:
    if role == "drums":
        return {"onset-drum": onset_drum_profile(notes)}
    return {"time-pitch": time_pitch_profile(notes), "onset-duration": onset_duration_profile(notes)}


def similarity(generated: np.ndarray, reference: np.ndarray) -> float:
    """The score of a segment's profile: NaN when the reference has nothing to compare with,
    0 when the segment has nothing (it played nothing in that role), else the cosine."""
    if not reference.any():
        return math.nan
    return cosine(generated, reference) if generated.any() else 0.0


def reference_profiles(reference: NoteTable, played: set[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """The style profiles of a whole real piece, per role it has; with `played`, per role it has
    among those (the roles its prompt plays: one that enters later is not the prompt's to continue)."""
    roles = set(reference.role.tolist())
    return {
        role: profiles(reference.in_role(role), role) for role in sorted(roles if played is None else roles & played)
    }


def style_metrics(span: Span) -> dict[str, list[float]]:
    """Style similarity of each quarter of the span with the reference piece (`span.context
    ["reference"]`, `reference_profiles`), pooled over roles: {"style <metric> Q<q>": [one value
    per role of the reference]}; a role the reference has but the quarter lacks scores 0."""
    out: dict[str, list[float]] = {}
    edges = quarter_edges(span)
    for q, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]), start=1):
        quarter = span.notes.onsets_in(lo, hi - lo)
        for role, ref in span.context["reference"].items():
            for metric, profile in profiles(quarter.in_role(role), role).items():
                value = 0.0 if not profile.any() else cosine(profile, ref[metric])  # empty quarter: 0
                out.setdefault(f"style {metric} Q{q}", []).append(value)
    return out


class StyleQuarters(Metric):
    needs = ("reference",)
    per_quarter = True

    def compute(self, span: Span) -> dict[str, list[float]]:
        return style_metrics(span)
