"""One layer of the model as both of its forms run it: the parallel pass (transformer.Block)
and the single-token step (torch_step; step.c's `layer_step` follows the same order and takes
its choices by the numbers given here, which c_step declares to the C build).

A layer is two residual branches, attention then feed-forward, each with its LayerNorm:
pre-norm  x = x + f(norm(x));  post-norm (the reference code)  x = norm(x + f(x)).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.nn import functional as F

NORMS = ("post", "pre")  # ModelConfig.norm; the index is step.c's NORM_POST, NORM_PRE
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}  # ModelConfig.activation; the order is step.c's ACTIVATION_*

# A branch takes its input h and the residual stream x and returns x + f(h): the step adds in
# the same call that computes f(h).
Branch = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def residual_branches(
    x: torch.Tensor, branches: tuple[Branch, Branch], norms: tuple[Callable, Callable], pre_norm: bool
) -> torch.Tensor:
    """x through the attention and feed-forward branches in the layer's order."""
    for branch, norm in zip(branches, norms):
        x = branch(norm(x), x) if pre_norm else norm(branch(x, x))
    return x
