"""The recall measure (musegen/evaluation/run_recall.py): NLL by bar on unseen random loops.

Its claim is that the recall gain tells a copier from a model that copies nothing. Two stand-in
models pin that down: one that spreads its mass evenly (every bar costs log V, gain 0) and one
that copies the token one period back (after the first period every token is certain, so the
gain is the first bars' whole cost)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from musegen.evaluation.run_recall import BARS, nll_by_bar, recall_row
from musegen.music.loops import HELD_OUT_SEEDS, random_loop_piece
from musegen.tokenizers.groove_dur import BAR_UNITS, GrooveDurTokenizer, times_after

TOK = GrooveDurTokenizer()


class Uniform(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*ids.shape, self.vocab) + self.weight


class Copier(Uniform):
    """Predicts, for sure, the token one period back: the period is the sequence's own (the
    shortest shift under which its second half repeats, padding left out), which only a loop whose chords repeat
    with its pattern has."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = super().forward(ids).clone()
        for row, seq in enumerate(ids.tolist()):
            n = seq.index(TOK.pad_id) if TOK.pad_id in seq else len(seq)  # (a batch pads shorter pieces)
            half = n // 2
            period = next(p for p in range(1, half) if seq[half:n] == seq[half - p : n - p])
            for t in range(period - 1, n):
                logits[row, t, seq[t + 1 - period]] = 50.0
        return logits


def periodic_loops(count: int) -> list[np.ndarray]:
    """Held-out loops whose tokens repeat from the second bar on (pattern and chords of equal length)."""
    found = []
    for k in range(HELD_OUT_SEEDS, HELD_OUT_SEEDS + 200):
        ids = TOK.encode(random_loop_piece(k).midi_bytes()).ids
        bars = times_after(ids) // BAR_UNITS
        body = ids[(bars >= 1) & (bars < 9)]  # bars 1..8: whole repeats of a 1- or 2-bar period
        per_bar = len(body) // 8
        if any(np.array_equal(body[: len(body) - p], body[p:]) for p in (per_bar, 2 * per_bar)):
            found.append(ids[: np.searchsorted(bars, 9)])
        if len(found) == count:
            return found
    raise AssertionError("too few loops whose chords repeat with the pattern")


def test_a_model_that_copies_nothing_gains_nothing():
    pieces = [TOK.encode(random_loop_piece(HELD_OUT_SEEDS + k).midi_bytes()).ids for k in range(4)]
    by_bar = nll_by_bar(Uniform(TOK.vocab_size), TOK, pieces)
    assert np.allclose(by_bar, math.log(TOK.vocab_size))
    assert recall_row(by_bar)["recall gain"] == pytest.approx(0.0, abs=1e-9)


def test_a_copier_gains_the_first_bars_whole_cost():
    by_bar = nll_by_bar(Copier(TOK.vocab_size), TOK, periodic_loops(3))
    row = recall_row(by_bar)
    assert np.all(by_bar[4:BARS] < 1e-6)  # the pattern heard twice: every token certain
    assert by_bar[0] > 1.0 and row["recall gain"] == pytest.approx(row["bars 1-2"], abs=1e-6)


def test_the_cli_writes_the_recall_table_beside_the_copy_test(tmp_path):
    """`evaluate copy` on the shipped duration model: both tables, one recall row per model."""
    proc = subprocess.run(
        [sys.executable, "-m", "musegen", "evaluate", "copy", "-c", "checkpoints/groove-dur", "--bars", "1"]
        + ["--samples", "1", "--recall-pieces", "3", "--device", "cpu", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    table = (tmp_path / "recall.md").read_text()
    assert "| groove-dur |" in table and "recall gain" in table and (tmp_path / "recall.png").stat().st_size
    assert (tmp_path / "copy.md").is_file()
