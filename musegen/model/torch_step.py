"""The single-token step of the linear attentions: the fast path of `MusicPerformer.step`.

One token through the paper-size model reads every weight once (~76M parameters) and does
little else, so a step should cost about the time memory takes to deliver the weights. The
parallel pass run on one token is many small operations a layer (SPE products, feature maps,
copies) and matrix-vector products on unpacked weights; docs/performance.md ("The cost of one
step") counts both paths. `RecurrentStep` keeps the model's arithmetic (layer.py's order,
features.py's maps, spe.py's gate; tests/test_transformer.py checks every variant against the
parallel pass) in far fewer operations, by preparing its operands once per session:

- the SPE codes of the position once per step for all layers, each layer's gate folded into one
  [2, H, D, R] matrix that meets q and k in one bmm;
- the weights cast once (`Linear`: bf16 where the device computes bf16 natively, reordered by
  oneDNN on CPU), or packed for step.c, which then runs each whole layer in one call (c_step),
  kept in a `PreparedWeights` that sessions may share;
- the value projection given one more output per head (zero weights, bias 1), so the recurrent
  sums S and z live in one [H * B, M, Dv + 1] tensor, updated by one outer-product add and read
  by one product (numerator and denominator together);
- with a window (attention.windowed_attention), a ring buffer of the last W keys and [v, 1]
  values per head and sequence: the key a step overwrites enters the sums as it leaves, so the
  state keeps its size whatever the number of tokens;
- on CUDA, the layers replayed as one captured graph.

The residual stream, the attention sums and the output head stay fp32.
"""

from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass
from functools import cache, partial
from typing import Optional

import torch
from torch.nn import functional as F

from . import c_step
from .attention import EPS
from .features import FEATURE_MAPS
from .layer import ACTIVATIONS, residual_branches
from .spe import SineSPE, gate_codes


def _onednn_bf16(device: torch.device) -> bool:
    return device.type == "cpu" and _onednn_packs_bf16()


