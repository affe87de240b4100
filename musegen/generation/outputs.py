"""A prompt's output set: one MIDI per sample (with optional WAV, piano roll and MIREX JSON) and
`<stem>.json`, written into a hidden scratch folder and published together (`output_set`)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import miditoolkit

from .. import mirex, schemas
from ..errors import MusegenError
from ..io import atomic_path, write_json
from ..render import PROMPT_END_MARKER, pianoroll_png, render_wav
from ..tokenizers.base import Tokenizer
from .loop import Sample
from .prompt import Prompt, with_piece

SCRATCH_PREFIX = ".musegen-sample-"  # hidden folders an output set is written into before it is moved in
JOURNAL = ".publishing.json"  # in a scratch folder: the set is complete and being moved in (see output_set)


def new_notes(prompt: Prompt, full: miditoolkit.MidiFile) -> list[miditoolkit.Note]:
    """The notes of a decoded sample that the prompt alone does not have (by track, onset, pitch)."""
    alone = prompt.piece.instruments if prompt.piece is not None else []
    own = {(i, n.start, n.pitch) for i, inst in enumerate(alone) for n in inst.notes}
    return [n for i, inst in enumerate(full.instruments) for n in inst.notes if (i, n.start, n.pitch) not in own]


def prompt_end_tick(prompt: Prompt, full: miditoolkit.MidiFile) -> int | None:
    """Where the continuation begins: the earliest of the prompt's last note end and the first
    note onset that the prompt alone does not have (a long prompt note may overlap the cut)."""
    if not len(prompt.ids):
        return None
    ends = [n.end for inst in prompt.piece.instruments for n in inst.notes]
    fresh = [n.start for n in new_notes(prompt, full)]
    candidates = ([max(ends)] if ends else []) + ([min(fresh)] if fresh else [])
    return min(candidates) if candidates else 0


def write_samples(
    samples: list[Sample],
    tokenizer: Tokenizer,
    prompt: Prompt,
    out_dir: str | os.PathLike,
    stem: str,
    audio: bool = False,
    pianoroll: bool = False,
) -> list[dict[str, Any]]:
    """One MIDI per sample (prompt kept at the start, prompt end marked); optional WAV and PNG;
    for a MIREX .json prompt also the continuation's notes as `<stem>_<i>.json`. A sample the
    grammar rejects (sampled without the mask) is decoded leniently: the tokens the grammar
    rejects are dropped and counted (`dropped_tokens`), and the piece is closed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prompt = with_piece(tokenizer, prompt)
    records = []
    for i, sample in enumerate(samples):
        record = {
            "index": i,
            "tokens": int(len(sample.ids)),
            "new_tokens": sample.new_tokens,
            "valid": sample.valid,
            "closed": sample.closed,
            "first_violation": sample.violation,
        }
        ids = sample.ids
        if not sample.valid:
            ids, record["dropped_tokens"] = tokenizer.grammar().repair(sample.ids)
        midi = tokenizer.decode(ids, prompt.meta)
        tick = prompt_end_tick(prompt, midi)
        if tick is not None:
            midi.markers.append(miditoolkit.Marker(PROMPT_END_MARKER, int(tick)))
        path = out_dir / f"{stem}_{i:03d}.mid"
        with atomic_path(path) as tmp:
            midi.dump(str(tmp))
        record["midi"] = path.name
        if prompt.mirex_offset is not None:
            notes = mirex.generation(new_notes(prompt, midi), midi.ticks_per_beat, prompt.mirex_offset)
            mirex.write_generation(path.with_suffix(".json"), notes)
            record["json"] = path.with_suffix(".json").name
        if not any(inst.notes for inst in midi.instruments):
            record["error"] = "no notes"  # nothing to listen to or draw
        else:
            if audio:
                record["wav"] = render_wav(path, path.with_suffix(".wav")).name
            if pianoroll:
                record["pianoroll"] = pianoroll_png(path, path.with_suffix(".png")).name
        records.append(record)
    return records


@contextlib.contextmanager
def output_set(out_dir: Path, manifest: str) -> Iterator[Path]:
    """A hidden scratch folder for one prompt's files. When the block succeeds (its last act is to
    write the manifest, `<stem>.json`) the set is published: a journal naming the old set and the
    new one is written in the scratch folder, then the old manifest and the old set's files go,
    the new files come in, and the new manifest comes in last. A kill before the journal leaves
    the old set; a kill after it, an old or new set without its manifest (never files of two
    runs side by side), which the next run into the folder completes from the journal."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _recover_dead_scratch(out_dir)
    scratch = Path(tempfile.mkdtemp(dir=out_dir, prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
    try:
        yield scratch
        journal = {
            "manifest": manifest,
            "old": sorted(_set_files(out_dir / manifest)),
            "new": sorted(p.name for p in scratch.iterdir()),
        }
        write_json(scratch / JOURNAL, journal)
        _publish(scratch, out_dir, schemas.check(journal, "publish journal", scratch / JOURNAL))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _publish(scratch: Path, out_dir: Path, journal) -> None:
    """Replace the journal's old set by the new one; done again after a kill, it ends the same.
    Every old file goes before a new one comes in: a file of the old set that is still there
    when the new one has moved in would sit beside it as if of one run."""
    (out_dir / journal.manifest).unlink(missing_ok=True)
    for name in journal.old:
        if name not in journal.new or (scratch / name).exists():  # (else the new file is already in)
            (out_dir / name).unlink(missing_ok=True)
    for name in journal.new:
        if name != journal.manifest and (scratch / name).exists():
            os.replace(scratch / name, out_dir / name)
    if (scratch / journal.manifest).exists():
        os.replace(scratch / journal.manifest, out_dir / journal.manifest)


def _set_files(manifest: Path) -> set[str]:
    """The files an earlier run's manifest lists as its set (only names the set's pattern allows)."""
    try:
        records = schemas.read(manifest, "sample summary").samples
    except MusegenError:  # no summary of ours: no set to replace
        return set()
    names = {name for r in records for name in (r.midi, r.wav, r.pianoroll, r.json_) if name}
    return {name for name in names if writes(manifest.stem, name, mirex_prompt=True)}


def _recover_dead_scratch(out_dir: Path) -> None:
    """Scratch folders of runs that are gone: a journaled set is published, the rest removed."""
    for folder in out_dir.glob(f"{SCRATCH_PREFIX}*"):
        pid = folder.name[len(SCRATCH_PREFIX) :].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(MusegenError):  # a journal cut short: its set was never published
                _publish(folder, out_dir, schemas.read(folder / JOURNAL, "publish journal"))
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True


def writes(stem: str, name: str, mirex_prompt: bool) -> bool:
    """Whether `name` is a file of the output set named `stem` (MIREX prompts add `.json` per sample)."""
    kinds = "mid|wav|png" + ("|json" if mirex_prompt else "")
    return name == f"{stem}.json" or re.fullmatch(re.escape(stem) + rf"_\d{{3,}}\.({kinds})", name) is not None
