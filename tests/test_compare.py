"""`musegen evaluate compare`: several models' evaluations side by side, read back from their files."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from train_fixtures import prepare_pop909

from musegen.checkpoint import save_checkpoint
from musegen.cli import main
from musegen.errors import DataError
from musegen.evaluation.compare import compare, compare_style_drops, read_style_rows, read_training
from musegen.evaluation.run_loss import evaluate_loss
from musegen.evaluation.run_style import evaluate_style
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.shards import Shards


@pytest.fixture(scope="module")
def pop(pop909_songs, tmp_path_factory):
    return prepare_pop909(pop909_songs[:6], tmp_path_factory.mktemp("pop"))


def _evaluated(pop, folder, seed, pe):
    tokenizer = Shards(pop).tokenizer
    torch.manual_seed(seed)
    model = MusicPerformer(preset("tiny", vocab_size=tokenizer.vocab_size, pe=pe, redraw="fixed")).eval()
    ckpt = save_checkpoint(folder / "ckpt", model, model.config, tokenizer, {"train_len": 24})
    return evaluate_loss(ckpt, pop, max_len=72, split="validation", out_dir=folder / "eval")


def test_loss_table_reproduces_each_evaluation(pop, tmp_path):
    expected = {"ape": _evaluated(pop, tmp_path / "a", 0, "ape"), "sine": _evaluated(pop, tmp_path / "b", 1, "sine")}
    report = compare({"ape": tmp_path / "a" / "eval", "sine": tmp_path / "b" / "eval"}, tmp_path / "cmp", train_len=24)
    for row in report["loss"]:
        for key in ("within", "extrapolation", "mean"):
            assert row[key] == pytest.approx(expected[row["model"]][key], abs=1e-5)
    assert report["loss"][0]["within"] != pytest.approx(report["loss"][1]["within"], abs=1e-4)
    table = (tmp_path / "cmp" / "nll.md").read_text().splitlines()
    assert table[0] == "| model | within (< 24) | extrapolation (24..71) | all |"
    assert [line.split(" | ")[0] for line in table[2:]] == ["| ape", "| sine"]
    assert (tmp_path / "cmp" / "nll.png").read_bytes()[:4] == b"\x89PNG"


def test_style_table_reproduces_each_evaluation(pop909_songs, tmp_path):
    expected = {}
    for name, songs in {"first": pop909_songs[:2], "second": pop909_songs[2:4]}.items():
        generated, reference = tmp_path / name / "gen", tmp_path / name / "ref"
        for i, song in enumerate(songs):
            (generated / f"s{i}").parent.mkdir(parents=True, exist_ok=True)
            reference.mkdir(parents=True, exist_ok=True)
            shutil.copy(song, generated / f"s{i}_000.mid")
            shutil.copy(pop909_songs[4 + i], reference / f"s{i}.mid")
        result = evaluate_style(generated, reference, tmp_path / name / "style.csv", baselines=name == "first")
        expected[name] = result["medians"]
        empty = result["empty"]["time-pitch"]
        # the first model's folder holds the ceiling and floor: they join the table
        expected |= {kind: part["medians"] for kind, part in result.get("baselines", {}).items()}
    assert set(expected) == {"first", "second", "ceiling", "floor"}
    report = compare({name: tmp_path / name for name in ("first", "second")}, tmp_path / "cmp")
    assert set(report) == {"style"}
    assert list(report["style"]) == ["first", "second", "ceiling", "floor"]
    for name, table in report["style"].items():
        for metric, values in table.items():
            assert values == pytest.approx(expected[name][metric], abs=1e-9)
    assert (tmp_path / "cmp" / "style.png").read_bytes()[:4] == b"\x89PNG"
    text = (tmp_path / "cmp" / "style.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| second | time-pitch |"))
    assert row.endswith(f"| {expected['second']['time-pitch'][-1]:.2f} ({100 * empty[-1]:.0f}%) |")


def test_bad_requests_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(DataError, match="nothing to compare"):
        compare({"x": tmp_path}, tmp_path / "out")
    for args in (["--run", "no-equals-sign"], ["--run", f"x={tmp_path / 'missing'}"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["evaluate", "compare", *args, "--out", str(tmp_path / "out")])
        assert exit_info.value.code != 0
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "Traceback" not in err and err


def test_run_folders_add_the_compute_each_run_used_and_their_validations(pop, tmp_path, capsys):
    sets = [
        "seq_len=32",
        "batch_size=2",
        "steps=4",
        "workers=0",
        "valid_every=2",
        "valid_len=64",
        "valid_pieces=2",
        "ckpt_every=4",
        "warmup=1",
        "log_every=2",
    ]
    for name, pe in (("ape", "ape"), ("sine", "sine")):
        run = tmp_path / name
        with pytest.raises(SystemExit) as exit_info:
            main(
                [
                    "train",
                    "--data",
                    str(pop),
                    "--out",
                    str(run),
                    "--preset",
                    "tiny",
                    "--set",
                    f"model.pe={pe}",
                    *[a for s in sets for a in ("--set", s)],
                ]
            )
        assert exit_info.value.code in (0, None), capsys.readouterr().err
        evaluate_loss(run / "checkpoints" / "step-00000004", pop, max_len=48, split="validation", out_dir=run / "eval")
    report = compare({"ape": tmp_path / "ape", "sine": tmp_path / "sine"}, tmp_path / "cmp", train_len=32)
    models = {
        name: MusicPerformer(preset("tiny", vocab_size=Shards(pop).tokenizer.vocab_size, pe=pe))
        for name, pe in (("ape", "ape"), ("sine", "sine"))
    }
    for row in report["training"]:
        assert row["steps"] == 4 and row["tokens"] == 4 * 2 * 32 and row["minutes"] > 0
        assert row["parameters"] == models[row["model"]].num_parameters()
    assert "| sine |" in (tmp_path / "cmp" / "training.md").read_text()
    validation = (tmp_path / "cmp" / "validation.md").read_text()
    for name in ("ape", "sine"):
        logged = [json.loads(line) for line in (tmp_path / name / "log.jsonl").read_text().splitlines()]
        logged = [r for r in logged if "valid_loss" in r]
        assert [r["step"] for r in logged] == [2, 4]
        for row, record in zip(report["validation"][name], logged):
            assert (row["within"], row["beyond"]) == (record["valid_loss"], record["valid_extrapolation"])
            gap = f"{record['valid_extrapolation'] - record['valid_loss']:.3f}"
            assert f"| {name} | {record['step']} | {record['valid_loss']:.3f} |" in validation and gap in validation
    assert (tmp_path / "cmp" / "validation.png").read_bytes()[:4] == b"\x89PNG"


def test_continuation_table_puts_each_model_beside_the_real_and_floor_quarters(pop, tmp_path, one_torch_thread):
    from musegen.evaluation.run_continuation import ContinuationSettings, evaluate_continuation
    from musegen.generation.settings import SampleSettings

    tokenizer = Shards(pop).tokenizer
    settings = ContinuationSettings(
        prompt_bars=1, sample=SampleSettings(bars=4, num_samples=1, seed=0), by_quarter=True
    )
    results = {}
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        model = MusicPerformer(preset("tiny", vocab_size=tokenizer.vocab_size))
        ckpt = save_checkpoint(tmp_path / name / "ckpt", model, model.config, tokenizer, {"train_len": 24})
        results[name] = evaluate_continuation(
            ckpt, pop, tmp_path / name / "continuation", settings, split="train", limit=2, device="cpu", progress=False
        )
    report = compare({"a": tmp_path / "a", "b": tmp_path / "b"}, tmp_path / "cmp")
    series = report["continuation"]
    assert list(series) == ["a", "b", "real", "floor"]
    for name in ("a", "b"):
        rows = {r["metric"]: r for r in results[name]["rows"]}
        for q in range(1, 5):  # the quarter means and medians are the whole table's rows of that quarter
            for statistic in ("mean", "median"):
                assert series[name][("notes per bar", statistic)][q - 1] == pytest.approx(
                    rows[f"notes per bar Q{q}"][f"model_{statistic}"], abs=5e-4
                )
                assert series["real"][("silent beats", statistic)][q - 1] == pytest.approx(
                    rows[f"silent beats Q{q}"][f"real_{statistic}"], abs=5e-4
                )
        starts = [
            json.loads(line)["model_positions"][0][0]
            for line in (tmp_path / name / "continuation" / "pieces.jsonl").read_text().splitlines()
        ]
        assert (
            f"| {name} | quarter start position | mean | {sum(starts) / len(starts):,.0f} |"
            in (tmp_path / "cmp" / "continuation.md").read_text()
        )
    assert (tmp_path / "cmp" / "continuation.png").read_bytes()[:4] == b"\x89PNG"


def test_a_resumed_runs_wall_time_leaves_out_the_pause_between_sessions():
    """Two sessions at 2 s a step, ten hours apart (a run resumed on another day): 8 steps take
    16 s, whatever the pause; the steps before each session's first record count at that rate."""

    def step(n, t):
        return {"step": n, "loss": 1.0, "tokens": 10 * n, "time": t}

    records = [
        {"step": 0, "event": "start", "parameters": 7},
        step(2, 104.0),
        step(4, 108.0),
        {"step": 4, "event": "resume"},
        step(6, 36_104.0),
        step(8, 36_108.0),
    ]
    training = read_training(records)
    assert training["minutes"] * 60 == pytest.approx(16.0)
    assert (training["steps"], training["tokens"], training["parameters"]) == (8, 80, 7)


