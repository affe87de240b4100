"""The decoder-only music Performer: parallel training forward and exact recurrent generation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from ..errors import NumericError
from . import c_step
from .attention import causal_linear_attention, softmax_attention, windowed_attention
from .config import ModelConfig, parse_redraw
from .dropout import Dropout
from .families import FAMILIES
from .features import FEATURE_MAPS
from .layer import ACTIVATIONS, residual_branches
from .spe import ConvSPE, SineSPE, SPEFilter, share_codes
from .torch_step import PreparedWeights, RecurrentStep

# The paths a streaming session's steps can take, named by the caller (the model times nothing:
# musegen.generation.precision chooses). STEP_C: bf16 with step.c running whole layers
# (musegen/model/c_step.py), where it builds for the model, else PyTorch's bf16 step.
FP32, BF16, STEP_C = "fp32", "bf16", "bf16-step.c"
STEP_PATHS = (FP32, BF16, STEP_C)


def sinusoids(positions: torch.Tensor, width: int) -> torch.Tensor:
    """The sinusoidal absolute positions of Vaswani et al. at `positions` [...] (token indices or
    beats): [..., width]."""
    device = positions.device
    rates = torch.exp(torch.arange(0, width, 2, device=device, dtype=torch.float64) * (-math.log(10000.0) / width))
    angles = positions.to(torch.float64)[..., None] * rates
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[..., :width].float()


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
        self.kernel, self.window = config.kernel, config.window
        # The other families (families.py) bring their own core and may need fewer projections.
        self.family = FAMILIES[config.attention](config) if config.attention in FAMILIES else None
        self.inputs = self.family.inputs if self.family is not None else ("q", "k", "v")
        self.qkv = nn.Linear(config.d_model, len(self.inputs) * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)
        uses_spe = config.pe in ("sine", "conv")
        self.spe_filter = (
            SPEFilter(self.n_heads, self.head_dim, config.spe_realizations, config.gated) if uses_spe else None
        )
        width = config.spe_realizations if uses_spe else self.head_dim  # width of the scored q, k
        self.scale = width**-0.5
        feature_map = FEATURE_MAPS.get(config.attention)
        self.features = feature_map(width, config.n_features) if feature_map is not None else None

    def split(self, projected: torch.Tensor) -> tuple:
        """qkv(x) [B, T, P * d_model] -> q, k, v as [B, H, T, head_dim], None where not projected."""
        B, T, _ = projected.shape
        parts = projected.view(B, T, len(self.inputs), self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        named = dict(zip(self.inputs, parts))
        return named.get("q"), named.get("k"), named.get("v")

    def forward(self, x: torch.Tensor, codes, gate_noise, state, start: int):
        """x [B, T, d_model] at token positions [start, start + T), continuing `state`."""
        B, T, _ = x.shape
        projected = self.qkv(x)
        q, k, v = self.split(projected)
        # Feature maps and the running sums stay in fp32 under autocast: exp() features and long
        # prefix sums lose too much in bf16. Matrix products (SPE's, the linear attention's)
        # take the projection's dtype (bf16 under autocast), as the linear layers do.
        with torch.autocast(x.device.type, enabled=False):
            if self.spe_filter is not None:
                q, k = self.spe_filter(q, k, codes, gate_noise)  # fp32 or wider
            wide = torch.promote_types(projected.dtype, torch.float32)
            q, k, v = (None if t is None else t.to(wide, memory_format=torch.contiguous_format) for t in (q, k, v))
            if self.family is not None:
                y, state = self.family(q, k, v, state)
            elif self.features is None:
                y, state = softmax_attention(q, k, v, self.scale, state)
            elif self.window:
                y, state = windowed_attention(
                    self.features, q, k, v, self.window, start, state, self.kernel, products=projected.dtype
                )
            else:
                y, state = causal_linear_attention(
                    self.features(q, True), self.features(k, False), v, state, self.kernel, products=projected.dtype
                )
        # One copy either way: the cast writes a contiguous tensor (bf16), else the reshape copies.
        y = y.transpose(1, 2).to(projected.dtype, memory_format=torch.contiguous_format)
        return self.out(y.reshape(B, T, -1)), state


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre_norm = config.norm == "pre"
        self.attention = SelfAttention(config)
        self.norm1, self.norm2 = nn.LayerNorm(config.d_model), nn.LayerNorm(config.d_model)
        self.ff = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff),
            _Activation(ACTIVATIONS[config.activation]),
            Dropout(config.dropout),
            nn.Linear(config.d_ff, config.d_model),
        )
        self.dropout = Dropout(config.dropout)

    def forward(self, x, codes, gate_noise, state, start: int):
        def attend(h, x):
            nonlocal state
            y, state = self.attention(h, codes, gate_noise, state, start)
            return x + self.dropout(y)

        def feed_forward(h, x):
            return x + self.dropout(self.ff(h))

        return residual_branches(x, (attend, feed_forward), (self.norm1, self.norm2), self.pre_norm), state


class _Activation(nn.Module):
    """An activation of layer.ACTIVATIONS as a module of the feed-forward Sequential."""

    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)


@dataclass
class StreamState:
    """A snapshot of a streaming session, from `model.get_state()`; `model.set_state(state)`
    continues from it, as often as wanted. `layers` holds each layer's recurrent state as the
    parallel pass takes it: (S [B, H, M, Dv], z [B, H, M]) for the linear attentions (with a
    window, its keys and values after them: attention.WindowState), the key/value cache for
    softmax, relative and synthesizer attention, (m, u, w) for aaren."""

    batch_size: int
    position: int
    noise: Any
    layers: list


def clone_states(states):
    """A deep copy of nested lists/tuples of tensors (None stays None)."""
    if isinstance(states, torch.Tensor):
        return states.clone()
    if isinstance(states, (list, tuple)):
        return type(states)(clone_states(x) for x in states)
    return states


class MusicPerformer(nn.Module):
    """Decoder-only Performer over token ids (docs/method.md).

    Training: `forward(ids [B, N]) -> logits [B, N, vocab]`, causal, with fresh SPE and gate
    noise on every call. Call `on_train_step(step)` after each optimiser step to apply the
    config's feature-redraw policy.

    Generation: `session = model.session(batch_size, path, seed)` draws all noise once (SPE
    noise, every layer's gate noise; the random features are the model's buffers and do not
    change) and keeps each layer's recurrent state; `session.step(tokens)` then consumes the
    next tokens of every sequence, one at a time or in parallel chunks (`Session`). A whole
    sequence through one `step(ids)` is the parallel forward with the session's frozen noise,
    and two sessions with the same `seed` draw the same noise. Per-token time and memory are
    constant for the linear attentions and "aaren"; "softmax", "relative" and "synthesizer"
    keep a growing key/value cache instead, and "synthesizer" stops at `max_len` positions.
    Steps run without gradients; call `model.eval()` first so dropout is off. The session holds
    everything that changes, so one model serves any number of sessions, in any threads.

    Precision of generation: the caller names the session's path, one of STEP_PATHS (default
    fp32; musegen.generation.precision chooses for "auto"). In bf16 the weights are read as
    bf16 (see torch_step.py) and block steps run under bf16 autocast (SPE's products included);
    the attention sums and logits stay fp32, and the fast single-token step applies the SPE
    codes in fp32. Single-token steps of the attentions without a fast step (softmax and the
    families) stay fp32. The logits then differ from fp32 by bf16 rounding
    (BF16_LOGIT_TOLERANCE, tests/test_transformer.py).
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
        self.dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()
        self.head = nn.Linear(config.d_model, config.vocab_size)
        self._redraw_kind, self._redraw_value = parse_redraw(config.redraw)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        if config.ape_input == "reference":
            nn.init.normal_(self.embedding.weight, std=0.01)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    # --- noise and random features -------------------------------------------------------
    def draw_noise(self, generator: Optional[torch.Generator] = None) -> Noise:
        if self.spe is None:
            return Noise(None, [None] * len(self.layers))
        return Noise(
            self.spe.draw_noise(generator), [layer.attention.spe_filter.draw_noise(generator) for layer in self.layers]
        )

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
    def _run(
        self, ids: torch.Tensor, t0: int, noise: Noise, states: list, beats: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, list]:
        """The layers over token positions [t0, t0 + T) continuing `states`: (final hidden [B, T, d],
        new states). `beats` [B, T]: each token's onset, for a model whose positions are beats."""
        t1 = t0 + ids.shape[1]
        self.config.check_length(t1)
        self._check_beats(beats, ids.shape)
        beats = self.beat_positions(beats)
        x = self.embedding(ids) * math.sqrt(self.config.d_model)
        if self.config.pe == "ape":
            positions = beats if beats is not None else torch.arange(t0, t1, device=ids.device)
            encoding = self.position_encoding(positions).to(x.dtype)
        if self.config.pe != "ape":
            x = self.dropout(x)
        elif self.config.ape_input == "reference":  # positions after the dropout: never dropped
            x = self.dropout(x) + encoding
        else:
            x = self.dropout(x + encoding)
        codes = None
        if self.spe is not None:
            device = ids.device.type
            # The codes come in the dtype of the layers' SPE products, once for all layers:
            # bf16 under autocast, like the attention's products (SPEFilter), else the model's
            # dtype or fp32, whichever is wider (a float64 model keeps float64 codes).
            products = (
                torch.get_autocast_dtype(device)
                if torch.is_autocast_enabled(device)
                else torch.promote_types(x.dtype, torch.float32)
            )
            with torch.autocast(device, enabled=False):
                if beats is not None:
                    codes = self.spe.factored_codes(noise.spe, beats, dtype=products)
                else:
                    codes = tuple(share_codes(c) for c in self.spe.codes(noise.spe, t0, t1, dtype=products))
        new_states = []
        for layer, gate_noise, state in zip(self.layers, noise.gates, states):
            x, state = layer(x, codes, gate_noise, state, t0)
            new_states.append(state)
        return self.final_norm(x), new_states

    def position_encoding(self, positions: torch.Tensor) -> torch.Tensor:
        """The absolute (APE) encoding of `positions` [...] (token indices or beats): [..., d_model]."""
        return sinusoids(positions, self.config.d_model)

    def beat_positions(self, beats: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """Onsets in beats as the positions the encodings read (`positions_per_beat` units a beat)."""
        scale = self.config.positions_per_beat
        return beats if beats is None or scale == 1.0 else beats * scale

    def _check_beats(self, beats: Optional[torch.Tensor], shape: tuple) -> None:
        """ValueError unless `beats` is given, of `shape`, exactly when the positions are beats."""
        wanted = self.config.positions == "beats"
        if (beats is not None) != wanted:
            raise ValueError(
                "this model's positions are beats: pass each token's onset"
                if wanted
                else "this model's positions are token indices: it takes no beats"
            )
        if beats is not None and tuple(beats.shape) != tuple(shape):
            raise ValueError(f"beats of shape {tuple(beats.shape)} for tokens of shape {tuple(shape)}")

    def forward(self, ids: torch.Tensor, beats: Optional[torch.Tensor] = None) -> torch.Tensor:
        """ids [B, N] -> logits [B, N, vocab]; `beats` [B, N]: each token's onset in beats, for a
        model whose positions are beats (config.positions)."""
        hidden, _ = self._run(ids, 0, self.draw_noise(), [None] * len(self.layers), beats)
        return self.head(hidden)

    # --- streaming generation --------------------------------------------------------------
    def session(
        self,
        batch_size: int,
        path: str = FP32,
        seed: Optional[int] = None,
        weights: Optional[PreparedWeights] = None,
    ) -> "Session":
        """A streaming session of `batch_size` sequences on step path `path` (STEP_PATHS), all its
        noise drawn from `seed` (None: from torch's global generator). `weights`: the prepared
        weights to share with other sessions of this model (None: the session prepares its own)."""
        if path not in STEP_PATHS:
            raise ValueError(f"a step path is one of {', '.join(STEP_PATHS)}, got {path!r}")
        if weights is None:
            weights = PreparedWeights(self)
        elif weights.model is not self:
            raise ValueError("these prepared weights are another model's")
        if path != FP32:
            self._check_range(torch.bfloat16)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(torch.randint(0, 2**62, ())) if seed is None else seed)
        return Session(self, batch_size, path, self.draw_noise(generator), weights)

    def step_paths(self) -> tuple[str, ...]:
        """The paths whose single-token steps run differently here, for a caller to time: fp32,
        PyTorch's bf16, and STEP_C where step.c builds with bf16 arithmetic and has the model's
        feature map. None without a fast step: single tokens then run the parallel pass in fp32."""
        if not RecurrentStep.supports(self.config):
            return ()
        step_c_runs = c_step.supports(self.config) and c_step.step_kernels(self.device) is not None
        return STEP_PATHS if step_c_runs else (FP32, BF16)

    def _check_range(self, dtype: torch.dtype) -> None:
        """NumericError when a weight, cast to `dtype` for the steps, would become inf."""
        for name, tensor in self.state_dict().items():
            if tensor.is_floating_point() and torch.isinf(tensor.to(dtype)).any():
                raise NumericError(
                    f"{name} holds values up to {tensor.abs().max().item():.6g}, beyond the range "
                    f"of {dtype}; sample with --precision fp32"
                )


class Session:
    """A streaming session (`MusicPerformer.session`): frozen noise, the position, and every
    layer's recurrent state, held by the fast single-token step where the model has one
    (torch_step.RecurrentStep), else as the parallel pass takes it. The session holds all that
    changes; the model and the prepared weights are only read, so threads may sample from one
    model at once, each with its own sessions.

    `step(tokens)` consumes the next tokens of every sequence:
      - tokens [B] -> logits [B, vocab] for that position (the RNN step);
      - tokens [B, T] -> logits [B, T, vocab], the parallel chunked form continuing the same
        state: use it to ingest a prompt quickly.
    Both give the same logits (to float rounding), in any mix. `get_state()` snapshots the
    session and `set_state(state)` continues from a snapshot."""

    def __init__(self, model: MusicPerformer, batch_size: int, path: str, noise: Noise, weights: PreparedWeights):
        self.model, self.batch_size, self.path, self.noise = model, batch_size, path, noise
        self.bf16 = path != FP32
        self.position = 0  # tokens consumed
        self.fast = None
        if RecurrentStep.supports(model.config):
            with torch.no_grad():
                dtype = torch.bfloat16 if self.bf16 else torch.float32
                self.fast = RecurrentStep(model, batch_size, noise, dtype, weights, use_kernels=path == STEP_C)
        self._states = None if self.fast is not None else [None] * len(model.layers)

    @property
    def states(self) -> list:
        return self.fast.states(self.position) if self.fast is not None else self._states

    @states.setter
    def states(self, states: list) -> None:
        """Every layer's state after `self.position` tokens."""
        if self.fast is not None:
            self.fast.load(states, self.position)
        else:
            self._states = states

    @property
    def state_bytes(self) -> int:
        """Bytes the session carries between tokens: every layer's recurrent state or key/value
        cache (constant for the linear attentions, growing for the softmax ones)."""
        if self.fast is not None:
            return self.fast.state_bytes

        def size(x) -> int:
            if isinstance(x, torch.Tensor):
                return x.nbytes
            return sum(size(y) for y in x) if isinstance(x, (list, tuple)) else 0

        return size(self.states)

    def get_state(self) -> StreamState:
        """A snapshot of the session (a copy: later steps do not change it)."""
        return StreamState(self.batch_size, self.position, self.noise, clone_states(self.states))

    def set_state(self, state: StreamState) -> None:
        """Continue from a snapshot of a session with the same batch size (of this model)."""
        if state.batch_size != self.batch_size:
            raise ValueError(f"a state of batch size {state.batch_size} in a session of {self.batch_size}")
        self.noise, self.position = state.noise, state.position
        self.states = list(state.layers)  # the parallel pass never changes a state in place
        if self.fast is not None:
            self.fast.use_noise(state.noise)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, beats: Optional[torch.Tensor] = None) -> torch.Tensor:
        """`beats`, shaped as `tokens`: each token's onset in beats, for a model whose positions
        are beats (the sampler keeps it with the tokenizer's `onset_clock`)."""
        single = tokens.dim() == 1
        ids = tokens[:, None] if single else tokens
        if ids.dim() != 2 or ids.shape[0] != self.batch_size:
            raise ValueError(
                f"step() expects [{self.batch_size}] or [{self.batch_size}, T] "
                f"token ids, got shape {tuple(tokens.shape)}"
            )
        model, device = self.model, self.model.device.type
        if single and self.fast is not None:
            model._check_beats(beats, tokens.shape)
            with torch.autocast(device, enabled=False):
                logits = self.fast(tokens, self.position, beats)
            self.position += 1
            return logits
        # single tokens without a fast step stay fp32: autocast would cast every weight every step
        with torch.autocast(device, dtype=torch.bfloat16, enabled=self.bf16 and not single):
            block_beats = beats[:, None] if single and beats is not None else beats
            hidden, states = model._run(ids, self.position, self.noise, self.states, block_beats)
        self.position += ids.shape[1]
        self.states = states
        with torch.autocast(device, enabled=False):  # fp32 logits, as the fast step's
            logits = model.head(hidden.float())
        return logits[:, 0] if single else logits
