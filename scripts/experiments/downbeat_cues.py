"""Would stronger downbeat cues let the tracker follow POP909's irregular bars?

The tracker's downbeats are measured here apart from its beats: every song's cues are taken at
its *annotated* beats, and its downbeats are the Viterbi path over them (`bar_path`, as
`track_beats` does). Two cue models, both fitted on every third song (index 0, 3, 6, ...) and
measured on the others:
- `linear`: the tracker's own, a logistic regression on `bar_features` (its CUE_WEIGHTS, refitted);
- `cnn`: a small 1-D convolutional network over the same eight cues per beat, which sees about
  ±12 beats around each beat (three layers, 32 channels), trained 10 passes with Adam;
- `chords (annotated)`: not a cue the tracker could have, a bound on what harmony can tell: the
  dataset's own chord annotations (`chord_midi.txt`), a logistic regression on one flag per beat,
  a change of chord within a 16th of it;
- `linear + chords (annotated)`: the linear cues and that flag, fitted together.
For each: the per-beat AUC of the cue against the annotated downbeats, the songs whose downbeats
agree (as beat_tracker.py defines it) at several costs of a bar of another length, and, within
every run of regular (4-beat) annotated bars, which beat of the bar the cue favours (its mean
over the run largest), by the run's length.
    python scripts/experiments/downbeat_cues.py      # about 3 minutes on one core
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from beat_tracker import FITTED, file_positions, logistic  # noqa: E402

from data_prep.common import SHARED_DATASETS  # noqa: E402
from data_prep.pop909 import annotations, song_files  # noqa: E402
from musegen.metrics.two_sample import roc_auc  # noqa: E402
from musegen.music import tracker  # noqa: E402
from musegen.music.midi import load_score  # noqa: E402

COSTS = (2.0, 4.0, 8.0, 16.0)


def cnn_cues(train: list[tuple[np.ndarray, np.ndarray]], test: list[np.ndarray]) -> list[np.ndarray]:
    """Log-odds of a downbeat per beat from a small convolutional network over the eight cues."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv1d(8, 32, 9, padding=4),
        torch.nn.ReLU(),
        torch.nn.Conv1d(32, 32, 9, padding=4),
        torch.nn.ReLU(),
        torch.nn.Conv1d(32, 32, 5, padding=4, dilation=2),
        torch.nn.ReLU(),
        torch.nn.Conv1d(32, 1, 1),
    )
    optimiser = torch.optim.Adam(net.parameters(), 1e-3)
    order = np.random.default_rng(0)
    as_input = lambda x: torch.tensor(x[:, :8].T[None], dtype=torch.float32)  # noqa: E731
    for _ in range(10):
        for k in order.permutation(len(train)):
            x, y = train[k]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                net(as_input(x))[0, 0], torch.tensor(y, dtype=torch.float32)
            )
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    with torch.no_grad():
        return [net(as_input(x))[0, 0].double().numpy() for x in test]


def chord_changes(song: Path, seconds: np.ndarray) -> np.ndarray:
    """1.0 at each beat within a 16th of a change in the song's annotated chords (its
    `chord_midi.txt`: start, end, name a line; a chord named as the one before is no change)."""
    rows = [line.split() for line in (song.parent / "chord_midi.txt").read_text().splitlines() if line.strip()]
    starts = np.array([float(row[0]) for k, row in enumerate(rows) if k == 0 or row[2] != rows[k - 1][2]])
    sixteenth = np.gradient(seconds) / 4
    return (np.abs(seconds[:, None] - starts[None, :]).min(axis=1) <= sixteenth).astype(np.float64)


def favoured_beats(cue: np.ndarray, downbeat: np.ndarray) -> Counter:
    """(run length in 8-bar steps, up to 3: the beat of the bar the cue favours) over every run of
    at least 4 regular annotated bars; beat 0 is the annotated downbeat."""
    found = Counter()
    starts = np.flatnonzero(downbeat)
    regular = np.diff(starts) == 4
    k = 0
    while k < len(regular):
        end = k
        while end < len(regular) and regular[end]:
            end += 1
        if end - k >= 4:
            run = cue[starts[k] : starts[end]]
            found[(min((end - k) // 8, 3), int(np.argmax([run[p::4].mean() for p in range(4)])))] += 1
        k = max(end, k + 1)
    return found


def main() -> None:
    songs = song_files(SHARED_DATASETS / "pop909")
    fitted = set(songs[FITTED])
    data = []
    for song in songs:
        seconds, downbeat = annotations(song)
        table = tracker.as_table(load_score(song))
        features = tracker.bar_features(table, file_positions(table, seconds))
        data.append((song in fitted, seconds, downbeat, np.c_[features, chord_changes(song, seconds)]))
    fitted_cues, fitted_labels = [x for f, _, _, x in data if f], [d for f, _, d, _ in data if f]
    train = [(x[:, :-1], d) for x, d in zip(fitted_cues, fitted_labels)]
    test = [(s, d, x) for f, s, d, x in data if not f]
    weights = logistic([x for x, _ in train], fitted_labels)  # the tracker's own cues, as beat_tracker.py fits them
    chords_only = logistic([x[:, -1:] for x in fitted_cues], fitted_labels)
    both = logistic(fitted_cues, fitted_labels)
    cues = {
        "linear": [x[:, :-1] @ weights[1:] + weights[0] for _, _, x in test],
        "cnn": cnn_cues(train, [x[:, :-1] for _, _, x in test]),
        "chords (annotated)": [x[:, -1:] @ chords_only[1:] + chords_only[0] for _, _, x in test],
        "linear + chords (annotated)": [x @ both[1:] + both[0] for _, _, x in test],
    }
    labels = np.concatenate([d for _, d, _ in test])
    print(f"{len(test)} songs measured, {len(train)} fitted on; cues at the annotated beats\n")
    print("| cues | per-beat AUC | " + " | ".join(f"songs agreeing, cost {c:g}" for c in COSTS) + " |")
    print("|---|---|" + "---|" * len(COSTS))
    for name, values in cues.items():
        agreeing = []
        for cost in COSTS:
            tracker.SKIP_COST = cost
            ok = 0
            for (seconds, downbeat, _), cue in zip(test, values):
                found = tracker.Beats(seconds, tracker.bar_path(cue, 4) == 0, "annotated", 0.0, 4, 1.0)
                ok += min(tracker.downbeat_agreement(found, seconds, downbeat)) >= 0.9
            agreeing.append(f"{ok / len(test):.1%}")
        print(f"| {name} | {roc_auc(np.concatenate(values), labels):.3f} | " + " | ".join(agreeing) + " |")
    print(
        "\nThe beat the cues favour over a run of regular annotated bars (0: the annotated downbeat; 2: the half bar)\n"
    )
    print("| cues | run of | runs | beat 0 | beat 1 | beat 2 | beat 3 |")
    print("|---|---|---|---|---|---|---|")
    for name, values in cues.items():
        counts = sum((favoured_beats(cue, downbeat) for (_, downbeat, _), cue in zip(test, values)), Counter())
        for length, label in enumerate(("4-7 bars", "8-15 bars", "16-23 bars", "24 bars or more")):
            n = sum(counts[(length, p)] for p in range(4))
            shares = " | ".join(f"{counts[(length, p)] / max(n, 1):.0%}" for p in range(4))
            print(f"| {name} | {label} | {n} | {shares} |")


if __name__ == "__main__":
    main()
