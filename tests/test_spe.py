"""SPE maths: empirical kernels converge to their targets like 1/sqrt(R); codes stream exactly."""

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from musegen.model.spe import ConvNoise, ConvSPE, SineSPE, SPEFilter, mix_codes, share_codes

H, D, T = 2, 4, 24
R_GRID = (16, 64, 256, 1024, 4096)


def empirical_kernel(qbar, kbar, code_scale):
    """(1/R) Qbar_d Kbar_d^T with the codes' (R D)^(-1/4) scale removed: [H, D, T, T]."""
    R = qbar.shape[-1]
    return torch.einsum("hmdr,hndr->hdmn", qbar, kbar) / (R * code_scale**2)


def lags(n):
    positions = torch.arange(n)
    return positions[:, None] - positions[None, :]  # m - n


def sine_target(spe):
    """1/(2K) sum_k lambda^2 cos(2 pi f tau + theta), written from the parameters directly."""
    f = torch.sigmoid(spe.freqs) / 2
    lam2 = F.softplus(spe.gains) ** 2
    tau = lags(T).double()
    angle = 2 * math.pi * f[..., None, None, :].double() * tau[..., None] + spe.offsets[..., None, None, :].double()
    return ((lam2[..., None, None, :] * angle.cos()).sum(-1) / (2 * spe.n_sines)).float()


def conv_target(spe):
    """Cross-correlation sum_j phi_Q[j] phi_K[j + tau] with numpy, 0 outside (-P, P)."""
    fq = spe.filter_q[:, 0].detach().numpy()
    fk = spe.filter_k[:, 0].detach().numpy()
    P = spe.kernel_size
    out = np.zeros((fq.shape[0], T, T), dtype=np.float64)
    for c in range(fq.shape[0]):
        full = np.correlate(fk[c], fq[c], mode="full")  # index P-1+tau holds sum_j fq[j] fk[j+tau]
        for m in range(T):
            for n in range(T):
                tau = m - n
                out[c, m, n] = full[P - 1 + tau] if abs(tau) < P else 0.0
    return torch.from_numpy(out).float().view(H, D, T, T)


def make_sine(R):
    torch.manual_seed(0)
    return SineSPE(H, D, R, n_sines=3)


def make_conv(R):
    torch.manual_seed(0)
    return ConvSPE(H, D, R, kernel_size=5)


def relative_errors(make, target_of, gate=None, seeds=3):
    """RMS error / RMS target of the empirical kernel, for each R of the grid (mean over seeds)."""
    errors = []
    for R in R_GRID:
        spe = make(R)
        target = target_of(spe)
        filt = SPEFilter(H, D, R, gated=gate is not None)
        if gate is not None:
            filt.gate.data = torch.logit(gate)
            target = (1 - gate)[..., None, None] * target + gate[..., None, None]
        err = 0.0
        for seed in range(seeds):
            g = torch.Generator().manual_seed(100 + seed)
            codes = filt.gated_codes(spe.codes(spe.draw_noise(g), 0, T), filt.draw_noise(g))
            with torch.no_grad():
                emp = empirical_kernel(*codes, spe.code_scale)
            err += ((emp - target).pow(2).mean() / target.pow(2).mean()).sqrt().item() / seeds
        errors.append(err)
    return errors


def assert_root_r_convergence(errors):
    slope = np.polyfit(np.log(R_GRID), np.log(errors), 1)[0]
    assert -0.62 < slope < -0.38, (slope, errors)
    assert errors[-1] < 0.06, errors


def test_sine_kernel_matches_formula():
    spe = make_sine(8)
    with torch.no_grad():
        assert torch.allclose(spe.kernel(lags(T).flatten()).view(H, D, T, T), sine_target(spe), atol=1e-5)


def test_conv_kernel_matches_cross_correlation():
    spe = make_conv(8)
    with torch.no_grad():
        assert torch.allclose(spe.kernel(lags(T).flatten()).view(H, D, T, T), conv_target(spe), atol=1e-6)


def test_sine_empirical_kernel_converges():
    with torch.no_grad():
        assert_root_r_convergence(relative_errors(make_sine, sine_target))


def test_conv_empirical_kernel_converges_and_vanishes_beyond_kernel_size():
    with torch.no_grad():
        assert_root_r_convergence(relative_errors(make_conv, conv_target))
        spe = make_conv(4096)
        emp = empirical_kernel(*spe.codes(spe.draw_noise(torch.Generator().manual_seed(1)), 0, T), spe.code_scale)
    outside = lags(T).abs() >= spe.kernel_size
    scale = conv_target(spe).abs().max()
    # Beyond P the target is exactly 0 and the estimate is pure noise of size ~ 1/sqrt(R).
    assert emp[..., outside].abs().max() < 5 * scale / math.sqrt(4096)


@pytest.mark.parametrize("make,target", [(make_sine, sine_target), (make_conv, conv_target)])
def test_gated_kernel_converges_to_mixture(make, target):
    gate = torch.tensor([[0.1, 0.5, 0.9, 0.3], [0.7, 0.2, 0.6, 0.95]])
    with torch.no_grad():
        assert_root_r_convergence(relative_errors(make, target, gate=gate))


