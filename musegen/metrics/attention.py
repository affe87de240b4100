"""Seeing inside a trained Performer: positional templates, attention maps, PE probes, sparsity.

Nothing here runs during training. Attention matrices are materialised only for inspection, from
the scored queries and keys each layer really uses (q-hat, k-hat: after SPE and its gate), which
are captured with forward hooks so the model's code stays untouched.

- Templates: P_d(m, n) estimated from one layer's (gated) SPE codes, (1/R) Qbar_d(m) . Kbar_d(n)
  without the codes' (R D)^(-1/4) scale, next to the module's analytic kernel.
- Attention logits: log of the un-normalised attention, scale * q-hat . k-hat^T for the exp kernels
  (softmax, and FAVOR+ which estimates it), log(phi(q-hat) . phi(k-hat)) for relu/elu features;
  the families of musegen/model/families.py give their own (`layer_logits`).
- PE probes (Wang et al., ICLR 2021, "identical word probing"): feed one token repeated, so the
  first layer's attention depends on positions only. On A[i, tau] = a(m_i, m_i - tau):
  * translation invariance = share of A's variance explained by the offset tau
    (1 - within-offset sum of squares / total sum of squares): 1 for a purely relative kernel;
  * monotonicity = mean over queries of the Spearman correlation between distance and -A:
    1 when attention strictly decreases with distance.
- Sparsity S(x) = E|x| / sqrt(E x^2): 1 for a constant vector, 1/sqrt(n) (its minimum) for a
  one-hot one; scale-free, so row-normalisation does not change it.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch

# --- generic measures ----------------------------------------------------------------------


def sparsity(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """S(x) = E|x| / sqrt(E x^2) along `dim` (lower is sparser); NaN for an all-zero x."""
    x = x.double()
    return x.abs().mean(dim) / x.pow(2).mean(dim).sqrt()


def translation_invariance(a: torch.Tensor) -> torch.Tensor:
    """a: [..., queries, offsets]. Share of the variance of a explained by the offset column:
    1 - sum (a - column mean)^2 / sum (a - grand mean)^2. A constant a is trivially invariant (1)."""
    a = a.double()
    within = (a - a.mean(-2, keepdim=True)).pow(2).sum((-2, -1))
    total = (a - a.mean((-2, -1), keepdim=True)).pow(2).sum((-2, -1))
    trivial = total <= 1e-12 * a.pow(2).sum((-2, -1)).clamp_min(1e-300)
    return torch.where(trivial, torch.ones_like(total), 1 - within / total.clamp_min(1e-300))


def _average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks along the last axis, ties sharing their mean rank (as Spearman needs)."""
    below = (x[..., None, :] < x[..., :, None]).sum(-1)
    ties = (x[..., None, :] == x[..., :, None]).sum(-1)
    return below + (ties - 1) / 2


def spearman(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Spearman rank correlation along the last axis; NaN where either side is constant."""
    rx, ry = _average_ranks(x.double()), _average_ranks(y.double())
    rx, ry = rx - rx.mean(-1, keepdim=True), ry - ry.mean(-1, keepdim=True)
    return (rx * ry).sum(-1) / (rx.norm(dim=-1) * ry.norm(dim=-1))


def monotonicity(a: torch.Tensor) -> torch.Tensor:
    """a: [..., queries, offsets] with offset tau = query - key distance. Mean over queries of
    Spearman(tau, -a): 1 when every row decreases with distance. Constant rows are ignored."""
    distance = torch.arange(a.shape[-1], dtype=torch.float64).expand(a.shape)
    return spearman(distance, -a.double()).nanmean(-1)


def lag_view(scores: torch.Tensor, queries: Sequence[int], window: int) -> torch.Tensor:
    """scores [..., T, T] (query, key) -> [..., len(queries), window] with [i, tau] = scores[m_i, m_i - tau]."""
    m = torch.as_tensor(list(queries))
    if int(m.min()) < window - 1:
        raise ValueError(f"query {int(m.min())} has fewer than {window} keys before it")
    keys = m[:, None] - torch.arange(window)[None, :]
    return scores[..., m[:, None], keys]


# --- capturing what each layer scores ------------------------------------------------------


def _layer_modules(model) -> list:
    return [layer.attention for layer in model.layers]


@torch.no_grad()
def capture_scored(model, ids: torch.Tensor, layers: Iterable[int], seed: int = 0) -> dict[int, dict]:
    """Run `model(ids)` once and return, for each layer index asked for, the q-hat and k-hat its
    attention scores ({"q", "k"}: [B, H, T, width]; without SPE also "v", and None for what the
    layer does not project) and, with SPE, the shared codes and that layer's gate noise
    ({"codes", "eps"}). The forward's random draws come from `seed`."""
    wanted = sorted(set(layers))
    captured: dict[int, dict] = {}
    handles = []
    attentions = _layer_modules(model)

    def on_spe(index):
        def hook(module, args, output):
            captured[index] = {"q": output[0], "k": output[1], "codes": args[2], "eps": args[3]}

        return hook

    def on_qkv(index, attention):
        def hook(module, args, output):
            q, k, v = (None if x is None else x.float() for x in attention.split(output))
            captured[index] = {"q": q, "k": k, "v": v, "codes": None, "eps": None}

        return hook

    for index in wanted:
        attention = attentions[index]
        if attention.spe_filter is not None:
            handles.append(attention.spe_filter.register_forward_hook(on_spe(index)))
        else:
            handles.append(attention.qkv.register_forward_hook(on_qkv(index, attention)))
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[ids.device] if ids.device.type == "cuda" else []):
            torch.manual_seed(seed)
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return captured


