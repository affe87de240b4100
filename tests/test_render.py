"""musegen render: FluidSynth WAV of the right duration, piano roll with the prompt-end mark; files
FluidSynth cannot read whole are merged, and only a real soundfont is passed to it."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import wave
from pathlib import Path

import extreme
import miditoolkit
import numpy as np
import pytest
import symusic

from musegen import render
from musegen.cli import main, terminate
from musegen.errors import MusegenError, ResourceError

needs_fluidsynth = pytest.mark.skipif(shutil.which("fluidsynth") is None, reason="fluidsynth not installed")


def short_song(pop909_songs, tmp_path, seconds=6.0):
    """`seconds` of a POP909 song from its first note, with a prompt-end marker at 2 s."""
    score = symusic.Score(str(pop909_songs[0])).to("second")
    first = min(n.time for t in score.tracks for n in t.notes)
    score = score.clip(first, first + seconds, clip_end=True).shift_time(-first)
    path = tmp_path / "short.mid"
    score.to("tick").dump_midi(str(path))
    midi = miditoolkit.MidiFile(str(path))
    midi.markers.append(miditoolkit.Marker(render.PROMPT_END_MARKER, midi.get_tick_to_time_mapping().searchsorted(2.0)))
    midi.dump(str(path))
    return path, max(n.end for t in score.tracks for n in t.notes)


def read_wav(path):
    with wave.open(str(path)) as w:
        frames = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).reshape(-1, w.getnchannels())
        return frames, w.getframerate()


@needs_fluidsynth
def test_render_writes_nonsilent_wav_of_the_midi_duration(pop909_songs, tmp_path, capsys):
    midi, end = short_song(pop909_songs, tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["render", str(midi), "--out", str(tmp_path / "a.wav"), "--pianoroll", str(tmp_path / "a.png")])
    assert (exit_.value.code or 0) == 0, capsys.readouterr().err
    frames, rate = read_wav(tmp_path / "a.wav")
    duration = len(frames) / rate
    # FluidSynth renders to the last note-off plus the release tail of the voices still ringing
    assert end <= duration <= end + 1.5
    half_seconds = frames[: int(end * rate) // (rate // 2) * (rate // 2)].astype(float).reshape(-1, rate // 2, 2)
    rms = np.sqrt((half_seconds**2).mean(axis=(1, 2)))
    assert np.mean(rms > 100) >= 0.8  # 16-bit samples: sound through (nearly) all of the music
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes left nothing behind


def test_prompt_end_is_read_from_the_marker(pop909_songs, tmp_path):
    midi, _ = short_song(pop909_songs, tmp_path)
    assert render.prompt_end_seconds(symusic.Score(str(midi))) == pytest.approx(2.0, abs=0.01)


def test_missing_fluidsynth_says_how_to_install(pop909_songs, tmp_path, monkeypatch):
    monkeypatch.setattr(render.shutil, "which", lambda name: None)
    with pytest.raises(MusegenError, match="apt-get install fluidsynth fluid-soundfont-gm"):
        render.render_wav(pop909_songs[0], tmp_path / "x.wav")
    assert not (tmp_path / "x.wav").exists()


def test_render_bad_input_is_one_line(tmp_path, capsys):
    (tmp_path / "bad.mid").write_text("hello")
    cases = [
        ["render", str(tmp_path / "bad.mid"), "--out", str(tmp_path / "x.wav")],
        ["render", str(tmp_path / "missing.mid"), "--pianoroll", str(tmp_path / "x.png")],
        ["render", str(tmp_path / "bad.mid")],
    ]
    for args in cases:
        with pytest.raises(SystemExit) as exit_:
            main(args)
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 1 and err.startswith("error:") and "\n" not in err, err
    assert not (tmp_path / "x.wav").exists() and not (tmp_path / "x.png").exists()


def test_more_tracks_than_fluidsynth_reads_are_merged_by_instrument():
    score = symusic.Score.from_midi(extreme.thousand_tracks_trio())
    merged = render.merge_by_instrument(score)
    assert len(score.tracks) == 1000 and len(merged.tracks) == 3 <= render.MAX_FLUIDSYNTH_TRACKS
    assert sorted((t.program, t.is_drum) for t in merged.tracks) == [(0, False), (0, True), (33, False)]
    # the same sound, where notes of one key overlapping on one channel are one note (their union)
    assert spans(merged) == spans(score) and merged.end() == score.end()
    assert sum(len(t.notes) for t in merged.tracks) < sum(len(t.notes) for t in score.tracks)


def spans(score) -> dict[tuple, list[tuple[int, int]]]:
    """For each (program, drums, pitch): the stretches of time its notes sound, overlaps joined."""
    found: dict[tuple, list[tuple[int, int]]] = {}
    for track in score.tracks:
        for n in track.notes:
            found.setdefault((track.program, track.is_drum, n.pitch), []).append((n.time, n.time + n.duration))
    joined = {}
    for key, notes in found.items():
        joined[key] = []
        for start, end in sorted(notes):
            if joined[key] and start < joined[key][-1][1]:
                joined[key][-1] = (joined[key][-1][0], max(end, joined[key][-1][1]))
            else:
                joined[key].append((start, end))
    return joined


def test_only_a_soundfont_2_file_is_taken_as_soundfont(tmp_path):
    for path, words in (
        ("/etc/passwd", "not a SoundFont 2 file"),
        (tmp_path, "is a folder"),
        (tmp_path / "none.sf2", "no such file"),
    ):
        with pytest.raises(MusegenError, match=words):
            render.find_soundfont(path)
    real = next((p for p in render.soundfont_candidates() if p.is_file()), None)
    if real is not None:
        assert render.find_soundfont(real) == real


def fluidsynth_children() -> list[int]:
    """Processes of FluidSynth started by this test process and still running."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:  # ended while listed
            continue
        if fields.get("Name", "").strip() == "fluidsynth" and int(fields.get("PPid", 0)) == os.getpid():
            found.append(int(status.parent.name))
    return found


