"""Style profiles on MIDI whose histograms are known by construction (PAPER_NOTES §4)."""

from __future__ import annotations

import csv
import math

import miditoolkit
import numpy as np
import pytest
import symusic

from musegen.cli import main
from musegen.metrics import style
from musegen.render import PROMPT_END_MARKER

TPQ = 480


def write_midi(path, tracks, marker_beat=None):
    """tracks: list of (program, is_drum, [(start_beat, duration_beats, pitch), ...])."""
    midi = miditoolkit.MidiFile(ticks_per_beat=TPQ)
    for program, is_drum, notes in tracks:
        inst = miditoolkit.Instrument(program, is_drum=is_drum)
        inst.notes = [miditoolkit.Note(90, p, round(s * TPQ), round((s + d) * TPQ)) for s, d, p in notes]
        midi.instruments.append(inst)
    if marker_beat is not None:
        midi.markers.append(miditoolkit.Marker(PROMPT_END_MARKER, round(marker_beat * TPQ)))
    midi.dump(str(path))
    return path


def notes_of(triples):
    s, d, p = (np.array(x) for x in zip(*triples))
    return style.Notes(s.astype(float), d.astype(float), p.astype(int))


# Pattern A: the same pitch on every beat, half a beat long. Pattern B: off-beat notes climbing by
# a semitone, 1.5 beats long. They share no bin of any profile (see test_disjoint_bins_score_zero).
def bar_a(bar):
    return [(4 * bar + k, 0.5, 60) for k in range(4)]


def bar_b(bar):
    return [(4 * bar + k + 0.5, 1.5, 50 + 4 * bar + k) for k in range(4)]


def test_time_pitch_bins_by_hand():
    # C at 0, E at 1/3 beat, G at 2 beats: pairs (+4 at dt 1/3), (+7 at dt 2), (+3 at dt 5/3).
    hist = style.time_pitch_profile(notes_of([(0, 1, 60), (1 / 3, 1, 64), (2, 1, 67)]))
    assert hist.shape == (24, 41) and hist.sum() == 3
    assert hist[2, 20 + 4] == hist[12, 20 + 7] == hist[10, 20 + 3] == 1


def test_time_pitch_window_and_interval_limits():
    # dt = 4 beats is outside [0, 4); an interval of 21 semitones is outside -20..20; chords count both ways.
    hist = style.time_pitch_profile(notes_of([(0, 1, 60), (4, 1, 60), (5, 1, 81), (5, 1, 62)]))
    assert hist[0, 20 + 19] == 1 and hist[0, 20 - 19] == 1  # the chord at beat 5 (81/62), both orders
    assert hist[6, 20 + 2] == 1  # 60 at beat 4 -> 62 at beat 5
    assert hist.sum() == 3  # 60@4 -> 81@5 is a 21-semitone leap: not counted


def test_onset_duration_bins_by_hand():
    # onset 4.5 beats is 0.5 into its bar (bin 3); durations 0.25 -> bin 1, exactly 2 -> last bin, 3 -> dropped.
    hist = style.onset_duration_profile(notes_of([(4.5, 0.25, 60), (1, 2.0, 60), (2, 3.0, 60)]))
    assert hist.shape == (24, 12) and hist.sum() == 2
    assert hist[3, 1] == 1 and hist[6, 11] == 1


def test_identical_pieces_score_one(tmp_path):
    piece = write_midi(tmp_path / "a.mid", [(0, False, bar_a(0) + bar_b(1)), (33, False, bar_b(0)),
                                            (0, True, [(k / 2, 0.1, 36 + k % 3) for k in range(16)])])
    rows = style.score_piece(piece, piece, n_segments=1)
    assert {(r["track"], r["metric"]) for r in rows} == {("other", "time-pitch"), ("other", "onset-duration"),
                                                          ("bass", "time-pitch"), ("bass", "onset-duration"),
                                                          ("drums", "onset-drum")}
    assert all(r["similarity"] == pytest.approx(1.0) for r in rows)


def test_disjoint_bins_score_zero(tmp_path):
    a = write_midi(tmp_path / "a.mid", [(0, False, bar_a(0) + bar_a(1))])
    b = write_midi(tmp_path / "b.mid", [(0, False, bar_b(0) + bar_b(1))])
    rows = style.score_piece(a, b, n_segments=1)
    assert len(rows) == 2 and all(r["similarity"] == 0.0 for r in rows)
    # ... while each pattern alone does have notes in its profiles
    assert all(r["generated_notes"] == 8 and r["reference_notes"] == 8 for r in rows)


