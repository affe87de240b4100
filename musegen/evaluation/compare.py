"""Side-by-side reports of several models' evaluations (the experiments of docs/results.md).

Each model is a folder (a run folder, say) holding, anywhere below it, what `musegen evaluate
loss` (one nll_<split>.csv), `musegen evaluate style` (style.csv), `musegen evaluate continuation
--by-quarter` (continuation_quarters.csv) and `musegen sample` (batch.json or <prompt>.json) wrote
for it. The report holds a table (Markdown and CSV) and one figure per
kind of evaluation found for every model, and, for run folders, the compute each run used and,
where they validated as they trained, their NLL within and beyond the training length by step.
"""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from .. import schemas
from ..errors import DataError, FormatError
from ..generation.outputs import SAMPLE_SUMMARY
from ..metrics.loss import summarize
from ..metrics.report import (
    fmt,
    plot_grouped_segments,
    plot_position_nll,
    plot_quarters,
    plot_validation,
    read_position_nll,
    write_table,
)
from ..metrics.style import STYLE_METRICS
from ..training.run_folder import LOG_RECORD
from .run_continuation import PIECE_RECORD, mean_positions
from .run_style import empty_shares, medians


def labelled_paths(spec: str | None, default: dict[str, Path]) -> dict[str, Path]:
    """The notebooks' inputs: "label=path" entries separated by os.pathsep (a bare path is labelled
    by its folder's name), or `default` when there is no spec."""
    if not spec:
        return dict(default)
    pairs = [
        entry.split("=", 1) if "=" in entry else (Path(entry).parent.name, entry)
        for entry in spec.split(os.pathsep)
        if entry
    ]
    return {label: Path(path) for label, path in pairs}


def _found(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.rglob(pattern))


def _the_one(folder: Path, pattern: str, command: str) -> Path:
    found = _found(folder, pattern)
    if len(found) != 1:
        raise DataError(f"{folder}: expected one {pattern} from `{command}`, found {len(found)}")
    return found[0]


# --- style similarity (paper Fig. 5) ----------------------------------------------------------


def read_style_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a CSV written by `musegen evaluate style`, with numbers parsed."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"metric", "segment", "similarity"} <= set(rows[0]):
        raise DataError(f"{path}: not a `musegen evaluate style` CSV")
    for row in rows:
        row["segment"] = int(row["segment"])
        row["similarity"] = float(row["similarity"]) if row["similarity"] not in ("", "nan") else math.nan
        if row.get("generated_notes", "") != "":
            row["generated_notes"] = int(row["generated_notes"])
    return rows


def plot_style_comparison(
    tables: dict[str, str | os.PathLike | list[dict[str, Any]]], path: str | os.PathLike
) -> dict[str, dict[str, list[float]]]:
    """Box plots of style similarity per segment, one colour per model, one panel per metric
    (paper Fig. 5); returns the medians per model, metric and segment. A table is a
    `musegen evaluate style` CSV or its rows."""
    rows = {label: p if isinstance(p, list) else read_style_rows(p) for label, p in tables.items()}
    segments = max(r["segment"] for table in rows.values() for r in table)
    metrics = [m for m in STYLE_METRICS if any(r["metric"] == m for table in rows.values() for r in table)]
    values = {
        label: {
            metric: [
                [
                    r["similarity"]
                    for r in table
                    if r["metric"] == metric and r["segment"] == s and not math.isnan(r["similarity"])
                ]
                for s in range(1, segments + 1)
            ]
            for metric in metrics
        }
        for label, table in rows.items()
    }
    plot_grouped_segments(values, path)
    return {label: medians(table, segments) for label, table in rows.items()}


# --- run folders side by side (`musegen evaluate compare`) -------------------------------------


def read_sampling(folder: Path) -> dict[str, float] | None:
    """Generation speed and recurrent-state size from a `musegen sample` summary, if one is there."""
    for path in _found(folder, "batch.json") + _found(folder, "*.json"):
        try:
            stats = schemas.read(path, SAMPLE_SUMMARY).stats
        except FormatError:  # another JSON file in the folder
            continue
        return {
            "ms_per_token": 1000.0 / stats.tokens_per_second if stats.tokens_per_second else math.nan,
            "state_kib": (stats.state_bytes if stats.state_bytes is not None else math.nan) / 1024,
        }
    return None


