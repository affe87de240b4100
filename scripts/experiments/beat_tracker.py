"""Does the beat tracker find POP909's annotated beats and downbeats from the raw MIDI alone?

Each song's `NNN.mid` is tracked (`musegen.music.tracker.track_beats`, which never sees the
annotations) and compared with its `beat_midi.txt`. A song agrees when at least 90% of its
annotated downbeats have a tracked downbeat within a 16th note (a quarter of the local annotated
beat interval) and at least 90% of the tracked downbeats inside the annotated span have an
annotated one within a 16th. The beat F-measure counts a beat as found within 70 ms (the usual
window). Prints a Markdown table (all songs, and those the cue weights were not fitted on), the
same agreement for the file's own grid (`--grid file`) and for the best any regular bar can do
(the annotated beats themselves, downbeats every 4 beats from the best first one), then the songs
that do not agree and why.

`--fit` instead fits cue weights on POP909 alone, a logistic regression of the annotated downbeats
on `bar_features` at the annotated beats, over every third song (those whose index is a multiple
of 3, the ones `FITTED` names), and prints them: the tracker's CUE_WEIGHTS until 2026-11-30; now
tracker_regular.py --fit adds played pieces of music21's corpus to these songs.
    python scripts/experiments/beat_tracker.py [FOLDER] [--every N] [--fit]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from data_prep.common import SHARED_DATASETS
from data_prep.pop909 import annotations, song_files
from musegen.music.midi import load_score
from musegen.music.tracker import (
    Beats,
    as_table,
    bar_features,
    downbeat_agreement,
    file_beats,
    seconds_of,
    track_beats,
)

FITTED = slice(None, None, 3)  # the songs CUE_WEIGHTS were fitted on


def file_positions(table, seconds: np.ndarray) -> np.ndarray:
    """Times in seconds as positions in the file's beats (the inverse of its tempo map)."""
    grid = np.linspace(0, table.end.max() / table.tpq + 64, 200_000)
    return np.interp(seconds, seconds_of(table, grid), grid)


def fit(songs: list[Path]) -> np.ndarray:
    """CUE_WEIGHTS fitted on the annotated downbeats of `songs`."""
    return logistic(*song_cues(songs))


