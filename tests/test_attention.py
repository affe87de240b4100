"""Causal linear attention kernels, feature maps and the softmax baseline."""

import math

import pytest
import torch

from musegen.model.attention import (
    EPS,
    causal_linear_attention,
    chunked_kernel,
    fast_transformers_available,
    fast_transformers_kernel,
    softmax_attention,
    windowed_attention,
)
from musegen.model.features import FEATURE_MAPS, Favor

B, H, M, DV = 2, 3, 8, 5


def naive(q, k, v, state=None):
    """O(T^2) reference: the full causal score matrix."""
    scores = (q @ k.transpose(-1, -2)).tril()
    num, den = scores @ v, scores.sum(-1)
    if state is not None:
        num, den = num + q @ state[0], den + (q * state[1][:, :, None]).sum(-1)
    return num, den


def features(T, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(B, H, T, M, generator=g, dtype=torch.float64) + 0.1  # positive, like phi
    k = torch.rand(B, H, T, M, generator=g, dtype=torch.float64) + 0.1
    v = torch.randn(B, H, T, DV, generator=g, dtype=torch.float64)
    return q, k, v


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("T", [1, 7, 16, 63, 129, 200])
def test_chunked_equals_naive_forward_and_backward(T):
    q64, k64, v64 = features(T)
    ref = [x.clone().requires_grad_() for x in (q64, k64, v64)]
    got = [x.float().requires_grad_() for x in (q64, k64, v64)]  # the kernel runs in fp32
    w_num, w_den = torch.randn(B, H, T, DV, dtype=torch.float64), torch.randn(B, H, T, dtype=torch.float64)
    num_r, den_r = naive(*ref)
    num_g, den_g, _ = chunked_kernel(*got, chunk_size=16)
    assert rel(num_g.double(), num_r) < 1e-5 and rel(den_g.double(), den_r) < 1e-5
    ((num_r * w_num).sum() + (den_r * w_den).sum()).backward()
    ((num_g * w_num.float()).sum() + (den_g * w_den.float()).sum()).backward()
    for r, g in zip(ref, got):
        assert rel(g.grad.double(), r.grad) < 1e-5


def test_chunked_continues_from_state_like_one_pass():
    q, k, v = (x.float() for x in features(150, seed=1))
    whole, _, full_state = chunked_kernel(q, k, v, chunk_size=32)
    first, _, state = chunked_kernel(q[:, :, :61], k[:, :, :61], v[:, :, :61], chunk_size=32)
    pieces = [first]
    for t in range(61, 150):  # token by token: the RNN form
        out, _, state = chunked_kernel(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
        pieces.append(out)
    assert rel(torch.cat(pieces, dim=2), whole) < 1e-5
    assert rel(state[0], full_state[0]) < 1e-5 and rel(state[1], full_state[1]) < 1e-5


@pytest.mark.skipif(not fast_transformers_available(), reason="fast-transformers not installed")
@pytest.mark.parametrize("T", [1, 33, 256])
def test_chunked_equals_fast_transformers(T):
    q, k, v = (x.float() for x in features(T, seed=2))
    state = (torch.randn(B, H, M, DV), torch.rand(B, H, M))
    for ours, theirs in zip(chunked_kernel(q, k, v, state), fast_transformers_kernel(q, k, v, state)):
        if isinstance(ours, tuple):
            ours, theirs = (
                torch.cat([ours[0], ours[1][..., None]], -1),
                torch.cat([theirs[0], theirs[1][..., None]], -1),
            )
        assert rel(ours, theirs) < 1e-5


def test_performer_features_estimate_the_softmax_kernel():
    """E[phi(x) . phi(y)] = exp(temperature x . y), with error shrinking like 1/sqrt(M)."""
    torch.manual_seed(0)
    x, y = torch.randn(20, 8) * 0.6, torch.randn(20, 8) * 0.6
    errors = []
    for n_features in (512, 8192):
        fm = Favor(8, n_features)
        exact = torch.exp(fm.temperature * x @ y.T)
        estimate = fm(x, is_query=False) @ fm(y, is_query=False).T
        errors.append(((estimate - exact).abs() / exact).mean().item())
    assert errors[1] < 0.03
    assert 2.0 < errors[0] / errors[1] < 8.0  # sqrt(16) = 4 expected


def test_performer_attention_approaches_softmax_attention():
    torch.manual_seed(0)
    T, width = 40, 16
    q, k, v = torch.randn(1, 2, T, width) * 0.5, torch.randn(1, 2, T, width) * 0.5, torch.randn(1, 2, T, 4)
    exact, _ = softmax_attention(q, k, v, scale=width**-0.5)
    fm = Favor(width, 16_384)
    approx, _ = causal_linear_attention(fm(q, True), fm(k, False), v)
    assert (approx - exact).abs().max() < 0.05


def test_performer_features_are_the_favor_formula():
    """phi(k) = exp(w.k' - |k'|^2/2) / sqrt(M) with k' = k temperature^(1/2) over [w, -w];
    phi(q) is the same up to a per-query factor, with max 1 (the shift by the row max)."""
    torch.manual_seed(3)
    fm = Favor(8, 32)
    x = torch.randn(5, 8, dtype=torch.float64) * 2
    fm.projection.data = fm.projection.double()
    xs = x * fm.temperature**0.5
    u = torch.cat([xs @ fm.projection, -(xs @ fm.projection)], -1)
    textbook = torch.exp(u - (xs * xs).sum(-1, keepdim=True) / 2) / math.sqrt(32)
    assert torch.allclose(fm(x, is_query=False), textbook, rtol=1e-12)
    queries = fm(x, is_query=True)
    assert torch.allclose(queries, textbook / textbook.amax(-1, keepdim=True), rtol=1e-12)


def test_query_stabiliser_cancels_in_the_normalisation():
    """Row-max shifting of query features must not change the attention output."""
    torch.manual_seed(1)
    fm = Favor(8, 32)
    q, k, v = torch.randn(1, 1, 20, 8), torch.randn(1, 1, 20, 8), torch.randn(1, 1, 20, 3)
    shifted, _ = causal_linear_attention(fm(q, True), fm(k, False), v)
    plain, _ = causal_linear_attention(fm(q, False), fm(k, False), v)
    assert torch.allclose(shifted, plain, atol=1e-4)


@pytest.mark.parametrize("kind", ["relu", "elu"])
def test_plain_feature_maps_are_nonnegative(kind):
    phi = FEATURE_MAPS[kind](8, 8)(torch.randn(50, 8), is_query=True)
    assert (phi >= 0).all() and (phi > 0).any()


def test_redraw_changes_only_when_asked():
    fm = Favor(16, 64)
    before = fm.projection.clone()
    x = torch.randn(3, 16)
    assert torch.equal(fm(x, True), fm(x, True))
    fm.redraw()
    assert not torch.equal(before, fm.projection)
    block = fm.projection[:, :16]
    gram = block.T @ block  # orthogonal directions within a block
    assert (gram - torch.diag(gram.diag())).abs().max() < 1e-3 * gram.diag().max()


def test_softmax_cache_continues_exactly():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 30, 8), torch.randn(1, 2, 30, 8), torch.randn(1, 2, 30, 8)
    whole, _ = softmax_attention(q, k, v, 0.3)
    first, cache = softmax_attention(q[:, :, :11], k[:, :, :11], v[:, :, :11], 0.3)
    rest, _ = softmax_attention(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], 0.3, cache)
    assert torch.allclose(torch.cat([first, rest], 2), whole, atol=1e-5)


