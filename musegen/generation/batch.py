"""The whole `musegen sample` run: load the checkpoint once, then continue one prompt, none, or
every prompt file under a folder, each into its own output set, with a summary per set and, for a
folder, `batch.json`."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from ..checkpoint import load_checkpoint
from ..errors import ConfigError, MidiError, MusegenError
from ..io import check_regular, write_json
from ..music.midi import MIDI_SUFFIXES
from ..render import INSTALL_HINT, find_soundfont
from ..tokenizers.base import Tokenizer
from .loop import generate
from .outputs import output_set, write_samples, writes
from .prompt import Prompt, load_prompt
from .resources import check_threads, checked_device
from .settings import SEED_MAX, SampleSettings


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
    """The whole `musegen sample` run: returns (and writes as <prompt stem>.json) what was done and how.

    A folder of prompts continues every MIDI (and MIREX .json) file under it with one loaded
    model, into the same sub-folders of `out_dir`; prompt i gets seed `seed + i`. A prompt that
    cannot be used, or whose outputs would overwrite another prompt's or an input file, is
    skipped, counted and listed (in the returned summary and `out_dir/batch.json`).
    """
    if audio:  # fail before spending minutes sampling
        if shutil.which("fluidsynth") is None:
            raise MusegenError(f"fluidsynth not found; install it with `{INSTALL_HINT}`")
        find_soundfont()
    settings.resolved()  # every bound checked before the model is loaded (the defaults come with it)
    check_threads(threads)
    device = checked_device(device)
    model, tokenizer, _, _ = load_checkpoint(checkpoint, device=device)
    settings = settings.resolved(tokenizer)
    run = Loaded(model, tokenizer, checkpoint, device, audio, pianoroll, threads)
    out_dir = Path(out_dir)
    if prompt_path is None or not Path(prompt_path).is_dir():
        stem = "sample"
        if prompt_path is not None:
            check_regular(prompt_path, "prompt")  # before any path is resolved (a link loop, a FIFO)
            prompt_path, stem = Path(prompt_path), Path(prompt_path).stem
            if out_dir.resolve() == prompt_path.resolve().parent and writes(
                stem, prompt_path.name, prompt_path.suffix.lower() == ".json"
            ):
                raise ConfigError(
                    f"{prompt_path}: its output {prompt_path.name} would overwrite the input "
                    f"{prompt_path.name}; choose another --out"
                )
        return sample_prompt(run, out_dir, stem, settings, prompt_path, progress)
    return _sample_folder(run, Path(prompt_path), out_dir, settings, progress)


def _sample_folder(
    run: Loaded, prompt_dir: Path, out_dir: Path, settings: SampleSettings, progress: bool
) -> dict[str, Any]:
    files, skipped = _prompt_files(prompt_dir)
    jobs = [(path, out_dir / path.relative_to(prompt_dir).parent) for path in files]
    stems = output_stems(jobs, files, out_dir / "batch.json")
    renamed = {str(path.relative_to(prompt_dir)): stem for path, stem in stems.items() if stem != path.stem}
    done = []
    for i, (path, folder) in enumerate(tqdm(jobs, desc="prompts", unit="prompt", disable=not progress)):
        rel = str(path.relative_to(prompt_dir))
        if rel in skipped:
            continue
        try:
            done.append(
                sample_prompt(
                    run, folder, stems[path], replace(settings, seed=(settings.seed + i) % (SEED_MAX + 1)), path
                )
            )
        except MusegenError as exc:
            skipped[rel] = str(exc).splitlines()[0]
    if not done:
        if not skipped:
            raise MidiError(f"{prompt_dir}: no MIDI or MIREX .json files found")
        first = next(iter(skipped.items()))
        raise MidiError(f"{prompt_dir}: none of its {len(skipped)} prompts could be continued ({first[0]}: {first[1]})")
    stats = [d["stats"] for d in done]
    seconds, new_tokens = sum(x["seconds"] for x in stats), sum(x["new_tokens"] for x in stats)
    summary = {
        "checkpoint": str(run.checkpoint),
        "prompts": str(prompt_dir),
        "continued": len(done),
        "skipped": dict(sorted(skipped.items())),
        "renamed": renamed,
        "settings": settings.record(),
        "stats": {
            "seconds": round(seconds, 3),
            "new_tokens": new_tokens,
            "tokens_per_second": round(new_tokens / max(seconds, 1e-9), 1),
            "state_bytes": max(x["state_bytes"] for x in stats),
            **{k: sum(x[k] for x in stats) for k in ("invalid", "grammar_violations", "unfinished")},
        },
        "samples": [r for d in done for r in d["samples"]],
    }
    write_json(out_dir / "batch.json", summary)
    return summary


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


def output_stems(jobs: list[tuple[Path, Path]], inputs: list[Path], reserved: Path) -> dict[Path, str]:
    """The name of each prompt's output set (its files are `<stem>.json`, `<stem>_NNN.mid`, ...),
    decided before anything is written: the prompt's own stem unless that set would overwrite an
    input file, `reserved` (the batch summary) or an earlier prompt's set in the same folder
    (`song.mid` and `song.midi`); then `<stem>-<suffix>` (`song-midi`), or `<stem>-2`, `-3`, ..."""
    protected: dict[Path, set[str]] = {}
    for path in [*inputs, reserved]:
        protected.setdefault(path.parent.resolve(), set()).add(path.name)
    claimed: dict[Path, list[tuple[str, bool]]] = {}
    stems = {}
    for path, folder in jobs:
        folder = folder.resolve()
        mirex_prompt = path.suffix.lower() == ".json"
        others = claimed.setdefault(folder, [])
        candidates = [
            path.stem,
            f"{path.stem}-{path.suffix.lstrip('.').lower()}",
            *(f"{path.stem}-{k}" for k in range(2, len(jobs) + 3)),
        ]
        stems[path] = next(
            stem
            for stem in candidates
            if not any(writes(stem, name, mirex_prompt) for name in protected.get(folder, ()))
            and not any(
                stem == other or writes(other, f"{stem}.json", mirex) or writes(stem, f"{other}.json", mirex_prompt)
                for other, mirex in others
            )
        )
        others.append((stems[path], mirex_prompt))
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


def sample_prompt(
    run: Loaded,
    out_dir: Path,
    stem: str,
    settings: SampleSettings,
    prompt_path,
    progress: bool = False,
    on_step: Callable[[list[list[int]]], None] | None = None,
    prompt: Prompt | None = None,
) -> dict[str, Any]:
    """Continue one prompt (or none) with a loaded model; write its output set and <stem>.json.
    `on_step` is passed to `generate` (musegen studio shows the notes while they are drawn);
    `prompt`, when given, is `prompt_path` as the caller already loaded it."""
    tokenizer = run.tokenizer
    if prompt is None:
        prompt = load_prompt(tokenizer, prompt_path, settings.prompt_bars)
    samples, stats = generate(
        run.model,
        tokenizer,
        prompt,
        settings,
        device=run.device,
        progress=progress,
        threads=run.threads,
        on_step=on_step,
    )
    with output_set(out_dir, f"{stem}.json") as scratch:
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
