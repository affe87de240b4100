"""Prepared POP909 shards for the training tests, built once per test process."""

from __future__ import annotations

from pathlib import Path

from data_prep.common import Item, prepare
from musegen.tokenizers.remi import RemiTokenizer


def prepare_pop909(songs: list[Path], out: Path) -> Path:
    """REMI shards of `songs`, split by song with about a tenth held out for validation."""
    items = [Item(name=p.stem, path=p, group=p.parent.name) for p in songs]
    prepare(RemiTokenizer(), items, out, {"valid": 0.15}, workers=2)
    return out
