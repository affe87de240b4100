"""Training curves of several runs in one figure: the training loss (a running mean over 20 log
records) and the validation loss, against the tokens seen.

    python scripts/experiments/plot_training.py OUT.png NAME=RUN/log.jsonl [NAME=RUN/log.jsonl ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from musegen.evaluation.compare import read_jsonl  # noqa: E402
from musegen.training.run_folder import LOG_RECORD  # noqa: E402

SMOOTH = 20  # log records in the training loss's running mean


def curves(log: Path) -> tuple[list, list, list, list]:
    rows = read_jsonl(log, LOG_RECORD)  # checked against the log's schema
    updates = [r for r in rows if "loss" in r and "tokens" in r]
    steps, tokens = [r["step"] for r in updates], [r["tokens"] / 1e6 for r in updates]
    losses = [r["loss"] for r in updates]
    smooth = [sum(losses[max(0, i - SMOOTH + 1) : i + 1]) / min(i + 1, SMOOTH) for i in range(len(losses))]
    valid = [r for r in rows if "valid_loss" in r]
    # validation falls between log records: its tokens are interpolated from the update counts
    valid_tokens = np.interp([r["step"] for r in valid], steps, tokens)
    return tokens, smooth, list(valid_tokens), [r["valid_loss"] for r in valid]


def main(out: str, runs: list[str]) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, spec in enumerate(runs):
        name, _, log = spec.partition("=")
        x, y, vx, vy = curves(Path(log))
        color = f"C{i}"
        ax.plot(x, y, color=color, label=f"{name}: training (mean of {SMOOTH} records)")
        ax.plot(vx, vy, "o--", color=color, label=f"{name}: validation")
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("NLL (nats / token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
