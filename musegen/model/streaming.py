"""Streaming generation: the session a `MusicPerformer.streaming()` block holds, its public
snapshot (`StreamState`), and the single-token fast path of the linear attentions.

Why a fast path: one token through the paper-size model reads every weight once (~76M
parameters) and does little else, so a step should cost about the time the memory takes to
deliver the weights. Run through the training code it costs 5-10x that: about 1,000 small
operations (per-layer SPE einsums, feature maps, copies) and unpacked matrix-vector products.
`RecurrentStep` does the same arithmetic as the parallel pass (tests/test_transformer.py checks
every variant against it) with per-layer work merged into a few large operations:

- the SPE codes of the position are computed once per step for all layers; each layer's gate
  folds into one [2, H, D, R] matrix (wet * codes + dry * eps), applied to q and k in one bmm;
- the FAVOR+ exponents of q and k come from one matmul with [w, -w] (FeatureMap.signed_projection);
- the value projection has an extra constant-1 output per head (zero weights, bias 1), so the
  recurrent sums S and z live in one [H * B, M, Dv + 1] tensor, updated by one in-place
  outer-product add and read by one bmm (numerator and denominator together);
- weights are prepared once per model version: in bf16 where the device computes bf16
  natively, on CPU also reordered by oneDNN (`_Linear`); the residual stream, the attention
  sums and the output head stay fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.nn import functional as F

from .attention import EPS
from .spe import SineSPE

FAST_ATTENTIONS = ("performer", "relu", "elu")  # the recurrent (linear) attentions the fast step runs


@dataclass
class StreamState:
    """A snapshot of a streaming session, from `model.get_state()`; `model.set_state(state)`
    continues from it, as often as wanted. `layers` holds each layer's recurrent state as the
    parallel pass takes it: (S [B, H, M, Dv], z [B, H, M]) for the linear attentions, the
    key/value cache for softmax, relative and synthesizer attention, (m, u, w) for aaren."""
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


def _onednn_bf16(device: torch.device) -> bool:
    return (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class _Linear:
    """y = activation(x W^T + b) for inference, weights cast once to `dtype`. On CPU in bf16 the
    weights are also reordered by oneDNN (for one row; measured as fast for 8): a 1-row bf16
    product then runs near the memory bandwidth (an unpacked one reaches about half of it),
    with the activation fused."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype,
                 activation: Optional[str] = None):
        self.activation = activation
        self.weight, self.bias = weight.detach().to(dtype), bias.detach().to(dtype)
        self.packed = dtype == torch.bfloat16 and _onednn_bf16(weight.device)
        if self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(self.weight, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, self.activation or "none", [],
                                                      "none" if self.activation == "gelu" else "")
        y = F.linear(x, self.weight, self.bias)
        if self.activation == "relu":
            return F.relu_(y)
        return F.gelu(y) if self.activation == "gelu" else y


