"""Style profiles on MIDI whose histograms are known by construction, on the golden MMA pieces,
and against a brute-force pair count in exact fractions."""

from __future__ import annotations

import csv
import itertools
import math
import tracemalloc
from fractions import Fraction

import miditoolkit
import numpy as np
import pytest
import symusic
from conftest import GOLDEN

from musegen.cli import main
from musegen.evaluation import run_style
from musegen.metrics import style
from musegen.metrics.metric import cosine
from musegen.render import PROMPT_END_MARKER

TPQ = 480
BOSSA = GOLDEN / "groove_spe" / "mma_BossaNova.mid"  # MMA's bass here plays GM program 26 (a guitar)


def write_midi(path, tracks, marker_beat=None, tpq=TPQ):
    """tracks: list of (program, is_drum, [(start_beat, duration_beats, pitch), ...]) or with a
    track name as a fourth element."""
    midi = miditoolkit.MidiFile(ticks_per_beat=tpq)
    for program, is_drum, notes, *name in tracks:
        inst = miditoolkit.Instrument(program, is_drum=is_drum, name=name[0] if name else "")
        inst.notes = [miditoolkit.Note(90, p, round(s * tpq), round((s + d) * tpq)) for s, d, p in notes]
        midi.instruments.append(inst)
    if marker_beat is not None:
        midi.markers.append(miditoolkit.Marker(PROMPT_END_MARKER, round(marker_beat * tpq)))
    midi.dump(str(path))
    return path


def notes_of(triples, tpq=TPQ):
    """(start beat, duration beats, pitch) -> one role's notes in ticks (beats given as exact fractions)."""
    s, d, p = (list(x) for x in zip(*triples))
    ticks = lambda beats: np.array([int(Fraction(b) * tpq) for b in beats], dtype=np.int64)
    start = ticks(s)
    return style.role_notes("other", tpq, start, start + ticks(d), np.array(p, dtype=np.int64))


def brute_time_pitch(notes) -> np.ndarray:
    """Every ordered pair, binned in exact fractions of a beat: the definition, at n^2 cost."""
    hist = np.zeros((24, 41), dtype=np.int64)
    for a, b in itertools.permutations(range(len(notes)), 2):
        dt = Fraction(int(notes.start[b] - notes.start[a]), notes.tpq)
        interval = int(notes.pitch[b] - notes.pitch[a])
        if 0 <= dt < 4 and abs(interval) <= 20:
            hist[math.floor(dt * 6), interval + 20] += 1
    return hist


# Pattern A: the same pitch on every beat, half a beat long. Pattern B: off-beat notes climbing by
# a semitone, 1.5 beats long. They share no bin of any profile (see test_disjoint_bins_score_zero).
def bar_a(bar):
    return [(4 * bar + k, 0.5, 60) for k in range(4)]


def bar_b(bar):
    return [(4 * bar + k + 0.5, 1.5, 50 + 4 * bar + k) for k in range(4)]


# ---------------------------------------------------------------- the profiles, exactly


def test_time_pitch_bins_by_hand():
    # C at 0, E at 1/3 beat, G at 2 beats: pairs (+4 at dt 1/3), (+7 at dt 2), (+3 at dt 5/3).
    hist = style.time_pitch_profile(notes_of([(0, 1, 60), (Fraction(1, 3), 1, 64), (2, 1, 67)]))
    assert hist.shape == (24, 41) and hist.sum() == 3
    assert hist[2, 20 + 4] == hist[12, 20 + 7] == hist[10, 20 + 3] == 1


def test_time_pitch_window_and_interval_limits():
    # dt = 4 beats is outside [0, 4); an interval of 21 semitones is outside -20..20; chords count both ways.
    hist = style.time_pitch_profile(notes_of([(0, 1, 60), (4, 1, 60), (5, 1, 81), (5, 1, 62)]))
    assert hist[0, 20 + 19] == 1 and hist[0, 20 - 19] == 1  # the chord at beat 5 (81/62), both orders
    assert hist[6, 20 + 2] == 1  # 60 at beat 4 -> 62 at beat 5
    assert hist.sum() == 3  # 60@4 -> 81@5 is a 21-semitone leap: not counted
    twice = style.time_pitch_profile(notes_of([(0, 1, 60), (0, 1, 60), (0, 1, 60)]))
    assert twice[0, 20] == 6 and twice.sum() == 6  # three equal notes: 3 x 2 ordered pairs


