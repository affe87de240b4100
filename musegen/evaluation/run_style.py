"""`musegen evaluate style`: generated continuations scored against their reference pieces with
the style profiles of `musegen.metrics.style` (paper Fig. 5; docs/method.md).

Tracks are compared by role (`musegen.music.roles`): by name in a Groove2Groove file (whose 2-bar
count-in is left out) or one `decode` wrote, else drums on the drum channel and bass by GM
program 32-39, else a bass-like name, else the lowest track. "other" is the single busiest
harmonic track, as the reference scores it (`other="merged"`: all of them).
A generated piece's continuation (from musegen's prompt-end marker on, or the whole piece
without one) is cut into equal-duration segments by onset; each segment's profile is scored
against the whole reference piece of the same role. A segment that is empty (or too short for
a profile) scores 0 where the reference has that profile; where the reference has none there is
nothing to compare (NaN, left out of the medians). Tables show the share of empty segments
beside each median, so a model that stops playing cannot look good.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import ConfigError, MidiError, MusegenError
from ..metrics.report import plot_segments, write_rows_csv
from ..metrics.style import ROLES, STYLE_METRICS, profiles, role_notes, similarity
from ..music.midi import find_midi_files
from ..music.notes import NoteTable, prompt_end
from ..music.roles import merged_notes, read_trio

OTHER_CHOICES = ("busiest", "merged")
MAX_SEGMENTS = 64  # segments of a continuation; more would cut it finer than its notes
BASELINE_PROMPT_BARS = 2  # the baselines' "continuation" starts where the protocol's prompt ends


# ---- reading pieces ---------------------------------------------------------------------------------


def read_piece(path: str | os.PathLike, other: str = "busiest") -> tuple[dict[str, NoteTable], int | None]:
    """Notes per role (ticks) and the prompt end tick (None without a marker)."""
    if other not in OTHER_CHOICES:
        raise ConfigError(f"--other must be one of {', '.join(OTHER_CHOICES)}, got {other!r}")
    parsed, roles, _ = read_trio(path)
    others = roles.busiest() if other == "busiest" else [p for group in roles.harmonic for p in group]
    by_role = {}
    for role, parts in (("bass", roles.bass), ("drums", roles.drums), ("other", others)):
        rows = merged_notes(parts)
        if len(rows):
            start = np.maximum(rows[:, 0], 0)  # a count-in cut may leave an onset half a grid unit early
            notes = role_notes(role, parsed.tpq, start, rows[:, 1], rows[:, 2])
            by_role[role] = replace(notes, time_signatures=parsed.time_signatures)  # for its bar lines
    end = prompt_end(parsed.markers)
    return by_role, (None if end is None else max(end, 0))


def continuation_segments(
    by_role: dict[str, NoteTable], start: int | None, n_segments: int = 4
) -> list[dict[str, NoteTable]]:
    """The notes from `start` (default: the first onset) to the last note end, cut into
    `n_segments` spans of equal duration by onset (the last onset belongs to the last span)."""
    check_segments(n_segments)
    if start is None:
        start = min((int(n.start.min()) for n in by_role.values() if len(n)), default=0)
    cont = {role: n.select(n.start >= start) for role, n in by_role.items()}
    end = max((int(n.end.max()) for n in cont.values() if len(n)), default=start)
    span = max(end - start, 1)
    segments: list[dict[str, NoteTable]] = [{} for _ in range(n_segments)]
    for role, n in cont.items():
        index = np.minimum((n.start - start) * n_segments // span, n_segments - 1)
        for k in range(n_segments):
            segments[k][role] = n.select(index == k)
    return segments


def check_segments(n_segments) -> int:
    """The number of segments as an int in 1..MAX_SEGMENTS (ConfigError otherwise); accepts
    text such as "4" or "1e9" (the CLI's option)."""
    try:
        value = float(n_segments)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value == int(value) and 1 <= value <= MAX_SEGMENTS):
        raise ConfigError(f"--segments must be a whole number from 1 to {MAX_SEGMENTS}, got {n_segments}")
    return int(value)


# ---- scoring --------------------------------------------------------------------------------------


