"""The decoder-only Performer with Stochastic Positional Encoding."""

from .config import PRESETS, ModelConfig, preset

__all__ = ["PRESETS", "ModelConfig", "preset"]
