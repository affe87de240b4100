"""Prepared token shards back to MIDI files, to listen to what a model learns from."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

from tqdm import tqdm

from .errors import DataError
from .io import NAME_MAX, TEMP_NAME_EXTRA, name_fits, write_bytes
from .music.midi import MIDI_SUFFIXES
from .shards import Shards, resolve_split


def piece_stem(name: str) -> str:
    """A piece's name as a relative file stem: its MIDI suffix dropped, no absolute or parent parts
    (`pop/001` -> `pop/001`, `songs/a.mid` -> `songs/a`, `../x` -> `x`)."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.suffix in MIDI_SUFFIXES:
        path = path.with_suffix("")
    parts = [p for p in path.parts if p not in ("", ".", "..", "/")]
    return "/".join(parts) or "piece"


def export_midi(
    data_dir: str | os.PathLike, split: str, out_dir: str | os.PathLike, progress: bool = True
) -> dict[str, Any]:
    """Decode every piece of `split` to `out_dir/<piece name>.mid`.

    Files already in `out_dir` are never overwritten: a piece whose file exists is left as it is
    and counted (so an interrupted export resumes). Pieces that do not decode, or decode to no
    notes, are skipped and listed with the reason.
    """
    shards = Shards(data_dir)
    found = resolve_split(shards.splits, split)
    if found is None:
        raise DataError(f"{data_dir}: no split {split!r} (has {', '.join(shards.splits) or 'none'})")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"{out_dir}: exists and is not a folder")
    tokenizer = shards.tokenizer
    written, existing, skipped, taken = [], [], {}, set()
    names = shards.names(found)
    for name, ids in tqdm(
        zip(names, shards.pieces(found)), total=len(names), desc="exporting", unit="piece", disable=not progress
    ):
        path = out_dir / f"{piece_stem(name)}.mid"
        if not all(name_fits(part) for part in PurePosixPath(f"{piece_stem(name)}.mid").parts):
            skipped[name] = f"a part of its name is longer than a file name can be ({NAME_MAX - TEMP_NAME_EXTRA} bytes)"
            continue
        if path in taken:
            skipped[name] = f"another piece has the file name {path.name}"
            continue
        taken.add(path)
        if path.exists():
            existing.append(name)
            continue
        piece, why = tokenizer.decode_or_skip(ids)
        if piece is None:
            skipped[name] = why
            continue
        write_bytes(path, piece.midi_bytes())
        written.append(name)
    return {
        "split": found,
        "pieces": len(names),
        "written": len(written),
        "existing": len(existing),
        "skipped": skipped,
        "out": str(out_dir),
    }