@cache
def _onednn_packs_bf16() -> bool:
    """Whether oneDNN packs bf16 weights on this CPU: it refuses on CPUs without AVX512-BW/VL/DQ or
    AVX-NE-CONVERT (AMD's Zen 3, say), which only trying tells, so this tries once."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(2, 2, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


class Linear:
    """activation(x W^T + b) (+ add_to) for inference: x of any float dtype, the result fp32, the
    weights cast once to `dtype`. In bf16 on CPU, fastest first: step.c's linear_bf16 (weights
    in tiles, read as one stream), oneDNN's packed product (weights reordered for one row; an
    unpacked one reaches about half the memory bandwidth), F.linear."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor,
        dtype: torch.dtype,
        activation: Optional[str] = None,
        kernels: Optional[ctypes.CDLL] = None,
    ):
        self.activation, self.dtype = activation, dtype
        self.kernels = kernels if dtype == torch.bfloat16 else None
        weight, bias = weight.detach(), bias.detach()
        self.n_out, self.n_in = weight.shape
        if self.kernels is not None:
            self.weight, self.bias = c_step.tiles(weight), bias.float().contiguous()
            return
        self.weight, self.bias = weight.to(dtype), bias.to(dtype)
        self.packed = dtype == torch.bfloat16 and _onednn_bf16(weight.device)
        if self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(self.weight, 1)

    def __call__(self, x: torch.Tensor, add_to: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.kernels is not None:  # step.c's product on its own (layer_step calls it from C)
            y = self._activate(c_step.linear(self.kernels, self.weight, self.bias, x, self.n_out))
        elif self.packed:
            y = torch.ops.mkldnn._linear_pointwise(
                x.to(self.dtype),
                self.weight,
                self.bias,
                self.activation or "none",
                [],
                "none" if self.activation == "gelu" else "",
            ).float()
        else:
            y = self._activate(F.linear(x.to(self.dtype), self.weight, self.bias)).float()
        return y if add_to is None else add_to + y

    def _activate(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.activation is None else ACTIVATIONS[self.activation](y)


def _qkv_with_ones(attention) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention's q, k, v projection with one more output per head after its values:
    zero weights and bias 1, so v arrives as [v, 1] and one product gives numerator and
    denominator."""
    weight, bias = attention.qkv.weight.detach(), attention.qkv.bias.detach()
    H, D = attention.n_heads, attention.head_dim
    d_model = weight.shape[1]
    v_weight = weight[2 * H * D :].view(H, D, d_model)
    v_bias = bias[2 * H * D :].view(H, D)
    ones_weight = v_weight.new_zeros(H, D + 1, d_model)
    ones_bias = v_bias.new_ones(H, D + 1)
    ones_weight[:, :D], ones_bias[:, :D] = v_weight, v_bias
    return (
        torch.cat([weight[: 2 * H * D], ones_weight.view(-1, d_model)]),
        torch.cat([bias[: 2 * H * D], ones_bias.view(-1)]),
    )


@dataclass
class LayerWeights:
    qkv: Linear
    out: Linear
    ff_in: Linear
    ff_out: Linear


def _prepare(model, dtype: torch.dtype, kernels: Optional[ctypes.CDLL]) -> list:
    """Every layer's `LayerWeights` plus the head, as the step reads them."""
    layers = []
    for layer in model.layers:
        ff_in, ff_out = layer.ff[0], layer.ff[3]
        layers.append(
            LayerWeights(
                Linear(*_qkv_with_ones(layer.attention), dtype, kernels=kernels),
                Linear(layer.attention.out.weight, layer.attention.out.bias, dtype, kernels=kernels),
                Linear(ff_in.weight, ff_in.bias, dtype, model.config.activation, kernels),
                Linear(ff_out.weight, ff_out.bias, dtype, kernels=kernels),
            )
        )
    # The head stays fp32: it is small (vocab x d_model), and bf16 logits would be rounded to 2^-8.
    return layers + [Linear(model.head.weight, model.head.bias, torch.float32)]


class PreparedWeights:
    """A model's weights as the step reads them (cast, packed), built once per dtype and kernels
    and rebuilt once a parameter changes (an optimiser step or a load bumps its version). Held by
    the caller, not the model: sessions given the same one share its copies, and as it only reads
    the model, threads sampling from one model may share it too."""

    def __init__(self, model):
        self.model = model
        self._built: dict = {}  # (dtype, step.c's or not) -> (the parameters' versions, weights)
        self._lock = threading.Lock()  # two threads asking at once build one copy

    def get(self, dtype: torch.dtype, kernels: Optional[ctypes.CDLL] = None) -> list:
        version = tuple((p.data_ptr(), p._version) for p in self.model.parameters())
        key = (dtype, kernels is not None)
        with self._lock:
            # stale copies go before anything new is built, so two never coexist
            self._built = {k: built for k, built in self._built.items() if built[0] == version}
            if key not in self._built:
                self._built[key] = (version, _prepare(self.model, dtype, kernels))
            return self._built[key][1]


class RecurrentStep:
    """One token of every sequence through a linear-attention model, on a fixed-size state
    (module docstring). Holds the session's recurrent sums; `states()` / `load()` convert them
    to and from the parallel pass's (S, z) so both forms can continue each other."""

    def __init__(
        self, model, batch_size: int, noise, dtype: torch.dtype, weights: PreparedWeights, use_kernels: bool = True
    ):
        c = model.config
        self.model, self.dtype, self.batch = model, dtype, batch_size
        self.H, self.D = c.n_heads, c.d_model // c.n_heads
        self.pre_norm, self.eps = c.norm == "pre", EPS
        # step.c runs whole layers in bf16; fp32 sessions (and machines without it, or where the
        # caller chose PyTorch's bf16: musegen.generation.precision) run PyTorch
        use_kernels = use_kernels and dtype == torch.bfloat16 and c_step.supports(c)
        kernels = c_step.step_kernels(model.device) if use_kernels else None
        self.kernels = kernels
        self.weights = weights.get(dtype, kernels)
        self.embedding = model.embedding.weight.detach() * math.sqrt(c.d_model)
        # F.layer_norm with each norm's arguments: read through nn.Module's attribute lookup at
        # every step, they cost about 4% of it
        self.norms = [
            tuple(
                partial(F.layer_norm, normalized_shape=n.normalized_shape, weight=n.weight, bias=n.bias, eps=n.eps)
                for n in (layer.norm1, layer.norm2)
            )
            for layer in model.layers
        ]
        self.features = [layer.attention.features for layer in model.layers]
        self.feature_constants = [None if (k := f.constants()) is None else k.detach() for f in self.features]
        self.width = c.spe_realizations if model.spe else self.D  # of the queries and keys the feature map takes
        self.sums = [
            torch.zeros(self.H * batch_size, features.size, self.D + 1, device=model.device)
            for features in self.features
        ]
        self.window = c.window
        # per layer: keys [H * B, W, width] and values [H * B, W, D + 1]; token t in slot t % W
        self.rings = [
            (
                torch.zeros(self.H * batch_size, self.window, self.width, device=model.device),
                torch.zeros(self.H * batch_size, self.window, self.D + 1, device=model.device),
            )
            for _ in self.features
            if self.window
        ]
        self.use_noise(noise)
        self._mixed = None  # the [2, H, D, R] buffer of a layer's gated codes
        self._graph = None  # CUDA: the layers captured as one graph (see _replay)

    def use_noise(self, noise) -> None:
        """Take the session's noise, and with it each layer's gate as the SPE filter applies it
        (and sineSPE's noise times its gains, the same at every position)."""
        self.noise = noise
        self._graph = None  # a captured graph reads the old gates
        self.gates = [self._gate(layer.attention.spe_filter, eps) for layer, eps in zip(self.model.layers, noise.gates)]
        spe = self.model.spe
        self._weighted = spe.weighted(noise.spe).detach() if isinstance(spe, SineSPE) else None
        self.c_layers = c_step.Layers(self.kernels, self) if self.kernels is not None else None

    @staticmethod
    def supports(config) -> bool:
        """Whether the model's attention is a linear one, with a feature map and a fixed-size state."""
        return config.attention in FEATURE_MAPS

    @staticmethod
    def _gate(spe_filter, eps):
        """(wet [H, D, 1], dry * eps [H, D, R]) of a gated SPE filter, else None."""
        factors = None if spe_filter is None else spe_filter.gate_factors(eps)
        if factors is None:
            return None
        return factors[0].detach()[..., None].contiguous(), factors[1].detach().contiguous()

    @property
    def state_bytes(self) -> int:
        """Bytes carried between tokens: the sums and the window's ring buffers."""
        return sum(t.nbytes for t in self.sums) + sum(t.nbytes for ring in self.rings for t in ring)

    # --- state conversion ----------------------------------------------------------------
    def _grid(self, x: torch.Tensor) -> torch.Tensor:
        """[H * B, ...] -> [B, H, ...] (a view)."""
        return x.view(self.H, self.batch, *x.shape[1:]).transpose(0, 1)

    def states(self, tokens: int) -> list:
        """The state after `tokens` tokens as the parallel pass's per layer: (S [B, H, M, Dv],
        z [B, H, M]), views of the sums, followed with a window by its keys and values oldest
        first (copies, rolled out of the ring)."""
        out = []
        for layer, sums in enumerate(self.sums):
            grid = self._grid(sums)
            state = (grid[..., : self.D], grid[..., self.D])
            if self.window:
                keys, values = self.rings[layer]
                shift = -(tokens % self.window)  # the oldest token's slot first
                state += (self._grid(keys).roll(shift, 2), self._grid(values)[..., : self.D].roll(shift, 2))
            out.append(state)
        return out

    def load(self, states: list, tokens: int) -> None:
        """Continue from the parallel pass's `states` after `tokens` tokens."""
        for layer, (sums, state) in enumerate(zip(self.sums, states)):
            grid = self._grid(sums)
            rings = [self._grid(ring) for ring in self.rings[layer]] if self.window else []
            if state is None:
                for x in (grid, *rings):
                    x.zero_()
                continue
            grid[..., : self.D].copy_(state[0])
            grid[..., self.D].copy_(state[1])
            if self.window:
                shift = tokens % self.window
                rings[0].copy_(state[2].roll(shift, 2))
                rings[1][..., : self.D].copy_(state[3].roll(shift, 2))
                rings[1][..., self.D] = 1

    # --- the step ----------------------------------------------------------------------
    def _codes(self, position: int, beats: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """The SPE codes of token `position` for queries and keys: [2, H, D, R], shared by the
        batch; at each sequence's onset `beats` [B]: [B, 2, H, D, R]; None without SPE."""
        spe = self.model.spe
        if spe is None:
            return None
        extra = {} if self._weighted is None else {"weighted": self._weighted}
        if beats is not None:
            qbar, kbar = spe.codes_at(self.noise.spe, beats, **extra)  # [H, B, D, R] each
            return torch.stack([qbar, kbar], dim=2).permute(1, 2, 0, 3, 4).contiguous()
        qbar, kbar = spe.codes(self.noise.spe, position, position + 1, **extra)
        return torch.stack([qbar[:, 0], kbar[:, 0]])

    def _attend(self, layer: int, projected: torch.Tensor, codes: Optional[torch.Tensor], tokens: int) -> torch.Tensor:
        """The attention between the projections of the token after `tokens` others: projected
        [B, 2HD + H(D+1)] (fp32) -> [B, HD]."""
        H, D, B = self.H, self.D, self.batch
        qk = projected[:, : 2 * H * D].view(B, 2 * H, D).transpose(0, 1)  # [2H, B, D]
        if codes is not None:
            gate = self.gates[layer]
            if gate is not None:
                codes = self._mixed = gate_codes(codes, *gate, out=self._mixed)
            if codes.dim() == 5:  # [B, 2, H, D, R]: each sequence at its own position
                rows = qk.transpose(0, 1).reshape(B * 2 * H, 1, D)
                qk = torch.bmm(rows, codes.view(B * 2 * H, D, -1)).view(B, 2 * H, -1).transpose(0, 1)
            else:
                qk = torch.bmm(qk, codes.view(2 * H, D, -1))
        features, constants = self.features[layer], self.feature_constants[layer]
        q, k = qk[:H].reshape(H * B, -1), qk[H:].reshape(H * B, -1)
        phi_q = features(q, True, constants)
        values = projected[:, 2 * H * D :].view(B, H, D + 1).transpose(0, 1).reshape(H * B, D + 1)
        sums = self.sums[layer]
        if not self.window:
            sums.addcmul_(features(k, False, constants)[..., None], values[:, None])  # += phi(k) [v, 1]
            read = torch.bmm(phi_q[:, None], sums)[:, 0]
            y = read[:, :D] / read[:, D:].add_(self.eps)  # numerator / (denominator + eps)
        else:
            y = self._windowed(layer, q, k, values, phi_q, tokens)
        return y.view(H, B, D).transpose(0, 1).reshape(B, H * D)

    def _windowed(self, layer: int, q, k, values, phi_q, tokens: int) -> torch.Tensor:
        """attention.windowed_attention for one token of every row [H * B, ...]: the ring's key
        and value in the token's slot leave for the sums, the token takes the slot, and the exact
        weights are read over the slots filled so far."""
        features, constants, sums = self.features[layer], self.feature_constants[layer], self.sums[layer]
        keys, ring_values = self.rings[layer]
        slot, D = tokens % self.window, self.D
        if tokens >= self.window:
            leaving = features(keys[:, slot], False, constants)
            sums.addcmul_(leaving[..., None], ring_values[:, slot, None])
        keys[:, slot], ring_values[:, slot] = k, values
        filled = min(tokens + 1, self.window)
        # q as a row against the keys transposed: as a column after the keys, bmm took 5x as long
        # on CPU (a matrix-vector product down a slow path), a fifth of the window's whole cost
        logits = features.temperature * torch.bmm(q[:, None], keys[:, :filled].transpose(1, 2))[:, 0]
        logits += features.query_offset(q, constants)
        extra = logits.amax(-1, keepdim=True).clamp_(min=0)
        exact = torch.bmm((logits - extra).exp_()[:, None], ring_values[:, :filled])[:, 0]
        read = torch.bmm(phi_q[:, None], sums)[:, 0].mul_((-extra).exp_()).add_(exact)
        return read[:, :D] / read[:, D:].add_(self.eps)

    def _block(self, layer: int, x: torch.Tensor, codes: Optional[torch.Tensor], tokens: int) -> torch.Tensor:
        """One layer; the residual stream x stays fp32 (in bf16 it would round every layer's
        sum: 30x the logit error of bf16 products alone)."""
        weights = self.weights[layer]

        def attend(h, x):
            return weights.out(self._attend(layer, weights.qkv(h), codes, tokens), add_to=x)

        def feed_forward(h, x):
            return weights.ff_out(weights.ff_in(h), add_to=x)

        return residual_branches(x, (attend, feed_forward), self.norms[layer], self.pre_norm)

    def _layers(self, x: torch.Tensor, codes: Optional[torch.Tensor], tokens: int) -> torch.Tensor:
        if self.c_layers is not None:
            x = self.c_layers(x, codes, tokens)
        else:
            for layer in range(len(self.sums)):
                x = self._block(layer, x, codes, tokens)
        return self.weights[-1](self.model.final_norm(x))

    def __call__(self, tokens: torch.Tensor, position: int, beats: Optional[torch.Tensor] = None) -> torch.Tensor:
        """tokens [B] at token `position` (and each sequence's onset `beats` [B] when the model's
        positions are beats) -> logits [B, vocab] (fp32); the state moves one step on."""
        model = self.model
        beats = model.beat_positions(beats)
        x = F.embedding(tokens, self.embedding)
        if model.config.pe == "ape":
            at = beats if beats is not None else torch.tensor([position], device=x.device)
            x = x + model.position_encoding(at)
        codes = self._codes(position, beats)
        if x.device.type == "cuda" and not self.window:
            return self._replay(x, codes)
        return self._layers(x, codes, position)

    def _replay(self, x: torch.Tensor, codes: Optional[torch.Tensor]) -> torch.Tensor:
        """The layers as one CUDA graph, as the launches of the step's small operations (module
        docstring) would take longer than their work. Captured on first use (after a warm-up run on a side stream, as
        capture requires) with static inputs; the sums are updated in place by every replay."""
        if self._graph is None:
            self._inputs = (x.clone(), None if codes is None else codes.clone())
            kept = [sums.clone() for sums in self.sums]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._layers(*self._inputs, 0)
            torch.cuda.current_stream().wait_stream(side)
            for sums, before in zip(self.sums, kept):  # undo the warm-up's step
                sums.copy_(before)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):  # records the kernels, runs nothing
                self._output = self._layers(*self._inputs, 0)
        self._inputs[0].copy_(x)
        if codes is not None:
            self._inputs[1].copy_(codes)
        self._graph.replay()
        return self._output.clone()
