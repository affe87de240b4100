"""Does a model copy what it has just heard? Its NLL, bar by bar, on random loops it never saw.

A random loop (`musegen.music.loops`) repeats a 1- or 2-bar pattern of drums, bass and chords over
a progression that loops too, and its pattern is new to every model: the loops used here are drawn
from seeds no training corpus uses. Its first two bars can only be guessed from what grooves are
like. From the third bar on the pattern has been played through, so a model that copies predicts
the drums and the rhythm of every part almost surely, and only the chord changes stay uncertain.

The table gives each model's teacher-forced NLL (nats a token) in each of the first bars, and the
*recall gain*: the mean NLL of bars 1-2 less that of bars 5-8, the pattern heard at least twice.
An exact copier of drums and rhythm gains most of the first bars' NLL; a model that copies
nothing gains only what any context gives. Unlike the sampled copy test (run_copy.py) it draws
nothing, so it is exact, repeatable and takes seconds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint import load_checkpoint
from ..device import resolve_device
from ..errors import ConfigError
from ..io import write_json
from ..metrics.loss import scoring_inputs, token_nll
from ..metrics.metric import nan_mean
from ..metrics.report import fmt, json_safe, write_table
from ..music.loops import HELD_OUT_SEEDS, random_loop_piece
from ..plots import pyplot, save_png

BARS = 8  # bars scored per loop
FIRST, LATER = (0, 1), (4, 5, 6, 7)  # bar indices: the pattern's first pass, and after two passes
MAX_TOKENS = 2048  # a loop's 8 bars take about 500 tokens of groove-dur, 1,000 of groove


def nll_by_bar(model, tokenizer, pieces: list[np.ndarray], bars: int = BARS) -> np.ndarray:
    """Mean NLL of the tokens of each bar 0..bars-1 over `pieces` (NaN where no piece reaches it)."""
    sums, counts = np.zeros(bars), np.zeros(bars)
    scored = token_nll(model, pieces, MAX_TOKENS, tokenizer.pad_id, **scoring_inputs(model, tokenizer))
    for ids, nll in zip(pieces, scored):
        starts = np.asarray(tokenizer.bar_starts(ids))
        token_bar = np.searchsorted(starts, np.arange(1, len(nll) + 1), side="right") - 1  # nll[i]: token i + 1
        for b in range(bars):
            chosen = token_bar == b
            sums[b] += nll[chosen].sum()
            counts[b] += chosen.sum()
    return np.divide(sums, counts, out=np.full(bars, np.nan), where=counts > 0)


def recall_row(by_bar: np.ndarray) -> dict[str, float]:
    first, later = nan_mean(by_bar[list(FIRST)]), nan_mean(by_bar[list(LATER)])
    return {"bars 1-2": first, "bars 5-8": later, "recall gain": first - later}


def evaluate_recall(
    checkpoints: dict[str, str | os.PathLike],
    out_dir: str | os.PathLike,
    pieces: int = 30,
    device: str = "auto",
) -> dict[str, Any]:
    """Every checkpoint's NLL by bar on the same `pieces` unseen loops. Writes recall.md / .csv (the
    table), recall.png (NLL by bar) and recall.json."""

    if pieces < 1:
        raise ConfigError(f"--recall-pieces must be at least 1, got {pieces}")
    device = resolve_device(device)
    loops = [random_loop_piece(HELD_OUT_SEEDS + k).midi_bytes() for k in range(pieces)]
    table = []
    for name, folder in checkpoints.items():
        model, tokenizer, _, _ = load_checkpoint(folder, device=device)
        if not tokenizer.roles:
            raise ConfigError(
                f"{folder}: a {tokenizer.kind} model plays no track roles; loops are bass, drums and other"
            )
        by_bar = nll_by_bar(model, tokenizer, [tokenizer.encode(midi).ids for midi in loops])
        table.append({"name": name, "checkpoint": str(folder), "by_bar": by_bar.tolist(), **recall_row(by_bar)})
    return _report(Path(out_dir), table, pieces)


def _report(out_dir: Path, table: list[dict[str, Any]], pieces: int) -> dict[str, Any]:
    columns = [f"bar {b + 1}" for b in range(BARS)] + ["bars 1-2", "bars 5-8", "recall gain"]
    cells = [[r["name"]] + [fmt(v, 2) for v in r["by_bar"]] + [fmt(r[c], 2) for c in columns[BARS:]] for r in table]
    note = (
        f"Teacher-forced NLL (nats a token) of each bar of {pieces} random loops no model has heard "
        "(musegen.music.loops, held-out seeds); recall gain: bars 1-2 less bars 5-8, what hearing the "
        "pattern twice is worth. Definitions: docs/evaluation.md."
    )
    write_table(out_dir, "recall", ["model"] + columns, cells, note)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in table:
        ax.plot(range(1, BARS + 1), r["by_bar"], marker="o", label=r["name"])
    ax.set(xlabel="bar of the loop", ylabel="NLL (nats / token)", title="Unseen random loops: NLL by bar")
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    fig.tight_layout()
    save_png(fig, out_dir / "recall.png")
    write_json(out_dir / "recall.json", json_safe({"pieces": pieces, "table": table}))
    return {"table": table, "files": {kind: str(out_dir / f"recall.{kind}") for kind in ("md", "csv", "png", "json")}}
