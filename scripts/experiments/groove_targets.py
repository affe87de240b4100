"""Issue #28's "done when" for a groove model, as one table (an experiment script: the issue's
acceptance list, kept with the experiments that measured it):
    python scripts/experiments/groove_targets.py --out OUT [--mma RUN] [--midi RUN] [--copy RUN]

Each criterion of the issue that a measurement decides, its target, the value measured, the real
and floor values beside it, and whether it passes, read from the outputs of three runs:
- `evaluate continuation` on the unseen MMA test styles (2-bar prompts, at least 60 pieces x 2
  samples): the first quarter's style medians (empty quarters score 0), bass and other notes per
  bar (means over spans, within 25% of the real spans'), their median durations (the median over
  spans of each span's median, within 1.5x of the real one) and the mean pitch (within 3
  semitones of the real mean);
- `evaluate continuation` on a folder of real multi-track MIDI that is not MMA: bass and other
  median durations within 2x of the real continuations', and the three style medians of the
  first quarter above those of an unrelated piece's bars (the floor);
- `evaluate copy`: each model's mean score beside the ceiling and floor (the issue sets no
  number; the row passes nothing and fails nothing).
The issue's last criterion (what the docs say) is listed, for a reader to check.
Values are recomputed from the runs' per-piece results (pieces.jsonl), not from rounded tables.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import typer

from musegen import schemas
from musegen.cli import run_command
from musegen.errors import ConfigError, DataError
from musegen.evaluation.compare import read_jsonl
from musegen.evaluation.run_continuation import EVALUATION_SETTINGS, PIECE_RECORD, pooled_values, summary_rows
from musegen.evaluation.run_copy import COPY_RESULT
from musegen.io import write_json
from musegen.metrics.report import fmt, write_table

MMA_PIECES, MMA_SAMPLES, PROMPT_BARS = 60, 2, 2
STYLE_TARGETS = {"time-pitch": 0.6, "onset-duration": 0.5, "onset-drum": 0.7}
NOTES_TOLERANCE = 0.25  # notes per bar within +-25% of the real mean
MMA_DURATION_RATIO = 1.5
MIDI_DURATION_RATIO = 2.0
PITCH_TOLERANCE = 3.0  # semitones
PITCHED_ROLES = ("bass", "other")


@dataclass
class Check:
    """One row of the table: `passed` None where the issue sets no number."""

    part: str
    criterion: str
    target: str
    model: float  # a count (int) in the protocol row
    real: float = math.nan
    floor: float = math.nan
    passed: bool | None = None


@dataclass
class ContinuationRun:
    """What `targets` needs of one `evaluate continuation` output folder."""

    settings: dict[str, Any]
    pieces: int
    rows: dict[str, dict[str, Any]]  # summary_rows by metric

    @classmethod
    def read(cls, folder: str | os.PathLike) -> "ContinuationRun":
        folder = Path(folder)
        try:
            settings = schemas.read(folder / "run.json", EVALUATION_SETTINGS)
            records = read_jsonl(folder / "pieces.jsonl", PIECE_RECORD)
            rows = {r["metric"]: r for r in summary_rows(pooled_values(records))}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"{folder}: not the output of `musegen evaluate continuation` ({exc})") from None
        if not records:
            raise DataError(f"{folder}: no piece was continued yet")
        return cls(settings, len(records), rows)

    def statistic(self, metric: str, statistic: str) -> tuple[float, float, float]:
        """(model, real, floor) `statistic` ("mean" or "median") of a metric; NaN where missing."""
        row = self.rows.get(metric, {})
        return tuple(row.get(f"{source}_{statistic}", math.nan) for source in ("model", "real", "floor"))


def _within_ratio(model: float, real: float, ratio: float) -> bool:
    return real > 0 and model > 0 and 1 / ratio <= model / real <= ratio


def mma_checks(run: ContinuationRun) -> list[Check]:
    """The criteria on the unseen MMA test styles."""
    part = "MMA test styles"
    s = run.settings
    protocol = (
        s.get("prompt_bars") == PROMPT_BARS
        and run.pieces >= MMA_PIECES
        and s.get("samples_per_piece", 0) >= MMA_SAMPLES
    )
    checks = [
        Check(
            part,
            f"pieces ({s.get('samples_per_piece')} samples each, {s.get('prompt_bars')}-bar prompts, "
            f"{s.get('bars')} bars continued)",
            f">= {MMA_PIECES} x {MMA_SAMPLES}, 2-bar prompts",
            run.pieces,
            passed=protocol,
        )
    ]
    for metric, least in STYLE_TARGETS.items():
        checks.append(
            _compared(
                run, part, f"style {metric} Q1", "median", " (median, empty = 0)", f">= {least}", _at_least(least)
            )
        )
    for role in PITCHED_ROLES:
        checks.append(
            _compared(
                run,
                part,
                f"{role} notes per bar",
                "mean",
                " (mean)",
                f"real +-{NOTES_TOLERANCE:.0%}",
                lambda model, real, floor: real > 0 and abs(model / real - 1) <= NOTES_TOLERANCE,
            )
        )
    checks += _duration_checks(run, part, MMA_DURATION_RATIO, f"{MMA_DURATION_RATIO}")
    checks.append(
        _compared(
            run,
            part,
            "mean pitch",
            "mean",
            " (mean)",
            f"real +-{PITCH_TOLERANCE:g} semitones",
            lambda model, real, floor: abs(model - real) <= PITCH_TOLERANCE,
        )
    )
    return checks


def midi_checks(run: ContinuationRun) -> list[Check]:
    """The criteria on real multi-track MIDI that is not MMA."""
    part = f"real MIDI ({run.pieces} pieces x {run.settings.get('samples_per_piece')})"
    checks = _duration_checks(run, part, MIDI_DURATION_RATIO, f"{MIDI_DURATION_RATIO:g}")
    for metric in STYLE_TARGETS:
        checks.append(
            _compared(
                run,
                part,
                f"style {metric} Q1",
                "median",
                " (median, empty = 0)",
                "> floor (an unrelated piece)",
                lambda model, real, floor: model > floor,
            )
        )
    return checks


def _compared(run: ContinuationRun, part: str, metric: str, statistic: str, how: str, target: str, passes) -> Check:
    """The check of one statistic of a metric: the model's, real and floor values, and whether
    `passes(model, real, floor)`. `how` follows the metric's name in the criterion."""
    model, real, floor = run.statistic(metric, statistic)
    return Check(part, f"{metric}{how}", target, model, real, floor, passes(model, real, floor))


