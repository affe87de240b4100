"""Does the beat tracker find the bars of music whose bars are regular, played rather than quantised?

POP909's annotated bars change length (docs/experiments/beat-tracker), so its agreement says as
much of the annotations as of the tracker. Here the bars are known: pieces of music21's corpus in
one meter of 3 or 4 quarter notes a bar (4/4, 3/4, 2/2; a pickup bar allowed), written to MIDI as
`data prepare music21-song` writes them, then played: a tempo of 70 to 130 BPM that drifts by
up to about 10% (two slow sines on its logarithm), each onset moved by up to 30 ms (a normal of
12 ms, clipped), the first note 0.3 to 2 s in, and the file written at 120 BPM so that its own
grid says nothing. Each piece is tracked (`track_beats`) played, and also as written (quantised,
its own tempo); the played file's own grid is the floor. And played once more as if its file
named its meter, as `regrid` tracks it for the song tokens: a 3/4 piece in bars of 3 only, a
4/4 or 2/2 one as before (a file that says 4/4 leaves the meter to the notes). A piece agrees as
in beat_tracker.py: 90% of its downbeats found within a 16th and 90% of the tracked ones true,
over its full bars.
`--fit` instead fits the tracker's CUE_WEIGHTS on every other piece (played) and POP909's songs
that beat_tracker.py fits on, and prints them. `--midi DIR` keeps the pieces' MIDI files for a
rerun (writing them takes most of the 10 minutes).
    python scripts/experiments/tracker_regular.py [--chorales N] [--quartets N] [--tunes N] [--seed S]
                                                  [--midi DIR] [--fit]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable

import numpy as np
from music21 import corpus
from tqdm import tqdm

from data_prep.common import SHARED_DATASETS
from data_prep.music21_song import DEFAULTS, FIDDLE_TUNES
from data_prep.pop909 import song_files
from data_prep.scores import convert

sys.path.insert(0, str(Path(__file__).parent))
from beat_tracker import FITTED, agrees, file_positions, logistic, song_cues  # noqa: E402
from meter_set import tunes_in  # noqa: E402

from musegen.music.notes import NoteTable
from musegen.music.tracker import bar_features, downbeat_agreement, file_beats, seconds_of, track_beats

TPQ_PLAYED = 480  # the played file: 120 BPM, so a second is 960 ticks
METERS = {(4, 4): 4, (3, 4): 3, (2, 2): 4}  # meter -> quarter notes a bar (the tracker's beat)
QUARTETS = ("haydn", "mozart", "beethoven")


def pieces(chorales: int, quartets: int, tunes: int) -> list[tuple[str, Path, int | None, dict]]:
    """(group, source, tune number, to_midi options): Bach's chorales, the string quartets'
    movements (MusicXML: some are also there in Humdrum) and O'Neill's fiddle tunes in 3/4 and
    4/4, the first of each in the corpus' order."""
    choir, bpm = DEFAULTS["bach"]
    out = [("Bach chorales", Path(p), None, {"bpm": bpm, "program": choir}) for p in corpus.getComposer("bach")]
    out = out[:chorales]
    movements = [Path(p) for composer in QUARTETS for p in corpus.getComposer(composer) if Path(p).suffix == ".mxl"]
    out += [("string quartets", path, None, {"bpm": 100.0, "program": 40}) for path in movements[:quartets]]
    program, bpm = FIDDLE_TUNES
    for meter in ("3/4", "4/4"):
        found = islice(tunes_in(meter, Path(corpus.__file__).parent), tunes)
        out += [
            (f"O'Neill's tunes in {meter}", path, number, {"bpm": bpm, "program": program}) for path, number in found
        ]
    return out


