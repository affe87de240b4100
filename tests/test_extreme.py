"""Valid-but-extreme input, file-system oddities and real full disks, through the real commands.

Every case runs `python -m musegen ...` in a subprocess under a 2 GB address-space limit
(RLIMIT_AS, set in preexec_fn), a 1 GiB file-size limit (RLIMIT_FSIZE: a runaway writer is
killed, not left to fill the disk) and a wall-clock limit, and must end in one of two ways: the
right result, or exit 1 with one `error:` line (no traceback, no "internal error"), within its
limit, with nothing the user had on disk lost. Each run's peak memory is recorded (wait4).

CI runs a sample (each extreme MIDI file through one command, every file-system and disk case);
`-m slow` runs every MIDI file through every command. `log_line` prints the counts (-s) and
appends them to $MUSEGEN_ROBUSTNESS_LOG.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import wave
from collections import Counter
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import extreme
import pytest
import symusic
import torch
from fuzz import log_line
from train_fixtures import prepare_pop909, tiny_run

from musegen.checkpoint import save_checkpoint
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.tokenizers import tokenizer_from_dict

REPO = Path(__file__).resolve().parents[1]
MEMORY_CAP = 2_000_000_000  # bytes of address space per process: "no command uses more than 2 GB"
FILE_CAP = 2**30  # bytes per written file: past every documented bound (render's default is 318 MB)
TIME_LIMIT_S = 180  # per command on the shared 2-core machine; the slowest case takes about 20 s
OUTCOMES: Counter = Counter()  # (area, outcome) -> count, printed at the end
PEAK_MB: dict[str, float] = {}  # area -> largest peak RSS seen
LIMIT_WORDS = "past tick 2^31"
REFUSALS = (1, 2)  # a bad input; a file or setting against its schema, or a request refused before allocation


@pytest.fixture(scope="module", autouse=True)
def summary():
    yield
    for area in sorted({a for a, _ in OUTCOMES}):
        counts = ", ".join(f"{k} {OUTCOMES[area, k]}" for k in ("ok", "refused", "failed") if OUTCOMES[area, k])
        log_line(f"extreme {area}: {counts}; peak memory {PEAK_MB.get(area, 0):.0f} MB")


# ---- running the real command -------------------------------------------------------------------


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    seconds: float
    peak_mb: float
    timed_out: bool
    cpu_seconds: float = 0.0  # user + system time of the command: what it cost, whatever else the machine runs

    @property
    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]

    def problem(self) -> str | None:
        """Why this run is not a clean outcome (a result, or one error line), or None."""
        if self.timed_out:
            return f"still running after {self.seconds:.0f} s"
        if "Traceback" in self.stderr or "internal error" in self.stderr or "MemoryError" in self.stderr:
            return f"crashed: {self.stderr.strip()[-600:]}"
        if self.rc == 0:
            return None
        if self.rc not in REFUSALS or len(self.errors) != 1:
            return f"exit {self.rc} with {len(self.errors)} error lines: {self.stderr.strip()[-600:]}"
        return None

    def refused(self, *words: str) -> bool:
        return self.rc in REFUSALS and len(self.errors) == 1 and all(w in self.errors[0] for w in words)


def _isolate():
    """In the child: its own process group (so a timeout kills its workers too), capped memory and writes."""
    os.setpgrp()
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_CAP, FILE_CAP))  # a runaway write dies, the disk lives


# root reads files whatever their mode; without these two capabilities it meets permissions too
AS_PLAIN_USER = [
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
]


def musegen(
    *args,
    timeout: float = TIME_LIMIT_S,
    script: str | None = None,
    plain_user: bool = False,
    cwd: Path | None = None,
    area: str | None = None,
) -> Run:
    """Run the CLI (or `script`, which ends by calling it) and wait, killing its whole process
    group at `timeout`. `plain_user`: without root's power over file modes."""
    cmd = [
        sys.executable,
        *(["-c", script] if script else ["-m", "musegen"]),
        *(a if isinstance(a, (str, bytes)) else os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args),
    ]
    if plain_user and os.geteuid() == 0:
        cmd = AS_PLAIN_USER + cmd
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd, preexec_fn=_isolate)
        timed_out = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                timed_out = True
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # no orphaned worker outlives its command
        out.seek(0), err.seek(0)
        run = Run(
            proc.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
            time.monotonic() - start,
            usage.ru_maxrss / 1024,
            timed_out,
            usage.ru_utime + usage.ru_stime,
        )
    if area:
        PEAK_MB[area] = max(PEAK_MB.get(area, 0), run.peak_mb)
    return run


