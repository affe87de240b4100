"""Reading MIDI from untrusted sources, with one-line errors.

Parsing uses symusic (a C++ parser, far faster than mido-based readers). Callers get a
`symusic.Score` in ticks, or a `MidiError` that says in one line what is wrong.

Bounds, checked before the parser runs:
- only a regular file is read (a FIFO would block, /dev/zero never end), of at most
  MAX_MIDI_BYTES (16 MiB; real songs are tens of kB, whole symphonies a few MB);
- every event lies before tick 2^31. symusic keeps ticks in 32 bits: past 2^31 they come back
  negative, and past 2^32 they wrap to small, plausible times (a note moved onto the music,
  without a word), so the ticks are summed here from the file's own delta-times, in Python
  integers. How many bars a piece may have is each tokenizer's bound (10,000).
- at most MAX_TEMPOS tempo changes (one per 16th of the longest piece) and MAX_METERS time
  signatures (one per bar of it), counted on the parsed file before any reader walks them: a
  16 MiB file can hold 2.4 million tempo changes, which cost gigabytes as Python objects.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import mido
import numpy as np
import symusic

from ..errors import MidiError
from ..io import printable, read_input
from .constants import BEATS_PER_BAR, MAX_BARS

MIDI_SUFFIXES = (".mid", ".midi", ".MID", ".MIDI")
MAX_MIDI_BYTES = 16 * 2**20
MAX_TICK = 2**31 - 1  # the parser's 32-bit tick counter
MAX_TEMPOS = MAX_BARS * 4 * BEATS_PER_BAR
MAX_METERS = MAX_BARS


def source_name(source: str | os.PathLike | bytes | symusic.Score) -> str:
    """How an error names a MIDI source: its path, or "<bytes>" / "<score>" for one in memory."""
    if isinstance(source, (bytes, bytearray)):
        return "<bytes>"
    return "<score>" if isinstance(source, symusic.Score) else str(source)


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
    name, data = _midi_bytes(source)
    try:
        ends = _track_ends(data)
    except (IndexError, ValueError):  # a track symusic may read leniently: its events are checked below
        ends = []
    if ends and max(ends) > MAX_TICK:
        raise MidiError(
            f"{name}: events past tick 2^31 (tick {max(ends):,}), where the parser's 32-bit times wrap around"
        )
    try:
        score = symusic.Score.from_midi(data)
    except Exception as exc:  # the parser signals corruption with assorted exception types
        raise MidiError(f"{name}: corrupt MIDI ({_first_line(exc)})") from None
    score = _checked(score, name)
    return score, (max(ends) if ends else _last_event(score)) + 1


def _midi_bytes(source: str | os.PathLike | bytes) -> tuple[str, bytes]:
    """(printable name, bytes) of a MIDI file that passes the size, header and division checks."""
    if isinstance(source, (bytes, bytearray)):
        name, data = "<bytes>", bytes(source)
        if len(data) > MAX_MIDI_BYTES:
            raise MidiError(f"{name}: {len(data):,} bytes, more than the {MAX_MIDI_BYTES:,} a MIDI file may have")
    else:
        name = printable(source)
        data = read_input(source, "MIDI file", MAX_MIDI_BYTES, MidiError)
    if not data:
        raise MidiError(f"{name}: empty file")
    if not data.startswith(b"MThd") or len(data) < 14:
        raise MidiError(f"{name}: not a MIDI file (no MThd header)")
    division = struct.unpack(">H", data[12:14])[0]
    if division & 0x8000:
        raise MidiError(f"{name}: SMPTE time division (frames per second); musegen needs ticks per beat")
    return name, data


def _track_ends(data: bytes) -> list[int]:
    """The tick of the last event of each track chunk, read from the raw bytes."""
    ends = []
    pos = 8 + int.from_bytes(data[4:8], "big")
    while pos + 8 <= len(data):
        kind, length = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "big")
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
    ends = [
        int((n["time"].astype(np.int64) + n["duration"]).max()) if len(n["time"]) else 0
        for n in (t.notes.numpy() for t in score.tracks)
    ]
    ends += [e.time for events in (score.tempos, score.time_signatures, score.markers) for e in events]
    return max(ends + [0])


def _checked(score: symusic.Score, name: str) -> symusic.Score:
    if score.tpq <= 0:
        raise MidiError(f"{name}: invalid ticks-per-quarter {score.tpq}")
    if sum(len(t.notes) for t in score.tracks) == 0:
        raise MidiError(f"{name}: contains no notes")
    for events, what, bound, unit in (
        (score.tempos, "tempo changes", MAX_TEMPOS, "16th"),
        (score.time_signatures, "time signatures", MAX_METERS, "bar"),
    ):
        if len(events) > bound:
            raise MidiError(
                f"{name}: {len(events):,} {what}, more than a file may have ({bound:,}: one per {unit} "
                f"of the longest piece, {MAX_BARS:,} bars)"
            )
    times = [t.notes.numpy()["time"] for t in score.tracks] + [
        np.array([e.time for e in events]) for events in (score.tempos, score.time_signatures, score.markers)
    ]
    durations = [t.notes.numpy()["duration"] for t in score.tracks]
    if any(len(t) and t.min() < 0 for t in times + durations):
        raise MidiError(f"{name}: events past tick 2^31 (read back as negative times)")
    return score


def find_midi_files(folder: str | os.PathLike) -> list[Path]:
    """Every entry under `folder` with a MIDI suffix that is not a folder, sorted; a MidiError when
    there is none. FIFOs, devices, broken links and link loops are included (the reader refuses
    each in one line, so a batch counts them), and so are folders that cannot be listed."""
    folder = Path(folder)
    if not folder.exists() and not folder.is_symlink():
        raise MidiError(f"{printable(folder)}: no such folder")
    if not folder.is_dir():
        return [folder]
    found: list[Path] = []
    unreadable = lambda exc: found.append(Path(exc.filename))  # noqa: E731  (os.walk's error callback)
    for root, _, names in os.walk(folder, onerror=unreadable):
        found += [Path(root) / name for name in names if Path(name).suffix in MIDI_SUFFIXES]
    if not found:
        raise MidiError(f"{printable(folder)}: no MIDI files found")
    return sorted(found)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ---- reading a file as parts, as MusPy 0.3.0 does -------------------------------------------------


@dataclass
class Part:
    """The notes of one (MIDI track, channel, program): int64 rows (onset, offset, pitch,
    velocity) in ticks."""

    name: str | None
    program: int
    is_drum: bool
    notes: np.ndarray


@dataclass
class Parsed:
    """A MIDI file's parts and the time-stamped facts the groove tools use (ticks)."""

    name: str
    tpq: int
    parts: list[Part]
    tempos: list[tuple[int, float]] = field(default_factory=list)  # (tick, quarter notes per minute)
    time_signatures: list[tuple[int, int, int]] = field(default_factory=list)  # (tick, numerator, denominator)
    markers: list[tuple[int, str]] = field(default_factory=list)


