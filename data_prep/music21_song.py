"""music21's bundled corpus for the `song` representation: its multi-part pieces (Bach,
Palestrina, Monteverdi, the Trecento, Josquin, string quartets...) and its folk tunes (Essen,
O'Neill's, Ryan's Mammoth...) in all their meters. No network needed.

Each piece is written to MIDI first (`<out>/midi/<collection>/...`, data_prep/scores.py) with
every measure a bar of its own length, so a pickup is a bar of its own as in pop909-song, then
encoded. A rerun keeps the MIDI files already written. A folk-tune file holding many tunes (an
ABC "X:" per tune) gives one piece per tune, except where its tunes share one title: those are
the voices of one piece (Josquin's chansons). Pieces music21 cannot read or whose meters the
song tokens do not have are skipped and counted. Split by piece (a work's movements together),
5% validation, 5% test.

`--source`: a folder laid out as music21's corpus (one folder per collection), by default
music21's own.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import chain, zip_longest
from pathlib import Path
from typing import Any

from tqdm import tqdm

from musegen.errors import DataError
from musegen.tokenizers.base import Tokenizer, tokenizer_from_dict

from .common import Corpus, Item, Listing, pieces_per_meter, worker_pool
from .scores import CHOIR, convert

SUFFIXES = {".abc", ".krn", ".mxl", ".xml", ".musicxml"}  # scores; Roman-numeral analyses (.rntxt) are not
EXCLUDED = {"demos", "theoryExercises"}  # music21's examples of its features, not pieces
# for a collection whose parts name no instrument nor voice, and whose scores have no metronome
# mark: (GM program, quarter BPM). Sung collections are recognised by their part names.
FIDDLE_TUNES = (40, 120.0)  # violin: O'Neill's, Ryan's and the Scottish airs are fiddle music
DEFAULTS = {
    "essenFolksong": (CHOIR, 100.0),  # songs
    "ryansMammoth": FIDDLE_TUNES,
    "oneills1850": FIDDLE_TUNES,
    "airdsAirs": FIDDLE_TUNES,
    "nottingham-dataset": FIDDLE_TUNES,
    "miscFolk": FIDDLE_TUNES,
    "palestrina": (CHOIR, 100.0),  # half-note beats
    "josquin": (CHOIR, 100.0),
    "monteverdi": (CHOIR, 100.0),
    "trecento": (CHOIR, 100.0),
    "bach": (CHOIR, 80.0),  # chorales
}
OTHERS = (0, 100.0)  # piano
TUNE = re.compile(r"^X:\s*(\d+)[^\n]*\n(?:(?!X:)[^\n]*\n)*?T:\s*([^\n]*)", re.MULTILINE)


def tunes(path: Path) -> list[int | None]:
    """The tune numbers to read from an ABC file one by one, or [None]: the file is one piece
    (one tune, or tunes of one title, which are its parts)."""
    found: dict[int, str] = {}  # number -> title; music21 reads the first tune of a number
    for number, title in TUNE.findall(path.read_text(encoding="latin-1")):
        found.setdefault(int(number), title.strip())
    return list(found) if len(set(found.values())) > 1 else [None]


class Music21Song(Corpus):
    name = "music21-song"
    fractions = {"validation": 0.05, "test": 0.05}

    def tokenizer(self, option: str | None) -> Tokenizer:
        if option not in (None, "song"):
            raise DataError(f"{self.name} keeps every part and meter: only --tokenizer song applies, not {option!r}")
        return tokenizer_from_dict({"kind": "song"})

    def locate(self, source: Path | None, download: bool, out: Path) -> Path:
        if source is None:
            from music21 import corpus

            return Path(corpus.__file__).parent
        if not source.is_dir():
            raise DataError(f"{source}: not a folder of music21 collections")
        return source

    def listing(self, root: Path, out: Path, limit: int | None, workers: int | None) -> Listing:
        """Every piece written to MIDI under `<out>/midi/`, the collections interleaved so that a
        `limit` takes a few pieces of each; those music21 cannot convert refused."""
        by_collection: dict[str, list[tuple[Path, int | None]]] = {}
        for path in sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file()):
            collection = path.relative_to(root).parts[0]
            if collection not in EXCLUDED and path.parent != root:
                numbers = tunes(path) if path.suffix == ".abc" else [None]
                by_collection.setdefault(collection, []).extend((path, n) for n in numbers)
        pieces = [p for p in chain(*zip_longest(*by_collection.values())) if p is not None][:limit]
        if not pieces:
            raise DataError(f"{root}: no scores music21 reads ({', '.join(sorted(SUFFIXES))}) in collection folders")
        jobs, items = [], {}
        for path, number in pieces:
            relative = path.relative_to(root)
            collection = relative.parts[0]
            tune = "" if number is None else f"-{number}"
            dest = out / "midi" / f"{relative.as_posix()}{tune}.mid"
            program, bpm = DEFAULTS.get(collection, OTHERS)
            jobs.append((path, number, dest, {"bpm": bpm, "program": program, "pickup": "bar"}))
            # a work's movements (a folder of its own) split together
            work = relative.parts[1] if len(relative.parts) > 2 else relative.stem
            items[dest] = Item(name=f"{relative.as_posix()}{tune}", path=dest, group=f"{collection}/{work}{tune}")
        with worker_pool(workers) as pool:
            results = list(tqdm(pool.imap(convert, jobs), total=len(jobs), desc="music21 -> MIDI", unit="piece"))
        return Listing(
            [items[dest] for dest, reason in results if not reason],
            [(items[dest].name, reason) for dest, reason in results if reason],
            {"corpus": self.name, "source": str(root)},
        )

    def summarise(self, encoded: list[tuple[Item, Any, dict]]) -> dict[str, Any]:
        collections = Counter(item.name.split("/")[0] for item, _, _ in encoded)
        return {"collections": dict(sorted(collections.items())), "meters": pieces_per_meter(encoded)}


prepare = Music21Song().prepare