def test_style_drops_pair_the_same_prompts_and_roles(pop909_songs, tmp_path):
    """Real style rows of two POP909 songs against two others; a copy whose first quarters score
    0.1 higher loses exactly 0.1 more per pair, and an identical copy loses the same."""
    generated, reference = tmp_path / "gen", tmp_path / "ref"
    generated.mkdir(), reference.mkdir()
    for i in range(2):
        shutil.copy(pop909_songs[i], generated / f"s{i}_000.mid")
        shutil.copy(pop909_songs[2 + i], reference / f"s{i}.mid")
    evaluate_style(generated, reference, tmp_path / "style.csv")
    rows = read_style_rows(tmp_path / "style.csv")
    higher_start = [dict(r, similarity=r["similarity"] + 0.1 * (r["segment"] == 1)) for r in rows]
    results = compare_style_drops({"a": rows, "b": higher_start, "c": rows}, tmp_path / "out")
    found = {(r["model"], r["metric"]): r for r in results}
    metrics = {r["metric"] for r in results}
    assert metrics and "vs_first" not in found["a", next(iter(metrics))]
    for metric in metrics:
        q1 = [r["similarity"] for r in rows if r["metric"] == metric and r["segment"] == 1]
        q4 = [r["similarity"] for r in rows if r["metric"] == metric and r["segment"] == 4]
        assert found["a", metric]["drop"] == pytest.approx(sum(q1) / len(q1) - sum(q4) / len(q4))
        assert found["b", metric]["drop"] == pytest.approx(found["a", metric]["drop"] + 0.1)
        b, c = found["b", metric], found["c", metric]
        assert (b["vs_first"], b["low"], b["high"]) == pytest.approx((-0.1, -0.1, -0.1))
        assert (c["vs_first"], c["low"], c["high"]) == (0.0, 0.0, 0.0)
        assert b["pairs"] == c["pairs"] == found["a", metric]["comparisons"] == len(q1)
    assert "| b | time-pitch |" in (tmp_path / "out" / "style_drop.md").read_text()
