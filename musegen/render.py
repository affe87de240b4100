"""Listening and looking: MIDI -> WAV with FluidSynth, MIDI -> piano-roll PNG.

Audio goes through the FluidSynth command-line program (not a Python binding) so that the only
requirement is the Debian/Homebrew package, and a General MIDI soundfont. The piano roll marks
where the prompt ends when the MIDI carries musegen's prompt-end marker (see `musegen.generation.outputs`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
import wave
from collections import deque
from pathlib import Path
from typing import Iterator

import numpy as np
import symusic

from .errors import DiskFullError, MusegenError, ResourceError
from .io import atomic_path, printable, read_head
from .music.midi import load_score
from .music.notes import PROMPT_END_MARKER
from .plots import pyplot, save_png
from .signals import StopSignalsTo

INSTALL_HINT = "apt-get install fluidsynth fluid-soundfont-gm"
SAMPLE_RATE = 44100
MAX_MINUTES = 30.0  # default bound on a render: 30 minutes of 44.1 kHz stereo 16-bit is 318 MB of WAV
TAIL_SECONDS = 5.0  # FluidSynth plays on after the last note until the voices have died out
MAX_FLUIDSYNTH_TRACKS = 127  # its player silently ignores files with more (measured with FluidSynth 2.3)
# FluidSynth's time grows with the notes it is asked to start, sounding or not: 10^6 notes took 26 s
# of CPU (2.3, Zen 4); 250,000 take about 7 s, past any real piece (POP909's longest has ~4,000).
MAX_RENDER_NOTES = 250_000
# FluidSynth plays on while a voice sounds, so one that never dies (a note held forever) makes it
# write without end: it is stopped once its WAV holds this much past the end of the music.
MAX_TAIL_SECONDS = 30.0
# ... and stopped after this many seconds, plus one per second of music: FluidSynth renders many
# times faster than real time, so slower than that is a machine too busy or a file it chokes on.
WALL_SECONDS = 60.0
POLL_SECONDS = 0.05  # how often a render looks whether it was cancelled or passed a bound


class TooLongError(ResourceError):
    """A piece longer than render writes (`max_minutes`)."""

    def __init__(self, message: str, minutes: float):
        super().__init__(message)
        self.minutes = minutes


class Cancelled(Exception):
    """The caller's `cancel` event was set: FluidSynth was stopped and nothing was written."""


def soundfont_candidates() -> list[Path]:
    """General MIDI soundfonts in order of preference: FluidR3 (Debian), then pretty_midi's small one."""
    import pretty_midi

    return [
        Path("/usr/share/sounds/sf2/FluidR3_GM.sf2"),
        Path("/usr/share/soundfonts/FluidR3_GM.sf2"),
        Path(pretty_midi.__file__).parent / "TimGM6mb.sf2",
    ]


def find_soundfont(soundfont: str | os.PathLike | None = None) -> Path:
    if soundfont is not None:
        path = Path(soundfont)
        head = read_head(path, 12, "soundfont")
        if head[:4] != b"RIFF" or head[8:12] != b"sfbk":
            raise MusegenError(f"{printable(path)}: not a SoundFont 2 file (no RIFF 'sfbk' header)")
        return path
    for path in soundfont_candidates():
        if path.is_file():
            return path
    raise MusegenError(f"no General MIDI soundfont found; install one with `{INSTALL_HINT}`")


