"""Valid but extreme MIDI files, built byte by byte, and the file-system oddities around them.

Each generator returns the bytes of a well-formed Standard MIDI File that pushes one limit:
ticks per beat at 1 and at the format's edges, delta-times at the largest a variable-length
quantity holds (2^28 - 1) summed past 2^31 and 2^32, a note lasting 10^6 beats, 200,000 notes
in one bar, markers and tempo events far past the last note, 1,000 tracks. The files are
small (most under 200 bytes; the dense bar is the largest at 1.2 MB) and deterministic.
`MIDI_CASES` names them all; `tests/test_extreme.py` runs them through the real commands.
"""

from __future__ import annotations

import random
import struct
from typing import Callable, Iterable

from fuzz import vlq

VLQ_MAX = 2**28 - 1  # four 7-bit groups: the largest delta-time a MIDI file can state
Event = tuple[int, bytes]  # (delta-time in ticks, event bytes)


def track(events: Iterable[Event]) -> bytes:
    """An MTrk chunk of `events`, closed by an end-of-track event at delta 0."""
    body = b"".join(vlq(delta) + data for delta, data in events) + b"\x00\xff\x2f\x00"
    return b"MTrk" + struct.pack(">I", len(body)) + body


def smf(tracks: list[bytes], division: int = 480) -> bytes:
    """A Standard MIDI File: format 0 for one track, format 1 for several."""
    fmt = 0 if len(tracks) == 1 else 1
    return b"MThd" + struct.pack(">IHHH", 6, fmt, len(tracks), division) + b"".join(tracks)


def on(pitch: int, velocity: int = 80, channel: int = 0) -> bytes:
    return bytes([0x90 | channel, pitch, velocity])


def off(pitch: int, channel: int = 0) -> bytes:
    return bytes([0x80 | channel, pitch, 0])


def marker(text: str) -> bytes:
    return b"\xff\x06" + vlq(len(text)) + text.encode()


def tempo(bpm: float) -> bytes:
    return b"\xff\x51\x03" + int(60e6 / bpm).to_bytes(3, "big")


