"""Teacher-forced NLL per token position (the paper's Fig. 3): does a model extrapolate?

Each held-out piece is read from its start, up to `max_len` predicted tokens. Position t is
the NLL (nats) of token t+1 given tokens 0..t. "within" averages the positions below the
training length, "extrapolation" the positions from it on; both weight every token equally.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..device import resolve_device
from ..errors import DataError
from ..io import write_text
from ..plots import pyplot, save_png


@torch.no_grad()
def position_nll(model: torch.nn.Module, pieces: Sequence[np.ndarray], max_len: int, pad_id: int,
                 batch_size: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(NLL sum, token count) per position 0..max_len-1 over `pieces`, in fp32.

    The model's own random draws (SPE noise, features) come from a generator seeded with
    `seed`, so repeated validations of one model agree; the caller's RNG state is untouched.
    """
    device = next(model.parameters()).device
    sums = np.zeros(max_len, dtype=np.float64)
    counts = np.zeros(max_len, dtype=np.int64)
    usable = [np.asarray(p[:max_len + 1]) for p in pieces if len(p) >= 2]
    was_training = model.training
    model.eval()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            for i in range(0, len(usable), batch_size):
                chunk = usable[i:i + batch_size]
                width = max(len(p) for p in chunk)
                batch = torch.full((len(chunk), width), pad_id, dtype=torch.long)
                for row, piece in enumerate(chunk):
                    batch[row, :len(piece)] = torch.from_numpy(piece)
                batch = batch.to(device)
                logits = model(batch[:, :-1]).float()
                targets = batch[:, 1:]
                nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
                real = targets != pad_id
                n = width - 1
                sums[:n] += (nll * real).sum(0).double().cpu().numpy()
                counts[:n] += real.sum(0).cpu().numpy()
    finally:
        model.train(was_training)
    return sums, counts


def summarize(sums: np.ndarray, counts: np.ndarray, train_len: int) -> dict[str, Any]:
    """Token-weighted mean NLL overall, below `train_len` ("within") and from it on."""
    def mean(sl: slice) -> float | None:
        n = counts[sl].sum()
        return float(sums[sl].sum() / n) if n else None

    return {"mean": mean(slice(None)), "within": mean(slice(0, train_len)),
            "extrapolation": mean(slice(train_len, None)), "tokens": int(counts.sum()),
            "train_len": int(train_len), "max_len": int(len(sums))}


def write_position_nll(out_dir: str | os.PathLike, name: str, sums: np.ndarray, counts: np.ndarray,
                       train_len: int, title: str = "") -> dict[str, Path]:
    """`<name>.csv` (position, nll, count) and `<name>.png` (NLL against position), atomically."""
    plt = pyplot()

    out_dir = Path(out_dir)
    nll = np.divide(sums, counts, out=np.full(len(sums), np.nan), where=counts > 0)
    rows = ["position,nll,count"] + [f"{t},{'' if np.isnan(v) else f'{v:.6f}'},{c}"
                                     for t, (v, c) in enumerate(zip(nll, counts))]
    csv_path, png_path = out_dir / f"{name}.csv", out_dir / f"{name}.png"
    write_text(csv_path, "\n".join(rows) + "\n")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(np.arange(len(nll)), nll, lw=0.5, alpha=0.4, label="per position")
    window = max(1, len(nll) // 64)  # a running mean shows the trend through per-token noise
    if window > 1 and np.isfinite(nll).sum() >= window:
        smooth = np.convolve(np.nan_to_num(nll), np.ones(window) / window, mode="valid")
        ax.plot(np.arange(len(smooth)) + window // 2, smooth, lw=1.5, label=f"running mean ({window})")
    if train_len < len(nll):
        ax.axvline(train_len, color="k", ls="--", lw=1, label="training length")
    ax.set_xlabel("token position")
    ax.set_ylabel("NLL (nats)")
    ax.set_title(title or name)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    save_png(fig, png_path, dpi=110)
    return {"csv": csv_path, "png": png_path}


def evaluate_loss(checkpoint_dir: str | os.PathLike, data_dir: str | os.PathLike, max_len: int,
                  split: str = "valid", out_dir: str | os.PathLike | None = None,
                  batch_size: int = 4, device: str | torch.device | None = None) -> dict[str, Any]:
    """Per-position NLL of a checkpoint on a prepared split; CSV + PNG when `out_dir` is given.

    The training length comes from the checkpoint's metadata (`train_len`, written by
    `musegen train`); without it every position counts as "within".
    """
    from ..checkpoint import load_checkpoint
    from ..shards import Shards

    if max_len < 1:
        raise DataError(f"max_len must be positive, got {max_len}")
    device = resolve_device(device)
    model, tokenizer, _, meta = load_checkpoint(checkpoint_dir, device=device)
    split, pieces = Shards(data_dir).pieces_for(split, tokenizer)
    if not pieces:
        raise DataError(f"{data_dir}: split {split!r} holds no pieces")
    train_len = int(meta.get("train_len") or max_len)
    sums, counts = position_nll(model, pieces, max_len, tokenizer.pad_id, batch_size)
    result = summarize(sums, counts, train_len) | {"pieces": len(pieces), "split": split}
    if out_dir is not None:
        files = write_position_nll(out_dir, f"nll_{split}", sums, counts, train_len,
                                   title=f"{Path(checkpoint_dir).name} on {split}")
        result["files"] = {k: str(v) for k, v in files.items()}
    return result
