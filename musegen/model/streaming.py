"""Streaming generation: the session a `MusicPerformer.streaming()` block holds, its public
snapshot (`StreamState`), and the single-token fast path of the linear attentions.

Why a fast path: one token through the paper-size model reads every weight once (~76M
parameters) and does little else, so a step should cost about the time the memory takes to
deliver the weights. Run through the training code it costs 5-10x that: about 1,000 small
operations (per-layer SPE einsums, feature maps, copies) and unpacked matrix-vector products.
`RecurrentStep` does the same arithmetic as the parallel pass (tests/test_transformer.py checks
every variant against it), in one of two ways:

- in bf16 on a CPU with AVX512-BF16 (where musegen.precision timed it fastest), each layer is
  one call of step.c's `layer_step` (C, built on first use by native.py): weights in bf16 tiles
  read as one sequential stream, the norms, activation, residual adds and the whole attention
  (SPE codes, feature map, state update and read-out) in the same call, the next rows of the
  state prefetched while one computes;
- elsewhere (fp32, CUDA, no compiler, MUSEGEN_NATIVE=0) in PyTorch, with per-layer work merged
  into a few large operations: the SPE codes of the position computed once per step for all
  layers, each layer's gate folded into one [2, H, D, R] matrix (wet * codes + dry * eps) applied
  to q and k in one bmm; the FAVOR+ exponents of q and k from one matmul with [w, -w]
  (FeatureMap.signed_projection); weights in bf16 where the device computes bf16 natively, on CPU
  reordered by oneDNN (`_Linear`).

Both ways, the value projection has an extra constant-1 output per head (zero weights, bias 1), so
the recurrent sums S and z live in one [H * B, M, Dv + 1] tensor, updated by one outer-product add
and read by one product (numerator and denominator together); the residual stream, the attention
sums and the output head stay fp32.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.nn import functional as F

from . import native
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
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def step_kernels(device: torch.device) -> Optional[ctypes.CDLL]:
    """step.c's kernels where they run fast (a CPU with AVX512-BF16 and a C compiler), else None."""
    library = step_library() if device.type == "cpu" else None
    return library if library is not None and library.step_interface(b"NATIVE_BF16") == 1 else None


def step_library(portable: bool = False) -> Optional[ctypes.CDLL]:
    """step.c as built here (`portable`: its plain-C build, which runs on any CPU), its interface
    checked against this module's; None where it does not build."""
    library = native.library("step", portable)
    if library is not None:
        _check_interface(library)
    return library


_TILE = (8, 32)  # step.c's ROWS x COLUMNS


