"""The decoder-only Performer with Stochastic Positional Encoding."""

from .attention import FeatureMap, causal_linear_attention, chunked_kernel, fast_transformers_available
from .config import PRESETS, ModelConfig, preset
from .spe import ConvSPE, SineSPE, SPEFilter
from .transformer import MusicPerformer

__all__ = [
    "PRESETS",
    "ModelConfig",
    "preset",
    "MusicPerformer",
    "SineSPE",
    "ConvSPE",
    "SPEFilter",
    "FeatureMap",
    "causal_linear_attention",
    "chunked_kernel",
    "fast_transformers_available",
]
