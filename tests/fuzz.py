"""A deterministic MIDI fuzz corpus: real files mutated at the byte level.

`mutants(seeds, n, seed)` draws `n` files from the seed files' bytes. Each mutant applies one to
three mutations, some blind (truncation, bit flips, spliced or lying chunk lengths) and some
aware of the file's structure, so that the parser accepts the file and the tokenizers meet
the odd content: huge and malformed delta-times, running status where none may be, absurd
tempo and time-signature events, 0-tick, orphaned and overlapping notes, dense chords, odd
headers. The same (seeds, n, seed) always gives the same bytes.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path
from typing import Callable

import miditoolkit

Event = tuple[bytes, bytes]  # (delta-time bytes, event bytes): kept raw so deltas can be malformed


def vlq(n: int) -> bytes:
    """MIDI variable-length quantity (7 bits per byte, high bit = more follows)."""
    out = [n & 0x7F]
    n >>= 7
    while n:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(reversed(out))


def tracks(data: bytes) -> list[tuple[int, int]]:
    """(offset of the length field, end of the data) of each MTrk chunk, clipped to the file."""
    found, pos = [], 14
    while pos + 8 <= len(data):
        length = struct.unpack(">I", data[pos + 4 : pos + 8])[0]
        end = min(len(data), pos + 8 + length)
        if data[pos : pos + 4] == b"MTrk":
            found.append((pos + 4, end))
        pos = pos + 8 + length
    return found


def _insert(data: bytes, rng: random.Random, events: list[Event]) -> bytes:
    """Insert `events` at the start of a random track or just before its end-of-track event,
    fixing the chunk length (mostly: a tenth of the time the old length is left as a lie)."""
    spans = tracks(data)
    if not spans:  # no track left to aim at: the events become a track of their own
        block = b"".join(d + e for d, e in events)
        return data + b"MTrk" + struct.pack(">I", len(block)) + block
    length_at, end = rng.choice(spans)
    start = length_at + 4
    if rng.random() < 0.5 and data[end - 3 : end] == b"\xff\x2f\x00":
        # "... d_eot FF 2F 00": the first event takes d_eot, the end-of-track follows at delta 0
        block = events[0][1] + b"".join(d + e for d, e in events[1:]) + b"\x00"
        at = end - 3
    else:
        block = b"".join(d + e for d, e in events)
        at = start
    out = bytearray(data[:at] + block + data[at:])
    if rng.random() < 0.9:
        old = struct.unpack(">I", data[length_at : length_at + 4])[0]
        out[length_at : length_at + 4] = struct.pack(">I", min(old + len(block), 2**32 - 1))
    return bytes(out)


def _note(on: bool, pitch: int, velocity: int = 64, channel: int = 0) -> bytes:
    return bytes([(0x90 if on else 0x80) | channel, pitch & 0x7F, velocity & 0x7F])


# ---- blind mutations ------------------------------------------------------------------------


def truncate(data, rng):
    return data[: rng.randrange(len(data))]


def bit_flips(data, rng):
    out = bytearray(data)
    for _ in range(rng.randint(1, 16)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def splice(data, rng):
    """Copy a random slice of the file to another random place (duplicated or torn events)."""
    a = rng.randrange(len(data))
    b = min(len(data), a + rng.randint(1, 256))
    at = rng.randrange(len(data))
    return data[:at] + data[a:b] + data[at:]


def chunk_length_lie(data, rng):
    spans = tracks(data)
    if not spans:
        return data
    length_at, _ = rng.choice(spans)
    lie = rng.choice([0, 1, 2**31 - 1, 2**32 - 1, rng.randrange(2**32)])
    return data[:length_at] + struct.pack(">I", lie) + data[length_at + 4 :]


def header(data, rng):
    """Format, track count or division set to edge values (0, SMPTE, 0xFFFF ...)."""
    field = rng.choice(
        [(8, [0, 1, 2, 3, 0xFFFF]), (10, [0, 1, 2, 0xFFFF]), (12, [0, 1, 0x7FFF, 0x8000, 0xE250, 0xFFFF])]
    )
    offset, values = field
    return data[:offset] + struct.pack(">H", rng.choice(values)) + data[offset + 2 :]


# ---- structure-aware mutations ----------------------------------------------------------------


def huge_delta(data, rng):
    pitch = rng.randrange(128)
    big = rng.choice([0x0FFFFFFF, 2**21, 10**6, rng.randrange(2**28)])
    deltas = [vlq(big), b"\xff\xff\xff\xff\x7f", b"\x81\x80\x80\x80\x80\x00"]  # the last two are malformed
    return _insert(data, rng, [(vlq(0), _note(True, pitch)), (rng.choice(deltas), _note(False, pitch))])


def running_status(data, rng):
    """Data bytes where no running status applies: at a track's start, after meta/sysex events,
    or status bytes sent as data."""
    pitch = rng.randrange(128)
    variants = [
        [(vlq(0), bytes([pitch, 64]))],  # no status before it at all
        [(vlq(0), b"\xff\x01\x01A"), (vlq(0), bytes([pitch, 64]))],  # running status after a meta event
        [(vlq(0), b"\xf0\x01\xf7"), (vlq(1), bytes([pitch, 0]))],  # ... and after a sysex
        [(vlq(0), b"\x90\x80\x80")],  # status bytes as data
        [(vlq(0), _note(True, pitch))]
        + [
            (vlq(rng.randrange(4)), bytes([rng.randrange(128), rng.randrange(128)])) for _ in range(rng.randint(1, 64))
        ],  # long legal runs
    ]
    return _insert(data, rng, rng.choice(variants))


def absurd_tempo(data, rng):
    tempos = [b"\xff\x51\x03" + t for t in (b"\x00\x00\x00", b"\x00\x00\x01", b"\xff\xff\xff")]
    tempos += [b"\xff\x51\x00", b"\xff\x51\x7f\x00"]  # wrong lengths
    count = rng.choice([1, 1, 2, 500])
    return _insert(data, rng, [(vlq(rng.randrange(3)), rng.choice(tempos)) for _ in range(count)])


def absurd_time_signature(data, rng):
    def signature():
        if rng.random() < 0.2:
            return rng.choice([b"\xff\x58\x00", b"\xff\x58\x02\x04"])  # wrong lengths
        return b"\xff\x58\x04" + bytes([rng.choice([0, 1, 127, 255]), rng.choice([0, 5, 31, 127, 255]), 24, 8])

    return _insert(data, rng, [(vlq(rng.randrange(2000)), signature()) for _ in range(rng.choice([1, 3, 200]))])


def zero_tick_notes(data, rng):
    """Notes that end where they start, note-offs with no note-on, velocity-0 note-ons."""
    events: list[Event] = []
    for _ in range(rng.randint(1, 50)):
        pitch = rng.randrange(128)
        kind = rng.randrange(3)
        if kind == 0:
            events += [(vlq(rng.randrange(2)), _note(True, pitch)), (vlq(0), _note(False, pitch))]
        elif kind == 1:
            events.append((vlq(0), _note(False, pitch)))
        else:
            events.append((vlq(0), _note(True, pitch, 0)))
    return _insert(data, rng, events)


def overlapping_notes(data, rng):
    """The same pitch started again before it ends, and dense chords (up to all 128 pitches)."""
    channel = rng.choice([0, 0, 9, 15])
    if rng.random() < 0.5:
        pitch = rng.randrange(128)
        events = [(vlq(0), _note(True, pitch, channel=channel)) for _ in range(rng.randint(2, 20))]
        events += [(vlq(rng.randrange(500)), _note(False, pitch, channel=channel)) for _ in range(rng.randint(1, 3))]
    else:
        pitches = rng.sample(range(128), rng.randint(20, 128))
        events = [(vlq(0), _note(True, p, rng.randint(1, 127), channel)) for p in pitches]
        events += [(vlq(rng.choice([0, 1, 480, 100000])), _note(False, p, channel=channel)) for p in pitches]
    return _insert(data, rng, events)


MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    f.__name__: f
    for f in (
        truncate,
        bit_flips,
        splice,
        chunk_length_lie,
        header,
        huge_delta,
        running_status,
        absurd_tempo,
        absurd_time_signature,
        zero_tick_notes,
        overlapping_notes,
    )
}
# Blind mutations mostly break the file outright; the structured ones reach the tokenizers.
WEIGHTS = {"truncate": 1, "bit_flips": 2, "splice": 1, "chunk_length_lie": 1, "header": 1}  # the others: 3


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, list[str]]:
    names = list(MUTATIONS)
    applied = rng.choices(names, [WEIGHTS.get(n, 3) for n in names], k=rng.choice([1, 1, 2, 3]))
    for name in applied:
        if data:
            data = MUTATIONS[name](data, rng)
    return data, applied


def mutants(seeds: list[Path], n: int, seed: int = 0) -> list[tuple[str, bytes]]:
    """`n` (file name, bytes) pairs; the name says the seed file and the mutations applied."""
    rng = random.Random(seed)
    sources = [(p.stem, p.read_bytes()) for p in seeds]
    out = []
    for i in range(n):
        stem, data = sources[i % len(sources)]
        data, applied = mutate(data, rng)
        out.append((f"{i:05d}_{stem}__{'+'.join(applied)}.mid", data))
    return out


def write_corpus(folder: Path, corpus: list[tuple[str, bytes]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in corpus:
        (folder / name).write_bytes(data)
    return folder


def trio_midi(path: Path) -> Path:
    """A bass + drums + piano bar pattern: a seed that the groove tokenizer accepts in full."""
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    bass, drums, piano = miditoolkit.Instrument(33), miditoolkit.Instrument(0, is_drum=True), miditoolkit.Instrument(0)
    for beat in range(16):
        t = beat * 480
        bass.notes.append(miditoolkit.Note(90, 36 + (beat // 4) * 2, t, t + 400))
        drums.notes.append(miditoolkit.Note(100, 36 if beat % 2 == 0 else 38, t, t + 60))
        piano.notes += [miditoolkit.Note(70, p, t, t + 240) for p in (60, 64, 67)]
    midi.instruments += [bass, drums, piano]
    midi.dump(str(path))
    return path


def log_line(line: str) -> None:
    """Print a robustness figure (visible with -s) and append it to $MUSEGEN_ROBUSTNESS_LOG if set
    (xdist workers swallow prints)."""
    print(f"\n{line}")
    if os.environ.get("MUSEGEN_ROBUSTNESS_LOG"):
        with open(os.environ["MUSEGEN_ROBUSTNESS_LOG"], "a") as f:
            f.write(line + "\n")