def test_transposed_piece_keeps_time_pitch_profile(pop909_songs, tmp_path):
    score = symusic.Score(str(pop909_songs[0]))
    up = score.shift_pitch(5)
    up.dump_midi(str(tmp_path / "up.mid"))
    original, _ = style.read_piece(pop909_songs[0])
    shifted, _ = style.read_piece(tmp_path / "up.mid")
    a, b = style.time_pitch_profile(original["other"]), style.time_pitch_profile(shifted["other"])
    assert a.sum() > 1000 and np.array_equal(a, b)
    assert style.cosine(a, b) == pytest.approx(1.0)
    # the pitches did move: a pitch-class profile would not survive this
    assert not np.array_equal(original["other"].pitch, shifted["other"].pitch)


def test_cosine_is_nan_for_an_empty_profile():
    assert math.isnan(style.cosine(np.zeros((2, 2)), np.ones((2, 2))))
    assert style.cosine(np.array([1.0, 0.0]), np.array([1.0, 1.0])) == pytest.approx(1 / math.sqrt(2))


def test_quarters_of_the_continuation_follow_the_marker(tmp_path):
    # prompt (2 bars of B, before the marker) then A, A, B, B: each quarter is one bar.
    notes = bar_b(0) + bar_b(1) + bar_a(2) + bar_a(3) + bar_b(4) + bar_b(5)
    notes[-1] = (notes[-1][0], 0.5, notes[-1][2])  # the piece ends exactly at the end of bar 5
    (tmp_path / "gen").mkdir(), (tmp_path / "ref").mkdir()
    gen = write_midi(tmp_path / "gen" / "song_000.mid", [(0, False, notes)], marker_beat=8)
    write_midi(tmp_path / "ref" / "song.mid", [(0, False, bar_a(0))])
    write_midi(tmp_path / "ref" / "other.mid", [(0, False, bar_b(0))])
    rows = style.score_piece(gen, tmp_path / "ref" / "song.mid")
    onset = [r["similarity"] for r in rows if r["metric"] == "onset-duration"]
    assert onset == pytest.approx([1, 1, 0, 0])
    pitch = [r["similarity"] for r in rows if r["metric"] == "time-pitch"]
    assert pitch[0] == pytest.approx(1) and pitch[2:] == [0, 0]

    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "style", "--generated", str(tmp_path / "gen"), "--reference", str(tmp_path / "ref"),
              "--out", str(out)])
    assert exit_.value.code in (0, None)
    table = list(csv.DictReader(open(out / "style.csv")))
    assert {r["reference"] for r in table} == {"song.mid"} and len(table) == 8
    assert (out / "style.png").read_bytes()[:4] == b"\x89PNG"


def test_match_reference_by_folder_and_longest_stem_prefix(tmp_path):
    refs = {name: tmp_path / name for name in ("song.mid", "song_2.mid", "other.mid", "funk/0.mid", "jazz/0.mid")}
    assert style.match_reference("song_000.mid", refs) == refs["song.mid"]
    assert style.match_reference("song_2_001.mid", refs) == refs["song_2.mid"]
    assert style.match_reference("songbook_000.mid", refs) is None
    assert style.match_reference("jazz/0_000.mid", refs) == refs["jazz/0.mid"]  # same stem, other folder
    assert style.match_reference("funk/0_003.mid", refs) == refs["funk/0.mid"]
    assert style.match_reference("0_000.mid", refs) is None
    assert style.match_reference("x.mid", {"a.mid": refs["song.mid"]}) == refs["song.mid"]


def test_evaluate_style_without_matches_is_one_line_error(tmp_path, capsys):
    (tmp_path / "gen").mkdir(), (tmp_path / "ref").mkdir()
    write_midi(tmp_path / "gen" / "a_000.mid", [(0, False, bar_a(0))])
    write_midi(tmp_path / "ref" / "b.mid", [(0, False, bar_a(0))])
    write_midi(tmp_path / "ref" / "c.mid", [(0, False, bar_a(0))])
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "style", "--generated", str(tmp_path / "gen"), "--reference", str(tmp_path / "ref")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 1 and err.startswith("error:") and "\n" not in err
