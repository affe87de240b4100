"""Prepared POP909 shards for the training tests, built once per test process."""

from __future__ import annotations

from itertools import chain
from pathlib import Path

from data_prep.common import Item, prepare
from musegen.tokenizers.remi import RemiTokenizer


def prepare_pop909(songs: list[Path], out: Path) -> Path:
    """REMI shards of `songs`, split by song with about a tenth held out for validation."""
    items = [Item(name=p.stem, path=p, group=p.parent.name) for p in songs]
    prepare(RemiTokenizer(), items, out, {"valid": 0.15}, workers=2)
    return out


def tiny_run(**settings) -> list[str]:
    """`musegen train` options for a model that trains in seconds: the `tiny` preset, batches of
    two, no data workers, no validation, and `settings` (seq_len, steps, log_every...) on top."""
    settings = {"seq_len": 32, "batch_size": 2, "workers": 0, "valid_every": 0, **settings}
    return ["--preset", "tiny", *chain.from_iterable(("--set", f"{k}={v}") for k, v in settings.items())]
