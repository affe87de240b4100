"""POP909 (909 pop songs as piano arrangements, MIT licence) -> REMI token shards.

Each song folder `NNN/` holds `NNN.mid` with MELODY, BRIDGE and PIANO tracks; REMI merges them
into one stream. Songs are split by song id, 5% validation (hashed, so stable across runs).

POP909's MIDI grid is offset from the music (538 of the 68,731 annotated downbeats of its duple
songs lie on the file's own bar lines), so each song is first synchronised to its
beat annotations (`beat_midi.txt`: time in seconds, a flag every 2 beats, a downbeat flag), as
the Pop1K7 pipeline synchronised its transcriptions to tracked beats: `musegen.music.beats.synchronise`
makes every annotated bar a 4/4 bar, then the re-timed score is encoded. Songs whose annotated
bars are mostly not 4 beats long (28 of them, with bars of 6 beats: triple meter) cannot be
4/4 bars and are skipped and counted, as are songs without usable annotations.
The source is, in order: `--source`, the project's shared copy (`<repo>/../shared/datasets/pop909`),
or, with `--download`, the GitHub archive of music-x-lab/POP909-Dataset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from musegen.errors import DataError
from musegen.music.beats import synchronise
from musegen.music.midi import load_score
from musegen.tokenizers.base import Encoding, Tokenizer

from .common import SHARED_DATASETS, Corpus, Item, Listing
from .download import extract, fetch

DEFAULT_SOURCE = SHARED_DATASETS / "pop909"
# A branch archive changes with the repository, so there is no fixed checksum to verify.
ARCHIVE_URL = "https://github.com/music-x-lab/POP909-Dataset/archive/refs/heads/master.zip"


def song_files(folder: Path) -> list[Path]:
    """`NNN/NNN.mid` for every song folder (alternative versions in `NNN/versions/` are left out)."""
    return sorted(p for p in folder.glob("*/*.mid") if p.stem == p.parent.name)


def annotations(song: Path) -> tuple[np.ndarray, np.ndarray]:
    """(beat times in seconds, downbeat flags) from the song's `beat_midi.txt`."""
    path = song.parent / "beat_midi.txt"
    try:
        beats = np.loadtxt(path, ndmin=2)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: no usable beat annotations ({str(exc).splitlines()[0]})") from None
    if beats.shape[1] < 3 or len(beats) < 2:
        raise DataError(f"{path}: beat annotations need 3 columns and 2 beats")
    return beats[:, 0], beats[:, 2] == 1


def not_in_four(song: Path) -> str | None:
    """Why the song cannot be synchronised into 4/4 bars, or None: no usable annotations, or
    annotated bars that are mostly not 4 beats long."""
    try:
        _, downbeat = annotations(song)
    except DataError as exc:
        return str(exc)
    gaps = np.diff(np.flatnonzero(downbeat))
    if len(gaps) == 0:
        return f"{song}: the beat annotations mark fewer than two downbeats"
    usual = int(np.bincount(gaps).argmax())
    return None if usual == 4 else f"{song}: annotated bars of {usual} beats; REMI bars are 4/4"


class Pop909(Corpus):
    name = "pop909"

    def locate(self, source: Path | None, download: bool, out: Path) -> Path:
        if source is not None:
            if not source.is_dir():
                raise DataError(f"{source}: POP909 folder not found")
            return source
        if DEFAULT_SOURCE.is_dir():
            return DEFAULT_SOURCE
        if not download:
            raise DataError(f"POP909 not found at {DEFAULT_SOURCE}; pass --source FOLDER or --download")
        raw = out / "raw"
        archive = fetch(ARCHIVE_URL, raw / "POP909-Dataset.zip")
        extract(archive, raw)
        found = [p for p in raw.rglob("POP909") if p.is_dir() and song_files(p)]
        if not found:
            raise DataError(f"{archive}: no POP909/NNN/NNN.mid songs inside the downloaded archive")
        return found[0]

    def listing(self, root: Path, out: Path, limit: int | None, workers: int | None) -> Listing:
        """Every song, those that cannot be 4/4 bars refused."""
        files = song_files(root)
        if not files:
            raise DataError(f"{root}: no POP909 songs (NNN/NNN.mid) found")
        refused = {p.stem: why for p in files[:limit] if (why := not_in_four(p))}
        return Listing(
            [Item(name=p.stem, path=p, group=p.stem) for p in files[:limit] if p.stem not in refused],
            list(refused.items()),
            {"corpus": self.name, "source": str(root), "synchronised": True},
        )

    def encode(self, tok: Tokenizer, item: Item) -> Encoding:
        """The song re-timed to its annotated beats, then encoded; the report counts the annotated
        bars that were not 4 beats long (stretched or squeezed into 4/4 bars)."""
        seconds, downbeat = annotations(item.path)
        encoding = tok.encode(synchronise(load_score(item.path), seconds, downbeat))
        encoding.report["irregular_bars"] = int(np.count_nonzero(np.diff(np.flatnonzero(downbeat)) != 4))
        return encoding


prepare = Pop909().prepare
