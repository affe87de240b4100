"""Causal attention: linear (parallel and recurrent) and exact softmax; the feature maps are in features.py.

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
from torch.nn import functional as F

from ..errors import ConfigError

State = tuple[torch.Tensor, torch.Tensor]  # S: [B, H, M, Dv], z: [B, H, M]
EPS = 1e-6  # denominator guard, as in fast-transformers
# tuned with bench/attention.py (docs/performance.md): 64-row GEMMs run ~1.8x the rate of 32-row ones
CHUNK = 64


def _empty_state(q: torch.Tensor, v: torch.Tensor) -> State:
    B, H, _, M = q.shape
    wide = torch.promote_types(q.dtype, torch.float32)  # states are sums: never below fp32
    return q.new_zeros(B, H, M, v.shape[-1], dtype=wide), q.new_zeros(B, H, M, dtype=wide)


def _exclusive_prefix_sum(first: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """out[:, :, c] = first + sum_{j < c} steps[:, :, j], as an in-place loop over the chunk axis
    (dim 2): several times faster on CPU than `cumsum` along a middle dimension."""
    out = torch.empty_like(steps)
    out[:, :, 0] = first
    for c in range(1, steps.shape[2]):
        torch.add(out[:, :, c - 1], steps[:, :, c - 1], out=out[:, :, c])
    return out


def _exclusive_suffix_sum(last: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """out[:, :, c] = last + sum_{j > c} steps[:, :, j] (the backward pass's mirror image)."""
    out = torch.empty_like(steps)
    n = steps.shape[2]
    out[:, :, n - 1] = last
    for c in range(n - 2, -1, -1):
        torch.add(out[:, :, c + 1], steps[:, :, c + 1], out=out[:, :, c])
    return out


class _ChunkedAttention(torch.autograd.Function):
    """The chunked kernel over T = n * C positions, with a hand-derived backward.

    Per chunk c (rows = its C positions): A_c = tril(Q_c K_c^T); the state before it is
    S_c = S0 + sum_{j<c} K_j^T V_j, z_c = z0 + sum_{j<c} K_j^T 1; then
        num_c = A_c V_c + Q_c S_c,   den_c = A_c 1 + Q_c z_c.
    Backward, with gN, gD the output gradients and G_c = dS_out + sum_{j>c} Q_j^T gN_j
    (g_c likewise from gD) the gradient reaching chunk c's keys through later states:
        dA_c = tril(gN_c V_c^T + gD_c 1^T)
        dQ_c = dA_c K_c + gN_c S_c^T + gD_c z_c^T
        dK_c = dA_c^T Q_c + V_c G_c^T + 1 g_c^T
        dV_c = A_c^T gN_c + K_c G_c
    Autograd would store the same tensors, but this saves its copies and the running sums of
    the backward; the denominator is kept apart from the values (a ones column would make
    every matmul one column wider than the head: odd widths are slow in MKL).

    Precision: the matrix products run in the dtype of q, k, v (bf16 under autocast, about
    twice as fast on CPUs with bf16 arithmetic); the running sums across chunks (S, z and the
    backward's G, g), the states and both outputs are fp32.
    """

    @staticmethod
    def forward(ctx, q, k, v, S0, z0, C: int):
        B, H, T, M = q.shape
        n, Dv, dtype = T // C, v.shape[-1], q.dtype
        wide = torch.promote_types(dtype, torch.float32)  # the sums' dtype
        qc, kc, vc = q.view(B, H, n, C, M), k.view(B, H, n, C, M), v.view(B, H, n, C, Dv)
        A = torch.matmul(qc, kc.transpose(-1, -2)).tril_()
        # each chunk's state increment
        kv, ksum = torch.matmul(kc.transpose(-1, -2), vc).to(wide), kc.sum(3, dtype=wide)
        S, z = _exclusive_prefix_sum(S0, kv), _exclusive_prefix_sum(z0, ksum)
        S_end, z_end = S[:, :, -1] + kv[:, :, -1], z[:, :, -1] + ksum[:, :, -1]
        S, z = S.to(dtype), z.to(dtype)  # as factors of products
        num = torch.matmul(qc, S)
        num.view(-1, C, Dv).baddbmm_(A.view(-1, C, C), vc.reshape(-1, C, Dv))
        den = A.sum(-1, dtype=wide) + torch.matmul(qc, z[..., None])[..., 0]
        ctx.save_for_backward(qc, kc, vc, A, S, z)
        return num.view(B, H, T, Dv).to(wide), den.view(B, H, T), S_end, z_end

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gN, gD, gS, gz):
        # The forward ran with autocast off (SelfAttention). A backward called inside autocast
        # would cast the out-of-place products down, and the in-place ones would then meet
        # operands of two dtypes: autocast stays off here too.
        with torch.autocast(gN.device.type, enabled=False):
            return _ChunkedAttention._backward(ctx, gN, gD, gS, gz)

    @staticmethod
    def _backward(ctx, gN, gD, gS, gz):
        qc, kc, vc, A, S, z = ctx.saved_tensors
        B, H, n, C, M = qc.shape
        Dv, dtype = vc.shape[-1], qc.dtype
        wide = torch.promote_types(dtype, torch.float32)
        gN, gD = gN.reshape(B, H, n, C, Dv).to(dtype), gD.reshape(B, H, n, C).to(dtype)
        dA = torch.matmul(gN, vc.transpose(-1, -2)).add_(gD[..., None]).tril_()
        dq = torch.matmul(dA, kc)
        dq.view(-1, C, M).baddbmm_(gN.reshape(-1, C, Dv), S.transpose(-1, -2).reshape(-1, Dv, M))
        dq.addcmul_(gD[..., None], z[..., None, :])
        P, p = torch.matmul(qc.transpose(-1, -2), gN).to(wide), torch.matmul(gD[..., None, :], qc)[..., 0, :].to(wide)
        G, g = _exclusive_suffix_sum(gS, P), _exclusive_suffix_sum(gz, p)
        G_factor = G.to(dtype)  # as a factor of the products below
        dk = torch.matmul(dA.transpose(-1, -2), qc)
        dk.view(-1, C, M).baddbmm_(vc.reshape(-1, C, Dv), G_factor.transpose(-1, -2).reshape(-1, Dv, M))
        dk.add_(g[..., None, :])
        dv = torch.matmul(A.transpose(-1, -2), gN)
        dv.view(-1, C, Dv).baddbmm_(kc.reshape(-1, C, M), G_factor.view(-1, M, Dv))
        T = n * C
        return (
            dq.view(B, H, T, M),
            dk.view(B, H, T, M),
            dv.view(B, H, T, Dv),
            G[:, :, 0] + P[:, :, 0],
            g[:, :, 0] + p[:, :, 0],
            None,
        )


