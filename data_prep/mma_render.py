"""Rendering with MMA: a song file for a groove and its bars of chords, `mma` run on it, and
its MIDI written again in Groove2Groove's layout, which the groove tokenizer reads.
"""

from __future__ import annotations

import io
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import mido
import numpy as np
from tqdm import tqdm

from musegen.errors import DataError
from musegen.io import write_bytes
from musegen.music.midi import Part, read_parts
from musegen.music.roles import COUNT_IN_BEATS, G2G_BASS, G2G_DRUMS, G2G_HARMONIC

from .common import worker_pool

if TYPE_CHECKING:  # (mma_styles renders with this module: imported for the annotation only)
    from .mma_styles import Style

RENDER_TIME_LIMIT_S = 60
BASS_TRACK = re.compile(r"(bass|walk)", re.IGNORECASE)  # MMA's bass line tracks: Bass, Bass-8, Walk...
CLICK_PITCH, CLICK_VELOCITY = 37, 80  # the count-in: a side stick on every beat, an eighth note long

# Ways MMA plays a groove differently, as song-file lines (a piece's variant takes some of them:
# mma_pieces.piece_plan). Swing comes before the library is read: MMA swings a groove's patterns
# when it compiles them. New instruments are not among them: the trio's tokens carry no
# programs, so they would repeat a piece token for token.
TREATMENTS = {
    "swing": "SwingMode On Skew=66",
    "staccato": "AllTracks Articulate 60",
    "legato": "AllTracks Articulate 100",
    "inverted": "AllTracks Chord Invert 1",
    "higher": "AllTracks Chord Octave +1",
    "strummed": "AllTracks Chord Strum 15",
}
BEFORE_USE = {"swing"}
FILL_EVERY = 8  # bars in a phrase; with a fill, its last bar plays the fill groove


def mma_text(
    style: Style,
    bars: list[list[str]],
    seed: int,
    tempo: int | None = None,
    treatments: tuple[str, ...] = (),
    fill: str | None = None,
) -> str:
    """An MMA song file: `bars` (4 chords each) in the style's groove, the treatments after every
    groove change (MMA restores a groove's settings when it is selected), the fill groove for the
    last bar of every FILL_EVERY."""
    settings = [TREATMENTS[t] for t in treatments if t not in BEFORE_USE]
    lines = [TREATMENTS[t] for t in treatments if t in BEFORE_USE] + [f"Use {style.family}"]
    lines += [f"Groove {style.groove}", *settings, f"Tempo {tempo or style.tempo}", f"RndSeed {seed}"]
    for n, bar in enumerate(bars, 1):
        beats = [c if i == 0 or c != bar[i - 1] else "/" for i, c in enumerate(bar)]
        phrase_end = fill is not None and n % FILL_EVERY == 0
        lines += [f"Groove {fill}", *settings] if phrase_end else []
        lines.append(" ".join(beats))
        lines += [f"Groove {style.groove}", *settings] if phrase_end and n < len(bars) else []
    return "\n".join(lines) + "\n"


def render_mma(text: str) -> bytes:
    """Run `mma` on a song file's text and return the MIDI bytes; DataError on failure."""
    with tempfile.TemporaryDirectory(prefix="musegen-mma-") as tmp:
        src, out = Path(tmp) / "song.mma", Path(tmp) / "song.mid"
        src.write_text(text)
        try:
            # relative names: MMA writes the input's name into the file, keep it reproducible
            proc = subprocess.run(
                ["mma", "-w", "-f", out.name, src.name],
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=RENDER_TIME_LIMIT_S,
            )
        except FileNotFoundError:
            raise DataError("`mma` not found; install the Debian package mma") from None
        except subprocess.TimeoutExpired:
            raise DataError(f"mma took longer than {RENDER_TIME_LIMIT_S}s") from None
        if proc.returncode != 0 or not out.is_file():
            errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "Error" in ln]
            raise DataError(f"mma failed: {(errors or ['no output'])[0].strip()}")
        return out.read_bytes()


def render_jobs(
    work: Callable[[Any], tuple[str | None, bool]], jobs: list, pieces: int, workers: int | None, desc: str
) -> tuple[list[str], int, float]:
    """Run `work(job)` (a module-level function returning an error line or None, and whether MMA
    ran) for each job on `workers` processes, of `pieces` in all (the others done already);
    return the failures, how many MMA rendered and the seconds it took."""
    started = time.perf_counter()
    failures, rendered = [], 0
    with tqdm(total=pieces, initial=pieces - len(jobs), desc=desc, unit="piece") as progress:
        if jobs:
            with worker_pool(workers) as pool:
                for error, ran in pool.imap_unordered(work, jobs, chunksize=2):
                    progress.update(1)
                    rendered += ran
                    if error:
                        failures.append(error)
    return failures, rendered, round(time.perf_counter() - started, 1)


