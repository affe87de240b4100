"""Bach chorales from music21's bundled corpus -> REMI token shards. No network needed.

Each chorale (`bwvN.M` in the corpus) is written to MIDI first (`<out>/midi/`), one track per
voice, then encoded like any other MIDI. A pickup bar is padded so that bar lines fall on
REMI's bars. Chorales in 3/4 are refused by REMI's meter check and counted as skipped.
Split by cantata (BWV number), 5% validation.
"""

from __future__ import annotations

import re
from pathlib import Path

from tqdm import tqdm

from musegen.errors import DataError

from . import scores
from .common import Corpus, Item, Listing, worker_pool

DEFAULT_BPM = 80  # for the few chorales without a metronome mark
CHORALE_NAME = re.compile(r"bwv(\d+)\.\d+")
# REMI holds 4/4 bars only and no instruments: pickups padded, every part (the voices and the
# instruments doubling them) a choir
MIDI_OPTIONS = {"bpm": DEFAULT_BPM, "program": scores.CHOIR, "pickup": "pad", "instruments": False}


def chorale_paths() -> list[Path]:
    from music21 import corpus

    return sorted(
        (Path(p) for p in corpus.getComposer("bach") if CHORALE_NAME.fullmatch(Path(p).stem)), key=lambda p: p.stem
    )


def to_midi(source: Path, dest: Path) -> None:
    """Write one chorale as this corpus writes it."""
    scores.to_midi(scores.parse(source), dest, **MIDI_OPTIONS)


class Chorales(Corpus):
    name = "chorales"

    def locate(self, source: Path | None, download: bool, out: Path) -> None:
        if source is not None:
            raise DataError("the chorales corpus comes from music21's bundled corpus; it takes no --source")

    def listing(self, root: None, out: Path, limit: int | None, workers: int | None) -> Listing:
        """The chorales written to MIDI (`<out>/midi/`), grouped by cantata; those music21 cannot
        convert refused."""
        paths = chorale_paths()[:limit]
        if not paths:
            raise DataError("music21's corpus holds no Bach chorales (is music21 fully installed?)")
        jobs = [(p, None, out / "midi" / f"{p.stem}.mid", MIDI_OPTIONS) for p in paths]
        with worker_pool(workers) as pool:
            converted = tqdm(pool.imap(scores.convert, jobs), total=len(jobs), desc="music21 -> MIDI", unit="chorale")
            results = list(converted)
        return Listing(
            [
                Item(name=dest.stem, path=dest, group=CHORALE_NAME.fullmatch(dest.stem).group(1))
                for dest, reason in results
                if not reason
            ],
            [(dest.stem, reason) for dest, reason in results if reason],
            {"corpus": self.name},
        )


prepare = Chorales().prepare
