"""Reading MIDI from untrusted sources, with one-line errors.

Parsing uses symusic (a C++ parser, far faster than mido-based readers). Callers get a
`symusic.Score` in ticks, or a `MidiError` that says in one line what is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path

import symusic

from .errors import MidiError

MIDI_SUFFIXES = (".mid", ".midi", ".MID", ".MIDI")


def load_score(source: str | os.PathLike | bytes) -> symusic.Score:
    """Parse a MIDI file (path or raw bytes) into a tick-based score that has at least one note."""
    if isinstance(source, (bytes, bytearray)):
        name, data = "<bytes>", bytes(source)
    else:
        path = Path(source)
        name = str(path)
        if not path.exists():
            raise MidiError(f"{name}: no such file")
        if path.is_dir():
            raise MidiError(f"{name}: is a folder, not a MIDI file")
        data = path.read_bytes()
    if not data:
        raise MidiError(f"{name}: empty file")
    if not data.startswith(b"MThd"):
        raise MidiError(f"{name}: not a MIDI file (no MThd header)")
    try:
        score = symusic.Score.from_midi(data)
    except Exception as exc:  # the parser signals corruption with assorted exception types
        raise MidiError(f"{name}: corrupt MIDI ({_first_line(exc)})") from None
    if score.tpq <= 0:
        raise MidiError(f"{name}: invalid ticks-per-quarter {score.tpq}")
    if sum(len(t.notes) for t in score.tracks) == 0:
        raise MidiError(f"{name}: contains no notes")
    return score


def find_midi_files(folder: str | os.PathLike) -> list[Path]:
    """All MIDI files under `folder`, sorted, or a MidiError when there are none."""
    folder = Path(folder)
    if not folder.exists():
        raise MidiError(f"{folder}: no such folder")
    if folder.is_file():
        return [folder]
    files = sorted(p for p in folder.rglob("*") if p.suffix in MIDI_SUFFIXES and p.is_file())
    if not files:
        raise MidiError(f"{folder}: no MIDI files found")
    return files


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
