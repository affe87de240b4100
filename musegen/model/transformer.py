"""The decoder-only music Performer: parallel training forward and exact recurrent generation."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from .attention import FeatureMap, causal_linear_attention, softmax_attention
from .config import ModelConfig, parse_redraw
from .families import FAMILIES
from .spe import ConvSPE, SineSPE, SPEFilter


def sinusoids(t0: int, t1: int, width: int, device=None) -> torch.Tensor:
    """The sinusoidal absolute positions of Vaswani et al. for [t0, t1): [T, width]."""
    positions = torch.arange(t0, t1, device=device, dtype=torch.float64)[:, None]
    rates = torch.exp(torch.arange(0, width, 2, device=device, dtype=torch.float64) * (-math.log(10000.0) / width))
    angles = positions * rates
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[:, :width].float()


@dataclass
class Noise:
    """Everything random in a forward pass besides dropout: the shared SPE noise and each
    layer's gate noise. Random features live in the layers (buffers)."""
    spe: Any = None
    gates: list = field(default_factory=list)


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.d_model // config.n_heads
        self.kind, self.kernel = config.attention, config.kernel
        # The other families (families.py) bring their own core and may need fewer projections.
        self.family = FAMILIES[config.attention](config) if config.attention in FAMILIES else None
        self.inputs = self.family.inputs if self.family is not None else ("q", "k", "v")
        self.qkv = nn.Linear(config.d_model, len(self.inputs) * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)
        uses_spe = config.pe in ("sine", "conv")
        self.spe_filter = (SPEFilter(self.n_heads, self.head_dim, config.spe_realizations, config.gated)
                           if uses_spe else None)
        width = config.spe_realizations if uses_spe else self.head_dim  # width of the scored q, k
        self.scale = width ** -0.5
        self.features = (FeatureMap(config.attention, width, config.n_features)
                         if config.attention in ("performer", "relu", "elu") else None)

    def split(self, projected: torch.Tensor) -> tuple:
        """qkv(x) [B, T, P * d_model] -> q, k, v as [B, H, T, head_dim], None where not projected."""
        B, T, _ = projected.shape
        parts = projected.view(B, T, len(self.inputs), self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        named = dict(zip(self.inputs, parts))
        return named.get("q"), named.get("k"), named.get("v")

    def forward(self, x: torch.Tensor, codes, gate_noise, state):
        B, T, _ = x.shape
        q, k, v = self.split(self.qkv(x))
        # SPE, feature maps and the running sums stay in fp32 under autocast: exp() features and
        # long prefix sums lose too much in bf16.
        with torch.autocast(x.device.type, enabled=False):
            q, k, v = (None if t is None else t.float() for t in (q, k, v))
            if self.spe_filter is not None:
                q, k = self.spe_filter(q, k, codes, gate_noise)
            if self.family is not None:
                y, state = self.family(q, k, v, state)
            elif self.features is None:
                y, state = softmax_attention(q, k, v, self.scale, state)
            else:
                y, state = causal_linear_attention(self.features(q, True), self.features(k, False), v,
                                                   state, self.kernel)
        return self.out(y.transpose(1, 2).reshape(B, T, -1).to(x.dtype)), state


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre_norm = config.norm == "pre"
        self.attention = SelfAttention(config)
        self.norm1, self.norm2 = nn.LayerNorm(config.d_model), nn.LayerNorm(config.d_model)
        self.ff = nn.Sequential(nn.Linear(config.d_model, config.d_ff),
                                nn.ReLU() if config.activation == "relu" else nn.GELU(),
                                nn.Dropout(config.dropout), nn.Linear(config.d_ff, config.d_model))
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, codes, gate_noise, state):
        if self.pre_norm:
            y, state = self.attention(self.norm1(x), codes, gate_noise, state)
            x = x + self.dropout(y)
            return x + self.dropout(self.ff(self.norm2(x))), state
        y, state = self.attention(x, codes, gate_noise, state)  # post-norm, as the reference code
        x = self.norm1(x + self.dropout(y))
        return self.norm2(x + self.dropout(self.ff(x))), state


@dataclass
class _Session:
    batch_size: int
    noise: Noise
    position: int = 0
    states: list = field(default_factory=list)


