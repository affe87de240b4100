"""The checkpoints the studio offers, by name: the shipped ones (wherever musegen/home.py finds
them) and those given with --checkpoint. Each is loaded once when the studio starts, so a bad folder is
refused before the page is served; a model carries its streaming state while it samples, so each
worker thread samples with its own copy."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

from .. import home
from ..checkpoint import load_checkpoint
from ..errors import ConfigError
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
        self._local = threading.local()

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "tokenizer": tokenizer.kind, "defaults": dict(tokenizer.sampling_defaults)}
            for name, (_, tokenizer) in self._loaded.items()
        ]

    def tokenizer(self, name: str) -> Tokenizer:
        return self._get(name)[1]

    def for_this_thread(self, name: str):
        """(model, tokenizer): this thread's own copy of the model."""
        template, tokenizer = self._get(name)
        copies = self._local.__dict__.setdefault("copies", {})
        if name not in copies:
            copies[name] = copy.deepcopy(template)
        return copies[name], tokenizer

    def _get(self, name: str):
        if name not in self._loaded:
            raise ConfigError(f"unknown model {str(name)[:80]!r}; choose one of: {', '.join(self._loaded)}")
        return self._loaded[name]
