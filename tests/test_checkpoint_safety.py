"""Checkpoint safety: nothing is ever unpickled, and every tampered, truncated or mismatched
checkpoint is refused by the CLI with one clear line (never a traceback or an internal error)."""

from __future__ import annotations

import json
import pickle
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from train_fixtures import prepare_pop909

from musegen.checkpoint import export_checkpoint, load_checkpoint, save_checkpoint
from musegen.cli import main
from musegen.errors import CheckpointError, FormatError
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.tokenizers import tokenizer_from_dict
from musegen.training.run_folder import latest_checkpoint
from musegen.training.settings import build_config
from musegen.training.trainer import train

REPO = Path(__file__).resolve().parents[1]
PICKLE_NAMES = ("model.pt", "trainer_state.pt", "optimizer.pt", "pytorch_model.bin", "rng_state.pkl")
TINY_RUN = ["seq_len=32", "batch_size=2", "workers=0", "valid_every=0", "log_every=1", "steps=2", "ckpt_every=1"]


class Planted:
    """Unpickling this object creates `marker`: proof that something unpickled the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def plant(folder: Path, marker: Path) -> list[Path]:
    """Malicious pickles under the names other tools load from checkpoint folders."""
    planted = []
    for name in PICKLE_NAMES:
        path = folder / name
        if name.endswith(".pt"):
            torch.save({"state": Planted(marker)}, path)  # torch's zip format, with a pickle inside
        else:
            path.write_bytes(pickle.dumps(Planted(marker)))
        planted.append(path)
    return planted


def assert_really_malicious(path: Path, marker: Path) -> None:
    """Control: unpickling a planted file does create the marker (then it is removed)."""
    loader = "torch.load(p, weights_only=False)" if path.suffix == ".pt" else "pickle.load(open(p, 'rb'))"
    code = f"import pickle, torch; p = {str(path)!r}; {loader}"
    subprocess.run([sys.executable, "-c", code], check=False, capture_output=True)
    assert marker.exists(), f"the planted {path.name} is not malicious: the test would prove nothing"
    marker.unlink()


@pytest.fixture
def no_unpickling(monkeypatch):
    """Any unpickling in this process fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("something tried to unpickle")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    tok = tokenizer_from_dict({"kind": "remi"})
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", vocab_size=tok.vocab_size)).eval()
    return save_checkpoint(tmp_path_factory.mktemp("ckpt"), model, model.config, tok)


@pytest.fixture(scope="module")
def run(pop909_songs, tmp_path_factory) -> tuple[Path, Path]:
    """A 2-step tiny training run (data folder, run folder) with checkpoints at steps 0, 1, 2."""
    data = prepare_pop909(pop909_songs[:3], tmp_path_factory.mktemp("data"))
    out = tmp_path_factory.mktemp("run") / "run"
    train(build_config("tiny", data, out, sets=TINY_RUN))
    return data, out


def cli(args, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    return exit_.value.code or 0, capsys.readouterr().err.strip().splitlines()


def copy(folder: Path, dest: Path) -> Path:
    dest.mkdir()
    for path in folder.iterdir():
        (dest / path.name).write_bytes(path.read_bytes())
    return dest


# ---- never unpickle --------------------------------------------------------------------------


def test_no_unpickling_call_in_the_package():
    """Grep-level: no pickle, torch.load or pickled numpy anywhere in musegen/ (checkpoints, shards,
    training state, sampling). data_prep/pop1k7.py unpickles the Pop1K7 download with a
    plain-values-only unpickler; it never reads checkpoint folders."""
    pattern = re.compile(
        r"\bimport pickle\b|\bpickle\.|torch\.load\(|weights_only\s*=\s*False|allow_pickle\s*=\s*True"
        r"|\bjoblib\b|\bdill\b"
    )
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for path in (REPO / "musegen").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, offenders
    loads = [
        f"{path.relative_to(REPO)}:{n}"
        for path in (REPO / "musegen").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "np.load(" in line and "allow_pickle=False" not in line
    ]
    assert not loads, loads


def test_planted_pickles_are_never_executed_by_sample_or_resume(run, checkpoint, tmp_path, capsys, no_unpickling):
    data, out = run
    marker = tmp_path / "PWNED"
    folders = [checkpoint, latest_checkpoint(out)]
    planted = [p for folder in folders for p in plant(folder, marker)]
    for path in planted[: len(PICKLE_NAMES)]:
        assert_really_malicious(path, marker)  # in a subprocess, where pickle works
    code, err = cli(
        [
            "train",
            "--data",
            data,
            "--out",
            out,
            "--preset",
            "tiny",
            *[x for s in TINY_RUN if not s.startswith("steps") for x in ("--set", s)],
            "--set",
            "steps=3",
            "--resume",
        ],
        capsys,
    )
    assert code == 0, err
    assert latest_checkpoint(out).name == "step-00000003" and not marker.exists()
    code, err = cli(["sample", "-c", checkpoint, "--length", 8, "--seed", 0, "--out", tmp_path / "s"], capsys)
    assert code == 0, err
    assert not marker.exists()


def test_a_pickle_in_place_of_the_weights_is_refused_unexecuted(checkpoint, tmp_path, capsys, no_unpickling):
    marker = tmp_path / "PWNED"
    for i, write in enumerate(
        (lambda p: p.write_bytes(pickle.dumps(Planted(marker))), lambda p: torch.save({"w": Planted(marker)}, p))
    ):
        folder = copy(checkpoint, tmp_path / f"c{i}")
        write(folder / "model.safetensors")  # (writing a pickle is allowed; reading one is not)
        code, err = cli(["sample", "-c", folder, "--length", 4, "--out", tmp_path / "s"], capsys)
        assert code == 1 and len(err) == 1 and "unreadable weights" in err[0], err
    assert not marker.exists()


# ---- tampered, truncated, mismatched -----------------------------------------------------------


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _edit_weights(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _flip_header_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8 + 2] ^= 0xFF  # inside the JSON header of the safetensors file
    path.write_bytes(bytes(data))


def _smaller_model(path: Path) -> None:
    other = MusicPerformer(preset("tiny", vocab_size=333, d_model=32))
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(path))


