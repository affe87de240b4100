"""Teacher-forced NLL per token position (the paper's Fig. 3): does a model extrapolate? And per
token type, beside count baselines. `musegen.evaluation.run_loss` runs it on a checkpoint.

Each held-out piece is read from its start, up to `max_len` predicted tokens. Position t is
the NLL (nats) of token t+1 given tokens 0..t. "within" averages the positions below the
training length, "extrapolation" the positions from it on; both weight every token equally.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import TokenError
from ..tokenizers.base import Grammar, Tokenizer
from .metric import nan_mean


def position_sums(per_piece: Sequence[np.ndarray], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(NLL sum, token count) per position 0..max_len-1 of `token_nll`'s per-piece arrays."""
    sums, counts = np.zeros(max_len, dtype=np.float64), np.zeros(max_len, dtype=np.int64)
    for nll in per_piece:
        sums[: len(nll)] += nll
        counts[: len(nll)] += 1
    return sums, counts


def scoring_inputs(model, tokenizer: Tokenizer) -> dict[str, Any]:
    """What `token_nll` needs for `model` beside the ids: the tokenizer's onsets for a model whose
    positions are beats, its grammar for one trained under it (a scorer that is not a model,
    such as a baseline, needs neither)."""
    config = getattr(model, "config", None)
    beats = getattr(config, "positions", "tokens") == "beats"
    under_grammar = getattr(config, "loss_over", "vocab") == "grammar"
    return {"onsets": tokenizer.onsets if beats else None, "grammar": tokenizer.grammar() if under_grammar else None}


@torch.no_grad()
def token_nll(
    model: torch.nn.Module,
    pieces: Sequence[np.ndarray],
    max_len: int,
    pad_id: int,
    batch_size: int = 4,
    seed: int = 0,
    type_of: np.ndarray | None = None,
    onsets: Optional[Callable[[np.ndarray], np.ndarray]] = None,
    grammar: Grammar | None = None,
) -> list:
    """Teacher-forced NLL (nats) of tokens 1..max_len of each piece given the tokens before them.

    One float64 array per piece (empty for pieces shorter than 2 tokens). With `type_of` (each
    id's token type, -1 for none) each entry is a pair: the NLL and the NLL *given the type*,
    -log(p(token) / p(any token of its type)), which compares fairly with baselines that know
    the type. `onsets`: the tokenizer's, for a model whose
    positions are beats (each piece's onsets, the padding at its last). `grammar`: for a model
    trained under it (ModelConfig.loss_over), each token is scored among the ids it allows there.

    The model's own random draws (SPE noise, features) come from a generator seeded with
    `seed`, so repeated validations of one model agree; the caller's RNG state is untouched.
    """
    device = next(model.parameters()).device
    out: list = [(np.zeros(0), np.zeros(0)) if type_of is not None else np.zeros(0) for _ in pieces]
    usable = [(k, np.asarray(p[: max_len + 1])) for k, p in enumerate(pieces) if len(p) >= 2]
    members = (
        None
        if type_of is None
        else [torch.from_numpy(np.flatnonzero(type_of == t)).to(device) for t in range(int(type_of.max()) + 1)]
    )
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            for i in range(0, len(usable), batch_size):
                chunk = usable[i : i + batch_size]
                batch = torch.full((len(chunk), max(len(p) for _, p in chunk)), pad_id, dtype=torch.long)
                beats = None if onsets is None else torch.zeros(batch.shape, dtype=torch.float64)
                for row, (_, piece) in enumerate(chunk):
                    batch[row, : len(piece)] = torch.from_numpy(piece)
                    if beats is not None:
                        times = torch.from_numpy(onsets(piece))
                        beats[row], beats[row, : len(piece)] = times[-1], times
                batch = batch.to(device)
                inputs = (batch[:, :-1],) if beats is None else (batch[:, :-1], beats[:, :-1].to(device))
                logits = model(*inputs).float()
                if grammar is not None:
                    allowed = np.ones((*batch[:, 1:].shape, grammar.vocab_size), dtype=bool)
                    for row, (_, piece) in enumerate(chunk):
                        allowed[row] = grammar.allowed_after(piece, 0, allowed.shape[1])
                    allowed = F.pad(torch.from_numpy(allowed).to(device), (0, logits.shape[-1] - grammar.vocab_size))
                    logits = logits.masked_fill(~allowed, -math.inf)
                logp = logits.log_softmax(-1)
                targets = batch[:, 1:]
                nll = -logp.gather(-1, targets[..., None])[..., 0]
                given = None if members is None else nll + _type_log_mass(logp, targets, members, type_of)
                for row, (k, piece) in enumerate(chunk):
                    n = len(piece) - 1
                    out[k] = nll[row, :n].double().cpu().numpy()
                    if given is not None:
                        out[k] = (out[k], given[row, :n].double().cpu().numpy())
    finally:
        model.train(was_training)
    return out


