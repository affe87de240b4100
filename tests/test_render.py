"""musegen render: FluidSynth WAV of the right duration, piano roll with the prompt-end mark; files
FluidSynth cannot read whole are merged, and only a real soundfont is passed to it."""

from __future__ import annotations

import shutil
import wave

import extreme
import miditoolkit
import numpy as np
import pytest
import symusic

from musegen import render
from musegen.cli import main
from musegen.errors import MusegenError

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
    notes = lambda s: sorted((n.time, n.duration, n.pitch) for t in s.tracks for n in t.notes)  # noqa: E731
    assert notes(merged) == notes(score) and merged.end() == score.end()


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
