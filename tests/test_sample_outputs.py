"""`musegen sample` output sets: no prompt's files overwrite another's or an input, a rerun
replaces a prompt's whole set, and a failed or killed run leaves the previous set as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import miditoolkit
import pytest
from tiny_models import tiny_checkpoint

from musegen.generation.batch import sample_to_folder
from musegen.generation.outputs import SCRATCH_PREFIX
from musegen.generation.settings import SampleSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SETTINGS = SampleSettings(length=16, seed=1, prompt_bars=4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint("remi", tmp_path_factory.mktemp("ckpt"))


def files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_colliding_names_are_renamed_before_anything_is_written_and_listed(checkpoint, pop909_songs, tmp_path):
    """Every prompt gets a set of its own: one whose stem is taken (by another prompt's set, an
    input or the batch summary) is written under another stem, and the batch says which."""
    prompts = tmp_path / "prompts"
    (prompts / "sub").mkdir(parents=True)
    for name, song in (("song.mid", 0), ("song.midi", 1), ("song-midi.mid", 4), ("batch.mid", 2), ("sub/song.mid", 3)):
        shutil.copy(pop909_songs[song], prompts / name)
    os.mkfifo(prompts / "pipe.mid")  # would block a reader
    summary = sample_to_folder(checkpoint, tmp_path / "out", SETTINGS, prompts, progress=False)
    assert summary["continued"] == 5 and summary["skipped"] == {"pipe.mid": "not a regular file"}
    assert summary["renamed"] == {"batch.mid": "batch-mid", "song.midi": "song-2"}
    out = tmp_path / "out"
    for stem, prompt in {
        "song": "song.mid",
        "song-2": "song.midi",
        "song-midi": "song-midi.mid",
        "batch-mid": "batch.mid",
        "sub/song": "sub/song.mid",
    }.items():
        assert json.loads((out / f"{stem}.json").read_text())["prompt"] == str(prompts / prompt)
    assert json.loads((out / "batch.json").read_text())["continued"] == 5
    assert len(list(out.rglob("*_000.mid"))) == 5 and not list(out.rglob(".*"))


def test_a_prompt_named_like_the_outputs_of_another_gets_its_own_set(checkpoint, pop909_songs, tmp_path):
    """MIREX prompts write `<stem>_NNN.json`: a prompt `x_000.json` beside `x.json` would be
    overwritten (and overwrite) were the names not resolved first."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    notes = [{"start": 4 * i, "pitch": 60 + i % 12, "duration": 4} for i in range(40)]
    for name in ("x.json", "x_000.json"):
        (prompts / name).write_text(json.dumps({"prompt": notes}))
    summary = sample_to_folder(
        checkpoint, prompts, SampleSettings(length=16, seed=1, num_samples=2), prompts, progress=False
    )
    assert summary["continued"] == 2 and summary["renamed"] == {"x.json": "x-json", "x_000.json": "x_000-json"}
    assert json.loads((prompts / "x.json").read_text()) == {"prompt": notes}  # the inputs are untouched
    assert json.loads((prompts / "x_000.json").read_text()) == {"prompt": notes}


def test_a_rerun_replaces_the_prompts_whole_set_and_nothing_else(checkpoint, pop909_songs, tmp_path):
    out = tmp_path / "out"
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=1, num_samples=3), pop909_songs[0], progress=False)
    stem = pop909_songs[0].stem
    (out / "notes.txt").write_text("mine")
    (out / f"{stem}_007.mid").write_bytes(b"not listed by the set, so not the run's to remove")
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=2, num_samples=1), pop909_songs[0], progress=False)
    assert sorted(files(out)) == [f"{stem}.json", f"{stem}_000.mid", f"{stem}_007.mid", "notes.txt"]
    summary = json.loads((out / f"{stem}.json").read_text())
    assert summary["settings"]["seed"] == 2 and [r["midi"] for r in summary["samples"]] == [f"{stem}_000.mid"]


def test_a_run_that_fails_while_writing_leaves_the_previous_set(checkpoint, pop909_songs, tmp_path, monkeypatch):
    out = tmp_path / "out"
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=1, num_samples=3), pop909_songs[0], progress=False)
    before = files(out)
    real, calls = miditoolkit.MidiFile.dump, []

    def dump_then_fail(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the second sample's file: disk full, say
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(miditoolkit.MidiFile, "dump", dump_then_fail)
    with pytest.raises(OSError, match="No space left"):
        sample_to_folder(
            checkpoint, out, SampleSettings(length=16, seed=5, num_samples=3), pop909_songs[0], progress=False
        )
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


KILLED_WHILE_PUBLISHING = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from musegen.generation import outputs
    from musegen.generation.batch import sample_to_folder
    from musegen.generation.settings import SampleSettings

    checkpoint, out, prompt, kill_at = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    moved, real_replace = [], os.replace

    def replace(src, dst):  # SIGKILL before the kill_at-th file of the set is moved into `out`
        if Path(dst).parent == out:
            moved.append(dst)
            if len(moved) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)
    outputs.os.replace = replace
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=5, num_samples=3), prompt, progress=False)
""")


def mids(folder) -> dict[str, bytes]:
    return {name: data for name, data in files(folder).items() if name.endswith(".mid") and not name.startswith(".")}


@pytest.mark.parametrize("kill_at", [1, 2, 4])  # the first file, one in the middle, the manifest
def test_a_run_killed_while_publishing_never_mixes_two_sets_and_the_next_run_completes_it(
    kill_at, checkpoint, pop909_songs, tmp_path
):
    prompt, stem = pop909_songs[0], pop909_songs[0].stem
    old, new, out = tmp_path / "old", tmp_path / "new", tmp_path / "out"
    for folder, seed in ((old, 1), (new, 5), (out, 1)):
        sample_to_folder(
            checkpoint, folder, SampleSettings(length=16, seed=seed, num_samples=3), prompt, progress=False
        )
    assert mids(old) != mids(new) and len(mids(new)) == 3
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_PUBLISHING, str(checkpoint), str(out), str(prompt), str(kill_at)],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert run.returncode == -9, run.stderr.decode()[-500:]
    seen = mids(out)
    manifest = out / f"{stem}.json"
    if manifest.exists():  # a manifest means a whole set, all of one run
        assert seen in (mids(old), mids(new))
    else:  # without one, what is there belongs to one run only
        assert all(seen[name] == mids(old).get(name) for name in seen) or all(
            seen[name] == mids(new).get(name) for name in seen
        ), sorted(seen)
    sample_to_folder(checkpoint, out, SampleSettings(length=8, seed=1), None, progress=False)  # any later run
    assert mids(out) == {**mids(new), "sample_000.mid": mids(out)["sample_000.mid"]}
    assert [r["midi"] for r in json.loads(manifest.read_text())["samples"]] == sorted(mids(new))
    assert not list(out.glob(".*"))
