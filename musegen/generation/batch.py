"""The whole `musegen sample` run: load the checkpoint once, then continue one prompt, none, or
every prompt file under a folder, each into its own output set, with a summary per set and, for a
folder, `batch.json`."""

from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from .. import schemas
from ..checkpoint import load_checkpoint
from ..errors import MidiError, MusegenError
from ..io import check_regular, write_json
from ..model.torch_step import PreparedWeights
from ..music.midi import MIDI_SUFFIXES
from ..render import INSTALL_HINT, find_soundfont
from ..tokenizers.base import Tokenizer
from .loop import Sample, generate
from .outputs import SAMPLE_SUMMARY, is_set, output_set, write_samples
from .prompt import Prompt, load_prompt
from .resources import check_threads, checked_device
from .settings import SampleSettings, nth_seed


def sample_to_folder(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    settings: SampleSettings,
    prompt_path: str | os.PathLike | None = None,
    audio: bool = False,
    pianoroll: bool = False,
    device: str = "auto",
    progress: bool = True,
    threads: int | None = None,
) -> dict[str, Any]:
    """The whole `musegen sample` run. Each prompt's files go into a folder of their own, its set
    (`out_dir/<prompt stem>/`: `<stem>_000.mid`, ..., and `<stem>.json`), which appears complete
    or not at all. Returns what the set's `<stem>.json` holds, and `folder`: where the set went.

    A folder of prompts continues every MIDI (and MIREX .json) file under it with one loaded
    model, into the same sub-folders of `out_dir` (`refs/funk/0.mid` -> `out/funk/0/`); prompt i
    gets seed `seed + i`. A prompt that cannot be used is skipped, counted and listed (in the
    returned summary and `out_dir/batch.json`). Set names are decided before anything is
    written: a set whose folder is taken gets another name (`output_stems`), listed as renamed.
    """
    if audio:  # fail before spending minutes sampling
        if shutil.which("fluidsynth") is None:
            raise MusegenError(f"fluidsynth not found; install it with `{INSTALL_HINT}`")
        find_soundfont()
    settings.resolved()  # every bound checked before the model is loaded (the defaults come with it)
    check_threads(threads)
    device = checked_device(device)
    prompt_path = Path(prompt_path) if prompt_path is not None else None
    if prompt_path is not None and not prompt_path.is_dir():
        check_regular(prompt_path, "prompt")  # a FIFO or a link loop, refused before the model loads
    model, tokenizer, _, _ = load_checkpoint(checkpoint, device=device)
    settings = settings.resolved(tokenizer)
    run = Loaded(model, tokenizer, checkpoint, device, audio, pianoroll, threads)
    out_dir = Path(out_dir)
    if prompt_path is not None and prompt_path.is_dir():
        return _sample_folder(run, prompt_path, out_dir, settings, progress)
    stem = next(iter(output_stems([(prompt_path or Path("sample"), out_dir)]).values()))
    summary = sample_prompt(run, out_dir / stem, stem, settings, prompt_path, progress)
    return {**summary, "folder": str(out_dir / stem)}


def _sample_folder(
    run: Loaded, prompt_dir: Path, out_dir: Path, settings: SampleSettings, progress: bool
) -> dict[str, Any]:
    files, skipped = _prompt_files(prompt_dir)
    jobs = [(path, out_dir / path.relative_to(prompt_dir).parent) for path in files]
    batch = batch_summary_path(out_dir)
    stems = output_stems(jobs, batch)
    sets, renamed = {}, {}
    for i, (path, folder) in enumerate(tqdm(jobs, desc="prompts", unit="prompt", disable=not progress)):
        rel = str(path.relative_to(prompt_dir))
        if rel in skipped:
            continue
        try:
            seed = nth_seed(settings.seed, i)
            sets[rel] = sample_prompt(run, folder / stems[path], stems[path], replace(settings, seed=seed), path)
        except MusegenError as exc:
            skipped[rel] = str(exc).splitlines()[0]
            continue
        if stems[path] != path.stem:
            renamed[rel] = stems[path]
    if not sets:
        if not skipped:
            raise MidiError(f"{prompt_dir}: no MIDI or MIREX .json files found")
        first = next(iter(skipped.items()))
        raise MidiError(f"{prompt_dir}: none of its {len(skipped)} prompts could be continued ({first[0]}: {first[1]})")
    stats = [d["stats"] for d in sets.values()]
    seconds, new_tokens = sum(x["seconds"] for x in stats), sum(x["new_tokens"] for x in stats)
    summary = {
        "checkpoint": str(run.checkpoint),
        "prompts": str(prompt_dir),
        "continued": len(sets),
        "skipped": dict(sorted(skipped.items())),
        "renamed": renamed,
        "sets": {rel: (Path(rel).parent / stems[prompt_dir / rel]).as_posix() for rel in sets},
        "settings": settings.record(),
        "stats": {
            "seconds": round(seconds, 3),
            "prompt_seconds": round(sum(x["prompt_seconds"] for x in stats), 3),
            "new_tokens": new_tokens,
            "tokens_per_second": round(new_tokens / max(seconds, 1e-9), 1),
            "state_bytes": max(x["state_bytes"] for x in stats),
            **{k: sum(x[k] for x in stats) for k in ("invalid", "grammar_violations", "unfinished", "repeats")},
        },
        "samples": [r for d in sets.values() for r in d["samples"]],
    }
    write_json(batch, summary)
    return {**summary, "folder": str(out_dir), "file": str(batch)}


