"""`musegen train`: learning, exact resume after SIGKILL, checkpoint safety, DDP, bad inputs."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from train_fixtures import prepare_pop909, tiny_run

from musegen.checkpoint import load_checkpoint
from musegen.cli import main
from musegen.errors import ConfigError, FormatError
from musegen.generation.constraints import KeptShare
from musegen.generation.loop import constraint_chain, generate
from musegen.generation.prompt import Prompt
from musegen.generation.settings import SampleSettings
from musegen.metrics.loss import scoring_inputs, token_nll
from musegen.model.transformer import MusicPerformer
from musegen.shards import Shards, write_shards
from musegen.tokenizers.groove import GrooveTokenizer
from musegen.training.loader import load_training_data
from musegen.training.optim import lr_factor, make_optimizer, next_token_nll
from musegen.training.processes import setup_processes
from musegen.training.run_folder import checkpoint_dirs, is_complete, latest_checkpoint
from musegen.training.settings import LIMITS, TrainConfig, build_config, format_limit
from musegen.training.trainer import Trainer, train

TINY = tiny_run(seq_len=64, log_every=1)
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
    for bad in (
        ["steps=ten"],
        ["model.dropout=high"],
        ["nosuch=1"],
        ["model.nosuch=1"],
        ["steps"],
        ["optimizer=sgd"],
        ["compile=maybe"],
        ["batch_size=0"],
        ["data=elsewhere"],
    ):
        with pytest.raises(ConfigError):
            build_config("small", "d", "o", sets=bad)
    yaml_file.write_text("lr: fast\n")
    with pytest.raises(ConfigError, match="'lr' expects float"):
        build_config("small", "d", "o", yaml_file)
    yaml_file.write_text("model: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        build_config("small", "d", "o", yaml_file)
    # settings of one layer are applied together: the order of agreeing settings does not matter
    assert build_config("small", "d", "o", sets=["lr=1e-6", "lr_floor=1e-7"]).lr_floor == 1e-7


@pytest.mark.parametrize(
    "setting",
    [
        "lr=5",
        "lr=inf",
        "lr=1e30",
        "lr=nan",
        "lr=0",
        "lr_floor=-1e-9",
        "steps=0",
        "steps=10000000000",
        "seq_len=10000000",
        "seq_len=0",
        "batch_size=0",
        "batch_size=-1",
        "batch_size=100000",
        "grad_clip=-1",
        "grad_clip=inf",
        "weight_decay=2",
        "warmup=-1",
        "seed=-1",
        "keep=0",
        "max_nonfinite=0",
        "valid_len=1000000",
        "workers=1000",
    ],
)
def test_numeric_settings_out_of_their_bounds_are_refused(setting, tmp_path, capsys):
    key = setting.split("=")[0]
    low, high = LIMITS[key]
    message = rf"^{key} must be in {re.escape(format_limit(low))}\.\.{re.escape(format_limit(high))}, got "
    with pytest.raises(FormatError, match=message):
        build_config("tiny", "d", "o", sets=[setting])
    build_config("tiny", "d", "o", sets=[f"{key}={high}"] + (["lr=1"] if key == "lr_floor" else []))  # the bound is in
    # the CLI: one line and exit 2, as for a model setting out of its bounds, before anything is written
    capsys.readouterr()
    code = _cli(["train", "--data", tmp_path, "--out", tmp_path / "run", "--set", setting])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and re.search(message, err[0].removeprefix("error: ")), err
    assert not (tmp_path / "run").exists()
    assert _cli(["train", "--data", tmp_path, "--out", tmp_path / "run", "--set", "model.n_features=0"]) == 2


def test_the_bounds_are_documented():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    for key, (low, high) in LIMITS.items():
        assert re.search(
            rf"\| `{key}` \|[^|\n]*\| {re.escape(format_limit(low))}\.\.{re.escape(format_limit(high))} \|", docs
        ), key
    result = subprocess.run(
        _musegen("train", "--help"), capture_output=True, text=True, env={**_env(), "COLUMNS": "300"}
    )
    help_text = " ".join(result.stdout.replace("│", " ").split())
    for key in ("lr", "seq_len", "batch_size"):
        assert f"{key} {format_limit(LIMITS[key][0])}..{format_limit(LIMITS[key][1])}" in help_text, key
    assert f"steps 1..10^{round(math.log10(LIMITS['steps'][1]))}" in help_text and LIMITS["steps"][0] == 1


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    warmup, total, floor = 10, 111, 0.1  # 100 decaying updates after the warm-up
    lrs = np.array([lr_factor(u, warmup, total, floor) for u in range(total)])
    assert np.allclose(lrs[:warmup], np.arange(1, warmup + 1) / warmup)
    assert lrs[warmup] == pytest.approx(1.0) and lrs[-1] == pytest.approx(floor)
    assert np.all(np.diff(lrs[warmup:]) <= 1e-12)
    middle = warmup + (total - 1 - warmup) // 2
    assert lrs[middle] == pytest.approx(floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * 0.5)), abs=1e-9)


def test_next_token_nll_sums_the_targets_negative_log_probabilities_and_skips_padding():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11, dtype=torch.bfloat16)
    targets = torch.randint(0, 10, (3, 7))
    targets[1, 4:] = 10  # padding
    logp = logits.double().log_softmax(-1)
    expected = -sum(logp[b, t, targets[b, t]] for b in range(3) for t in range(7) if targets[b, t] != 10)
    nll = next_token_nll(logits, targets, ignore_index=10)
    assert nll.dtype == torch.float32 and float(nll) == pytest.approx(float(expected), rel=1e-6)


def test_the_optimiser_is_adams_fused_kernel_on_cpu_and_steps_like_the_plain_one():
    torch.manual_seed(0)
    weights = [torch.randn(5, 4, requires_grad=True), torch.randn(4, requires_grad=True)]
    twins = [w.detach().clone().requires_grad_() for w in weights]
    start = [w.detach().clone() for w in weights]
    fused = make_optimizer(weights, "adamw", 1e-2, 0.1, torch.device("cpu"))
    plain = torch.optim.AdamW(twins, lr=1e-2, weight_decay=0.1)
    assert fused.defaults["fused"]
    for _ in range(5):
        for group in (weights, twins):
            for w in group:
                w.grad = torch.sin(w.detach() * 3)
        fused.step(), plain.step()
    for w, twin, w0 in zip(weights, twins, start):
        assert torch.allclose(w, twin, atol=1e-6) and (w - w0).abs().min() > 1e-3  # every weight moved


# ---- learning --------------------------------------------------------------------------------


def test_200_steps_of_the_small_preset_lower_the_loss_by_30_percent(pop20, tmp_path):
    torch.set_num_threads(2)
    cfg = build_config(
        "small",
        pop20,
        tmp_path / "run",
        sets=[
            "seq_len=64",
            "batch_size=4",
            "steps=200",
            "lr=1e-3",
            "warmup=20",
            "lr_floor=1e-4",
            "workers=1",
            "log_every=1",
            "valid_every=100",
            "valid_len=128",
            "ckpt_every=100",
            "valid_pieces=2",
        ],
    )
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
    # one precision for both runs: each would time "auto" for itself, under the load of the other
    common = [
        "--data",
        pop20,
        *TINY,
        *CONSTANT_LR,
        "--set",
        "ckpt_every=5",
        "--set",
        "keep=2",
        "--set",
        "precision=bf16",
    ]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    reference = subprocess.Popen(
        _musegen("train", "--out", straight, *common, "--set", "steps=20"),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # the killed run is told to go much further, so the kill surely lands mid-run
    stop, gaps = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(killed, stop, gaps))
    watcher.start()
    try:
        proc = subprocess.Popen(
            _musegen("train", "--out", killed, *common, "--set", "steps=1000"),
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
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
        resumed = subprocess.run(
            _musegen("train", "--out", killed, *common, "--set", "steps=20", "--resume"),
            env=_env(),
            capture_output=True,
            text=True,
        )
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


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm to the process group, with a data worker"])
def test_ctrl_c_writes_a_checkpoint_and_exits_130_and_a_second_run_is_locked_out(stop, pop20, tmp_path, capsys):
    run = tmp_path / "run"
    workers = ["--set", "workers=1"] if "worker" in stop else []
    proc = subprocess.Popen(
        _musegen(
            "train", "--data", pop20, "--out", run, *TINY, "--set", "steps=1000", "--set", "ckpt_every=500", *workers
        ),
        env=_env(),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=os.setpgrp,
    )
    deadline = time.time() + 120
    while not any(json.loads(line).get("step", 0) >= 3 for line in _log_lines(run)):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.01)
    config = (run / "train_config.json").read_bytes()
    capsys.readouterr()
    for extra in ([], ["--resume"]):  # a second run on the folder, fresh or resuming, refuses to start
        code = _cli(["train", "--data", pop20, "--out", run, *TINY, "--set", "steps=5", "--set", "seed=7", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(err) == 1 and f"in use by another `musegen train` (process {proc.pid})" in err[0], err
    assert (run / "train_config.json").read_bytes() == config
    if stop == "ctrl-c":
        proc.send_signal(signal.SIGINT)
    else:
        os.killpg(proc.pid, signal.SIGTERM)  # what a job scheduler sends: the worker gets it too
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    steps = [s for s, p in checkpoint_dirs(run) if is_complete(p)]
    assert steps[0] == 0 and steps[-1] >= 3  # the interrupted step was saved, not only step 0
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"stopped at step {steps[-1]} on request" in errors[0] and "Traceback" not in stderr
    assert json.loads(_log_lines(run)[-1]) == {"step": steps[-1], "event": "stopped", "reason": "stop request"}


def test_a_partial_last_log_line_is_dropped_on_resume(pop20, tmp_path, capsys):
    """A full disk (or a kill) mid-write leaves half a line; the next --resume drops it and goes on."""
    common = ["--data", pop20, *TINY, *CONSTANT_LR, "--set", "ckpt_every=2"]
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert _cli(["train", "--out", straight, *common, "--set", "steps=4"]) == 0
    assert _cli(["train", "--out", cut, *common, "--set", "steps=2"]) == 0
    with open(cut / "log.jsonl", "a") as log:
        log.write("[" * 100000 + "]" * 100000 + "\n")  # (nested too deeply for the json module)
        log.write('{"step": 3, "loss": 4.12')
    assert _cli(["train", "--out", cut, *common, "--set", "steps=4", "--resume"]) == 0
    records = [json.loads(line) for line in (cut / "log.jsonl").read_text().splitlines()]  # every line parses
    assert [r.get("log_lines_dropped") for r in records if r.get("event") == "resume"] == [2]
    assert _losses(cut) == _losses(straight)


def test_resume_alone_continues_with_the_runs_recorded_settings_and_reports_what_the_command_changes(
    pop20, tmp_path, capsys
):
    """`--resume` as the stop message suggests it, without repeating the run's settings: the
    tiny preset, its crop, batch and constant lr come from the run folder, so the updates are an
    uninterrupted run's; only what the command gives (the longer schedule) changes, and is said."""
    common = ["--data", pop20, *TINY, *CONSTANT_LR, "--set", "ckpt_every=2", "--set", "seed=3"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert _cli(["train", "--out", straight, *common, "--set", "steps=4"]) == 0
    assert _cli(["train", "--out", stopped, *common, "--set", "steps=2"]) == 0
    capsys.readouterr()
    assert _cli(["train", "--data", pop20, "--out", stopped, "--set", "steps=4", "--resume"]) == 0
    reported = [line for line in capsys.readouterr().err.splitlines() if line.startswith("resume:")]
    assert reported == ["resume: steps: 2 -> 4 (this command's)"]
    entries = [json.loads(line) for line in _log_lines(stopped)]
    assert [r["changed"] for r in entries if r.get("event") == "resume"] == [["steps: 2 -> 4"]]
    assert _losses(stopped) == _losses(straight)
    recorded = json.loads((stopped / "train_config.json").read_text())["config"]
    assert recorded == json.loads((straight / "train_config.json").read_text())["config"] | {"out": "stopped"}
    # a model setting that contradicts the checkpoint is refused in one line, the folder untouched
    before = (stopped / "train_config.json").read_bytes()
    code = _cli(["train", "--data", pop20, "--out", stopped, "--set", "model.n_layers=3", "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "contradicts the checkpoint being resumed" in err[0], err
    assert (stopped / "train_config.json").read_bytes() == before


# ---- starting from a checkpoint's weights (--init) -------------------------------------------------


@pytest.fixture(scope="module")
def pretrained(pop20, tmp_path_factory) -> Path:
    """A tiny model trained for 40 updates: the starting point of the fine-tuning tests."""
    run = tmp_path_factory.mktemp("pretrained") / "run"
    assert (
        _cli(
            ["train", "--data", pop20, "--out", run, *TINY, *CONSTANT_LR, "--set", "steps=40", "--set", "ckpt_every=40"]
        )
        == 0
    )
    return run


def test_init_fine_tunes_from_an_exported_model_with_a_fresh_optimiser(pop20, pretrained, tmp_path):
    first_losses = [_losses(pretrained)[s] for s in range(1, 4)]
    for dtype in ("fp16", "bf16"):
        exported = tmp_path / f"model-{dtype}"
        assert _cli(["export", latest_checkpoint(pretrained), "--out", exported, "--dtype", dtype]) == 0
        run = tmp_path / f"tuned-{dtype}"
        # no --preset: the model comes from the checkpoint; training settings are free
        assert (
            _cli(
                [
                    "train",
                    "--data",
                    pop20,
                    "--out",
                    run,
                    *TINY[2:],
                    *CONSTANT_LR,
                    "--set",
                    "lr=5e-4",
                    "--set",
                    "lr_floor=5e-4",
                    "--set",
                    "seq_len=32",
                    "--set",
                    "steps=3",
                    "--init",
                    exported,
                ]
            )
            == 0
        )
        # the run starts from the exported weights, stored in fp32
        start, stored = _weights(run / "checkpoints" / "step-00000000"), _weights(exported)
        assert all(start[k].dtype == torch.float32 and torch.equal(start[k], stored[k].float()) for k in stored)
        assert stored["head.weight"].dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        state = json.loads((run / "checkpoints" / "step-00000000" / "trainer_state.json").read_text())
        assert state["optimizer"]["scalars"] == {} and state["scheduler"]["last_epoch"] == 0
        assert not load_file(str(run / "checkpoints" / "step-00000000" / "trainer_state.safetensors")).keys() - {
            "rng.torch"
        }
        # it learnt before: its first losses are far below those of the model it was fine-tuned from
        tuned = _losses(run)
        assert max(tuned.values()) < min(first_losses) - 1.0, (tuned, first_losses)
        saved = json.loads((run / "train_config.json").read_text())
        # recorded by name: the exported model's folder, and the run's checkpoint it came from
        assert saved["init"] == saved["config"]["init"] == exported.name and saved["config"]["seq_len"] == 32
        start_record = json.loads((run / "log.jsonl").read_text().splitlines()[0])
        assert start_record["event"] == "start" and start_record["init"] == exported.name
        assert start_record["precision"]["path"] in ("fp32", "bf16") and start_record["precision"]["reason"]
        assert load_checkpoint(latest_checkpoint(run))[3]["init"] == exported.name
        assert load_checkpoint(exported)[3]["exported_from"] == "run/checkpoints/step-00000040"
    # the same command with --resume continues the fine-tuning run; its new lr takes effect
    assert (
        _cli(
            [
                "train",
                "--data",
                pop20,
                "--out",
                run,
                *TINY[2:],
                *CONSTANT_LR,
                "--set",
                "lr=2e-4",
                "--set",
                "lr_floor=2e-4",
                "--set",
                "seq_len=32",
                "--set",
                "steps=5",
                "--init",
                exported,
                "--resume",
            ]
        )
        == 0
    )
    lrs = {r["step"]: r["lr"] for r in map(json.loads, _log_lines(run)) if "lr" in r}
    assert lrs[3] == 5e-4 and lrs[4] == lrs[5] == 2e-4


def test_init_refuses_a_contradicting_model_or_another_tokenizer(pretrained, pop20, groove_data, tmp_path, capsys):
    init = latest_checkpoint(pretrained)
    cfg = build_config("tiny", pop20, tmp_path / "a", sets=["model.n_layers=2", "lr=1e-3", "steps=7"], init=init)
    assert (cfg.model, cfg.preset, cfg.init, cfg.steps) == (load_checkpoint(init)[2], "tiny", str(init), 7)
    cases = {
        "other preset": (
            ["--preset", "small"],
            "--preset small contradicts the --init checkpoint's model (n_layers: 4 vs 2)",
            2,  # a setting
        ),
        "other model setting": (
            ["--set", "model.n_layers=3"],
            "model.n_layers=3 contradicts the --init checkpoint's n_layers=2",
            2,
        ),
        "other tokenizer": (
            ["--data", groove_data],
            "trained on another tokenizer (remi, 333 tokens) than the data",
            1,  # the checkpoint
        ),
        "no checkpoint": (["--init", tmp_path / "nowhere"], "checkpoint folder not found", 1),
    }
    for name, (args, expected, exit_code) in cases.items():
        data = [] if "--data" in args else ["--data", pop20]
        start = [] if "--init" in args else ["--init", init]
        code = _cli(["train", *data, *start, "--out", tmp_path / name, *TINY[2:], *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == exit_code and len(err) == 1 and expected in err[0], (name, err)
        assert not (tmp_path / name).exists()  # refused before anything was written


def test_kit_shuffle_on_data_without_a_drum_kit_is_refused_before_anything_is_written(pop20, tmp_path, capsys):
    code = _cli(["train", "--data", pop20, "--out", tmp_path / "run", *TINY[2:], "--set", "kit_shuffle=0.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "kit_shuffle: the remi representation cannot do this augmentation" in err[0]
    assert not (tmp_path / "run").exists()


# ---- a tampered trainer state is refused before anything is written ----------------------------


def _tamper_tensors(edit):
    def tamper(folder: Path):
        path = folder / "trainer_state.safetensors"
        tensors = load_file(str(path))
        edit(tensors)
        save_file(tensors, str(path))

    return tamper


def _tamper_json(edit):
    def tamper(folder: Path):
        path = folder / "trainer_state.json"
        state = json.loads(path.read_text())
        edit(state)
        path.write_text(json.dumps(state))

    return tamper


TAMPERED_STATES = {
    "moment of another shape": _tamper_tensors(lambda t: t.update({"optim.0.exp_avg": torch.zeros(3)})),
    "moment of another dtype": _tamper_tensors(lambda t: t.update({"optim.1.exp_avg": t["optim.1.exp_avg"].double()})),
    "missing moment": _tamper_tensors(lambda t: t.pop("optim.2.exp_avg_sq")),
    "NaN moment": _tamper_tensors(lambda t: t["optim.0.exp_avg"].view(-1).__setitem__(0, float("nan"))),
    "negative second moment": _tamper_tensors(lambda t: t["optim.0.exp_avg_sq"].view(-1).__setitem__(0, -1.0)),
    "moments of a parameter the model lacks": _tamper_tensors(
        lambda t: t.update({"optim.999.exp_avg": torch.zeros(1)})
    ),
    "truncated RNG state": _tamper_tensors(lambda t: t.update({"rng.torch": t["rng.torch"][:100]})),
    "unexpected tensor": _tamper_tensors(lambda t: t.update({"extra": torch.zeros(1)})),
    "scheduler at another update": _tamper_json(lambda s: s["scheduler"].update(last_epoch=99)),
    "scheduler without base_lrs": _tamper_json(lambda s: s["scheduler"].pop("base_lrs")),
    "scheduler lr not a number": _tamper_json(lambda s: s["scheduler"].update(_last_lr=["fast"])),
    "negative counter": _tamper_json(lambda s: s.update(nonfinite_total=-1)),
    "counter not an integer": _tamper_json(lambda s: s.update(tokens_seen="many")),
    "step of another folder": _tamper_json(lambda s: s.update(step=1)),
    "optimizer group of fewer parameters": _tamper_json(
        lambda s: s["optimizer"]["param_groups"][0].update(params=s["optimizer"]["param_groups"][0]["params"][:-1])
    ),
    "optimizer setting of another type": _tamper_json(lambda s: s["optimizer"]["param_groups"][0].update(eps="small")),
    "deeply nested JSON": lambda folder: (folder / "trainer_state.json").write_text("[" * 100000 + "]" * 100000),
}


@pytest.fixture(scope="module")
def two_steps(pop20, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("two") / "run"
    assert _cli(["train", "--data", pop20, "--out", run, *TINY, "--set", "steps=2", "--set", "ckpt_every=2"]) == 0
    return run


def _trainer(cfg, resume: bool) -> Trainer:
    procs, device = setup_processes(cfg.device)
    data = load_training_data(cfg)
    model_cfg = dataclasses.replace(cfg.model, vocab_size=data.tokenizer.vocab_size)
    return Trainer(cfg, procs, device, data, model_cfg, None, resume, "musegen train")


def _state_of(folder: Path) -> dict[str, tuple]:
    """Every path under `folder`: whether it is a folder, its modification time, its bytes."""
    return {
        str(p.relative_to(folder)): (p.is_dir(), p.stat().st_mtime_ns, None if p.is_dir() else p.read_bytes())
        for p in folder.rglob("*")
    }


def test_constructing_a_trainer_writes_nothing_and_running_it_writes_the_run(pop20, two_steps, tmp_path):
    sets = ["seq_len=64", "batch_size=2", "workers=0", "valid_every=0", "precision=fp32", "ckpt_every=2"]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    trainer = _trainer(build_config("tiny", pop20, fresh, sets=sets + ["steps=1"]), resume=False)
    assert list(fresh.iterdir()) == []
    assert _trainer(build_config("tiny", pop20, tmp_path / "absent", sets=sets), resume=False)
    assert not (tmp_path / "absent").exists()
    assert trainer.run()["step"] == 1
    assert {p.name for p in fresh.iterdir()} - {"tensorboard"} == {"checkpoints", "log.jsonl", "train_config.json"}
    assert [s for s, _ in checkpoint_dirs(fresh)] == [0, 1]
    # a resumed run reads and checks the checkpoint at construction, and still writes nothing
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    before = _state_of(run)
    trainer = _trainer(build_config("tiny", pop20, run, sets=sets + ["steps=4"]), resume=True)
    assert trainer.learner.step == 2 and _state_of(run) == before
    trainer.run()
    saved = json.loads((run / "train_config.json").read_text())
    assert saved["resumed_from"] == "checkpoints/step-00000002" and [s for s, _ in checkpoint_dirs(run)][-1] == 4


def test_the_run_records_folders_by_name_not_by_this_machines_paths(pop20, two_steps):
    """A checkpoint travels: its metadata and the run's config name the data and the run, not
    where they lay on the machine that trained it."""
    saved = json.loads((two_steps / "train_config.json").read_text())
    assert (saved["config"]["data"], saved["config"]["out"]) == (pop20.name, two_steps.name)
    for _, folder in checkpoint_dirs(two_steps):
        meta = load_checkpoint(folder)[3]
        assert meta["data"] == pop20.name and "init" not in meta
    texts = [(two_steps / "train_config.json").read_text()]
    texts += [(folder / "config.json").read_text() for _, folder in checkpoint_dirs(two_steps)]
    assert not any(str(two_steps.parent) in text or str(pop20) in text for text in texts)


@pytest.mark.parametrize("case", list(TAMPERED_STATES))
def test_a_tampered_trainer_state_is_refused_before_anything_is_written(case, two_steps, pop20, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    TAMPERED_STATES[case](run / "checkpoints" / "step-00000002")
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    capsys.readouterr()
    code = _cli(
        ["train", "--data", pop20, "--out", run, *TINY, "--set", "steps=4", "--set", "ckpt_every=2", "--resume"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    against_schema = case in ("negative counter", "counter not an integer", "deeply nested JSON")  # schemas.py: exit 2
    assert code == (2 if against_schema else 1) and len(err) == 1, err
    assert ("trainer_state.json" if against_schema else "training state") in err[0], err
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before


def test_a_run_saved_with_another_optimiser_kernel_resumes_with_this_processs(two_steps, pop20, tmp_path):
    """A run saved with other optimiser kernel settings (`fused: null` in its param groups) resumes
    with this process's: how the optimiser computes is not part of the run's state."""
    run = tmp_path / "run"
    shutil.copytree(two_steps, run)
    state_json = run / "checkpoints" / "step-00000002" / "trainer_state.json"
    state = json.loads(state_json.read_text())
    assert all(group["fused"] is True for group in state["optimizer"]["param_groups"])
    for group in state["optimizer"]["param_groups"]:
        group["fused"], group["foreach"] = None, None
    state_json.write_text(json.dumps(state))
    assert (
        _cli(["train", "--data", pop20, "--out", run, *TINY, "--set", "steps=4", "--set", "ckpt_every=2", "--resume"])
        == 0
    )
    resumed = json.loads((run / "checkpoints" / "step-00000004" / "trainer_state.json").read_text())
    assert all(group["fused"] is True for group in resumed["optimizer"]["param_groups"])


def _log_lines(run: Path) -> list[str]:
    path = run / "log.jsonl"
    return [line for line in path.read_text().splitlines() if line.endswith("}")] if path.exists() else []


def _diverge_after(monkeypatch, updates: int):
    """From training forward pass `updates` + 1 on, the model's logits are NaN: a diverged model."""
    real, calls = MusicPerformer.forward, []

    def forward(self, *args, **kwargs):
        logits = real(self, *args, **kwargs)
        if self.training:
            calls.append(1)
            if len(calls) > updates:
                return logits * float("nan")
        return logits

    monkeypatch.setattr(MusicPerformer, "forward", forward)


def _finite(folder: Path) -> bool:
    return all(torch.isfinite(t).all() for t in _weights(folder).values())


def test_non_finite_losses_stop_the_run_and_keep_the_good_checkpoint(pop20, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    _diverge_after(monkeypatch, 4)
    code = _cli(
        [
            "train",
            "--data",
            pop20,
            "--out",
            run,
            *TINY,
            "--set",
            "steps=50",
            "--set",
            "max_nonfinite=3",
            "--set",
            "ckpt_every=2",
            "--set",
            "keep=1",
        ]
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "non-finite 3 updates in a row" in errors[0], errors
    # step 6 skipped two updates but its weights are finite: it is written, and it is good
    assert [s for s, _ in checkpoint_dirs(run)] == [6] and errors[0].endswith("step-00000006")
    load_checkpoint(latest_checkpoint(run))  # loads: finite weights
    stopped = [json.loads(line) for line in _log_lines(run) if "stopped" in line]
    assert [(r["step"], r["reason"]) for r in stopped] == [(7, "non-finite")]
    assert [r["nonfinite"] for r in map(json.loads, _log_lines(run)) if "loss" in r] == [0, 0, 0, 0, 1, 2, 3]


def test_a_run_that_ends_diverged_exits_non_zero(pop20, tmp_path, capsys, monkeypatch):
    """Fewer steps than max_nonfinite: a run whose last updates were skipped still exits non-zero."""
    run = tmp_path / "run"
    _diverge_after(monkeypatch, 2)
    code = _cli(
        ["train", "--data", pop20, "--out", run, *TINY, "--set", "steps=5", "--set", "ckpt_every=1", "--set", "keep=10"]
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "ended diverged: its last 3 updates were non-finite" in errors[0]
    folders = dict(checkpoint_dirs(run))
    assert sorted(folders) == [0, 1, 2, 3, 4, 5] and all(_finite(f) for f in folders.values())
    # skipped updates leave the weights alone: every checkpoint after step 2 holds step 2's weights
    assert all(torch.equal(_weights(folders[2])[k], v) for k, v in _weights(folders[5]).items())


def test_non_finite_weights_are_never_saved_and_the_good_checkpoint_is_never_pruned(
    pop20, tmp_path, capsys, monkeypatch
):
    run = tmp_path / "run"
    real, calls = torch.optim.Adam.step, []

    def step(self, *args, **kwargs):  # the third update leaves an infinite weight; the loss stays finite
        result = real(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = float("inf")
        return result

    monkeypatch.setattr(torch.optim.Adam, "step", step)
    code = _cli(
        ["train", "--data", pop20, "--out", run, *TINY, "--set", "steps=10", "--set", "ckpt_every=1", "--set", "keep=1"]
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "became non-finite by step 3; not saved" in errors[0], errors
    assert [s for s, _ in checkpoint_dirs(run)] == [2] and _finite(latest_checkpoint(run))
    assert errors[0].endswith("last good checkpoint: " + str(latest_checkpoint(run)))


# ---- distributed -----------------------------------------------------------------------------


def test_two_gloo_processes_give_the_loss_curve_of_one(pop20, tmp_path):
    common = [
        "--data",
        pop20,
        "--preset",
        "tiny",
        "--set",
        "seq_len=64",
        "--set",
        "batch_size=4",
        "--set",
        "micro_batch=1",
        "--set",
        "steps=20",
        "--set",
        "workers=0",
        "--set",
        "valid_every=0",
        "--set",
        "log_every=1",
        "--set",
        "warmup=5",
        "--set",
        "lr=1e-3",
        "--device",
        "cpu",
    ]
    one = subprocess.Popen(
        _musegen("train", "--out", tmp_path / "one", *common),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "musegen",
            "train",
            "--out",
            str(tmp_path / "two"),
            *map(str, common),
        ],
        env=_env(),
        capture_output=True,
        text=True,
    )
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
    from musegen.tokenizers.groove_events import serialize

    ids = serialize(np.array(notes))
    out = tmp_path_factory.mktemp("groove")
    write_shards(out, tok, {"train": [("a", ids)]}, {})
    return out


@pytest.fixture(scope="module")
def out_of_vocabulary(pop20, tmp_path_factory) -> Path:
    """REMI shards with one id past the vocabulary: refused in one line, not an IndexError mid-run."""
    from musegen.shards import Shards

    shards = Shards(pop20)
    pieces = [("ok", shards.pieces("train")[0]), ("bad", np.append(shards.pieces("train")[1], 333))]
    out = tmp_path_factory.mktemp("oov")
    write_shards(out, shards.tokenizer, {"train": pieces}, {})
    return out


def test_bad_inputs_give_one_line_and_a_non_zero_exit(pop20, groove_data, out_of_vocabulary, tmp_path, capsys):
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
        "id outside the vocabulary": (
            ["--data", out_of_vocabulary, "--out", tmp_path / "r6"],
            "token id 333 (piece 'bad') is outside the tokenizer's vocabulary",
        ),
        "lr out of bounds": (["--data", pop20, "--out", tmp_path / "r7", "--set", "lr=1e30"], "lr must be in 1e-8..1"),
    }
    capsys.readouterr()
    for name, (args, expected) in cases.items():
        preset = [] if "--preset" in args else ["--preset", "tiny"]
        code = _cli(["train", *args, *preset, "--set", "workers=0"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code != 0 and len(err) == 1 and expected in err[0], (name, err)


def test_a_model_of_beats_with_a_window_trains_and_validates_on_remi_onsets(pop20, tmp_path, capsys):
    run = tmp_path / "run"
    beats = ["--set", "model.positions=beats", "--set", "model.window=8", "--set", "valid_every=3"]
    assert _cli(["train", "--data", pop20, "--out", run, *TINY, *beats, "--set", "steps=3"]) == 0
    losses = _losses(run)
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(loss) for loss in losses.values())
    config = load_checkpoint(latest_checkpoint(run))[2]
    assert (config.positions, config.window) == ("beats", 8)
    validated = [record for record in map(json.loads, _log_lines(run)) if "valid_loss" in record]
    assert [record["step"] for record in validated] == [3] and math.isfinite(validated[0]["valid_loss"])


def test_a_model_trained_under_the_grammar_trains_validates_and_samples_under_it(pop20, tmp_path, capsys):
    run = tmp_path / "run"
    under = ["--set", "model.loss_over=grammar", "--set", "valid_every=3"]
    assert _cli(["train", "--data", pop20, "--out", run, *TINY, *under, "--set", "steps=3"]) == 0
    assert all(math.isfinite(loss) for loss in _losses(run).values())
    model, tokenizer, config, _ = load_checkpoint(latest_checkpoint(run))
    assert config.loss_over == "grammar"
    validated = [record for record in map(json.loads, _log_lines(run)) if "valid_loss" in record]
    assert math.isfinite(validated[0]["valid_loss"])
    # scored among the allowed ids, every token is at least as likely as among all of them
    piece = Shards(pop20).pieces("valid")[0][:300]
    among_allowed = token_nll(model, [piece], 299, tokenizer.pad_id, grammar=tokenizer.grammar())[0]
    among_all = token_nll(model, [piece], 299, tokenizer.pad_id)[0]
    assert (among_allowed <= among_all + 1e-6).all() and among_allowed.sum() < among_all.sum()
    assert scoring_inputs(model, tokenizer)["grammar"] is not None
    # sampled with the grammar's mask and no share kept (its distribution over the mask is its own)
    settings = SampleSettings(length=40, seed=1, precision="fp32")
    assert not any(isinstance(c, KeptShare) for c in constraint_chain(settings, under_grammar=True))
    samples, _ = generate(model, tokenizer, Prompt(piece[:100]), settings, progress=False)
    assert tokenizer.grammar().first_violation(samples[0].ids) is None
    with pytest.raises(ConfigError, match="trained under the grammar"):
        unmasked = dataclasses.replace(settings, grammar=False)
        generate(model, tokenizer, Prompt(piece[:100]), unmasked, progress=False)
