"""Fault injection on every write path: data preparation, training checkpoints, sample output.

Faults: SIGKILL at seeded random moments (subprocesses), a full disk (OSError(ENOSPC) injected at
the n-th fsync, where musegen makes written bytes durable, and at the real writes of the training
log and of safetensors files, which then hold a partial file), a read-only output folder (chmod;
when the tests run as root, which ignores modes, the same EROFS error is injected where files
are created). After each fault the earlier complete output must be intact and loadable and no
file under its final name may be partial; a rerun or resume then finishes. Counts print with -s.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import symusic
import torch
from fuzz import log_line, trio_midi
from train_fixtures import prepare_pop909, tiny_run

from musegen import io as musegen_io
from musegen.checkpoint import load_checkpoint, save_checkpoint
from musegen.cli import main
from musegen.generation.batch import sample_to_folder
from musegen.generation.settings import SampleSettings
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.shards import Shards
from musegen.tokenizers import tokenizer_from_dict
from musegen.training.run_folder import checkpoint_dirs, is_complete, latest_checkpoint

FAULTS = Counter()  # (area, "injected" | "intact") -> count
KILLS = int(os.environ.get("MUSEGEN_FAULT_KILLS", 2))  # per area; the slow suite raises it


@pytest.fixture(scope="module", autouse=True)
def summary():
    torch.set_num_threads(1)
    yield
    for area in sorted({a for a, _ in FAULTS}):
        log_line(
            f"faults {area}: injected {FAULTS[area, 'injected']}, "
            f"complete earlier output intact after {FAULTS[area, 'intact']}"
        )


def tiny_training(data, run, steps: int) -> list:
    """`musegen train` arguments for a tiny run that logs and checkpoints every step, keeping 2."""
    return ["train", "--data", data, "--out", run, *tiny_run(log_every=1, ckpt_every=1, keep=2, steps=steps)]


def musegen_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "musegen", *map(str, args)]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(args, capsys) -> tuple[int, list[str]]:
    """Exit code and the `error:` lines of stderr (progress bars share stderr); never a traceback."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    return exit_.value.code or 0, [line for line in err.splitlines() if line.startswith("error:")]


class DiskFull:
    """Make the n-th fsync (1-based) and every later one fail with ENOSPC."""

    def __init__(self, monkeypatch, n: int):
        self.n, self.calls, real = n, 0, os.fsync

        def fsync(fd):
            self.calls += 1
            if self.calls >= self.n:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd)

        monkeypatch.setattr(os, "fsync", fsync)


def read_only(folder: Path, monkeypatch) -> None:
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root writes through modes: inject what a read-only folder answers
        real = musegen_io.tempfile.mkstemp

        def mkstemp(*args, dir=None, **kwargs):
            if dir is not None and Path(dir).resolve().is_relative_to(folder.resolve()):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(musegen_io.tempfile, "mkstemp", mkstemp)


def kill_at_random(cmd: list[str], rng: random.Random, earliest: float, latest: float) -> bool:
    """Start `cmd`, SIGKILL it after a random delay; True if it was still running when killed."""
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=rng.uniform(earliest, latest))
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def visible_files(folder: Path) -> list[Path]:
    """Files under their final names (hidden `.name.tmp` files are the atomic writer's scratch)."""
    return [
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    ]


# ---- data preparation ---------------------------------------------------------------------------


def shards_content(folder: Path) -> dict:
    shards = Shards(folder)
    return {split: [p.tolist() for p in shards.pieces(split)] for split in shards.splits}


