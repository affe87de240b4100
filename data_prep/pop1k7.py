"""Pop1K7 (1,747 transcribed pop piano songs, REMI events) from Zenodo record 4782721 -> shards.

The record's `remi_dataset.tar.gz` holds one pickle per song: `(bar_positions, events)` with
events `{"name": "Note_Pitch", "value": 60}`, whose `name_value` strings are exactly musegen's
default REMI vocabulary. The pickles are read with an unpickler that builds only plain values
(lists, dicts, numbers, strings): a tampered file cannot run code. musegen's REMI encoder writes
the Pop1K7 pipeline's own conventions, so each piece is stored as it is, token for token, once
the REMI grammar accepts it; pieces it rejects, or that use unknown events, are skipped and
counted. (One case the grammar rejects: a piece whose last bar holds no note, which the
pipeline writes when it drops a last note whose onset rounds onto the next bar line.)
`--source` may name the extracted folder or the archive. Split by song, 5% validation.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np

from musegen.errors import DataError, TokenError
from musegen.tokenizers.base import Encoding, Tokenizer
from musegen.tokenizers.remi import RemiTokenizer

from .common import Corpus, Item, Listing
from .download import extract, fetch, zenodo_file

RECORD, ARCHIVE = 4782721, "remi_dataset.tar.gz"
# numpy scalars are the only non-builtin objects a plain event list may hold
SAFE_GLOBALS = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"), ("numpy", "dtype")}


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def load_piece(path: Path, tok: RemiTokenizer) -> np.ndarray:
    """Token ids of one Pop1K7 pickle, checked against the vocabulary and the grammar."""
    try:
        data = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
        _, events = data
        names = [f"{e['name']}_{e['value']}" for e in events]
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        IndexError,
        ImportError,
    ) as exc:
        raise DataError(f"{path.name}: not a Pop1K7 event pickle ({exc})") from None
    index = {name: i for i, name in enumerate(tok.vocab)}
    unknown = next((n for n in names if n not in index or n == "PAD_None"), None)
    if unknown is not None:
        raise DataError(f"{path.name}: unknown event {unknown!r}")
    ids = np.array([index[n] for n in names], dtype=np.int32)
    grammar = tok.grammar()
    state = grammar.start()
    for i, token in enumerate(ids.tolist()):
        try:
            state = grammar.step(state, token, where=i)
        except TokenError as exc:
            raise TokenError(f"{path.name}: not a REMI piece musegen writes ({exc})") from None
    if not grammar.can_close(state) or grammar.close(state):
        raise TokenError(f"{path.name}: not a REMI piece musegen writes (it does not end with Bar, EOS)")
    return ids


class Pop1k7(Corpus):
    name = "pop1k7"
    count_encodings = False  # its pieces are stored as they are: there is nothing to count

    def tokenizer(self, option: str | None) -> Tokenizer:
        tok = super().tokenizer(option)
        if tok.settings() != RemiTokenizer().settings():
            raise DataError("Pop1K7 is stored in the default REMI vocabulary only")
        return tok

    def locate(self, source: Path | None, download: bool, out: Path) -> Path:
        """The folder of pickles: `source` (folder or archive), or the Zenodo download."""
        raw = out / "raw"
        if source is not None:
            if source.is_file():
                extract(source, raw)
            elif not source.is_dir():
                raise DataError(f"{source}: Pop1K7 folder or archive not found")
            else:
                raw = source
        elif download:
            url, md5 = zenodo_file(RECORD, ARCHIVE)
            extract(fetch(url, raw / ARCHIVE, md5=md5), raw)
        else:
            raise DataError("Pop1K7 needs --source (the extracted remi_dataset folder or its archive) or --download")
        folders = sorted({p.parent for p in raw.rglob("*.pkl")})
        if not folders:
            raise DataError(f"{raw}: no Pop1K7 .pkl pieces found")
        return folders[0]

    def listing(self, root: Path, out: Path, limit: int | None, workers: int | None) -> Listing:
        """Every piece, each its own group."""
        files = sorted(root.glob("*.pkl"))[:limit]
        return Listing(
            [Item(name=p.stem, path=p, group=p.stem) for p in files], report={"corpus": self.name, "source": str(root)}
        )

    def encode(self, tokenizer: Tokenizer, item: Item) -> Encoding:
        return Encoding(load_piece(item.path, tokenizer))


prepare = Pop1k7().prepare