def regular(table: NoteTable) -> tuple[int, float] | None:
    """(quarter notes a bar, where the bars begin, in quarters) of a piece whose full bars are
    all in one meter of METERS and on one grid; the short bars a score has at its start and at
    repeat signs (3/4 then 1/4 in 4/4: one bar split by the sign) may lie between them, less than
    half of the piece. None for any other piece."""
    signatures = [(tick / table.tpq, n * 4 / d, (n, d)) for tick, n, d in table.time_signatures] or [(0.0, 4.0, (4, 4))]
    end = table.end.max() / table.tpq
    bars = []  # (start, length in quarters, meter)
    for k, (at, length, meter) in enumerate(signatures):
        stop = signatures[k + 1][0] if k + 1 < len(signatures) else end
        bars += [(start, length, meter) for start in np.arange(at, stop - 1e-9, length)]
    full = max((m for _, _, m in bars if m in METERS), key=lambda m: sum(b[2] == m for b in bars), default=None)
    if full is None:
        return None
    per_bar = METERS[full]
    starts = np.array([start for start, _, m in bars if m == full])
    shorter = all(m == full or length < per_bar for _, length, m in bars)
    on_grid = np.allclose((starts - starts[0]) % per_bar, 0, atol=1e-6)
    return (per_bar, float(starts[0])) if shorter and on_grid and len(starts) * per_bar >= end / 2 else None


def played(table: NoteTable, rng: np.random.Generator):
    """`table` played (see the module's docstring), and the time in seconds of a time in quarters."""
    quarters = np.arange(0, table.end.max() / table.tpq + 4, 1 / 48)
    periods, phases = rng.uniform([32, 8], [64, 16]), rng.uniform(0, 2 * np.pi, 2)
    drift = 0.06 * np.sin(2 * np.pi * quarters / periods[0] + phases[0]) + 0.03 * np.sin(
        2 * np.pi * quarters / periods[1] + phases[1]
    )
    bpm = rng.uniform(70, 130) * np.exp(drift)
    seconds = rng.uniform(0.3, 2.0) + np.r_[0, np.cumsum(60 / bpm[:-1] / 48)]
    at = lambda ticks: np.interp(ticks / table.tpq, quarters, seconds)  # noqa: E731
    start = at(table.start) + np.clip(rng.normal(0, 0.012, len(table)), -0.03, 0.03)
    end = np.maximum(at(table.end), start + 0.03)
    ticks = lambda s: np.round(s * 2 * TPQ_PLAYED).astype(np.int64)  # noqa: E731 (seconds at 120 BPM)
    tracks = []
    for k, track in enumerate(table.tracks):
        mine = table.track == k
        rows = zip(ticks(start[mine]), ticks(end[mine]), table.pitch[mine], table.velocity[mine])
        tracks.append((track, [tuple(map(int, row)) for row in rows]))
    return NoteTable.of_tracks(TPQ_PLAYED, tracks, [(0, 120.0)], [(0, 4, 4)]), lambda q: np.interp(q, quarters, seconds)


def truth(table: NoteTable, per_bar: int, first: float, seconds_at) -> tuple[np.ndarray, np.ndarray]:
    """The beats (seconds, `seconds_at` of a time in quarters) from the first full bar to the last
    note, and which are downbeats."""
    beats = np.arange(int(np.ceil(table.end.max() / table.tpq - first)) + 1)
    return seconds_at(first + beats), beats % per_bar == 0


@dataclass
class Piece:
    group: str
    written: NoteTable
    meter: tuple[int, float]  # regular()'s
    performance: NoteTable
    seconds_at: Callable  # a time in quarters of `written` -> seconds of `performance`

    def truth(self) -> tuple[np.ndarray, np.ndarray]:
        return truth(self.written, *self.meter, self.seconds_at)


