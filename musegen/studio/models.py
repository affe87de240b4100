"""The checkpoints the studio offers, by name: the shipped ones (wherever musegen/home.py finds
them) and those given with --checkpoint. Each is loaded once when the studio starts, so a bad folder is
refused before the page is served. Workers share each model and its prepared weights: a run keeps
its streaming state in a session of its own (MusicPerformer.session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import home
from ..checkpoint import load_checkpoint
from ..errors import ConfigError, MusegenError
from ..generation.prompt import load_prompt
from ..model.torch_step import PreparedWeights
from ..tokenizers.base import Tokenizer


def shipped_checkpoints() -> list[Path]:
    return list(home.models().values())


def examples() -> dict[str, Path]:
    """The example prompts, by file name."""
    return home.examples()


class Models:
    def __init__(self, folders: list[Path]):
        self.folders: dict[str, Path] = {}
        for folder in folders:
            name, n = folder.resolve().name, 2
            while name in self.folders and self.folders[name] != folder:
                name, n = f"{folder.name}-{n}", n + 1
            self.folders[name] = folder
        self._loaded = {name: load_checkpoint(folder)[:2] for name, folder in self.folders.items()}
        self._weights = {name: PreparedWeights(model) for name, (model, _) in self._loaded.items()}
        # the examples each model can continue (the groove tokenizer needs drums): a few small files
        self._examples = {name: _readable(tokenizer) for name, (_, tokenizer) in self._loaded.items()}

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "tokenizer": tokenizer.kind,
                "defaults": dict(tokenizer.sampling_defaults),
                "examples": self._examples[name],
            }
            for name, (_, tokenizer) in self._loaded.items()
        ]

    def name_of(self, checkpoint: str) -> str | None:
        """The name of the model whose folder is `checkpoint` (as a run's summary records it)."""
        at = Path(checkpoint).resolve() if checkpoint else None
        return next((n for n, f in self.folders.items() if f.resolve() == at), None)

    def tokenizer(self, name: str) -> Tokenizer:
        return self._get(name)[1]

    def shared(self, name: str) -> tuple[Any, Tokenizer, PreparedWeights]:
        """(model, tokenizer, prepared weights), one of each for every worker: a run only reads the
        model, and keeps what changes while it samples in a session of its own."""
        model, tokenizer = self._get(name)
        return model, tokenizer, self._weights[name]

    def _get(self, name: str):
        if name not in self._loaded:
            raise ConfigError(f"unknown model {str(name)[:80]!r}; choose one of: {', '.join(self._loaded)}")
        return self._loaded[name]


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