def _tiles(weight: torch.Tensor) -> torch.Tensor:
    """weight [n_out, n_in] zero-padded to whole tiles and laid out tile after tile, in bf16, as
    step.c's linear_bf16 reads it: one sequential stream."""
    (n_out, n_in), (rows, columns) = weight.shape, _TILE
    padded = weight.new_zeros(-(-n_out // rows) * rows, -(-n_in // columns) * columns)
    padded[:n_out, :n_in] = weight
    return padded.to(torch.bfloat16).view(-1, rows, padded.shape[1] // columns, columns).transpose(1, 2).contiguous()


class _KernelLinear(ctypes.Structure):  # step.c's struct linear
    _fields_ = [
        ("tiles", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("n_out", ctypes.c_int64),
        ("n_in", ctypes.c_int64),
    ]


class _KernelNorm(ctypes.Structure):  # struct norm
    _fields_ = [("weight", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("eps", ctypes.c_float)]


class _KernelLayer(ctypes.Structure):  # struct layer
    _fields_ = (
        [(name, _KernelLinear) for name in ("qkv", "out", "ff_in", "ff_out")]
        + [("norm1", _KernelNorm), ("norm2", _KernelNorm)]
        + [(name, ctypes.c_void_p) for name in ("wet", "dry_eps", "projection", "sums")]
    )


class _KernelShape(ctypes.Structure):  # struct shape
    _fields_ = (
        [(name, ctypes.c_int64) for name in ("batch", "heads", "head_dim", "width", "features")]
        + [(name, ctypes.c_int) for name in ("kind", "pre_norm", "gelu")]
        + [(name, ctypes.c_float) for name in ("log_scale", "key_scale", "eps")]
    )


def _interface() -> dict[str, int]:
    """What this module assumes of step.c, by the names its step_interface answers to: the tile
    shape, the feature maps' numbers, and every struct's size and field offsets."""
    expected = {"ROWS": _TILE[0], "COLUMNS": _TILE[1]}
    expected.update({name.upper(): i for i, name in enumerate(FAST_ATTENTIONS)})
    for name, struct in (
        ("linear", _KernelLinear),
        ("norm", _KernelNorm),
        ("layer", _KernelLayer),
        ("shape", _KernelShape),
    ):
        expected[f"sizeof {name}"] = ctypes.sizeof(struct)
        expected.update({f"{name}.{field}": getattr(struct, field).offset for field, _ in struct._fields_})
    return expected


def _check_interface(library: ctypes.CDLL) -> None:
    differences = [
        f"{name}: C {library.step_interface(name.encode())}, Python {value}"
        for name, value in _interface().items()
        if library.step_interface(name.encode()) != value
    ]
    if differences:
        raise RuntimeError(f"step.c and streaming.py disagree on their interface: {'; '.join(differences)}")


def _checked(status: int) -> None:
    if status != 0:
        raise MemoryError("the step's kernel could not allocate its scratch memory")


def _activate(y: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    if activation == "relu":
        return F.relu_(y)
    return F.gelu(y) if activation == "gelu" else y


class _Linear:
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
            self.weight, self.bias = _tiles(weight), bias.float().contiguous()
            return
        self.weight, self.bias = weight.to(dtype), bias.to(dtype)
        self.packed = dtype == torch.bfloat16 and _onednn_bf16(weight.device)
        if self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(self.weight, 1)

    def __call__(self, x: torch.Tensor, add_to: Optional[torch.Tensor] = None) -> torch.Tensor:
        y = self._torch(x) if self.kernels is None else _activate(self._kernel(x), self.activation)
        return y if add_to is None else add_to + y

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        """step.c's product on its own (its layer_step calls it from C; this is for benchmarks and tests)."""
        x = x.float().contiguous()
        y = x.new_empty(len(x), self.n_out)
        _checked(
            self.kernels.linear_bf16(
                self.weight.data_ptr(),
                self.bias.data_ptr(),
                x.data_ptr(),
                None,
                y.data_ptr(),
                len(x),
                self.n_out,
                self.n_in,
            )
        )
        return y

    def _torch(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(
                x.to(self.dtype),
                self.weight,
                self.bias,
                self.activation or "none",
                [],
                "none" if self.activation == "gelu" else "",
            ).float()
        return _activate(F.linear(x.to(self.dtype), self.weight, self.bias), self.activation).float()


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
class _LayerWeights:
    qkv: _Linear
    out: _Linear
    ff_in: _Linear
    ff_out: _Linear


def prepared_weights(model, dtype: torch.dtype, kernels: Optional[ctypes.CDLL] = None) -> list:
    """Every layer's `_LayerWeights` plus the head, built once per (dtype, device, kernels) and
    kept on the model until a parameter changes (an optimiser step or a load bumps its version)."""
    version = tuple((p.data_ptr(), p._version) for p in model.parameters())
    cache = model.__dict__.setdefault("_prepared", {})
    for key in [key for key, (seen, _) in cache.items() if seen != version]:
        del cache[key]  # stale: free it before building anything new
    key = (dtype, model.device, kernels is not None)
    if key in cache:
        return cache[key][1]
    activation = "relu" if model.config.activation == "relu" else "gelu"
    layers = []
    for layer in model.layers:
        ff_in, ff_out = layer.ff[0], layer.ff[3]
        layers.append(
            _LayerWeights(
                _Linear(*_qkv_with_ones(layer.attention), dtype, kernels=kernels),
                _Linear(layer.attention.out.weight, layer.attention.out.bias, dtype, kernels=kernels),
                _Linear(ff_in.weight, ff_in.bias, dtype, activation, kernels),
                _Linear(ff_out.weight, ff_out.bias, dtype, kernels=kernels),
            )
        )
    # The head stays fp32: it is small (vocab x d_model), and bf16 logits would be rounded to 2^-8.
    prepared = layers + [_Linear(model.head.weight, model.head.bias, torch.float32)]
    cache[key] = (version, prepared)
    return prepared


def forget_prepared(model) -> None:
    """Free every prepared copy of the weights (the next session prepares what it uses)."""
    model.__dict__.pop("_prepared", None)


class RecurrentStep:
    """One token of every sequence through a linear-attention model, on a fixed-size state
    (module docstring). Holds the session's recurrent sums; `states()` / `load()` convert them
    to and from the parallel pass's (S, z) so both forms can continue each other."""

    def __init__(self, model, batch_size: int, noise, dtype: torch.dtype, use_kernels: bool = True):
        c = model.config
        self.model, self.dtype, self.batch = model, dtype, batch_size
        self.H, self.D = c.n_heads, c.d_model // c.n_heads
        self.pre_norm, self.kind = c.norm == "pre", c.attention
        # step.c runs whole layers in bf16; fp32 sessions (and machines without it, or where
        # PyTorch's step was timed faster: musegen.precision) run PyTorch
        self.kernels = step_kernels(model.device) if dtype == torch.bfloat16 and use_kernels else None
        self.weights = prepared_weights(model, dtype, self.kernels)
        self.embedding = model.embedding.weight.detach() * math.sqrt(c.d_model)
        attentions = [layer.attention for layer in model.layers]
        # each layer's two norms as F.layer_norm's arguments: read through nn.Module's attribute
        # lookup, they cost about 4% of a step
        self.norms = [
            [(ln.normalized_shape, ln.weight, ln.bias, ln.eps) for ln in (layer.norm1, layer.norm2)]
            for layer in model.layers
        ]
        self.projections = [
            a.features.signed_projection().detach() if self.kind == "performer" else None for a in attentions
        ]
        self.features = attentions[0].features
        # FAVOR+'s exponent shift -log(M)/2 (FeatureMap.key_shift)
        self.log_scale = -math.log(self.features.n_features) / 2 if self.kind == "performer" else 0.0
        self._log_scale = torch.tensor(self.log_scale, device=model.device)
        self.width = c.spe_realizations if model.spe else self.D  # of the queries and keys the feature map takes
        self.sums = [
            torch.zeros(
                self.H * batch_size,
                c.n_features if self.kind == "performer" else self.width,
                self.D + 1,
                device=model.device,
            )
            for _ in attentions
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
        if self.kernels is not None:
            self._describe_for_kernel()

    @staticmethod
    def supports(config) -> bool:
        return config.attention in FAST_ATTENTIONS

    @staticmethod
    def _gate(spe_filter, eps):
        """(wet [H, D, 1], dry * eps [H, D, R]) of a gated SPE filter, else None."""
        factors = None if spe_filter is None else spe_filter.gate_factors(eps)
        if factors is None:
            return None
        return factors[0].detach()[..., None].contiguous(), factors[1].detach().contiguous()

    # --- state conversion ----------------------------------------------------------------
    def states(self) -> list:
        """The sums as the parallel pass's per-layer (S [B, H, M, Dv], z [B, H, M]) (views)."""
        out = []
        for sums in self.sums:
            grid = sums.view(self.H, self.batch, -1, self.D + 1)
            out.append((grid[..., : self.D].transpose(0, 1), grid[..., self.D].transpose(0, 1)))
        return out

    def load(self, states: list) -> None:
        for sums, state in zip(self.sums, states):
            grid = sums.view(self.H, self.batch, -1, self.D + 1)
            if state is None:
                grid.zero_()
                continue
            grid[..., : self.D].copy_(state[0].transpose(0, 1))
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
        queries, keys = u[: self.H], u[self.H :]
        queries.sub_(queries.amax(-1, keepdim=True))
        keys.sub_(torch.linalg.vecdot(x[self.H :], x[self.H :]).unsqueeze(-1), alpha=self.features.temperature / 2)
        return u.exp_()

    def _attend(self, layer: int, projected: torch.Tensor, codes: Optional[torch.Tensor]) -> torch.Tensor:
        """The attention between the projections: projected [B, 2HD + H(D+1)] (fp32) -> [B, HD]."""
        H, D, B = self.H, self.D, self.batch
        qk = projected[:, : 2 * H * D].view(B, 2 * H, D).transpose(0, 1)  # [2H, B, D]
        if codes is not None:
            gate = self.gates[layer]
            if gate is not None:  # q @ (wet * qbar + dry * eps), k likewise, as SPEFilter
                codes = torch.addcmul(gate[1], gate[0], codes, out=self._mixed)
                self._mixed = codes
            qk = torch.bmm(qk, codes.view(2 * H, D, -1))
        phi = self._features(layer, qk)
        values = projected[:, 2 * H * D :].view(B, H, D + 1).transpose(0, 1)
        sums = self.sums[layer]
        sums.addcmul_(phi[H:].reshape(H * B, -1, 1), values.reshape(H * B, 1, D + 1))  # += phi(k) [v, 1]
        read = torch.bmm(phi[:H].reshape(H * B, 1, -1), sums).view(H, B, D + 1)
        y = read[..., :D] / read[..., D:].add_(EPS)  # numerator / (denominator + eps)
        return y.transpose(0, 1).reshape(B, H * D)

    def _block(self, layer: int, x: torch.Tensor, codes: Optional[torch.Tensor]) -> torch.Tensor:
        """One layer; the residual stream x stays fp32 (in bf16 it would round every layer's
        sum: measured 30x the logit error of bf16 products alone)."""
        weights, (norm1, norm2) = self.weights[layer], self.norms[layer]

        def attend(h, add_to):
            return weights.out(self._attend(layer, weights.qkv(h), codes), add_to=add_to)

        def feed_forward(h, add_to):
            return weights.ff_out(weights.ff_in(h), add_to=add_to)

        def norm(arguments, h):
            return F.layer_norm(h, *arguments)

        if self.pre_norm:
            x = attend(norm(norm1, x), add_to=x)
            return feed_forward(norm(norm2, x), add_to=x)
        x = norm(norm1, attend(x, add_to=x))
        return norm(norm2, feed_forward(x, add_to=x))

    def _layers(self, x: torch.Tensor, codes: Optional[torch.Tensor]) -> torch.Tensor:
        if self.kernels is not None:
            x = x.contiguous()  # step.c updates it in place, layer by layer
            shape, codes_pointer = ctypes.addressof(self._kernel_shape), None if codes is None else codes.data_ptr()
            for layer in self._kernel_layers:
                _checked(self.kernels.layer_step(ctypes.addressof(layer), shape, codes_pointer, x.data_ptr()))
        else:
            for layer in range(len(self.sums)):
                x = self._block(layer, x, codes)
        return self.weights[-1](self.model.final_norm(x))

    def _describe_for_kernel(self) -> None:
        """step.c's view of the session: per layer a `_KernelLayer` of pointers into the tensors
        this step holds (weights, norms, gates, state), and the `_KernelShape` all layers share."""
        self._kernel_shape = _KernelShape(
            batch=self.batch,
            heads=self.H,
            head_dim=self.D,
            width=self.width,
            features=self.sums[0].shape[1],
            kind=FAST_ATTENTIONS.index(self.kind),
            pre_norm=self.pre_norm,
            gelu=self.model.config.activation != "relu",
            log_scale=self.log_scale,
            key_scale=self.features.temperature / 2,
            eps=EPS,
        )

        def pointer(tensor):
            return None if tensor is None else tensor.data_ptr()

        self._kernel_layers = []
        for weights, norms, gate, projection, sums in zip(
            self.weights, self.norms, self.gates, self.projections, self.sums
        ):
            wet, dry_eps = gate or (None, None)
            self._kernel_layers.append(
                _KernelLayer(
                    *(
                        _KernelLinear(pointer(w.weight), pointer(w.bias), w.n_out, w.n_in)
                        for w in (weights.qkv, weights.out, weights.ff_in, weights.ff_out)
                    ),
                    *(_KernelNorm(pointer(weight), pointer(bias), eps) for _, weight, bias, eps in norms),
                    pointer(wet),
                    pointer(dry_eps),
                    pointer(projection),
                    pointer(sums),
                )
            )

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
