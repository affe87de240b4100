"""POP909 synchronised to its beat annotations (musegen.music.beats, data_prep.pop909).

Measured on the re-timed score, independently of the synchroniser's arithmetic: where each
annotated downbeat falls (a bar line?) and whether every note kept its time in seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import symusic

from data_prep.pop909 import annotations, not_in_four, song_files
from musegen.errors import DataError
from musegen.music.beats import beat_ticks, synchronise
from musegen.tokenizers.remi import RemiTokenizer

BAR = 4 * 480


def ticks_of_seconds(score: symusic.Score, t: np.ndarray) -> np.ndarray:
    """The (fractional) tick at each time `t` in seconds, from the score's tempo map."""
    ticks = np.array([e.time for e in score.tempos], dtype=np.float64)
    mspq = np.array([e.mspq for e in score.tempos], dtype=np.float64)
    assert ticks[0] == 0
    seconds = np.r_[0.0, np.cumsum(np.diff(ticks) * mspq[:-1] / score.tpq / 1e6)]
    k = np.maximum(np.searchsorted(seconds, t, side="right") - 1, 0)
    return ticks[k] + (t - seconds[k]) * 1e6 * score.tpq / mspq[k]


def note_seconds(score: symusic.Score) -> np.ndarray:
    return np.concatenate([t.notes.numpy()["time"] for t in score.to("second").tracks]).astype(np.float64)


def measure(song: Path) -> tuple[int, int, float, int]:
    """(downbeats, downbeats on a bar line, largest note time error in seconds, downbeats on a bar
    line of the MIDI file's own grid) for one song."""
    seconds, downbeat = annotations(song)
    raw = symusic.Score(str(song))
    synced = synchronise(raw, seconds, downbeat)
    assert synced.tpq == 480 and [(ts.numerator, ts.denominator) for ts in synced.time_signatures] == [(4, 4)]
    before, after = note_seconds(raw), note_seconds(synced)
    offset = np.median(after - before)  # the re-timed score starts at a bar line, not at 0 s
    error = float(np.abs(after - before - offset).max())
    on_bar = ticks_of_seconds(synced, seconds[downbeat] + offset)
    raw_bar = ticks_of_seconds(raw, seconds[downbeat]) * 480 / raw.tpq
    # within 5 ticks (a 24th of a 16th): the offset is measured on notes, whose ticks are rounded
    near = lambda ticks: int(np.count_nonzero(np.abs((ticks + BAR / 2) % BAR - BAR / 2) <= 5))  # noqa: E731
    return int(downbeat.sum()), near(on_bar), error, near(raw_bar)


def check(folder: Path, songs_at_least: int) -> None:
    songs = [p for p in song_files(folder) if not_in_four(p) is None]
    assert len(songs) >= songs_at_least
    downbeats = on_bar = raw_on_bar = 0
    worst = 0.0
    for song in songs:
        n, hit, error, raw_hit = measure(song)
        downbeats, on_bar, raw_on_bar = downbeats + n, on_bar + hit, raw_on_bar + raw_hit
        worst = max(worst, error)
    print(
        f"{len(songs)} songs: {on_bar}/{downbeats} annotated downbeats on bar lines after synchronising "
        f"({raw_on_bar} on the MIDI file's own bar lines); largest note time error {worst * 1e3:.2f} ms"
    )
    assert on_bar >= 0.98 * downbeats
    assert worst <= 0.010
    assert raw_on_bar < 0.6 * downbeats  # the files' own grid is off: the test measures something


def test_synchronised_pop909_songs_put_downbeats_on_bar_lines_and_keep_note_times(pop909_dir):
    check(pop909_dir, 30)


@pytest.mark.slow
def test_every_shared_pop909_song_synchronises(full_pop909):
    check(full_pop909, 800)


def test_irregular_bars_become_whole_bars():
    # a pickup of 1 beat, bars of 4, 2, 6 and 8 beats, then 3 beats of a last bar
    downbeat = np.zeros(1 + 4 + 2 + 6 + 8 + 3, dtype=bool)
    downbeat[[1, 5, 7, 13, 21]] = True
    ticks = beat_ticks(downbeat)
    assert ticks[[1, 5, 7, 13, 21]].tolist() == [0, BAR, 2 * BAR, 4 * BAR, 6 * BAR]  # 6 and 8 beats: 2 bars
    assert ticks[0] == -480 and ticks[6] == BAR + 960 and ticks[-1] == 6 * BAR + 2 * 480


def test_synchronised_song_encodes_in_the_grammar(pop909_dir):
    song = pop909_dir / "001" / "001.mid"
    seconds, downbeat = annotations(song)
    tok = RemiTokenizer()
    ids = tok.encode(synchronise(symusic.Score(str(song)), seconds, downbeat)).ids
    assert tok.grammar().first_violation(ids) is None
    assert not np.array_equal(ids, tok.encode(song).ids)


def test_bad_annotations_are_one_line_data_errors(tmp_path):
    score = symusic.Score(str(Path(__file__).parent / "data" / "pop909" / "001" / "001.mid"))
    with pytest.raises(DataError, match="increasing time"):
        synchronise(score, np.array([1.0, 0.5, 2.0]), np.array([True, False, True]))
    with pytest.raises(DataError, match="no downbeat"):
        synchronise(score, np.array([0.5, 1.0, 2.0]), np.zeros(3, dtype=bool))
    song = tmp_path / "999" / "999.mid"
    song.parent.mkdir()
    (song.parent / "beat_midi.txt").write_text("0.5 1 1\nnot numbers\n")
    assert "no usable beat annotations" in not_in_four(song)