def _type_log_mass(
    logp: torch.Tensor, targets: torch.Tensor, members: list[torch.Tensor], type_of: np.ndarray
) -> torch.Tensor:
    """log p(the target's type) at every position: logsumexp over the ids of that type."""
    mass = torch.stack(
        [logp[..., ids].logsumexp(-1) if len(ids) else torch.full_like(logp[..., 0], -math.inf) for ids in members], -1
    )
    kind = torch.from_numpy(type_of).to(targets.device)[targets]
    picked = mass.gather(-1, kind.clamp_min(0)[..., None])[..., 0]
    return torch.where(kind >= 0, picked, torch.zeros_like(picked))  # typeless ids (PAD): NLL as is


def summarize(sums: np.ndarray, counts: np.ndarray, train_len: int) -> dict[str, Any]:
    """Token-weighted mean NLL overall, below `train_len` ("within") and from it on."""

    def mean(sl: slice) -> float | None:
        n = counts[sl].sum()
        return float(sums[sl].sum() / n) if n else None

    return {
        "mean": mean(slice(None)),
        "within": mean(slice(0, train_len)),
        "extrapolation": mean(slice(train_len, None)),
        "tokens": int(counts.sum()),
        "train_len": int(train_len),
        "max_len": int(len(sums)),
    }


# ---- NLL per token type, beside baselines ------------------------------------------------------

MAX_SCORED_LEN = 65_536  # positions `evaluate loss` may score: the longest training crop musegen accepts
BAR_START = -2  # the context of a bar's first position token (mapped to an extra row of the tables)


def token_contexts(tokenizer: Tokenizer, ids: np.ndarray) -> np.ndarray:
    """What the conditional baseline conditions token i on (i >= 1): for a token of the tokenizer's
    position type, the previous position token in the same bar, or BAR_START when it is the bar's
    first; for any other token, the token before it. Entry 0 (no context) is -1."""
    ids = np.asarray(ids, dtype=np.int64)
    ctx = np.r_[-1, ids[:-1]]
    if tokenizer.position_type is None or not len(ids):
        return ctx
    index = np.arange(len(ids))
    is_position = tokenizer.token_type_ids()[ids] == list(tokenizer.token_types).index(tokenizer.position_type)
    before = np.r_[-1, np.maximum.accumulate(np.where(is_position, index, -1))[:-1]]  # last one before i
    starts = np.asarray(tokenizer.bar_starts(ids), dtype=np.int64)
    bar = np.searchsorted(starts, index, side="right") - 1
    bar_start = np.where(bar >= 0, starts[np.maximum(bar, 0)], 0) if len(starts) else np.zeros_like(index)
    in_bar = (before >= 0) & (before >= bar_start)
    ctx[is_position] = np.where(in_bar, ids[np.maximum(before, 0)], BAR_START)[is_position]
    ctx[0] = -1
    return ctx


