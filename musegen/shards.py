"""Token shards: the prepared-corpus format shared by data preparation and training.

A prepared folder holds:
- `tokenizer.json`: the tokenizer that made the tokens;
- `<split>-<digest>.npy`: all pieces of a split, concatenated (int16 when the vocabulary fits),
  named by a digest of their bytes;
- `index.json`: {"format", "version", "tokenizer": kind, "splits": {split: {"file", "names",
  "offsets", "lengths"}}, "report": preparation summary}. It is written last and names the
  files it needs, so rewriting a folder swaps old for new in one rename: an interrupted rewrite
  leaves the previous complete index and its files untouched.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

import numpy as np
from pydantic import BaseModel, Field, JsonValue, model_validator
from pydantic_core import PydanticCustomError

from . import schemas
from .errors import CheckpointError, DataError, FormatError, MusegenError
from .io import atomic_path, read_head, write_json
from .tokenizers.base import Tokenizer, load_tokenizer

FORMAT, VERSION = "musegen-shards", 1
VALIDATION_NAMES = ("valid", "validation")  # corpora name their held-out split either way
INDEX, TOKENIZER = "index.json", "tokenizer.json"


class ShardSplit(BaseModel):
    """One split of a shard index: its pieces lie one after another in its .npy file."""

    model_config = schemas.STRICT
    file: Annotated[str, Field(pattern=r"^[\w-][\w.-]*\.npy$", max_length=255)] | None = None  # None: `<split>.npy`
    names: Annotated[list[schemas.Name], Field(max_length=schemas.MAX_ITEMS)]
    offsets: Annotated[list[schemas.Count], Field(max_length=schemas.MAX_ITEMS)]
    lengths: Annotated[list[schemas.Count], Field(max_length=schemas.MAX_ITEMS)]

    @model_validator(mode="after")
    def _consecutive(self) -> "ShardSplit":
        counts = len(self.names), len(self.offsets), len(self.lengths)
        if len(set(counts)) > 1:
            raise PydanticCustomError("pieces", "{n} names, {o} offsets and {l} lengths", dict(zip("nol", counts)))
        end = 0
        for i, (offset, length) in enumerate(zip(self.offsets, self.lengths)):
            if offset != end:
                raise PydanticCustomError(
                    "pieces",
                    "offsets.{i} is {o}, not {e}, where the piece before ends",
                    {"i": i, "o": offset, "e": end},
                )
            end += length
        return self


class ShardIndex(BaseModel):
    model_config = schemas.STRICT
    format: Literal["musegen-shards"]
    version: Literal[1]
    tokenizer: schemas.Name
    splits: dict[schemas.Name, ShardSplit]
    report: dict[str, JsonValue] = {}


SHARD_INDEX = schemas.Format("shard index", VERSION, ShardIndex)


def write_shards(
    folder: str | os.PathLike,
    tokenizer: Tokenizer,
    splits: dict[str, list[tuple[str, np.ndarray]]],
    report: dict[str, Any],
) -> Path:
    """Write every split's pieces (name, ids) and then the index that makes the folder complete."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dtype = np.int16 if tokenizer.vocab_size < 2**15 else np.int32
    index: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": tokenizer.kind,
        "splits": {},
        "report": report,
    }
    for split, pieces in splits.items():
        lengths = [int(len(ids)) for _, ids in pieces]
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int).tolist() if pieces else []
        tokens = np.concatenate([ids for _, ids in pieces]).astype(dtype) if pieces else np.zeros(0, dtype)
        file = f"{split}-{hashlib.sha256(tokens.tobytes()).hexdigest()[:16]}.npy"
        with atomic_path(folder / file) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, tokens)
        index["splits"][split] = {
            "file": file,
            "names": [name for name, _ in pieces],
            "offsets": offsets,
            "lengths": lengths,
        }
    replaced = _indexed_files(folder)
    tokenizer.save(folder / TOKENIZER)
    write_json(folder / INDEX, index)
    kept = {entry["file"] for entry in index["splits"].values()}
    for name in replaced - kept:  # the previous index's files, now unreferenced; never anything else
        (folder / name).unlink(missing_ok=True)
    return folder


def _indexed_files(folder: Path) -> set[str]:
    """The shard files the folder's current index names (plain `<split>-<digest>.npy` names only:
    an edited index must not make a rewrite delete files elsewhere)."""
    try:
        splits = schemas.read(folder / INDEX, SHARD_INDEX).splits
    except MusegenError:  # no index of ours: nothing to delete
        return set()
    return {
        entry.file for entry in splits.values() if entry.file and re.fullmatch(r"[\w.-]+-[0-9a-f]{16}\.npy", entry.file)
    }


