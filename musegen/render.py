"""Listening and looking: MIDI -> WAV with FluidSynth, MIDI -> piano-roll PNG.

Audio goes through the FluidSynth command-line program (not a Python binding) so that the only
requirement is the Debian/Homebrew package, and a General MIDI soundfont. The piano roll marks
where the prompt ends when the MIDI carries musegen's prompt-end marker (see `musegen.sample`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np

from .errors import MusegenError
from .io import atomic_path
from .midi import load_score
from .plots import pyplot, save_png

INSTALL_HINT = "apt-get install fluidsynth fluid-soundfont-gm"
PROMPT_END_MARKER = "musegen:prompt_end"
SAMPLE_RATE = 44100


def soundfont_candidates() -> list[Path]:
    """General MIDI soundfonts in order of preference: FluidR3 (Debian), then pretty_midi's small one."""
    import pretty_midi

    return [Path("/usr/share/sounds/sf2/FluidR3_GM.sf2"),
            Path("/usr/share/soundfonts/FluidR3_GM.sf2"),
            Path(pretty_midi.__file__).parent / "TimGM6mb.sf2"]


def find_soundfont(soundfont: str | os.PathLike | None = None) -> Path:
    if soundfont is not None:
        path = Path(soundfont)
        if not path.is_file():
            raise MusegenError(f"{path}: soundfont not found")
        return path
    for path in soundfont_candidates():
        if path.is_file():
            return path
    raise MusegenError(f"no General MIDI soundfont found; install one with `{INSTALL_HINT}`")


def render_wav(midi_path: str | os.PathLike, wav_path: str | os.PathLike,
               soundfont: str | os.PathLike | None = None, sample_rate: int = SAMPLE_RATE) -> Path:
    """Synthesise `midi_path` to a 16-bit WAV at `wav_path` (written atomically)."""
    load_score(midi_path)  # one-line MidiError for anything FluidSynth would choke on
    exe = shutil.which("fluidsynth")
    if exe is None:
        raise MusegenError(f"fluidsynth not found; install it with `{INSTALL_HINT}`")
    font = find_soundfont(soundfont)
    wav_path = Path(wav_path)
    with atomic_path(wav_path) as tmp:
        # -T wav: the temporary name has no .wav suffix for FluidSynth to guess the type from.
        cmd = [exe, "-n", "-i", "-q", "-r", str(sample_rate), "-T", "wav", "-O", "s16",
               "-F", str(tmp), str(font), str(midi_path)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or tmp.stat().st_size <= 44:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise MusegenError(f"fluidsynth failed on {midi_path}: {detail[-1] if detail else 'no audio written'}")
        _trim_silent_tail(tmp, load_score(midi_path).to("second").end())
    return wav_path


def _trim_silent_tail(path: Path, music_end: float, threshold: int = 32, margin: float = 0.1) -> None:
    """Cut the seconds of near-silence FluidSynth appends after the last release dies out, so the
    WAV lasts as long as the music (plus what is still audibly ringing); never before `music_end`."""
    with wave.open(str(path)) as w:
        params = w.getparams()
        frames = np.frombuffer(w.readframes(params.nframes), dtype=np.int16).reshape(-1, params.nchannels)
    loud = np.flatnonzero(np.abs(frames).max(axis=1) > threshold)
    keep_until = max(music_end, (loud[-1] + 1) / params.framerate if len(loud) else 0.0) + margin
    keep = min(len(frames), int(round(keep_until * params.framerate)))
    with wave.open(str(path), "wb") as w:
        w.setparams(params)
        w.writeframes(frames[:keep].tobytes())


def prompt_end_seconds(score) -> float | None:
    """Where the prompt ends, in seconds, from musegen's marker; None when there is no marker."""
    seconds = score.to("second")
    for marker in seconds.markers:
        if marker.text == PROMPT_END_MARKER:
            return float(marker.time)
    return None


def pianoroll_png(midi_path: str | os.PathLike, png_path: str | os.PathLike, title: str | None = None) -> Path:
    """Draw every note as a bar (time in seconds x pitch), one colour per track; mark the prompt end."""
    plt = pyplot()

    score = load_score(midi_path)
    seconds = score.to("second")
    fig, ax = plt.subplots(figsize=(12, 4.5), dpi=100)
    for i, track in enumerate(t for t in seconds.tracks if len(t.notes)):
        notes = track.notes.numpy()
        label = "drums" if track.is_drum else (track.name or f"program {track.program}")
        ax.barh(notes["pitch"], np.maximum(notes["duration"], 0.02), left=notes["time"], height=0.8,
                color=f"C{i % 10}", label=label, linewidth=0)
    end = prompt_end_seconds(score)
    if end is not None:
        ax.axvline(end, color="black", linestyle="--", linewidth=1.2, label="prompt end")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("MIDI pitch")
    ax.set_title(title or Path(midi_path).name)
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    return save_png(fig, png_path)