def record(area: str, run: Run, extra_problem: str | None = None) -> None:
    """Count the outcome; fail the test on a problem."""
    problem = run.problem() or extra_problem
    if problem is None:
        OUTCOMES[area, "ok" if run.rc == 0 else "refused"] += 1
        return
    OUTCOMES[area, "failed"] += 1
    pytest.fail(problem)


# ---- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    folders = {}
    for kind in ("remi", "groove"):
        tok = tokenizer_from_dict({"kind": kind})
        torch.manual_seed(0)
        model = MusicPerformer(preset("tiny", vocab_size=tok.vocab_size)).eval()
        folders[kind] = save_checkpoint(tmp_path_factory.mktemp(f"ckpt-{kind}"), model, model.config, tok)
    return folders


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("extreme")
    paths = {}
    for name, make in extreme.MIDI_CASES.items():
        paths[name] = folder / f"{name}.mid"
        paths[name].write_bytes(make())
    return paths


def end_seconds(path: Path) -> float:
    return symusic.Score.from_midi(path.read_bytes()).to("second").end()


# ---- each extreme MIDI file through each command ------------------------------------------------

LIMIT_CASES = {"deltas_past_2_31", "deltas_past_2_32", "long_note_past_2_32"}  # past the parser's 32-bit ticks
EXPECTED_WORDS = {**{name: LIMIT_WORDS for name in LIMIT_CASES}, "division_65535": "SMPTE"}
COMMANDS = (
    "prepare-remi",
    "prepare-groove",
    "show",
    "sample-remi",
    "sample-groove",
    "render-wav",
    "render-png",
    "style",
)


def run_command(command: str, midi: Path, tmp: Path, checkpoints) -> tuple[Run, str | None]:
    """Run `command` on `midi`; (the run, a problem with its result beyond the exit status)."""
    if command.startswith("prepare"):
        source = tmp / "src"
        source.mkdir()
        shutil.copy(midi, source)
        run = musegen(
            "data",
            "prepare",
            "midi",
            "--source",
            source,
            "--out",
            tmp / "out",
            "--tokenizer",
            command.split("-")[1],
            "--workers",
            1,
            area="MIDI files",
        )
        if run.rc != 0:
            return run, "data prepare must skip a bad file, not stop"
        report = json.loads((tmp / "out" / "index.json").read_text())["report"]
        if report["files"] != 1 or report["encoded"] + report["skipped"] != 1:
            return run, f"miscounted: {report['files']} files, {report['encoded']} + {report['skipped']}"
        reason = report["skipped_files"][0]["reason"] if report["skipped"] else ""
        return run, _wrong_reason(midi.stem, reason, skipped=bool(report["skipped"]))
    if command == "show":
        run = musegen("data", "show", midi, area="MIDI files")
    elif command.startswith("sample"):
        run = musegen(
            "sample",
            "-c",
            checkpoints[command.split("-")[1]],
            "--prompt",
            midi,
            "--length",
            8,
            "--seed",
            0,
            "--out",
            tmp / "s",
            area="MIDI files",
        )
    elif command == "render-wav":
        run = musegen("render", midi, "--out", tmp / "a.wav", area="MIDI files")
        return run, _wrong_wav(midi, tmp / "a.wav", run)
    elif command == "render-png":
        run = musegen("render", midi, "--pianoroll", tmp / "a.png", area="MIDI files")
    else:
        (tmp / "gen").mkdir()
        shutil.copy(midi, tmp / "gen" / "song_000.mid")
        run = musegen(
            "evaluate", "style", "--generated", tmp / "gen", "--reference", midi, "--out", tmp / "st", area="MIDI files"
        )
    return run, _wrong_reason(midi.stem, run.errors[0] if run.rc in REFUSALS and run.errors else "", run.rc in REFUSALS)


