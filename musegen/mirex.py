"""The note lists of the MIREX 2025 piano continuation task, to and from MIDI.

The task gives a prompt as JSON, `{"prompt": [{"start": 16, "pitch": 72, "duration": 6}, ...]}`,
times and durations in sixteenth notes of 4/4 bars (5 bars, the first a pickup: starts 0..79),
and takes a continuation in the same form under `"generation"` (12 bars: starts 80..271),
counted from the same origin. The notes carry no velocity and no tempo, so a prompt becomes a
one-track piano MIDI file at a fixed TEMPO_BPM and VELOCITY (480 ticks per beat, 120 per 16th).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, ClassVar, Iterable, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from . import schemas
from .errors import MidiError
from .io import write_json
from .music.constants import BEATS_PER_BAR, MAX_BARS, MAX_PROMPT_BARS, TICKS_PER_BEAT
from .music.notes import NoteTable, Track

SIXTEENTHS_PER_BAR = 4 * BEATS_PER_BAR
TICKS_PER_SIXTEENTH = TICKS_PER_BEAT // 4
TEMPO_BPM = 120.0  # the task states no tempo; 120 bpm is MIDI's own default
VELOCITY = 80  # the task states no dynamics; mezzo-forte, inside REMI's velocity bins (40..86)
MAX_FILE_BYTES = 16 * 2**20  # a prompt of 10,000 bars of dense piano is a few MB


MIREX_MAX_TIME = MAX_BARS * SIXTEENTHS_PER_BAR  # in 16ths: the latest a note may end, as long as a piece may be
# The latest a prompt's note may end: its continuation, counted from the same origin, then has
# MAX_BARS - MAX_PROMPT_BARS bars of room before MIREX_MAX_TIME.
MIREX_PROMPT_MAX_TIME = MAX_PROMPT_BARS * SIXTEENTHS_PER_BAR


def _ends_by(note: "MirexNote", limit: int, what: str) -> None:
    if note.start + note.duration > limit:
        bars = limit // SIXTEENTHS_PER_BAR
        raise PydanticCustomError("too_late", f"ends after 16th {limit:,} ({bars:,} bars, {what})")


class MirexNote(BaseModel):
    """A note of a continuation musegen writes (`"generation"`): it ends by `LATEST`."""

    LATEST: ClassVar[tuple[int, str]] = (MIREX_MAX_TIME, "the longest piece")
    model_config = ConfigDict(strict=True, allow_inf_nan=False)  # extra keys (velocity, ...) ignored
    start: Annotated[int, Field(ge=0)]  # 16ths from the task's origin
    pitch: schemas.Pitch
    duration: Annotated[int, Field(ge=1)]

    @model_validator(mode="after")
    def _in_time(self) -> "MirexNote":
        _ends_by(self, *self.LATEST)
        return self


class MirexPromptNote(MirexNote):
    LATEST = (MIREX_PROMPT_MAX_TIME, "the longest prompt")


class MirexPrompt(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False)
    prompt: Annotated[list[MirexPromptNote], Field(min_length=1, max_length=2**20)]


class MirexGeneration(BaseModel):
    model_config = schemas.STRICT
    generation: list[MirexNote]


MIREX_PROMPT = schemas.Format("mirex prompt", None, MirexPrompt)
MIREX_GENERATION = schemas.Format("mirex generation", None, MirexGeneration)


class Note(NamedTuple):
    start: int  # 16ths from the origin
    pitch: int
    duration: int  # 16ths, at least 1


def read_prompt(path: str | os.PathLike) -> list[Note]:
    """The notes of a task prompt file, checked against its schema (which bounds them by a piece's length)."""
    path = Path(path)
    if path.stat().st_size > MAX_FILE_BYTES:
        raise MidiError(f"{path}: {path.stat().st_size:,} bytes, more than a prompt can be ({MAX_FILE_BYTES:,})")
    return sorted(Note(n.start, n.pitch, n.duration) for n in schemas.read(path, MIREX_PROMPT).prompt)


def prompt_midi(notes: Iterable[Note]) -> bytes:
    """A MIDI file of the notes: 4/4, TEMPO_BPM, every note at VELOCITY on one piano track."""
    rows = [
        (n.start * TICKS_PER_SIXTEENTH, (n.start + n.duration) * TICKS_PER_SIXTEENTH, n.pitch, VELOCITY) for n in notes
    ]
    piano = Track("Piano", 0, False)
    return NoteTable.of_tracks(TICKS_PER_BEAT, [(piano, rows)], [(0, TEMPO_BPM)], [(0, 4, 4)]).midi_bytes()


def sixteenths(ticks: int, ticks_per_beat: int) -> int:
    """The nearest 16th note of a tick time (halves up)."""
    return int((8 * int(ticks) + ticks_per_beat) // (2 * ticks_per_beat))


def origin_offset(notes: list[Note], decoded: NoteTable) -> int:
    """What to add to a 16th-note time of the decoded prompt to get the JSON's time: the tokens
    may not keep the origin (an encoder that drops leading empty bars, such as a blank pickup)."""
    return notes[0].start - sixteenths(decoded.start.min(), decoded.tpq) if len(decoded) else 0


def generation(notes: NoteTable, offset: int) -> list[dict[str, int]]:
    """Decoded notes as task notes: 16ths from the prompt's origin, each at least a 16th long.
    The format holds a piece of MAX_BARS bars from that origin (MIREX_MAX_TIME): a note
    held past its end is cut there, one that starts after it left out (only a continuation of
    thousands of bars reaches it: a prompt ends by MIREX_PROMPT_MAX_TIME)."""
    out = []
    for on, off, pitch in zip(notes.start.tolist(), notes.end.tolist(), notes.pitch.tolist()):
        start = sixteenths(on, notes.tpq) + offset  # the origin first, then the bound
        if start >= MIREX_MAX_TIME:
            continue
        end = min(sixteenths(off, notes.tpq) + offset, MIREX_MAX_TIME)
        out.append({"start": start, "pitch": pitch, "duration": max(1, end - start)})
    return sorted(out, key=lambda n: (n["start"], n["pitch"], n["duration"]))


def write_generation(path: str | os.PathLike, notes: list[dict[str, int]]) -> None:
    data = {"generation": notes}
    schemas.check(data, MIREX_GENERATION, path)  # what musegen writes, its readers read back
    write_json(path, data)
