"""`musegen export`: a smaller, self-contained copy of a checkpoint that loads back the same model."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from musegen.checkpoint import SCALE_SUFFIX, export_checkpoint, load_checkpoint, read_checkpoint_config, save_checkpoint
from musegen.errors import CheckpointError
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.tokenizers.remi import RemiTokenizer


def test_export_halves_the_weights_and_keeps_the_model(tmp_path):
    tok = RemiTokenizer()
    config = preset("tiny", vocab_size=tok.vocab_size)
    torch.manual_seed(0)
    model = MusicPerformer(config).eval()
    save_checkpoint(tmp_path / "run", model, config, tok, {"step": 7})
    (tmp_path / "run" / "trainer_state.json").write_text("{}")  # what a training checkpoint also holds

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "musegen",
            "export",
            str(tmp_path / "run"),
            "--out",
            str(tmp_path / "shipped"),
            "--dtype",
            "fp16",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    shipped = tmp_path / "shipped"
    assert sorted(p.name for p in shipped.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    full, half = (tmp_path / "run" / "model.safetensors").stat().st_size, (shipped / "model.safetensors").stat().st_size
    assert half < 0.55 * full

    loaded, tok2, config2, meta = load_checkpoint(shipped)
    assert config2 == config and tok2.to_dict() == tok.to_dict()
    assert meta["step"] == 7 and meta["dtype"] == "fp16"
    assert meta["exported_from"] == "run"  # the source by name, not by this machine's path
    ids = torch.randint(0, tok.vocab_size, (1, 32))
    a = loaded.session(1, seed=0).step(ids)
    b = model.session(1, seed=0).step(ids)
    assert torch.allclose(a, b, atol=5e-2) and not torch.equal(a, b)  # fp16 rounding, same model

    # exported again (fp16 to int8), it still names the training run it came from
    again = subprocess.run(
        [sys.executable, "-m", "musegen", "export", str(shipped), "--out", str(tmp_path / "int8"), "--dtype", "int8"],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr
    meta = read_checkpoint_config(tmp_path / "int8")[1]
    assert meta["exported_from"] == "run" and meta["dtype"] == "int8" and meta["step"] == 7


def test_int8_export_moves_no_weight_past_half_a_step_of_its_row(tmp_path):
    tok = RemiTokenizer()
    config = preset("tiny", vocab_size=tok.vocab_size)
    torch.manual_seed(0)
    model = MusicPerformer(config).eval()
    save_checkpoint(tmp_path / "run", model, config, tok)
    export_checkpoint(tmp_path / "run", tmp_path / "int8", torch.int8, {"dtype": "int8"})
    stored = load_file(str(tmp_path / "int8" / "model.safetensors"))
    matrices = [k for k, v in model.state_dict().items() if v.dim() == 2]
    assert matrices and all(stored[k].dtype == torch.int8 for k in matrices)
    assert all(v.dtype in (torch.int8, torch.float16, torch.float32) for v in stored.values())

    loaded, *_ = load_checkpoint(tmp_path / "int8")
    original, restored = model.state_dict(), loaded.state_dict()
    for name in matrices:
        half_step = original[name].abs().amax(dim=1, keepdim=True) / 254
        assert ((restored[name] - original[name]).abs() <= half_step * 1.001 + 1e-7).all(), name
    ids = torch.randint(0, tok.vocab_size, (1, 32))
    a, b = loaded.session(1, seed=0).step(ids), model.session(1, seed=0).step(ids)
    assert (a - b).abs().max() < 0.1 * b.std() and not torch.equal(a, b)


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda t, k: t.update({k + SCALE_SUFFIX: -t[k + SCALE_SUFFIX]}), "by positive numbers"),
        (lambda t, k: t.update({k + SCALE_SUFFIX: t[k + SCALE_SUFFIX][:-1]}), "does not scale the rows"),
        (lambda t, k: t.pop(k + SCALE_SUFFIX), "without"),
        (lambda t, k: t.update({"nothing" + SCALE_SUFFIX: torch.ones(3)}), "does not scale the rows"),
    ],
)
def test_a_tampered_int8_file_is_refused_in_one_line(tmp_path, tamper, message):
    tok = RemiTokenizer()
    config = preset("tiny", vocab_size=tok.vocab_size)
    save_checkpoint(tmp_path / "m", MusicPerformer(config), config, tok, dtype=torch.int8)
    path = tmp_path / "m" / "model.safetensors"
    tensors = load_file(str(path))
    tamper(tensors, next(k for k, v in tensors.items() if v.dtype == torch.int8))
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=message) as caught:
        load_checkpoint(tmp_path / "m")
    assert "\n" not in str(caught.value)


def test_export_rejects_bad_dtype_and_missing_checkpoint(tmp_path):
    cases = [(["--dtype", "int4"], "--dtype must be one of", 2), ([], "checkpoint folder not found", 1)]
    for args, message, code in cases:
        result = subprocess.run(
            [sys.executable, "-m", "musegen", "export", str(tmp_path / "none"), "--out", str(tmp_path / "o"), *args],
            capture_output=True,
            text=True,
        )
        assert result.returncode == code and message in result.stderr and "Traceback" not in result.stderr


def test_shipped_models_name_their_data_and_source_runs_without_machine_paths():
    shipped = sorted(p.parent for p in (Path(__file__).resolve().parents[1] / "checkpoints").glob("*/config.json"))
    assert [p.name for p in shipped] == ["groove", "groove-dur", "groove-dur-softmax", "pop", "song"]
    for folder in shipped:
        _, meta = read_checkpoint_config(folder)
        songs = "pop909-song+mma-song+music21-song"  # corpora of `data prepare`, merged
        assert meta["data"] in ("mma-groove", "mma-groove-dur", "pop909", songs), meta
        for key in ("init", "exported_from"):
            if key not in meta:
                continue
            parts = meta[key].split("/")  # `<run>/checkpoints/step-NNNNNNNN`, or a checkpoint folder's name
            if len(parts) == 1:
                assert key == "init" and parts[0], meta
            else:
                run, checkpoints, step = parts
                assert run and checkpoints == "checkpoints" and step.startswith("step-"), meta
