"""A two-sample test on bars: can a classifier tell one set of bars from another?

Each bar becomes a vector of named features (`FEATURES`: how many notes, their pitches,
durations, velocities, onset positions and pitch classes, and how they stand to the prompt's).
An L2-regularised logistic regression on the standardised features is trained to separate the two
sets, cross-validated with the folds grouped by song (no song's bars in both training and test),
and scored by the ROC AUC of the pooled out-of-fold scores: 0.5 when the sets cannot be told
apart, 1 when every bar of the first set scores above every bar of the second. A bootstrap over
songs gives its 95% interval. Which features give the first set away: each feature's own AUC,
ranked by its distance from 0.5 (above 0.5: higher in the first set).

`continuation_comparisons` runs the test of `musegen evaluate continuation`: generated bars, the
prompt copied, and another song's bars, each against the real continuations, with a control of
each song's real bars against its other real bars, which should be near 0.5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..music.notes import NoteTable
from .metric import cosine

STEPS_PER_BEAT = 4  # onset positions are counted on the 16th grid, folded onto one beat
PITCH_CLASS_NAMES = ("C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B")
FEATURES = (
    "notes",  # pitched onsets in the bar
    "onsets",  # distinct onset times, drums included
    "pitch mean",
    "pitch std",
    "pitch range",
    "duration mean",  # beats
    "duration std",
    "velocity mean",  # every note, drums included
    "velocity std",
    "polyphony",  # pitched notes sounding at each pitched onset, on average
    "off the 16th grid",  # share of onsets off the 16th grid
    "drum share",
    *(f"onsets at 16th {k} of the beat" for k in range(STEPS_PER_BEAT)),
    *(f"pitch class {name}" for name in PITCH_CLASS_NAMES),  # shares of the pitched onsets
    "pitch-class cosine to the prompt",
    "pitch mean minus the prompt's",
    "notes minus the prompt's",  # the prompt's notes per bar
    "velocity mean minus the prompt's",
)
COMPARISONS = ("generated", "copy prompt", "another song", "real vs real")
CONTINUATION_NOTE = (
    "Can a classifier tell these bars from the real continuations? {songs} pieces; per-bar features, logistic "
    "regression, 5 folds grouped by piece; auc 0.5: not told apart, 1: always told; 95% interval over pieces "
    "resampled. real vs real: each piece's real bars split in two at random (the control). telling_features: "
    "the features whose own AUC is farthest from 0.5 (above: higher in the compared bars). docs/evaluation.md."
)


# ---- features ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """What the prompt-relative features compare a bar with."""

    classes: np.ndarray  # pitch-class counts of the pitched onsets
    pitch_mean: float
    notes_per_bar: float
    velocity_mean: float

    @classmethod
    def of(cls, notes: NoteTable, first_bar: int, bars: int) -> Prompt:
        """The prompt as bars first_bar .. first_bar + bars - 1 of `notes`."""
        heard = notes.onsets_in(first_bar, bars)
        pitched = heard.pitched()
        return cls(
            np.bincount(pitched.pitch % 12, minlength=12).astype(np.float64),
            float(pitched.pitch.mean()) if len(pitched) else math.nan,
            len(pitched) / bars,
            float(heard.velocity.mean()) if len(heard) else math.nan,
        )


def bar_features(notes: NoteTable, first_bar: int, bars: int, prompt: Prompt) -> np.ndarray:
    """(bars, len(FEATURES)): each bar's features; NaN where a bar has no note to measure."""
    drum_tracks = np.array([t.is_drum for t in notes.tracks], dtype=bool)
    pitched_all = notes.pitched()
    rows = []
    for bar in range(first_bar, first_bar + bars):
        heard = notes.onsets_in(bar, 1)
        pitched = heard.select(~drum_tracks[heard.track]) if len(heard) else heard
        steps = heard.beats(heard.start - notes.bar_tick(bar)) * STEPS_PER_BEAT
        nearest = np.rint(steps).astype(np.int64)
        positions = np.bincount(nearest % STEPS_PER_BEAT, minlength=STEPS_PER_BEAT) / max(len(heard), 1)
        classes = np.bincount(pitched.pitch % 12, minlength=12).astype(np.float64)
        durations = pitched.beats(pitched.end - pitched.start)
        sounding = [
            np.count_nonzero((pitched_all.start <= t) & (pitched_all.end > t)) for t in np.unique(pitched.start)
        ]
        pitch_mean = _mean(pitched.pitch)
        velocity_mean = _mean(heard.velocity)
        rows.append(
            [
                len(pitched),
                len(np.unique(heard.start)),
                pitch_mean,
                _std(pitched.pitch),
                float(np.ptp(pitched.pitch)) if len(pitched) else math.nan,
                _mean(durations),
                _std(durations),
                velocity_mean,
                _std(heard.velocity),
                _mean(sounding),
                float(np.mean(np.abs(steps - nearest) > 1e-6)) if len(heard) else 0.0,
                float(np.mean(drum_tracks[heard.track])) if len(heard) else 0.0,
                *positions,
                *(classes / max(len(pitched), 1)),
                cosine(classes, prompt.classes),
                pitch_mean - prompt.pitch_mean,
                len(pitched) - prompt.notes_per_bar,
                velocity_mean - prompt.velocity_mean,
            ]
        )
    return np.array(rows, dtype=np.float64).reshape(bars, len(FEATURES))


