"""Dropout for CPU training whose mask costs a quarter of a hashed word per element.

torch's per-element Bernoulli draws take about a tenth of a CPU training step; here each
64-bit word of SplitMix64 gives four 16-bit uniforms. Where dropout.c builds (native.py), the
hashing, comparing and scaling are one pass and the backward redraws the mask from the seed;
otherwise the same bits come from `random_words` and a product with a (0 or scale) tensor.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from . import native

_SIGNATURES = {
    "dropout": (
        [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int,
            ctypes.c_uint64,
            ctypes.c_uint32,
            ctypes.c_float,
        ],
        None,
    )
}


def _library():
    """dropout.c with its function typed, or None where it does not build."""
    return native.declared(native.library("dropout"), _SIGNATURES)


class _Scaled(torch.autograd.Function):
    """x * keep, the gradient likewise; `keep` (0 or the scale, in x's dtype) is saved instead of x."""

    @staticmethod
    def forward(ctx, x, keep):
        ctx.save_for_backward(keep)
        return torch.mul(x, keep)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return torch.mul(grad, keep), None


# SplitMix64 (Steele, Lea and Flood 2014) constants, as the signed int64 torch computes with
_GOLDEN, _MIX1, _MIX2 = -0x61C8864680B583EB, -0x40A7B892E31B1A47, -0x6B2FB644ECCEEE15
_HASH_BLOCK = 1 << 18  # words hashed at a time: 2 MB, so a block's passes stay in the core's cache


def random_words(n: int) -> torch.Tensor:
    """n random int64 words: SplitMix64's output for counters 0..n-1 from a seed drawn from
    torch's generator (so `torch.manual_seed` fixes them). A dozen vectorised passes over cached
    blocks, on every thread: about twice as fast as `random_`, whose generator is serial.
    Arithmetic shifts are masked into the logical shifts SplitMix64 specifies; products wrap."""
    seed = int(torch.empty((), dtype=torch.int64).random_())
    words = torch.empty(n, dtype=torch.int64)
    for start in range(0, n, _HASH_BLOCK):
        z = words[start : start + _HASH_BLOCK]
        torch.arange(start, start + len(z), dtype=torch.int64, out=z).mul_(_GOLDEN).add_(seed)
        for shift, multiplier in ((30, _MIX1), (27, _MIX2), (31, None)):
            z.bitwise_xor_(z.bitwise_right_shift(shift).bitwise_and_((1 << (64 - shift)) - 1))
            if multiplier is not None:
                z.mul_(multiplier)
    return words


class _NativeDropout(torch.autograd.Function):
    """x * (0 or scale) by dropout.c in one pass; the backward draws the same mask again from
    the seed, so nothing is saved."""

    @staticmethod
    def forward(ctx, x, seed: int, cut: int, scale: float):
        ctx.mask = seed, cut, scale
        return _apply_native_mask(x, seed, cut, scale)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        return _apply_native_mask(grad, *ctx.mask), None, None, None


def _apply_native_mask(x: torch.Tensor, seed: int, cut: int, scale: float) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    _library().dropout(x.data_ptr(), out.data_ptr(), x.numel(), x.dtype == torch.bfloat16, seed, cut, scale)
    return out


class Dropout(nn.Dropout):
    """nn.Dropout whose CPU mask compares 16-bit uniforms with round(p * 2^16) (so the rate is p
    to 1/65536, and the scale matches the rate exactly), by dropout.c or, where it does not
    build, as a product with a (0 or scale) tensor in x's dtype, which CPUs vectorise (a
    masked_fill with a bool mask does not). Both give the same bits. On other devices,
    nn.Dropout as it is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0 or x.device.type != "cpu":
            return super().forward(x)
        return _cpu_dropout(x, self.p)


@torch.compiler.disable  # a ctypes call and drawn seeds: torch.compile runs it as it is, between graphs
def _cpu_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    cut = round(p * 2**16)
    scale = 2**16 / (2**16 - cut)
    if x.dtype in (torch.float32, torch.bfloat16) and _library() is not None:
        seed = int(torch.empty((), dtype=torch.int64).random_()) % 2**64  # as random_words draws it
        # the scale as the eager path rounds it: to x's dtype
        return _NativeDropout.apply(x, seed, cut, torch.tensor(scale, dtype=x.dtype).item())
    keep = random_words((x.numel() + 3) // 4).view(torch.int16)[: x.numel()].view(x.shape) >= cut - 2**15
    # through uint8: a bool -> float conversion is not vectorised, a uint8 one is
    return _Scaled.apply(x, keep.view(torch.uint8).to(x.dtype).mul_(scale))
