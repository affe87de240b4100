"""Model configuration: one dataclass and the named presets."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from ..errors import ConfigError, FormatError
from .features import FEATURE_MAPS
from .layer import ACTIVATIONS, NORMS

PE_CHOICES = ("ape", "sine", "conv", "none")
FAMILY_ATTENTIONS = ("relative", "synthesizer", "aaren")  # musegen/model/families.py
SYNTHESIZER_VARIANTS = ("dense", "random", "random-fixed", "factorized", "dot")
KERNEL_CHOICES = ("torch", "fast-transformers")
POSITION_CHOICES = ("tokens", "beats")  # what a position counts: tokens, or musical time in beats
LOSS_OVER = ("vocab", "grammar")  # the ids a model's softmax was trained over (ModelConfig.loss_over)


def size(most: int, least: int = 1):
    """An int setting within [least, most]."""
    return Annotated[int, Field(ge=least, le=most)]


# Every setting is checked where a config is made (from code, `--set`, a YAML file or a checkpoint),
# with its type and bounds. The upper bounds are many times the paper's values; some sizes (SPE
# realizations, heads) shape only the work of each step, so nothing else would bound them.
@dataclass(config=ConfigDict(strict=True, extra="forbid", allow_inf_nan=False))
class ModelConfig:
    vocab_size: size(2**20) = 333
    n_layers: size(256) = 24
    d_model: size(16384) = 512
    n_heads: size(256) = 8
    d_ff: size(65536) = 2048
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    activation: str = "relu"  # one of layer.ACTIVATIONS: "relu" | "gelu"
    norm: str = "post"  # one of layer.NORMS: "post" (reference code) | "pre"
    # Positional encoding: APE adds sinusoids to the embedding; SPE variants replace it.
    pe: str = "sine"  # one of PE_CHOICES
    # How APE enters: "musegen" adds the sinusoids to the embedding (weights N(0, 0.02)) before
    # the embedding dropout; "reference" as aliutkus/spe's pop-piano model: embedding weights
    # N(0, 0.01), the sinusoids added after the dropout, so positions are never dropped.
    ape_input: str = "musegen"
    gated: bool = True
    # "beats": each token sits at its onset in beats (any real, non-decreasing), given beside the
    # ids (training) or by the sampler at each step; "tokens": token indices 0, 1, 2, ...
    positions: str = "tokens"
    # With positions "beats": position units per beat, the onsets' scale. sineSPE's frequencies
    # stop at half a cycle per unit, so at 1 two onsets within one beat are barely told apart by
    # position; at a model's mean tokens per beat, the kernels of its token-position training
    # keep about their reach (a fine-tune from token positions).
    positions_per_beat: Annotated[float, Field(gt=0.0, le=4096.0)] = 1.0
    spe_sines: size(256) = 5  # K for sineSPE
    spe_kernel: size(4096) = 128  # filter length P for convSPE
    spe_realizations: size(1024) = 64  # R
    # Attention: FAVOR+ ("performer"), plain feature maps ("relu", "elu"), or exact softmax.
    attention: str = "performer"
    n_features: size(8192, least=2) = 128  # FAVOR+ features: n_features // 2 projections x [exp(+wx), exp(-wx)]
    redraw: str = "prob:0.05"  # "fixed" | "prob:P" | "every:N"
    kernel: str = "torch"  # causal linear attention kernel, one of KERNEL_CHOICES
    # Exact softmax over the last `window` tokens, FAVOR+ over the tokens before them (attention.py);
    # 0: FAVOR+ over every token.
    window: size(4096, least=0) = 0
    # The other attention families (docs/attention_families.md); pe must be "none" or "ape".
    max_relative_distance: size(65536) = 256  # relative: distances clipped here
    relative_values: bool = False  # relative: relative embeddings for the values too
    synthesizer: str = "dense"  # variants of SYNTHESIZER_VARIANTS, mixed with "+" (e.g. "dense+dot")
    synthesizer_rank: size(4096) = 8  # "factorized": rank of R1 R2^T
    max_len: size(65536) = 2048  # synthesizer: logits exist for positions < max_len only
    # The ids the softmax was trained over: "vocab", every id; "grammar", only those the
    # tokenizer's grammar allows at each step (the rest never enter the loss). Such a model's
    # logits mean nothing outside the grammar: it is sampled and scored under the grammar's mask.
    loss_over: str = "vocab"

    def __post_init__(self):
        # the linear attentions (one per feature map) and softmax: SPE and `kernel` apply to these
        dot_product = (*FEATURE_MAPS, "softmax")
        checks = [
            (self.pe in PE_CHOICES, f"pe must be one of {PE_CHOICES}, got {self.pe!r}"),
            (
                self.ape_input in ("musegen", "reference"),
                f"ape_input must be 'musegen' or 'reference', got {self.ape_input!r}",
            ),
            (
                self.attention in dot_product + FAMILY_ATTENTIONS,
                f"attention must be one of {dot_product + FAMILY_ATTENTIONS}, got {self.attention!r}",
            ),
            (
                self.positions in POSITION_CHOICES,
                f"positions must be one of {POSITION_CHOICES}, got {self.positions!r}",
            ),
            (
                self.positions == "tokens" or self.pe in ("sine", "ape"),
                f"positions 'beats' needs pe 'sine' or 'ape' (convSPE filters noise on a grid of "
                f"token steps; 'none' has no positions), got pe={self.pe!r}",
            ),
            (
                self.positions == "beats" or self.positions_per_beat == 1.0,
                f"positions_per_beat needs positions 'beats', got positions={self.positions!r}",
            ),
            (
                self.window == 0 or self.attention == "performer",
                f"window needs attention 'performer' (its exact part is the softmax FAVOR+ estimates), "
                f"got {self.attention!r}",
            ),
            (self.loss_over in LOSS_OVER, f"loss_over must be one of {LOSS_OVER}, got {self.loss_over!r}"),
            (self.kernel in KERNEL_CHOICES, f"kernel must be one of {KERNEL_CHOICES}, got {self.kernel!r}"),
            (self.norm in NORMS, f"norm must be 'post' or 'pre', got {self.norm!r}"),
            (self.activation in ACTIVATIONS, f"activation must be 'relu' or 'gelu', got {self.activation!r}"),
            (self.d_model % self.n_heads == 0, "d_model must be divisible by n_heads"),
            (self.n_features % 2 == 0, "n_features must be even"),
            (
                self.attention in dot_product or self.pe in ("none", "ape"),
                f"attention {self.attention!r} takes pe 'none' or 'ape' (SPE applies to "
                f"{', '.join(dot_product)}), got pe={self.pe!r}",
            ),
            (
                self.attention in dot_product or self.kernel == "torch",
                f"kernel {self.kernel!r} is a linear-attention kernel; attention {self.attention!r} has none",
            ),
            (
                self.attention == "relative" or not self.relative_values,
                f"relative_values needs attention 'relative', got {self.attention!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        parse_redraw(self.redraw)
        synthesizer_variants(self.synthesizer)

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model can read: synthesizer logits are tied to `max_len`."""
        return self.max_len if self.attention == "synthesizer" else None

    def check_length(self, n: int, what: str = "a sequence") -> None:
        """ConfigError when `n` tokens are more than the model can read (see `max_positions`)."""
        if self.max_positions is not None and n > self.max_positions:
            raise ConfigError(
                f"{what} of {n} tokens is longer than synthesizer attention's "
                f"max_len={self.max_len} (a model setting fixed at training)"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        return replace_checked(cls(), data)


def parse_redraw(policy: str) -> tuple[str, float]:
    """ "fixed" -> ("fixed", 0); "prob:P" -> ("prob", P) with 0 <= P <= 1; "every:N" -> ("every", N >= 1)."""
    kind, _, value = policy.partition(":")
    try:
        if kind == "fixed" and not value:
            return "fixed", 0
        if kind == "prob" and 0.0 <= float(value) <= 1.0:
            return "prob", float(value)
        if kind == "every" and int(value) >= 1:
            return "every", int(value)
    except ValueError:
        pass
    raise ConfigError(f"redraw must be 'fixed', 'prob:P' (0 <= P <= 1) or 'every:N' (N >= 1), got {policy!r}")


def synthesizer_variants(spec: str) -> tuple[str, ...]:
    """ "dense+dot" -> ("dense", "dot"): known variants, each at most once."""
    variants = tuple(spec.split("+"))
    if not set(variants) <= set(SYNTHESIZER_VARIANTS) or len(set(variants)) != len(variants):
        raise ConfigError(
            f"synthesizer must be variants of {SYNTHESIZER_VARIANTS} joined by '+', each at most once, got {spec!r}"
        )
    return variants


def replace_checked(obj, overrides: dict[str, Any]):
    """`dataclasses.replace` that rejects unknown fields, values of the wrong type and, for a
    ModelConfig, values out of bounds (ConfigError naming the setting)."""
    fields = {f.name: f for f in dataclasses.fields(obj)}
    clean = {}
    for key, value in overrides.items():
        if key not in fields:
            raise ConfigError(f"unknown setting {key!r} for {type(obj).__name__}")
        expected = type(getattr(obj, key))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigError(f"setting {key!r} expects {expected.__name__}, got {value!r}")
        clean[key] = value
    try:
        return dataclasses.replace(obj, **clean)
    except ValidationError as exc:  # a bound: each setting is a number, so its value prints short
        error = exc.errors(include_url=False)[0]
        message = error["msg"][0].lower() + error["msg"][1:]
        raise FormatError(f"setting {error['loc'][0]}: {message} (got {error['input']!r})") from None


PRESETS: dict[str, dict[str, Any]] = {
    # The paper's pop-piano model: ~80M parameters, REMI vocabulary (332 + PAD).
    "paper-pop": dict(vocab_size=333, pe="sine", gated=True, spe_sines=5, redraw="prob:0.05"),
    # The paper's groove model: 794 tokens (+ PAD), sineSPE K=8, features redrawn every 40 steps.
    "paper-groove": dict(vocab_size=795, pe="sine", gated=True, spe_sines=8, redraw="every:40"),
    # Small models that train on a laptop CPU in minutes.
    "small": dict(n_layers=4, d_model=256, n_heads=4, d_ff=1024, n_features=64, spe_realizations=32),
    "tiny": dict(n_layers=2, d_model=64, n_heads=2, d_ff=128, n_features=16, spe_realizations=16, spe_kernel=16),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset with `overrides` applied; a ConfigError names the valid presets."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return replace_checked(ModelConfig(), {**PRESETS[name], **overrides})
