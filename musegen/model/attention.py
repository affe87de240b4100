"""Feature maps and causal attention: linear (parallel and recurrent) and exact softmax.

Causal linear attention (Katharopoulos et al. 2020) with feature map phi:

    y_t = sum_{s<=t} (phi(q_t) . phi(k_s)) v_s / (sum_{s<=t} phi(q_t) . phi(k_s) + eps)

Every kernel here computes the numerator and denominator for a block of T positions that
continues a prefix summarised by the state (S, z) = (sum_s phi(k_s) v_s^T, sum_s phi(k_s)),
and returns the updated state. With an empty state that is the parallel training form;
with T = 1 it is the RNN step S_t = S_{t-1} + phi(k_t) v_t^T, z_t = z_{t-1} + phi(k_t).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import ConfigError

State = tuple[torch.Tensor, torch.Tensor]  # S: [B, H, M, Dv], z: [B, H, M]
EPS = 1e-6  # denominator guard, as in fast-transformers
CHUNK = 64  # tuned with bench/attention.py (see docs/performance.md)


def _empty_state(q: torch.Tensor, v: torch.Tensor) -> State:
    B, H, _, M = q.shape
    return q.new_zeros(B, H, M, v.shape[-1]), q.new_zeros(B, H, M)


class _ExclusivePrefixSum(torch.autograd.Function):
    """out[:, :, c] = first + sum_{j < c} steps[:, :, j], as an in-place loop over the chunk axis:
    several times faster on CPU than `cumsum` along a middle dimension, forward and backward."""

    @staticmethod
    def forward(ctx, first: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(steps)
        out[:, :, 0] = first
        for c in range(1, steps.shape[2]):
            torch.add(out[:, :, c - 1], steps[:, :, c - 1], out=out[:, :, c])
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Suffix sums: grad_first = sum_c grad[c]; grad_steps[j] = sum_{c > j} grad[c].
        suffix = grad.clone()
        for c in range(grad.shape[2] - 2, -1, -1):
            suffix[:, :, c] += suffix[:, :, c + 1]
        grad_steps = torch.zeros_like(grad)
        grad_steps[:, :, :-1] = suffix[:, :, 1:]
        return suffix[:, :, 0], grad_steps


def chunked_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[State] = None,
                   chunk_size: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor, State]:
    """Pure-PyTorch causal linear attention: (numerator [B,H,T,Dv], denominator [B,H,T], state).

    Positions are cut into chunks of C. Inside a chunk, a masked C x C product (dense matmuls);
    across chunks, an exclusive prefix sum of the per-chunk states phi(k)^T v. Values carry an
    extra column of ones so the same products yield the denominator. Work is
    O(T C (M + Dv) + T M Dv) in large matmuls and memory O(T (C + M Dv / C)), linear in T.
    """
    B, H, T, M = q.shape
    Dv = v.shape[-1]
    S0, z0 = state if state is not None else _empty_state(q, v)
    C = min(chunk_size, T)
    pad = -T % C
    if pad:  # zero keys add nothing; the padded queries' outputs are cut off below
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    n = (T + pad) // C
    v1 = torch.cat([v, v.new_ones(B, H, T + pad, 1)], dim=-1)
    qc, kc, vc = q.view(B, H, n, C, M), k.view(B, H, n, C, M), v1.view(B, H, n, C, Dv + 1)

    out = (qc @ kc.transpose(-1, -2)).tril() @ vc  # within each chunk
    kv = kc.transpose(-1, -2) @ vc  # each chunk's contribution to the state: [B, H, n, M, Dv + 1]
    before = _ExclusivePrefixSum.apply(torch.cat([S0, z0[..., None]], dim=-1), kv)
    out = (out + qc @ before).reshape(B, H, n * C, Dv + 1)[:, :, :T]
    after = before[:, :, -1] + kv[:, :, -1]
    return out[..., :Dv], out[..., Dv], (after[..., :Dv], after[..., Dv])


def fast_transformers_available() -> bool:
    try:
        import fast_transformers.causal_product  # noqa: F401
    except ImportError:
        return False
    return True


def fast_transformers_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             state: Optional[State] = None) -> tuple[torch.Tensor, torch.Tensor, State]:
    """The same contract, numerator from fast-transformers' `causal_dot_product` (fp32 only),
    denominator from a cumulative sum of keys as fast-transformers' CausalLinearAttention does."""
    try:
        from fast_transformers.causal_product import causal_dot_product
    except ImportError:
        raise ConfigError("kernel 'fast-transformers' needs the optional extra: "
                          "pip install 'musegen[fast]'") from None
    dtype = q.dtype
    q, k, v = (x.float().contiguous() for x in (q, k, v))
    S0, z0 = state if state is not None else _empty_state(q, v)
    num = causal_dot_product(q, k, v) + q @ S0
    kcum = k.cumsum(2) + z0[:, :, None]
    den = (q * kcum).sum(-1)
    new_state = (S0 + k.transpose(-1, -2) @ v, kcum[:, :, -1])
    return num.to(dtype), den.to(dtype), new_state


