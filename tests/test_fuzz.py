"""MIDI fuzzing: `musegen data prepare midi` and `musegen sample --prompt` over mutated real files.

Every mutant must be processed or rejected with a one-line reason; a traceback, an internal
error, a hang past the per-file limit or a dead batch counts as a crash, and crashes must be 0.
CI runs a few hundred mutants; `-m slow` runs 2,400. Each test prints its counts (`-s`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from fuzz import log_line, mutants, trio_midi, write_corpus

from musegen.checkpoint import save_checkpoint
from musegen.errors import MusegenError
from musegen.generation.batch import sample_to_folder
from musegen.generation.settings import SampleSettings
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.tokenizers import tokenizer_from_dict

REPO = Path(__file__).resolve().parents[1]
PROMPTS = sorted((REPO / "checkpoints" / "prompts").glob("*.mid"))
KINDS = ("remi", "groove")
CI_MUTANTS, SLOW_MUTANTS = 240, 2400
FILE_LIMIT_S = 60  # per mutant in-process, as data_prep's per-file limit: past it, a hang
BATCH_LIMIT_S = 300  # one `data prepare` call over the whole folder


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def seeds(pop909_songs, tmp_path_factory) -> list[Path]:
    return pop909_songs[:4] + PROMPTS + [trio_midi(tmp_path_factory.mktemp("seed") / "trio.mid")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    folders = {}
    for kind in KINDS:
        tok = tokenizer_from_dict({"kind": kind})
        torch.manual_seed(0)
        model = MusicPerformer(preset("tiny", vocab_size=tok.vocab_size)).eval()
        folders[kind] = save_checkpoint(tmp_path_factory.mktemp(f"ckpt-{kind}"), model, model.config, tok)
    return folders


def corpus_folder(seeds: list[Path], folder: Path, n: int) -> Path:
    return write_corpus(folder, mutants(seeds, n, seed=7))


def musegen(*args, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "musegen", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )


def is_one_line_error(stderr: str) -> bool:
    lines = stderr.strip().splitlines()
    return (
        len(lines) == 1
        and lines[0].startswith("error: ")
        and "internal error" not in lines[0]
        and "Traceback" not in stderr
    )


# ---- data prepare: the whole folder in one call -------------------------------------------------


def prepare_counts(folder: Path, out: Path, kind: str) -> Counter:
    """Run `musegen data prepare midi` once over `folder`; count processed/rejected/crashed files."""
    n = len(list(folder.iterdir()))
    result = musegen(
        "data",
        "prepare",
        "midi",
        "--source",
        folder,
        "--out",
        out,
        "--tokenizer",
        kind,
        "--workers",
        2,
        timeout=BATCH_LIMIT_S,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    report = json.loads((out / "index.json").read_text())["report"]
    assert report["files"] == n and report["encoded"] + report["skipped"] == n
    crashed = [
        s
        for s in report["skipped_files"]
        if "internal error" in s["reason"] or "took longer" in s["reason"] or "\n" in s["reason"]
    ]
    assert not crashed, crashed[:5]
    assert all(s["reason"].strip() for s in report["skipped_files"])
    return Counter(
        tried=n, processed=report["encoded"], rejected=report["skipped"] - len(crashed), crashed=len(crashed)
    )


# ---- sample --prompt: the library function behind the command, per mutant -------------------------


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: int):
    def on_alarm(signum, frame):
        raise Hang

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def sample_counts(checkpoint: Path, files: list[Path], out: Path) -> tuple[Counter, list[str]]:
    counts, crashes = Counter(tried=len(files)), []
    settings = SampleSettings(length=4, seed=0, prompt_bars=4)
    for i, path in enumerate(files):
        try:
            with time_limit(FILE_LIMIT_S):
                summary = sample_to_folder(checkpoint, out / str(i), settings, path, progress=False)
            assert (Path(summary["folder"]) / summary["samples"][0]["midi"]).is_file()
            counts["processed"] += 1
        except MusegenError as exc:
            message = str(exc)
            if message.strip() and "\n" not in message:
                counts["rejected"] += 1
            else:
                counts["crashed"] += 1
                crashes.append(f"{path.name}: multi-line or empty message {message!r}")
        except Hang:
            counts["crashed"] += 1
            crashes.append(f"{path.name}: took over {FILE_LIMIT_S}s")
        except Exception as exc:  # anything else escaping the library is a crash
            counts["crashed"] += 1
            crashes.append(f"{path.name}: {type(exc).__name__}: {exc}")
    return counts, crashes


def report(label: str, counts: Counter) -> None:
    log_line(
        f"fuzz {label}: tried {counts['tried']}, processed {counts['processed']}, "
        f"rejected {counts['rejected']}, crashed {counts['crashed']}"
    )


@pytest.fixture(scope="module")
def ci_corpus(seeds, tmp_path_factory) -> Path:
    return corpus_folder(seeds, tmp_path_factory.mktemp("mutants"), CI_MUTANTS)


def test_mutants_are_deterministic_and_varied(seeds):
    a, b = mutants(seeds, 200, seed=7), mutants(seeds, 200, seed=7)
    assert a == b and a != mutants(seeds, 200, seed=8)
    originals = {p.read_bytes() for p in seeds}
    assert sum(data in originals for _, data in a) < 10  # (a truncation can rarely cut nothing important)
    applied = Counter(op for name, _ in a for op in name[:-4].split("__")[-1].split("+"))
    assert len(applied) == 11 and min(applied.values()) >= 5


@pytest.mark.parametrize("kind", KINDS)
def test_prepare_processes_or_rejects_every_mutant(ci_corpus, tmp_path, kind):
    counts = prepare_counts(ci_corpus, tmp_path / "shards", kind)
    report(f"data prepare ({kind})", counts)
    assert counts["crashed"] == 0
    assert counts["processed"] > 0 and counts["rejected"] > 0  # the corpus reaches the tokenizer and is not all clean


@pytest.mark.parametrize("kind", KINDS)
def test_sample_prompt_processes_or_rejects_every_mutant(ci_corpus, checkpoints, tmp_path, kind):
    files = sorted(ci_corpus.iterdir())[KINDS.index(kind) :: 2]  # each mutant through one of the two, for time
    counts, crashes = sample_counts(checkpoints[kind], files, tmp_path)
    report(f"sample --prompt ({kind}, in-process)", counts)
    assert not crashes, crashes[:5]
    assert counts["processed"] + counts["rejected"] == counts["tried"]
    assert counts["processed"] > 0 and counts["rejected"] > 0


def cli_sample_counts(checkpoint: Path, files: list[Path], out: Path) -> Counter:
    counts = Counter(tried=len(files))
    for i, path in enumerate(files):
        result = musegen(
            "sample",
            "-c",
            checkpoint,
            "--prompt",
            path,
            "--prompt-bars",
            4,
            "--length",
            4,
            "--seed",
            0,
            "--out",
            out / str(i),
            timeout=120,
        )
        if result.returncode == 0:
            counts["processed"] += 1
        else:
            assert result.returncode == 1 and is_one_line_error(result.stderr), (path.name, result.stderr[-2000:])
            counts["rejected"] += 1
    return counts


def test_cli_sample_on_a_handful_of_mutants(ci_corpus, checkpoints, tmp_path):
    files = sorted(ci_corpus.iterdir())
    # two mutants the groove tokenizer reads and one it rejects (each CLI call costs a Python start)
    ok, bad = [], []
    tok = tokenizer_from_dict({"kind": "groove"})
    for path in files:
        try:
            tok.encode(path)
            ok.append(path)
        except MusegenError:
            bad.append(path)
    counts = cli_sample_counts(checkpoints["groove"], ok[:2] + bad[:1], tmp_path)
    report("sample --prompt (groove, CLI)", counts)
    assert counts["processed"] == 2 and counts["rejected"] == 1


@pytest.mark.slow
def test_2400_mutants_through_prepare_and_sample(seeds, checkpoints, tmp_path):
    folder = corpus_folder(seeds, tmp_path / "mutants", SLOW_MUTANTS)
    files = sorted(folder.iterdir())
    for kind in KINDS:
        counts = prepare_counts(folder, tmp_path / f"shards-{kind}", kind)
        report(f"data prepare ({kind})", counts)
        assert counts["crashed"] == 0
        counts, crashes = sample_counts(checkpoints[kind], files, tmp_path / f"samples-{kind}")
        report(f"sample --prompt ({kind}, in-process)", counts)
        assert not crashes, crashes[:5]
    counts = cli_sample_counts(checkpoints["remi"], files[:20], tmp_path / "cli")
    report("sample --prompt (remi, CLI)", counts)