def read_jsonl(path: Path, format: schemas.Format) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (blank lines skipped), each checked as `format`."""
    return [
        schemas.loads(line, format, path).model_dump(by_alias=True, exclude_unset=True)
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def read_log(folder: Path) -> list[dict[str, Any]]:
    """A run folder's log.jsonl records (none when the folder is not a run)."""
    path = folder / "log.jsonl"
    return read_jsonl(path, LOG_RECORD) if path.is_file() else []


def read_training(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Compute a run used, from its log records: parameters, steps, tokens, wall time, last loss."""
    steps = [r for r in records if "loss" in r and "time" in r]
    if not steps:
        return None
    # Wall time between the logged steps of each session (a resumed run's pause between
    # sessions is not compute), and the steps before each session's first record at that rate.
    seconds = timed_steps = 0.0
    session: list[dict[str, Any]] = []
    for record in records + [{"event": "end"}]:
        if record.get("event") in ("start", "resume", "end") and session:
            seconds += session[-1]["time"] - session[0]["time"]
            timed_steps += session[-1]["step"] - session[0]["step"]
            session = []
        elif "loss" in record and "time" in record:
            session.append(record)
    last = steps[-1]
    starts = [r for r in records if r.get("event") in ("start", "resume")]
    return {
        "parameters": starts[0].get("parameters") if starts else None,
        "steps": last["step"],
        "tokens": last["tokens"],
        "minutes": seconds * last["step"] / max(timed_steps, 1) / 60,
        "loss": last["loss"],
    }


def compare_training(runs: dict[str, dict[str, Any]], out_dir: Path) -> list[dict[str, Any]]:
    """Compute per model (`read_training`'s): parameters, steps, tokens, wall minutes and the last
    logged training loss."""
    rows = [{"model": name, **training} for name, training in runs.items()]
    header = ["model", "parameters", "steps", "tokens", "wall minutes", "last training loss"]
    write_table(
        out_dir,
        "training",
        header,
        [
            [
                r["model"],
                f"{r['parameters']:,}" if r["parameters"] else "-",
                str(r["steps"]),
                f"{r['tokens']:,}",
                f"{r['minutes']:.0f}",
                fmt(r["loss"]),
            ]
            for r in rows
        ],
    )
    return rows


def read_validation(records: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The validations a run logged as it trained (`valid_every`): step, NLL within the
    training length and beyond it (positions up to `valid_len`)."""
    return [
        {"step": r["step"], "within": r["valid_loss"], "beyond": r.get("valid_extrapolation", math.nan)}
        for r in records
        if "valid_loss" in r
    ]


def compare_validation(trends: dict[str, list[dict[str, float]]], out_dir: Path) -> dict[str, list[dict[str, float]]]:
    """Each model's validation NLL (`read_validation`'s) within and beyond L as training went on,
    and the gap between them (table and figure): whether extrapolation departs from the training
    length with training."""
    write_table(
        out_dir,
        "validation",
        ["model", "step", "within L", "beyond L", "beyond - within"],
        [
            [name, str(v["step"]), fmt(v["within"]), fmt(v["beyond"]), fmt(v["beyond"] - v["within"])]
            for name, trend in trends.items()
            for v in trend
        ],
    )
    plot_validation(trends, out_dir / "validation.png")
    return trends


def compare_loss(runs: dict[str, Path], train_len: int, out_dir: Path) -> list[dict[str, Any]]:
    """Within / extrapolation NLL per model, token-weighted as `musegen evaluate loss` reports it
    (table), and all the NLL curves in one plot."""
    curves = {name: _the_one(folder, "nll_*.csv", "musegen evaluate loss") for name, folder in runs.items()}
    results = []
    for name, csv_path in curves.items():
        nll, counts = read_position_nll(csv_path)
        result = {"model": name, **summarize(np.nan_to_num(nll) * counts, counts, train_len)}
        result.update(read_sampling(runs[name]) or {})
        results.append(result)
    plot_position_nll(curves, train_len, out_dir / "nll.png")

    with_sampling = any("ms_per_token" in r for r in results)
    header = ["model", f"within (< {train_len})", f"extrapolation ({train_len}..{results[0]['max_len'] - 1})", "all"]
    header += ["ms / generated token", "state KiB"] if with_sampling else []
    rows = []
    for r in results:
        row = [r["model"], fmt(r["within"]), fmt(r["extrapolation"]), fmt(r["mean"])]
        if with_sampling:
            row += [fmt(r.get("ms_per_token", math.nan), 2), fmt(r.get("state_kib", math.nan), 0)]
        rows.append(row)
    write_table(out_dir, "nll", header, rows)
    return results


def compare_style(runs: dict[str, Path], out_dir: Path) -> dict[str, dict[str, list[float]]]:
    """Median style similarity per model, metric and segment, with the share of empty segments
    (table), the grouped box plot, and the models' losses of style over the segments
    (`compare_style_drops`). Where the first model's folder holds the ceiling and floor of
    `evaluate style --baselines` (style_baselines.csv), they are rows and boxes of their own."""
    tables = {
        name: read_style_rows(_the_one(folder, "style.csv", "musegen evaluate style")) for name, folder in runs.items()
    }
    compare_style_drops(tables, out_dir)
    for path in _found(next(iter(runs.values())), "style_baselines.csv")[:1]:
        baselines = read_style_rows(path)
        tables |= {
            kind: part
            for kind in ("ceiling", "floor")
            for part in [[r for r in baselines if r.get("baseline") == kind]]
            if part
        }
    table = plot_style_comparison(tables, out_dir / "style.png")
    segments = max(len(values) for t in table.values() for values in t.values())
    header = ["model", "metric"] + [f"Q{s} (empty)" for s in range(1, segments + 1)]
    cells = []
    for name, by_metric in table.items():
        empty = empty_shares(tables[name], segments)
        cells += [
            [name, metric] + [f"{fmt(v, 2)} ({fmt(100 * e, 0)}%)" for v, e in zip(values, empty[metric])]
            for metric, values in by_metric.items()
        ]
    write_table(
        out_dir,
        "style",
        header,
        cells,
        "Median style similarity per quarter of the continuation (an "
        "empty segment scores 0), and in brackets the share of empty segments; ceiling: the references' own "
        "bars after the prompt; floor: another style's (`musegen evaluate style --baselines`).",
    )
    return table


def _style_drops(rows: list[dict[str, Any]], metric: str, last: int) -> dict[tuple, float]:
    """{(generated, reference, track): similarity in segment 1 minus in segment `last`} for the
    comparisons of `metric` that score both."""
    scores: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["metric"] == metric and r["segment"] in (1, last) and not math.isnan(r["similarity"]):
            scores[(r.get("generated"), r.get("reference"), r.get("track"))][r["segment"]] = r["similarity"]
    return {key: s[1] - s[last] for key, s in scores.items() if len(s) == 2}


def compare_style_drops(
    tables: dict[str, list[dict[str, Any]]], out_dir: Path, resamples: int = 2000
) -> list[dict[str, Any]]:
    """How much of the style each model loses from the first segment to the last (the paper's
    claim that SPE keeps it while APE loses it): the mean drop over the comparisons, and against
    the first model the mean paired difference (the first model's drop minus this model's, on
    the same prompts and roles) with a 95% bootstrap interval over those pairs (seeded). An
    interval above 0: this model keeps the style better than the first one."""
    last = max(r["segment"] for table in tables.values() for r in table)
    first = next(iter(tables))
    rng = np.random.default_rng(0)
    results = []
    for metric in STYLE_METRICS:
        base = _style_drops(tables[first], metric, last)
        for name, table in tables.items():
            drops = base if name == first else _style_drops(table, metric, last)
            if not drops:
                continue
            row = {
                "model": name,
                "metric": metric,
                "drop": float(np.mean(list(drops.values()))),
                "comparisons": len(drops),
            }
            pairs = sorted(base.keys() & drops.keys())
            if name != first and pairs:
                gaps = np.array([base[key] - drops[key] for key in pairs])
                means = rng.choice(gaps, (resamples, len(gaps))).mean(axis=1)
                row |= {
                    "vs_first": float(gaps.mean()),
                    "low": float(np.quantile(means, 0.025)),
                    "high": float(np.quantile(means, 0.975)),
                    "pairs": len(pairs),
                }
            results.append(row)
    header = [
        "model",
        "metric",
        f"Q1 - Q{last} (mean)",
        "comparisons",
        f"{first}'s drop minus this one's",
        "95% interval",
        "pairs",
    ]
    write_table(
        out_dir,
        "style_drop",
        header,
        [
            [r["model"], r["metric"], fmt(r["drop"]), str(r["comparisons"])]
            + (
                [fmt(r["vs_first"]), f"[{fmt(r['low'])}, {fmt(r['high'])}]", str(r["pairs"])]
                if "vs_first" in r
                else ["-", "-", "-"]
            )
            for r in results
        ],
        f"Mean loss of style similarity from the first quarter of the continuation to the last, per comparison "
        f"(prompt and role; empty segments score 0), and against {first} the mean paired difference of the drops "
        f"with a 95% bootstrap interval ({resamples} resamples of the pairs, seed 0): above 0, the model keeps "
        f"the style better than {first}.",
    )
    return results


def read_quarters(path: Path) -> dict[str, dict[tuple[str, str], list[float]]]:
    """{source: {(metric, statistic): [Q1..Q4]}} (sources model, real, floor; statistics mean and
    median) from the continuation_quarters.csv of `musegen evaluate continuation --by-quarter`."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"model Q1", "statistic"} <= set(rows[0]):
        raise DataError(f"{path}: not a continuation_quarters.csv of `musegen evaluate continuation --by-quarter`")
    number = lambda cell: math.nan if cell in ("", "-") else float(cell)  # noqa: E731
    return {
        source: {(r["metric"], r["statistic"]): [number(r[f"{source} Q{q}"]) for q in range(1, 5)] for r in rows}
        for source in ("model", "real", "floor")
    }


def mean_quarter_starts(folder: Path) -> list[float]:
    """Mean token position where each quarter of the model's continuations begins (pieces.jsonl)."""
    means = mean_positions(read_jsonl(folder / "pieces.jsonl", PIECE_RECORD))
    return [math.nan] * 4 if means is None else means[:4].tolist()


def compare_continuation(runs: dict[str, Path], out_dir: Path) -> dict[str, dict[tuple[str, str], list[float]]]:
    """Each model's continuation metrics per quarter (means and medians) beside the real and floor
    spans' (taken from the first model's evaluation: every model continued the same pieces), with
    the mean token position where the model's quarters begin (table; the figure draws medians)."""
    paths = {
        name: _the_one(folder, "continuation_quarters.csv", "musegen evaluate continuation --by-quarter")
        for name, folder in runs.items()
    }
    tables = {name: read_quarters(path) for name, path in paths.items()}
    first = next(iter(tables.values()))
    series = {name: table["model"] for name, table in tables.items()} | {"real": first["real"], "floor": first["floor"]}
    rows = [
        [name, "quarter start position", "mean"] + [f"{v:,.0f}" for v in mean_quarter_starts(paths[name].parent)]
        for name in tables
    ]
    rows += [
        [label, metric, statistic] + [fmt(v) for v in values]
        for label, table in series.items()
        for (metric, statistic), values in table.items()
    ]
    write_table(
        out_dir,
        "continuation",
        ["source", "metric", "statistic", "Q1", "Q2", "Q3", "Q4"],
        rows,
        "Per quarter of the continued bars; real and floor: the same spans of the real pieces "
        "and of other pieces (`musegen evaluate continuation`, docs/evaluation.md).",
    )
    plot_quarters(
        {
            label: {metric: values for (metric, statistic), values in table.items() if statistic == "median"}
            for label, table in series.items()
        },
        out_dir / "continuation.png",
    )
    return series


def compare(
    runs: dict[str, str | os.PathLike], out_dir: str | os.PathLike, train_len: int | None = None
) -> dict[str, Any]:
    """Every comparison the folders allow: loss when each holds an nll_*.csv, style when each holds a
    style.csv, continuation per quarter when each holds a continuation_quarters.csv."""
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
        report["style"] = compare_style(folders, out_dir)
    if all(_found(f, "continuation_quarters.csv") for f in folders.values()):
        report["continuation"] = compare_continuation(folders, out_dir)
    logs = {name: read_log(folder) for name, folder in folders.items()}  # each run's log, read once
    training = {name: read_training(records) for name, records in logs.items()}
    if report and all(training.values()):
        report["training"] = compare_training(training, out_dir)
    validations = {name: read_validation(records) for name, records in logs.items()}
    if report and all(validations.values()):
        report["validation"] = compare_validation(validations, out_dir)
    if not report:
        raise DataError(
            "nothing to compare: give every model folder nll_<split>.csv (musegen evaluate loss), "
            "style.csv (musegen evaluate style) or continuation_quarters.csv "
            "(musegen evaluate continuation --by-quarter)"
        )
    return report
