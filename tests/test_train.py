"""`musegen train`: learning, exact resume after SIGKILL, checkpoint safety, DDP, bad inputs."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from musegen.checkpoint import load_checkpoint
from musegen.cli import main
from musegen.errors import ConfigError
from musegen.shards import write_shards
from musegen.tokenizers.groove import GrooveTokenizer
from musegen.train import (TrainConfig, build_config, checkpoint_dirs, is_complete, latest_checkpoint, lr_factor,
                           train)

from train_fixtures import prepare_pop909

TINY = ["--preset", "tiny", "--set", "seq_len=64", "--set", "batch_size=2", "--set", "workers=0",
        "--set", "valid_every=0", "--set", "log_every=1"]
CONSTANT_LR = ["--set", "warmup=0", "--set", "lr=1e-3", "--set", "lr_floor=1e-3"]


@pytest.fixture(scope="module")
def pop20(pop909_songs, tmp_path_factory) -> Path:
    return prepare_pop909(pop909_songs, tmp_path_factory.mktemp("pop20"))


def _env():
    # one thread: deterministic kernels, and the two shared cores are not oversubscribed
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _musegen(*args) -> list[str]:
    return [sys.executable, "-m", "musegen", *map(str, args)]


def _losses(run: Path) -> dict[int, float]:
    lines = (run / "log.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


# ---- configuration and schedule ---------------------------------------------------------------

def test_config_layers_preset_file_and_sets(tmp_path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("lr: 0.001\nsteps: 50\nmodel:\n  n_layers: 3\n")
    cfg = build_config("small", "data", "out", yaml_file, ["steps=70", "model.pe=conv", "compile=true", "lr=3e-4"])
    assert (cfg.lr, cfg.steps, cfg.compile, cfg.model.n_layers, cfg.model.pe) == (3e-4, 70, True, 3, "conv")
    assert cfg.model.d_model == 256  # the rest of the preset stays
    for bad in (["steps=ten"], ["model.dropout=high"], ["nosuch=1"], ["model.nosuch=1"], ["steps"], ["optimizer=sgd"],
                ["compile=maybe"], ["batch_size=0"]):
        with pytest.raises(ConfigError):
            build_config("small", "d", "o", sets=bad)
    yaml_file.write_text("lr: fast\n")
    with pytest.raises(ConfigError, match="'lr' expects float"):
        build_config("small", "d", "o", yaml_file)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    warmup, total, floor = 10, 111, 0.1  # 100 decaying updates after the warm-up
    lrs = np.array([lr_factor(u, warmup, total, floor) for u in range(total)])
    assert np.allclose(lrs[:warmup], np.arange(1, warmup + 1) / warmup)
    assert lrs[warmup] == pytest.approx(1.0) and lrs[-1] == pytest.approx(floor)
    assert np.all(np.diff(lrs[warmup:]) <= 1e-12)
    middle = warmup + (total - 1 - warmup) // 2
    assert lrs[middle] == pytest.approx(floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * 0.5)), abs=1e-9)


# ---- learning --------------------------------------------------------------------------------

def test_200_steps_of_the_small_preset_lower_the_loss_by_30_percent(pop20, tmp_path):
    torch.set_num_threads(2)
    cfg = build_config("small", pop20, tmp_path / "run", sets=[
        "seq_len=64", "batch_size=4", "steps=200", "lr=1e-3", "warmup=20", "lr_floor=1e-4",
        "workers=1", "log_every=1", "valid_every=100", "valid_len=128", "ckpt_every=100", "valid_pieces=2"])
    result = train(cfg)
    losses = _losses(tmp_path / "run")
    start, end = np.mean([losses[s] for s in range(1, 6)]), np.mean([losses[s] for s in range(191, 201)])
    assert end <= 0.7 * start, (start, end)
    assert result["step"] == 200 and result["nonfinite"] == 0
    # validation wrote the per-position NLL, beyond the training length too
    rows = (tmp_path / "run" / "valid" / "step-00000200.csv").read_text().splitlines()
    assert rows[0] == "position,nll,count" and len(rows) == 1 + 128
    assert (tmp_path / "run" / "valid" / "step-00000200.png").stat().st_size > 1000
    assert result["valid"]["extrapolation"] is not None
    # the final checkpoint is self-contained and carries the training length
    model, tok, config, meta = load_checkpoint(result["checkpoint"])
    assert meta["train_len"] == 64 and meta["step"] == 200 and config.vocab_size == tok.vocab_size
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["config"]["seq_len"] == 64 and TrainConfig(**{**saved["config"], "model": config}).steps == 200


# ---- checkpoints and resume ------------------------------------------------------------------

def _watch(run: Path, stop: threading.Event, gaps: list):
    """Record any moment after the first checkpoint when no complete one exists."""
    seen = False
    while not stop.is_set():
        complete = [p for _, p in checkpoint_dirs(run) if is_complete(p)]
        seen |= bool(complete)
        if seen and not complete:
            gaps.append(time.time())
        time.sleep(0.002)


def test_sigkill_then_resume_reaches_the_same_weights(pop20, tmp_path):
    common = ["--data", pop20, *TINY, *CONSTANT_LR, "--set", "ckpt_every=5", "--set", "keep=2"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    reference = subprocess.Popen(_musegen("train", "--out", straight, *common, "--set", "steps=20"),
                                 env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # the killed run is told to go much further, so the kill surely lands mid-run
    stop, gaps = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(killed, stop, gaps))
    watcher.start()
    try:
        proc = subprocess.Popen(_musegen("train", "--out", killed, *common, "--set", "steps=1000"),
                                env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 240
        while not (killed / "checkpoints" / "step-00000010").exists():
            assert proc.poll() is None and time.time() < deadline, "the run ended before step 10"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        resume_from = latest_checkpoint(killed)
        step = int(resume_from.name.split("-")[1])
        assert 10 <= step < 20
        load_checkpoint(resume_from)  # loadable right after the kill
        resumed = subprocess.run(_musegen("train", "--out", killed, *common, "--set", "steps=20", "--resume"),
                                 env=_env(), capture_output=True, text=True)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
    finally:
        stop.set()
        watcher.join()
    assert reference.wait() == 0, reference.stderr.read()[-2000:]
    assert not gaps, "the run folder was left without a complete checkpoint"
    a, b = _weights(straight / "checkpoints" / "step-00000020"), _weights(killed / "checkpoints" / "step-00000020")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the log was rewound to the checkpoint: one loss per step, equal to the reference's
    assert _losses(killed) == _losses(straight)
    assert len(checkpoint_dirs(killed)) == 2  # keep=2


def test_ctrl_c_writes_a_checkpoint_and_exits_130(pop20, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(_musegen("train", "--data", pop20, "--out", run, *TINY, "--set", "steps=1000",
                                     "--set", "ckpt_every=500"), env=_env(), stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not any(json.loads(line).get("step", 0) >= 3 for line in _log_lines(run)):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    steps = [s for s, p in checkpoint_dirs(run) if is_complete(p)]
    assert steps[0] == 0 and steps[-1] >= 3  # the interrupted step was saved, not only step 0


def _log_lines(run: Path) -> list[str]:
    path = run / "log.jsonl"
    return [line for line in path.read_text().splitlines() if line.endswith("}")] if path.exists() else []


def test_non_finite_losses_stop_the_run_and_keep_the_good_checkpoint(pop20, tmp_path, capsys):
    run = tmp_path / "run"
    code = _cli(["train", "--data", pop20, "--out", run, *TINY, "--set", "lr=1e30", "--set", "warmup=0",
                 "--set", "grad_clip=0", "--set", "steps=50", "--set", "max_nonfinite=3"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "non-finite" in errors[0]
    model, *_ = load_checkpoint(latest_checkpoint(run))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    stopped = [json.loads(line) for line in _log_lines(run) if "stopped" in line]
    assert stopped and stopped[0]["step"] < 10


# ---- distributed -----------------------------------------------------------------------------

def test_two_gloo_processes_give_the_loss_curve_of_one(pop20, tmp_path):
    common = ["--data", pop20, "--preset", "tiny", "--set", "seq_len=64", "--set", "batch_size=4",
              "--set", "micro_batch=1", "--set", "steps=20", "--set", "workers=0", "--set", "valid_every=0",
              "--set", "log_every=1", "--set", "warmup=5", "--set", "lr=1e-3", "--device", "cpu"]
    one = subprocess.Popen(_musegen("train", "--out", tmp_path / "one", *common), env=_env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "-m", "musegen", "train", "--out", str(tmp_path / "two"), *map(str, common)],
                         env=_env(), capture_output=True, text=True)
    assert two.returncode == 0, two.stderr[-3000:]
    assert one.wait() == 0, one.stderr.read()[-2000:]
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert sorted(a) == sorted(b) == list(range(1, 21))
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-4
    assert a[20] < a[1]  # it did learn: the comparison is not between two flat lines
    saved = json.loads((tmp_path / "two" / "train_config.json").read_text())
    assert (saved["world_size"], saved["accumulation"]) == (2, 2)


# ---- bad inputs ------------------------------------------------------------------------------

def _cli(args) -> int:
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.fixture(scope="module")
def groove_data(tmp_path_factory) -> Path:
    """A one-piece groove corpus: a checkpoint trained on REMI must refuse it."""
    rng = np.random.default_rng(0)
    tok = GrooveTokenizer()
    notes = [(1 + i % 3, 40 + int(rng.integers(20)), 6 * i, 6 * i + 5) for i in range(60)]
    from musegen.tokenizers.groove import serialize
    ids = serialize(np.array(notes))
    out = tmp_path_factory.mktemp("groove")
    write_shards(out, tok, {"train": [("a", ids)]}, {})
    return out


def test_bad_inputs_give_one_line_and_a_non_zero_exit(pop20, groove_data, tmp_path, capsys):
    run = tmp_path / "run"
    assert _cli(["train", "--data", pop20, "--out", run, *TINY, "--set", "steps=2"]) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        "missing data": (["--data", tmp_path / "nowhere", "--out", tmp_path / "r1"], "not found"),
        "empty data": (["--data", empty, "--out", tmp_path / "r2"], "index.json"),
        "other tokenizer": (["--data", groove_data, "--out", run, "--resume"], "another tokenizer"),
        "resume without checkpoint": (["--data", pop20, "--out", tmp_path / "r3", "--resume"], "no checkpoint"),
        "unknown preset": (["--data", pop20, "--out", tmp_path / "r4", "--preset", "huge"], "unknown preset"),
        "wrong type": (["--data", pop20, "--out", tmp_path / "r5", "--set", "steps=many"], "expects int"),
        "existing run": (["--data", pop20, "--out", run], "--resume"),
    }
    capsys.readouterr()
    for name, (args, expected) in cases.items():
        preset = [] if "--preset" in args else ["--preset", "tiny"]
        code = _cli(["train", *args, *preset, "--set", "workers=0"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code != 0 and len(err) == 1 and expected in err[0], (name, err)
