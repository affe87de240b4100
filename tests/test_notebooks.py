"""The three notebooks run top to bottom on inputs made here with the real library (CI keeps them alive)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient
from train_fixtures import prepare_pop909

from musegen.checkpoint import save_checkpoint
from musegen.evaluation.run_loss import evaluate_loss
from musegen.evaluation.run_style import evaluate_style
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.shards import Shards

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
TRAIN_LEN = 32


def run_notebook(name: str, env: dict[str, str], monkeypatch) -> nbformat.NotebookNode:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel shares two busy cores
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()  # raises on any failing cell
    return notebook


def images(notebook) -> int:
    return sum(
        "image/png" in output.get("data", {})
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )


@pytest.fixture(scope="module")
def pop(pop909_songs, tmp_path_factory):
    return prepare_pop909(pop909_songs[:10], tmp_path_factory.mktemp("pop"))


def tiny_checkpoint(folder: Path, tokenizer, pe: str) -> Path:
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", vocab_size=tokenizer.vocab_size, pe=pe, dropout=0.0))
    return save_checkpoint(folder, model, model.config, tokenizer, {"train_len": TRAIN_LEN})


def test_attention_notebook(pop, tmp_path, monkeypatch):
    checkpoint = tiny_checkpoint(tmp_path / "sine", Shards(pop).tokenizer, "sine")
    notebook = run_notebook(
        "attention.ipynb",
        {"MUSEGEN_CHECKPOINT": str(checkpoint), "MUSEGEN_DATA": str(pop), "MUSEGEN_OUT": str(tmp_path / "out")},
        monkeypatch,
    )
    assert images(notebook) == 5  # templates, gates, maps, probes, sparsity
    assert (tmp_path / "out" / "summary.csv").is_file()


def test_extrapolation_notebook(pop, tmp_path, monkeypatch):
    tokenizer = Shards(pop).tokenizer
    entries = []
    for pe in ("ape", "sine"):
        checkpoint = tiny_checkpoint(tmp_path / pe, tokenizer, pe)
        result = evaluate_loss(checkpoint, pop, 2 * TRAIN_LEN, out_dir=tmp_path / pe / "eval", device="cpu")
        entries.append(f"{pe}={result['files']['csv']}")
    notebook = run_notebook(
        "extrapolation.ipynb",
        {
            "MUSEGEN_NLL_CSVS": os.pathsep.join(entries),
            "MUSEGEN_TRAIN_LEN": str(TRAIN_LEN),
            "MUSEGEN_SMOOTH": "4",
            "MUSEGEN_OUT": str(tmp_path / "out"),
        },
        monkeypatch,
    )
    assert images(notebook) == 1
    printed = "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
    assert "ape" in printed and "sine" in printed


def test_groove_style_notebook(pop909_songs, tmp_path, monkeypatch):
    entries = []
    for label, (reference, generated) in {"first": (0, [1, 2]), "second": (3, [4, 5])}.items():
        ref_dir, gen_dir = tmp_path / label / "ref", tmp_path / label / "gen"
        ref_dir.mkdir(parents=True)
        gen_dir.mkdir()
        shutil.copy(pop909_songs[reference], ref_dir)
        for i in generated:
            shutil.copy(pop909_songs[i], gen_dir)
        evaluate_style(gen_dir, ref_dir, tmp_path / label / "style.csv")
        entries.append(f"{label}={tmp_path / label / 'style.csv'}")
    notebook = run_notebook(
        "groove_style.ipynb",
        {"MUSEGEN_STYLE_CSVS": os.pathsep.join(entries), "MUSEGEN_OUT": str(tmp_path / "out")},
        monkeypatch,
    )
    assert images(notebook) == 1 and (tmp_path / "out" / "groove_style.png").is_file()
    printed = "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
    assert "first" in printed and "time-pitch" in printed