def _set(key, value):
    def edit(data):
        data[key] = value

    return edit


TAMPERING = {
    # name: (file, how, words the one-line message must hold)
    "truncated weights": (
        "model.safetensors",
        lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
        "unreadable weights",
    ),
    "empty weights": ("model.safetensors", lambda p: p.write_bytes(b""), "unreadable weights"),
    "flipped header byte": ("model.safetensors", _flip_header_byte, "unreadable weights"),
    "huge header length": (
        "model.safetensors",
        lambda p: p.write_bytes(struct.pack("<Q", 2**62) + p.read_bytes()[8:]),
        "unreadable weights",
    ),
    "wrong shapes": ("model.safetensors", _smaller_model, "has shape"),
    "NaN weights": (
        "model.safetensors",
        lambda p: _edit_weights(p, lambda t: t["head.weight"].fill_(float("nan"))),
        "non-finite",
    ),
    "missing tensor": ("model.safetensors", lambda p: _edit_weights(p, lambda t: t.pop("head.bias")), "do not match"),
    "extra tensor": (
        "model.safetensors",
        lambda p: _edit_weights(p, lambda t: t.update(extra=torch.zeros(2))),
        "do not match",
    ),
    "missing weights": ("model.safetensors", Path.unlink, "missing model.safetensors"),
    "missing tokenizer": ("tokenizer.json", Path.unlink, "tokenizer file not found"),
    "edited vocabulary": (
        "tokenizer.json",
        lambda p: _edit_json(p, lambda d: d["vocab"].reverse()),
        "vocabulary does not match",
    ),
    "other tokenizer, bigger vocabulary": (
        "tokenizer.json",
        lambda p: _edit_json(p, lambda d: d.update(tokenizer_from_dict({"kind": "groove"}).to_dict())),
        "but the model",
    ),
    "unknown tokenizer kind": (
        "tokenizer.json",
        lambda p: _edit_json(p, _set("kind", "abc")),
        "unknown tokenizer kind 'abc'",
    ),
    "tokenizer not JSON": ("tokenizer.json", lambda p: p.write_bytes(b"\x80\x04K\x01."), "not valid JSON"),
    "missing config": ("config.json", Path.unlink, "missing config.json"),
    "truncated config": ("config.json", lambda p: p.write_text(p.read_text()[:40]), "not valid JSON"),
    "config not an object": (
        "config.json",
        lambda p: p.write_text("[1, 2]"),
        "invalid checkpoint config: (the whole file)",
    ),
    "other format version": ("config.json", lambda p: _edit_json(p, _set("version", 99)), "version: input should be 1"),
    "unknown setting": ("config.json", lambda p: _edit_json(p, lambda d: d["model"].update(foo=1)), "foo: unexpected"),
    "wrong type": (
        "config.json",
        lambda p: _edit_json(p, lambda d: d["model"].update(n_layers="two")),
        "n_layers: input should be a valid integer",
    ),
    "model not an object": (
        "config.json",
        lambda p: _edit_json(p, _set("model", [1, 2])),
        "model: input should be a valid dict",
    ),
    "vocabulary size mismatch": (
        "config.json",
        lambda p: _edit_json(p, lambda d: d["model"].update(vocab_size=300)),
        "but the model",
    ),
}


