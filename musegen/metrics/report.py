"""Every table and figure the evaluations write: Markdown and CSV tables, box plots, per-quarter
lines, NLL against position. Runners compute; this module only lays out what they computed."""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..io import write_json, write_text
from ..plots import pyplot, save_png
from .metric import QUARTERS

# ---- tables -------------------------------------------------------------------------------------


def fmt(value: float, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_table(out_dir: Path, name: str, header: list[str], rows: list[list[str]], note: str = "") -> None:
    """`<name>.md` (the table, then `note`) and `<name>.csv` (the table) in `out_dir`."""
    write_text(out_dir / f"{name}.md", _markdown(header, rows) + (f"\n{note}\n" if note else ""))
    buffer = io.StringIO()  # the csv module quotes cells such as "3,329,869"
    csv.writer(buffer, lineterminator="\n").writerows([header] + rows)
    write_text(out_dir / f"{name}.csv", buffer.getvalue())


def write_rows_csv(path: str | os.PathLike, rows: list[dict]) -> None:
    """A CSV of dict rows, the columns in the order they first appear."""
    buffer = io.StringIO()
    fields = list(dict.fromkeys(key for row in rows for key in row)) if rows else ["generated"]
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buffer.getvalue())


TWO_SAMPLE_COLUMNS = ("comparison", "auc", "auc_low", "auc_high", "bars", "real_bars", "songs", "telling_features")


def write_two_sample(out_dir: Path, results: dict, note: str = "", telling: int = 3) -> None:
    """`two_sample.md`/`.csv`, a row per comparison ({name: a `two_sample.TwoSample`}): the AUC,
    its 95% interval, the bars on each side, the songs, and the `telling` features farthest from
    0.5 with their own AUC; `two_sample.json`, every field of every comparison."""
    cells = [
        [name, fmt(r.auc), fmt(r.low), fmt(r.high), str(r.bars[0]), str(r.bars[1]), str(r.songs)]
        + ["; ".join(f"{feature} {fmt(auc, 2)}" for feature, auc in r.telling[:telling])]
        for name, r in results.items()
    ]
    write_table(out_dir, "two_sample", list(TWO_SAMPLE_COLUMNS), cells, note)
    write_json(out_dir / "two_sample.json", json_safe({name: vars(r) for name, r in results.items()}))


def json_safe(value):
    """NaN -> None (JSON has no NaN), recursively."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


# ---- figures ------------------------------------------------------------------------------------


def _panel_grid(count: int):
    """A figure of `count` small panels, four to a row (the unused ones hidden): (figure, axes)."""
    columns = 4
    rows = math.ceil(count / columns)
    fig, axes = pyplot().subplots(rows, columns, figsize=(3.2 * columns, 2.4 * rows), squeeze=False)
    for ax in axes.ravel()[count:]:
        ax.axis("off")
    return fig, axes.ravel()


def plot_quarters(series: dict[str, dict[str, list[float]]], path: Path) -> None:
    """One panel per metric, one line per label ({label: {metric: [Q1..Q4 values]}}): a model's
    solid, the real spans' ("real") dashed and the floor's ("floor") dotted, in black and grey."""
    metrics = list(dict.fromkeys(m for values in series.values() for m in values))
    fig, axes = _panel_grid(len(metrics))
    x = np.arange(1, QUARTERS + 1)
    looks = {"real": dict(ls="--", marker="s", color="black"), "floor": dict(ls=":", marker="^", color="grey")}
    for ax, metric in zip(axes, metrics):
        for label, values in series.items():
            if metric in values:
                ax.plot(x, values[metric], label=label, **looks.get(label, dict(ls="-", marker="o")))
        ax.set_xticks(x, [f"Q{q}" for q in x])
        ax.set_title(metric, fontsize=9)
        ax.tick_params(labelsize=8)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


def plot_boxes(pooled: dict[str, dict[str, np.ndarray]], sources: tuple[str, ...], path: Path) -> None:
    """One panel per metric: box plots of each source's values ({metric: {source: values}})."""
    fig, axes = _panel_grid(len(pooled))
    for ax, (metric, by) in zip(axes, pooled.items()):
        data = [by[s][np.isfinite(by[s])] for s in sources]
        ax.boxplot([d if len(d) else [math.nan] for d in data], showfliers=False)
        ax.set_xticks(range(1, len(sources) + 1), sources)
        ax.set_title(metric, fontsize=9)
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    save_png(fig, path)


def plot_segments(values: dict[str, list[list[float]]], path: str | os.PathLike) -> None:
    """One panel per metric, one box per segment of the continuation ({metric: [each segment's
    similarities]}; paper Fig. 5)."""
    fig, axes = pyplot().subplots(1, len(values), figsize=(4 * len(values), 3.5), squeeze=False)
    for ax, (metric, data) in zip(axes[0], values.items()):
        ax.boxplot([d if d else [math.nan] for d in data], showfliers=False)
        ax.set_xticks(range(1, len(data) + 1), [f"Q{s}" for s in range(1, len(data) + 1)])
        ax.set_ylim(0, 1)
        ax.set_title(metric)
        ax.set_xlabel("segment of the continuation")
    axes[0][0].set_ylabel("cosine similarity to reference")
    fig.tight_layout()
    save_png(fig, path)


