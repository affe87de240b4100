"""`musegen evaluate loss`: the NLL of a checkpoint on a prepared split, per position and per token
type (`musegen.metrics.loss`), written as tables and figures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import load_checkpoint
from ..device import resolve_device
from ..errors import ConfigError, DataError
from ..metrics.loss import (
    MAX_SCORED_LEN,
    TYPE_COLUMNS,
    TypeBaselines,
    position_sums,
    scoring_inputs,
    summarize,
    token_nll,
    type_nll_rows,
)
from ..metrics.report import fmt, write_position_nll, write_table
from ..shards import Shards


def write_type_nll(
    out_dir: str | os.PathLike, name: str, rows: list[dict[str, Any]], position_type: str | None
) -> dict[str, Path]:
    """`<name>.md` (the per-type table and what each column means) and `<name>.csv`."""
    note = (
        "NLL in nats per token. model: -log p(token); model_given_type: -log p(token | its type). "
        "The baselines know the type and are counted on the training split: unigram; conditional: "
        + (
            f"a {position_type} token given the previous {position_type} token in its bar (or the bar "
            "start), any other token given the previous token; "
            if position_type
            else "a token given the previous token; "
        )
        + "uniform_allowed: a uniform guess among the tokens of that type the grammar allows there."
    )
    cells = [[r["type"], str(r["tokens"])] + [fmt(r[c]) for c in TYPE_COLUMNS[2:]] for r in rows]
    write_table(Path(out_dir), name, list(TYPE_COLUMNS), cells, note)
    return {"csv": Path(out_dir) / f"{name}.csv", "md": Path(out_dir) / f"{name}.md"}


def evaluate_loss(
    checkpoint_dir: str | os.PathLike,
    data_dir: str | os.PathLike,
    max_len: int,
    split: str = "valid",
    out_dir: str | os.PathLike | None = None,
    batch_size: int = 4,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Per-position and per-token-type NLL of a checkpoint on a prepared split.

    The training length comes from the checkpoint's metadata (`train_len`, written by
    `musegen train`); without it every position counts as "within". The per-type baselines are
    counted on the folder's train split (left empty when it has none). With `out_dir`:
    `nll_<split>.csv/.png` (per position) and `token_types_<split>.csv/.md` (per type).
    """

    if not 1 <= max_len <= MAX_SCORED_LEN:
        raise ConfigError(f"--max-len must be within 1..{MAX_SCORED_LEN:,}, got {max_len:,}")
    device = resolve_device(device)
    model, tokenizer, _, meta = load_checkpoint(checkpoint_dir, device=device)
    shards = Shards(data_dir)
    split, pieces = shards.pieces_for(split, tokenizer)
    if not pieces:
        raise DataError(f"{data_dir}: split {split!r} holds no pieces")
    train_len = int(meta.get("train_len") or max_len)
    scored = token_nll(
        model,
        pieces,
        max_len,
        tokenizer.pad_id,
        batch_size,
        type_of=tokenizer.token_type_ids(),
        **scoring_inputs(model, tokenizer),
    )
    sums, counts = position_sums([nll for nll, _ in scored], max_len)
    baselines = TypeBaselines(tokenizer, shards.pieces("train")) if "train" in shards.splits else None
    types = type_nll_rows(tokenizer, pieces, scored, baselines)
    result = summarize(sums, counts, train_len) | {"pieces": len(pieces), "split": split, "types": types}
    if out_dir is not None:
        files = write_position_nll(
            out_dir, f"nll_{split}", sums, counts, train_len, title=f"{Path(checkpoint_dir).name} on {split}"
        )
        files |= {
            f"types_{k}": v
            for k, v in write_type_nll(out_dir, f"token_types_{split}", types, tokenizer.position_type).items()
        }
        result["files"] = {k: str(v) for k, v in files.items()}
    return result