@pytest.mark.parametrize("tpq", [12, 96, 480, 960])
def test_a_triplet_and_twelfth_grid_is_binned_exactly(tpq):
    """Every onset k/12 beat (and triplets) over two bars, on a 1/12-beat grid: no pair lands in
    another bin than the exact fraction says; reading times as float32 beats misbins some."""
    onsets = [Fraction(k, 12) for k in range(96)] + [Fraction(k, 3) + 8 for k in range(24)]
    notes = notes_of([(t, Fraction(1, 12), 40 + i % 9) for i, t in enumerate(onsets)], tpq=tpq)
    assert np.array_equal(style.time_pitch_profile(notes), brute_time_pitch(notes))
    bins = style._onset_bins(notes)
    assert bins.tolist() == [math.floor(t % 4 * 6) for t in onsets]
    as_float32 = np.floor(np.float32(notes.start % (4 * tpq)) / np.float32(tpq) / np.float32(1 / 6)).astype(int)
    assert tpq != 480 or (as_float32 != bins).sum() > 0  # what exact integers avoid


def test_time_pitch_matches_the_brute_force_definition_on_random_notes():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 60))
        triples = [(Fraction(int(rng.integers(0, 96)), 12), 1, int(rng.integers(50, 80))) for _ in range(n)]
        notes = notes_of(triples)
        assert np.array_equal(style.time_pitch_profile(notes), brute_time_pitch(notes))


@pytest.mark.parametrize("tpq", [96, 480])
def test_dense_notes_counted_on_the_grid_match_the_definition(monkeypatch, tpq):
    """The grid's FFT count (what a dense bar takes) equals the brute-force definition, stacked
    equal notes and chords included, and the lag sweep on a bar too dense to brute-force."""
    rng = np.random.default_rng(5)
    triples = [(Fraction(int(rng.integers(0, 48)), 6), 1, int(rng.integers(55, 70))) for _ in range(120)]
    small = notes_of(triples + triples[:10], tpq=tpq)  # 10 notes twice
    monkeypatch.setattr(style, "GRID_WHEN", 0)  # the grid, whatever the density
    assert np.array_equal(style.time_pitch_profile(small), brute_time_pitch(small))
    start = rng.integers(0, 4 * tpq, 20_000)
    dense = style.role_notes("other", tpq, start, start + 1, rng.integers(21, 109, 20_000))
    on_grid = style.time_pitch_profile(dense)
    monkeypatch.setattr(style, "GRID_WHEN", 10**18)  # the lag sweep, whatever the density
    assert np.array_equal(on_grid, style.time_pitch_profile(dense))


def test_a_dense_bar_in_a_long_piece_is_not_counted_on_a_huge_grid():
    """One dense bar and a note 5,000 bars later: the grid would span 10^9 cells, so the pairs are
    swept instead, in bounded memory."""
    rng = np.random.default_rng(0)
    start = np.append(rng.integers(0, 4 * TPQ, 3000), 5000 * 4 * TPQ).astype(np.int64)
    notes = style.role_notes("other", TPQ, start, start + 1, rng.integers(21, 109, len(start)))
    tracemalloc.start()
    try:
        hist = style.time_pitch_profile(notes)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20 and hist.sum() > 0