def _wrong_reason(case: str, reason: str, skipped: bool) -> str | None:
    words = EXPECTED_WORDS.get(case)
    if words and not (skipped and words in reason):
        return f"expected a refusal saying {words!r}, got {reason or 'a result'!r}"
    return None


def _wrong_wav(midi: Path, wav: Path, run: Run) -> str | None:
    """A rendered WAV lasts the music (plus FluidSynth's release tail), or the refusal says why not."""
    if midi.stem in EXPECTED_WORDS:
        return _wrong_reason(midi.stem, run.errors[0] if run.errors else "", run.rc in REFUSALS)
    seconds = end_seconds(midi)
    if seconds > 30 * 60:
        return None if run.refused("--max-minutes") else f"a {seconds:.0f} s piece must be refused, got {run.stderr}"
    if shutil.which("fluidsynth") is None:
        return None
    if run.rc != 0:
        return f"a {seconds:.0f} s piece must render: {run.errors}"
    with wave.open(str(wav)) as w:
        duration = w.getnframes() / w.getframerate()
    return None if seconds <= duration <= seconds + 6 else f"WAV of {duration:.3f} s for {seconds:.3f} s of music"


MATRIX = [(case, command) for case in extreme.MIDI_CASES for command in COMMANDS]
CI_SAMPLE = {  # each file once, through the command where it once did harm
    ("tpq1_long_note", "prepare-remi"),
    ("tpq1_melody", "render-wav"),
    ("tpq_max_melody", "sample-remi"),
    ("division_65535", "show"),
    ("note_million_beats", "render-wav"),
    ("deltas_past_2_31", "prepare-groove"),
    ("deltas_past_2_32", "sample-groove"),
    ("long_note_past_2_32", "render-png"),
    ("note_39000_beats", "prepare-remi"),
    ("dense_bar", "render-png"),
    ("dense_trio", "style"),
    ("far_marker", "prepare-remi"),
    ("far_chord_marker", "sample-remi"),
    ("far_tempo", "show"),
    ("marker_within_limit", "prepare-remi"),
    ("thousand_tracks", "render-wav"),
    ("thousand_tracks_trio", "prepare-groove"),
}
assert {case for case, _ in CI_SAMPLE} == set(extreme.MIDI_CASES)


@pytest.mark.parametrize(
    "case, command",
    [
        pytest.param(case, command, marks=[] if (case, command) in CI_SAMPLE else [pytest.mark.slow])
        for case, command in MATRIX
    ],
)
def test_extreme_midi_through_every_command(case, command, cases, checkpoints, tmp_path):
    run, problem = run_command(command, cases[case], tmp_path, checkpoints)
    record("MIDI files", run, problem)


@pytest.mark.parametrize("kind", ["remi", "groove"])
def test_a_batch_of_every_extreme_file_is_counted_and_listed(kind, cases, tmp_path):
    """One `data prepare` over all the files: every one encoded or skipped with its reason."""
    source = tmp_path / "src"
    source.mkdir()
    for path in cases.values():
        shutil.copy(path, source)
    run = musegen(
        "data",
        "prepare",
        "midi",
        "--source",
        source,
        "--out",
        tmp_path / "out",
        "--tokenizer",
        kind,
        "--workers",
        2,
        area="batches",
    )
    record("batches", run)
    report = json.loads((tmp_path / "out" / "index.json").read_text())["report"]
    assert report["files"] == len(cases) == report["encoded"] + report["skipped"]
    reasons = {Path(s["name"]).stem: s["reason"] for s in report["skipped_files"]}
    assert all(LIMIT_WORDS in reasons[name] for name in LIMIT_CASES), reasons
    assert "thousand_tracks_trio" not in reasons and f"skipped: {report['skipped']}" in run.stdout


# ---- file-system oddities -------------------------------------------------------------------------


def can_drop_root_override() -> bool:
    return os.geteuid() != 0 or (
        shutil.which("setpriv") is not None
        and subprocess.run(AS_PLAIN_USER + ["true"], capture_output=True).returncode == 0
    )