def test_normalisation_uses_eps_guard():
    q = k = torch.zeros(1, 1, 3, 4)
    out, _ = causal_linear_attention(q, k, torch.ones(1, 1, 3, 2))
    assert torch.isfinite(out).all() and out.abs().max() == 0 and EPS > 0


def test_chunked_kernel_gradients_including_state_pass_gradcheck():
    g = torch.Generator().manual_seed(4)
    args = [torch.rand(1, 2, 11, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    args.append(torch.randn(1, 2, 11, 2, generator=g, dtype=torch.float64, requires_grad=True))
    S0 = torch.randn(1, 2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    z0 = torch.rand(1, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)

    def flat(q, k, v, S, z):
        num, den, (S1, z1) = chunked_kernel(q, k, v, (S, z), chunk_size=4)
        return num, den, S1, z1

    assert torch.autograd.gradcheck(flat, (*args, S0, z0))


def test_bf16_products_keep_fp32_sums_and_stay_close():
    """bf16 q, k, v (the autocast path): outputs and states come back fp32, within bf16 rounding
    of the fp32 kernel, and the state continues across calls like one pass."""
    g = torch.Generator().manual_seed(7)
    q, k = (torch.rand(1, 2, 300, 16, generator=g) for _ in range(2))
    v = torch.randn(1, 2, 300, 8, generator=g)
    num32, den32, (S32, z32) = chunked_kernel(q, k, v)
    half = [x.bfloat16() for x in (q, k, v)]
    num, den, (S, z) = chunked_kernel(*half)
    assert {t.dtype for t in (num, den, S, z)} == {torch.float32}
    for got, want in ((num, num32), (den, den32), (S, S32), (z, z32)):
        assert ((got - want).abs().max() / want.abs().max()).item() < 2e-2
    first = chunked_kernel(*(x[:, :, :130] for x in half))
    rest = chunked_kernel(*(x[:, :, 130:] for x in half), first[2])
    assert torch.allclose(torch.cat([first[0], rest[0]], 2), num, rtol=2e-2, atol=1e-2 * num.abs().max().item())


def test_a_window_as_long_as_the_sequence_is_exact_softmax_attention():
    torch.manual_seed(0)
    favor = Favor(M, 16)
    q, k, v = torch.randn(B, H, 37, M), torch.randn(B, H, 37, M), torch.randn(B, H, 37, DV)
    exact = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=favor.temperature)
    whole, _ = windowed_attention(favor, q, k, v, window=64, start=0)
    torch.testing.assert_close(whole, exact, rtol=1e-4, atol=1e-4)
    # a short window: exact near each query, FAVOR+ beyond; closer to softmax than FAVOR+ alone
    near, _ = windowed_attention(favor, q, k, v, window=4, start=0)
    linear, _ = causal_linear_attention(favor(q, True), favor(k, False), v)
    assert (near - exact).abs().mean() < 0.9 * (linear - exact).abs().mean()
    torch.testing.assert_close(near[:, :, :4], exact[:, :, :4], rtol=1e-4, atol=1e-4)  # all inside the window
