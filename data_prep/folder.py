"""Any folder of MIDI files -> token shards (REMI by default, or any registered tokenizer kind).

Every file is its own group, 5% validation by hashed relative path. Unreadable or unusable
files (and FIFOs, devices, link loops with a MIDI suffix) are skipped, counted and listed,
which also makes this the entry point for fuzzing the tokenizers.
"""

from __future__ import annotations

from pathlib import Path

from musegen.errors import DataError
from musegen.io import printable
from musegen.music.midi import find_midi_files
from musegen.tokenizers.base import Tokenizer, tokenizer_from_dict

from .common import Corpus, Item, Listing


class MidiFolder(Corpus):
    name = "midi"

    def tokenizer(self, option: str | None) -> Tokenizer:
        """Any registered tokenizer kind, REMI by default."""
        kind = option or "remi"
        if kind not in Tokenizer.registry:
            raise DataError(f"unknown tokenizer {kind!r}; choose one of {', '.join(Tokenizer.registry)}")
        return tokenizer_from_dict({"kind": kind})

    def locate(self, source: Path | None, download: bool, out: Path) -> Path:
        if source is None:
            raise DataError("the midi corpus needs --source FOLDER (a folder of MIDI files)")
        return source

    def listing(self, root: Path, out: Path, limit: int | None, workers: int | None) -> Listing:
        """Every MIDI file under `root` (or `root` itself), each its own group, named by its path there."""
        files = find_midi_files(root)[:limit]
        base = root if root.is_dir() else root.parent
        names = [printable(p.relative_to(base)) for p in files]  # non-UTF-8 names as \xNN: printable, JSON-safe
        return Listing(
            [Item(name=name, path=p, group=name) for name, p in zip(names, files)],
            report={"corpus": self.name, "source": str(root)},
        )


prepare = MidiFolder().prepare