@pytest.mark.parametrize("gated", [False, True])
def test_filter_applies_gated_codes(gated):
    torch.manual_seed(3)
    spe, filt = make_sine(16), SPEFilter(H, D, 16, gated=gated)
    codes, eps = spe.codes(spe.draw_noise(), 0, T), filt.draw_noise()
    q, k = torch.randn(2, H, T, D), torch.randn(2, H, T, D)
    qhat, khat = filt(q, k, codes, eps)
    qbar, kbar = filt.gated_codes(codes, eps)
    assert torch.allclose(qhat, torch.einsum("bhtd,htdr->bhtr", q, qbar), atol=1e-5)
    assert torch.allclose(khat, torch.einsum("bhtd,htdr->bhtr", k, kbar), atol=1e-5)


def test_sine_codes_stream_in_closed_form():
    spe = make_sine(16)
    z = spe.draw_noise(torch.Generator().manual_seed(5))
    with torch.no_grad():
        whole = spe.codes(z, 0, 40)
        for t0, t1 in [(0, 1), (13, 29), (39, 40)]:
            part = spe.codes(z, t0, t1)
            for a, b in zip(whole, part):
                assert torch.allclose(a[:, t0:t1], b, atol=1e-6)


def test_sine_codes_keep_precision_far_past_training_length():
    spe = make_sine(16)
    z = spe.draw_noise(torch.Generator().manual_seed(5))
    t = 3_000_017
    with torch.no_grad():
        qbar, _ = spe.codes(z, t, t + 1)
        f = torch.sigmoid(spe.freqs.double()) / 2
        phase = 2 * math.pi * f * t + spe.offsets.double()  # float64 reference
        basis = torch.stack([phase.cos(), phase.sin()], -1).flatten(-2)
        gains = F.softplus(spe.gains.double()).repeat_interleave(2, -1)
        exact = torch.einsum("hdj,hdjr->hdr", basis * gains, z.double()) * spe.code_scale
    assert torch.allclose(qbar[:, 0].double(), exact, atol=1e-5)


def test_conv_codes_stream_across_noise_chunks_in_any_order():
    spe = make_conv(16)
    with torch.no_grad():
        noise = ConvNoise((16, H * D), seed=11, device=torch.device("cpu"), chunk=7)
        later = spe.codes(noise, 30, 33)  # asked first: chunks are drawn out of order
        whole = spe.codes(noise, 0, 40)
        for t0, t1 in [(0, 1), (5, 19), (30, 33), (39, 40)]:
            part = later if (t0, t1) == (30, 33) else spe.codes(noise, t0, t1)
            for a, b in zip(whole, part):
                assert torch.allclose(a[:, t0:t1], b, atol=1e-6)
        # Streaming forward drops chunks that lie wholly before the window: memory stays bounded.
        for t in range(40, 200):
            spe.codes(noise, t, t + 1)
        assert len(noise._chunks) <= 2


def test_noise_draws_differ_and_repeat_with_seed():
    spe = make_conv(16)
    a = spe.codes(spe.draw_noise(torch.Generator().manual_seed(1)), 0, 10)[0]
    b = spe.codes(spe.draw_noise(torch.Generator().manual_seed(1)), 0, 10)[0]
    c = spe.codes(spe.draw_noise(torch.Generator().manual_seed(2)), 0, 10)[0]
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_gated_mix_codes_is_the_gated_per_position_product_with_its_gradients():
    """out[b, h, t] = (x[b, h, t] * wet[h]) @ codes[h, t] + x[b, h, t] @ dry[h], for any strides of
    x, and gradcheck of the hand backward, alone and with codes shared by two layers."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 5, 2, 4, generator=g, dtype=torch.float64).transpose(1, 2)  # [B, H, T, D], not contiguous
    codes = torch.randn(2, 5, 4, 6, generator=g, dtype=torch.float64)
    wet = torch.rand(2, 4, generator=g, dtype=torch.float64)
    dry = torch.randn(2, 4, 6, generator=g, dtype=torch.float64)
    expected = torch.einsum("bhtd,hd,htdr->bhtr", x, wet, codes) + torch.einsum("bhtd,hdr->bhtr", x, dry)
    assert torch.allclose(mix_codes(x, codes, wet, dry), expected, rtol=1e-12)
    inputs = [t.clone().requires_grad_() for t in (x, codes, wet, dry)]
    assert torch.autograd.gradcheck(mix_codes, inputs)

    def layers(x, y, codes, wet, dry):  # two "layers" reading one set of shared codes
        shared = share_codes(codes * 1.5)
        return mix_codes(x, shared, wet, dry) * mix_codes(y, shared, wet * 0.5, dry)

    y = torch.randn(3, 2, 5, 4, generator=g, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(layers, (inputs[0], y, *inputs[1:]))


def test_mix_codes_is_the_per_position_product_with_its_gradients():
    """out[b, h, t] = x[b, h, t] @ codes[h, t], for any strides of x, and gradcheck of the hand backward."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5, 2, 4, generator=g, dtype=torch.float64).transpose(1, 2)  # [B, H, T, D], not contiguous
    codes = torch.randn(2, 5, 4, 6, generator=g, dtype=torch.float64)
    assert torch.allclose(mix_codes(x, codes), torch.einsum("bhtd,htdr->bhtr", x, codes), rtol=1e-12)
    assert torch.autograd.gradcheck(mix_codes, (x.clone().requires_grad_(), codes.clone().requires_grad_()))

    def layers(x, y, codes):  # two "layers" reading one set of shared codes, which sum their gradients
        shared = share_codes(codes * 1.5)
        return mix_codes(x, shared) * mix_codes(y, shared)

    y = torch.randn(3, 2, 5, 4, generator=g, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(layers, (x.clone().requires_grad_(), y, codes.clone().requires_grad_()))
