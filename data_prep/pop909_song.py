"""POP909 for the `song` representation: the MELODY, BRIDGE and PIANO tracks kept apart, each
song synchronised to its beat annotations as for REMI (data_prep/pop909.py), but with every
annotated bar in its own meter: a bar of k beats becomes a k/4 bar, a pickup a bar of its own.
So no song is refused for its meter (the 28 in triple meter are in 3/4 or 6/4 here); only songs
without usable annotations are. Split by song as for REMI, so the two share their held-out songs.
"""

from __future__ import annotations

from pathlib import Path

from musegen.errors import DataError
from musegen.music.beats import synchronise
from musegen.music.midi import load_score
from musegen.tokenizers.base import Encoding, Tokenizer, tokenizer_from_dict

from .common import Item, Listing
from .pop909 import Pop909, annotations, song_files


class Pop909Song(Pop909):
    name = "pop909-song"

    def tokenizer(self, option: str | None) -> Tokenizer:
        if option not in (None, "song"):
            raise DataError(
                f"{self.name} keeps POP909's tracks and meters: only --tokenizer song applies, not {option!r}"
            )
        return tokenizer_from_dict({"kind": "song"})

    def listing(self, root: Path, out: Path, limit: int | None, workers: int | None) -> Listing:
        """Every song with usable beat annotations."""
        files = song_files(root)[:limit]
        if not files:
            raise DataError(f"{root}: no POP909 songs (NNN/NNN.mid) found")
        refused = {}
        for path in files:
            try:
                annotations(path)
            except DataError as exc:
                refused[path.stem] = str(exc)
        return Listing(
            [Item(name=p.stem, path=p, group=p.stem) for p in files if p.stem not in refused],
            list(refused.items()),
            {"corpus": self.name, "source": str(root), "synchronised": True, "bar_lengths": "annotated"},
        )

    def encode(self, tok: Tokenizer, item: Item) -> Encoding:
        seconds, downbeat = annotations(item.path)
        return tok.encode(synchronise(load_score(item.path), seconds, downbeat, meters=True))


prepare = Pop909Song().prepare
