"""Symbolic music representations: REMI (pop piano) and groove (bass, drums, accompaniment).

Every module of this package is imported here, so each `Tokenizer` subclass it defines is in
`Tokenizer.registry` (by `kind`) as soon as anything in the package is imported: adding a
representation is adding its module.
"""

import importlib
import pkgutil

from .base import Encoding, Grammar, RepresentationError, Tokenizer, load_tokenizer, tokenizer_from_dict

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Encoding", "Grammar", "RepresentationError", "Tokenizer", "load_tokenizer", "tokenizer_from_dict"]