def copied_prompt(notes: NoteTable, span_start: int, prompt_bars: int, bars: int, prompt: Prompt) -> np.ndarray:
    """The features of a continuation that repeats the prompt: bar j of the span copies prompt bar
    j mod prompt_bars (the prompt's bars before `span_start`)."""
    rows = bar_features(notes, span_start - prompt_bars, prompt_bars, prompt)
    return rows[np.arange(bars) % prompt_bars]


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def _std(values) -> float:
    return float(np.std(values)) if len(values) else math.nan


# ---- the classifier ---------------------------------------------------------------------------------


def standardiser(train: np.ndarray):
    """A function that standardises rows by `train`'s columns (mean 0, standard deviation 1; a
    constant column is only centred) and puts a missing value at the mean, 0."""
    known = np.isfinite(train)
    count = np.maximum(known.sum(0), 1)  # a column with no value at all gets mean 0 and std 1
    mean = np.where(known, train, 0.0).sum(0) / count
    std = np.sqrt((np.where(known, train - mean, 0.0) ** 2).sum(0) / count)
    std = np.where(std > 0, std, 1.0)
    return lambda rows: np.nan_to_num((rows - mean) / std)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, iterations: int = 100) -> np.ndarray:
    """The weights (one per column, then the intercept) minimising the summed log loss plus
    l2 / 2 * |weights|^2 (the intercept is not penalised), by Newton's method with step halving."""
    a = np.hstack([x, np.ones((len(x), 1))])
    penalty = np.full(a.shape[1], l2)
    penalty[-1] = 0.0

    def loss(w: np.ndarray) -> float:
        z = a @ w
        return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * np.sum(penalty * w * w))

    w = np.zeros(a.shape[1])
    for _ in range(iterations):
        p = _sigmoid(a @ w)
        gradient = a.T @ (p - y) + penalty * w
        hessian = (a * (p * (1 - p))[:, None]).T @ a + np.diag(penalty)
        step = np.linalg.solve(hessian + 1e-12 * np.eye(len(w)), gradient)
        before, scale = loss(w), 1.0
        while loss(w - scale * step) > before and scale > 1e-8:
            scale /= 2
        w = w - scale * step
        if np.max(np.abs(scale * step)) < 1e-10:
            break
    return w


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # exact to rounding, and no overflow for large |z|


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The probability that a positive (label 1) outscores a negative, ties counting one half:
    the Mann-Whitney statistic from average ranks. NaN without both labels or with a NaN score."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    positives, negatives = labels.sum(), (~labels).sum()
    if not positives or not negatives or np.isnan(scores).any():
        return math.nan
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # 1-based, ties at their average
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def song_folds(groups: np.ndarray, folds: int, seed: int = 0) -> np.ndarray:
    """Each row's fold: the songs shuffled (seeded) and dealt into min(folds, songs) folds, so that
    a song's rows all share one fold."""
    songs, song_of_row = np.unique(groups, return_inverse=True)
    fold_of_song = np.empty(len(songs), dtype=np.int64)
    fold_of_song[np.random.default_rng(seed).permutation(len(songs))] = np.arange(len(songs)) % folds
    return fold_of_song[song_of_row]


