"""`musegen sample` output sets: no prompt's files overwrite another's or an input, a rerun
replaces a prompt's whole set, and a failed or killed run leaves the previous set as it was."""

from __future__ import annotations

import json
import os
import shutil

import miditoolkit
import pytest
from tiny_models import tiny_checkpoint

from musegen.sample import SCRATCH_PREFIX, SampleSettings, sample_to_folder

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SETTINGS = SampleSettings(length=16, seed=1, prompt_bars=4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint("remi", tmp_path_factory.mktemp("ckpt"))


def files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_colliding_names_are_skipped_and_listed_never_overwritten(checkpoint, pop909_songs, tmp_path):
    prompts = tmp_path / "prompts"
    (prompts / "sub").mkdir(parents=True)
    for name, song in (("song.mid", 0), ("song.midi", 1), ("batch.mid", 2), ("sub/song.mid", 3)):
        shutil.copy(pop909_songs[song], prompts / name)
    os.mkfifo(prompts / "pipe.mid")  # would block a reader
    summary = sample_to_folder(checkpoint, tmp_path / "out", SETTINGS, prompts, progress=False)
    assert summary["continued"] == 2, summary["skipped"]  # song.mid, sub/song.mid (another folder)
    assert summary["skipped"] == {
        "batch.mid": "batch.mid: its output batch.json would overwrite the run's batch.json",
        "pipe.mid": "not a regular file",
        "song.midi": "song.midi: its output song.json would overwrite the outputs of song.mid",
    }
    out = tmp_path / "out"
    assert json.loads((out / "song.json").read_text())["prompt"] == str(prompts / "song.mid")
    assert json.loads((out / "batch.json").read_text())["continued"] == 2
    assert sorted(files(out)) == ["batch.json", "song.json", "song_000.mid", "sub/song.json", "sub/song_000.mid"]


def test_a_rerun_replaces_the_prompts_whole_set_and_nothing_else(checkpoint, pop909_songs, tmp_path):
    out = tmp_path / "out"
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=1, num_samples=3), pop909_songs[0],
                     progress=False)
    stem = pop909_songs[0].stem
    (out / "notes.txt").write_text("mine")
    (out / f"{stem}_007.mid").write_bytes(b"not listed by the set, so not the run's to remove")
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=2, num_samples=1), pop909_songs[0],
                     progress=False)
    assert sorted(files(out)) == [f"{stem}.json", f"{stem}_000.mid", f"{stem}_007.mid", "notes.txt"]
    summary = json.loads((out / f"{stem}.json").read_text())
    assert summary["settings"]["seed"] == 2 and [r["midi"] for r in summary["samples"]] == [f"{stem}_000.mid"]


def test_a_run_that_fails_while_writing_leaves_the_previous_set(checkpoint, pop909_songs, tmp_path, monkeypatch):
    out = tmp_path / "out"
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=1, num_samples=3), pop909_songs[0],
                     progress=False)
    before = files(out)
    real, calls = miditoolkit.MidiFile.dump, []

    def dump_then_fail(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second sample's file: disk full, say
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)
    monkeypatch.setattr(miditoolkit.MidiFile, "dump", dump_then_fail)
    with pytest.raises(OSError, match="No space left"):
        sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=5, num_samples=3), pop909_songs[0],
                         progress=False)
    assert files(out) == before  # no new file beside the old ones, no scratch left behind


def test_scratch_folders_of_killed_runs_are_removed_by_the_next_run(checkpoint, tmp_path):
    out = tmp_path / "out"
    dead = out / f"{SCRATCH_PREFIX}{2**22 + 12345}-x"  # above Linux's default pid_max: no such process
    alive = out / f"{SCRATCH_PREFIX}{os.getpid()}-y"  # a run still writing
    for folder in (dead, alive):
        folder.mkdir(parents=True)
        (folder / "sample_000.mid").write_bytes(b"half")
    sample_to_folder(checkpoint, out, SampleSettings(length=8, seed=1), None, progress=False)
    assert not dead.exists() and alive.exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["sample.json", "sample_000.mid"]