def load(args: argparse.Namespace, folder: Path) -> tuple[list[Piece], int]:
    """The pieces in one regular meter, written to MIDI in `folder` (kept there: a rerun reads
    them) and played; and how many were skipped."""
    out, skipped = [], 0
    listed = pieces(args.chorales, args.quartets, args.tunes)
    # a file is named by its piece's place in the corpus: a rerun with other counts reads the right ones
    root = Path(corpus.__file__).parent
    for k, (group, source, number, options) in enumerate(tqdm(listed, desc="pieces", unit="piece")):
        name = "_".join(source.relative_to(root).with_suffix("").parts) + (f"_{number}" if number else "")
        dest, failed = convert((source, number, folder / f"{name}.mid", options))
        written = None if failed else NoteTable.read(dest, by_role=False)
        meter = regular(written) if written is not None and len(written) >= 32 else None
        if meter is None:
            skipped += 1
            continue
        out.append(Piece(group, written, meter, *played(written, np.random.default_rng([args.seed, k]))))
    return out, skipped


def fit_with_pop909(fitted: list[Piece]) -> np.ndarray:
    """CUE_WEIGHTS fitted on the played `fitted` pieces' true downbeats and on the POP909 songs
    that beat_tracker.py fits on, each corpus weighing half (POP909 has 8 times the beats)."""
    features, labels = song_cues(song_files(SHARED_DATASETS / "pop909")[FITTED])
    pop909 = sum(map(len, labels))
    for piece in fitted:
        seconds, downbeat = piece.truth()
        features.append(bar_features(piece.performance, file_positions(piece.performance, seconds)))
        labels.append(downbeat)
    scores = sum(map(len, labels)) - pop909
    weights = np.r_[np.full(pop909, 0.5 / pop909), np.full(scores, 0.5 / scores)] * (pop909 + scores)
    return logistic(features, labels, weights)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chorales", type=int, default=120, help="the first N of Bach's corpus files")
    parser.add_argument("--quartets", type=int, default=100, help="the first N of the quartets' movements")
    parser.add_argument("--tunes", type=int, default=40, help="the first N of O'Neill's tunes in each meter")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--midi", type=Path, help="where to keep the pieces' MIDI files (default: a temporary folder)")
    parser.add_argument("--fit", action="store_true", help="fit CUE_WEIGHTS on every other piece and POP909's third")
    args = parser.parse_args()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.midi or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        every, skipped = load(args, folder)
    if args.fit:
        print(np.round(fit_with_pop909(every[::2]), 2).tolist())
        return
    rows: dict[str, list] = {}
    for k, piece in enumerate(every):
        seconds, downbeat = piece.truth()
        tracked = track_beats(piece.performance)
        named = track_beats(piece.performance, (3,)) if piece.meter[0] == 3 else tracked
        as_written = track_beats(piece.written)
        for group in (piece.group, "all") + (("all, not fitted on",) if k % 2 else ()):
            rows.setdefault(group, []).append(
                (
                    agrees(tracked, seconds, downbeat),
                    tracked.beats_per_bar == piece.meter[0],
                    *downbeat_agreement(tracked, seconds, downbeat),
                    agrees(as_written, *truth(piece.written, *piece.meter, lambda q: seconds_of(piece.written, q))),
                    agrees(file_beats(piece.performance), seconds, downbeat),
                    agrees(named, seconds, downbeat),
                )
            )
    print(
        "| pieces | n | played: downbeats agree | meter found | recall / precision | as written: agree | "
        "played, the file's own grid | played, the file naming its meter |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for group, found in rows.items():
        a = np.array(found, dtype=np.float64)
        print(
            f"| {group} | {len(a)} | **{a[:, 0].mean():.1%}** | {a[:, 1].mean():.1%} | {a[:, 2].mean():.3f} / "
            f"{a[:, 3].mean():.3f} | {a[:, 4].mean():.1%} | {a[:, 5].mean():.1%} | {a[:, 6].mean():.1%} |"
        )
    print(
        f"\n{skipped} pieces skipped (not in one meter of {', '.join(f'{n}/{d}' for n, d in METERS)}, "
        f"or unreadable); {time.perf_counter() - began:.0f} s"
    )


if __name__ == "__main__":
    main()