def plot_grouped_segments(values: dict[str, dict[str, list[list[float]]]], path: str | os.PathLike) -> None:
    """Box plots per segment, one colour per model, one panel per metric ({model: {metric: [each
    segment's values]}}; paper Fig. 5 with several models)."""
    metrics = list(dict.fromkeys(m for by_metric in values.values() for m in by_metric))
    segments = max(len(data) for by_metric in values.values() for data in by_metric.values())
    fig, axes = pyplot().subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.6), squeeze=False)
    width = 0.8 / len(values)
    for ax, metric in zip(axes[0], metrics):
        for i, by_metric in enumerate(values.values()):
            data = by_metric.get(metric, [[]] * segments)
            positions = np.arange(1, segments + 1) - 0.4 + width * (i + 0.5)
            box = ax.boxplot(
                [d or [math.nan] for d in data],
                positions=positions,
                widths=width * 0.9,
                showfliers=False,
                patch_artist=True,
            )
            for patch in box["boxes"]:
                patch.set_facecolor(f"C{i}")
        for i, label in enumerate(values):
            ax.plot([], [], color=f"C{i}", lw=6, label=label)
        ax.set_xticks(range(1, segments + 1), [f"Q{s}" for s in range(1, segments + 1)])
        ax.set_ylim(0, 1)
        ax.set_title(metric)
        ax.set_xlabel("segment of the continuation")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("cosine similarity to reference")
    fig.tight_layout()
    save_png(fig, Path(path))


def plot_validation(trends: dict[str, list[dict[str, float]]], path: Path) -> None:
    """Each model's validation NLL within and beyond L by training step, and the gap between them."""
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(9, 3.5))
    for name, trend in trends.items():
        steps = [v["step"] for v in trend]
        (line,) = left.plot(steps, [v["within"] for v in trend], marker="o", ms=3, label=f"{name} within L")
        left.plot(
            steps,
            [v["beyond"] for v in trend],
            marker="o",
            ms=3,
            ls="--",
            color=line.get_color(),
            label=f"{name} beyond L",
        )
        right.plot(steps, [v["beyond"] - v["within"] for v in trend], marker="o", ms=3, label=name)
    left.set(xlabel="training step", ylabel="validation NLL (nats)")
    right.set(xlabel="training step", ylabel="beyond L - within L (nats)")
    right.axhline(0, color="k", lw=0.8)
    left.legend(fontsize=7)
    right.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)


# ---- NLL per position ---------------------------------------------------------------------------


def write_position_nll(
    out_dir: str | os.PathLike, name: str, sums: np.ndarray, counts: np.ndarray, train_len: int, title: str = ""
) -> dict[str, Path]:
    """`<name>.csv` (position, nll, count) and `<name>.png` (NLL against position), atomically."""
    out_dir = Path(out_dir)
    nll = np.divide(sums, counts, out=np.full(len(sums), np.nan), where=counts > 0)
    rows = ["position,nll,count"] + [
        f"{t},{'' if np.isnan(v) else f'{v:.6f}'},{c}" for t, (v, c) in enumerate(zip(nll, counts))
    ]
    csv_path, png_path = out_dir / f"{name}.csv", out_dir / f"{name}.png"
    write_text(csv_path, "\n".join(rows) + "\n")
    fig, ax = pyplot().subplots(figsize=(7, 3.5))
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


def read_position_nll(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(NLL, token count) for every position of a CSV written by `musegen evaluate loss`; the NLL
    is NaN at positions no piece reached."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not any(r.get("nll") for r in rows):
        raise DataError(f"{path}: no per-position NLL rows (expected a `musegen evaluate loss` CSV)")
    return (
        np.array([float(r["nll"]) if r["nll"] else math.nan for r in rows]),
        np.array([int(r["count"]) for r in rows]),
    )


def plot_position_nll(
    curves: dict[str, str | os.PathLike], train_len: int | None, path: str | os.PathLike, smooth: int = 32
) -> dict[str, dict[str, float]]:
    """Several models' NLL against position in one figure (paper Fig. 3), with a running mean of
    `smooth` positions; returns each model's mean of the per-position NLL within and beyond
    `train_len` (positions weigh the same; `musegen evaluate loss` weighs tokens)."""
    fig, ax = pyplot().subplots(figsize=(7, 3.5))
    summary = {}
    for label, csv_path in curves.items():
        nll, counts = read_position_nll(csv_path)
        positions = np.flatnonzero(counts > 0)
        nll = nll[positions]
        window = max(1, min(smooth, len(nll)))
        trend = np.convolve(nll, np.ones(window) / window, mode="valid")
        ax.plot(positions[window - 1 :], trend, lw=1.2, label=label)
        split = train_len if train_len is not None else int(positions.max()) + 1
        summary[label] = {
            "within": float(nll[positions < split].mean()) if (positions < split).any() else math.nan,
            "beyond": float(nll[positions >= split].mean()) if (positions >= split).any() else math.nan,
        }
    if train_len is not None:
        ax.axvline(train_len, color="k", ls="--", lw=1, label="training length")
    ax.set_xlabel("token position")
    ax.set_ylabel(f"NLL (nats, running mean of {smooth})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, Path(path))
    return summary