def batch_summary_path(out_dir: Path) -> Path:
    """`out_dir/batch.json`, unless that is a file `sample` did not write (a prompt named so, when
    the prompts are continued in place): then `batch-2.json`, `batch-3.json`, ..."""
    for k in itertools.count(1):
        path = out_dir / ("batch.json" if k == 1 else f"batch-{k}.json")
        try:
            if not os.path.lexists(path) or schemas.read(path, SAMPLE_SUMMARY):
                return path
        except MusegenError:
            continue
    raise AssertionError("unreachable")


def _prompt_files(folder: Path) -> tuple[list[Path], dict[str, str]]:
    """The prompt files under `folder` (MIDI and .json, hidden ones left out), sorted, and
    those that are not regular files (FIFOs, devices: reading them would block) with why."""
    files, skipped = [], {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or path.is_dir():
            continue
        if path.suffix in MIDI_SUFFIXES or path.suffix.lower() == ".json":
            files.append(path)
            if not path.is_file():
                skipped[str(rel)] = "not a regular file"
    return files, skipped


def output_stems(jobs: list[tuple[Path, Path]], reserved: Path | None = None) -> dict[Path, str]:
    """The name of each prompt's set (its folder `<folder>/<stem>/` and its files' stem), decided
    before anything is written: the prompt's own stem unless `<folder>/<stem>` is taken: by
    something on disk that is not an earlier set of that name (the user's file or folder, an
    input), by another prompt's set of this run (`song.mid` and `song.midi`), by a folder other
    sets go into (`song.mid` beside `song/`), or by `reserved` (the batch summary); then
    `<stem>-<suffix>` (`song-midi`), or `<stem>-2`, `-3`, ... Names are compared ignoring case,
    as a case-insensitive file system would."""
    key = lambda path: os.fspath(path).casefold()  # noqa: E731
    claimed = {key(p) for _, folder in jobs for p in (folder.resolve(), *folder.resolve().parents)}
    claimed |= {key(reserved.resolve())} if reserved is not None else set()
    stems = {}
    for path, folder in jobs:
        base = path.stem.lstrip(".") or "prompt"  # a set folder is never hidden
        suffix = path.suffix.lstrip(".").lower()
        candidates = itertools.chain(
            [base, f"{base}-{suffix}"] if suffix else [base], (f"{base}-{k}" for k in itertools.count(2))
        )
        for stem in candidates:
            target = folder.resolve() / stem
            if key(target) not in claimed and (not os.path.lexists(target) or is_set(target, stem)):
                break
        claimed.add(key(target))
        stems[path] = stem
    return stems


@dataclass(frozen=True)
class Loaded:
    """What every prompt of one run shares: the loaded model, where it came from, and what to write."""

    model: Any
    tokenizer: Tokenizer
    checkpoint: str | os.PathLike
    device: Any  # a torch.device, or its name
    audio: bool = False
    pianoroll: bool = False
    threads: int | None = None
    weights: PreparedWeights | None = None  # the model's prepared weights, shared by the runs that read it


def sample_prompt(
    run: Loaded,
    set_dir: Path,
    stem: str,
    settings: SampleSettings,
    prompt_path,
    progress: bool = False,
    on_step: Callable[[list[list[int]]], None] | None = None,
    prompt: Prompt | None = None,
    on_ingest: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Continue one prompt (or none) with a loaded model; write its output set, `<stem>.json`
    and `<stem>_NNN.mid`, ..., as the folder `set_dir` (replacing an earlier set there).
    `on_step` and `on_ingest` are passed to `generate` (musegen studio shows the notes while they
    are drawn, and ends a run nobody waits for);
    `prompt`, when given, is `prompt_path` as the caller already loaded it."""
    tokenizer = run.tokenizer
    if prompt is None:
        prompt = load_prompt(tokenizer, prompt_path, settings.prompt_bars, settings.grid, settings.prompt_from)
    samples, stats = generate(
        run.model,
        tokenizer,
        prompt,
        settings,
        device=run.device,
        progress=progress,
        threads=run.threads,
        on_step=on_step,
        on_ingest=on_ingest,
        weights=run.weights,
    )
    return write_set(run, set_dir, stem, settings, prompt_path, prompt, samples, stats)


def write_set(
    run: Loaded,
    set_dir: Path,
    stem: str,
    settings: SampleSettings,
    prompt_path,
    prompt: Prompt,
    samples: list[Sample],
    stats: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """Write `samples` of `prompt` as the output set `set_dir` (see `sample_prompt`), its summary
    with `extra` added (musegen studio marks a run stopped partway so); returns the summary."""
    tokenizer = run.tokenizer
    with output_set(set_dir, stem) as scratch:
        records = write_samples(samples, tokenizer, prompt, scratch, stem, run.audio, run.pianoroll)
        summary = {
            "checkpoint": str(run.checkpoint),
            "tokenizer": tokenizer.kind,
            "device": str(run.device),
            "prompt": str(prompt_path) if prompt_path else None,
            "prompt_tokens": int(len(prompt.ids)),
            "prompt_bars": prompt.bars,
            "prompt_report": _jsonable(prompt.report),
            "settings": settings.record(),
            "stats": stats,
            "samples": records,
            **extra,
        }
        write_json(scratch / f"{stem}.json", summary)
    return summary


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