KERNELS: dict[str, Callable] = {"torch": chunked_kernel, "fast-transformers": fast_transformers_kernel}


def causal_linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                            state: Optional[State] = None, kernel: str = "torch") -> tuple[torch.Tensor, State]:
    """Normalised causal linear attention over [B, H, T, *]; returns (output, new state)."""
    num, den, new_state = KERNELS[kernel](phi_q, phi_k, v, state)
    return num / (den[..., None] + EPS), new_state


def orthogonal_gaussian(rows: int, cols: int, device=None) -> torch.Tensor:
    """[rows, cols] whose columns are orthogonal in blocks of `rows`, with the norms of
    Gaussian vectors, so each column is marginally N(0, I) (Performer's ORF)."""
    n_blocks = -(-cols // rows)
    basis, _ = torch.linalg.qr(torch.randn(n_blocks, rows, rows, device=device))
    norms = torch.randn(n_blocks, rows, rows, device=device).norm(dim=1)  # [n_blocks, rows]
    blocks = basis * norms[:, None, :]  # scale each orthonormal column
    return blocks.permute(1, 0, 2).reshape(rows, n_blocks * rows)[:, :cols]


class FeatureMap(nn.Module):
    """phi for linear attention over inputs of width `in_dim`.

    - "performer": FAVOR+ positive random features,
      phi(x) = exp([w.x', -w.x'] - |x'|^2 / 2) / sqrt(M) with x' = x * temperature^(1/2), so that
      E[phi(q) . phi(k)] = exp(temperature * q . k); temperature is 1/sqrt(in_dim) as in
      fast-transformers (with SPE, in_dim = R, which yields the paper's overall 1/sqrt(D)).
      The projections w are a buffer: saved with the model, frozen unless `redraw()` is called.
    - "relu": relu(x); "elu": elu(x) + 1 (the linear transformer).
    """

    def __init__(self, kind: str, in_dim: int, n_features: int):
        super().__init__()
        self.kind, self.in_dim, self.n_features = kind, in_dim, n_features
        self.temperature = in_dim ** -0.5
        if kind == "performer":
            self.register_buffer("projection", orthogonal_gaussian(in_dim, n_features // 2))

    @torch.no_grad()
    def redraw(self) -> None:
        if self.kind == "performer":
            self.projection.copy_(orthogonal_gaussian(self.in_dim, self.n_features // 2, self.projection.device))

    def forward(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        if self.kind == "relu":
            return F.relu(x)
        if self.kind == "elu":
            return F.elu(x) + 1
        x = x * math.sqrt(self.temperature)
        u = x @ self.projection.to(x.dtype)
        logits = torch.cat([u, -u], dim=-1) - (x * x).sum(-1, keepdim=True) / 2 - math.log(self.n_features) / 2
        if is_query:
            # A per-query constant cancels between numerator and denominator: subtracting the
            # row max keeps exp() <= 1. Keys get no such shift; it would not cancel.
            logits = logits - logits.amax(-1, keepdim=True).detach()
        return logits.exp()


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                      cache: Optional[State] = None) -> tuple[torch.Tensor, State]:
    """Exact causal softmax attention (SDPA). `cache` holds earlier keys and values, so a block
    of T new positions attends to everything before it; the cache grows with the sequence."""
    if cache is not None:
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    T, total = q.shape[2], k.shape[2]
    if total == T:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:  # queries sit at positions total-T .. total-1
        mask = torch.ones(T, total, dtype=torch.bool, device=q.device).tril(total - T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out, (k, v)
