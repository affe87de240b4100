"""Attention families beside the dot-product ones of attention.py, behind the same interface.

`SelfAttention` (transformer.py) projects the input to the queries, keys and values a family
declares in `inputs` and calls `family(q, k, v, state) -> (output, state)` on [B, H, T, head]
tensors; a projection the family does not use is None (and has no weights). `state` is None
for a fresh sequence; a block of T new positions continues whatever the state summarises, so
one call over the whole sequence is the parallel training form and T = 1 is a sampling step.
`logits(q, k, v)` gives the un-normalised log attention [B, H, T, T] of a whole sequence, which
inspection draws (musegen.metrics.attention).

- RelativeAttention: Shaw et al. 2018 softmax attention with learned relative embeddings,
  computed with Music Transformer's skewing (Huang et al. 2018). State: a key/value cache.
- Synthesizer: Tay et al. 2020's synthetic attention logits, tied to `max_len` positions.
  State: a key/value cache.
- Aaren: Feng et al. 2024, attention of one learned query per head over each prefix, as a
  parallel prefix scan or an RNN. State: (m, u, w), constant size.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from .config import ModelConfig, synthesizer_variants

Cache = tuple[Optional[torch.Tensor], Optional[torch.Tensor]]  # earlier keys, values: [B, H, S0, head]


def _extend(cache: Optional[Cache], k: Optional[torch.Tensor], v: torch.Tensor) -> Cache:
    """The cached keys and values followed by the new ones (None stays None)."""
    if cache is None:
        return k, v
    return (None if k is None else torch.cat([cache[0], k], dim=2)), torch.cat([cache[1], v], dim=2)


def _causal_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over keys [..., T, S] for the last T of S positions: query i sees keys <= S - T + i.
    Future entries come out exactly 0, so no gradient reaches future inputs."""
    T, S = logits.shape[-2:]
    future = torch.ones(T, S, dtype=torch.bool, device=logits.device).triu(S - T + 1)
    return logits.masked_fill(future, -math.inf).softmax(-1)


class _Family(nn.Module):
    inputs: tuple[str, ...] = ("q", "k", "v")

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.d_model // config.n_heads
        self.scale = self.head_dim**-0.5


# --- relative positions (Shaw et al. 2018; skewing from Huang et al. 2018) ---------------------


def skew(x: torch.Tensor) -> torch.Tensor:
    """[..., T, S] indexed by (query i, reversed distance c) -> [..., T, S] indexed by (i, key j).
    Column c holds distance S - 1 - c. Query i sits at position S - T + i, so its key j is at
    distance S - T + i - j, in column j + T - 1 - i: row i is read shifted by T - 1 - i. Padding
    one column makes rows S + 1 long; reading the flat buffer from T - 1 in rows of S makes every
    shift at once (Music Transformer's trick, generalised to T <= S queries after a cache).
    Entries for future keys (j > S - T + i) are garbage: the causal mask drops them."""
    T, S = x.shape[-2:]
    flat = F.pad(x, (0, 1)).flatten(-2)
    return flat[..., T - 1 : T - 1 + T * S].view(*x.shape[:-2], T, S)


def unskew(y: torch.Tensor) -> torch.Tensor:
    """The inverse of `skew` for inputs that are zero on future keys (causal attention weights):
    [..., T, S] by (query, key) -> [..., T, S] by (query, reversed distance), zero past the start."""
    T, S = y.shape[-2:]
    flat = F.pad(y.flatten(-2), (T - 1, 1))
    return flat.view(*y.shape[:-2], T, S + 1)[..., :S]


