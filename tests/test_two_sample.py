"""The two-sample test of `musegen evaluate continuation` (`musegen.metrics.two_sample`): its bar
features on a bar worked out by hand, its AUC against a count of pairs, its logistic regression at
its optimum, and the whole test on POP909 bars: real against real is not told apart, bars made
quieter or an octave higher are, by the feature that was changed."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import pop909_files

from musegen.metrics.two_sample import (
    FEATURES,
    Prompt,
    bar_features,
    continuation_comparisons,
    copied_prompt,
    fit_logistic,
    roc_auc,
    song_folds,
    two_sample_test,
)
from musegen.music.notes import NoteTable, Track

TPB = 480


def beat(b: float) -> int:
    return round(b * TPB)


def test_the_features_of_a_bar_worked_out_by_hand():
    piano = [
        (beat(0), beat(1), 60, 80),  # bar 0, the prompt: C4 and G4
        (beat(2), beat(4), 67, 80),
        (beat(4), beat(6), 60, 100),  # bar 1: C4 held for half the bar, E4 an eighth after it,
        (beat(4.5), beat(5), 64, 60),
        (beat(5 + 1 / 3), beat(5 + 2 / 3), 69, 80),  # and A4 on a triplet, off the 16th grid
    ]
    drums = [(beat(4), beat(4.25), 36, 100), (beat(6), beat(6.25), 38, 100)]
    notes = NoteTable.of_tracks(TPB, [(Track(None, 0, False), piano), (Track(None, 0, True), drums)])
    prompt = Prompt.of(notes, 0, 1)
    rows = bar_features(notes, 1, 2, prompt)  # bar 1, and bar 2, which is empty
    assert rows.shape == (2, len(FEATURES))
    bar = dict(zip(FEATURES, rows[0]))
    pitches, durations, velocities = [60, 64, 69], [2, 0.5, 1 / 3], [100, 60, 80, 100, 100]
    expected = {
        "notes": 3,
        "onsets": 4,  # the C4 and the kick start together
        "pitch mean": np.mean(pitches),
        "pitch std": np.std(pitches),
        "pitch range": 9,
        "duration mean": np.mean(durations),
        "duration std": np.std(durations),
        "velocity mean": 88,
        "velocity std": np.std(velocities),
        "polyphony": (1 + 2 + 2) / 3,  # the C4 alone, then with the E4, then with the A4
        "off the 16th grid": 1 / 5,
        "drum share": 2 / 5,
        "onsets at 16th 0 of the beat": 3 / 5,  # C4, kick, snare
        "onsets at 16th 1 of the beat": 1 / 5,  # the triplet, at its nearest 16th
        "onsets at 16th 2 of the beat": 1 / 5,  # E4
        "onsets at 16th 3 of the beat": 0,
        "pitch class C": 1 / 3,
        "pitch class E": 1 / 3,
        "pitch class A": 1 / 3,
        "pitch class G": 0,
        "pitch-class cosine to the prompt": 1 / math.sqrt(6),  # {C, E, A} against {C, G}
        "pitch mean minus the prompt's": np.mean(pitches) - 63.5,
        "notes minus the prompt's": 3 - 2,
        "velocity mean minus the prompt's": 88 - 80,
    }
    assert {name: bar[name] for name in expected} == pytest.approx(expected)
    empty = dict(zip(FEATURES, rows[1]))
    assert empty["notes"] == 0 and empty["onsets"] == 0 and empty["onsets at 16th 0 of the beat"] == 0
    assert math.isnan(empty["pitch mean"]) and math.isnan(empty["velocity mean minus the prompt's"])
    copied = copied_prompt(notes, 2, 2, 3, prompt)  # bars 0, 1, 0 of the two before bar 2
    np.testing.assert_array_equal(copied, bar_features(notes, 0, 2, prompt)[[0, 1, 0]])


def test_the_auc_is_the_share_of_pairs_a_positive_wins_ties_counting_half():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, 300).astype(float)  # few values: many ties
    labels = rng.random(300) < 0.3
    positives, negatives = scores[labels], scores[~labels]
    pairs = (positives[:, None] > negatives[None, :]) + 0.5 * (positives[:, None] == negatives[None, :])
    assert roc_auc(scores, labels) == pytest.approx(pairs.mean(), abs=1e-12)
    assert roc_auc(np.ones(10), np.arange(10) < 5) == 0.5
    assert roc_auc(np.arange(10.0), np.arange(10) >= 5) == 1.0
    assert math.isnan(roc_auc(np.arange(4.0), np.ones(4)))  # one label only


@pytest.mark.parametrize("separable", [False, True])
def test_the_logistic_regression_stops_at_its_optimum(separable):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 3))
    x[:, 0] += np.sign(x[:, 0])  # a margin of 2 around x0 = 0
    y = (x[:, 0] > 0).astype(float) if separable else (rng.random(200) < 1 / (1 + np.exp(-x @ [1, -1, 0]))) * 1.0
    w = fit_logistic(x, y, l2=1.0)
    a = np.hstack([x, np.ones((200, 1))])
    gradient = a.T @ (1 / (1 + np.exp(-a @ w)) - y) + np.r_[w[:-1], 0.0]  # the intercept is not penalised
    assert np.abs(gradient).max() < 1e-8
    if separable:  # the penalty keeps the weights finite, and they still separate every row
        assert np.all(((a @ w) > 0) == (y == 1)) and np.isfinite(w).all()
    else:  # the weights the labels were drawn with, roughly
        assert w[:3] == pytest.approx([1, -1, 0], abs=0.3)
    # without features the optimum is the log-odds of the labels
    assert fit_logistic(np.zeros((200, 0)), y)[-1] == pytest.approx(math.log(y.mean() / (1 - y.mean())))


def test_no_song_is_in_two_folds():
    groups = np.repeat(np.arange(12), 5)
    folds = song_folds(groups, 5, seed=3)
    assert all(len(set(folds[groups == g])) == 1 for g in range(12))
    assert sorted(np.bincount(folds[::5])) == [2, 2, 2, 3, 3]  # songs dealt evenly


@pytest.fixture(scope="module")
def pop909(pop909_dir) -> list[NoteTable]:
    # in 4/4, as the pop tokens hold them (the raw files declare 2/4 or 1/4 bars that are not the songs')
    return [replace(NoteTable.read(path), time_signatures=[(0, 4, 4)]) for path in pop909_files(folder=pop909_dir)]


def span_bars(notes: NoteTable) -> np.ndarray:
    """12 bars after a pickup bar and 4 prompt bars, as `evaluate continuation` measures them."""
    start = notes.first_bar() + 1
    return bar_features(notes, start + 4, 12, Prompt.of(notes, start, 4))


def test_real_bars_against_real_bars_are_not_told_apart(pop909):
    assert len(pop909) >= 30
    control = continuation_comparisons([{"real": span_bars(notes)} for notes in pop909])["real vs real"]
    assert abs(control.auc - 0.5) < 0.1 and control.low < 0.5 < control.high
    assert control.bars == (6 * len(pop909), 6 * len(pop909)) and control.songs == len(pop909)


@pytest.mark.parametrize(
    "change, feature",
    [
        (lambda notes: replace(notes, velocity=notes.velocity // 2), "velocity mean"),
        (lambda notes: replace(notes, pitch=notes.pitch + 12), "pitch mean"),
    ],
    ids=["quieter", "octave higher"],
)
def test_changed_bars_are_told_apart_by_the_feature_that_changed(pop909, change, feature):
    real = [span_bars(notes) for notes in pop909]
    changed = [span_bars(change(notes)) for notes in pop909]
    songs = np.concatenate([np.full(len(bars), i) for i, bars in enumerate(real)])
    result = two_sample_test(np.vstack(changed), np.vstack(real), songs, songs)
    assert result.auc > 0.9 and result.low > 0.9
    assert result.telling[0][0] == feature


def test_another_songs_bars_are_told_by_their_pitch_classes(pop909):
    """Another song's bars are real music: their own features are the real bars' in another order,
    so only how they stand to this prompt gives them away."""
    songs = []
    for i, notes in enumerate(pop909):
        other, start = pop909[(i + len(pop909) // 2) % len(pop909)], notes.first_bar() + 1
        prompt = Prompt.of(notes, start, 4)
        songs.append({"real": span_bars(notes), "another song": bar_features(other, other.first_bar() + 5, 12, prompt)})
    result = continuation_comparisons(songs)
    assert result["another song"].auc > result["real vs real"].high
    assert result["another song"].telling[0][0] == "pitch-class cosine to the prompt"
