"""The continuation metrics count a piece's own bars: a bar of 3/4 is three beats, a pickup is a
bar of its own length, a meter change starts a bar, as the song tokens write them. Before, every
span was cut in 4-beat bars: 8 bars continued in 3/4 were measured over 32 beats, the last 8 of
them silent in every sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_prep.scores import convert
from musegen.evaluation.run_continuation import ContinuationSettings, usable_pieces
from musegen.generation.settings import SampleSettings
from musegen.metrics.span import groove_consistency, span_metrics
from musegen.metrics.style import onset_drum_profile
from musegen.metrics.two_sample import FEATURES, Prompt, bar_features
from musegen.music.notes import NoteTable, Track
from musegen.tokenizers import tokenizer_from_dict

TPQ = 480


def waltz(bars: int = 14, pickup: bool = True) -> NoteTable:
    """A 3/4 piece with a quarter-note pickup (a 1/4 bar): in every 3/4 bar a bass note on beat 1
    and a chord tone on beats 2 and 3, and a hi-hat on every beat."""
    start = TPQ if pickup else 0
    bass, upper, hats = [], [(0, TPQ, 67, 80)] if pickup else [], []
    for bar in range(bars):
        line = start + 3 * TPQ * bar
        bass.append((line, line + TPQ, 43 + bar % 3, 90))
        upper += [(line + k * TPQ, line + (k + 1) * TPQ, 64 + k, 70) for k in (1, 2)]
        hats += [(line + k * TPQ, line + k * TPQ + 60, 42, 60) for k in range(3)]
    tracks = [(Track("bass", 33, False), bass), (Track("piano", 0, False), upper), (Track("hats", 0, True), hats)]
    meters = [(0, 1, 4), (TPQ, 3, 4)] if pickup else [(0, 3, 4)]
    return NoteTable.of_tracks(TPQ, tracks, [(0, 120.0)], meters)


def test_bars_follow_the_time_signatures():
    piece = waltz()
    assert [piece.bar_tick(b) for b in range(4)] == [0, TPQ, 4 * TPQ, 7 * TPQ]
    assert piece.bar_tick(2.5) == 4 * TPQ + 1.5 * TPQ  # half into a 3/4 bar
    assert piece.bar_of(np.array([0, TPQ - 1, TPQ, 4 * TPQ - 1, 4 * TPQ])).tolist() == [0, 0, 1, 1, 2]
    assert piece.in_bar(np.array([5 * TPQ, 7 * TPQ + 2 * TPQ])).tolist() == [TPQ, 2 * TPQ]
    assert (piece.first_bar(), piece.last_onset_bar()) == (0, 14)  # the pickup, then 14 bars of 3/4
    assert len(piece.onsets_in(1, 1)) == 1 + 2 + 3  # bass, two chord tones, three hats
    # without time signatures bars are 4 beats, as they always were
    plain = NoteTable.of_tracks(TPQ, [(Track("piano", 0, False), [(0, TPQ, 60, 80)])], [(0, 120.0)], [])
    assert [plain.bar_tick(b) for b in range(3)] == [0, 4 * TPQ, 8 * TPQ] and plain.bar_of(4 * TPQ) == 1


def test_span_metrics_measure_the_bars_of_the_meter():
    piece = waltz()
    metrics = span_metrics(piece, 5, 8, np.ones(12))
    assert metrics["notes per bar"] == 3  # the pitched notes of a 3/4 bar
    assert metrics["silent beats"] == 0  # (cut in 4-beat bars, the span ran past the end)
    assert metrics["bars with a low note"] == 1
    assert metrics["groove consistency"] == groove_consistency(piece, 5, 8) == 1.0
    moved = NoteTable.of_tracks(  # bar 6's hats an 8th late: 6 of its 12 16ths differ from bar 5's and bar 7's
        TPQ,
        [
            (
                Track("hats", 0, True),
                [
                    (t + (TPQ // 2 if piece.bar_of(t) == 6 else 0), t + TPQ // 2, 42, 60)
                    for t in piece.start[piece.pitch == 42]
                ],
            )
        ],
        [(0, 120.0)],
        piece.time_signatures,
    )
    assert groove_consistency(moved, 5, 3) == pytest.approx(1 - 6 / 12)


def test_bar_features_and_style_place_onsets_in_the_bar():
    piece = waltz()
    rows = bar_features(piece, 5, 2, Prompt.of(piece, 1, 4))
    on_beat = FEATURES.index("onsets at 16th 0 of the beat")
    assert rows[:, FEATURES.index("onsets")].tolist() == [3, 3] and rows[:, on_beat].tolist() == [1, 1]
    hats = piece.select(piece.pitch == 42)
    profile = onset_drum_profile(hats)
    assert np.flatnonzero(profile[:, 42]).tolist() == [0, 6, 12]  # beats 1, 2 and 3 of the bar, 6 bins a beat


def test_the_protocol_takes_a_3_4_piece_as_long_as_it_is():
    """A pickup, 4 bars of prompt and 8 to continue: 12 bars of 3/4 after the pickup suffice (cut
    in 4-beat bars, 37 beats held only 10 bars)."""
    tok = tokenizer_from_dict({"kind": "song"})
    settings = ContinuationSettings(prompt_bars=4, sample=SampleSettings(bars=8, num_samples=1, seed=0))
    pieces = {name: tok.encode(waltz(n).midi_bytes()).ids for name, n in (("long", 12), ("short", 11))}
    usable, skipped = usable_pieces(tok, list(pieces), list(pieces.values()), settings)
    assert [p.name for p in usable] == ["long"] and usable[0].span_start == 5
    assert list(skipped) == ["short"] and "needs 13" in skipped["short"]


def test_a_real_tune_in_6_8_is_measured_in_its_bars(tmp_path):
    """O'Neill's jig no. 7 (music21's corpus) as `data prepare music21-song` writes it (an 8th-note
    pickup, then 6/8), decoded from the song tokens: every bar line of the tokens is one of the
    table's."""
    corpus = pytest.importorskip("music21.corpus")
    tune = Path(corpus.__file__).parent / "oneills1850" / "0001-0050.abc"
    _, failed = convert((tune, 7, tmp_path / "jig.mid", {"bpm": 120.0, "program": 40, "pickup": "bar"}))
    assert failed is None
    tok = tokenizer_from_dict({"kind": "song"})
    ids = tok.encode(tmp_path / "jig.mid").ids
    notes = tok.decode(ids)
    bars = np.cumsum(np.asarray(ids) == tok.bar_id) - 1  # the bar each token is in
    struck = (tok.pitch_of[ids] >= 0) | (tok.drum_of[ids] >= 0)
    assert bars[-1] >= 13 and notes.time_signatures[:2] == [(0, 1, 8), (TPQ // 2, 6, 8)]
    assert np.bincount(notes.bar_of(notes.start)).tolist() == np.bincount(bars[struck]).tolist()