class RelativeAttention(_Family):
    """Causal softmax attention with logits q_i . (k_j + a_K[d]) / sqrt(head), d = i - j clipped to
    `max_relative_distance`, and optionally outputs sum_j p_ij (v_j + a_V[d]). The embeddings
    a_K, a_V are learned per head ([H, K + 1, head]; Shaw et al. share them across heads, the
    Music Transformer does not: per head lets each head keep its own sense of distance).

    q . a_K is computed once per query and distance ([T, K + 1], not a [T, S, head] tensor) and
    skewed into key order; for values, the weights are unskewed into distance order and summed
    per clipped distance. Cost: O(T S head) time and O(T S) memory like softmax attention; a
    sampling step reads the whole cache, so its time and the cache grow with the position.
    """

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.max_distance = config.max_relative_distance
        shape = (self.n_heads, self.max_distance + 1, self.head_dim)
        self.key_embedding = nn.Parameter(torch.randn(shape) * 0.02)
        self.value_embedding = nn.Parameter(torch.randn(shape) * 0.02) if config.relative_values else None

    def logits(self, q, k, v=None):
        S, K = k.shape[2], self.max_distance
        q = q * self.scale
        per_distance = q @ self.key_embedding[:, : min(S, K + 1)].transpose(-1, -2)  # [B, H, T, distances]
        # Reversed distance order (S - 1 .. 0), distances past K repeating a_K[K]: a flip and an
        # expand, whose backward passes are far cheaper on CPU than a gather's scatter.
        by_distance = per_distance.flip(-1)
        if S > K + 1:
            by_distance = torch.cat([per_distance[..., K:].expand(*q.shape[:-1], S - K - 1), by_distance], -1)
        return q @ k.transpose(-1, -2) + skew(by_distance)

    def forward(self, q, k, v, state: Optional[Cache]):
        k, v = _extend(state, k, v)
        weights = _causal_softmax(self.logits(q, k))
        out = weights @ v
        if self.value_embedding is not None:  # the weights summed per clipped distance, times a_V
            K = self.max_distance
            per_distance = unskew(weights).flip(-1)  # distance order 0 .. S - 1
            if per_distance.shape[-1] > K + 1:
                per_distance = torch.cat([per_distance[..., :K], per_distance[..., K:].sum(-1, keepdim=True)], -1)
            out = out + per_distance @ self.value_embedding[:, : per_distance.shape[-1]]
        return out, (k, v)


# --- synthetic attention (Tay et al. 2020) -----------------------------------------------------


class Synthesizer(_Family):
    """Causal attention whose logits are synthesised rather than (only) compared, per head:
    - "random": a learned max_len x max_len logit matrix R; "random-fixed": R drawn once, frozen;
    - "factorized": R = R1 R2^T with R1, R2 of max_len x `synthesizer_rank`;
    - "dense": row t = W2 relu(q_t) + b2, a 2-layer MLP of token t whose first layer is the head's
      query projection (W1 x + b1), giving a logit for every key position;
    - "dot": q . k / sqrt(head), ordinary attention logits.
    Variants joined by "+" add their logits with learned softmax-normalised weights (Tay et al.'s
    mixtures). Logits are indexed by absolute position, so the model cannot read past `max_len`
    (ModelConfig.check_length refuses it). State: the cached keys (for "dot") and values.
    """

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.variants = synthesizer_variants(config.synthesizer)
        self.inputs = tuple(
            name
            for name, used in (("q", {"dense", "dot"} & set(self.variants)), ("k", "dot" in self.variants), ("v", True))
            if used
        )
        H, N, R = self.n_heads, config.max_len, config.synthesizer_rank
        if "random" in self.variants:
            self.random = nn.Parameter(torch.randn(H, N, N))
        if "random-fixed" in self.variants:  # a buffer: saved with the model, never trained
            self.register_buffer("random_fixed", torch.randn(H, N, N))
        if "factorized" in self.variants:  # R1 R2^T has unit-variance entries, like "random"
            self.factor_rows = nn.Parameter(torch.randn(H, N, R) * R**-0.25)
            self.factor_cols = nn.Parameter(torch.randn(H, N, R) * R**-0.25)
        if "dense" in self.variants:
            self.dense_weight = nn.Parameter(torch.randn(H, self.head_dim, N) * 0.02)
            self.dense_bias = nn.Parameter(torch.zeros(H, 1, N))
        self.mixture = nn.Parameter(torch.zeros(len(self.variants))) if len(self.variants) > 1 else None

    def _variant(self, name: str, q, k, T: int, S: int) -> torch.Tensor:
        """One variant's logits for the last T of S positions: [H or B, H, T, S]."""
        rows = slice(S - T, S)
        if name == "random":
            return self.random[:, rows, :S]
        if name == "random-fixed":
            return self.random_fixed[:, rows, :S]
        if name == "factorized":
            return self.factor_rows[:, rows] @ self.factor_cols[:, :S].transpose(-1, -2)
        if name == "dense":
            return F.relu(q) @ self.dense_weight[..., :S] + self.dense_bias[..., :S]
        return q @ k.transpose(-1, -2) * self.scale  # "dot"

    def _scores(self, q, k, T: int, S: int) -> torch.Tensor:
        logits = [self._variant(name, q, k, T, S) for name in self.variants]
        if self.mixture is None:
            return logits[0]
        return sum(w * x for w, x in zip(self.mixture.softmax(0), logits))

    def logits(self, q, k, v):
        T = v.shape[2]
        return self._scores(q, k, T, T).expand(v.shape[0], self.n_heads, T, T)

    def forward(self, q, k, v, state: Optional[Cache]):
        T = v.shape[2]
        k, v = _extend(state, k, v)
        return _causal_softmax(self._scores(q, k, T, v.shape[2])) @ v, (k, v)


