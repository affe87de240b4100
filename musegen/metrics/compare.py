"""Side-by-side reports of several models' evaluations (the experiments of docs/results.md).

Each model is a folder (a run folder, say) holding, anywhere below it, what `musegen evaluate
loss` (one nll_<split>.csv), `musegen evaluate style` (style.csv) and `musegen sample` (batch.json
or <prompt>.json) wrote for it. The report holds a table (Markdown and CSV) and one figure per
kind of evaluation found for every model, and, for run folders, the compute each run used.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from ..io import read_json, write_text
from ..plots import pyplot, save_png
from .loss import summarize
from .style import METRICS, medians


def _read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _found(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.rglob(pattern))


def read_position_nll(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """(NLL sums, counts) per position from the single nll_<split>.csv under `folder`."""
    found = _found(folder, "nll_*.csv")
    if len(found) != 1:
        raise DataError(f"{folder}: expected one nll_<split>.csv from `musegen evaluate loss`, found {len(found)}")
    rows = _read_rows(found[0])
    counts = np.array([int(r["count"]) for r in rows])
    nll = np.array([float(r["nll"]) if r["nll"] else 0.0 for r in rows])
    return nll * counts, counts


def read_sampling(folder: Path) -> dict[str, float] | None:
    """Generation speed and recurrent-state size from a `musegen sample` summary, if one is there."""
    for path in _found(folder, "batch.json") + _found(folder, "*.json"):
        summary = read_json(path)
        if isinstance(summary, dict) and "stats" in summary:
            stats = summary["stats"]
            return {"ms_per_token": 1000.0 / stats["tokens_per_second"] if stats.get("tokens_per_second") else math.nan,
                    "state_kib": stats.get("state_bytes", math.nan) / 1024}
    return None


def read_training(folder: Path) -> dict[str, Any] | None:
    """Compute a run used, from its log.jsonl: parameters, steps, tokens, wall time, last loss."""
    path = folder / "log.jsonl"
    if not path.is_file():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in records if "loss" in r and "time" in r]
    if not steps:
        return None
    # Wall time between logged steps, plus the first interval scaled from the first record's steps.
    first, last = steps[0], steps[-1]
    per_step = (last["time"] - first["time"]) / max(last["step"] - first["step"], 1)
    starts = [r for r in records if r.get("event") in ("start", "resume")]
    return {"parameters": starts[0].get("parameters") if starts else None, "steps": last["step"],
            "tokens": last["tokens"], "minutes": (last["time"] - first["time"] + per_step * first["step"]) / 60,
            "loss": last["loss"]}


def compare_training(runs: dict[str, Path], out_dir: Path) -> list[dict[str, Any]]:
    """Compute per model: parameters, steps, tokens, wall minutes and the last logged training loss."""
    rows = [{"model": name, **read_training(folder)} for name, folder in runs.items()]
    header = ["model", "parameters", "steps", "tokens", "wall minutes", "last training loss"]
    _write_table(out_dir, "training", header, [
        [r["model"], f"{r['parameters']:,}" if r["parameters"] else "-", str(r["steps"]), f"{r['tokens']:,}",
         f"{r['minutes']:.0f}", _fmt(r["loss"])] for r in rows])
    return rows


def _fmt(value: float, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _write_table(out_dir: Path, name: str, header: list[str], rows: list[list[str]]) -> None:
    write_text(out_dir / f"{name}.md", _markdown(header, rows))
    write_text(out_dir / f"{name}.csv", "\n".join(",".join(r) for r in [header] + rows) + "\n")


def compare_loss(runs: dict[str, Path], train_len: int, out_dir: Path) -> list[dict[str, Any]]:
    """Within / extrapolation NLL per model (table) and the running-mean NLL curves (one plot)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    results = []
    for name, folder in runs.items():
        sums, counts = read_position_nll(folder)
        result = {"model": name, **summarize(sums, counts, train_len)}
        sampling = read_sampling(folder)
        if sampling:
            result.update(sampling)
        results.append(result)
        nll = np.divide(sums, counts, out=np.full(len(sums), np.nan), where=counts > 0)
        window = max(1, len(nll) // 32)  # per-token NLL is noisy; the trend is what compares
        smooth = np.convolve(np.nan_to_num(nll), np.ones(window) / window, mode="valid")
        ax.plot(np.arange(len(smooth)) + window // 2, smooth, lw=1.5, label=name)
    ax.axvline(train_len, color="k", ls="--", lw=1, label="training length L")
    ax.set_xlabel("token position")
    ax.set_ylabel(f"NLL (nats), running mean over {window}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, out_dir / "nll.png", dpi=110)

    with_sampling = any("ms_per_token" in r for r in results)
    header = ["model", f"within (< {train_len})", f"extrapolation ({train_len}..{results[0]['max_len'] - 1})", "all"]
    header += ["ms / generated token", "state KiB"] if with_sampling else []
    rows = []
    for r in results:
        row = [r["model"], _fmt(r["within"]), _fmt(r["extrapolation"]), _fmt(r["mean"])]
        if with_sampling:
            row += [_fmt(r.get("ms_per_token", math.nan), 2), _fmt(r.get("state_kib", math.nan), 0)]
        rows.append(row)
    _write_table(out_dir, "nll", header, rows)
    return results


def compare_style(runs: dict[str, Path], out_dir: Path, n_segments: int = 4) -> dict[str, dict[str, list[float]]]:
    """Median style similarity per model, metric and segment (table) and a grouped box plot."""
    per_model = {}
    for name, folder in runs.items():
        found = _found(folder, "style.csv")
        if len(found) != 1:
            raise DataError(f"{folder}: expected one style.csv from `musegen evaluate style`, found {len(found)}")
        per_model[name] = [r | {"segment": int(r["segment"]), "similarity": float(r["similarity"])}
                           for r in _read_rows(found[0])]
    table = {name: medians(rows, n_segments) for name, rows in per_model.items()}
    metrics = [m for m in METRICS if any(m in t for t in table.values())]
    header = ["model", "metric"] + [f"Q{s}" for s in range(1, n_segments + 1)]
    rows = [[name, metric] + [_fmt(v, 2) for v in values]
            for name, t in table.items() for metric, values in t.items()]
    _write_table(out_dir, "style", header, rows)

    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.8), squeeze=False)
    width = 0.8 / len(per_model)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, metric in zip(axes[0], metrics):
        for i, (name, model_rows) in enumerate(per_model.items()):
            data = [[r["similarity"] for r in model_rows if r["metric"] == metric and r["segment"] == s
                     and not math.isnan(r["similarity"])] or [math.nan] for s in range(1, n_segments + 1)]
            positions = np.arange(1, n_segments + 1) - 0.4 + width * (i + 0.5)
            box = ax.boxplot(data, positions=positions, widths=width * 0.9, showfliers=False, patch_artist=True)
            for patch in box["boxes"]:
                patch.set(facecolor=colors[i % len(colors)], alpha=0.6)
            ax.plot([], [], color=colors[i % len(colors)], lw=6, alpha=0.6, label=name)
        ax.set_xticks(range(1, n_segments + 1), [f"Q{s}" for s in range(1, n_segments + 1)])
        ax.set_ylim(0, 1)
        ax.set_title(metric)
        ax.set_xlabel("quarter of the continuation")
    axes[0][0].set_ylabel("cosine similarity to the style's reference")
    axes[0][-1].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    save_png(fig, out_dir / "style.png", dpi=110)
    return table


def compare(runs: dict[str, str | os.PathLike], out_dir: str | os.PathLike, train_len: int | None = None,
            n_segments: int = 4) -> dict[str, Any]:
    """Every comparison the folders allow: loss when each holds an nll_*.csv, style when each holds a style.csv."""
    folders = {name: Path(p) for name, p in runs.items()}
    for name, folder in folders.items():
        if not folder.is_dir():
            raise DataError(f"{folder}: no such folder (model {name!r})")
    out_dir = Path(out_dir)
    report: dict[str, Any] = {}
    if all(_found(f, "nll_*.csv") for f in folders.values()):
        if train_len is None:
            raise DataError("comparing losses needs the training length (--train-len)")
        report["loss"] = compare_loss(folders, train_len, out_dir)
    if all(_found(f, "style.csv") for f in folders.values()):
        report["style"] = compare_style(folders, out_dir, n_segments)
    if report and all(read_training(f) for f in folders.values()):
        report["training"] = compare_training(folders, out_dir)
    if not report:
        raise DataError("nothing to compare: give every model folder nll_<split>.csv "
                        "(musegen evaluate loss) or style.csv (musegen evaluate style)")
    return report
