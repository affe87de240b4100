"""Freedoom's music -> `song` tokens: a held-out test set of real multi-track songs.

Game music written for MIDI playback by people, each tune with drums, a bass and several
guitar, keyboard or lead tracks, in Debian's `freedoom` package (scripts/setup.sh installs it):
its WADs (`/usr/share/games/doom/freedoom1.wad`, `freedoom2.wad`) keep each tune as a music lump
named `D_*` holding a Standard MIDI File as it is. Every tune goes to the "test" split, and the
extracted files are written to `<out>/midi/<wad>_<lump>.mid` too, so that `musegen sample
--prompt <out>/midi` reads them. A lump in Doom's own MUS format, or one that repeats a tune
already taken, is left out and counted. `--source`: a WAD file or a folder of them.

A WAD file is a header ("IWAD" or "PWAD", the number of lumps, the offset of the directory), the
lumps, and the directory: for each lump its offset, its size and its name in 8 bytes, padded
with NULs (all numbers 32-bit little-endian).
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from musegen.errors import DataError
from musegen.io import write_bytes
from musegen.tokenizers.base import Tokenizer, tokenizer_from_dict

from .common import Corpus, Item, Listing, pieces_per_meter

WADS = Path("/usr/share/games/doom")
HEADER = struct.Struct("<4sii")
ENTRY = struct.Struct("<ii8s")


def wad_lumps(path: Path) -> list[tuple[str, bytes]]:
    """The (name, bytes) of every lump of the WAD file `path`, in directory order."""
    data = path.read_bytes()
    if len(data) < HEADER.size:
        raise DataError(f"{path}: not a WAD file (too short for its header)")
    kind, count, directory = HEADER.unpack_from(data)
    if kind not in (b"IWAD", b"PWAD") or count < 0 or not 0 <= directory <= len(data) - count * ENTRY.size:
        raise DataError(f"{path}: not a WAD file (no IWAD/PWAD header with a directory inside the file)")
    lumps = []
    for k in range(count):
        offset, size, name = ENTRY.unpack_from(data, directory + k * ENTRY.size)
        if offset < 0 or size < 0 or offset + size > len(data):
            raise DataError(f"{path}: lump {k} lies outside the file; the WAD is damaged")
        lumps.append((name.rstrip(b"\0").decode("ascii", "replace"), data[offset : offset + size]))
    return lumps


class Freedoom(Corpus):
    name = "freedoom"
    fractions = {"test": 1.0}  # every tune is held out

    def tokenizer(self, option: str | None) -> Tokenizer:
        if option not in (None, "song"):
            raise DataError(f"{self.name} keeps every track and meter: only --tokenizer song applies, not {option!r}")
        return tokenizer_from_dict({"kind": "song"})

    def locate(self, source: Path | None, download: bool, out: Path) -> Path:
        root = source or WADS
        if not root.exists():
            raise DataError(f"{root}: no Freedoom WADs; install Debian's freedoom package (scripts/setup.sh does)")
        return root

    def listing(self, root: Path, out: Path, limit: int | None, workers: int | None) -> Listing:
        """The MIDI music lumps of the WADs under `root`, written to `<out>/midi/`."""
        wads = [root] if root.is_file() else sorted(root.glob("*.wad"))
        if not wads:
            raise DataError(f"{root}: no .wad files")
        tunes, refused, seen = [], [], set()
        for wad in wads:
            for lump, data in wad_lumps(wad):
                if not lump.startswith("D_"):
                    continue
                name = f"{wad.stem}_{lump}"
                digest = hashlib.sha256(data).hexdigest()
                if not data.startswith(b"MThd"):
                    refused.append((name, f"{name}: not a Standard MIDI File (Doom's MUS format?), skipped"))
                elif digest in seen:
                    refused.append((name, f"{name}: the same tune as an earlier lump, skipped"))
                else:
                    seen.add(digest)
                    tunes.append((name, data))
        if not tunes:
            raise DataError(f"{root}: no MIDI music lumps (D_*) in {', '.join(w.name for w in wads)}")
        items = []
        for name, data in tunes[:limit]:
            write_bytes(out / "midi" / f"{name}.mid", data)
            items.append(Item(name=name, path=out / "midi" / f"{name}.mid", group=name))
        return Listing(items, refused, {"corpus": self.name, "source": str(root)})

    def summarise(self, encoded: list[tuple[Item, Any, dict]]) -> dict[str, Any]:
        program_of = tokenizer_from_dict({"kind": "song"}).program_of
        tracks = Counter(len(set(ids[program_of[ids] >= 0].tolist())) for _, ids, _ in encoded)
        return {"meters": pieces_per_meter(encoded), "tracks": {str(k): tracks[k] for k in sorted(tracks)}}


prepare = Freedoom().prepare
