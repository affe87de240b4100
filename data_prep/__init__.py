"""Turn raw corpora into token shards (see musegen/shards.py for the format).

Each corpus is a module here declaring a `Corpus` (data_prep/common.py): its name, its
tokenizer, where its raw files are (`locate`: a local copy or a download), how it lists them
(`listing`) and, where it differs, how one becomes tokens (`encode`). The one shared
`Corpus.prepare` encodes with workers, skips and counts bad files, splits and writes the
shards; each module exposes it as its entry point:

    prepare(out: Path, source: Path | None, download: bool, workers: int | None,
            limit: int | None, tokenizer: str | None, **options) -> dict   # the report stored in index.json

`source` is a local copy of the raw corpus (None: the corpus' default location), `download`
allows fetching it when it is missing, `limit` caps the number of pieces (for quick trials),
`tokenizer` overrides the corpus' default representation where that makes sense. `options` are
a corpus' own settings, given to its constructor (mma-groove: `scale`, its size, and `loops`; mma-song: `scale`).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

# name -> (module, one-line description); modules are imported only when used.
CORPORA: dict[str, tuple[str, str]] = {
    "pop909": ("data_prep.pop909", "POP909 pop piano songs -> REMI (local copy, or GitHub download)"),
    "pop909-song": ("data_prep.pop909_song", "POP909, its three tracks apart, in its annotated meters -> song"),
    "chorales": ("data_prep.chorales", "Bach chorales from music21's bundled corpus -> REMI (no network)"),
    "music21-song": ("data_prep.music21_song", "music21's corpus: part music and folk tunes in every meter -> song"),
    "freedoom": ("data_prep.freedoom", "Freedoom's game music from Debian's WADs, all in the test split -> song"),
    "mma-groove": ("data_prep.mma_groove", "Groove corpus synthesised with MMA, split by style -> groove"),
    "mma-song": ("data_prep.mma_song", "MMA's grooves in every meter, their own instruments, POP909 melodies -> song"),
    "pop1k7": ("data_prep.pop1k7", "Pop1K7 from Zenodo 4782721 -> REMI"),
    "groove2groove": ("data_prep.groove2groove", "Groove2Groove MIDI from Zenodo 3958000 -> groove"),
    "midi": ("data_prep.folder", "Any folder of MIDI files (--source), with --tokenizer remi|groove"),
}


def corpus_prepare(name: str) -> Callable[..., dict[str, Any]]:
    from musegen.errors import DataError

    if name not in CORPORA:
        raise DataError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}")
    return importlib.import_module(CORPORA[name][0]).prepare
