"""The feature maps phi of linear attention, one class each, registered under the name that
`ModelConfig.attention` gives.

Each map is written once here: the parallel pass (transformer.SelfAttention) and the PyTorch
single-token step (torch_step) both call it. A map with a C path names its number in step.c's
`feature_maps` (`c_kernel`); c_step declares those numbers to the C build and checks them when
the library loads. Adding a feature map is one subclass here (and a branch in step.c's
`feature_maps` if it has a C path).
"""

from __future__ import annotations

import math
from typing import ClassVar, Optional

import torch
from torch import nn
from torch.nn import functional as F

FEATURE_MAPS: dict[str, type[FeatureMap]] = {}  # ModelConfig.attention -> its class


class FeatureMap(nn.Module):
    """phi for linear attention over inputs of width `in_dim`; `size` features out."""

    kind: ClassVar[str]  # the registry key
    c_kernel: ClassVar[Optional[int]] = None  # step.c's number for it, None without a C path

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        FEATURE_MAPS[cls.kind] = cls

    def __init__(self, in_dim: int, n_features: int):
        super().__init__()
        self.in_dim, self.n_features = in_dim, n_features
        self.temperature = in_dim**-0.5

    @property
    def size(self) -> int:
        """M: the width of phi(x), and so of the attention state."""
        return self.in_dim

    def redraw(self) -> None:
        """Draw new random features (maps without any ignore it)."""

    def constants(self) -> Optional[torch.Tensor]:
        """What `forward` derives from the weights on every call, for a step to compute once."""
        return None

    def forward(self, x: torch.Tensor, is_query: bool, constants: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise NotImplementedError


class Favor(FeatureMap):
    """FAVOR+ positive random features (Performer):
    phi(x) = exp([w.x', -w.x'] - |x'|^2 / 2) / sqrt(M) with x' = x * temperature^(1/2), so that
    E[phi(q) . phi(k)] = exp(temperature * q . k); temperature is 1/sqrt(in_dim) as in
    fast-transformers (with SPE, in_dim = R, which yields the paper's overall 1/sqrt(D)).
    The projections w are a buffer: saved with the model, frozen unless `redraw()` is called."""

    kind = "performer"
    c_kernel = 0

    def __init__(self, in_dim: int, n_features: int):
        super().__init__(in_dim, n_features)
        self.register_buffer("projection", orthogonal_gaussian(in_dim, n_features // 2))

    @property
    def size(self) -> int:
        return self.n_features

    @property
    def log_scale(self) -> float:
        """-log(M) / 2: the exponent of the 1 / sqrt(M) normalisation."""
        return -math.log(self.n_features) / 2

    @property
    def key_scale(self) -> float:
        """The factor of |x|^2 in a key's exponent: temperature / 2."""
        return self.temperature / 2

    @torch.no_grad()
    def redraw(self) -> None:
        self.projection.copy_(orthogonal_gaussian(self.in_dim, self.n_features // 2, self.projection.device))

    def constants(self) -> torch.Tensor:
        """[in_dim, n_features]: [w, -w] * temperature^(1/2), so x @ it gives both halves of the
        features' exponents (before the norm term) in one matmul."""
        w = self.projection * math.sqrt(self.temperature)
        return torch.cat([w, -w], dim=1)

    def key_shift(self, x: torch.Tensor) -> torch.Tensor:
        """|x'|^2 / 2 + log(M) / 2 for keys x [..., in_dim] -> [..., 1]: the exponent's norm term."""
        return (x * x).sum(-1, keepdim=True) * self.key_scale - self.log_scale

    def query_offset(self, x: torch.Tensor, constants: Optional[torch.Tensor] = None) -> torch.Tensor:
        """key_shift(x) - max(u) for queries x [..., in_dim] -> [..., 1]: the log of what a query's
        features lack of the unbiased ones (their shift and norm term), so that
        exp(temperature q.k + query_offset(q)) is on the scale of phi(q) . phi(k) (the exact part of
        a windowed attention). A constant to the gradient, as the query's shift in `forward`: a
        per-query factor of both parts cancels in the normalisation."""
        u = x @ (self.constants() if constants is None else constants).to(x.dtype)
        return (self.key_shift(x) - u.amax(-1, keepdim=True)).detach()

    def forward(self, x: torch.Tensor, is_query: bool, constants: Optional[torch.Tensor] = None) -> torch.Tensor:
        u = x @ (self.constants() if constants is None else constants).to(x.dtype)
        if is_query:
            # A per-query constant cancels between numerator and denominator: subtracting the
            # row max keeps exp() <= 1, and the norm term, constant along the row, cancels in it.
            # Keys get no such shift; it would not cancel.
            return (u - u.amax(-1, keepdim=True).detach()).exp_()
        return (u - self.key_shift(x)).exp_()


class Relu(FeatureMap):
    """relu(x)."""

    kind = "relu"
    c_kernel = 1

    def forward(self, x: torch.Tensor, is_query: bool, constants: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.relu(x)


class Elu(FeatureMap):
    """elu(x) + 1 (the linear transformer of Katharopoulos et al. 2020)."""

    kind = "elu"
    c_kernel = 2

    def forward(self, x: torch.Tensor, is_query: bool, constants: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.elu(x) + 1


def orthogonal_gaussian(rows: int, cols: int, device=None) -> torch.Tensor:
    """[rows, cols] whose columns are orthogonal in blocks of `rows`, with the norms of
    Gaussian vectors, so each column is marginally N(0, I) (Performer's ORF)."""
    n_blocks = -(-cols // rows)
    basis, _ = torch.linalg.qr(torch.randn(n_blocks, rows, rows, device=device))
    norms = torch.randn(n_blocks, rows, rows, device=device).norm(dim=1)  # [n_blocks, rows]
    blocks = basis * norms[:, None, :]  # scale each orthonormal column
    return blocks.permute(1, 0, 2).reshape(rows, n_blocks * rows)[:, :cols]