def attention_logits(attention, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Log un-normalised attention of every query to every key, [B, H, T, T] (no mask)."""
    features = attention.features
    if features is None or features.kind == "performer":
        return attention.scale * q @ k.transpose(-1, -2)
    return (features(q, True) @ features(k, False).transpose(-1, -2)).clamp_min(1e-30).log()


@torch.no_grad()
def layer_logits(attention, got: dict) -> torch.Tensor:
    """`attention_logits` from what `capture_scored` kept for that layer; the other attention
    families (musegen/model/families.py) score in their own way."""
    if attention.family is not None:
        return attention.family.logits(got["q"], got["k"], got["v"])
    return attention_logits(attention, got["q"], got["k"])


def causal_attention_map(logits: torch.Tensor) -> torch.Tensor:
    """Row-normalised attention under the causal mask: [..., T, T], zero above the diagonal."""
    T = logits.shape[-1]
    future = torch.ones(T, T, dtype=torch.bool, device=logits.device).triu(1)
    return logits.masked_fill(future, -math.inf).softmax(-1)


def causal_row_sparsity(logits: torch.Tensor) -> torch.Tensor:
    """S of each query's attention over the keys it may see, for queries 1..T-1 (query 0 sees one
    key, S = 1 by construction): [..., T - 1]."""
    a = causal_attention_map(logits)[..., 1:, :]
    n = torch.arange(2, logits.shape[-1] + 1, device=a.device, dtype=torch.float64)
    a = a.double()
    return a.sum(-1) / (n * a.pow(2).sum(-1)).sqrt()


# --- positional templates ------------------------------------------------------------------


def code_templates(
    code_scale: float, codes: tuple[torch.Tensor, torch.Tensor], pairs: Sequence[tuple[int, int]]
) -> torch.Tensor:
    """P_d(m, n) estimated from codes (Qbar, Kbar) [H, T, D, R] for each (head, feature) pair:
    [len(pairs), T, T], the codes' (R D)^(-1/4) scale removed."""
    qbar, kbar = codes
    R = qbar.shape[-1]
    heads, feats = torch.tensor([h for h, _ in pairs]), torch.tensor([d for _, d in pairs])
    q, k = qbar[heads, :, feats], kbar[heads, :, feats]  # [pairs, T, R]
    return q @ k.transpose(-1, -2) / (R * code_scale**2)


def diagonal_means(template: torch.Tensor, lags: int) -> torch.Tensor:
    """Mean of template[..., m, m - tau] over m, for tau = 0..lags-1: the empirical kernel."""
    T = template.shape[-1]
    return torch.stack([template.diagonal(-tau, -2, -1).mean(-1) for tau in range(min(lags, T))], -1)


def gate_values(model) -> torch.Tensor | None:
    """g per layer, head and feature ([L, H, D]) for gated SPE, else None."""
    filters = [a.spe_filter for a in _layer_modules(model)]
    if not filters or filters[0] is None or filters[0].gate is None:
        return None
    return torch.stack([torch.sigmoid(f.gate.detach()) for f in filters])


def strongest_features(kernel_at_zero: torch.Tensor, per_head: int) -> list[tuple[int, int]]:
    """(head, feature) pairs: in each head, the `per_head` features with the largest |P_d(0)|."""
    top = kernel_at_zero.abs().topk(min(per_head, kernel_at_zero.shape[1]), dim=1).indices
    return [(h, int(d)) for h in range(kernel_at_zero.shape[0]) for d in top[h]]


# --- identical-token probes ----------------------------------------------------------------


def probe_first_layer(
    model, token: int, length: int, regions: dict[str, Sequence[int]], window: int, seed: int = 0
) -> dict[str, dict[str, torch.Tensor]]:
    """Translation invariance and monotonicity, per head, of the first layer's un-normalised
    attention on `token` repeated `length` times, for each region's query positions."""
    ids = torch.full((1, length), int(token), dtype=torch.long, device=next(model.parameters()).device)
    got = capture_scored(model, ids, [0], seed)[0]
    logits = layer_logits(_layer_modules(model)[0], got)[0]  # [H, T, T]
    out = {}
    for name, queries in regions.items():
        view = lag_view(logits, queries, window)
        # One shift per head keeps exp() finite; a common factor changes neither score.
        a = (view - view.amax((-2, -1), keepdim=True)).exp()
        out[name] = {
            "translation_invariance": translation_invariance(a),
            "monotonicity": monotonicity(a),
            "profile": a.double().mean(-2),
        }
    return out