def chunked_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[State] = None, chunk_size: int = CHUNK
) -> tuple[torch.Tensor, torch.Tensor, State]:
    """Pure-PyTorch causal linear attention: (numerator [B,H,T,Dv], denominator [B,H,T], state).

    Positions are cut into chunks of C. Inside a chunk, a masked C x C product (dense matmuls);
    across chunks, an exclusive prefix sum of the per-chunk states phi(k)^T v. Work is
    O(T C (M + Dv) + T M Dv) in large matmuls and memory O(T (C + M Dv / C)), linear in T.
    A single position (the sampler's step) takes the RNN update directly.
    """
    B, H, T, M = q.shape
    S0, z0 = state if state is not None else _empty_state(q, v)
    if T == 1:  # S += phi(k) v^T, z += phi(k); y = phi(q) S / phi(q) z
        q, k, v = (x.to(S0.dtype) for x in (q, k, v))
        S1 = torch.baddbmm(S0.reshape(B * H, M, -1), k.reshape(B * H, M, 1), v.reshape(B * H, 1, -1)).view_as(S0)
        z1 = z0 + k[:, :, 0]
        return q @ S1, (q[:, :, 0] * z1).sum(-1, keepdim=True), (S1, z1)
    C = min(chunk_size, T)
    pad = -T % C
    if pad:  # zero keys add nothing; the padded queries' outputs are cut off below
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    num, den, S1, z1 = _ChunkedAttention.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), S0.contiguous(), z0.contiguous(), C
    )
    return num[:, :, :T], den[:, :, :T], (S1, z1)


def fast_transformers_available() -> bool:
    try:
        import fast_transformers.causal_product  # noqa: F401
    except ImportError:
        return False
    return True


def fast_transformers_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[State] = None
) -> tuple[torch.Tensor, torch.Tensor, State]:
    """The same contract, numerator from fast-transformers' `causal_dot_product` (fp32 only),
    denominator from a cumulative sum of keys as fast-transformers' CausalLinearAttention does."""
    try:
        from fast_transformers.causal_product import causal_dot_product
    except ImportError:
        raise ConfigError("kernel 'fast-transformers' needs the optional extra: pip install 'musegen[fast]'") from None
    dtype = q.dtype
    q, k, v = (x.float().contiguous() for x in (q, k, v))
    S0, z0 = state if state is not None else _empty_state(q, v)
    num = causal_dot_product(q, k, v) + q @ S0
    kcum = k.cumsum(2) + z0[:, :, None]
    den = (q * kcum).sum(-1)
    new_state = (S0 + k.transpose(-1, -2) @ v, kcum[:, :, -1])
    return num.to(dtype), den.to(dtype), new_state


KERNELS: dict[str, Callable] = {"torch": chunked_kernel, "fast-transformers": fast_transformers_kernel}


