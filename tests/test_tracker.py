"""The beat and downbeat tracker (musegen.music.tracker) and `musegen sample --grid`.

Measured on real POP909 songs against their annotations (which the tracker never sees), on a
played piece built here with a known tempo, first downbeat and humanised onsets, and on a 3/4
minuet from the music21 corpus; and a prompt on the file's own grid is encoded as it is.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import music21
import numpy as np
import pytest
import symusic
from tiny_models import tiny_checkpoint
from train_fixtures import prepare_pop909

from data_prep.pop909 import annotations
from data_prep.scores import to_midi
from musegen.cli import main
from musegen.errors import MidiError
from musegen.generation.prompt import load_prompt, prompt_from_ids
from musegen.music.meter import bar_start, signature_changes
from musegen.music.midi import load_score
from musegen.music.notes import NoteTable, Track
from musegen.music.tracker import downbeat_agreement, file_beats, file_signature, regrid, track_beats
from musegen.tokenizers.remi import RemiTokenizer
from musegen.tokenizers.song import SongTokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_pop909_downbeats_are_found_without_the_annotations(pop909_songs):
    """Ten raw POP909 files, whose tick grid is offset from the music: the tracked beats and
    downbeats against the annotated ones (see docs/experiments/beat-tracker for all 859 songs)."""
    agreeing, file_agreeing, recalls, beats_found = 0, 0, [], []
    for song in pop909_songs[:10]:
        seconds, downbeat = annotations(song)
        piece = NoteTable.read(song)
        found = track_beats(piece)
        recall, precision = downbeat_agreement(found, seconds, downbeat)
        agreeing += recall >= 0.9 and precision >= 0.9
        file_agreeing += min(downbeat_agreement(file_beats(piece), seconds, downbeat)) >= 0.9
        recalls.append(recall)
        # the beats themselves: annotated beats with a tracked one within 70 ms
        nearest = np.abs(found.seconds[None, :] - seconds[:, None]).min(1)
        beats_found.append(np.mean(nearest <= 0.07))
        assert found.source == "tracked" and found.beats_per_bar == 4
    print(
        f"downbeats agree in {agreeing}/10 songs (the file's own grid: {file_agreeing}); "
        f"recall {np.mean(recalls):.3f}; beats {np.mean(beats_found):.3f}"
    )
    assert np.mean(beats_found) >= 0.95
    assert np.mean(recalls) >= 0.75
    assert agreeing >= 5 and file_agreeing <= 1


def played_piece(
    bpm: float,
    first_downbeat: float,
    bars: int,
    seed: int,
    jitter: float = 0.02,
    beats_per_bar: int = 4,
    signature: tuple[int, int] | None = None,
) -> NoteTable:
    """Four bars of a pop accompaniment, repeated: a bass note on each downbeat and half way
    through the bar (beat 3 of 4), a chord on each beat, an eighth-note melody; its chords change
    every bar. Played at `bpm` from `first_downbeat` seconds after a pickup beat, onsets jittered
    by up to `jitter` seconds, velocities by 10, written at MIDI's default 120 BPM, so that its
    own grid is not the music's, with the time signature `signature` (none by default)."""
    rng = np.random.default_rng(seed)
    beat = 60.0 / bpm
    roots = [48, 53, 55, 45]  # C F G A
    notes = []

    def play(at_beat: float, length: float, pitch: int, velocity: int) -> None:
        start = first_downbeat + at_beat * beat + rng.uniform(-jitter, jitter)
        ticks = lambda s: int(round(s * 2 * 480))  # noqa: E731 (120 BPM: 960 ticks a second)
        notes.append((ticks(start), ticks(start + length * beat), pitch, int(velocity + rng.integers(-10, 11))))

    play(-1, 0.5, 72, 70)  # the pickup
    for bar in range(bars):
        root = roots[bar % 4]
        for b in range(beats_per_bar):
            at = bar * beats_per_bar + b
            if b in (0, beats_per_bar // 2):
                play(at, 2.0, root - 12, 100 if b == 0 else 80)
            for interval in (12, 16, 19):
                play(at, 0.9, root + interval, 60)
            play(at, 0.5, root + 24 + (b * 2) % 7, 75)
            play(at + 0.5, 0.5, root + 28 - b, 55)
    signatures = [(0, *signature)] if signature else []
    return NoteTable.of_tracks(480, [(Track("piano", 0, False), notes)], time_signatures=signatures)


def perform(written: NoteTable, seconds_at, jitter: float, rng: np.random.Generator, track: Track) -> NoteTable:
    """`written` played on `track`: each note from `seconds_at` its time in quarters, its onset off
    by up to `jitter` seconds, at least 30 ms long, on a file at 120 BPM (960 ticks a second)."""
    start = seconds_at(written.start / written.tpq) + rng.uniform(-jitter, jitter, len(written))
    end = np.maximum(seconds_at(written.end / written.tpq), start + 0.03)
    ticks = lambda s: np.round(s * 960).astype(np.int64).tolist()  # noqa: E731
    notes = list(zip(ticks(start), ticks(end), written.pitch.tolist(), written.velocity.tolist()))
    return NoteTable.of_tracks(480, [(track, notes)])


def test_a_played_piece_is_tracked_to_its_tempo_and_first_downbeat():
    piece = played_piece(bpm=93.0, first_downbeat=1.37, bars=24, seed=3)
    found = track_beats(piece)
    assert found.bpm == pytest.approx(93.0, rel=0.01)
    assert found.beats_per_bar == 4
    assert found.first_downbeat == pytest.approx(1.37, abs=0.03)
    truth = 1.37 + np.arange(24) * 4 * 60 / 93.0
    mine = found.seconds[found.downbeat]
    assert np.abs(mine[:, None] - truth[None, :]).min(0).max() <= 0.04  # every bar, within 40 ms
    assert file_beats(piece).confidence < found.confidence  # auto would not keep the file's grid


def test_a_minuet_in_three_is_found_in_three():
    """Lady Coventry's Minuet (3/4, from the music21 corpus's Aird airs), written to MIDI."""
    minuet = music21.corpus.parse("airdsAirs/book5.abc", number=868)
    assert minuet.recurse().getElementsByClass("TimeSignature")[0].ratioString == "3/4"
    piece = NoteTable.read(music21.midi.translate.music21ObjectToMidiFile(minuet).writestr())
    assert track_beats(piece).beats_per_bar == 3


def played_minuet(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """Lady Coventry's Minuet played at 100 BPM from 0.77 s, onsets off by up to 10 ms, on a file
    at 120 BPM (4/4); with its notes' onsets in the quarter notes of the written piece."""
    minuet = music21.corpus.parse("airdsAirs/book5.abc", number=868)
    written = NoteTable.read(music21.midi.translate.music21ObjectToMidiFile(minuet).writestr())
    played = perform(written, lambda q: 0.77 + q * 0.6, 0.01, np.random.default_rng(0), Track("fiddle", 40, False))
    path = tmp_path / "minuet.mid"
    path.write_bytes(played.midi_bytes())
    return path, written.start / written.tpq


def test_a_played_minuet_keeps_its_three_beats_or_is_put_in_four_without_stretching_a_beat(tmp_path):
    """Tracked in 3, a waltz is re-timed in 3/4 bars for a representation with meters (the song
    tokens); for one of 4/4 bars only (REMI, the groove tokens) it is tracked in bars of 4, each
    beat still a quarter note (it used to be re-timed with every 3-beat bar stretched over a 4/4
    bar, its notes a third longer and off the grid)."""
    path, quarters = played_minuet(tmp_path)
    score = load_score(path)
    with_meters, found = regrid(score, "track", meters=True)
    assert found.beats_per_bar == 3
    assert {ts.numerator for ts in with_meters.time_signatures[1:]} == {3}  # after the pickup bar
    in_four, found = regrid(score, "track")
    assert found.beats_per_bar == 4 and [(ts.numerator, ts.denominator) for ts in in_four.time_signatures] == [(4, 4)]
    for retimed in (with_meters, in_four):
        onsets = np.sort(NoteTable.from_score(retimed).start) / retimed.ticks_per_quarter
        # every note where the written piece puts it, give or take the 10 ms of play (1/60 of a beat)
        assert np.abs((onsets - onsets[0]) - (quarters - quarters[0])).max() < 0.05
    song = load_prompt(SongTokenizer(), path, grid="track")
    assert song.report["meters"][-1] == "3/4" and song.report["grid"]["beats_per_bar"] == 3
    remi = load_prompt(RemiTokenizer(), path, grid="track")
    assert remi.report["grid"]["beats_per_bar"] == 4


def test_sample_continues_a_played_minuet_in_three_with_the_song_model(tmp_path, capsys):
    """From the command line, with the shipped song model: the played minuet (its file says
    nothing of 3/4) is found in 3, re-timed, and continued in 3/4 bars."""
    path, _ = played_minuet(tmp_path)
    args = ["sample", "-c", "song", "--prompt", str(path), "--bars", "4", "--seed", "0", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--grid", "track"])
    assert (exit_.value.code or 0) == 0, capsys.readouterr().err
    assert "3 beats per bar" in capsys.readouterr().out
    sample = NoteTable.read(tmp_path / "out" / "minuet" / "minuet_000.mid")
    assert {(numerator, denominator) for _, numerator, denominator in sample.time_signatures} == {(3, 4)}
    assert len(sample) > len(NoteTable.read(path))  # the prompt, and notes after it


def test_a_played_file_that_names_its_meter_is_tracked_in_it(tmp_path):
    """The tracker alone finds 3 or 4 beats a bar; a file that names a meter of quarter notes
    (its 5/4 here, the file's grid off the music) is tracked in it for the song tokens, and says
    so; a representation of 4/4 bars refuses it, as it refuses the file on its own grid. A file that
    says 4/4, as most played files do, leaves the meter to the notes."""
    riff = dict(bpm=104.0, first_downbeat=0.9, bars=16, seed=5, beats_per_bar=5)
    (tmp_path / "five.mid").write_bytes(played_piece(**riff, signature=(5, 4)).midi_bytes())
    five = 0.9 + 5 * 60 / 104 * np.arange(16)  # the true downbeats
    _, found = regrid(load_score(tmp_path / "five.mid"), "track", meters=True)
    assert (found.beats_per_bar, found.meter_from) == (5, "file")
    mine = found.seconds[found.downbeat]
    assert np.mean(np.abs(five[:, None] - mine[None, :]).min(1) <= 0.04) >= 0.9
    prompt = load_prompt(SongTokenizer(), tmp_path / "five.mid", grid="track")
    assert prompt.report["meters"][-1] == "5/4" and prompt.report["grid"]["meter_from"] == "file"
    with pytest.raises(MidiError, match="bar 1: time signature 5/4"):  # never stretched or cut into 4/4
        load_prompt(RemiTokenizer(), tmp_path / "five.mid", grid="track")
    (tmp_path / "four.mid").write_bytes(played_piece(**riff, signature=(4, 4)).midi_bytes())
    _, found = regrid(load_score(tmp_path / "four.mid"), "track", meters=True)
    assert found.beats_per_bar in (3, 4) and found.meter_from == "notes"


# twelve of Bach's chorales in music21's corpus past the first 120, which tracker_regular.py fits on
CHORALES = ("245.28", "245.3", "245.37", "245.40", "245.5", "248.12-2", "248.17", "248.23-s", "248.28", "248.33-3")
CHORALES += ("248.35-3", "248.35-3c")


def played_chorale(name: str, seed: int) -> tuple[NoteTable, np.ndarray, np.ndarray]:
    """A Bach chorale of music21's corpus in one meter of 3 or 4 quarters a bar, written to MIDI
    with its pickup padded to a full bar, then played: 70-110 BPM drifting by 6% over 12 bars,
    onsets off by up to 15 ms, the first bar 1.1 s in, on a file at 120 BPM. With the time of its
    quarter notes in seconds from the first full bar and which of them are downbeats."""
    score = music21.corpus.parse(f"bach/bwv{name}")
    meters = {ts.ratioString for ts in score.recurse().getElementsByClass("TimeSignature")}
    assert meters in ({"4/4"}, {"3/4"}), meters
    per_bar = 4 if meters == {"4/4"} else 3
    with tempfile.TemporaryDirectory() as scratch:
        midi = Path(scratch) / "chorale.mid"
        to_midi(score, midi, bpm=80.0, program=52, pickup="pad")
        table = NoteTable.read(midi, by_role=False)
    rng = np.random.default_rng(seed)
    quarters = np.arange(0, table.end.max() / table.tpq + 2, 1 / 24)
    bpm = rng.uniform(70, 110) * np.exp(0.06 * np.sin(2 * np.pi * quarters / 48 + rng.uniform(0, 6.3)))
    seconds = 1.1 + np.r_[0, np.cumsum(60 / bpm[:-1] / 24)]
    played = perform(table, lambda q: np.interp(q, quarters, seconds), 0.015, rng, Track("choir", 52, False))
    first = per_bar if table.start.min() > 0 else 0  # the padded pickup bar is not counted
    beats = np.arange(first, int(np.ceil(table.end.max() / table.tpq)) + 1)
    return played, np.interp(beats, quarters, seconds), (beats - first) % per_bar == 0


def test_played_chorales_are_found_on_their_bars():
    """Bars that never change length, unlike POP909's annotations: twelve chorales (3/4 and 4/4),
    played. The downbeat cues fitted on POP909 alone put 1 of these 12 on their bars; fitted on
    POP909 and played corpus pieces (not these) together, 5 (docs/experiments/beat-tracker)."""
    agreeing = 0
    for seed, name in enumerate(CHORALES):
        piece, seconds, downbeat = played_chorale(name, seed)
        agreeing += min(downbeat_agreement(track_beats(piece), seconds, downbeat)) >= 0.9
    assert agreeing >= 4, agreeing


def test_the_file_grid_names_the_meter_a_pickup_leads_into():
    """A tune in 3/4 that opens with a one-beat pickup bar (1/4), as music21 writes O'Neill's
    fiddle tunes: its grid has 3 beats a bar, with bar lines after the pickup every 3 beats."""
    score = symusic.Score(480)
    score.time_signatures.extend([symusic.TimeSignature(0, 1, 4), symusic.TimeSignature(480, 3, 4)])
    fiddle = symusic.Track("fiddle", 40)
    fiddle.notes.extend(symusic.Note(480 * beat, 400, 62 + beat % 5, 80) for beat in range(13))
    score.tracks.append(fiddle)
    grid = file_beats(score)
    assert grid.beats_per_bar == 3 and grid.meter_from == "file"
    assert np.flatnonzero(grid.downbeat)[:5].tolist() == [0, 1, 4, 7, 10]


@pytest.mark.parametrize(
    "signatures, meter",
    [
        (((960, 3, 4),), (3, 4)),  # the first signature late: 4/4 stands before it, as in MIDI
        (((0, 2, 4), (0, 3, 4)), (3, 4)),  # two at one tick: the last one read wins
        (((0, 3, 4), (2880, 0, 4)), (3, 4)),  # a signature of no beats places no bar line
        (((0, 1, 4), (480, 6, 8), (3360, 3, 4), (4320, 6, 8)), (6, 8)),  # a 3/4 bar cut short
    ],
)
def test_the_file_grid_has_the_bar_lines_and_meter_the_tokenizers_read(signatures, meter):
    """The file grid (beats and bars for `--grid file`) and the tokenizers read a file's time
    signatures by one rule (`signature_changes`): same bar lines, same main meter."""
    score = symusic.Score(480)
    score.time_signatures.extend(symusic.TimeSignature(*change) for change in signatures)
    piano = symusic.Track("piano", 0)
    piano.notes.extend(symusic.Note(480 * beat, 400, 60 + beat % 7, 80) for beat in range(24))
    score.tracks.append(piano)
    grid = file_beats(score)
    changes = [c for c in signature_changes(NoteTable.from_score(score).time_signatures) if c[1] and c[2]]
    bar_lines = [bar_start(changes, 480, bar) / 480 for bar in range(1, 9)]
    assert np.flatnonzero(grid.downbeat)[:8].tolist() == bar_lines
    assert file_signature(NoteTable.from_score(score)) == meter


def test_the_file_grid_keeps_the_prompt_as_it_is_and_tracking_re_times_it(pop909_songs):
    tok = RemiTokenizer()
    song = pop909_songs[2]
    kept = load_prompt(tok, song, bars=4, grid="file")
    assert np.array_equal(kept.ids, prompt_from_ids(tok, tok.encode(song).ids, bars=4).ids)
    assert kept.report["grid"] == {"source": "file"}  # trusted, not measured
    tracked = load_prompt(tok, song, bars=4, grid="track")
    assert tracked.report["grid"]["source"] == "tracked" and not np.array_equal(tracked.ids, kept.ids)
    # POP909's grid is offset from its notes, so auto tracks; a grid that fits its notes is kept
    assert load_prompt(tok, song, bars=4, grid="auto").report["grid"]["source"] == "tracked"
    on_grid = played_piece(bpm=120.0, first_downbeat=1.0, bars=8, seed=1, jitter=0.0)
    assert load_prompt(tok, on_grid.midi_bytes(), grid="auto").report.get("grid") is None  # bytes: as given
    assert regrid(symusic.Score.from_midi(on_grid.midi_bytes()), "auto")[1].source == "file"


def test_cli_sample_says_and_records_the_grid(pop909_songs, tmp_path, capsys):
    checkpoint = tiny_checkpoint("remi", tmp_path / "ckpt")
    out = tmp_path / "out"
    for grid in ("file", "track", None):  # None: the default, auto, which tracks this offset file
        args = ["sample", "-c", checkpoint, "--prompt", pop909_songs[2], "--prompt-bars", 2, "--length", 8]
        chosen = ["--grid", grid] if grid else []
        with pytest.raises(SystemExit) as exit_:
            main([str(a) for a in args + ["--seed", 1, *chosen, "--out", out / str(grid)]])
        printed = capsys.readouterr()
        assert (exit_.value.code or 0) == 0, printed.err
        stem = pop909_songs[2].stem
        summary = json.loads((out / str(grid) / stem / f"{stem}.json").read_text())
        recorded = summary["prompt_report"]["grid"]
        assert summary["settings"]["grid"] == (grid or "auto")
        assert recorded["source"] == {"file": "file", "track": "tracked", None: "tracked"}[grid]
        line = next(x for x in printed.out.splitlines() if x.startswith("grid: "))
        if grid == "file":
            assert line == "grid: the file's own grid"
        else:
            assert f"{recorded['beats_per_bar']} beats per bar" in line and f"{recorded['bpm']:.1f} BPM" in line
    with pytest.raises(SystemExit) as exit_:
        main(["sample", "-c", str(checkpoint), "--length", "8", "--grid", "bars", "--out", str(out / "bad")])
    assert exit_.value.code == 2 and "--grid must be one of auto, track, file" in capsys.readouterr().err


def test_evaluate_continuation_puts_a_folder_of_raw_files_on_the_grid_it_is_told(pop909_songs, tmp_path, capsys):
    """`evaluate continuation --grid track` continues each raw POP909 file as `sample --grid track`
    reads it: the real bars it measures are the tracked, re-timed file's, not the file's offset
    grid's; the grid is recorded; a prepared corpus (already on its grid) refuses the option."""
    checkpoint = tiny_checkpoint("remi", tmp_path / "ckpt")
    folder = tmp_path / "raw"
    folder.mkdir()
    song = pop909_songs[2]
    (folder / song.name).write_bytes(song.read_bytes())
    tok = RemiTokenizer()
    real = {}
    for grid in ("file", "track"):
        args = [
            "evaluate",
            "continuation",
            "-c",
            checkpoint,
            "--data",
            folder,
            "--grid",
            grid,
            "--out",
            tmp_path / grid,
        ]
        args += ["--prompt-bars", 1, "--bars", 4, "--samples-per-piece", 1, "--device", "cpu"]
        with pytest.raises(SystemExit) as exit_:
            main([str(a) for a in args])
        assert (exit_.value.code or 0) == 0, capsys.readouterr().err
        assert json.loads((tmp_path / grid / "run.json").read_text())["grid"] == grid
        record = json.loads((tmp_path / grid / "pieces.jsonl").read_text().splitlines()[0])
        notes = tok.decode(load_prompt(tok, song, grid=grid).ids)  # the whole file, on that grid
        span = notes.onsets_in(record["span_start_bar"], 4)
        assert record["real"]["notes per bar"] == [len(span) / 4]
        real[grid] = record["real"]
    assert real["file"] != real["track"]  # the offset grid and the music's cut other bars
    corpus = prepare_pop909(pop909_songs[:3], tmp_path / "corpus")
    capsys.readouterr()  # the runs' and the preparation's progress
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                str(a)
                for a in ["evaluate", "continuation", "-c", checkpoint, "--data", corpus, "--split", "train"]
                + ["--grid", "track", "--out", tmp_path / "corpus-eval", "--device", "cpu"]
            ]
        )
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.count("\n") == 0 and "a prepared corpus's tokens are on their grid" in err


def test_a_file_too_long_to_grid_is_one_line_under_the_default_grid(tmp_path, capsys):
    """A note at tick 2^30 with 1 tick a beat: a grid of a billion beats would not fit in memory,
    so the default `auto` refuses the file in one line that names it, as the tokenizer would."""
    score = symusic.Score(1)
    track = symusic.Track(program=0)
    for k in range(8):
        track.notes.append(symusic.Note(k, 1, 60 + k, 90))
    track.notes.append(symusic.Note(2**30, 1, 60, 90))
    score.tracks.append(track)
    path = tmp_path / "far.mid"
    score.dump_midi(str(path))
    checkpoint = tiny_checkpoint("remi", tmp_path / "ckpt")
    with pytest.raises(SystemExit) as exit_:
        main(["sample", "-c", str(checkpoint), "--prompt", str(path), "--length", "8", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code != 0 and err.count("\n") == 0, err
    assert str(path) in err and "beats, more than the longest piece" in err
