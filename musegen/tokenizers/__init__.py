"""Symbolic music representations: REMI (pop piano) and groove (bass, drums, accompaniment)."""

from .base import Encoding, Grammar, Tokenizer, load_tokenizer, tokenizer_from_dict

__all__ = ["Encoding", "Grammar", "Tokenizer", "load_tokenizer", "tokenizer_from_dict"]