def odd_entries(folder: Path) -> dict[str, str]:
    """Entries with MIDI names that are not readable MIDI files: name -> words of the refusal."""
    os.mkfifo(folder / "fifo.mid")
    (folder / "zero.mid").symlink_to("/dev/zero")
    (folder / "loop.mid").symlink_to(folder / "loop.mid")
    (folder / "broken.mid").symlink_to(folder / "nowhere.mid")
    return {
        "fifo.mid": "is a FIFO",
        "zero.mid": "is a character device",
        "loop.mid": "symbolic link loop",
        "broken.mid": "no such file",
    }


ODD_NAMES = ("fifo.mid", "zero.mid", "loop.mid", "broken.mid")


@pytest.mark.parametrize("command", ["sample", "render", "show"])
@pytest.mark.parametrize("name", ODD_NAMES)
def test_fifo_device_and_link_loop_as_the_midi_file_are_refused_at_once(command, name, tmp_path, checkpoints):
    words = odd_entries(tmp_path)[name]
    args = {
        "sample": [
            "sample",
            "-c",
            checkpoints["remi"],
            "--prompt",
            tmp_path / name,
            "--length",
            4,
            "--out",
            tmp_path / "s",
        ],
        "render": ["render", tmp_path / name, "--out", tmp_path / "a.wav"],
        "show": ["data", "show", tmp_path / name],
    }[command]
    run = musegen(*args, timeout=60, area="file system")
    said = run.refused(words)
    record("file system", run, None if said else f"{name}: expected {words!r}: {run.stderr}")


def test_a_batch_counts_and_lists_every_odd_entry(pop909_songs, tmp_path):
    """FIFO, device, link loop, broken link, unreadable file, non-UTF-8 names, one name in two
    folders: each encoded or skipped with its reason, the report and the summary printable."""
    if not can_drop_root_override():
        pytest.skip("running as root without setpriv: no file is unreadable")
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    expected = odd_entries(src)
    for sub, song in (("a", pop909_songs[0]), ("b", pop909_songs[1])):
        shutil.copy(song, src / sub / "song.mid")  # the same name in two folders
    with open(os.fsencode(src) + b"/caf\xe9.mid", "wb") as f:
        f.write(pop909_songs[2].read_bytes())
    shutil.copy(pop909_songs[3], src / "secret.mid")
    (src / "secret.mid").chmod(0o000)
    expected["secret.mid"] = "permission denied"
    out = tmp_path / "out"
    run = musegen(
        "data", "prepare", "midi", "--source", src, "--out", out, "--workers", 2, plain_user=True, area="file system"
    )
    record("file system", run)
    text = (out / "index.json").read_text(encoding="utf-8")
    report = json.loads(text)["report"]
    assert "\\udc" not in text  # no lone surrogates: any JSON reader takes it
    reasons = {s["name"]: s["reason"] for s in report["skipped_files"]}
    assert report["files"] == 8 and report["encoded"] == 3 and report["skipped"] == 5, reasons
    for name, words in expected.items():
        assert words in reasons[name], (name, reasons)
    names = [n for split in json.loads(text)["splits"].values() for n in split["names"]]
    assert sorted(names) == ["a/song.mid", "b/song.mid", "caf\\xe9.mid"]
    assert "skipped: 5" in run.stdout and run.stdout.count("skipped ") >= 5


def test_render_of_a_non_utf8_name_and_refusals_that_keep_the_users_files(pop909_songs, tmp_path):
    midi = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9.mid"))
    short = symusic.Score(str(pop909_songs[0])).clip(0, 480 * 8, clip_end=True)
    short.dump_midi(os.fsencode(midi).decode("utf-8", "surrogateescape"))
    original = midi.read_bytes()
    png = tmp_path / "roll.png"
    run = musegen("render", midi, "--pianoroll", png, area="file system")
    record("file system", run, None if "caf\\xe9.mid" not in run.stdout and png.is_file() else run.stdout)
    (tmp_path / "notes.txt").write_text("mine")
    refusals = [
        (["--out", midi], "the output is the input"),
        (["--pianoroll", midi], "the output is the input"),
        (["--out", tmp_path / "notes.txt"], "is not a WAV file"),
        (["--pianoroll", tmp_path / "notes.txt"], "is not a PNG file"),
        (["--out", tmp_path / "x.wav", "--soundfont", "/etc/passwd"], "not a SoundFont 2 file"),
        (["--out", tmp_path / "x.wav", "--soundfont", tmp_path], "is a folder"),
    ]
    for options, words in refusals:
        run = musegen("render", midi, *options, area="file system")
        record("file system", run, None if run.refused(words) else f"{options}: expected {words!r}: {run.stderr}")
    assert midi.read_bytes() == original and (tmp_path / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "x.wav").exists()


