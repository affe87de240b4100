"""The checkpoints the studio offers, by name: the shipped ones (wherever musegen/home.py finds
them) and those given with --checkpoint. Each is loaded once when the studio starts, so a bad folder is
refused before the page is served, and again in each worker process that samples it (OnDemand):
a run keeps its streaming state in a session of its own (MusicPerformer.session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import home
from ..checkpoint import load_checkpoint
from ..errors import ConfigError, MusegenError
from ..generation.live import live_refusal
from ..generation.prompt import load_prompt
from ..model.torch_step import PreparedWeights
from ..tokenizers.base import Tokenizer

LIVE_METERS = ((4, 4), (3, 4), (2, 4), (6, 8))  # the Live panel's Meter menu offers those a model plays


def shipped_checkpoints() -> list[Path]:
    return list(home.models().values())


def examples() -> dict[str, Path]:
    """The example prompts, by file name."""
    return home.examples()


class OnDemand:
    """The studio's models as a worker process holds them: by the names Models gave them, each
    loaded on the first run that samples it (Models checked every folder when the studio started)."""

    def __init__(self, folders: dict[str, Path]):
        self.folders = folders
        self._shared: dict[str, tuple[Any, Tokenizer, PreparedWeights]] = {}

    def shared(self, name: str) -> tuple[Any, Tokenizer, PreparedWeights]:
        """(model, tokenizer, prepared weights), as Models.shared."""
        if name not in self._shared:
            model, tokenizer = load_checkpoint(self.folders[name])[:2]
            self._shared[name] = model, tokenizer, PreparedWeights(model)
        return self._shared[name]


class Models:
    def __init__(self, folders: list[Path]):
        self.folders: dict[str, Path] = {}
        for folder in folders:
            name, n = folder.resolve().name, 2
            while name in self.folders and self.folders[name] != folder:
                name, n = f"{folder.name}-{n}", n + 1
            self.folders[name] = folder
        self._loaded = OnDemand(self.folders)
        for name in self.folders:  # every folder loaded now: a bad one is refused before anything is served
            self._loaded.shared(name)
        # the examples each model can continue (the groove tokenizer needs drums): a few small files
        self._examples = {name: _readable(self.tokenizer(name)) for name in self.folders}
        # the meters each plays live (a few encodes each): none where it cannot play live at all
        self._meters = {name: _live_meters(self.tokenizer(name)) for name in self.folders}

    def describe(self) -> list[dict[str, Any]]:
        tokenizers = {name: self.tokenizer(name) for name in self.folders}
        return [
            {
                "name": name,
                "tokenizer": t.kind,
                "defaults": dict(t.sampling_defaults),
                "examples": self._examples[name],
                "live_meters": self._meters[name],
            }
            for name, t in tokenizers.items()
        ]

    def name_of(self, checkpoint: str) -> str | None:
        """The name of the model whose folder is `checkpoint` (as a run's summary records it)."""
        at = Path(checkpoint).resolve() if checkpoint else None
        return next((n for n, f in self.folders.items() if f.resolve() == at), None)

    def tokenizer(self, name: str) -> Tokenizer:
        return self.shared(name)[1]

    def shared(self, name: str) -> tuple[Any, Tokenizer, PreparedWeights]:
        """(model, tokenizer, prepared weights): a run only reads the model, and keeps what changes
        while it samples in a session of its own."""
        if name not in self.folders:
            raise ConfigError(f"unknown model {str(name)[:80]!r}; choose one of: {', '.join(self.folders)}")
        return self._loaded.shared(name)


def _readable(tokenizer: Tokenizer) -> list[str]:
    """The example prompts `tokenizer` encodes without error, by file name."""
    readable = []
    for name, path in examples().items():
        try:
            load_prompt(tokenizer, path)
        except MusegenError:
            continue
        readable.append(name)
    return readable


def _live_meters(tokenizer: Tokenizer) -> list[str]:
    """The meters of LIVE_METERS `tokenizer` plays live, as the panel writes them ("3/4")."""
    return [f"{n}/{d}" for n, d in LIVE_METERS if live_refusal(tokenizer, (n, d)) is None]
