"""Any folder of MIDI files -> token shards (REMI by default, or groove).

Every file is its own group, 5% validation by hashed relative path. Unreadable or unusable
files are skipped and counted, which also makes this the entry point for fuzzing the tokenizers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from musegen.errors import DataError
from musegen.midi import find_midi_files
from musegen.tokenizers.base import tokenizer_from_dict

from .common import Item, prepare as prepare_items

KINDS = ("remi", "groove")
FRACTIONS = {"validation": 0.05}


def prepare(out: Path, source: Path | None = None, download: bool = False, workers: int | None = None,
            limit: int | None = None, tokenizer: str | None = None) -> dict[str, Any]:
    if source is None:
        raise DataError("the midi corpus needs --source FOLDER (a folder of MIDI files)")
    kind = tokenizer or "remi"
    if kind not in KINDS:
        raise DataError(f"unknown tokenizer {kind!r}; choose one of {', '.join(KINDS)}")
    source = Path(source)
    files = find_midi_files(source)[:limit]
    root = source if source.is_dir() else source.parent
    items = [Item(name=str(p.relative_to(root)), path=p, group=str(p.relative_to(root))) for p in files]
    return prepare_items(tokenizer_from_dict({"kind": kind}), items, out, FRACTIONS, workers,
                         extra_report={"corpus": "midi", "source": str(source)})