def out_of_fold_scores(x: np.ndarray, y: np.ndarray, fold: np.ndarray, l2: float = 1.0) -> np.ndarray:
    """Each row's log-odds from the classifier trained on the other folds; NaN for the rows of a
    fold whose training rows hold only one label."""
    scores = np.full(len(y), math.nan)
    for f in np.unique(fold):
        test, train = fold == f, fold != f
        if len(np.unique(y[train])) < 2:
            continue
        scaled = standardiser(x[train])
        w = fit_logistic(scaled(x[train]), y[train], l2)
        scores[test] = scaled(x[test]) @ w[:-1] + w[-1]
    return scores


# ---- the test ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TwoSample:
    auc: float  # ROC AUC of the pooled out-of-fold scores
    low: float  # its 95% interval over songs resampled with replacement
    high: float
    bars: tuple[int, int]  # rows of the first set, of the second
    songs: int
    telling: tuple[tuple[str, float], ...]  # (feature, its own AUC), the farthest from 0.5 first


def two_sample_test(
    first: np.ndarray,
    second: np.ndarray,
    first_songs: np.ndarray,
    second_songs: np.ndarray,
    folds: int = 5,
    seed: int = 0,
    resamples: int = 200,
    l2: float = 1.0,
) -> TwoSample:
    """How well bars `first` (rows of FEATURES) are told from bars `second`, each row's song given
    by `*_songs`: cross-validated in folds grouped by song (see the module docstring)."""
    x = np.vstack([first, second])
    y = np.r_[np.ones(len(first)), np.zeros(len(second))]
    groups = np.r_[first_songs, second_songs]
    scores = out_of_fold_scores(x, y, song_folds(groups, folds, seed), l2)
    low, high = _bootstrap_interval(scores, y, groups, resamples, seed)
    own = [roc_auc(column, y) for column in standardiser(x)(x).T]  # a missing value at its column's mean
    ranked = sorted(zip(FEATURES, own), key=lambda item: -abs(item[1] - 0.5) if not math.isnan(item[1]) else 0.0)
    return TwoSample(roc_auc(scores, y), low, high, (len(first), len(second)), len(np.unique(groups)), tuple(ranked))


def _bootstrap_interval(scores, y, groups, resamples: int, seed: int) -> tuple[float, float]:
    songs = np.unique(groups)
    rows_of = [np.flatnonzero(groups == s) for s in songs]
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        rows = np.concatenate([rows_of[s] for s in rng.integers(0, len(songs), len(songs))])
        values.append(roc_auc(scores[rows], y[rows]))
    values = np.array(values)
    values = values[np.isfinite(values)]
    if len(songs) < 2 or not len(values):
        return math.nan, math.nan
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def continuation_comparisons(songs: list[dict], seed: int = 0, **options) -> dict[str, TwoSample]:
    """The tests of `COMPARISONS` over songs given as {set: its bars' FEATURES rows (an array, or
    lists with None for NaN as pieces.jsonl holds them)}, each song with its "real" bars:
    "generated", "copy prompt" and "another song" each against the real bars (of the songs that
    have that set); "real vs real", each song's real bars split in two at random (seeded), so that
    the control has the others' design: every song on both sides. A comparison with fewer than two
    songs is left out. `options` go to `two_sample_test`."""
    songs = [
        {name: np.array(bars, dtype=np.float64).reshape(-1, len(FEATURES)) for name, bars in s.items()} for s in songs
    ]
    rng = np.random.default_rng(seed)
    halves = [np.array_split(song["real"][rng.permutation(len(song["real"]))], 2) for song in songs]
    results = {}
    for name in COMPARISONS:
        if name == "real vs real":
            pairs = [(first, second, i) for i, (first, second) in enumerate(halves)]
        else:
            pairs = [(song[name], song["real"], i) for i, song in enumerate(songs) if len(song.get(name, ()))]
        if len(pairs) < 2:
            continue
        first, second, index = zip(*pairs)
        first_songs = np.concatenate([np.full(len(f), i) for f, i in zip(first, index)])
        second_songs = np.concatenate([np.full(len(s), i) for s, i in zip(second, index)])
        first, second = np.vstack(first), np.vstack(second)
        results[name] = two_sample_test(first, second, first_songs, second_songs, seed=seed, **options)
    return results
