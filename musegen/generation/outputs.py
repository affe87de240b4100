"""A prompt's output set: a folder holding one MIDI per sample (with optional WAV, piano roll and
MIREX JSON) and the manifest `<stem>.json`, written as a hidden scratch folder and made visible
by one rename (`output_set`)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Iterator

from pydantic import BaseModel, Field

from .. import mirex, schemas
from ..errors import ConfigError, MusegenError
from ..io import UMASK, printable, write_bytes
from ..music.notes import PROMPT_END_MARKER, NoteTable
from ..render import pianoroll_png, render_wav
from ..tokenizers.base import Tokenizer
from .loop import Sample
from .prompt import Prompt, with_piece

SCRATCH_PREFIX = ".musegen-sample-"  # hidden folders a set is written into before it is renamed into place


class SampleRecord(BaseModel):
    model_config = schemas.OPEN
    midi: schemas.Name | None = None
    wav: schemas.Name | None = None
    pianoroll: schemas.Name | None = None
    json_: schemas.Name | None = Field(None, alias="json")


class SampleStats(BaseModel):
    model_config = schemas.OPEN
    tokens_per_second: Annotated[float, Field(ge=0)] | None = None
    state_bytes: schemas.Count | None = None


class SampleSummary(BaseModel):
    """`<stem>.json` of one prompt's output set and `batch.json` of a folder of prompts."""

    model_config = schemas.OPEN
    samples: Annotated[list[SampleRecord], Field(max_length=schemas.MAX_ITEMS)]
    stats: SampleStats


SAMPLE_SUMMARY = schemas.Format("sample summary", None, SampleSummary)


def with_prompt_end(prompt: Prompt, full: NoteTable) -> NoteTable:
    """A decoded sample of `prompt` (with its piece) marked where the continuation begins, so that
    `after_prompt()` gives the continuation: the earliest of the prompt's last note end and the
    first onset the prompt alone does not have (by track, onset, pitch; a long prompt note may
    overlap the cut). Without a prompt the sample is left unmarked: all of it is new."""
    if not len(prompt.ids):
        return full
    alone = prompt.piece
    own = set(zip(alone.track.tolist(), alone.start.tolist(), alone.pitch.tolist()))
    notes = zip(full.track.tolist(), full.start.tolist(), full.pitch.tolist())
    fresh = [start for track, start, pitch in notes if (track, start, pitch) not in own]
    candidates = ([int(alone.end.max())] if len(alone) else []) + ([min(fresh)] if fresh else [])
    return replace(full, markers=[*full.markers, (min(candidates, default=0), PROMPT_END_MARKER)])


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
        piece = with_prompt_end(prompt, tokenizer.decode(ids, prompt.meta))
        path = out_dir / f"{stem}_{i:03d}.mid"
        write_bytes(path, piece.midi_bytes())
        record["midi"] = path.name
        if prompt.mirex_offset is not None:
            notes = mirex.generation(piece.after_prompt(), prompt.mirex_offset)
            mirex.write_generation(path.with_suffix(".json"), notes)
            record["json"] = path.with_suffix(".json").name
        if not len(piece):
            record["error"] = "no notes"  # nothing to listen to or draw
        else:
            if audio:
                record["wav"] = render_wav(path, path.with_suffix(".wav")).name
            if pianoroll:
                record["pianoroll"] = pianoroll_png(path, path.with_suffix(".png")).name
        records.append(record)
    return records


@contextlib.contextmanager
def output_set(set_dir: Path, stem: str) -> Iterator[Path]:
    """A hidden scratch folder beside `set_dir` for one prompt's files, named `<stem>...`. When
    the block succeeds the scratch folder becomes `set_dir` in one rename, so the set appears
    whole or not at all: a plain rename when `set_dir` is new; over an earlier set (`is_set`),
    an exchange of the two folders (Linux's renameat2), after which the old set is in the
    scratch folder and removed with it. Where the system cannot exchange, the old set is moved
    aside first: for a moment neither is there, never a mix. A kill at any point leaves complete
    sets only, and hidden scratch folders that the next run into the folder removes."""
    parent = set_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_dead_scratch(parent)
    scratch = Path(tempfile.mkdtemp(dir=parent, prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
    aside = scratch.with_name(scratch.name + "-old")
    try:
        yield scratch
        os.chmod(scratch, 0o777 & ~UMASK)  # mkdtemp's 0700 would keep the set from other users
        if not os.path.lexists(set_dir):
            os.rename(scratch, set_dir)  # (fails rather than replace a folder made meanwhile)
        elif not is_set(set_dir, stem):
            raise ConfigError(f"{printable(set_dir)}: not an output set of {printable(stem)}; it is left as it is")
        elif not _exchange(scratch, set_dir):
            os.rename(set_dir, aside)
            os.rename(scratch, set_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(aside, ignore_errors=True)


def is_set(folder: Path, stem: str) -> bool:
    """Whether `folder` holds one output set of `stem` and nothing else: a manifest `<stem>.json`
    that `sample` wrote and only files named as the set's. Only such a folder is replaced by a
    rerun; a folder holding anything else (the user's own notes) is left alone."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    names = os.listdir(folder)
    if f"{stem}.json" not in names or not all(
        set_file_name(stem, name) and (folder / name).is_file() for name in names
    ):
        return False
    try:
        schemas.read(folder / f"{stem}.json", SAMPLE_SUMMARY)
    except MusegenError:
        return False
    return True


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the folders `a` and `b` in one step; False where the system or file system cannot
    (not Linux, an old kernel, a file system without RENAME_EXCHANGE)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    sys.audit("os.rename", a, b, -1, -1)  # as os.rename does: audit hooks see this rename too
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), os.fsdecode(b))


def remove_dead_scratch(folder: Path) -> None:
    """Scratch folders of runs that are gone: an unfinished set, or an old set already replaced."""
    for scratch in folder.glob(f"{SCRATCH_PREFIX}*"):
        pid = scratch.name[len(SCRATCH_PREFIX) :].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(scratch, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True


def set_file_name(stem: str, name: str) -> bool:
    """Whether `name` is named as a file of the output set `stem`: its manifest, or a sample's MIDI,
    WAV, piano roll or MIREX JSON (a MIREX prompt's sets have one per sample)."""
    return name == f"{stem}.json" or re.fullmatch(re.escape(stem) + r"_\d{3,}\.(mid|wav|png|json)", name) is not None