def after(ticks: int, data: bytes) -> list[Event]:
    """`data` `ticks` after the previous event, however far: gaps beyond one delta-time are
    bridged with empty text events."""
    fillers = [(VLQ_MAX, b"\xff\x01\x00")] * (ticks // VLQ_MAX)
    return fillers + [(ticks % VLQ_MAX, data)]


def melody(bars: int = 2, tpq: int = 480, channel: int = 0, base: int = 60) -> list[Event]:
    """Quarter notes up and down a scale: ordinary music to put an extreme event next to."""
    events: list[Event] = []
    for beat in range(4 * bars):
        pitch = base + (0, 2, 4, 5, 7, 5, 4, 2)[beat % 8]
        events += [(0, on(pitch, channel=channel)), (tpq, off(pitch, channel))]
    return events


def trio(bars: int = 2, tpq: int = 480) -> list[bytes]:
    """Bass, drums and piano tracks: material the groove tokenizer reads as well as REMI."""
    bass = [(0, b"\xc0\x21")] + melody(bars, tpq, channel=0, base=36)
    drums: list[Event] = []
    for beat in range(4 * bars):
        drums += [
            (0, on(36 if beat % 2 == 0 else 38, channel=9)),
            (tpq // 4, off(36 if beat % 2 == 0 else 38, 9)),
            (tpq - tpq // 4, b"\xff\x01\x00"),
        ]  # (an empty text event pads the beat)
    piano = [(0, b"\xc1\x00")] + melody(bars, tpq, channel=1, base=64)
    return [track(bass), track(drums), track(piano)]


# ---- the cases ---------------------------------------------------------------------------------


def tpq1_long_note() -> bytes:
    """52 bytes: 1 tick per beat and a note lasting 10^6 beats (the chord detector's 16 GiB ask)."""
    return smf([track([(0, on(60)), (10**6, off(60))])], division=1)


def tpq1_melody() -> bytes:
    return smf([track(melody(4, tpq=1))], division=1)


def tpq_max_melody() -> bytes:
    """32,767 ticks per beat, the largest a (non-SMPTE) MIDI header can state."""
    return smf([track(melody(4, tpq=32767))], division=32767)


def division_65535() -> bytes:
    """A division of 65,535: the top bit marks SMPTE timing, which musical tokenizers cannot use."""
    return smf([track(melody(2, tpq=480))], division=65535)


def note_million_beats() -> bytes:
    """One note lasting 10^6 beats at 480 ticks per beat (4.8e8 ticks), after some ordinary music."""
    return smf([track(melody(1) + [(0, on(48))] + after(480 * 10**6, off(48)))])


def deltas_past_2_31() -> bytes:
    """Largest delta-times summed past 2^31 ticks: a 32-bit tick counter turns negative here."""
    return smf([track(melody(1) + after(2**31, on(60)) + [(480, off(60))])])


def deltas_past_2_32() -> bytes:
    """... and past 2^32 (16 x (2^28 - 1)), where a 32-bit counter wraps back to small positive ticks."""
    return smf([track(melody(1) + after(2**32, on(60)) + [(480, off(60))])])


def long_note_past_2_32() -> bytes:
    """A note whose end lies 2^32 - 1 ticks after its start: its duration wraps in 32 bits."""
    return smf([track(melody(1) + [(0, on(60))] + after(2**32 - 1, off(60)))])


def dense_bar(notes: int = 200_000, seed: int = 0) -> bytes:
    """200,000 notes in one 4/4 bar at 480 ticks per beat, about a hundred at every tick, each
    one tick long (running status and velocity-0 note-offs keep it to six bytes a note)."""
    rng = random.Random(seed)
    timed = []  # (tick, note-off first, data bytes under running status 0x90)
    for i in range(notes):
        start, pitch = rng.randrange(4 * 480), 21 + i % 88
        timed += [(start, 1, bytes([pitch, 90])), (start + 1, 0, bytes([pitch, 0]))]
    timed.sort()
    body, now = bytearray(), 0
    for i, (tick, _, data) in enumerate(timed):
        body += vlq(tick - now) + (b"\x90" if i == 0 else b"") + data
        now = tick
    body += b"\x00\xff\x2f\x00"
    return b"MThd" + struct.pack(">IHHH", 6, 0, 1, 480) + b"MTrk" + struct.pack(">I", len(body)) + bytes(body)


def dense_trio(notes: int = 100_000, seed: int = 0) -> bytes:
    """100,000 notes in one bar shared by bass, drums and piano (channels 0, 9, 1), with a status
    byte on every event: 800 kB, for the groove tokenizer and the style metrics."""
    rng = random.Random(seed)
    timed = []
    for i in range(notes):
        channel, start = (0, 9, 1)[i % 3], rng.randrange(4 * 480)
        pitch = {0: 28 + i % 24, 9: 35 + i % 46, 1: 48 + i % 48}[channel]
        timed += [(start, 1, on(pitch, 90, channel)), (start + 1, 0, bytes([0x90 | channel, pitch, 0]))]
    timed.sort()
    events, now = [(0, b"\xc0\x21")], 0
    for tick, _, data in timed:
        events.append((tick - now, data))
        now = tick
    return smf([track(events)])


def far_marker() -> bytes:
    """Two bars of music, then a marker 2^28 - 1 ticks (about 560,000 beats) later."""
    return smf([track(melody(2) + [(VLQ_MAX, marker("far"))])])


def far_chord_marker() -> bytes:
    """A chord marker (what REMI decodes write) far past the last note."""
    return smf([track([(0, marker("C_M"))] + melody(2) + [(VLQ_MAX, marker("G_M"))])])


def far_tempo() -> bytes:
    """A tempo change 2^28 - 1 ticks past the last note."""
    return smf([track([(0, tempo(120))] + melody(2) + [(VLQ_MAX, tempo(60))])])


def note_39000_beats() -> bytes:
    """A note lasting 39,000 beats at 32,767 ticks per beat (1.28e9 ticks): inside every bound."""
    return smf([track(melody(1, tpq=32767) + [(0, on(48))] + after(32767 * 39_000, off(48)))], division=32767)


def marker_within_limit() -> bytes:
    """A marker at beat 39,000: far, but inside the 10,000-bar limit (it must cost little)."""
    return smf([track(melody(2) + [(480 * 39_000, marker("late"))])])


def thousand_tracks(count: int = 1000) -> bytes:
    """1,000 tracks, each one note of a slow arpeggio on channels 0-15 (drums on 9)."""
    tracks = []
    for i in range(count):
        channel, pitch, start = i % 16, 36 + i % 60, (i % 64) * 240
        tracks.append(track([(start, on(pitch, channel=channel)), (480, off(pitch, channel))]))
    return smf(tracks)


def thousand_tracks_trio() -> bytes:
    """A bass/drums/piano trio followed by 997 one-note tracks (groove must still find its trio)."""
    extra = [
        track([(i % 64 * 120, on(60 + i % 12, channel=2 + i % 7)), (120, off(60 + i % 12, 2 + i % 7))])
        for i in range(997)
    ]
    return smf(trio(2) + extra)


MIDI_CASES: dict[str, Callable[[], bytes]] = {
    f.__name__: f
    for f in (
        tpq1_long_note,
        tpq1_melody,
        tpq_max_melody,
        division_65535,
        note_million_beats,
        deltas_past_2_31,
        deltas_past_2_32,
        long_note_past_2_32,
        note_39000_beats,
        dense_bar,
        dense_trio,
        far_marker,
        far_chord_marker,
        far_tempo,
        marker_within_limit,
        thousand_tracks,
        thousand_tracks_trio,
    )
}
