"""The command line under hostile options: names that would become paths outside the output folder,
seeds at the edge of their bound, and options out of range, each answered as `--help` says (one
line, exit 2 for an option out of its bounds) with nothing written where it should not be."""

from __future__ import annotations

import json

import pytest
from tiny_models import tiny_checkpoint

from musegen.cli import app, main
from musegen.generation.settings import SEED_MAX, nth_seed

EXAMPLE = "checkpoints/prompts/pop_progression.mid"
POP = ["sample", "-c", "checkpoints/pop", "--prompt", EXAMPLE]


def run_cli(args: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    return exit_info.value.code, capsys.readouterr().err.strip().splitlines()


def files_under(folder) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def groove_checkpoint(tmp_path_factory):
    return tiny_checkpoint("groove", tmp_path_factory.mktemp("tiny") / "groove")


def copy_args(out, *extra) -> list:
    return ["evaluate", "copy", "--out", out, "--device", "cpu", "--bars", "1", "--samples", "1", *extra]


def test_a_model_name_that_would_leave_the_output_folder_is_refused_before_anything_is_written(
    groove_checkpoint, tmp_path, capsys
):
    out = tmp_path / "a" / "b" / "c" / "d" / "out"
    for name in ("../../../../x/ESCAPED", "/tmp/ESCAPED", "..", ".hidden", "a/b"):
        before = files_under(tmp_path)
        code, err = run_cli(copy_args(out, "-c", f"{name}={groove_checkpoint}", "--recall-pieces", "0"), capsys)
        assert code == 2 and len(err) == 1 and "model name" in err[0], (name, err)
        assert files_under(tmp_path) == before, name


def test_the_largest_seed_is_accepted_and_the_patterns_after_it_wrap_around(
    groove_checkpoint, tmp_path, capsys, one_torch_thread
):
    assert nth_seed(SEED_MAX, 0) == SEED_MAX and nth_seed(SEED_MAX, 1) == 0 and nth_seed(5, 2) == 7
    out = tmp_path / "out"
    code, err = run_cli(copy_args(out, "-c", groove_checkpoint, "--seed", SEED_MAX, "--recall-pieces", "0"), capsys)
    assert code == 0, err
    result = json.loads((out / "copy.json").read_text())
    assert result["settings"]["sample"]["seed"] == SEED_MAX and len(result["patterns"]) >= 2
    code, err = run_cli(copy_args(tmp_path / "more", "-c", groove_checkpoint, "--seed", SEED_MAX + 1), capsys)
    assert code == 2 and len(err) == 1 and "--seed must be within" in err[0], err
    assert not (tmp_path / "more").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        ([*POP, "--bars", "1", "--temperature", "1000"], "--temperature"),
        ([*POP, "--bars", "1", "--top-p", "0"], "--top-p"),
        ([*POP, "--bars", "1", "--seed", "-1"], "--seed"),
        ([*POP, "--bars", "0"], "--bars"),
        (["export", "checkpoints/pop", "--dtype", "int4"], "--dtype"),
    ],
)
def test_an_option_out_of_its_bounds_exits_2_as_help_says(args, message, tmp_path, capsys):
    assert "2 an option or setting out of its bounds" in app.info.help
    code, err = run_cli([*args, "--out", tmp_path / "out"], capsys)
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()