# exit 2: the file breaks its declared schema (CHECKPOINT_CONFIG, TOKENIZER_FILE); the others exit 1
AGAINST_SCHEMA = {
    "unknown tokenizer kind",
    "tokenizer not JSON",
    "truncated config",
    "config not an object",
    "other format version",
    "unknown setting",
    "wrong type",
    "model not an object",
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_tampered_checkpoint_is_refused_in_one_line(case, checkpoint, tmp_path, capsys):
    name, tamper, expected = TAMPERING[case]
    folder = copy(checkpoint, tmp_path / "ckpt")
    tamper(folder / name)
    code, err = cli(["sample", "-c", folder, "--length", 4, "--seed", 0, "--out", tmp_path / "out"], capsys)
    assert code == (2 if case in AGAINST_SCHEMA else 1) and len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_file_or_nothing_in_place_of_the_folder(checkpoint, tmp_path, capsys):
    for target in (checkpoint / "config.json", tmp_path / "nowhere"):
        code, err = cli(["sample", "-c", target, "--length", 4, "--out", tmp_path / "out"], capsys)
        assert code == 1 and len(err) == 1 and "checkpoint folder not found" in err[0], err


@pytest.mark.parametrize("case", ["truncated optimiser state", "state JSON not JSON", "state JSON without step"])
def test_tampered_training_state_is_refused_on_resume(case, run, tmp_path, capsys):
    data, out = run
    run_copy = tmp_path / "run"
    (run_copy / "checkpoints").mkdir(parents=True)
    folder = copy(latest_checkpoint(out), run_copy / "checkpoints" / latest_checkpoint(out).name)
    state, tensors = folder / "trainer_state.json", folder / "trainer_state.safetensors"
    {
        "truncated optimiser state": lambda: tensors.write_bytes(tensors.read_bytes()[:100]),
        "state JSON not JSON": lambda: state.write_text("{"),
        "state JSON without step": lambda: _edit_json(state, lambda d: d.pop("step")),
    }[case]()
    code, err = cli(
        [
            "train",
            "--data",
            data,
            "--out",
            run_copy,
            "--preset",
            "tiny",
            *[x for s in TINY_RUN for x in ("--set", s)],
            "--resume",
        ],
        capsys,
    )
    assert (
        code == (1 if "optimiser" in case else 2)
        and len(err) == 1
        and ("trainer_state" in err[0] or "training state" in err[0])
    ), err
    load_checkpoint(folder)  # the model files themselves are still fine for sampling


# ---- nothing allocated on the files' word alone ---------------------------------------------------


def test_shapes_are_compared_before_the_real_model_is_built(checkpoint, tmp_path, monkeypatch):
    """A mismatched weight file is refused having built the model only on the meta device (which
    allocates nothing), and an oversized config before building it at all."""
    import musegen.model.transformer as model_module

    folder = copy(checkpoint, tmp_path / "c")
    _smaller_model(folder / "model.safetensors")
    built_on = []
    real_init = MusicPerformer.__init__

    def spy(self, config):
        built_on.append(torch.get_default_device().type)
        real_init(self, config)

    monkeypatch.setattr(model_module.MusicPerformer, "__init__", spy)
    with pytest.raises(CheckpointError, match="has shape"):
        load_checkpoint(folder)
    assert built_on == ["meta"]
    _edit_json(folder / "config.json", lambda d: d["model"].update(n_layers=10**30))
    built_on.clear()
    with pytest.raises(FormatError, match=r"n_layers: input should be less than or equal to 256"):
        load_checkpoint(folder)
    assert built_on == []
    load_checkpoint(checkpoint)
    assert built_on == ["meta", "cpu"]


def test_export_to_fp16_refuses_what_fp16_cannot_hold(checkpoint, tmp_path):
    folder = copy(checkpoint, tmp_path / "c")
    _edit_weights(folder / "model.safetensors", lambda t: t["head.bias"].__setitem__(3, -70000.0))
    with pytest.raises(CheckpointError, match=r"head.bias holds values up to 70000, beyond the range of torch.float16"):
        export_checkpoint(folder, tmp_path / "fp16", torch.float16)
    assert not (tmp_path / "fp16").exists()
    export_checkpoint(folder, tmp_path / "bf16", torch.bfloat16)  # bf16 has fp32's range
    assert load_file(str(tmp_path / "bf16" / "model.safetensors"))["head.bias"][3].item() == -70144.0  # (rounded)
