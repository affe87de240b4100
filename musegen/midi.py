"""Reading MIDI from untrusted sources, with one-line errors.

Parsing uses symusic (a C++ parser, far faster than mido-based readers). Callers get a
`symusic.Score` in ticks, or a `MidiError` that says in one line what is wrong. symusic keeps
ticks in 32 bits: a file whose events lie past 2^31 ticks comes back with negative times, which
is refused here rather than left to index arrays with.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import symusic

from .errors import MidiError

MIDI_SUFFIXES = (".mid", ".midi", ".MID", ".MIDI")


def load_score(source: str | os.PathLike | bytes | symusic.Score) -> symusic.Score:
    """Parse a MIDI file (path or raw bytes) into a tick-based score that has at least one note.
    A score already in memory is checked the same way."""
    return read_midi(source)[0]


def read_midi(source: str | os.PathLike | bytes | symusic.Score) -> tuple[symusic.Score, int]:
    """`load_score`, and the file's length as miditoolkit counts it (its `max_tick`): one past the
    last event of any track, end-of-track events included. For a score in memory, one past its
    last event."""
    if isinstance(source, symusic.Score):
        score = _checked(source, "<score>")
        return score, _last_event(score) + 1
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
    score = _checked(score, name)
    try:
        end = max(_track_ends(data)) + 1
    except (IndexError, ValueError):  # a track symusic read leniently: count its events instead
        end = _last_event(score) + 1
    return score, end


def _track_ends(data: bytes) -> list[int]:
    """The tick of the last event of each track chunk, read from the raw bytes."""
    ends = []
    pos = 8 + int.from_bytes(data[4:8], "big")
    while pos + 8 <= len(data):
        kind, length = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "big")
        pos += 8
        stop = min(pos + length, len(data))
        if kind == b"MTrk":
            ends.append(_track_length(data, pos, stop))
        pos = stop
    return ends


def _track_length(data: bytes, i: int, stop: int) -> int:
    """The sum of the delta times of the events in data[i:stop]."""
    tick, status = 0, 0
    while i < stop:
        delta, i = _varlen(data, i)
        tick += delta
        byte = data[i]
        if byte == 0xFF:  # meta event: type, length, data
            length, i = _varlen(data, i + 2)
            i += length
        elif byte in (0xF0, 0xF7):  # sysex: length, data
            length, i = _varlen(data, i + 1)
            i += length
        else:
            if byte & 0x80:  # a new status byte; otherwise the running status goes on
                status, i = byte, i + 1
            i += 1 if (status & 0xF0) in (0xC0, 0xD0) else 2  # program, pressure: one data byte
    return tick


def _varlen(data: bytes, i: int) -> tuple[int, int]:
    value = 0
    for _ in range(4):
        byte = data[i]
        i += 1
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, i
    raise ValueError("variable-length quantity longer than 4 bytes")


def _last_event(score: symusic.Score) -> int:
    ends = [int((n["time"].astype(np.int64) + n["duration"]).max()) if len(n["time"]) else 0
            for n in (t.notes.numpy() for t in score.tracks)]
    ends += [e.time for events in (score.tempos, score.time_signatures, score.markers) for e in events]
    return max(ends + [0])


def _checked(score: symusic.Score, name: str) -> symusic.Score:
    if score.tpq <= 0:
        raise MidiError(f"{name}: invalid ticks-per-quarter {score.tpq}")
    if sum(len(t.notes) for t in score.tracks) == 0:
        raise MidiError(f"{name}: contains no notes")
    times = [t.notes.numpy()["time"] for t in score.tracks] + [
        np.array([e.time for e in events]) for events in (score.tempos, score.time_signatures, score.markers)]
    if any(len(t) and t.min() < 0 for t in times):
        raise MidiError(f"{name}: events past tick 2^31 (read back as negative times)")
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
