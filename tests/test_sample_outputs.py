"""`musegen sample` output sets: each prompt's files are a folder of their own, which appears
complete or not at all; no set overwrites another's, an input or the batch summary; a rerun
replaces a prompt's whole set; and a run that fails or is killed at any point leaves complete
sets only."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import miditoolkit
import pytest
import symusic
from tiny_models import tiny_checkpoint

from musegen import schemas
from musegen.generation import outputs
from musegen.generation.batch import sample_to_folder
from musegen.generation.outputs import SAMPLE_SUMMARY, SCRATCH_PREFIX
from musegen.generation.settings import SampleSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SETTINGS = SampleSettings(length=16, seed=1, prompt_bars=4)
REPO = Path(__file__).resolve().parents[1]
KILLS = int(os.environ.get("MUSEGEN_FAULT_KILLS", 8))  # random kill points; the slow suite may raise it


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint("remi", tmp_path_factory.mktemp("ckpt"))


def files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def visible(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if not any(part.startswith(".") for part in p.relative_to(folder).parts)]


def complete_sets_only(out: Path) -> int:
    """Every visible file under `out` is a batch summary or belongs to a complete set: a folder
    whose manifest `<folder>.json` lists exactly the other files in it, each of which parses.
    Returns the number of sets."""
    sets = 0
    for path in visible(out):
        if path.is_dir():
            if (path / f"{path.name}.json").is_file():
                summary = schemas.read(path / f"{path.name}.json", SAMPLE_SUMMARY)
                listed = {n for r in summary.samples for n in (r.midi, r.wav, r.pianoroll, r.json_) if n}
                assert {p.name for p in path.iterdir()} == listed | {f"{path.name}.json"}, sorted(path.iterdir())
                for name in listed:
                    if name.endswith(".mid"):
                        symusic.Score.from_file(str(path / name))
                    else:
                        json.loads((path / name).read_text())
                sets += 1
            continue
        if not (path.parent / f"{path.parent.name}.json").is_file():  # not in a set: a batch summary
            assert path.parent == out and path.name.startswith("batch"), f"{path} lies outside any set"
            schemas.read(path, SAMPLE_SUMMARY)
    return sets


def test_colliding_names_are_renamed_before_anything_is_written_and_listed(checkpoint, pop909_songs, tmp_path):
    """Every prompt gets a set folder of its own: one whose name is taken (by another prompt's
    set, a folder other sets go into, or something else on disk) is written under another name,
    and the batch says which."""
    prompts, out = tmp_path / "prompts", tmp_path / "out"
    (prompts / "sub").mkdir(parents=True)
    for name, song in (
        ("song.mid", 0),
        ("song.midi", 1),
        ("Song-midi.mid", 4),  # a case-insensitive file system would merge `song-midi` with it
        ("sub.mid", 2),  # beside the folder sub/, whose sets go into out/sub/
        ("sub/song.mid", 3),
        ("taken.mid", 5),
    ):
        shutil.copy(pop909_songs[song], prompts / name)
    os.mkfifo(prompts / "pipe.mid")  # would block a reader
    (out / "taken").mkdir(parents=True)
    (out / "taken" / "mine.txt").write_text("the user's own folder")
    summary = sample_to_folder(checkpoint, out, SETTINGS, prompts, progress=False)
    assert summary["continued"] == 6 and summary["skipped"] == {"pipe.mid": "not a regular file"}
    assert summary["renamed"] == {"song.midi": "song-2", "sub.mid": "sub-mid", "taken.mid": "taken-mid"}
    assert summary["sets"] == {
        "Song-midi.mid": "Song-midi",
        "song.mid": "song",
        "song.midi": "song-2",
        "sub.mid": "sub-mid",
        "sub/song.mid": "sub/song",
        "taken.mid": "taken-mid",
    }
    for prompt, folder in summary["sets"].items():
        stem = Path(folder).name
        assert json.loads((out / folder / f"{stem}.json").read_text())["prompt"] == str(prompts / prompt)
    assert (out / "taken" / "mine.txt").read_text() == "the user's own folder"
    shutil.rmtree(out / "taken")
    assert json.loads((out / "batch.json").read_text())["continued"] == 6
    assert complete_sets_only(out) == 6 and not list(out.rglob(".*"))


def test_a_prompt_named_like_the_batch_summary_keeps_its_file(checkpoint, pop909_songs, tmp_path):
    """Continued in place, a MIREX prompt `batch.json` would be overwritten by the batch summary,
    and a prompt `batch.json.mid` would make its name a folder: the summary is written as
    `batch-2.json`, the set as `batch.json-mid`, and the inputs are untouched."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    notes = [{"start": 4 * i, "pitch": 60 + i % 12, "duration": 4} for i in range(40)]
    for name in ("batch.json", "x.json", "x_000.json"):
        (prompts / name).write_text(json.dumps({"prompt": notes}))
    shutil.copy(pop909_songs[0], prompts / "batch.json.mid")
    settings = SampleSettings(length=16, seed=1, num_samples=2, prompt_bars=4)
    summary = sample_to_folder(checkpoint, prompts, settings, prompts, progress=False)
    assert summary["continued"] == 4 and summary["file"] == str(prompts / "batch-2.json")
    assert summary["renamed"] == {"batch.json.mid": "batch.json-mid"}
    assert set(summary["sets"].values()) == {"batch", "batch.json-mid", "x", "x_000"}
    for name in ("batch.json", "x.json", "x_000.json"):
        assert json.loads((prompts / name).read_text()) == {"prompt": notes}
    assert json.loads((prompts / "batch-2.json").read_text())["continued"] == 4
    assert sorted(os.listdir(prompts / "x")) == ["x.json", "x_000.json", "x_000.mid", "x_001.json", "x_001.mid"]


