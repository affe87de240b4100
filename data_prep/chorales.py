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
from musegen.io import write_bytes
from musegen.music.constants import TICKS_PER_BEAT as TPQ
from musegen.music.notes import NoteTable, Track

from .common import Corpus, Item, Listing, worker_pool

VELOCITY = 80  # the scores carry no dynamics
DEFAULT_BPM = 80  # for the few chorales without a metronome mark
CHORALE_NAME = re.compile(r"bwv(\d+)\.\d+")


def chorale_paths() -> list[Path]:
    from music21 import corpus

    return sorted(
        (Path(p) for p in corpus.getComposer("bach") if CHORALE_NAME.fullmatch(Path(p).stem)), key=lambda p: p.stem
    )


def to_midi(source: Path, dest: Path) -> None:
    """Write one chorale as MIDI: a track per part, pickup padded to a full bar, ties merged."""
    from music21 import corpus, meter, tempo

    score = corpus.parse(str(source)).stripTies()
    first_bar = score.parts[0].getElementsByClass("Measure")[0]
    pad = float(first_bar.paddingLeft or 0.0)  # the silent part of a pickup bar, in quarters
    ticks = lambda quarters: int(round((float(quarters) + pad) * TPQ))  # noqa: E731
    marks = list(score.flatten().getElementsByClass(tempo.MetronomeMark))
    bpm = (marks[0].getQuarterBPM() if marks else None) or DEFAULT_BPM  # "playback only" marks count too
    signatures, previous = [], None  # one event per change; the first also covers the pickup's padding
    for ts in score.parts[0].flatten().getElementsByClass(meter.TimeSignature):
        if (ts.numerator, ts.denominator) != previous:
            signatures.append((0 if previous is None else ticks(ts.offset), ts.numerator, ts.denominator))
            previous = (ts.numerator, ts.denominator)
    tracks = []
    for part in score.parts:
        notes = [
            (ticks(element.offset), ticks(element.offset + element.quarterLength), p.midi, VELOCITY)
            for element in part.flatten().notes
            for p in element.pitches
        ]
        tracks.append((Track(part.partName or "voice", 52, False), notes))  # GM 53: choir aahs
    write_bytes(dest, NoteTable.of_tracks(TPQ, tracks, [(0, float(bpm))], signatures).midi_bytes())


def _convert(job: tuple[Path, Path]) -> tuple[Path, str | None]:
    source, dest = job
    try:
        if not dest.is_file():
            to_midi(source, dest)
        return dest, None
    except Exception as exc:  # music21 raises many types on odd scores; the chorale is skipped and reported
        return dest, f"{source.name}: could not convert ({type(exc).__name__}: {exc})".splitlines()[0]


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
        jobs = [(p, out / "midi" / f"{p.stem}.mid") for p in paths]
        with worker_pool(workers) as pool:
            results = list(tqdm(pool.imap(_convert, jobs), total=len(jobs), desc="music21 -> MIDI", unit="chorale"))
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