class TypeBaselines:
    """Count tables from training pieces, predicting a token *given its type* (add-one smoothing):

    - unigram: P(t | type) = (c(t) + 1) / (c(type) + ids of that type);
    - conditional: P(t | context, type) = (c(context, t) + P_unigram(t | type)) / (c(context, type) + 1),
      with the context of `token_contexts` (for REMI Beats: the current beat of the bar).
    """

    def __init__(self, tokenizer: Tokenizer, pieces: Sequence[np.ndarray]):
        self.type_of = tokenizer.token_type_ids()
        self.tokenizer, size = tokenizer, tokenizer.vocab_size
        pairs = np.zeros((size + 1) * size, dtype=np.int64)
        for piece in pieces:
            piece = np.asarray(piece, dtype=np.int64)
            ctx = token_contexts(tokenizer, piece)[1:]
            pairs += np.bincount(np.where(ctx == BAR_START, size, ctx) * size + piece[1:], minlength=len(pairs))
        self.pairs = pairs.reshape(size + 1, size)
        self.unigram = self.pairs.sum(0)
        n_types = int(self.type_of.max()) + 1
        onehot = (self.type_of[:, None] == np.arange(n_types)[None, :]).astype(np.int64)
        per_type, ids_per_type = self.unigram @ onehot, onehot.sum(0)
        kind = np.maximum(self.type_of, 0)
        self.p_unigram = (self.unigram + 1) / (per_type[kind] + ids_per_type[kind])
        self.context_type = self.pairs @ onehot  # c(context, type)

    def nll(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(unigram NLL, conditional NLL) of tokens 1.. of `ids`; NaN for typeless tokens."""
        ids = np.asarray(ids, dtype=np.int64)
        ctx = token_contexts(self.tokenizer, ids)[1:]
        ctx = np.where(ctx == BAR_START, self.tokenizer.vocab_size, ctx)
        target, kind = ids[1:], self.type_of[ids[1:]]
        p_uni = self.p_unigram[target]
        p_cond = (self.pairs[ctx, target] + p_uni) / (self.context_type[ctx, np.maximum(kind, 0)] + 1)
        typed = kind >= 0
        return np.where(typed, -np.log(p_uni), np.nan), np.where(typed, -np.log(p_cond), np.nan)


def uniform_allowed_nll(tokenizer: Tokenizer, ids: np.ndarray) -> np.ndarray:
    """log(number of ids of token i's type that the grammar allows at i), for tokens 1.. of `ids`:
    the NLL of a uniform guess among the allowed tokens of the right type. NaN from the first token
    the grammar rejects on."""
    type_of = tokenizer.token_type_ids()
    masks = [type_of == k for k in range(int(type_of.max()) + 1)]
    grammar = tokenizer.grammar()
    out = np.full(max(len(ids) - 1, 0), np.nan)
    state = grammar.start()
    try:
        for i, tok in enumerate(int(t) for t in ids):
            if i:
                allowed = grammar.allowed(state)
                if not allowed[tok]:
                    break
                if type_of[tok] >= 0:
                    out[i - 1] = math.log(np.count_nonzero(allowed & masks[type_of[tok]]))
            state = grammar.step(state, tok)
    except TokenError:
        pass
    return out


TYPE_COLUMNS = ("type", "tokens", "share", "model", "model_given_type", "unigram", "conditional", "uniform_allowed")


def type_nll_rows(
    tokenizer: Tokenizer, pieces: Sequence[np.ndarray], scored: list, baselines: TypeBaselines | None
) -> list[dict[str, Any]]:
    """One row per token type (and "all"): mean NLL of the model, of the model given the type, and
    of the baselines, over the tokens `token_nll(..., type_of=...)` scored (`scored`)."""
    type_of = tokenizer.token_type_ids()
    columns: dict[str, list[np.ndarray]] = {c: [] for c in TYPE_COLUMNS[3:] + ("type_index",)}
    for piece, (nll, given) in zip(pieces, scored):
        ids = np.asarray(piece[: len(nll) + 1], dtype=np.int64)
        if len(ids) < 2:
            continue
        unigram, conditional = baselines.nll(ids) if baselines else (np.full(len(nll), np.nan),) * 2
        for name, values in zip(
            columns, (nll, given, unigram, conditional, uniform_allowed_nll(tokenizer, ids), type_of[ids[1:]])
        ):
            columns[name].append(values)
    flat = {name: np.concatenate(parts) if parts else np.zeros(0) for name, parts in columns.items()}
    total = len(flat["model"])
    rows = [
        {"type": "all", "tokens": total, "share": 1.0 if total else math.nan, "model": nan_mean(flat["model"])}
        | {c: math.nan for c in TYPE_COLUMNS[4:]}
    ]
    for k, name in enumerate(tokenizer.token_types):
        pick = flat["type_index"] == k
        if pick.any():
            rows.append(
                {"type": name, "tokens": int(pick.sum()), "share": pick.sum() / total}
                | {c: nan_mean(flat[c][pick]) for c in TYPE_COLUMNS[3:]}
            )
    return rows