def _linear_sums(phi_q, phi_k, v, state, kernel, products):
    """The kernel's (numerator, denominator, state), its products in `products` (see below)."""
    if torch.finfo(products).max < torch.finfo(torch.float32).max:
        products = torch.float32
    if kernel == "torch":
        phi_q, phi_k, v = phi_q.to(products), phi_k.to(products), v.to(products)
    return KERNELS[kernel](phi_q, phi_k, v, state)


def causal_linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    state: Optional[State] = None,
    kernel: str = "torch",
    products: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, State]:
    """Normalised causal linear attention over [B, H, T, *]; returns (output, new state).
    `products`: the dtype of the "torch" kernel's matrix products (its sums stay fp32). fp16 is
    taken as fp32: the states it multiplies are sums over every earlier position, which pass
    fp16's 65,504 within a few thousand tokens (bf16 has fp32's range)."""
    num, den, new_state = _linear_sums(phi_q, phi_k, v, state, kernel, products)
    return num / (den[..., None] + EPS), new_state


# A windowed layer's state: the linear sums (S, z) of every token before the window, and the
# window's keys [B, H, W, width] and values [B, H, W, Dv], oldest first.
WindowState = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def windowed_attention(
    features,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    start: int,
    state: Optional[WindowState] = None,
    kernel: str = "torch",
    products: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, WindowState]:
    """Causal attention of the T tokens at token positions [start, start + T): exact softmax
    weights exp(temperature q.k) over the last `window` keys (the query's own included), FAVOR+
    estimates of them (`features`, a features.Favor) over every older key, one normalisation over
    both: y = (N_exact + N_linear) / (D_exact + D_linear + EPS). As Based (Arora et al. 2024)
    pairs a sliding window with linear attention, but with the two parts summed into one
    softmax: the linear part then carries only what the window leaves out, so the result
    estimates full softmax attention, exactly near the query. The query features lack the factor
    exp(features.query_offset(q)) of the unbiased ones, so the exact weights are taken on the
    same scale, and both parts are scaled by exp(-extra) so no weight exceeds 1.

    Parallel form: the linear kernel reads the keys `window` places back (zero before the
    sequence); the exact part runs in blocks of `window` queries against the 2 * window keys
    that can reach them."""
    B, H, T, width = q.shape
    W, Dv = window, v.shape[-1]
    if state is None:
        linear_state, keys, values = None, q.new_zeros(B, H, W, width), v.new_zeros(B, H, W, Dv)
    else:
        linear_state, keys, values = state[:2], state[2], state[3]
    all_k, all_v = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)  # positions start - W ...
    valid = torch.arange(start - W, start + T, device=q.device) >= 0
    leaving = features(all_k[:, :, :T], False) * valid[:T, None]  # the keys W places back
    num, den, (S, z) = _linear_sums(features(q, True), leaving, all_v[:, :, :T], linear_state, kernel, products)

    n = -(-T // W)
    pad = n * W - T
    queries = F.pad(q, (0, 0, 0, pad)).view(B, H, n, W, width)
    blocks_k = F.pad(all_k, (0, 0, 0, pad)).view(B, H, n + 1, W, width)
    blocks_v = F.pad(all_v, (0, 0, 0, pad)).view(B, H, n + 1, W, Dv)
    near_k = torch.cat([blocks_k[:, :, :-1], blocks_k[:, :, 1:]], dim=3)  # [B, H, n, 2W, width]
    near_v = torch.cat([blocks_v[:, :, :-1], blocks_v[:, :, 1:]], dim=3)
    blocks_valid = F.pad(valid, (0, pad)).view(n + 1, W)
    near_valid = torch.cat([blocks_valid[:-1], blocks_valid[1:]], dim=1)  # [n, 2W]
    # query i of a block and its key j lie j - W - i tokens apart: in the window iff i < j <= i + W
    i, j = torch.arange(W, device=q.device)[:, None], torch.arange(2 * W, device=q.device)
    seen = (j > i) & (j <= i + W) & near_valid[:, None, :]  # [n, W, 2W]
    offset = F.pad(features.query_offset(q), (0, 0, 0, pad)).view(B, H, n, W, 1)
    logits = (features.temperature * queries @ near_k.transpose(-1, -2) + offset).masked_fill(~seen, -math.inf)
    extra = logits.amax(-1, keepdim=True).clamp(min=0).detach()  # every query sees itself: finite
    weights = (logits - extra).exp()
    exact_num = (weights @ near_v).view(B, H, n * W, Dv)[:, :, :T]
    exact_den = weights.sum(-1).view(B, H, n * W)[:, :, :T]
    scale = (-extra).exp().view(B, H, n * W)[:, :, :T]
    y = (num * scale[..., None] + exact_num) / ((den * scale + exact_den)[..., None] + EPS)
    return y, (S, z, all_k[:, :, -W:], all_v[:, :, -W:])


def softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, cache: Optional[State] = None
) -> tuple[torch.Tensor, State]:
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
