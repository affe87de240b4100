"""Stochastic Positional Encoding (Liutkus et al., ICML 2021); see docs/method.md.

An SPE module turns one draw of noise into *codes* (Qbar, Kbar), each shaped
[heads, positions, head_dim, R]. A per-layer `SPEFilter` (optionally gated) mixes a layer's
queries and keys with those codes into R-wide qhat, khat such that

    E[qhat_m . khat_n] = sqrt(R / D) * sum_d q_md k_nd P_d(m - n),

where P_d is the module's positional kernel (`kernel()`), because every code carries the
reference scale (R * D) ** -1/4. Codes for any window [t0, t1) come from the same noise, so
generation can stream past the training length: sineSPE in closed form, convSPE from a
lazily drawn, reproducible noise stream.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F


def _new_seed(generator: torch.Generator | None) -> int:
    # drawn on the generator's own device: a CUDA generator refuses to fill a CPU tensor
    device = generator.device if generator is not None else None
    return int(torch.randint(0, 2**62, (), generator=generator, device=device))


class SineSPE(nn.Module):
    """Periodic relative kernel P_d(tau) = 1/(2K) sum_k lambda_dk^2 cos(2 pi f_dk tau + theta_dk).

    The 1/(2K) is the variance of the shared noise Z_d (2K x R) of the reference code; it keeps
    P_d(0) of order 1 whatever K is.
    """

    def __init__(self, n_heads: int, head_dim: int, realizations: int, n_sines: int):
        super().__init__()
        self.n_heads, self.head_dim, self.realizations, self.n_sines = n_heads, head_dim, realizations, n_sines
        shape = (n_heads, head_dim, n_sines)
        # Initialisation as in the reference code: low frequencies (sigmoid(-4)/2 ~ 0.01 cycles
        # per token) so the kernel starts long-ranged, and gains of moderate size.
        self.freqs = nn.Parameter(torch.randn(shape) - 4.0)
        self.offsets = nn.Parameter(torch.randn(shape))
        gains = torch.randn(shape)
        self.gains = nn.Parameter(gains / (gains.norm(dim=-1, keepdim=True).sqrt() / 2))

    @property
    def code_scale(self) -> float:
        return (self.realizations * self.head_dim) ** -0.25

    def draw_noise(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """Z: [H, D, 2K, R], entries N(0, 1/(2K)); one draw serves every position."""
        shape = (self.n_heads, self.head_dim, 2 * self.n_sines, self.realizations)
        z = torch.randn(shape, generator=generator, device=self.freqs.device)
        return z / math.sqrt(2 * self.n_sines)

    def _phases(self, positions: torch.Tensor) -> torch.Tensor:
        """2 pi f p for the positions p [N] (any reals: token indices, or beats): [H, D, N, K].
        The product is reduced modulo one cycle in float64 so that positions far past the
        training length keep full precision."""
        freqs = torch.sigmoid(self.freqs.double()) / 2
        positions = positions.to(device=freqs.device, dtype=torch.float64)
        cycles = torch.remainder(freqs[:, :, None] * positions[:, None], 1.0)
        return (2 * math.pi * cycles).to(self.freqs.dtype)

    @staticmethod
    def _basis(phases: torch.Tensor) -> torch.Tensor:
        """[H, D, N, K] phases -> [H, D, N, 2K]: each sine's (cos, sin), the layout of the noise."""
        return torch.stack([phases.cos(), phases.sin()], dim=-1).flatten(-2)

    def _codes(self, phases: torch.Tensor, weighted: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """sum_j basis[h, d, t, j] weighted[h, d, j, r] -> [H, T, D, R] in `dtype`, contiguous:
        every layer reads the codes as H*T matrices of [D, R] (mix_codes). One bmm over the H*D
        pairs, its factors in `dtype` (bf16 under autocast: a product of the cosines and sines,
        taken in fp32, with fp32 sums, like the other products), and one transposing copy (an
        einsum here copied matrix by matrix in its backward)."""
        H, D, T, _ = phases.shape
        basis = self._basis(phases).view(H * D, T, -1).to(dtype)  # [(h, d), T, 2K]
        codes = torch.bmm(basis, weighted.to(dtype).view(H * D, -1, self.realizations))
        return codes.view(H, D, T, -1).transpose(1, 2).contiguous()

    def weighted(self, noise: torch.Tensor) -> torch.Tensor:
        """The noise times each sine's gain and the codes' scale: [H, D, 2K, R], the same for
        every position (a streaming step computes it once per session)."""
        gains = F.softplus(self.gains).repeat_interleave(2, dim=-1)  # [H, D, 2K]: (cos, sin) share a gain
        return noise * gains[..., None] * self.code_scale

    def codes(
        self,
        noise: torch.Tensor,
        t0: int,
        t1: int,
        weighted: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(Qbar, Kbar) for token positions [t0, t1), each [H, T, D, R] in `dtype` (`codes_at`)."""
        positions = torch.arange(t0, t1, device=self.freqs.device, dtype=torch.float64)
        return self.codes_at(noise, positions, weighted, dtype)

    def codes_at(
        self,
        noise: torch.Tensor,
        positions: torch.Tensor,
        weighted: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(Qbar, Kbar) at the positions [N], each [H, N, D, R] in `dtype`, in closed form: the
        phases and their sines in fp32, the one product in `dtype` (`weighted`:
        `self.weighted(noise)`, when already at hand)."""
        phases = self._phases(positions)
        weighted = self.weighted(noise) if weighted is None else weighted
        return self._codes(phases + self.offsets[:, :, None], weighted, dtype), self._codes(phases, weighted, dtype)

    def factored_codes(
        self, noise: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> "FactoredCodes":
        """The codes at each sequence's own positions [B, T] (beats), kept as their two factors:
        built out, they would be B times the shared codes ([B, H, T, D, R])."""
        phases = self._phases(positions.reshape(-1))  # [H, D, B*T, K]
        weighted = self.weighted(noise).to(dtype)
        bases = tuple(self._basis(p).to(dtype) for p in (phases + self.offsets[:, :, None], phases))
        return FactoredCodes(bases[0], bases[1], weighted)

    def kernel(self, lags: torch.Tensor) -> torch.Tensor:
        """P_d(tau) for the given lags tau = m - n: [H, D, len(lags)] (the unscaled target)."""
        freqs = torch.sigmoid(self.freqs) / 2
        angle = 2 * math.pi * freqs[..., None, :] * lags.to(freqs)[:, None] + self.offsets[..., None, :]
        lam2 = F.softplus(self.gains)[..., None, :] ** 2
        return (lam2 * angle.cos()).sum(-1) / (2 * self.n_sines)


class FactoredCodes:
    """sineSPE's codes at per-sequence positions as their factors: the cosines and sines of the
    query and key phases, bases [H, D, B*T, 2K], and the weighted noise [H, D, 2K, R]. A layer
    mixes x [B, H, T, D] with them in two products, (x (outer) basis) @ weighted, never building
    the [B, H, T, D, R] codes."""

    def __init__(self, query_basis: torch.Tensor, key_basis: torch.Tensor, weighted: torch.Tensor):
        self.query_basis, self.key_basis, self.weighted = query_basis, key_basis, weighted

    def mix(self, x: torch.Tensor, basis: torch.Tensor, wet=None, dry=None) -> torch.Tensor:
        """x [B, H, T, D] -> [B, H, T, R] in fp32 or wider: x @ codes per position, or with a
        gate (wet [H, D], dry [H, D, R]) (x * wet) @ codes + x @ dry, as mix_codes."""
        B, H, T, D = x.shape
        rows = x.permute(1, 0, 2, 3).reshape(H, B * T, D)  # [H, (b, t), D]
        scaled = rows if wet is None else rows * wet[:, None, :]
        outer = scaled[..., None] * basis.permute(0, 2, 1, 3)  # [H, B*T, D, 2K]
        wide = torch.promote_types(x.dtype, torch.float32)
        out = torch.bmm(outer.reshape(H, B * T, -1), self.weighted.reshape(H, -1, self.weighted.shape[-1])).to(wide)
        if dry is not None:
            out = out + torch.bmm(rows, dry)
        return out.view(H, B, T, -1).transpose(0, 1)


class ConvNoise:
    """White noise z[:, :, i] for i = 0, 1, 2, ..., drawn lazily in chunks of `chunk` positions.

    Chunk c is drawn from its own generator seeded by (seed, c), so any window is reproducible
    whatever order windows are asked for in. Chunks before the last window's start are
    dropped, which keeps streaming generation at constant memory.
    """

    def __init__(self, channels: tuple[int, int], seed: int, device: torch.device, chunk: int = 256):
        self.channels, self.seed, self.device, self.chunk = channels, seed, device, chunk
        self._chunks: dict[int, torch.Tensor] = {}

    def _draw(self, c: int) -> torch.Tensor:
        generator = torch.Generator(device=self.device)
        generator.manual_seed((self.seed * 1_000_003 + c) % 2**63)
        return torch.randn(*self.channels, self.chunk, generator=generator, device=self.device)

    def window(self, start: int, stop: int) -> torch.Tensor:
        """Noise for positions [start, stop): [R, H*D, stop - start]."""
        first, last = start // self.chunk, (stop - 1) // self.chunk
        self._chunks = {c: z for c, z in self._chunks.items() if c >= first}
        for c in range(first, last + 1):
            if c not in self._chunks:
                self._chunks[c] = self._draw(c)
        joined = torch.cat([self._chunks[c] for c in range(first, last + 1)], dim=-1)
        offset = first * self.chunk
        return joined[..., start - offset : stop - offset]


class ConvSPE(nn.Module):
    """Vanishing relative kernel: white noise filtered by two learned length-P filters per
    (head, feature). Qbar(t) = sum_j phi_Q[j] z[t + j], Kbar likewise with phi_K, so
    P_d(tau) = sum_j phi_Q[j] phi_K[j + tau], which is 0 for |tau| >= P."""

    def __init__(self, n_heads: int, head_dim: int, realizations: int, kernel_size: int):
        super().__init__()
        self.n_heads, self.head_dim, self.realizations, self.kernel_size = n_heads, head_dim, realizations, kernel_size
        scale = math.sqrt(kernel_size / 2)  # reference init: uniform filters of unit-order energy
        self.filter_q = nn.Parameter(torch.rand(n_heads * head_dim, 1, kernel_size) / scale)
        self.filter_k = nn.Parameter(torch.rand(n_heads * head_dim, 1, kernel_size) / scale)

    @property
    def code_scale(self) -> float:
        return (self.realizations * self.head_dim) ** -0.25

    def draw_noise(self, generator: torch.Generator | None = None) -> ConvNoise:
        return ConvNoise((self.realizations, self.n_heads * self.head_dim), _new_seed(generator), self.filter_q.device)

    def codes(
        self, noise: ConvNoise, t0: int, t1: int, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(Qbar, Kbar) for positions [t0, t1), each [H, T, D, R], filtered in fp32 and delivered
        in `dtype`."""
        z = noise.window(t0, t1 + self.kernel_size - 1).to(self.filter_q.dtype)
        groups = self.n_heads * self.head_dim

        def filtered(weight):  # [R, H*D, T] -> [H, T, D, R], contiguous like SineSPE's
            out = F.conv1d(z, weight, groups=groups) * self.code_scale
            out = out.view(self.realizations, self.n_heads, self.head_dim, t1 - t0).permute(1, 3, 2, 0)
            return out.to(dtype, memory_format=torch.contiguous_format)

        return filtered(self.filter_q), filtered(self.filter_k)

    def kernel(self, lags: torch.Tensor) -> torch.Tensor:
        """P_d(tau) for the given integer lags: [H, D, len(lags)] (the unscaled target)."""
        fq, fk = self.filter_q[:, 0], self.filter_k[:, 0]  # [H*D, P]
        P = self.kernel_size
        # Cross-correlation for every lag in (-P, P): full[:, P - 1 + tau] = sum_j fq[j] fk[j + tau].
        full = F.conv1d(F.pad(fk, (P - 1, P - 1))[None], fq[:, None], groups=fq.shape[0])[0]
        index = lags.long() + P - 1
        inside = (index >= 0) & (index < 2 * P - 1)
        values = full[:, index.clamp(0, 2 * P - 2)] * inside
        return values.view(self.n_heads, self.head_dim, -1)


class SPEFilter(nn.Module):
    """One per layer: applies the shared codes to this layer's queries and keys.

    Gated (docs/method.md): Qbar_d <- sqrt(1 - g_d) Qbar_d + sqrt(g_d) eps_d and likewise for Kbar,
    with eps_d one R-vector per layer shared by all positions, giving the kernel
    (1 - g_d) P_d + g_d. The gated codes are never built: the gate scales q and k instead,
    so all layers share one copy of the codes (and of their autograd buffers).
    """

    def __init__(self, n_heads: int, head_dim: int, realizations: int, gated: bool):
        super().__init__()
        self.n_heads, self.head_dim, self.realizations = n_heads, head_dim, realizations
        self.gate = nn.Parameter(torch.randn(n_heads, head_dim)) if gated else None

    def draw_noise(self, generator: torch.Generator | None = None) -> torch.Tensor | None:
        """eps: [H, D, R] with the codes' scale, or None when ungated."""
        if self.gate is None:
            return None
        eps = torch.randn(self.n_heads, self.head_dim, self.realizations, generator=generator, device=self.gate.device)
        return eps * (self.realizations * self.head_dim) ** -0.25

    def gate_factors(self, eps):
        """(wet [H, D], dry * eps [H, D, R]): a gated layer's codes are wet * codes + dry * eps,
        with wet = sqrt(1 - g) and dry = sqrt(g); None without a gate."""
        if self.gate is None:
            return None
        g = torch.sigmoid(self.gate)
        return (1 - g).sqrt(), g.sqrt()[..., None] * eps

    def gated_codes(self, codes, eps):
        """The effective codes this layer uses (for inspection and tests)."""
        qbar, kbar = codes
        factors = self.gate_factors(eps)
        if factors is None:
            return qbar, kbar
        wet, dry_eps = factors[0][:, None, :, None], factors[1][:, None]  # over [H, T, D, R]
        return gate_codes(qbar, wet, dry_eps), gate_codes(kbar, wet, dry_eps)

    def forward(self, q: torch.Tensor, k: torch.Tensor, codes, eps) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k: [B, H, T, D] -> qhat, khat: [B, H, T, R] in fp32. The products take the codes'
        dtype (bf16 under autocast: the model casts the codes once for all layers) and sum in fp32."""
        if isinstance(codes, FactoredCodes):  # per-sequence positions
            dtype = codes.weighted.dtype
            q, k = q.to(dtype), k.to(dtype)
            factors = self.gate_factors(eps)
            gate = () if factors is None else (factors[0].to(dtype), factors[1].to(dtype))
            return codes.mix(q, codes.query_basis, *gate), codes.mix(k, codes.key_basis, *gate)
        qbar, kbar = codes
        dtype = qbar.dtype
        q, k = q.to(dtype), k.to(dtype)
        factors = self.gate_factors(eps)
        if factors is None:
            return mix_codes(q, qbar), mix_codes(k, kbar)
        wet, dry_eps = factors[0].to(dtype), factors[1].to(dtype)  # [H, D], [H, D, R]: one matrix per head
        return mix_codes(q, qbar, wet, dry_eps), mix_codes(k, kbar, wet, dry_eps)


def gate_codes(codes: torch.Tensor, wet: torch.Tensor, dry_eps: torch.Tensor, out=None) -> torch.Tensor:
    """wet * codes + dry_eps: the codes a gated layer uses (SPEFilter.gate_factors), the factors
    broadcast over the codes' positions. (The parallel pass applies the same gate to q and k
    instead, in mix_codes, so that all layers share one copy of the codes.)"""
    return torch.addcmul(dry_eps, wet, codes, out=out)


class _GradientSum:
    """The gradient of codes shared by every layer: each layer's backward leaves its factors
    (inputs x and output gradients g, per position), and the codes' backward makes one product
    of them all, sum over layers and batch of x^T g, instead of one codes-sized tensor per
    layer plus their sums (at [H, T, D, R] = 8 x 2048 x 64 x 64 each of those is 268 MB)."""

    def __init__(self):
        self.rows: list[torch.Tensor] = []  # [H*T, B, D] per layer
        self.grads: list[torch.Tensor] = []  # [H*T, B, R] per layer

    def add(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        self.rows.append(rows)
        self.grads.append(grads)

    def total(self) -> Optional[torch.Tensor]:
        """sum_layers x^T g as [H*T, D, R] (None if no layer added), and forget the factors."""
        if not self.rows:
            return None
        rows, grads = torch.cat(self.rows, dim=1), torch.cat(self.grads, dim=1)
        self.rows, self.grads = [], []
        return torch.bmm(rows.transpose(1, 2), grads)


class _ShareCodes(torch.autograd.Function):
    """The identity on the codes; its backward hands on the summed gradient of all mixes."""

    @staticmethod
    def forward(ctx, codes, gradient: _GradientSum):
        ctx.set_materialize_grads(False)  # the mixes pass None: their gradient is in `gradient`
        ctx.gradient, ctx.shape = gradient, codes.shape
        return codes.view_as(codes)

    @staticmethod
    def backward(ctx, _):
        total = ctx.gradient.total()
        return (None if total is None else total.view(ctx.shape)), None


def share_codes(codes: torch.Tensor) -> torch.Tensor:
    """`codes` for every layer's `mix_codes`, which then sum their gradients in place (a no-op
    without gradients)."""
    if not codes.requires_grad:
        return codes
    gradient = _GradientSum()
    shared = _ShareCodes.apply(codes.contiguous(), gradient)
    shared.gradient_sum = gradient  # read by mix_codes
    return shared


class _MixCodes(torch.autograd.Function):
    """out[b, h, t] = x[b, h, t] @ codes[h, t]: every position has its own [D, R] matrix, shared
    by the batch; with a gate, (x[b, h, t] * wet[h]) @ codes[h, t] + x[b, h, t] @ dry[h]. x is
    laid out once as rows [H, T, B, D]: the codes' product is one bmm over the H*T matrices with
    the batch as rows, the gate noise's one bmm per head over all T*B rows, summed into one
    output in that layout, and the backward keeps it, so the codes are never copied (an einsum
    permutes them on every call; the gate as separate ops copied x twice and cast and added
    its two halves across layouts, about 10% of a bf16 training update)."""

    @staticmethod
    def forward(ctx, x, codes, wet, dry, gradient_sum: Optional[_GradientSum]):
        B, H, T, D = x.shape
        R = codes.shape[-1]
        rows = x.permute(1, 2, 0, 3).contiguous()  # x, codes and the gate share a dtype (SPEFilter)
        scaled = rows if wet is None else rows * wet[:, None, None, :]
        wide = torch.promote_types(rows.dtype, torch.float32)  # the output: sums never below fp32
        out = torch.bmm(scaled.view(H * T, B, D), codes.view(H * T, D, R)).to(wide)
        if dry is not None:
            out.view(H, T * B, R).add_(torch.bmm(rows.view(H, T * B, D), dry))
        ctx.save_for_backward(rows, codes, wet, dry)
        ctx.gradient_sum = gradient_sum
        return out.view(H, T, B, R).permute(2, 0, 1, 3)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        rows, codes, wet, dry = ctx.saved_tensors
        H, T, B, D = rows.shape
        R = codes.shape[-1]
        # [H, T, B, R] in the products' dtype, one copy: a cast writes it contiguous; without
        # one, `to` returns the permuted view as it is
        g = grad.permute(1, 2, 0, 3).to(rows.dtype, memory_format=torch.contiguous_format).contiguous()
        flat, g_flat = rows.view(H, T * B, D), g.view(H, T * B, R)
        dx = torch.bmm(g.view(H * T, B, R), codes.view(H * T, D, R).transpose(1, 2)).view(H, T * B, D)
        d_wet = d_dry = d_codes = None
        if wet is not None:
            d_wet = (dx * flat).sum(1, dtype=torch.float32).to(wet.dtype)
            dx = dx * wet[:, None, :]
        if dry is not None:
            d_dry = torch.bmm(flat.transpose(1, 2), g_flat)
            dx = dx.baddbmm_(g_flat, dry.transpose(1, 2))
        if ctx.gradient_sum is not None or ctx.needs_input_grad[1]:
            scaled = (flat if wet is None else flat * wet[:, None, :]).view(H * T, B, D)  # again: not kept
            if ctx.gradient_sum is not None:
                ctx.gradient_sum.add(scaled, g.view(H * T, B, R))
            else:
                d_codes = torch.bmm(scaled.transpose(1, 2), g.view(H * T, B, R)).view_as(codes)
        return dx.view(H, T, B, D).permute(2, 0, 1, 3), d_codes, d_wet, d_dry, None


def mix_codes(
    x: torch.Tensor, codes: torch.Tensor, wet: Optional[torch.Tensor] = None, dry: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """x [B, H, T, D] (any strides), codes [H, T, D, R] -> x @ codes per position, or with a
    gate (wet [H, D], dry [H, D, R]) (x * wet) @ codes + x @ dry: [B, H, T, R] in fp32 or wider
    (a view of [H, T, B, R] memory). All in one dtype. Codes from `share_codes` collect their
    gradient in one buffer."""
    return _MixCodes.apply(x, codes.contiguous(), wet, dry, getattr(codes, "gradient_sum", None))