def to_groove2groove(raw: Path, dest: Path) -> None:
    """Write MMA's rendering `raw` in Groove2Groove's layout: the drum tracks as `BB Drums`, the
    busiest of MMA's bass-line tracks (Bass*, Walk*) as `BB Bass`, the other melodic tracks by
    decreasing note count as `BB Guitar`, `BB Piano`, `BB Strings` (any further ones are left
    out), all 2 bars later after a count-in of side-stick clicks; tempo and meter changes move
    with the music. One MIDI track per MMA track, so each keeps its own note pairing; a string that
    MMA re-strikes without a note-off ends where it is struck again."""
    parsed = read_parts(raw, restrike_ends=True)
    groups: dict[str, list[Part]] = {}
    for part in parsed.parts:
        if len(part.notes):
            groups.setdefault(("drums:" if part.is_drum else "") + (part.name or ""), []).append(part)
    count = lambda name: sum(len(p.notes) for p in groups[name])
    drums = [p for name, parts in groups.items() if name.startswith("drums:") for p in parts]
    melodic = [name for name in groups if not name.startswith("drums:")]
    bass = max((n for n in melodic if BASS_TRACK.match(n)), key=count, default=None)
    harmonic = sorted((n for n in melodic if n != bass), key=count, reverse=True)[: len(G2G_HARMONIC)]
    shift = COUNT_IN_BEATS * parsed.tpq
    clicks = np.array(
        [
            (b * parsed.tpq, b * parsed.tpq + parsed.tpq // 8, CLICK_PITCH, CLICK_VELOCITY)
            for b in range(COUNT_IN_BEATS)
        ],
        dtype=np.int64,
    )
    tracks = [(G2G_DRUMS, 9, 0, clicks)] + [(G2G_DRUMS, 9, p.program, _later(p.notes, shift)) for p in drums]
    named = ([(G2G_BASS, bass)] if bass else []) + list(zip(G2G_HARMONIC, harmonic))
    channels = iter(c for c in range(16) if c != 9)
    for g2g_name, mma_name in named:
        tracks += [(g2g_name, next(channels), p.program, _later(p.notes, shift)) for p in groups[mma_name]]
    midi = mido.MidiFile(type=1, ticks_per_beat=parsed.tpq)
    meta = [
        (0 if tick == 0 else tick + shift, mido.MetaMessage("set_tempo", tempo=mido.bpm2tempo(qpm)))
        for tick, qpm in parsed.tempos
    ]
    meta += [
        (0 if tick == 0 else tick + shift, mido.MetaMessage("time_signature", numerator=n, denominator=d))
        for tick, n, d in parsed.time_signatures
    ]
    midi.tracks.append(midi_track(meta))
    for name, channel, program, notes in tracks:
        events = [
            (0, mido.MetaMessage("track_name", name=name)),
            (0, mido.Message("program_change", channel=channel, program=program)),
        ]
        for on, off, pitch, velocity in notes.tolist():
            events.append((on, mido.Message("note_on", channel=channel, note=pitch, velocity=velocity)))
            events.append((off, mido.Message("note_off", channel=channel, note=pitch, velocity=0)))
        midi.tracks.append(midi_track(events))
    buffer = io.BytesIO()
    midi.save(file=buffer)
    write_bytes(dest, buffer.getvalue())


def _later(notes, shift: int):
    moved = notes.copy()
    moved[:, :2] += shift
    return moved


def midi_track(events: list[tuple[int, Any]]) -> mido.MidiTrack:
    """Timed messages as a track. At one tick note_ons come before note_offs, so a zero-length
    note is read as a note (first in, first out) and not as the end of an earlier one."""
    order = sorted(range(len(events)), key=lambda i: (events[i][0], events[i][1].type == "note_off", i))
    track, now = mido.MidiTrack(), 0
    for i in order:
        tick, msg = events[i]
        msg.time = tick - now  # (each message is made for this track: set in place, not copied)
        track.append(msg)
        now = tick
    track.append(mido.MetaMessage("end_of_track", time=0))
    return track
