"""What every tokenizer offers: a vocabulary, encode/decode, a grammar, JSON persistence.

Tokenizers know nothing about torch: ids are numpy int arrays. The grammar is a small state
machine the sampler uses to mask logits and the tests use to check validity.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import miditoolkit
import numpy as np

from ..errors import TokenError
from ..io import read_json, write_json


MAX_BARS = 10_000  # about 5 hours at 120 bpm: anything longer is a broken file, not music


@dataclass
class Encoding:
    """The result of encoding one MIDI file."""

    ids: np.ndarray  # int32 token ids, start to end of the piece
    report: dict[str, Any] = field(default_factory=dict)  # counts of folded/dropped notes etc.


class Grammar(abc.ABC):
    """Which tokens may come next. States are small immutable-by-convention objects."""

    vocab_size: int

    @abc.abstractmethod
    def start(self) -> Any:
        """The state before the first token."""

    @abc.abstractmethod
    def allowed(self, state: Any) -> np.ndarray:
        """Boolean mask of shape (vocab_size,): the tokens that may follow `state`."""

    @abc.abstractmethod
    def step(self, state: Any, token: int) -> Any:
        """The state after `token`; raises TokenError when `token` is not allowed."""

    @abc.abstractmethod
    def can_close(self, state: Any) -> bool:
        """True where the piece may be ended now (no half-written note)."""

    @abc.abstractmethod
    def close(self, state: Any) -> list[int]:
        """Tokens that end the piece cleanly from a state where `can_close` holds."""

    def first_violation(self, ids) -> int | None:
        """Index of the first token the grammar rejects, or None when all are accepted."""
        state = self.start()
        for i, tok in enumerate(ids):
            if not self.allowed(state)[int(tok)]:
                return i
            state = self.step(state, int(tok))
        return None


class Tokenizer(abc.ABC):
    """One symbolic representation. Subclasses register themselves under `kind`."""

    kind: ClassVar[str]
    registry: ClassVar[dict[str, type["Tokenizer"]]] = {}
    # Training augmentation: keyword arguments of musegen.data.Augmenter (none: the data as it is).
    augmentation: ClassVar[dict[str, Any]] = {}
    # Where training crops start under `crop=auto`: a "random" window or the piece's "start".
    default_crop: ClassVar[str] = "random"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            Tokenizer.registry[cls.kind] = cls

    vocab: list[str]  # id -> event name
    # Token types for per-type metrics: type name -> event-name prefix, in order (an id has the
    # first type whose prefix starts its name; PAD has none). `position_type` moves time in a bar.
    token_types: ClassVar[dict[str, str]] = {}
    position_type: ClassVar[str | None] = None

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    @abc.abstractmethod
    def pad_id(self) -> int: ...

    def token_type_ids(self) -> np.ndarray:
        """For every id, the index of its type in `list(token_types)`, or -1 when it has none."""
        prefixes = list(self.token_types.values())
        return np.array([next((k for k, p in enumerate(prefixes) if name.startswith(p)), -1)
                         for name in self.vocab], dtype=np.int64)

    @abc.abstractmethod
    def encode(self, source: str | os.PathLike | bytes) -> Encoding:
        """Encode a MIDI file (path or bytes). Raises MidiError for unusable input."""

    @abc.abstractmethod
    def decode(self, ids) -> miditoolkit.MidiFile:
        """Decode ids to MIDI. Raises TokenError when the ids cannot be decoded."""

    @abc.abstractmethod
    def grammar(self) -> Grammar: ...

    @abc.abstractmethod
    def transpose(self, ids: np.ndarray, shift: int) -> np.ndarray | None:
        """The ids transposed by `shift` semitones, or None when a pitch would leave the range."""

    @abc.abstractmethod
    def bar_starts(self, ids) -> list[int]:
        """Indices at which each bar starts (used to cut prompts to N bars)."""

    @abc.abstractmethod
    def settings(self) -> dict[str, Any]:
        """The constructor keyword arguments; `type(self)(**settings())` rebuilds the tokenizer."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "settings": self.settings(), "vocab": list(self.vocab)}

    def save(self, path: str | os.PathLike) -> None:
        write_json(path, self.to_dict())


def tokenizer_from_dict(data: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from `to_dict()` output, checking the stored vocabulary matches."""
    from . import groove, remi  # noqa: F401  (registers the kinds)

    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in Tokenizer.registry:
        raise TokenError(f"unknown tokenizer kind {kind!r}")
    try:
        tok = Tokenizer.registry[kind](**data.get("settings", {}))
    except TypeError as exc:
        raise TokenError(f"invalid {kind} tokenizer settings: {exc}") from None
    if "vocab" in data and list(data["vocab"]) != list(tok.vocab):
        raise TokenError(f"stored {kind} vocabulary does not match the one its settings produce")
    return tok


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    path = Path(path)
    if not path.is_file():
        raise TokenError(f"{path}: tokenizer file not found")
    try:
        data = read_json(path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenError(f"{path}: not valid JSON ({exc})") from None
    return tokenizer_from_dict(data)