def score_segments(segments: list[dict[str, NoteTable]], reference: dict[str, NoteTable]) -> list[dict]:
    """One row per (role, metric, segment) for the roles the reference has."""
    rows = []
    for role in ROLES:
        if role not in reference:
            continue  # nothing to compare this role's output with
        ref_profiles = profiles(reference[role], role)
        for index, segment in enumerate(segments, start=1):
            notes = segment.get(role, NoteTable.empty(reference[role].tpq))
            for metric, profile in profiles(notes, role).items():
                rows.append(
                    {
                        "track": role,
                        "metric": metric,
                        "segment": index,
                        "similarity": similarity(profile, ref_profiles[metric]),
                        "generated_notes": len(notes),
                        "reference_notes": len(reference[role]),
                    }
                )
    return rows


def score_piece(
    generated: str | os.PathLike, reference: str | os.PathLike, n_segments: int = 4, other: str = "busiest"
) -> list[dict]:
    """One row per (role, metric, segment): the similarity and the note counts behind it."""
    gen_roles, prompt_end = read_piece(generated, other)
    ref_roles, _ = read_piece(reference, other)
    names = {"generated": Path(generated).name, "reference": Path(reference).name}
    return [names | row for row in score_segments(continuation_segments(gen_roles, prompt_end, n_segments), ref_roles)]


