"""Reading MIDI from untrusted sources, with one-line errors.

Parsing uses symusic (a C++ parser, far faster than mido-based readers). Callers get a
`symusic.Score` in ticks, or a `MidiError` that says in one line what is wrong.

Bounds, checked before anything is sized by the file's content:
- size: at most MAX_MIDI_BYTES (16 MiB; real songs are tens of kB, whole symphonies a few MB);
- time: every event (note ends, markers, tempo and other meta events) within MAX_BEATS beats,
  the 10,000 bars of 4/4 that either tokenizer can write (`tokenizers.base.MAX_BARS`). Time is
  summed here from the file's own delta-times in Python integers, because the parser keeps
  ticks in 32 bits, where 2^31 turns negative and 2^32 wraps back to small, plausible times.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import symusic

from .errors import MidiError
from .io import printable, read_input

MIDI_SUFFIXES = (".mid", ".midi", ".MID", ".MIDI")
MAX_MIDI_BYTES = 16 * 2**20
MAX_BEATS = 40_000  # 10,000 bars x 4 beats: the longest piece a tokenizer writes


def load_score(source: str | os.PathLike | bytes) -> symusic.Score:
    """Parse a MIDI file (path or raw bytes) into a tick-based score that has at least one note."""
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
    if division == 0:
        raise MidiError(f"{name}: invalid ticks-per-quarter 0")
    _check_length(name, max(track_end_ticks(data), default=0), division)
    try:
        score = symusic.Score.from_midi(data)
    except Exception as exc:  # the parser signals corruption with assorted exception types
        raise MidiError(f"{name}: corrupt MIDI ({_first_line(exc)})") from None
    if sum(len(t.notes) for t in score.tracks) == 0:
        raise MidiError(f"{name}: contains no notes")
    _check_parsed_times(name, score)
    return score


def _check_length(name: str, last_tick: int, tpq: int) -> None:
    if last_tick > MAX_BEATS * tpq:
        raise MidiError(f"{name}: events reach beat {last_tick // tpq:,}; musegen reads at most "
                        f"{MAX_BEATS:,} beats (10,000 bars of 4/4)")


def _check_parsed_times(name: str, score: symusic.Score) -> None:
    """The parser's own times must agree with the bound (a track the delta-time scan could not
    follow to its end is checked here instead)."""
    for track in score.tracks:
        if not len(track.notes):
            continue
        notes = track.notes.numpy()
        if notes["time"].min() < 0 or notes["duration"].min() < 0:
            raise MidiError(f"{name}: note times past 2^31 ticks")
    _check_length(name, int(score.end()), score.tpq)


def track_end_ticks(data: bytes) -> list[int]:
    """The tick of each MTrk chunk's last event before its end-of-track (exact Python integers).

    A track that stops making sense (truncated, a malformed length) is followed as far as it
    does; the parser then judges the file."""
    ends, pos = [], 8 + struct.unpack(">I", data[4:8])[0]
    while pos + 8 <= len(data):
        length = struct.unpack(">I", data[pos + 4:pos + 8])[0]
        if data[pos:pos + 4] == b"MTrk":
            ends.append(_track_end(data, pos + 8, min(len(data), pos + 8 + length)))
        pos += 8 + length
    return ends


def _track_end(data: bytes, i: int, end: int) -> int:
    tick, status = 0, 0
    while i < end:
        delta, i = _vlq(data, i, end)
        if delta is None or i >= end:
            break
        byte = data[i]
        if byte == 0xFF:  # meta event: type, length, data
            if i + 1 >= end or data[i + 1] == 0x2F:
                break  # the end-of-track's own delta is padding, no event
            length, i = _vlq(data, i + 2, end)
            if length is None:
                break
            i += length
        elif byte in (0xF0, 0xF7):  # sysex: length, data
            length, i = _vlq(data, i + 1, end)
            if length is None:
                break
            i += length
        else:  # channel message, maybe under running status
            if byte & 0x80:
                status, i = byte, i + 1
            if not status:
                break
            i += 1 if 0xC0 <= status < 0xE0 else 2
        tick += delta
    return tick


def _vlq(data: bytes, i: int, end: int) -> tuple[int | None, int]:
    """A variable-length quantity at `i` (at most 4 bytes): (value, next index), or None if malformed."""
    value = 0
    for _ in range(4):
        if i >= end:
            return None, i
        byte = data[i]
        i += 1
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, i
    return None, i


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