def song_cues(songs: list[Path]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """bar_features at each song's annotated beats, and its annotated downbeats."""
    features, labels = [], []
    for song in songs:
        seconds, downbeat = annotations(song)
        table = as_table(load_score(song))
        features.append(bar_features(table, file_positions(table, seconds)))
        labels.append(downbeat)
    return features, labels


def logistic(features: list[np.ndarray], labels: list[np.ndarray], weights: np.ndarray | None = None) -> np.ndarray:
    """Logistic regression (Newton's method, a little L2) of downbeats on bar_features, bias first;
    `weights`: each beat's weight in the fit (1 by default)."""
    x = np.c_[np.ones(sum(map(len, labels))), np.vstack(features)]
    y = np.concatenate(labels).astype(np.float64)
    s = np.ones(len(y)) if weights is None else weights
    ridge = np.diag(np.r_[0.0, np.ones(x.shape[1] - 1)])
    w = np.zeros(x.shape[1])
    for _ in range(25):
        p = 1 / (1 + np.exp(-x @ w))
        w -= np.linalg.solve((x * (s * p * (1 - p))[:, None]).T @ x + ridge, x.T @ (s * (p - y)) + ridge @ w)
    return w


def beat_f_measure(found: np.ndarray, wanted: np.ndarray, window: float = 0.07) -> float:
    inside = found[(found >= wanted[0] - window) & (found <= wanted[-1] + window)]
    if not len(inside):
        return 0.0
    hit = lambda a, b: np.mean(np.min(np.abs(a[:, None] - b[None, :]), 1) <= window)  # noqa: E731
    precision, recall = hit(inside, wanted), hit(wanted, inside)
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def agrees(found: Beats, seconds: np.ndarray, downbeat: np.ndarray) -> bool:
    return min(downbeat_agreement(found, seconds, downbeat)) >= 0.9


def regular_bars(seconds: np.ndarray, downbeat: np.ndarray) -> Beats:
    """The annotated beats with a downbeat every 4 from the first of the 4 that holds the most
    annotated downbeats: the best a tracker that keeps one bar length could do."""
    first = int(np.argmax(np.bincount(np.flatnonzero(downbeat) % 4, minlength=4)))
    return Beats(seconds, np.arange(len(seconds)) % 4 == first, "annotated", 0.0, 4, 1.0)


def why(found, seconds: np.ndarray, downbeat: np.ndarray) -> str:
    """The first reason a song disagrees: its meter, its tempo level, its beats, or its bar phase."""
    bars = np.bincount(np.diff(np.flatnonzero(downbeat))).argmax()
    ratio = np.median(np.diff(seconds)) / np.median(np.diff(found.seconds))
    if bars != 4:
        return f"annotated bars of {bars} beats"
    if abs(np.log2(ratio)) > 0.2:
        return f"tempo off by x{ratio:.2f}"
    if found.beats_per_bar != 4:
        return f"found {found.beats_per_bar} beats per bar"
    if beat_f_measure(found.seconds, seconds) < 0.8:
        return "beats off"
    return "downbeats on another beat"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=SHARED_DATASETS / "pop909")
    parser.add_argument("--every", type=int, default=1, help="every Nth song only")
    parser.add_argument("--fit", action="store_true", help="fit CUE_WEIGHTS and print them")
    args = parser.parse_args()
    if args.fit:
        print(np.round(fit(song_files(args.folder)[FITTED]), 2).tolist())
        return
    every = song_files(args.folder)
    fitted = set(every[FITTED])
    songs = every[:: args.every]
    rows, failures = [], []
    file_agree = regular_agree = 0
    began = time.perf_counter()
    for song in songs:
        seconds, downbeat = annotations(song)
        found = track_beats(load_score(song))
        recall, precision = downbeat_agreement(found, seconds, downbeat)
        agree = recall >= 0.9 and precision >= 0.9
        f_measure = beat_f_measure(found.seconds, seconds)
        rows.append((song not in fitted, agree, recall, precision, f_measure, found.beats_per_bar))
        file_agree += agrees(file_beats(load_score(song)), seconds, downbeat)
        regular_agree += agrees(regular_bars(seconds, downbeat), seconds, downbeat)
        if not agree:
            failures.append((song.stem, recall, precision, why(found, seconds, downbeat)))
    took = time.perf_counter() - began
    table = np.array(rows, dtype=np.float64)
    print("| songs | n | downbeats agree | downbeat recall | downbeat precision | beat F (70 ms) | 4 beats per bar |")
    print("|---|---|---|---|---|---|---|")
    for name, part in (("all", table), ("not fitted on", table[table[:, 0] == 1])):
        agree, recall, precision, f_measure, meter = part[:, 1:].T
        print(
            f"| {name} | {len(part)} | {agree.mean():.1%} ({int(agree.sum())}) | {recall.mean():.3f} "
            f"| {precision.mean():.3f} | {f_measure.mean():.3f} | {np.mean(meter == 4):.1%} |"
        )
    print(
        f"\nDownbeats agree on the file's own grid: {file_agree / len(rows):.1%} of songs; with one bar length "
        f"all through (the annotated beats, the best first downbeat): {regular_agree / len(rows):.1%}."
    )
    print(f"\n{took:.0f} s, {took / len(rows) * 1e3:.0f} ms a song\n")
    reasons: dict[str, int] = {}
    for _, _, _, reason in failures:
        key = reason.split(" x")[0] if reason.startswith("tempo") else reason
        reasons[key] = reasons.get(key, 0) + 1
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"- {reason}: {count}")
    print()
    for name, r, p, reason in failures:
        print(f"{name}: recall {r:.2f} precision {p:.2f}, {reason}")


if __name__ == "__main__":
    main()