def baseline_rows(references: dict[str, Path], n_segments: int = 4, other: str = "busiest") -> list[dict]:
    """Scores that bracket a model's: each reference's own bars after the prompt against itself
    (ceiling: the true continuation), and another style's reference after the prompt against it
    (floor). The other style is the reference half the sorted list away whose style (folder,
    else file stem) differs. Unreadable references are left out."""
    pieces = {}
    for name, path in sorted(references.items()):
        try:
            roles = read_piece(path, other)[0]
        except MusegenError:
            continue
        if roles:
            pieces[name] = roles
    names = list(pieces)
    rows = []
    for i, name in enumerate(names):
        rows += [
            {"baseline": "ceiling", "generated": name, "reference": name} | row
            for row in score_segments(_after_prompt(pieces[name], n_segments), pieces[name])
        ]
        others = [names[(i + len(names) // 2 + k) % len(names)] for k in range(len(names))]
        floor = next((o for o in others if _style_of(o) != _style_of(name)), None)
        if floor is not None:
            rows += [
                {"baseline": "floor", "generated": floor, "reference": name} | row
                for row in score_segments(_after_prompt(pieces[floor], n_segments), pieces[name])
            ]
    return rows


def _after_prompt(by_role: dict[str, NoteTable], n_segments: int) -> list[dict[str, NoteTable]]:
    """A reference played on from where the protocol's prompt ends (its bars, in its meters), in
    segments."""
    prompt_end = next(iter(by_role.values())).bar_tick(BASELINE_PROMPT_BARS)
    return continuation_segments(by_role, round(prompt_end), n_segments)


def _style_of(name: str) -> str:
    path = Path(name)
    return str(path.parent) if str(path.parent) != "." else path.stem


def match_reference(generated: str, references: dict[str, Path]) -> Path | None:
    """The reference for a generated file, both named by their paths relative to their folders.

    `musegen sample --prompt song.mid` writes song/song_000.mid, song/song_001.mid, ...: the
    reference in the same sub-folder as the set's folder (or as the file itself) whose stem is the
    longest prefix of the generated stem matches them (so a folder of prompts sampled as a batch
    matches the folder of references it came from). A single reference matches every generated file.
    """
    if len(references) == 1:
        return next(iter(references.values()))
    folder, stem = Path(generated).parent, Path(generated).stem
    in_set = folder.name and stem.startswith(folder.name + "_")  # `<set>/<set>_000.mid`
    for where in [folder.parent, folder] if in_set else [folder]:
        candidates = [
            (Path(rel).stem, path)
            for rel, path in references.items()
            if Path(rel).parent == where and (stem == Path(rel).stem or stem.startswith(Path(rel).stem + "_"))
        ]
        if candidates:
            return max(candidates, key=lambda c: len(c[0]))[1]
    return None


def _relative_names(folder: Path) -> dict[str, Path]:
    """The MIDI files under `folder` by relative name, hidden ones left out (such as the scratch
    folder of a `musegen sample` that was killed)."""
    root = folder if folder.is_dir() else folder.parent
    names = {str(p.relative_to(root)): p for p in find_midi_files(folder)}
    return {rel: p for rel, p in names.items() if not any(part.startswith(".") for part in Path(rel).parts)}


def evaluate_style(
    generated_dir: str | os.PathLike,
    reference_dir: str | os.PathLike,
    out_csv: str | os.PathLike,
    out_png: str | os.PathLike | None = None,
    n_segments: int = 4,
    other: str = "busiest",
    baselines: bool = False,
) -> dict:
    """Score every generated file against its reference; write the CSV (and box plot). Files
    that cannot be read are skipped, counted and listed with their reason. With `baselines`,
    also the ceiling and floor (`baseline_rows`), written beside the CSV as
    `<stem>_baselines.csv`."""
    n_segments = check_segments(n_segments)
    generated = _relative_names(Path(generated_dir))
    references = _relative_names(Path(reference_dir))
    name_of = {path: name for name, path in references.items()}
    rows, unmatched, skipped, used = [], [], {}, {}
    for name, path in generated.items():
        reference = match_reference(name, references)
        if reference is None:
            unmatched.append(name)
            continue
        try:
            rows.extend(row | {"generated": name} for row in score_piece(path, reference, n_segments, other))
            used[name_of[reference]] = reference
        except MusegenError as exc:  # one unreadable file must not end the whole evaluation
            skipped[name] = str(exc).splitlines()[0]
    if not rows:
        reason = f" ({next(iter(skipped.items()))[1]})" if skipped else ""
        raise MidiError(
            f"{generated_dir}: no generated file could be scored against a reference in "
            f"{reference_dir}{reason} (name references like the prompt: song.mid for song_000.mid)"
        )
    write_rows_csv(out_csv, rows)
    if out_png is not None:
        plot_segments(_per_segment_values(rows, n_segments), out_png)
    result = {
        "pieces": len(generated) - len(unmatched) - len(skipped),
        "unmatched": unmatched,
        "skipped": skipped,
        "rows": len(rows),
        "medians": medians(rows, n_segments),
        "empty": empty_shares(rows, n_segments),
    }
    if baselines:
        extra = baseline_rows(used, n_segments, other)
        write_rows_csv(Path(out_csv).with_name(Path(out_csv).stem + "_baselines.csv"), extra)
        result["baselines"] = {
            kind: {"medians": medians(part, n_segments), "empty": empty_shares(part, n_segments)}
            for kind in ("ceiling", "floor")
            for part in [[r for r in extra if r["baseline"] == kind]]
            if part
        }
    return result


def _per_segment(rows: list[dict], metric: str, n_segments: int) -> list[list[dict]]:
    """The rows of `metric` that compare something (finite similarity), per segment."""
    return [
        [r for r in rows if r["metric"] == metric and r["segment"] == s and not math.isnan(r["similarity"])]
        for s in range(1, n_segments + 1)
    ]


def medians(rows: list[dict], n_segments: int = 4) -> dict[str, list[float]]:
    """Median similarity per metric and segment over the comparisons made (an empty segment
    counts as 0; a role the reference lacks compares nothing)."""
    out = {}
    for metric in STYLE_METRICS:
        per_segment = _per_segment(rows, metric, n_segments)
        if any(per_segment):
            out[metric] = [float(np.median([r["similarity"] for r in v])) if v else math.nan for v in per_segment]
    return out


def empty_shares(rows: list[dict], n_segments: int = 4) -> dict[str, list[float]]:
    """Per metric and segment, the share of those comparisons whose generated segment played
    no note in that role."""
    out = {}
    for metric in STYLE_METRICS:
        per_segment = _per_segment(rows, metric, n_segments)
        if any(per_segment):
            out[metric] = [
                float(np.mean([r["generated_notes"] == 0 for r in v])) if v else math.nan for v in per_segment
            ]
    return out


def _per_segment_values(rows: list[dict], n_segments: int) -> dict[str, list[list[float]]]:
    """{metric: [the similarities of each segment]} for the metrics the rows score."""
    return {
        metric: [[r["similarity"] for r in v] for v in _per_segment(rows, metric, n_segments)]
        for metric in STYLE_METRICS
        if any(r["metric"] == metric for r in rows)
    }