class Shards:
    """Read access to a prepared folder: `Shards(dir).pieces("train")` -> list of id arrays."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise DataError(f"{self.folder}: data folder not found")
        if not (self.folder / INDEX).is_file():
            raise DataError(f"{self.folder}: no {INDEX}; prepare it with `musegen data prepare`")
        self.index = schemas.read(self.folder / INDEX, SHARD_INDEX).model_dump()
        try:
            self.tokenizer = load_tokenizer(self.folder / TOKENIZER)
        except FormatError:  # names the file and the field
            raise
        except MusegenError as exc:
            raise DataError(f"{self.folder}: {exc}") from None
        if self.index["tokenizer"] != self.tokenizer.kind:  # (index and tokenizer of two preparations)
            raise DataError(
                f"{self.folder / INDEX}: made with the {self.index['tokenizer']} tokenizer, but "
                f"{TOKENIZER} is {self.tokenizer.kind}; prepare the folder again"
            )
        self._cache: dict[str, np.ndarray] = {}

    @property
    def splits(self) -> list[str]:
        return list(self.index["splits"])

    def names(self, split: str) -> list[str]:
        return list(self._split(split)["names"])

    def pieces(self, split: str) -> list[np.ndarray]:
        """Each piece of `split` as an int64 array (views into one memory-mapped file)."""
        entry = self._split(split)
        if split not in self._cache:
            self._cache[split] = self._load_tokens(split, entry)
        tokens = self._cache[split]
        return [np.asarray(tokens[o : o + n], dtype=np.int64) for o, n in zip(entry["offsets"], entry["lengths"])]

    def _load_tokens(self, split: str, entry: dict[str, Any]) -> np.ndarray:
        """The split's token file, checked against the index and the tokenizer's vocabulary: an id
        outside it would only fail later, deep inside the model's embedding."""
        path = self.folder / (entry["file"] or f"{split}.npy")  # (older folders: one name per split)
        if read_head(path, 6, "shard file", DataError) != b"\x93NUMPY":  # (a FIFO or device: refused, not read)
            raise DataError(f"{path}: not a .npy file of token ids")
        try:
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: unreadable shard ({exc})") from None
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise DataError(f"{path}: expected a flat array of integer token ids, got {tokens.dtype} {tokens.shape}")
        total = sum(entry["lengths"])
        if len(tokens) != total:
            raise DataError(f"{path} holds {len(tokens)} tokens, the index says {total}")
        if len(tokens) and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.tokenizer.vocab_size:
            bad = int(np.flatnonzero((tokens < 0) | (tokens >= self.tokenizer.vocab_size))[0])
            piece = int(np.searchsorted(entry["offsets"], bad, side="right")) - 1
            raise DataError(
                f"{path}: token id {int(tokens[bad])} (piece {entry['names'][piece]!r}) is outside "
                f"the tokenizer's vocabulary 0..{self.tokenizer.vocab_size - 1}"
            )
        return tokens

    def pieces_for(self, split: str, tokenizer: Tokenizer) -> tuple[str, list[np.ndarray]]:
        """(split name, pieces) for a model trained with `tokenizer`; either validation spelling."""
        if self.tokenizer.to_dict() != tokenizer.to_dict():
            raise CheckpointError(
                f"the model was trained with another tokenizer than the one of {self.folder} "
                f"({tokenizer.kind} vs {self.tokenizer.kind})"
            )
        found = resolve_split(self.splits, split)
        if found is None:
            raise DataError(f"{self.folder}: no split {split!r} (has {', '.join(self.splits) or 'none'})")
        return found, self.pieces(found)

    def _split(self, split: str) -> dict[str, Any]:
        if split not in self.index["splits"]:
            raise DataError(f"{self.folder}: no split {split!r} (has {', '.join(self.splits) or 'none'})")
        entry = self.index["splits"][split]
        return entry  # (its pieces consecutive, one name, offset and length each: checked by its schema)


def resolve_split(available: Sequence[str], split: str) -> str | None:
    """`split` if the data has it; for a validation split, whichever spelling the data uses."""
    if split in available:
        return split
    if split in VALIDATION_NAMES:
        return next((name for name in VALIDATION_NAMES if name in available), None)
    return None


def merge_shards(
    out: str | os.PathLike, folders: Sequence[str | os.PathLike], exclude: Sequence[str] = ()
) -> dict[str, tuple[int, int]]:
    """One shard folder made of several prepared with the same tokenizer (to train on several
    corpora): each split joins the sources' pieces of that split, each piece named
    `<source folder>/<piece>`, except the pieces whose name matches a pattern of `exclude`
    (shell-style, `fnmatch`: a held-out set's pieces kept out of training); the index keeps each
    source's report under its folder's name, and the patterns with how many pieces each left out.
    Returns {split: (pieces, tokens)}."""
    sources = [Shards(folder) for folder in folders]
    if not sources:
        raise DataError("name at least one prepared folder to merge")
    out = Path(out)
    labels = [source.folder.name for source in sources]
    if len(set(labels)) < len(labels):
        raise DataError(f"two folders to merge share a name ({', '.join(labels)}): their pieces would share names")
    for source in sources:
        if source.folder.resolve() == out.resolve():
            raise DataError(f"{out}: the merged folder cannot be one of the folders merged")
        if source.tokenizer.to_dict() != sources[0].tokenizer.to_dict():
            raise DataError(
                f"{source.folder} was prepared with another tokenizer ({source.tokenizer.kind}) than "
                f"{sources[0].folder} ({sources[0].tokenizer.kind}); merge folders of one tokenizer"
            )
    splits: dict[str, list[tuple[str, np.ndarray]]] = {}
    excluded = dict.fromkeys(exclude, 0)
    for label, source in zip(labels, sources):
        for split in source.splits:
            for name, ids in zip(source.names(split), source.pieces(split)):
                name = f"{label}/{name}"
                matched = [pattern for pattern in excluded if fnmatch.fnmatchcase(name, pattern)]
                for pattern in matched:
                    excluded[pattern] += 1
                if not matched:
                    splits.setdefault(split, []).append((name, ids))
    report = {"merged": {label: s.index["report"] for label, s in zip(labels, sources)}}
    if excluded:
        report["excluded"] = excluded
    write_shards(out, sources[0].tokenizer, splits, report)
    return {split: (len(pieces), sum(len(ids) for _, ids in pieces)) for split, pieces in splits.items()}