@pytest.fixture(scope="module")
def source(pop909_songs, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("midi")
    for song in pop909_songs[:6]:
        (folder / song.name).write_bytes(song.read_bytes())
    return folder


def test_data_prepare_survives_full_disk_read_only_and_kill(source, tmp_path, capsys, monkeypatch):
    out = tmp_path / "shards"
    prepare = ["data", "prepare", "midi", "--source", source, "--out", out, "--workers", 1]
    assert cli(prepare + ["--limit", 3], capsys)[0] == 0
    before = shards_content(out)
    assert cli(prepare[:6] + [tmp_path / "reference"] + prepare[7:], capsys)[0] == 0
    after = shards_content(tmp_path / "reference")  # what a finished rewrite holds
    for n in range(1, 5):  # each atomic write of a rewrite: npy files, tokenizer, index
        with monkeypatch.context() as m:
            DiskFull(m, n)
            code, err = cli(prepare, capsys)
        FAULTS["data prepare", "injected"] += 1
        assert code == 1 and len(err) == 1 and "No space left" in err[0], err
        FAULTS["data prepare", "intact"] += shards_content(out) == before
    with monkeypatch.context() as m:
        read_only(out, m)
        code, err = cli(prepare, capsys)
        out.chmod(0o755)
    FAULTS["data prepare", "injected"] += 1
    assert code == 1 and len(err) == 1, err
    FAULTS["data prepare", "intact"] += shards_content(out) == before
    started = time.perf_counter()  # a whole rewrite as a subprocess, to aim the kills inside it
    subprocess.run(musegen_cmd(*prepare[:6], tmp_path / "timing", *prepare[7:]), env=env(), capture_output=True)
    duration = time.perf_counter() - started
    rng = random.Random(1)
    for _ in range(KILLS):
        killed = kill_at_random(musegen_cmd(*prepare), rng, 0.5 * duration, 0.95 * duration)
        FAULTS["data prepare", "injected"] += killed
        # always a complete folder: the earlier one, or the rewrite if it got as far as its index
        FAULTS["data prepare", "intact"] += killed and shards_content(out) in (before, after)
    assert cli(prepare, capsys)[0] == 0  # the rerun finishes
    assert sum(map(len, shards_content(out).values())) == 6
    assert FAULTS["data prepare", "intact"] == FAULTS["data prepare", "injected"]


WORKER_POOLS = """
import os, sys, time
from concurrent.futures import ProcessPoolExecutor
from data_prep.common import _fork_context, _init_worker, encode_file, worker_pool
from musegen.tokenizers import tokenizer_from_dict

def pid(_):
    return os.getpid()

pool = worker_pool(2)
pids = set(pool.map(pid, range(8), chunksize=1))
setup = (os.getpid(), tokenizer_from_dict({"kind": "remi"}).to_dict(), encode_file)
executor = ProcessPoolExecutor(2, mp_context=_fork_context(), initializer=_init_worker, initargs=setup)
pids |= set(executor.map(pid, range(8)))
print(*pids, flush=True)
time.sleep(600)
"""


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting for its reaper is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_data_prepare_workers_die_with_a_killed_parent():
    """Both kinds of worker pool `data prepare` forks (the encoding executor, the rendering
    pool): when their process is killed outright, its workers go too. Before, the encoding
    workers waited on their task pipe for ever (every run of the kill test above left one)."""
    proc = subprocess.Popen([sys.executable, "-c", WORKER_POOLS], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in proc.stdout.readline().split()]
    finally:
        proc.kill()
        proc.wait()
    assert len(workers) >= 2 and all(pid != proc.pid for pid in workers)
    deadline = time.monotonic() + 60  # the kernel sends the signal at once; this only bounds a failure
    while any(map(running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(running, workers)), [pid for pid in workers if running(pid)]


# ---- training checkpoints ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(pop909_songs, tmp_path_factory) -> Path:
    return prepare_pop909(pop909_songs[:3], tmp_path_factory.mktemp("data"))


def complete_checkpoints_load(run: Path) -> bool:
    """Every folder that looks complete loads; the newest complete one exists."""
    folders = [path for _, path in checkpoint_dirs(run) if is_complete(path)]
    for folder in folders:
        load_checkpoint(folder)
    return bool(folders) and latest_checkpoint(run) == folders[-1]


def test_training_survives_full_disk_read_only_and_kill(data, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    train_args = partial(tiny_training, data, run)
    assert cli(train_args(1), capsys)[0] == 0
    # a checkpoint makes ~5 fsyncs (weights, tokenizer, config, folder, parent); hit each in turn
    for n in range(1, 7):
        earlier = latest_checkpoint(run)
        with monkeypatch.context() as m:
            DiskFull(m, n)
            code, err = cli(train_args(5) + ["--resume"], capsys)
        FAULTS["training", "injected"] += 1
        assert code == 1 and len(err) == 1 and "No space left" in err[0], err
        FAULTS["training", "intact"] += complete_checkpoints_load(run) and latest_checkpoint(run) >= earlier
    with monkeypatch.context() as m:
        read_only(run / "checkpoints", m)
        code, err = cli(train_args(8) + ["--resume"], capsys)
        (run / "checkpoints").chmod(0o755)
    FAULTS["training", "injected"] += 1
    assert code == 1 and len(err) == 1, err
    FAULTS["training", "intact"] += complete_checkpoints_load(run)
    rng = random.Random(2)
    for _ in range(KILLS):
        killed = kill_at_random(musegen_cmd(*train_args(1000), "--resume"), rng, 4.0, 10.0)
        FAULTS["training", "injected"] += killed
        FAULTS["training", "intact"] += killed and complete_checkpoints_load(run)
    last = int(latest_checkpoint(run).name.split("-")[1])
    assert cli(train_args(last + 2) + ["--resume"], capsys)[0] == 0  # resume finishes the job
    assert latest_checkpoint(run).name == f"step-{last + 2:08d}"
    assert FAULTS["training", "intact"] == FAULTS["training", "injected"]


class FullDiskWrites:
    """The writes to files named `name` put down half their bytes, then fail with ENOSPC (from the
    `after`-th such write on): what a disk that fills up mid-write does."""

    def __init__(self, monkeypatch, name: str, after: int = 1):
        self.calls, real = 0, os.write

        def write(fd, data):
            if not os.readlink(f"/proc/self/fd/{fd}").endswith(name):
                return real(fd, data)
            self.calls += 1
            if self.calls < after:
                return real(fd, data)
            real(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "write", write)


def full_disk_safetensors(monkeypatch, module, name: str) -> None:
    """`module.save_file` writes half of `name`'s bytes, then fails as safetensors does on a full disk."""
    from safetensors import SafetensorError
    from safetensors.torch import save

    real = module.save_file

    def save_file(tensors, path, *args, **kwargs):
        if not Path(path).name.startswith((name, f".{name}")):
            return real(tensors, path, *args, **kwargs)
        Path(path).write_bytes(save(tensors)[:1000])
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(module, "save_file", save_file)


def test_training_survives_a_full_disk_at_the_real_writes(data, tmp_path, capsys, monkeypatch):
    from musegen import checkpoint as checkpoint_module
    from musegen.training import run_folder

    run = tmp_path / "run"
    train_args = partial(tiny_training, data, run)
    assert cli(train_args(2), capsys)[0] == 0
    faults = {
        "log line": lambda m: FullDiskWrites(m, "log.jsonl", after=2),
        "weights": lambda m: full_disk_safetensors(m, checkpoint_module, "model.safetensors"),
        "trainer state": lambda m: full_disk_safetensors(m, run_folder, "trainer_state.safetensors"),
    }
    for name, inject in faults.items():  # each hits before the step-3 checkpoint lands
        earlier = latest_checkpoint(run)
        files = {f.name: f.read_bytes() for f in earlier.iterdir()}
        with monkeypatch.context() as m:
            inject(m)
            code, err = cli(train_args(6) + ["--resume"], capsys)
        FAULTS["training", "injected"] += 1
        assert code == 1 and len(err) == 1 and "No space left on device" in err[0], (name, err)
        if name == "log line":
            assert not (run / "log.jsonl").read_bytes().endswith(b"\n")  # half a line was written
        intact = (
            complete_checkpoints_load(run)
            and latest_checkpoint(run) == earlier
            and {f.name: f.read_bytes() for f in earlier.iterdir()} == files
        )
        FAULTS["training", "intact"] += intact
        assert intact, name
    assert cli(train_args(6) + ["--resume"], capsys)[0] == 0  # the resume repairs the log and finishes
    assert latest_checkpoint(run).name == "step-00000006"
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 7))


# ---- sample output ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def groove(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny groove checkpoint and a prompt it reads."""
    tok = tokenizer_from_dict({"kind": "groove"})
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", vocab_size=tok.vocab_size)).eval()
    folder = tmp_path_factory.mktemp("ckpt")
    return save_checkpoint(folder, model, model.config, tok), trio_midi(folder.parent / "trio.mid")


def outputs_complete(out: Path) -> dict[str, bytes]:
    """Every visible file parses (MIDI, JSON); returns their bytes."""
    import json

    files = {p.name: p.read_bytes() for p in visible_files(out)}
    for name, data in files.items():
        if name.endswith(".mid"):
            symusic.Score.from_midi(data)
        else:
            json.loads(data)
    return files


def test_sample_output_survives_full_disk_read_only_and_kill(groove, tmp_path, capsys, monkeypatch):
    checkpoint, prompt = groove
    out = tmp_path / "out"
    sample_to_folder(checkpoint, out, SampleSettings(length=16, seed=0), None, progress=False)
    earlier = outputs_complete(out)  # sample_000.mid + sample.json from a run without prompt
    args = ["sample", "-c", checkpoint, "--prompt", prompt, "--length", 16, "-n", 2, "--seed", 1, "--out", out]
    for n in range(1, 4):  # the two MIDI files, then the JSON
        with monkeypatch.context() as m:
            DiskFull(m, n)
            code, err = cli(args, capsys)
        FAULTS["sample", "injected"] += 1
        assert code == 1 and len(err) == 1 and "No space left" in err[0], err
        now = outputs_complete(out)
        FAULTS["sample", "intact"] += all(now[name] == data for name, data in earlier.items())
    with monkeypatch.context() as m:
        read_only(out, m)
        code, err = cli(args, capsys)
        out.chmod(0o755)
    FAULTS["sample", "injected"] += 1
    assert code == 1 and len(err) == 1, err
    FAULTS["sample", "intact"] += all(outputs_complete(out)[k] == v for k, v in earlier.items())
    rng = random.Random(3)
    long_args = [a if a != 16 else 100000 for a in args]
    for _ in range(KILLS):
        killed = kill_at_random(musegen_cmd(*long_args), rng, 3.0, 8.0)
        FAULTS["sample", "injected"] += killed
        FAULTS["sample", "intact"] += killed and all(outputs_complete(out)[k] == v for k, v in earlier.items())
    assert cli(args, capsys)[0] == 0  # the rerun writes its outputs beside the earlier ones
    assert {"trio_000.mid", "trio_001.mid", "trio.json"} <= set(outputs_complete(out))
    assert FAULTS["sample", "intact"] == FAULTS["sample", "injected"]
