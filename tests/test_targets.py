"""scripts/experiments/groove_targets.py: issue #28's table built from real outputs of `evaluate
continuation` (a tiny groove model on MMA renders of the golden set, and on the Freedoom tunes as a
folder of MIDI) and `evaluate copy`, each value checked against the per-piece results it comes from."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import DATA, GOLDEN, REPO
from tiny_models import tiny_checkpoint

from data_prep.common import Item, prepare
from musegen.cli import run_command
from musegen.evaluation.run_continuation import ContinuationSettings, evaluate_continuation
from musegen.evaluation.run_copy import evaluate_copy
from musegen.generation.settings import SampleSettings
from musegen.tokenizers.groove import GrooveTokenizer

sys.path.insert(0, str(REPO / "scripts" / "experiments"))  # the acceptance table is an experiment script
from groove_targets import MMA_PIECES, ContinuationRun, command, groove_targets, midi_checks, mma_checks  # noqa: E402

MMA_FILES = sorted((GOLDEN / "groove_spe").glob("mma_*.mid"))[:6]
FREEDOOM = DATA / "multitrack"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_torch_thread):
    """The three outputs of a tiny groove model: MMA pieces, the Freedoom tunes, the copy test."""
    root = tmp_path_factory.mktemp("targets")
    items = [Item(name=p.stem, path=p, group=p.stem) for p in MMA_FILES]
    prepare(GrooveTokenizer(), items, root / "data", {"test": 1.0}, workers=1, split_of=lambda group: "test")
    ckpt = tiny_checkpoint("groove", root / "ckpt")
    settings = ContinuationSettings(prompt_bars=2, sample=SampleSettings(bars=4, num_samples=2, seed=0))
    evaluate_continuation(ckpt, root / "data", root / "mma", settings, split="test", device="cpu", progress=False)
    evaluate_continuation(
        ckpt,
        FREEDOOM,
        root / "midi",
        ContinuationSettings(prompt_bars=2, sample=SampleSettings(bars=4, num_samples=1, seed=0)),
        device="cpu",
        progress=False,
    )
    evaluate_copy(
        {"tiny": ckpt},
        root / "copy",
        settings=SampleSettings(bars=2, num_samples=1, seed=0),
        device="cpu",
        progress=False,
    )
    return root


def records(folder):
    return [json.loads(line) for line in (folder / "pieces.jsonl").read_text().splitlines()]


def pooled(folder, source: str, metric: str) -> np.ndarray:
    """Every value of `metric` of `source` (model, real, floor) in a run's per-piece results (a
    piece of one role has no style values)."""
    values = []
    for record in records(folder):
        spans = record[source] if source == "model" else [record[source]]
        values += [math.nan if v is None else v for span in spans for v in span.get(metric, [])]
    return np.array(values, dtype=np.float64)


def finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def test_the_table_reads_each_criterion_from_the_runs(runs):
    result = groove_targets(runs / "table", runs / "mma", runs / "midi", runs / "copy")
    checks = {(c.part.split(" (")[0], c.criterion.split(" (")[0]): c for c in result["checks"]}
    protocol = checks[("MMA test styles", "pieces")]
    assert protocol.model == len(MMA_FILES) < MMA_PIECES and protocol.passed is False  # too few pieces
    for metric, least in (("time-pitch", 0.6), ("onset-duration", 0.5), ("onset-drum", 0.7)):
        check = checks[("MMA test styles", f"style {metric} Q1")]
        model = finite(pooled(runs / "mma", "model", f"style {metric} Q1"))
        assert len(model) >= 2 * (len(MMA_FILES) - 1)  # samples x roles of the pieces with roles
        assert check.model == pytest.approx(np.median(model)) and check.passed == (np.median(model) >= least)
        assert check.real == pytest.approx(np.median(finite(pooled(runs / "mma", "real", f"style {metric} Q1"))))
    for role in ("bass", "other"):
        notes = checks[("MMA test styles", f"{role} notes per bar")]
        model, real = (pooled(runs / "mma", s, f"{role} notes per bar").mean() for s in ("model", "real"))
        assert (notes.model, notes.real) == pytest.approx((model, real))
        assert notes.passed == (abs(model / real - 1) <= 0.25)
        durations = checks[("real MIDI", f"{role} median duration, beats")]
        model, real = (
            np.median(finite(pooled(runs / "midi", s, f"{role} median duration"))) for s in ("model", "real")
        )
        assert (durations.model, durations.real) == pytest.approx((model, real))
        assert durations.passed == (0.5 <= model / real <= 2)
    drum = checks[("real MIDI", "style onset-drum Q1")]
    assert drum.floor == pytest.approx(np.median(finite(pooled(runs / "midi", "floor", "style onset-drum Q1"))))
    assert drum.passed == (drum.model > drum.floor)
    copy = json.loads((runs / "copy" / "copy.json").read_text())["table"]
    tiny = checks[("copy test", "tiny: mean F1 per bar")]
    assert tiny.model == pytest.approx(copy[0]["mean"]) and tiny.real == pytest.approx(1.0)  # the loop's ceiling
    assert tiny.passed is None and result["checks"][-1].part == "docs" and result["checks"][-1].passed is None
    table = (runs / "table" / "done_when.md").read_text()
    assert table.count("\n| ") == len(result["checks"]) and "| FAIL |" in table
    saved = json.loads((runs / "table" / "done_when.json").read_text())
    assert len(saved["checks"]) == len(result["checks"]) and saved["decided"] == len(result["checks"]) - 2
    assert saved["runs"]["MMA test styles"]["prompt_bars"] == 2 and saved["runs"]["real MIDI"]["split"] == "midi"
    assert saved["runs"]["copy test"]["checkpoints"] == {"tiny": str(runs / "ckpt")}


def test_a_model_that_plays_the_real_bars_meets_the_ratio_targets_and_not_the_floor_test(runs, tmp_path):
    """The real continuation put in the model's place: counts, durations and pitch agree exactly;
    the floor comparison is strict, so the floor in the model's place does not beat the floor."""
    for part, source in (("mma", "real"), ("midi", "floor")):
        folder = tmp_path / part
        folder.mkdir()
        shutil.copy(runs / part / "run.json", folder)
        lines = [json.dumps(r | {"model": [r[source]]}) for r in records(runs / part)]
        (folder / "pieces.jsonl").write_text("\n".join(lines) + "\n")
    mma = {c.criterion.split(" (")[0]: c for c in mma_checks(ContinuationRun.read(tmp_path / "mma"))}
    for name in (
        "bass notes per bar",
        "other notes per bar",
        "bass median duration, beats",
        "other median duration, beats",
        "mean pitch",
    ):
        assert mma[name].passed and mma[name].model == pytest.approx(mma[name].real), name
    for metric in ("time-pitch", "onset-duration", "onset-drum"):
        assert mma[f"style {metric} Q1"].model == pytest.approx(mma[f"style {metric} Q1"].real)
    styles = [c for c in midi_checks(ContinuationRun.read(tmp_path / "midi")) if c.criterion.startswith("style")]
    assert len(styles) == 3 and all(c.model == pytest.approx(c.floor) and c.passed is False for c in styles)


