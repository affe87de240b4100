"""Any folder of MIDI files -> token shards (REMI by default, or any registered tokenizer kind).

Every file is its own group, 5% validation by hashed relative path. Unreadable or unusable
files (and FIFOs, devices, link loops with a MIDI suffix) are skipped, counted and listed,
which also makes this the entry point for fuzzing the tokenizers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from musegen.errors import DataError
from musegen.io import printable
from musegen.music.midi import find_midi_files
from musegen.tokenizers.base import Tokenizer, tokenizer_from_dict

from .common import Item
from .common import prepare as prepare_items

FRACTIONS = {"validation": 0.05}


def prepare(
    out: Path,
    source: Path | None = None,
    download: bool = False,
    workers: int | None = None,
    limit: int | None = None,
    tokenizer: str | None = None,
) -> dict[str, Any]:
    if source is None:
        raise DataError("the midi corpus needs --source FOLDER (a folder of MIDI files)")
    kind = tokenizer or "remi"
    if kind not in Tokenizer.registry:
        raise DataError(f"unknown tokenizer {kind!r}; choose one of {', '.join(Tokenizer.registry)}")
    source = Path(source)
    files = find_midi_files(source)[:limit]
    root = source if source.is_dir() else source.parent
    names = [printable(p.relative_to(root)) for p in files]  # non-UTF-8 names as \xNN: printable, JSON-safe
    items = [Item(name=name, path=p, group=name) for name, p in zip(names, files)]
    return prepare_items(
        tokenizer_from_dict({"kind": kind}),
        items,
        out,
        FRACTIONS,
        workers,
        extra_report={"corpus": "midi", "source": str(source)},
    )