class MusicPerformer(nn.Module):
    """Decoder-only Performer over token ids (PAPER_NOTES §2).

    Training: `forward(ids [B, N]) -> logits [B, N, vocab]`, causal, with fresh SPE and gate
    noise on every call. Call `on_train_step(step)` after each optimiser step to apply the
    config's feature-redraw policy.

    Generation: inside `with model.streaming(batch_size, seed=None):` all noise is drawn once
    (SPE noise, every layer's gate noise; the random features are the model's buffers and do
    not change) and each layer keeps its recurrent state. `model.step(tokens)` then consumes
    the next tokens of every sequence:
      - tokens [B] -> logits [B, vocab] for that position (the RNN step);
      - tokens [B, T] -> logits [B, T, vocab], the parallel chunked form continuing the same
        state: use it to ingest a prompt quickly.
    Both give the same logits (to float rounding), in any mix: a whole sequence through one
    `step(ids)` is the parallel forward with the session's frozen noise, and two sessions with
    the same `seed` draw the same noise. Per-token time and memory are constant for the linear
    attentions and "aaren"; "softmax", "relative" and "synthesizer" keep a growing key/value
    cache instead, and "synthesizer" stops at `max_len` positions. `step` runs without
    gradients; call `model.eval()` first so dropout is off.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        head_dim = config.d_model // config.n_heads
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        if config.pe == "sine":
            self.spe = SineSPE(config.n_heads, head_dim, config.spe_realizations, config.spe_sines)
        elif config.pe == "conv":
            self.spe = ConvSPE(config.n_heads, head_dim, config.spe_realizations, config.spe_kernel)
        else:
            self.spe = None
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()
        self.head = nn.Linear(config.d_model, config.vocab_size)
        self._redraw_kind, self._redraw_value = parse_redraw(config.redraw)
        self._session: Optional[_Session] = None
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    # --- noise and random features -------------------------------------------------------
    def draw_noise(self, generator: Optional[torch.Generator] = None) -> Noise:
        if self.spe is None:
            return Noise(None, [None] * len(self.layers))
        return Noise(self.spe.draw_noise(generator),
                     [layer.attention.spe_filter.draw_noise(generator) for layer in self.layers])

    def redraw_features(self) -> None:
        for layer in self.layers:
            if layer.attention.features is not None:
                layer.attention.features.redraw()

    def on_train_step(self, step: int) -> None:
        """Apply the redraw policy after optimiser step `step` ("fixed", "prob:P", "every:N")."""
        if self._redraw_kind == "prob" and torch.rand(()) < self._redraw_value:
            self.redraw_features()
        elif self._redraw_kind == "every" and step > 0 and step % self._redraw_value == 0:
            self.redraw_features()

    # --- forward passes ------------------------------------------------------------------
    def _run(self, ids: torch.Tensor, t0: int, noise: Noise, states: list) -> tuple[torch.Tensor, list]:
        t1 = t0 + ids.shape[1]
        self.config.check_length(t1)
        x = self.embedding(ids) * math.sqrt(self.config.d_model)
        if self.config.pe == "ape":
            x = x + sinusoids(t0, t1, self.config.d_model, ids.device).to(x.dtype)
        x = self.dropout(x)
        codes = None
        if self.spe is not None:
            with torch.autocast(ids.device.type, enabled=False):  # codes stay fp32, like the attention core
                codes = self.spe.codes(noise.spe, t0, t1)
        new_states = []
        for layer, gate_noise, state in zip(self.layers, noise.gates, states):
            x, state = layer(x, codes, gate_noise, state)
            new_states.append(state)
        return self.head(self.final_norm(x)), new_states

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits, _ = self._run(ids, 0, self.draw_noise(), [None] * len(self.layers))
        return logits

    @contextlib.contextmanager
    def streaming(self, batch_size: int, seed: Optional[int] = None):
        """Freeze all noise and hold per-layer recurrent state for `batch_size` sequences."""
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(torch.randint(0, 2**62, ())) if seed is None else seed)
        self._session = _Session(batch_size, self.draw_noise(generator), 0, [None] * len(self.layers))
        try:
            yield self
        finally:
            self._session = None

    @property
    def position(self) -> int:
        """Number of tokens consumed in the current streaming session."""
        if self._session is None:
            raise RuntimeError("position is only defined inside model.streaming()")
        return self._session.position

    @property
    def state_bytes(self) -> int:
        """Bytes the streaming session carries between tokens: every layer's recurrent state or
        key/value cache (constant for the linear attentions, growing for the softmax ones)."""
        if self._session is None:
            raise RuntimeError("state_bytes is only defined inside model.streaming()")

        def size(x) -> int:
            if isinstance(x, torch.Tensor):
                return x.nbytes
            return sum(size(y) for y in x) if isinstance(x, (list, tuple)) else 0

        return size(self._session.states)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        session = self._session
        if session is None:
            raise RuntimeError("step() must be called inside `with model.streaming(batch_size):`")
        single = tokens.dim() == 1
        ids = tokens[:, None] if single else tokens
        if ids.dim() != 2 or ids.shape[0] != session.batch_size:
            raise ValueError(f"step() expects [{session.batch_size}] or [{session.batch_size}, T] "
                             f"token ids, got shape {tuple(tokens.shape)}")
        logits, session.states = self._run(ids, session.position, session.noise, session.states)
        session.position += ids.shape[1]
        return logits[:, 0] if single else logits