def render_wav(
    midi_path: str | os.PathLike,
    wav_path: str | os.PathLike,
    soundfont: str | os.PathLike | None = None,
    sample_rate: int = SAMPLE_RATE,
    max_minutes: float = MAX_MINUTES,
    cancel: threading.Event | None = None,
) -> Path:
    """Synthesise `midi_path` to a 16-bit stereo WAV at `wav_path` (written atomically).

    Refused in one line: a piece longer than `max_minutes` (TooLongError; the WAV size is bounded
    by it), an output path that is the MIDI file or an existing file that is not a WAV, more
    tracks than FluidSynth plays (127) when merging them by instrument does not bring them within
    it, and (before FluidSynth starts) more than MAX_RENDER_NOTES notes. FluidSynth is stopped
    (ResourceError) when its WAV runs MAX_TAIL_SECONDS past the music or it takes longer than
    WALL_SECONDS plus the music's length; and (Cancelled) as soon as `cancel` is set."""
    score = load_score(midi_path)  # one-line MidiError for anything FluidSynth would choke on
    seconds = score.to("second").end()
    _check_size(midi_path, score, seconds, max_minutes)
    wav_path = Path(wav_path)
    refuse_to_replace(wav_path, midi_path, b"RIFF", "WAV")
    exe = shutil.which("fluidsynth")
    if exe is None:
        raise MusegenError(f"fluidsynth not found; install it with `{INSTALL_HINT}`")
    font = find_soundfont(soundfont)
    needed = int((seconds + TAIL_SECONDS) * sample_rate) * 4  # 2 channels x 16 bits
    wav_path.parent.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(wav_path.parent).free < needed:
        raise DiskFullError(f"disk full: {printable(wav_path)} needs about {needed / 2**20:,.0f} MiB")
    with _playable_midi(midi_path, score, wav_path.parent) as playable, atomic_path(wav_path) as tmp:
        # -T wav: the temporary name has no .wav suffix for FluidSynth to guess the type from.
        cmd = [exe, "-n", "-i", "-q", "-r", str(sample_rate), "-T", "wav", "-O", "s16", "-F", str(tmp)]
        bound = _Bound(tmp, 1024 + int((seconds + MAX_TAIL_SECONDS) * sample_rate) * 4, WALL_SECONDS + seconds)
        returncode, detail = _fluidsynth([*cmd, str(font), str(playable)], bound, cancel, midi_path)
        if returncode != 0 or tmp.stat().st_size <= 44:
            raise MusegenError(f"fluidsynth failed on {printable(midi_path)}: {detail or 'no audio written'}")
        _trim_silent_tail(tmp, seconds)
    return wav_path


def _check_size(midi_path: str | os.PathLike, score, seconds: float, max_minutes: float) -> None:
    """Refuse, before FluidSynth starts, what would take it too long or write too much."""
    notes = sum(len(track.notes) for track in score.tracks)
    if notes > MAX_RENDER_NOTES:
        raise ResourceError(
            f"{printable(midi_path)}: {notes:,} notes; render plays at most {MAX_RENDER_NOTES:,} "
            f"(FluidSynth's time grows with the notes it starts)"
        )
    if seconds > 60 * max_minutes:
        raise TooLongError(
            f"{printable(midi_path)}: lasts {seconds / 60:,.1f} minutes; render writes at most "
            f"{max_minutes:g} (--max-minutes)",
            seconds / 60,
        )


class _Bound:
    """How far FluidSynth may go: the WAV's size in bytes and its running time in seconds."""

    def __init__(self, wav: Path, max_bytes: int, max_seconds: float):
        self.wav, self.max_bytes, self.max_seconds = wav, max_bytes, max_seconds
        self.deadline = time.monotonic() + max_seconds

    def passed(self, midi_path: str | os.PathLike) -> str | None:
        """Why FluidSynth must stop now, in one line; None while it is within its bounds."""
        if time.monotonic() > self.deadline:
            return f"{printable(midi_path)}: FluidSynth took more than {self.max_seconds:,.0f} s; stopped"
        if self.wav.stat().st_size > self.max_bytes:
            return (
                f"{printable(midi_path)}: FluidSynth played on {MAX_TAIL_SECONDS:g} s past the end of the music "
                "(a note that never stops?); stopped"
            )
        return None