def held_note_midi(path: Path) -> Path:
    """A second of organ where one key is pressed and never released: FluidSynth plays it for ever."""
    organ = [(0, b"\xc0\x13"), (0, extreme.on(64, 90)), (0, extreme.on(60, 90)), (960, extreme.off(60))]
    path.write_bytes(extreme.smf([extreme.track(organ)]))
    return path


def hostile_tracks_midi(path: Path) -> Path:
    """The red team's file: 999 tracks on 9 channels, 2 seconds, each channel's tracks sounding the
    same few keys over each other (merged onto one channel: notes of one key overlapping)."""
    programs = [0, 16, 19, 48, 52, 33, 40, 56, 73]
    tracks = []
    for i in range(999):
        channel, pitch = i % 9, 60 + i % 5
        events = [(0, bytes([0xC0 | channel, programs[channel]])), ((i * 37) % 960, extreme.on(pitch, 90, channel))]
        tracks.append(extreme.track(events + [(960, extreme.off(pitch, channel))]))
    path.write_bytes(extreme.smf(tracks))
    return path


@needs_fluidsynth
def test_a_note_that_never_ends_stops_fluidsynth_in_one_line(tmp_path):
    started = time.monotonic()
    with pytest.raises(ResourceError, match=r"/held\.mid: FluidSynth played on 30 s past the end of the music"):
        render.render_wav(held_note_midi(tmp_path / "held.mid"), tmp_path / "held.wav")
    assert time.monotonic() - started < 60  # (about a second: it wrote for ever before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held.mid"] and not fluidsynth_children()


@needs_fluidsynth
def test_999_tracks_on_9_channels_render_their_2_seconds(tmp_path):
    midi = hostile_tracks_midi(tmp_path / "tracks.mid")
    render.render_wav(midi, tmp_path / "tracks.wav")
    frames, rate = read_wav(tmp_path / "tracks.wav")
    assert 2.0 <= len(frames) / rate <= 2.0 + render.TAIL_SECONDS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tracks.mid", "tracks.wav"] and not fluidsynth_children()


@needs_fluidsynth
def test_a_render_stops_when_cancelled_or_past_its_time(tmp_path, monkeypatch):
    midi = held_note_midi(tmp_path / "held.mid")
    cancel = threading.Event()
    cancel.set()  # (set before: FluidSynth is started, then killed at its first look)
    with pytest.raises(render.Cancelled):
        render.render_wav(midi, tmp_path / "held.wav", cancel=cancel)
    monkeypatch.setattr(render, "WALL_SECONDS", -1.0)  # (its second of music is its whole allowance)
    with pytest.raises(ResourceError, match=r"/held\.mid: FluidSynth took more than 0 s; stopped$"):
        render.render_wav(midi, tmp_path / "held.wav")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held.mid"] and not fluidsynth_children()


@needs_fluidsynth
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("step", ["Popen", "Thread"])
def test_a_signal_while_fluidsynth_starts_stops_it_and_leaves_no_file(tmp_path, monkeypatch, signum, step):
    """SIGTERM (under the command line's handler) or Ctrl-C arriving while FluidSynth or the
    thread reading its output is being started, before the render holds them: the signal still
    stops the render, FluidSynth is killed and no temporary WAV is left (it was not: the render's
    temporary file exists before FluidSynth starts, and a signal in that moment left FluidSynth
    running and writing it)."""
    midi = held_note_midi(tmp_path / "held.mid")
    module = render.subprocess if step == "Popen" else render.threading
    real = getattr(module, step)
    made = []

    def then_signal(*args, **kwargs):
        made.append(real(*args, **kwargs))
        os.kill(os.getpid(), signum)  # Python runs the handler here, before the object is returned
        return made[-1]

    monkeypatch.setattr(module, step, then_signal)
    monkeypatch.setattr(terminate, "handler_pid", os.getpid())
    previous = signal.signal(signal.SIGTERM, terminate.on_sigterm)
    try:
        with pytest.raises(terminate.Terminated if signum == signal.SIGTERM else KeyboardInterrupt):
            render.render_wav(midi, tmp_path / "held.wav")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert made and not fluidsynth_children()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["held.mid"]


def test_a_piece_too_long_is_refused_before_fluidsynth_starts(tmp_path):
    path = tmp_path / "long.mid"
    path.write_bytes(extreme.smf([extreme.track([(0, extreme.on(60)), (480 * 2 * 61, extreme.off(60))])]))
    with pytest.raises(render.TooLongError, match=r"lasts 1\.0 minutes; render writes at most 0\.5 \(--max-minutes\)"):
        render.render_wav(path, tmp_path / "long.wav", max_minutes=0.5)
    assert not (tmp_path / "long.wav").exists()