# --- attention as an RNN (Feng et al. 2024) ----------------------------------------------------

Summary = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (m [..], u [..], w [.., D])


def _combine(a: Summary, b: Summary) -> Summary:
    """Merge the softmax summaries of two consecutive spans, a before b. A span's summary is
    (m = max score, u = sum exp(s - m), w = sum exp(s - m) v); rescaling both to the larger max
    keeps every exp() <= 1. Associative, so prefixes can be merged in any grouping."""
    m = torch.maximum(a[0], b[0])
    scale_a, scale_b = (a[0] - m).exp(), (b[0] - m).exp()
    return m, a[1] * scale_a + b[1] * scale_b, a[2] * scale_a[..., None] + b[2] * scale_b[..., None]


def prefix_scan(scores: torch.Tensor, v: torch.Tensor) -> Summary:
    """The summary of every prefix 0..t of scores [B, H, T] and values [B, H, T, D] (Hillis-Steele:
    after the pass with shift 2^j each position summarises the 2^(j+1) positions ending at it;
    log2 T passes of O(T D) work).

    m is only a stabiliser: w / u does not depend on it, so it is taken without gradient and
    u = exp(s - m) = 1 still carries the gradient of s."""
    m = scores.detach()
    u = (scores - m).exp()
    summary = (m, u, u[..., None] * v)
    shift, T = 1, scores.shape[-1]
    while shift < T:
        earlier = tuple(x[:, :, : T - shift] for x in summary)
        later = tuple(x[:, :, shift:] for x in summary)
        merged = _combine(earlier, later)
        summary = tuple(torch.cat([x[:, :, :shift], y], dim=2) for x, y in zip(summary, merged))
        shift *= 2
    return summary


class Aaren(_Family):
    """Output t = softmax attention of one learned, token-independent query per head over the keys
    and values 1..t. Parallel form: `prefix_scan` over all positions (O(T log T head) time);
    recurrent form: the state (m, u, w) of the prefix so far, merged with each new position:
    O(head) time and memory per token whatever the position. No query projection exists."""

    inputs = ("k", "v")

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.query = nn.Parameter(torch.randn(self.n_heads, self.head_dim) * 0.02)

    def _scores(self, k: torch.Tensor) -> torch.Tensor:
        return (k @ self.query[:, :, None])[..., 0] * self.scale  # [B, H, T]

    def logits(self, q, k, v):
        scores = self._scores(k)
        return scores[:, :, None, :].expand(-1, -1, scores.shape[-1], -1)  # the same query at every row

    def forward(self, q, k, v, state: Optional[Summary]):
        summary = prefix_scan(self._scores(k), v)
        if state is not None:  # continue the earlier prefix: merge it into every new position
            summary = _combine(tuple(x[:, :, None] for x in state), summary)
        m, u, w = summary
        return w / u[..., None], (m[:, :, -1], u[:, :, -1], w[:, :, -1])


FAMILIES: dict[str, type[_Family]] = {"relative": RelativeAttention, "synthesizer": Synthesizer, "aaren": Aaren}