def _at_least(least: float):
    return lambda model, real, floor: model >= least


def _duration_checks(run: ContinuationRun, part: str, ratio: float, shown: str) -> list[Check]:
    """The pitched roles' median durations (the median over spans) within `ratio` of the real ones."""
    return [
        _compared(
            run,
            part,
            f"{role} median duration",
            "median",
            ", beats (median)",
            f"within {shown}x of real",
            lambda model, real, floor: _within_ratio(model, real, ratio),
        )
        for role in PITCHED_ROLES
    ]


def read_copy(folder: str | os.PathLike) -> dict[str, Any]:
    """What the table needs of an `evaluate copy` output: its rows as (name, scored, mean), and its
    settings with the models' checkpoints."""
    folder = Path(folder)
    try:
        result = schemas.read(folder / "copy.json", COPY_RESULT)
        return {
            "rows": [(row.name, row.scored, row.mean) for row in result.table],
            "settings": dict(result.settings)
            | {"checkpoints": {name: model.checkpoint for name, model in result.models.items()}},
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{folder}: not the output of `musegen evaluate copy` ({exc})") from None


def copy_checks(copy: dict[str, Any]) -> list[Check]:
    """Each model's copy-test mean (`read_copy`), beside the ceiling and floor of its tokenizer."""
    baselines = ("ceiling", "floor")
    bounds = {name.split(":")[0]: mean for name, _, mean in copy["rows"] if name.startswith(baselines)}
    return [
        Check(
            "copy test",
            f"{name}: mean F1 per bar ({scored} scored)",
            "shown beside softmax and the previous model",
            _number(mean),
            _number(bounds.get("ceiling")),
            _number(bounds.get("floor")),
        )
        for name, scored, mean in copy["rows"]
        if not name.startswith(baselines)
    ]


def _number(value) -> float:
    return math.nan if value is None else float(value)


COLUMNS = ("part", "criterion", "target", "measured", "real", "floor", "pass")


def write_targets(
    out_dir: str | os.PathLike, checks: list[Check], note: str = "", runs: dict[str, Any] | None = None
) -> dict[str, Path]:
    """done_when.md (the table, then `note`), .csv and .json (every check, numbers unrounded, and
    `runs`: the settings of the runs measured)."""
    out_dir = Path(out_dir)
    verdict = {True: "pass", False: "FAIL", None: "-"}
    cells = [
        [
            c.part,
            c.criterion,
            c.target,
            str(c.model) if isinstance(c.model, int) else fmt(c.model),
            fmt(c.real),
            fmt(c.floor),
            verdict[c.passed],
        ]
        for c in checks
    ]
    write_table(out_dir, "done_when", list(COLUMNS), cells, note)  # and done_when.csv
    decided = [c.passed for c in checks if c.passed is not None]
    write_json(
        out_dir / "done_when.json",
        {
            "checks": [
                {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(c).items()}
                for c in checks
            ],
            "passed": sum(decided),
            "decided": len(decided),
            "runs": runs or {},
        },
    )
    return {"md": out_dir / "done_when.md", "json": out_dir / "done_when.json"}


def groove_targets(
    out_dir: str | os.PathLike,
    mma: str | os.PathLike | None = None,
    midi: str | os.PathLike | None = None,
    copy: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """The table from whichever of the three outputs are given; the criteria of the runs not given
    are left out (and named in the note)."""
    checks: list[Check] = []
    runs: dict[str, Any] = {}
    missing = []
    for label, folder, judge in (("MMA test styles", mma, mma_checks), ("real MIDI", midi, midi_checks)):
        if folder is None:
            missing.append(label)
        else:
            run = ContinuationRun.read(folder)
            checks += judge(run)
            runs[label] = run.settings
    if copy is None:
        missing.append("copy test")
    else:
        found = read_copy(copy)
        checks += copy_checks(found)
        runs["copy test"] = found["settings"]
    checks.append(
        Check(
            "docs",
            "comparison runs in docs/experiments/ with their compute; what limits the model, "
            "with numbers, in the card and docs/results.md",
            "written",
            math.nan,
        )
    )
    note = (
        "measured: the model's value (for the copy test: its mean; real: the ceiling, the prompt's own loop; "
        "floor: an unrelated pattern's loop). real: the pieces' own continuation bars; floor: another piece's "
        "bars after its own prompt. Definitions: docs/evaluation.md; criteria: issue #28 and "
        "musegen/evaluation/targets.py. The docs criterion is for a reader to check."
    )
    if missing:
        note += f" Not run: {', '.join(missing)}."
    files = write_targets(out_dir, checks, note, runs)
    return {"checks": checks, "files": files}


def command(
    out: Path = typer.Option(..., "--out", "-o", help="Folder for done_when.md, .csv and .json."),
    mma: Optional[Path] = typer.Option(
        None,
        help="`evaluate continuation` output on the MMA test split (2-bar prompts, at least 60 pieces x 2 samples).",
    ),
    midi: Optional[Path] = typer.Option(
        None, help="`evaluate continuation` output on a folder of real multi-track MIDI (e.g. tests/data/multitrack)."
    ),
    copy_test: Optional[Path] = typer.Option(None, "--copy", help="`evaluate copy` output."),
):
    """Issue #28's "done when" for a groove model: each criterion, its target, the measured, real and floor
    values and pass/fail, from the outputs given."""
    if mma is None and midi is None and copy_test is None:
        raise ConfigError("give at least one of --mma, --midi and --copy")
    result = groove_targets(out, mma, midi, copy_test)
    typer.echo(result["files"]["md"].read_text().rstrip() + "\n")
    typer.echo(f"wrote done_when.md, done_when.csv and done_when.json to {out}")


if __name__ == "__main__":
    run_command(command)