def test_pairs_are_bounded_to_four_beats_for_a_long_file():
    """60,000 notes, one per half beat: an n^2 matrix would need 28 GB; each note pairs with the
    next 7 only (dt 0.5 .. 3.5 beats)."""
    n = 60_000
    start = np.arange(n, dtype=np.int64) * TPQ // 2
    notes = style.role_notes("other", TPQ, start, start + TPQ // 4, np.full(n, 60, dtype=np.int64))
    hist = style.time_pitch_profile(notes)
    assert hist.sum() == 7 * n - 28
    assert hist[3:22:3, 20].tolist() == [n - k for k in range(1, 8)]


def test_onset_duration_bins_by_hand():
    # onset 4.5 beats is 0.5 into its bar (bin 3); durations 0.25 -> bin 1, exactly 2 -> last bin, 3 -> dropped.
    hist = style.onset_duration_profile(notes_of([(Fraction(9, 2), Fraction(1, 4), 60), (1, 2, 60), (2, 3, 60)]))
    assert hist.shape == (24, 12) and hist.sum() == 2
    assert hist[3, 1] == 1 and hist[6, 11] == 1


def test_similarity_rules():
    ones, zeros = np.ones((2, 2)), np.zeros((2, 2))
    assert math.isnan(cosine(zeros, ones))
    assert cosine(np.array([1.0, 0.0]), np.array([1.0, 1.0])) == pytest.approx(1 / math.sqrt(2))
    assert style.similarity(zeros, ones) == 0.0, "an empty segment scores 0"
    assert math.isnan(style.similarity(ones, zeros)), "nothing to compare with"


# ---------------------------------------------------------------- roles


def test_a_groove2groove_piece_finds_its_bass_by_name():
    by_role, marker = run_style.read_piece(BOSSA)
    score = symusic.Score(str(BOSSA))
    bass = next(t for t in score.tracks if t.name == "BB Bass")
    assert bass.program == 26 and marker is None
    assert sorted(by_role["bass"].pitch.tolist()) == sorted(n.pitch for n in bass.notes)
    assert by_role["bass"].start.min() == min(n.time for n in bass.notes) - 8 * score.tpq, "the count-in is left out"
    drums = next(t for t in score.tracks if t.name == "BB Drums")
    assert len(by_role["drums"]) == len(drums.notes) - 8, "the count-in's 8 clicks are gone"
    guitar = next(t for t in score.tracks if t.name == "BB Guitar")
    assert len(by_role["other"]) == len(guitar.notes)
    rows = run_style.score_piece(BOSSA, BOSSA, n_segments=2)
    assert {r["track"] for r in rows} == {"bass", "drums", "other"}
    assert all(r["similarity"] > 0.5 for r in rows)


def test_other_is_the_busiest_harmonic_track_or_all_merged():
    soul = GOLDEN / "groove_spe" / "mma_Soul.mid"  # Strings 40, Piano 306, Guitar 332 notes
    busiest, _ = run_style.read_piece(soul)
    merged, _ = run_style.read_piece(soul, other="merged")
    score = symusic.Score(str(soul))
    count = {t.name: len(t.notes) for t in score.tracks}
    assert len(busiest["other"]) == count["BB Guitar"]
    assert len(merged["other"]) == count["BB Guitar"] + count["BB Piano"] + count["BB Strings"]
    with pytest.raises(Exception, match="--other"):
        run_style.read_piece(soul, other="loudest")


def test_bass_by_program_then_by_name_then_lowest(tmp_path):
    piano = (0, False, [(b, 1, 72) for b in range(8)], "Piano")
    drums = (0, True, [(b, 0.1, 36) for b in range(8)], "Kit")
    program = write_midi(tmp_path / "a.mid", [piano, drums, (33, False, [(b, 1, 80) for b in range(4)], "Low")])
    named = write_midi(
        tmp_path / "b.mid",
        [
            piano,
            drums,
            (26, False, [(b, 1, 76) for b in range(4)], "Slap Bass"),
            (0, False, [(b, 1, 40) for b in range(2)], "Pad"),
        ],
    )
    lowest = write_midi(tmp_path / "c.mid", [piano, drums, (0, False, [(b, 1, 40) for b in range(2)], "Pad")])
    assert run_style.read_piece(program)[0]["bass"].pitch.tolist() == [80] * 4
    assert run_style.read_piece(named)[0]["bass"].pitch.tolist() == [76] * 4
    assert run_style.read_piece(lowest)[0]["bass"].pitch.tolist() == [40] * 2


def test_the_baselines_continue_a_reference_after_its_own_bars_in_its_meter(tmp_path):
    """In 3/4 the protocol's 2-bar prompt ends at beat 6, not at the 8 beats of two 4/4 bars."""
    path = write_midi(tmp_path / "waltz.mid", [(33, False, [(b, 1, 40 + b) for b in range(24)], "Bass")])
    midi = miditoolkit.MidiFile(str(path))
    midi.time_signature_changes = [miditoolkit.TimeSignature(3, 4, 0)]
    midi.dump(str(path))
    by_role, _ = run_style.read_piece(path)
    segments = run_style._after_prompt(by_role, 1)
    assert segments[0]["bass"].start.min() == 6 * TPQ
    assert len(segments[0]["bass"]) == 24 - 6


def test_a_continuation_takes_its_roles_from_the_piece_it_continues():
    """A sample that lets the piece's bass rest: inferred alone, its lowest guitar would be the
    bass and be scored against the piece's bass; read beside the piece, it stays "other"."""
    from musegen.metrics.metric import Span
    from musegen.music.notes import NoteTable, Track

    bar = 4 * TPQ
    riff = [(k * TPQ // 2, (k + 1) * TPQ // 2, 52 + 3 * (k % 4), 90) for k in range(8)]  # a guitar 8ths riff
    lead = [(0, 2 * TPQ, 76, 90), (2 * TPQ, 4 * TPQ, 79, 90)]
    bass = [(0, TPQ, 33, 90), (2 * TPQ, 3 * TPQ, 40, 90)]

    def bars(notes, first, last):
        return [(s + b * bar, e + b * bar, p, v) for b in range(first, last) for s, e, p, v in notes]

    guitar, synth, low = (
        Track("Distortion Guitar", 30, False),
        Track("Lead 2 (sawtooth)", 81, False),
        Track("Bass", 33, False),
    )
    piece = NoteTable.of_tracks(TPQ, [(guitar, bars(riff, 0, 8)), (synth, bars(lead, 0, 8)), (low, bars(bass, 4, 8))])
    piece = piece.with_roles()
    sample = NoteTable.of_tracks(TPQ, [(guitar, bars(riff, 0, 8)), (synth, bars(lead, 0, 8))]).with_roles()
    assert [t.role for t in piece.tracks] == ["other", "other", "bass"]
    assert [t.role for t in sample.tracks] == ["bass", "other"]  # alone: the guitar is the lowest track
    read = sample.with_roles_of(piece)
    assert [t.role for t in read.tracks] == ["other", "other"]
    assert np.array_equal(read.start, sample.start) and read.tracks[0].program == 30
    stranger = NoteTable.of_tracks(TPQ, [(Track("Organ", 19, False), bars(lead, 0, 2))]).with_roles()
    assert [t.role for t in stranger.with_roles_of(piece).tracks] == ["bass"]  # not in the piece: its own

    reference = style.reference_profiles(piece)

    def scores(notes):
        return style.style_metrics(Span(notes, 4, 4, {"reference": reference}))["style time-pitch Q1"]

    # roles sorted: bass, other. Read beside the piece, the sample's "other" is the piece's own
    # (the same guitar and lead) and its resting bass scores 0; inferred alone, the guitar is
    # scored against the bass (nothing alike: 0) and the lead alone against guitar and lead.
    real = scores(piece)
    assert real[0] > 0.5 and scores(read) == [0.0, pytest.approx(real[1])]
    assert scores(sample)[0] == 0.0 and scores(sample)[1] < real[1] - 0.2


# ---------------------------------------------------------------- scoring pieces


def test_identical_pieces_score_one(tmp_path):
    piece = write_midi(
        tmp_path / "a.mid",
        [
            (0, False, bar_a(0) + bar_b(1)),
            (33, False, bar_b(0)),
            (0, True, [(k / 2, 0.1, 36 + k % 3) for k in range(16)]),
        ],
    )
    rows = run_style.score_piece(piece, piece, n_segments=1)
    assert {(r["track"], r["metric"]) for r in rows} == {
        ("other", "time-pitch"),
        ("other", "onset-duration"),
        ("bass", "time-pitch"),
        ("bass", "onset-duration"),
        ("drums", "onset-drum"),
    }
    assert all(r["similarity"] == pytest.approx(1.0) for r in rows)


def test_disjoint_bins_score_zero(tmp_path):
    a = write_midi(tmp_path / "a.mid", [(0, False, bar_a(0) + bar_a(1))])
    b = write_midi(tmp_path / "b.mid", [(0, False, bar_b(0) + bar_b(1))])
    rows = run_style.score_piece(a, b, n_segments=1)
    assert len(rows) == 2 and all(r["similarity"] == 0.0 for r in rows)
    # ... while each pattern alone does have notes in its profiles
    assert all(r["generated_notes"] == 8 and r["reference_notes"] == 8 for r in rows)


def test_an_empty_segment_scores_zero_and_is_counted(tmp_path):
    """Drums play on; the accompaniment stops after the first quarter of the continuation."""
    drums = (0, True, [(b, 0.1, 36) for b in range(24)])
    gen = write_midi(tmp_path / "gen.mid", [drums, (0, False, bar_a(2) + [(9, 3, 64)])], marker_beat=8)
    ref = write_midi(tmp_path / "ref.mid", [drums, (0, False, bar_a(0) + bar_a(1))])
    rows = run_style.score_piece(gen, ref)
    other = [r for r in rows if r["metric"] == "onset-duration"]
    assert [r["similarity"] for r in other][1:] == [0.0, 0.0, 0.0]
    assert run_style.medians(rows)["onset-duration"][1:] == [0.0, 0.0, 0.0]
    assert run_style.empty_shares(rows)["onset-duration"] == [0.0, 1.0, 1.0, 1.0]
    assert run_style.empty_shares(rows)["onset-drum"] == [0.0, 0.0, 0.0, 0.0]


def test_transposed_piece_keeps_time_pitch_profile(pop909_songs, tmp_path):
    score = symusic.Score(str(pop909_songs[0]))
    score.shift_pitch(5).dump_midi(str(tmp_path / "up.mid"))
    original, _ = run_style.read_piece(pop909_songs[0], other="merged")
    shifted, _ = run_style.read_piece(tmp_path / "up.mid", other="merged")
    assert set(original) == set(shifted) == {"bass", "other"}
    for role in original:
        a, b = style.time_pitch_profile(original[role]), style.time_pitch_profile(shifted[role])
        assert a.sum() > 1000 and np.array_equal(a, b)
        assert not np.array_equal(original[role].pitch, shifted[role].pitch)  # the pitches did move


def test_quarters_of_the_continuation_follow_the_marker(tmp_path):
    # prompt (2 bars of B, before the marker) then A, A, B, B: each quarter is one bar.
    notes = bar_b(0) + bar_b(1) + bar_a(2) + bar_a(3) + bar_b(4) + bar_b(5)
    notes[-1] = (notes[-1][0], 0.5, notes[-1][2])  # the piece ends exactly at the end of bar 5
    (tmp_path / "gen").mkdir(), (tmp_path / "ref").mkdir()
    gen = write_midi(tmp_path / "gen" / "song_000.mid", [(0, False, notes)], marker_beat=8)
    write_midi(tmp_path / "ref" / "song.mid", [(0, False, bar_a(0))])
    write_midi(tmp_path / "ref" / "other.mid", [(0, False, bar_b(0))])
    rows = run_style.score_piece(gen, tmp_path / "ref" / "song.mid")
    onset = [r["similarity"] for r in rows if r["metric"] == "onset-duration"]
    assert onset == pytest.approx([1, 1, 0, 0])
    pitch = [r["similarity"] for r in rows if r["metric"] == "time-pitch"]
    assert pitch[0] == pytest.approx(1) and pitch[2:] == [0, 0]

    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "evaluate",
                "style",
                "--generated",
                str(tmp_path / "gen"),
                "--reference",
                str(tmp_path / "ref"),
                "--out",
                str(out),
            ]
        )
    assert exit_.value.code in (0, None)
    table = list(csv.DictReader(open(out / "style.csv")))
    assert {r["reference"] for r in table} == {"song.mid"} and len(table) == 8
    assert (out / "style.png").read_bytes()[:4] == b"\x89PNG"


def test_match_reference_by_folder_and_longest_stem_prefix(tmp_path):
    refs = {name: tmp_path / name for name in ("song.mid", "song_2.mid", "other.mid", "funk/0.mid", "jazz/0.mid")}
    assert run_style.match_reference("song_000.mid", refs) == refs["song.mid"]
    assert run_style.match_reference("song_2_001.mid", refs) == refs["song_2.mid"]
    assert run_style.match_reference("songbook_000.mid", refs) is None
    assert run_style.match_reference("jazz/0_000.mid", refs) == refs["jazz/0.mid"]  # same stem, other folder
    assert run_style.match_reference("funk/0_003.mid", refs) == refs["funk/0.mid"]
    assert run_style.match_reference("0_000.mid", refs) is None
    assert run_style.match_reference("x.mid", {"a.mid": refs["song.mid"]}) == refs["song.mid"]
    # as `musegen sample` writes them: each prompt's set in a folder of its own
    assert run_style.match_reference("song/song_000.mid", refs) == refs["song.mid"]
    assert run_style.match_reference("funk/0/0_003.mid", refs) == refs["funk/0.mid"]
    assert run_style.match_reference("song_2/song_2_001.mid", refs) == refs["song_2.mid"]
    assert run_style.match_reference("other/0/0_000.mid", refs) is None


# ---------------------------------------------------------------- the command


def style_folders(tmp_path):
    """Two styles (A and B patterns) with a reference and a generated continuation each, and a
    corrupt generated file."""
    for name in ("gen/a", "gen/b", "ref/a", "ref/b"):
        (tmp_path / name).mkdir(parents=True)
    drums = (0, True, [(b, 0.1, 36 + 6 * (b % 2)) for b in range(24)])
    write_midi(tmp_path / "ref" / "a" / "0.mid", [drums, (0, False, [n for b in range(6) for n in bar_a(b)])])
    write_midi(
        tmp_path / "ref" / "b" / "0.mid",
        [(0, True, [(b + 0.5, 0.1, 46) for b in range(24)]), (0, False, [n for b in range(6) for n in bar_b(b)])],
    )
    write_midi(
        tmp_path / "gen" / "a" / "0_000.mid",
        [drums, (0, False, [n for b in range(6) for n in bar_a(b)])],
        marker_beat=8,
    )
    write_midi(tmp_path / "gen" / "b" / "0_000.mid", [drums, (0, False, bar_b(2))], marker_beat=8)
    (tmp_path / "gen" / "b" / "0_001.mid").write_bytes(b"MThd\x00\x00\x00\x06broken")


def test_bad_files_are_skipped_counted_and_listed_and_baselines_bracket(tmp_path, capsys):
    style_folders(tmp_path)
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "evaluate",
                "style",
                "--generated",
                str(tmp_path / "gen"),
                "--reference",
                str(tmp_path / "ref"),
                "--out",
                str(out),
                "--baselines",
            ]
        )
    stdout = capsys.readouterr().out
    assert exit_.value.code in (0, None)
    assert "2 pieces scored" in stdout and "skipped b/0_001.mid" in stdout and "corrupt" in stdout
    assert "ceiling" in stdout and "floor" in stdout and "(" in stdout
    baselines = list(csv.DictReader(open(out / "style_baselines.csv")))
    ceiling = [float(r["similarity"]) for r in baselines if r["baseline"] == "ceiling"]
    floor = [float(r["similarity"]) for r in baselines if r["baseline"] == "floor"]
    assert min(ceiling) > 0.75 and max(floor) < 0.5
    assert {r["generated"] for r in baselines if r["baseline"] == "floor"} == {"a/0.mid", "b/0.mid"}


@pytest.mark.parametrize("value", ["1e9", "0", "65", "two", "2.5"])
def test_segments_out_of_bounds_is_one_line(tmp_path, capsys, value):
    style_folders(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "evaluate",
                "style",
                "--generated",
                str(tmp_path / "gen"),
                "--reference",
                str(tmp_path / "ref"),
                "--segments",
                value,
            ]
        )
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err == f"error: --segments must be a whole number from 1 to 64, got {value}"


def test_evaluate_style_without_matches_is_one_line_error(tmp_path, capsys):
    (tmp_path / "gen").mkdir(), (tmp_path / "ref").mkdir()
    write_midi(tmp_path / "gen" / "a_000.mid", [(0, False, bar_a(0))])
    write_midi(tmp_path / "ref" / "b.mid", [(0, False, bar_a(0))])
    write_midi(tmp_path / "ref" / "c.mid", [(0, False, bar_a(0))])
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "style", "--generated", str(tmp_path / "gen"), "--reference", str(tmp_path / "ref")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 1 and err.startswith("error:") and "\n" not in err
