"""What `--grid auto` does to quantised multi-track files: Freedoom's tunes.

For every tune of Debian's freedoom WADs (`data prepare freedoom` reads the same): the share of its
onsets on its own grid's 16ths (what `auto` measures), the grid `auto` picks and the seconds that
took (and the tracker's alone); and, on the file's own beats and on the tracked ones, the share of
onsets within a 48th of a beat of a 16th or a triplet (a stricter test of whether a grid follows
the music: a quantised file has nearly all its onsets there, whatever its rhythm).
    python scripts/experiments/grid_auto.py       # about a minute
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import symusic

sys.path.insert(0, str(Path(__file__).parent))
from beat_tracker import file_positions  # noqa: E402

from data_prep.freedoom import wad_lumps  # noqa: E402
from musegen.music import tracker  # noqa: E402

WADS = [Path("/usr/share/games/doom/freedoom1.wad"), Path("/usr/share/games/doom/freedoom2.wad")]
CELLS = np.array([0, 1 / 6, 1 / 4, 1 / 3, 1 / 2, 2 / 3, 3 / 4, 5 / 6, 1])  # 16ths and triplets of a beat


def on_cells(table, beats: np.ndarray) -> float:
    """The weighted share of onsets within a 48th of a beat of a 16th or triplet of `beats`
    (positions on the file's beat axis)."""
    onsets, weights = table.start / table.tpq, tracker.onset_weights(table)
    index = np.interp(onsets, beats, np.arange(len(beats)), left=np.nan, right=np.nan)
    inside = ~np.isnan(index)
    near = np.min(np.abs(index[inside, None] % 1 - CELLS[None]), 1) <= 1 / 48
    return float(np.sum(weights[inside] * near) / np.sum(weights[inside]))


def main() -> None:
    rows = []
    for wad in WADS:
        for name, data in wad_lumps(wad):
            try:
                score = symusic.Score.from_midi(data)
            except Exception:  # noqa: BLE001 - not a MIDI lump (MUS music, graphics, ...)
                continue
            began = time.perf_counter()
            _, chosen = tracker.regrid(score, "auto", meters=True)  # as for the song tokens
            took = time.perf_counter() - began
            table = tracker.as_table(score)
            own = tracker.file_beats(table)
            began = time.perf_counter()
            tracked = tracker.track_beats(table)
            tracking = time.perf_counter() - began
            tracked_beats = file_positions(table, tracked.seconds)
            own_beats = np.arange(len(own.seconds), dtype=np.float64)
            rows.append(
                (
                    name,
                    chosen.source,
                    own.confidence,
                    on_cells(table, own_beats),
                    on_cells(table, tracked_beats),
                    took,
                    tracking,
                )
            )
    print("| tune | auto picks | own 16ths | 16ths or triplets: own | tracked | seconds |")
    print("|---|---|---|---|---|---|")
    for name, source, own, own_cells, tracked_cells, took, _ in rows:
        if source == "tracked":
            print(f"| {name} | {source} | {own:.3f} | {own_cells:.3f} | {tracked_cells:.3f} | {took:.2f} |")
    kept = [r for r in rows if r[1] == "file"]
    print(
        f"\n{len(kept)} of {len(rows)} tunes kept on their own grid (own 16ths {min(r[2] for r in kept):.3f} or more)"
    )
    for label, k in (("`auto`", 5), ("the tracker alone", 6)):
        print(
            f"seconds of {label} a tune: median {np.median([r[k] for r in rows]):.2f}, "
            f"max {max(r[k] for r in rows):.2f}"
        )


if __name__ == "__main__":
    main()