def test_a_rerun_replaces_the_prompts_whole_set_and_a_folder_with_the_users_files_is_left_alone(
    checkpoint, pop909_songs, tmp_path
):
    out, stem = tmp_path / "out", pop909_songs[0].stem
    first = sample_to_folder(
        checkpoint, out, SampleSettings(length=16, seed=1, num_samples=3), pop909_songs[0], progress=False
    )
    assert first["folder"] == str(out / stem)
    (out / "notes.txt").write_text("mine")
    (out / stem / f"{stem}_007.mid").write_bytes(b"named as the set's: part of it")
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=2, num_samples=1), pop909_songs[0], progress=False)
    assert sorted(files(out)) == [f"{stem}/{stem}.json", f"{stem}/{stem}_000.mid", "notes.txt"]
    summary = json.loads((out / stem / f"{stem}.json").read_text())
    assert summary["settings"]["seed"] == 2 and [r["midi"] for r in summary["samples"]] == [f"{stem}_000.mid"]
    (out / stem / "notes.txt").write_text("the user's own file: the folder is no longer only a set")
    again = sample_to_folder(
        checkpoint, out, SampleSettings(length=16, seed=3, num_samples=1), pop909_songs[0], progress=False
    )
    assert again["folder"] == str(out / f"{stem}-mid") and (out / stem / "notes.txt").is_file()
    assert json.loads((out / stem / f"{stem}.json").read_text())["settings"]["seed"] == 2


def test_where_folders_cannot_be_exchanged_the_old_set_is_moved_aside_first(
    checkpoint, pop909_songs, tmp_path, monkeypatch
):
    out, stem = tmp_path / "out", pop909_songs[0].stem
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=1, num_samples=3), pop909_songs[0], progress=False)
    monkeypatch.setattr(outputs, "_exchange", lambda a, b: False)
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=2, num_samples=1), pop909_songs[0], progress=False)
    assert sorted(files(out)) == [f"{stem}/{stem}.json", f"{stem}/{stem}_000.mid"]


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
    assert sorted(p.relative_to(out).as_posix() for p in visible(out)) == [
        "sample",
        "sample/sample.json",
        "sample/sample_000.mid",
    ]


# The real command, SIGKILLed by an audit hook just before its `kill_at`-th change to the output
# folder (a file opened for writing, a folder made, a rename or exchange, a removal), so that
# every point of writing and publishing can be hit, not only those a timer happens to reach.
KILLED_AT = textwrap.dedent("""
    import os, signal, sys
    out, kill_at, changes = os.path.realpath(sys.argv[1]), int(sys.argv[2]), 0
    WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def touches_out(args):
        flat = [a for arg in args for a in (arg if isinstance(arg, tuple) else (arg,))]
        return any(isinstance(a, (str, bytes)) and os.fsdecode(a).startswith(out) for a in flat)

    def changes_out(event, args):
        if event == "open":
            mode, flags = args[1], args[2]
            return touches_out(args[:1]) and (any(c in (mode or "") for c in "wax+") or bool(flags & WRITES))
        return event in ("os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "shutil.rmtree",
                         "tempfile.mkdtemp", "ctypes.call_function") and touches_out(args)

    def hook(event, args):
        global changes
        if changes_out(event, args):
            changes += 1
            if changes == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    from musegen.cli import main
    try:
        main(sys.argv[3:])
    finally:
        print(f"changes {changes}", file=sys.stderr)
""")


def run_killed_at(kill_at: int, out: Path, args: list) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", KILLED_AT, str(out), str(kill_at), "sample", *map(str, args), "--out", str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_a_run_killed_at_any_point_of_writing_leaves_complete_sets_only(checkpoint, pop909_songs, tmp_path):
    """A folder of prompts (`song.mid` and `song.midi` among them: two sets for one stem) sampled
    into the same folder again and again, each run SIGKILLed at a random change to the folder:
    after every kill, every visible file belongs to a complete set (all its files, parsable)."""
    prompts, out = tmp_path / "prompts", tmp_path / "out"
    (prompts / "sub").mkdir(parents=True)
    for name, song in (("song.mid", 0), ("song.midi", 1), ("sub/other.mid", 2)):
        shutil.copy(pop909_songs[song], prompts / name)
    args = ["-c", checkpoint, "--prompt", prompts, "--prompt-bars", 2, "--length", 16, "-n", 2, "--seed"]
    full = run_killed_at(0, out, [*args, 0])  # never killed: counts the changes of a run that replaces nothing
    assert full.returncode == 0, full.stderr[-800:]
    assert complete_sets_only(out) == 3
    rerun = run_killed_at(0, out, [*args, 1])  # one that replaces every set
    assert rerun.returncode == 0, rerun.stderr[-800:]
    changes = int(rerun.stderr.rsplit("changes ", 1)[1])
    assert changes >= 3 * 5, rerun.stderr[-800:]  # per set at least: folder, 2 MIDI, manifest, publish
    rng, killed = random.Random(31), 0
    for seed in range(2, 2 + KILLS):
        run = run_killed_at(rng.randint(1, changes), out, [*args, seed])
        killed += run.returncode == -9
        assert run.returncode in (0, -9), run.stderr[-800:]
        assert complete_sets_only(out) == 3  # (each set is there: killed runs replace, never remove)
    assert killed >= KILLS - 1  # (a run whose hook point lies past its last change completes)
    assert run_killed_at(0, out, [*args, 99]).returncode == 0
    assert complete_sets_only(out) == 3 and not list(out.rglob(f"{SCRATCH_PREFIX}*"))