def _fluidsynth(
    cmd: list[str], bound: _Bound, cancel: threading.Event | None, midi_path: str | os.PathLike
) -> tuple[int, str]:
    """Run FluidSynth within `bound`, killed when it passes it or `cancel` is set; its exit code
    and the last line it printed. Its output is read as it comes (a full pipe would stall it)."""
    said: deque[bytes] = deque(maxlen=16)  # the end of what it printed, for the error line
    process = reader = None
    try:
        with _signals_held():  # a Ctrl-C or SIGTERM here would leave FluidSynth or its reader unknown to `finally`
            process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            reader = threading.Thread(target=lambda: said.extend(iter(lambda: process.stderr.read1(4096), b"")))
            reader.daemon = True
            reader.start()
        while True:
            try:
                process.wait(POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                pass
            if cancel is not None and cancel.is_set():
                raise Cancelled(printable(midi_path))
            why = bound.passed(midi_path)
            if why is not None:
                raise ResourceError(why)
    finally:
        if process is not None:
            if process.poll() is None:
                process.kill()
                process.wait()
            if reader is not None:
                reader.join()
            process.stderr.close()
    lines = b"".join(said).decode(errors="replace").strip().splitlines()
    return process.returncode, lines[-1] if lines else ""


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM that arrive inside the block and deliver them as it ends, to the
    handlers they had (Ctrl-C's KeyboardInterrupt, the command line's Terminated): a step that
    must not be cut in half."""
    held: list[int] = []
    try:
        with StopSignalsTo(lambda signum, _: held.append(signum)):
            yield
    finally:
        for signum in held:
            signal.raise_signal(signum)  # to the handler put back: it raises, ends the process or ignores it


def refuse_to_replace(out: Path, source: str | os.PathLike, signature: bytes, kind: str) -> None:
    """MusegenError when writing `out` would destroy the input or a file that is not a `kind`."""
    if not out.exists():
        return
    if os.path.samefile(out, source):
        raise MusegenError(f"{printable(out)}: the output is the input file; choose another path")
    if not out.is_file() or read_head(out, len(signature), f"{kind} file") != signature:
        raise MusegenError(f"{printable(out)} exists and is not a {kind} file; not replacing it")


@contextlib.contextmanager
def _playable_midi(midi_path: str | os.PathLike, score, scratch: Path) -> Iterator[Path]:
    """The MIDI file itself when FluidSynth can play it, else a copy with its tracks merged by
    instrument (FluidSynth's player ignores files of more than 127 tracks and writes silence),
    kept in a temporary folder under `scratch` (beside the WAV: nothing is written elsewhere)."""
    tracks = struct.unpack(">H", read_head(midi_path, 12, "MIDI file")[10:12])[0]  # what FluidSynth reads
    if tracks <= MAX_FLUIDSYNTH_TRACKS:
        yield Path(midi_path)
        return
    merged = merge_by_instrument(score)
    melodic = sum(not t.is_drum for t in merged.tracks)
    if melodic > 15:  # 16 channels, one of them drums
        raise MusegenError(
            f"{printable(midi_path)}: {len(score.tracks)} tracks with {melodic} pitched "
            "instruments; FluidSynth plays 127 tracks and 16 channels (15 + drums)"
        )
    with tempfile.TemporaryDirectory(prefix=".musegen-render-", dir=scratch) as folder:
        path = Path(folder) / "merged.mid"
        merged.dump_midi(str(path))
        yield path


def merge_by_instrument(score):
    """A copy of `score` with one track per (program, drums) holding all of their notes and controls,
    the notes of one key that overlap made one (on one channel they would leave FluidSynth notes
    that never end: a key's second note-on and the first note-off pair up wrongly)."""
    merged = score.copy()
    groups: dict[tuple[int, bool], object] = {}
    for track in score.tracks:
        key = (track.program, track.is_drum)
        if key not in groups:
            groups[key] = symusic.Track(name=track.name, program=track.program, is_drum=track.is_drum)
        target = groups[key]
        for field in ("notes", "controls", "pitch_bends", "pedals"):
            getattr(target, field).extend(getattr(track, field))
    merged.tracks = list(groups.values())
    for track in merged.tracks:
        track.notes = _joined_overlaps(track.notes)
        track.sort()
    return merged


def _joined_overlaps(notes):
    """`notes` where each run of same-pitch notes that overlap is one note, from the run's first
    onset to its last end, with the first note's velocity."""
    if not len(notes):
        return notes
    a = notes.numpy()
    order = np.lexsort((a["time"], a["pitch"]))
    start, pitch, velocity = a["time"][order], a["pitch"][order], a["velocity"][order]
    end = start.astype(np.int64) + a["duration"][order]
    # the latest end so far within each pitch (pitches are sorted, so an offset per pitch keeps them apart)
    offset = int(end.max()) + 1
    reach = np.maximum.accumulate(end + pitch.astype(np.int64) * offset) - pitch.astype(np.int64) * offset
    first = np.ones(len(start), dtype=bool)
    first[1:] = (pitch[1:] != pitch[:-1]) | (start[1:] >= reach[:-1])
    at = np.flatnonzero(first)
    ends = np.maximum.reduceat(end, at)
    return symusic.Note.from_numpy(start[at], (ends - start[at]).astype(a["duration"].dtype), pitch[at], velocity[at])


def _trim_silent_tail(path: Path, music_end: float, threshold: int = 32, margin: float = 0.1) -> None:
    """Cut the seconds of near-silence FluidSynth appends after the last release dies out, so the
    WAV lasts as long as the music (plus what is still audibly ringing); never before `music_end`.
    Reads a second at a time from `music_end` on and truncates in place: memory stays small."""
    with wave.open(str(path)) as w:
        rate, channels, total = w.getframerate(), w.getnchannels(), w.getnframes()
        last_loud = min(total, int(music_end * rate))
        w.setpos(last_loud)
        pos = last_loud
        while pos < total:
            block = np.frombuffer(w.readframes(rate), dtype=np.int16).reshape(-1, channels)
            if not len(block):
                break
            loud = np.flatnonzero(np.abs(block.astype(np.int32)).max(axis=1) > threshold)
            if len(loud):
                last_loud = pos + int(loud[-1]) + 1
            pos += len(block)
    _truncate_wav(path, min(total, last_loud + int(round(margin * rate))), 2 * channels)


def _truncate_wav(path: Path, frames: int, frame_bytes: int) -> None:
    """Keep the first `frames` frames of a PCM WAV: rewrite the RIFF and data sizes, cut the file."""
    with open(path, "r+b") as f:
        pos = 12  # after "RIFF" <size> "WAVE": walk the chunks to "data"
        while True:
            f.seek(pos)
            head = f.read(8)
            if len(head) < 8:
                raise MusegenError(f"fluidsynth wrote a WAV without audio data ({printable(path)})")
            size = struct.unpack("<I", head[4:])[0]
            if head[:4] == b"data":
                break
            pos += 8 + size + (size & 1)
        data_bytes = min(size, frames * frame_bytes)
        f.seek(pos + 4)
        f.write(struct.pack("<I", data_bytes))
        f.seek(4)
        f.write(struct.pack("<I", pos + data_bytes))
        f.truncate(pos + 8 + data_bytes)


def prompt_end_seconds(score) -> float | None:
    """Where the prompt ends, in seconds, from musegen's marker; None when there is no marker."""
    seconds = score.to("second")
    for marker in seconds.markers:
        if marker.text == PROMPT_END_MARKER:
            return float(marker.time)
    return None


def pianoroll_png(midi_path: str | os.PathLike, png_path: str | os.PathLike, title: str | None = None) -> Path:
    """Draw every note as a bar (time in seconds x pitch), one colour per track; mark the prompt end.

    Each track's notes are one collection of rectangles (not one artist per note), so a file of
    200,000 notes draws in seconds and little memory."""
    from matplotlib.collections import PolyCollection

    plt = pyplot()
    score = load_score(midi_path)
    refuse_to_replace(Path(png_path), midi_path, b"\x89PNG", "PNG")
    seconds = score.to("second")
    fig, ax = plt.subplots(figsize=(12, 4.5), dpi=100)
    for i, track in enumerate(t for t in seconds.tracks if len(t.notes)):
        notes = track.notes.numpy()
        x0, x1 = notes["time"], notes["time"] + np.maximum(notes["duration"], 0.02)
        y0, y1 = notes["pitch"] - 0.4, notes["pitch"] + 0.4
        boxes = np.stack(
            [np.stack([x0, y0], 1), np.stack([x0, y1], 1), np.stack([x1, y1], 1), np.stack([x1, y0], 1)], 1
        )
        label = "drums" if track.is_drum else (track.name or f"program {track.program}")
        ax.add_collection(PolyCollection(boxes, facecolors=f"C{i % 10}", linewidths=0, label=label))
    ax.autoscale_view()
    end = prompt_end_seconds(score)
    if end is not None:
        ax.axvline(end, color="black", linestyle="--", linewidth=1.2, label="prompt end")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("MIDI pitch")
    ax.set_title(printable(title or Path(midi_path).name))
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    return save_png(fig, png_path)
