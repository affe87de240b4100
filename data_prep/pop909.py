"""POP909 (909 pop songs as piano arrangements, MIT licence) -> REMI token shards.

Each song folder `NNN/` holds `NNN.mid` with MELODY, BRIDGE and PIANO tracks; REMI merges them
into one stream. Songs are split by song id, 5% validation (hashed, so stable across runs).

The MIDI time signatures of POP909 say little (most songs carry 1/4 at tick 0), but its beat
annotations (`beat_midi.txt`, columns: time, downbeat, hyper-downbeat) do: 831 songs mark a
downbeat every 2 beats and 28 every 3. The triple-meter songs cannot be written in 4/4 bars,
so they are skipped (and counted), as Pop1K7 holds only 4/4.
The source is, in order: `--source`, the project's shared copy (`<repo>/../shared/datasets/pop909`),
or, with `--download`, the GitHub archive of music-x-lab/POP909-Dataset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from musegen.errors import DataError
from musegen.tokenizers.base import Tokenizer, tokenizer_from_dict

from .common import Item, prepare as prepare_items
from .download import extract, fetch

DEFAULT_SOURCE = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "pop909"
# A branch archive changes with the repository, so there is no fixed checksum to verify.
ARCHIVE_URL = "https://github.com/music-x-lab/POP909-Dataset/archive/refs/heads/master.zip"
FRACTIONS = {"validation": 0.05}


def remi_tokenizer(option: str | None, corpus: str) -> Tokenizer:
    """The REMI tokenizer, refusing another representation for a piano corpus."""
    if option not in (None, "remi"):
        raise DataError(f"{corpus} is a piano corpus: only --tokenizer remi applies, not {option!r}")
    return tokenizer_from_dict({"kind": "remi"})


def song_files(folder: Path) -> list[Path]:
    """`NNN/NNN.mid` for every song folder (alternative versions in `NNN/versions/` are left out)."""
    return sorted(p for p in folder.glob("*/*.mid") if p.stem == p.parent.name)


def in_triple_meter(song: Path) -> bool:
    """True when the song's beat annotations put a downbeat every 3 beats (False without annotations)."""
    try:
        beats = np.loadtxt(song.parent / "beat_midi.txt", ndmin=2)
        return round(len(beats) / max(beats[:, 1].sum(), 1)) == 3
    except (OSError, ValueError, IndexError):
        return False


def locate(source: Path | None, download: bool, out: Path) -> Path:
    if source is not None:
        if not Path(source).is_dir():
            raise DataError(f"{source}: POP909 folder not found")
        return Path(source)
    if DEFAULT_SOURCE.is_dir():
        return DEFAULT_SOURCE
    if not download:
        raise DataError(f"POP909 not found at {DEFAULT_SOURCE}; pass --source FOLDER or --download")
    raw = Path(out) / "raw"
    archive = fetch(ARCHIVE_URL, raw / "POP909-Dataset.zip")
    extract(archive, raw)
    found = [p for p in raw.rglob("POP909") if p.is_dir() and song_files(p)]
    if not found:
        raise DataError(f"{archive}: no POP909/NNN/NNN.mid songs inside the downloaded archive")
    return found[0]


def prepare(out: Path, source: Path | None = None, download: bool = False, workers: int | None = None,
            limit: int | None = None, tokenizer: str | None = None) -> dict[str, Any]:
    tok = remi_tokenizer(tokenizer, "pop909")
    folder = locate(source, download, Path(out))
    files = song_files(folder)
    if not files:
        raise DataError(f"{folder}: no POP909 songs (NNN/NNN.mid) found")
    triple = [p for p in files[:limit] if in_triple_meter(p)]
    items = [Item(name=p.stem, path=p, group=p.stem) for p in files[:limit] if p not in triple]
    return prepare_items(tok, items, out, FRACTIONS, workers,
                         extra_report={"corpus": "pop909", "source": str(folder)},
                         skipped_before=[(p.stem, f"{p}: triple meter in POP909's beat annotations; REMI bars are 4/4")
                                         for p in triple])
