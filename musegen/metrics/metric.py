"""The metric interface: what every measure of a piece computes on, and how its values add up.

A `Metric` computes on a `Span`: bars first_bar .. first_bar + bars - 1 of a piece's `NoteTable`,
with the context the metric declares in `needs` (the prompt's pitch classes, the real piece's
style profiles, its roles: whatever the runner puts in `Span.context`). A span whose context
lacks one of them is not measured by that metric (a single-track piece has no roles).

`compute` returns {name: value}: a float is one observation, a list several (one per role, say).
Runners pool the observations of every span of a source (model, real, floor) and report their
`STATISTICS` (mean and median, NaN left out: a metric a span could not have). `per_quarter`
says how a metric follows a long span: False, it is measured on the whole span and, when asked,
again on each quarter of it ("<name> Q<q>"); True, it reports each quarter itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from ..music.notes import NoteTable

QUARTERS = 4


@dataclass(frozen=True)
class Span:
    notes: NoteTable
    first_bar: int
    bars: int
    context: dict[str, Any] = field(default_factory=dict)


class Metric:
    """One measure of a span (see the module docstring); subclasses set `needs` and `per_quarter`
    and define `compute`."""

    needs: tuple[str, ...] = ()
    per_quarter: bool = False

    def compute(self, span: Span) -> dict[str, float | list[float]]:
        raise NotImplementedError

    def applies(self, span: Span) -> bool:
        return all(key in span.context for key in self.needs)


def measure(metrics: Sequence[Metric], span: Span, by_quarter: bool = False) -> dict[str, list[float]]:
    """Every metric that applies to `span`, each value as a list of observations: the whole-span
    metrics, then the ones that report quarters themselves, then with `by_quarter` the whole-span
    metrics of each quarter ("<name> Q<q>"; `span.bars` a multiple of QUARTERS)."""
    usable = [m for m in metrics if m.applies(span)]

    def observed(metric: Metric, part: Span, suffix: str = "") -> dict[str, list[float]]:
        return {f"{name}{suffix}": v if isinstance(v, list) else [v] for name, v in metric.compute(part).items()}

    values: dict[str, list[float]] = {}
    for metric in [m for m in usable if not m.per_quarter] + [m for m in usable if m.per_quarter]:
        values |= observed(metric, span)
    if by_quarter:
        size = span.bars // QUARTERS
        for q in range(QUARTERS):
            quarter = replace(span, first_bar=span.first_bar + q * size, bars=size)
            for metric in (m for m in usable if not m.per_quarter):
                values |= observed(metric, quarter, f" Q{q + 1}")
    return values


def quarter_edges(span: Span) -> np.ndarray:
    """The QUARTERS + 1 bar positions that cut the span into equal quarters (fractional bars when
    `bars` is not a multiple of QUARTERS)."""
    return np.linspace(span.first_bar, span.first_bar + span.bars, QUARTERS + 1)


def nan_mean(values) -> float:
    """Mean of the finite values (NaN marks a value a span could not have); NaN if none."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(finite.mean()) if len(finite) else math.nan


def nan_median(values) -> float:
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(np.median(finite)) if len(finite) else math.nan


# Tables give both: a few runaway samples move a mean far from what most samples do.
STATISTICS = {"mean": nan_mean, "median": nan_median}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two histograms; NaN when either is empty."""
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return math.nan
    return float(np.dot(a.ravel().astype(float), b.ravel().astype(float)) / (na * nb))
