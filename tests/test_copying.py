"""`musegen evaluate copy`: the score on loops built here and on real pieces (MMA renderings of the
golden set, Freedoom's game music): a perfect loop scores 1, a late or transposed one less,
silence 0; the F1 worked out by hand; corpus patterns; the command with a tiny model."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import DATA, GOLDEN
from tiny_models import tiny_checkpoint

from data_prep.common import Item
from data_prep.common import prepare as prepare_shards
from musegen.cli import main
from musegen.errors import DataError
from musegen.evaluation.run_copy import PROMPT_BARS, corpus_patterns, loop_scores, prepare
from musegen.metrics.copy_score import Loop
from musegen.music.grooves import BUILT_GROOVES, Pattern, built_patterns, cut_pattern
from musegen.music.notes import NoteTable, Track
from musegen.tokenizers.groove import GrooveTokenizer

MMA_FILES = sorted((GOLDEN / "groove_spe").glob("mma_*.mid"))[:6]
FREEDOOM_FILES = sorted((DATA / "multitrack").glob("*.mid"))
TOK = GrooveTokenizer()


def moved(pattern: Pattern, ticks: int = 0, semitones: int = 0) -> Pattern:
    """The pattern with every note `ticks` later and every pitched note `semitones` higher (notes
    moved past its end are dropped)."""
    notes = pattern.notes
    end = 2 * 4 * notes.tpq
    drums = np.array([t.is_drum for t in notes.tracks])[notes.track]
    start = notes.start + ticks
    pitch = np.where(drums, notes.pitch, notes.pitch + semitones)
    shifted = replace(notes, start=start, end=np.minimum(notes.end + ticks, end), pitch=pitch)
    return Pattern(pattern.name + " moved", pattern.source, shifted.select(start < end))


def real_pattern(path, every_role: bool = False) -> Pattern:
    """2 bars of a real file as the tokenizer reads it: from the first bar with a note, or with
    `every_role` from the first bar where bass, drums and other play in both bars."""
    notes = TOK.decode(TOK.encode(path).ids)
    first = next(
        b
        for b in range(notes.first_bar(), notes.last_onset_bar())
        if not every_role
        or all(set(notes.onsets_in(b + k, 1).role.tolist()) == {"bass", "drums", "other"} for k in (0, 1))
    )
    return cut_pattern(notes, first, path.stem, "corpus")


def test_the_built_grooves_are_distinct_two_bar_trios():
    patterns = built_patterns()
    assert len(patterns) == len(BUILT_GROOVES) >= 4
    for pattern in patterns:
        notes = pattern.notes
        assert set(notes.role.tolist()) == {"bass", "drums", "other"}
        assert notes.start.min() == 0 and notes.beats(notes.start).max() < 8
        for role in ("bass", "other"):  # the second bar changes chord
            mine = notes.select(notes.role == role)
            assert set(mine.onsets_in(0, 1).pitch.tolist()) != set(mine.onsets_in(1, 1).pitch.tolist())
    tempos = {p.notes.tempos[0][1] for p in patterns}
    assert len(tempos) >= 3


def test_a_perfect_loop_scores_one_late_or_transposed_less_and_silence_zero():
    for pattern in built_patterns():
        loop = prepare(TOK, pattern).loop
        assert loop_scores(TOK, loop, pattern, 4) == {"bass": 1.0, "drums": 1.0, "other": 1.0}, pattern.name
        assert loop.scores(NoteTable.empty(480), PROMPT_BARS, 4) == {"bass": 0.0, "drums": 0.0, "other": 0.0}
        # one step of the tokenizer's grid (1/12 beat) late: no onset is where it was
        late = loop_scores(TOK, loop, moved(pattern, ticks=pattern.notes.tpq // 12), 4)
        assert late == {"bass": 0.0, "drums": 0.0, "other": 0.0}, pattern.name
        # a tone up: the drums (never transposed) still loop, bass and chords miss every note
        assert loop_scores(TOK, loop, moved(pattern, semitones=2), 4) == {"bass": 0.0, "drums": 1.0, "other": 0.0}


def test_the_score_is_the_f1_of_onsets_and_pitches_per_bar_worked_out_by_hand():
    # pattern: bar 0 drums kick-snare-kick-snare on the beats, bar 1 drums silent
    loop = Loop(480, {"drums": [{(0, 36), (480, 38), (960, 36), (1440, 38)}, set()]})
    bar = 4 * 480
    # bar 4 (phase 0): two of the four, one extra; bar 5 (phase 1): one note where the pattern rests
    hits = [(t, t + 60, p, 100) for p, t in [(36, 4 * bar), (38, 4 * bar + 480), (42, 4 * bar + 240), (42, 5 * bar)]]
    drums = Track(None, 0, True, "drums")
    notes = NoteTable.of_tracks(480, [(drums, hits)])
    assert loop.scores(notes, 4, 1) == {"drums": pytest.approx(2 * 2 / (3 + 4))}
    assert loop.scores(notes, 4, 2) == {"drums": pytest.approx((4 / 7 + 0) / 2)}
    notes = NoteTable.of_tracks(480, [(drums, hits[:3])])  # both silent in bar 5: that bar is left out
    assert loop.scores(notes, 4, 2) == {"drums": pytest.approx(4 / 7)}
    assert math.isnan(loop.scores(notes, 5, 1)["drums"])  # nothing to compare


@pytest.mark.parametrize("path", MMA_FILES + FREEDOOM_FILES, ids=lambda p: p.stem)
def test_real_pieces_loop_to_one_and_other_pieces_score_less(path):
    pattern = real_pattern(path, every_role=path in FREEDOOM_FILES)  # Freedoom's tunes begin with intros
    loop = prepare(TOK, pattern).loop
    playing = {role for role, bars in loop.bars.items() if any(bars)}
    assert playing == {"bass", "drums", "other"} or path in MMA_FILES  # some golden files begin with fewer
    ceiling = loop_scores(TOK, loop, pattern, 4)
    assert {r: v for r, v in ceiling.items() if r in playing} == dict.fromkeys(playing, 1.0)
    assert all(math.isnan(v) for r, v in ceiling.items() if r not in playing)  # neither plays: not scored
    transposed = loop_scores(TOK, loop, moved(pattern, semitones=1), 4)
    assert {r: transposed[r] for r in playing} == {r: 1.0 if r == "drums" else 0.0 for r in playing}
    other = real_pattern(next(p for p in FREEDOOM_FILES + MMA_FILES if p != path))
    floor = loop_scores(TOK, loop, other, 4)
    assert max(floor[r] for r in playing) < 1.0


@pytest.fixture(scope="module")
def groove_corpus(tmp_path_factory):
    """Token shards of real MMA renderings, all in the test split, two to a style folder."""
    out = tmp_path_factory.mktemp("corpus")
    items = [Item(name=f"style{i // 2}/{p.stem}", path=p, group=p.stem) for i, p in enumerate(MMA_FILES)]
    prepare_shards(TOK, items, out, {"test": 1.0}, workers=1, split_of=lambda group: "test")
    return out


def test_corpus_patterns_are_the_first_two_playing_bars_of_one_piece_a_style(groove_corpus, pop909_songs, tmp_path):
    patterns, skipped = corpus_patterns(groove_corpus, "test", 4)  # one a style first
    chosen = [MMA_FILES[i] for i in (0, 2, 4, 1)]
    assert [p.name for p in patterns] == [f"style{i // 2}/{p.stem}" for i, p in zip((0, 2, 4, 1), chosen)]
    assert not skipped
    for pattern, path in zip(patterns, chosen):
        wanted, got = real_pattern(path).notes, pattern.notes
        assert sorted(zip(got.start, got.pitch)) == sorted(zip(wanted.start, wanted.pitch))
    with pytest.raises(DataError, match="no split"):
        corpus_patterns(groove_corpus, "nope", 3)
    from train_fixtures import prepare_pop909

    with pytest.raises(DataError, match="no track roles"):
        corpus_patterns(prepare_pop909(pop909_songs[:2], tmp_path / "pop"), "train", 1)


def test_cli_compares_models_beside_the_loop_and_bad_input_is_one_line(
    groove_corpus, tmp_path, capsys, one_torch_thread
):
    ckpt = tiny_checkpoint("groove", tmp_path / "tiny")
    out = tmp_path / "copy"
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "evaluate",
                "copy",
                "-c",
                f"a={ckpt}",
                "-c",
                f"b={ckpt}",
                "--data",
                str(groove_corpus),
                "--pieces",
                "2",
                "--bars",
                "1",
                "--samples",
                "1",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
    assert exit_info.value.code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "| a | 6 |" in printed and "| b | 6 |" in printed
    assert "| ceiling: the prompt's own loop | 6 | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 | - |" in printed
    result = json.loads((out / "copy.json").read_text())
    assert len(result["patterns"]) == 2 + len(BUILT_GROOVES)
    assert result["models"]["a"]["rows"] == result["models"]["b"]["rows"]  # same weights, same seeds
    assert len(list((out / "samples" / "a").glob("*.mid"))) == 6
    assert len(result["table"][0]["by_bar"]) == 1 and "mean by continued bar (1..1): a " in printed
    assert result["settings"]["sample"]["cache"] is None  # each model's default
    remi = tiny_checkpoint("remi", tmp_path / "remi")
    for bad in (
        ["-c", str(remi)],
        ["-c", str(ckpt), "--bars", "0"],
        ["-c", str(ckpt), "--cache", "1.5"],
        ["-c", str(ckpt), "--no-built"],
        ["-c", str(tmp_path / "missing")],
        ["-c", f"a={ckpt}", "-c", f"a={ckpt}"],
        ["-c", str(ckpt), "--data", str(tmp_path)],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["evaluate", "copy", "--out", str(tmp_path / "x"), "--device", "cpu", *bad])
        assert exit_info.value.code != 0
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("error:"), (bad, err)