@pytest.mark.skipif(shutil.which("fluidsynth") is None, reason="fluidsynth not installed")
def test_render_length_bound_and_sigterm_leave_no_file_behind(tmp_path):
    long = tmp_path / "long.mid"  # 25 minutes of one chord per beat at 120 bpm
    events = [e for beat in range(3000) for e in ((0, extreme.on(48 + beat % 24)), (480, extreme.off(48 + beat % 24)))]
    long.write_bytes(extreme.smf([extreme.track(events)]))
    run = musegen("render", long, "--out", tmp_path / "a.wav", "--max-minutes", 20, area="render")
    record("render", run, None if run.refused("lasts 25.0 minutes", "--max-minutes") else run.stderr)
    cmd = [sys.executable, "-m", "musegen", "render", str(long), "--out", str(tmp_path / "b.wav")]
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=os.setpgrp
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".b.wav.*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.05)  # until FluidSynth is writing
    assert list(tmp_path.glob(".b.wav.*.tmp")), "the render never started writing"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    OUTCOMES["render", "refused"] += 1
    assert proc.returncode == 143 and err.decode().strip().endswith("error: terminated"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.mid"]
    fluidsynths = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert not fluidsynths  # the synthesiser was stopped with its parent


def test_a_forked_worker_terminated_before_its_setup_ends_quietly():
    """A pool stops its workers with SIGTERM, possibly before a worker's initialiser has run: the
    worker then still holds the CLI's handler (inherited through fork) and must die of the signal,
    not unwind with a traceback on the user's terminal."""
    script = (
        "import os, signal, sys\n"
        "from musegen.cli import main\n"
        "import musegen.cli as cli\n"
        "def fork_and_term():\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        sum(range(10**6))  # where the inherited handler would raise\n"
        "        os._exit(7)\n"
        "    _, status = os.waitpid(pid, 0)\n"
        "    print('child', os.WIFSIGNALED(status) and os.WTERMSIG(status))\n"
        "cli.app.command('fork-test')(fork_and_term)\n"
        "main(['fork-test'])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode == 0 and run.stdout.strip() == f"child {int(signal.SIGTERM)}", run
    assert "Traceback" not in run.stderr and "Terminated" not in run.stderr, run.stderr


def test_prepare_never_deletes_what_it_did_not_write(pop909_songs, tmp_path):
    """`--out .` beside the user's own .npy files, then a rewrite: only the shards it wrote go."""
    src = tmp_path / "src"
    src.mkdir()
    for song in pop909_songs[:3]:
        shutil.copy(song, src)
    work = tmp_path / "work"
    work.mkdir()
    mine = {"embeddings.npy": b"\x93NUMPY mine", "train-0123456789abcdef.npy": b"not a shard of musegen's"}
    for name, data in mine.items():
        (work / name).write_bytes(data)
    for limit in (2, 3):
        run = musegen(
            "data",
            "prepare",
            "midi",
            "--source",
            src,
            "--out",
            ".",
            "--limit",
            limit,
            "--workers",
            1,
            cwd=work,
            area="file system",
        )
        record("file system", run)
    index = json.loads((work / "index.json").read_text())
    shards = {entry["file"] for entry in index["splits"].values()}
    assert {p.name for p in work.glob("*.npy")} == set(mine) | shards  # the first run's shards are gone
    assert all((work / name).read_bytes() == data for name, data in mine.items())


# ---- checkpoints trusted no further than checked ------------------------------------------------------


def edited_checkpoint(source: Path, dest: Path, edit) -> Path:
    shutil.copytree(source, dest)
    edit(dest)
    return dest


def _set_model(**values):
    def edit(folder: Path):
        path = folder / "config.json"
        text = path.read_text()
        for key, value in values.items():  # as raw JSON text: 10**30 stays an integer
            data = json.loads(text)
            data["model"][key] = "@@"
            text = json.dumps(data).replace('"@@"', str(value))
        path.write_text(text)

    return edit


def _replace_with_fifo(name: str):
    def edit(folder: Path):
        (folder / name).unlink()
        os.mkfifo(folder / name)

    return edit


def _nest(folder: Path):
    (folder / "config.json").write_text(
        '{"format": "musegen-checkpoint", "meta": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )


CHECKPOINT_CASES = {
    "n_layers 10^30": (_set_model(n_layers=10**30), "n_layers"),
    "n_layers 10^6": (_set_model(n_layers=10**6), "n_layers"),
    "d_model 2^24": (_set_model(d_model=2**24, n_heads=2), "d_model"),
    "spe_realizations 10^9": (_set_model(spe_realizations=10**9), "spe_realizations"),
    "n_features 2^40": (_set_model(n_features=2**40), "n_features"),
    "100,000-deep JSON": (_nest, "nested deeper than"),
    "config.json a FIFO": (_replace_with_fifo("config.json"), "is a FIFO"),
    "weights a FIFO": (_replace_with_fifo("model.safetensors"), "is a FIFO"),
    "tokenizer a FIFO": (_replace_with_fifo("tokenizer.json"), "tokenizer"),
    "weights a link to /dev/zero": (
        lambda f: ((f / "model.safetensors").unlink(), (f / "model.safetensors").symlink_to("/dev/zero")),
        "character device",
    ),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_checkpoint_values_are_bounded_before_anything_is_built(case, checkpoints, tmp_path):
    edit, words = CHECKPOINT_CASES[case]
    folder = edited_checkpoint(checkpoints["remi"], tmp_path / "ckpt", edit)
    run = musegen("sample", "-c", folder, "--length", 4, "--out", tmp_path / "s", timeout=60, area="checkpoints")
    record("checkpoints", run, None if run.refused(words) else f"expected {words!r}: {run.stderr[-500:]}")
    assert run.peak_mb < 1000 and not (tmp_path / "s").exists()


def test_fp16_export_refuses_weights_it_cannot_hold_and_fp16_maxima_still_sample(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    big = edited_checkpoint(checkpoints["remi"], tmp_path / "big", lambda f: None)
    tensors = load_file(str(big / "model.safetensors"))
    tensors["head.weight"][0, 0] = 1e6
    save_file(tensors, str(big / "model.safetensors"))
    run = musegen("export", big, "--out", tmp_path / "fp16", "--dtype", "fp16", area="checkpoints")
    record("checkpoints", run, None if run.refused("head.weight", "1e+06", "beyond the range") else run.stderr)
    assert not (tmp_path / "fp16").exists()
    run = musegen("export", big, "--out", big, area="checkpoints")
    record("checkpoints", run, None if run.refused("is the checkpoint itself") else run.stderr)
    at_max = edited_checkpoint(checkpoints["remi"], tmp_path / "max", lambda f: None)
    save_file(
        {
            k: torch.full_like(v, 65504.0, dtype=torch.float16) if v.is_floating_point() else v
            for k, v in load_file(str(at_max / "model.safetensors")).items()
        },
        str(at_max / "model.safetensors"),
    )
    run = musegen("sample", "-c", at_max, "--length", 8, "--seed", 0, "--out", tmp_path / "s", area="checkpoints")
    record("checkpoints", run)


# ---- real full disks --------------------------------------------------------------------------------


@contextmanager
def small_disk(folder: Path, size_kb: int):
    """A tmpfs of `size_kb` mounted at `folder`: writes beyond it fail with a real ENOSPC inside
    whatever library writes (numpy, safetensors, FluidSynth), not an injected one."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root): no real full disk to write to")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def hidden_or_partial(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.name.startswith(".") and p.name.endswith(".tmp")]


def test_disk_full_in_safetensors_numpy_and_sample_writes_is_one_line(checkpoints, pop909_songs, tmp_path):
    with small_disk(tmp_path / "disk", 64) as disk:  # the tiny models' weights are ~300 kB
        run = musegen("export", checkpoints["remi"], "--out", disk / "model", "--dtype", "fp32", area="full disk")
        record("full disk", run, None if run.refused("disk full writing", "model.safetensors") else run.stderr)
        assert hidden_or_partial(disk) == [] and not (disk / "model" / "model.safetensors").exists()
    src = tmp_path / "src"
    src.mkdir()
    for song in pop909_songs[:12]:
        shutil.copy(song, src)
    with small_disk(tmp_path / "disk2", 96) as disk:
        prepare = ["data", "prepare", "midi", "--source", src, "--out", disk / "shards", "--workers", 1]
        record("full disk", musegen(*prepare, "--limit", 1, area="full disk"))
        before = (disk / "shards" / "index.json").read_text()
        run = musegen(*prepare, area="full disk")  # twelve songs do not fit
        record("full disk", run, None if run.refused("disk full writing") else run.stderr)
        assert (disk / "shards" / "index.json").read_text() == before and hidden_or_partial(disk) == []
        run = musegen(
            "sample",
            "-c",
            checkpoints["remi"],
            "--prompt",
            pop909_songs[0],
            "--length",
            8,
            "-n",
            64,
            "--out",
            disk / "samples",
            area="full disk",
        )
        record("full disk", run, None if run.rc == 0 or run.refused("disk full") else run.stderr)


@pytest.mark.skipif(shutil.which("fluidsynth") is None, reason="fluidsynth not installed")
def test_render_to_a_full_disk_is_refused_before_writing(pop909_songs, tmp_path):
    with small_disk(tmp_path / "disk", 256) as disk:
        run = musegen("render", pop909_songs[0], "--out", disk / "song.wav", area="full disk")
        record("full disk", run, None if run.refused("disk full", "needs about") else run.stderr)
        assert list(disk.iterdir()) == []


def test_disk_full_while_training_is_one_line(pop909_songs, tmp_path):
    data = prepare_pop909(pop909_songs[:3], tmp_path / "data")
    with small_disk(tmp_path / "disk", 200) as disk:
        run = musegen(
            "train",
            "--data",
            data,
            "--out",
            disk / "run",
            "--preset",
            "tiny",
            "--set",
            "steps=4",
            "--set",
            "seq_len=32",
            "--set",
            "batch_size=2",
            "--set",
            "workers=0",
            "--set",
            "ckpt_every=1",
            "--set",
            "valid_every=0",
            area="full disk",
        )
        record("full disk", run, None if run.refused("disk full") else run.stderr)


# ---- a data-prepare worker killed (as the out-of-memory killer does) ---------------------------------------

KILLING_ENCODER = textwrap.dedent("""
    import os, signal, sys
    from musegen.tokenizers.remi import RemiTokenizer
    real = RemiTokenizer.encode
    def encode(self, source):
        if "oom" in os.fspath(source):  # what the kernel's OOM killer does to a process: SIGKILL
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, source)
    RemiTokenizer.encode = encode
    from musegen.cli import main
    main(sys.argv[1:])
""")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_killed_worker_is_skipped_and_listed_never_a_hang(workers, pop909_songs, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i, song in enumerate(pop909_songs[:6]):
        shutil.copy(song, src / (f"{i}-oom.mid" if i in (1, 4) else f"{i}.mid"))
    run = musegen(
        "data",
        "prepare",
        "midi",
        "--source",
        src,
        "--out",
        tmp_path / "out",
        "--workers",
        workers,
        script=KILLING_ENCODER,
        timeout=300,
        area="killed workers",
    )
    record("killed workers", run)
    report = json.loads((tmp_path / "out" / "index.json").read_text())["report"]
    assert report["files"] == 6 and report["encoded"] == 4
    assert {s["name"]: "was killed" in s["reason"] for s in report["skipped_files"]} == {
        "1-oom.mid": True,
        "4-oom.mid": True,
    }


# ---- training, evaluation and batch sampling inputs ----------------------------------------------------

TINY = tiny_run(log_every=1)


@pytest.fixture(scope="module")
def tiny_data(pop909_songs, tmp_path_factory) -> Path:
    return prepare_pop909(pop909_songs[:3], tmp_path_factory.mktemp("data"))


def _fifo_config(tmp_path: Path, data: Path) -> list:
    os.mkfifo(tmp_path / "config.yaml")
    return ["--data", data, "--config", tmp_path / "config.yaml"]


def _deep_yaml(tmp_path: Path, data: Path) -> list:
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 50_000 + "]" * 50_000 + "\n")
    return ["--data", data, "--config", tmp_path / "deep.yaml"]


def _fifo_shard(tmp_path: Path, data: Path) -> list:
    shutil.copytree(data, tmp_path / "data")
    shard = next((tmp_path / "data").glob("train-*.npy"))
    shard.unlink()
    os.mkfifo(shard)
    return ["--data", tmp_path / "data"]


@pytest.mark.parametrize(
    "make", [_fifo_config, _deep_yaml, _fifo_shard], ids=["fifo config", "deep yaml", "fifo shard"]
)
def test_training_inputs_that_block_or_recurse(make, tiny_data, tmp_path):
    run = musegen(
        "train",
        *make(tmp_path, tiny_data),
        "--out",
        tmp_path / "run",
        *TINY,
        "--set",
        "steps=1",
        timeout=60,
        area="file system",
    )
    record("file system", run, None if run.rc in REFUSALS else "must be refused in one line")


def test_two_writers_on_one_run_folder(tiny_data, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "musegen",
        "train",
        "--data",
        str(tiny_data),
        "--out",
        str(tmp_path / "run"),
        *TINY,
        "--set",
        "steps=30",
        "--set",
        "ckpt_every=5",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, preexec_fn=_isolate)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=TIME_LIMIT_S), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    # The second refuses at the lock while the first trains (exit 1) or, had the first already
    # finished when it started (a loaded machine), at the checkpoints it left (exit 2): either
    # way in one line that says which.
    refusals = {1: "in use by another", 2: "already holds checkpoints"}
    errors = [[line for line in err.splitlines() if line.startswith("error:")] for rc, err in results if rc]
    one_refused = (
        codes[0] == 0
        and codes[1] in refusals
        and len(errors) == 1
        and len(errors[0]) == 1
        and refusals[codes[1]] in errors[0][0]
    )
    OUTCOMES["training", "refused" if one_refused else "failed"] += 1
    assert one_refused, f"both writers ran (exits {codes}; {errors})"


def test_divergent_training_stops_in_one_line_and_keeps_a_good_checkpoint(tiny_data, tmp_path):
    run = musegen(
        "train",
        "--data",
        tiny_data,
        "--out",
        tmp_path / "run",
        *TINY,
        "--set",
        "steps=40",
        "--set",
        "lr=1e6",
        "--set",
        "ckpt_every=10",
        area="training",
    )
    record("training", run, None if run.rc == 2 else "lr=1e6 must be refused in one line, exit 2 (out of lr's bounds)")


def test_evaluate_loss_with_a_huge_max_len_is_one_line(checkpoints, tiny_data, tmp_path):
    run = musegen(
        "evaluate",
        "loss",
        "-c",
        checkpoints["remi"],
        "--data",
        tiny_data,
        "--max-len",
        10**9,
        "--out",
        tmp_path / "e",
        area="evaluation",
    )
    record("evaluation", run, None if run.rc in (0, *REFUSALS) and run.peak_mb < 2000 else run.stderr[-300:])


def test_sample_never_silently_overwrites_a_colliding_prompt_name(checkpoints, pop909_songs, tmp_path):
    """`x.mid` and `x.midi` share a stem: each is continued into its own files or listed as skipped."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    shutil.copy(pop909_songs[0], prompts / "x.mid")
    shutil.copy(pop909_songs[1], prompts / "x.midi")
    out = tmp_path / "out"
    run = musegen(
        "sample",
        "-c",
        checkpoints["remi"],
        "--prompt",
        prompts,
        "--prompt-bars",
        2,
        "--length",
        8,
        "--seed",
        0,
        "--out",
        out,
        area="sampling",
    )
    batch = json.loads((out / "batch.json").read_text()) if run.rc == 0 else {"continued": 0, "skipped": {}}
    midis = sorted(p.name for p in out.rglob("*.mid"))
    accounted = batch["continued"] + len(batch["skipped"]) == 2 and len(midis) == batch["continued"]
    record("sampling", run, None if accounted else f"two prompts gave {midis}, batch {batch}")