def read_parts(source: str | os.PathLike | bytes, restrike_ends: bool = False) -> Parsed:
    """Parse a MIDI file (path or bytes) into parts, one-line MidiError for unusable input.

    A note-off ends the oldest sounding note of its pitch. With `restrike_ends`, a note-on of a
    pitch that is still sounding on its channel ends it first, as a synthesiser plays it: MMA's
    strummed tracks re-strike a string without a note-off, which the default pairing would read
    as a note lasting to the end of the track."""
    load_score(source)  # missing, empty, not MIDI, corrupt, no notes: one line each
    name = "<bytes>" if isinstance(source, (bytes, bytearray)) else str(source)
    data = bytes(source) if isinstance(source, (bytes, bytearray)) else Path(source).read_bytes()
    try:
        midi = mido.MidiFile(file=io.BytesIO(data))
    except Exception as exc:  # mido signals corruption with assorted exception types
        text = str(exc).strip().splitlines()
        raise MidiError(f"{name}: corrupt MIDI ({text[0] if text else type(exc).__name__})") from None
    if midi.type == 2:
        raise MidiError(f"{name}: MIDI type 2 (independent sequences) is not supported")
    parsed = Parsed(name, int(midi.ticks_per_beat), [])
    for index, track in enumerate(midi.tracks):
        parsed.parts.extend(
            _track_parts(track, parsed, named=midi.type == 1 and index > 0, restrike_ends=restrike_ends)
        )
    return parsed


def _track_parts(track, parsed: Parsed, named: bool, restrike_ends: bool) -> list[Part]:
    """The parts of one MIDI track; its meta events go to `parsed`. A type-1 file's first track
    names the song, not a part (MusPy's rule)."""
    time, name = 0, None
    programs = [0] * 16
    sounding: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (channel, pitch) -> [(onset, velocity)]
    found: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}  # (program, channel) -> notes

    def end(channel: int, pitch: int, notes) -> None:
        """End the sounding `notes` [(onset, velocity)] of `pitch` on `channel` at the current time."""
        found.setdefault((programs[channel], channel), []).extend(
            (onset, time, pitch, velocity) for onset, velocity in notes
        )

    for msg in track:
        time += msg.time
        kind = msg.type
        if kind == "note_on" and msg.velocity > 0:
            waiting = sounding.setdefault((msg.channel, msg.note), [])
            if restrike_ends:
                end(msg.channel, msg.note, waiting)
                waiting.clear()
            waiting.append((time, msg.velocity))
        elif kind in ("note_off", "note_on"):
            waiting = sounding.setdefault((msg.channel, msg.note), [])
            if waiting:
                end(msg.channel, msg.note, [waiting.pop(0)])
        elif kind == "program_change":
            programs[msg.channel] = msg.program
        elif kind == "set_tempo" and msg.tempo > 0:  # 0 microseconds per beat: no tempo at all
            parsed.tempos.append((time, mido.tempo2bpm(msg.tempo)))
        elif kind == "time_signature":
            parsed.time_signatures.append((time, msg.numerator, msg.denominator))
        elif kind == "marker":
            parsed.markers.append((time, msg.text))
        elif kind == "track_name" and named:
            name = msg.name
        elif kind == "end_of_track":
            break
    for (channel, pitch), waiting in sounding.items():  # still sounding: they end with the track
        end(channel, pitch, waiting)
    return [
        Part(name, program, channel == 9, np.array(notes, dtype=np.int64).reshape(-1, 4))
        for (program, channel), notes in found.items()
    ]