def test_cli_writes_the_table_and_refuses_bad_folders_in_one_line(runs, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_command(command, ["--copy", str(runs / "copy"), "--out", str(tmp_path / "t")])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "| copy test |" in printed and "Not run: MMA test styles, real MIDI." in printed
    for bad in ([], ["--mma", str(runs / "copy")], ["--copy", str(runs / "mma")]):
        with pytest.raises(SystemExit) as exit_info:
            run_command(command, ["--out", str(tmp_path / "x"), *bad])
        assert exit_info.value.code != 0
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("error:"), err


def test_the_script_runs_every_stage_resumes_and_writes_the_table(runs, tmp_path):
    """scripts/experiments/groove_eval.sh end to end on the tiny model: the table of a groove
    checkpoint in one command; run again, it samples nothing anew."""
    env = os.environ | {
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "DATA": str(runs / "data"),
        "PIECES": "2",
        "MIDI_SAMPLES": "1",
        "NAME": "tiny",
        "REPORT": str(tmp_path / "report"),
    }
    script = [str(REPO / "scripts" / "experiments" / "groove_eval.sh"), str(runs / "ckpt"), str(tmp_path / "out")]
    first = subprocess.run(["bash", *script], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    saved = json.loads((tmp_path / "report" / "done_when.json").read_text())
    assert {c["part"].split(" (")[0] for c in saved["checks"]} == {"MMA test styles", "real MIDI", "copy test", "docs"}
    assert saved["checks"][0]["model"] == 2 and saved["checks"][0]["passed"] is False  # 2 pieces < 60
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == [
        "copy.md",
        "done_when.json",
        "done_when.md",
        "midi.md",
        "mma.md",
    ]
    again = subprocess.run(["bash", *script], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "(2 from an earlier run)" in again.stdout and "copy: done" in again.stdout
    bad = subprocess.run(
        ["bash", script[0], str(tmp_path), str(tmp_path / "x")], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "not a checkpoint folder" in bad.stderr