def _qkv_with_ones(attention) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention's q, k, v projection with one more output per head after its values:
    zero weights and bias 1, so v arrives as [v, 1] and one product gives numerator and
    denominator."""
    weight, bias = attention.qkv.weight.detach(), attention.qkv.bias.detach()
    H, D = attention.n_heads, attention.head_dim
    d_model = weight.shape[1]
    v_weight = weight[2 * H * D:].view(H, D, d_model)
    v_bias = bias[2 * H * D:].view(H, D)
    ones_weight = v_weight.new_zeros(H, D + 1, d_model)
    ones_bias = v_bias.new_ones(H, D + 1)
    ones_weight[:, :D], ones_bias[:, :D] = v_weight, v_bias
    return (torch.cat([weight[:2 * H * D], ones_weight.view(-1, d_model)]),
            torch.cat([bias[:2 * H * D], ones_bias.view(-1)]))


@dataclass
class _LayerWeights:
    qkv: _Linear
    out: _Linear
    ff_in: _Linear
    ff_out: _Linear


def prepared_weights(model, dtype: torch.dtype) -> list:
    """Every layer's `_LayerWeights` plus the head, built once per (dtype, device) and kept on
    the model until a parameter changes (an optimiser step or a load bumps its version)."""
    version = tuple((p.data_ptr(), p._version) for p in model.parameters())
    cache = model.__dict__.setdefault("_prepared", {})
    for key in [key for key, (seen, _) in cache.items() if seen != version]:
        del cache[key]  # stale: free it before building anything new
    key = (dtype, model.device)
    if key in cache:
        return cache[key][1]
    activation = "relu" if model.config.activation == "relu" else "gelu"
    layers = []
    for layer in model.layers:
        ff_in, ff_out = layer.ff[0], layer.ff[3]
        layers.append(_LayerWeights(_Linear(*_qkv_with_ones(layer.attention), dtype),
                                    _Linear(layer.attention.out.weight, layer.attention.out.bias, dtype),
                                    _Linear(ff_in.weight, ff_in.bias, dtype, activation),
                                    _Linear(ff_out.weight, ff_out.bias, dtype)))
    # The head stays fp32: it is small (vocab x d_model), and bf16 logits would be rounded to 2^-8.
    prepared = layers + [_Linear(model.head.weight, model.head.bias, torch.float32)]
    cache[key] = (version, prepared)
    return prepared


class RecurrentStep:
    """One token of every sequence through a linear-attention model, on a fixed-size state
    (module docstring). Holds the session's recurrent sums; `states()` / `load()` convert them
    to and from the parallel pass's (S, z) so both forms can continue each other."""

    def __init__(self, model, batch_size: int, noise, dtype: torch.dtype):
        c = model.config
        self.model, self.dtype, self.batch = model, dtype, batch_size
        self.H, self.D = c.n_heads, c.d_model // c.n_heads
        self.pre_norm, self.kind = c.norm == "pre", c.attention
        self.weights = prepared_weights(model, dtype)
        self.embedding = model.embedding.weight.detach() * math.sqrt(c.d_model)
        attentions = [layer.attention for layer in model.layers]
        # each layer's two norms as F.layer_norm's arguments: read through nn.Module's attribute
        # lookup, they cost about 4% of a step
        self.norms = [[(ln.normalized_shape, ln.weight, ln.bias, ln.eps) for ln in (layer.norm1, layer.norm2)]
                      for layer in model.layers]
        self.use_noise(noise)
        self.projections = [a.features.signed_projection().detach() if self.kind == "performer" else None
                            for a in attentions]
        self.features = attentions[0].features
        if self.kind == "performer":
            self._log_scale = torch.tensor(-math.log(self.features.n_features) / 2, device=model.device)
        width = c.n_features if self.kind == "performer" else (c.spe_realizations if model.spe else self.D)
        self.sums = [torch.zeros(self.H * batch_size, width, self.D + 1, device=model.device)
                     for _ in attentions]
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

    @staticmethod
    def supports(config) -> bool:
        return config.attention in FAST_ATTENTIONS

    @staticmethod
    def _gate(spe_filter, eps):
        """(wet [H, D, 1], dry * eps [H, D, R]) of a gated SPE filter, else None."""
        factors = None if spe_filter is None else spe_filter.gate_factors(eps)
        if factors is None:
            return None
        return factors[0].detach()[..., None], factors[1].detach()

    # --- state conversion ----------------------------------------------------------------
    def states(self) -> list:
        """The sums as the parallel pass's per-layer (S [B, H, M, Dv], z [B, H, M]) (views)."""
        out = []
        for sums in self.sums:
            grid = sums.view(self.H, self.batch, -1, self.D + 1)
            out.append((grid[..., :self.D].transpose(0, 1), grid[..., self.D].transpose(0, 1)))
        return out

    def load(self, states: list) -> None:
        for sums, state in zip(self.sums, states):
            grid = sums.view(self.H, self.batch, -1, self.D + 1)
            if state is None:
                grid.zero_()
                continue
            grid[..., :self.D].copy_(state[0].transpose(0, 1))
            grid[..., self.D].copy_(state[1].transpose(0, 1))

    # --- the step ----------------------------------------------------------------------
    def _codes(self, position: int) -> Optional[torch.Tensor]:
        """The SPE codes of `position` for queries and keys: [2, H, D, R], or None without SPE."""
        spe = self.model.spe
        if spe is None:
            return None
        extra = {} if self._weighted is None else {"weighted": self._weighted}
        qbar, kbar = spe.codes(self.noise.spe, position, position + 1, **extra)
        return torch.stack([qbar[:, 0], kbar[:, 0]])

    def _features(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """phi of the stacked queries and keys x [2H, B, width] -> [2H, B, M], as FeatureMap."""
        if self.kind == "relu":
            return F.relu(x)
        if self.kind == "elu":
            return F.elu(x).add_(1)
        # The keys' constant -log(M)/2 comes with the product; for queries it cancels in the max.
        u = torch.addmm(self._log_scale, x.reshape(-1, x.shape[-1]), self.projections[layer]).view(*x.shape[:2], -1)
        queries, keys = u[:self.H], u[self.H:]
        queries.sub_(queries.amax(-1, keepdim=True))
        keys.sub_(torch.linalg.vecdot(x[self.H:], x[self.H:]).unsqueeze(-1), alpha=self.features.temperature / 2)
        return u.exp_()

    def _attend(self, layer: int, x: torch.Tensor, codes: Optional[torch.Tensor]) -> torch.Tensor:
        H, D, B = self.H, self.D, self.batch
        projected = self.weights[layer].qkv(x).float()  # x: already in the step's dtype
        qk = projected[:, :2 * H * D].view(B, 2 * H, D).transpose(0, 1)  # [2H, B, D]
        if codes is not None:
            gate = self.gates[layer]
            if gate is not None:  # q @ (wet * qbar + dry * eps), k likewise, as SPEFilter
                codes = torch.addcmul(gate[1], gate[0], codes, out=self._mixed)
                self._mixed = codes
            qk = torch.bmm(qk, codes.view(2 * H, D, -1))
        phi = self._features(layer, qk)
        values = projected[:, 2 * H * D:].view(B, H, D + 1).transpose(0, 1)
        sums = self.sums[layer]
        sums.addcmul_(phi[H:].reshape(H * B, -1, 1), values.reshape(H * B, 1, D + 1))  # += phi(k) [v, 1]
        read = torch.bmm(phi[:H].reshape(H * B, 1, -1), sums).view(H, B, D + 1)
        y = read[..., :D] / read[..., D:].add_(EPS)  # numerator / (denominator + eps)
        return y.transpose(0, 1).reshape(B, H * D).to(self.dtype)  # the output projection is the caller's

    def _block(self, layer: int, x: torch.Tensor, codes: Optional[torch.Tensor]) -> torch.Tensor:
        """One layer; the residual stream x stays fp32 (in bf16 it would round every layer's
        sum: measured 30x the logit error of bf16 products alone)."""
        weights, (norm1, norm2) = self.weights[layer], self.norms[layer]

        def attend(h):
            return weights.out(self._attend(layer, h.to(self.dtype), codes))

        def feed_forward(h):
            return weights.ff_out(weights.ff_in(h.to(self.dtype)))

        def norm(arguments, h):
            return F.layer_norm(h, *arguments)

        if self.pre_norm:
            x = x + attend(norm(norm1, x))
            return x + feed_forward(norm(norm2, x))
        x = norm(norm1, x + attend(x))
        return norm(norm2, x + feed_forward(x))

    def _layers(self, x: torch.Tensor, codes: Optional[torch.Tensor]) -> torch.Tensor:
        for layer in range(len(self.sums)):
            x = self._block(layer, x, codes)
        return self.weights[-1](self.model.final_norm(x))

    def __call__(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """tokens [B] at `position` -> logits [B, vocab] (fp32); the sums move one step on."""
        model = self.model
        x = F.embedding(tokens, self.embedding)
        if model.config.pe == "ape":
            x = x + model.position_encoding(position, position + 1)
        codes = self._codes(position)
        if x.device.type == "cuda":
            return self._replay(x, codes)
        return self._layers(x, codes)

    def _replay(self, x: torch.Tensor, codes: Optional[torch.Tensor]) -> torch.Tensor:
        """The layers as one CUDA graph: a step is ~700 small kernels, whose launches would take
        longer than their work. Captured on first use (after a warm-up run on a side stream, as
        capture requires) with static inputs; the sums are updated in place by every replay."""
        if self._graph is None:
            self._inputs = (x.clone(), None if codes is None else codes.clone())
            kept = [sums.clone() for sums in self.sums]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._layers(*self._inputs)
            torch.cuda.current_stream().wait_stream(side)
            for sums, before in zip(self.sums, kept):  # undo the warm-up's step
                sums.copy_(before)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):  # records the kernels, runs nothing
                self._output = self._layers(*self._inputs)
        self._inputs[0].copy_(x)
        if codes is not None:
            self._inputs[1].copy_(codes)
        self._graph.replay()
        return self._output.clone()
