"""A sampling option is declared once (SampleSettings in musegen/generation/settings.py) and its
default, if it is the model's, lives with the model: the command line, the bounds check and the
record all follow from that declaration. Shown by adding an option here, in the test, exactly
as a developer would: one field, and one default on a tokenizer."""

from __future__ import annotations

from dataclasses import make_dataclass

import pytest
import typer
from tiny_models import tiny_checkpoint
from typer.testing import CliRunner

from musegen.checkpoint import load_checkpoint
from musegen.cli import app
from musegen.cli.options import help_text, sampling_options
from musegen.errors import CheckpointError, ConfigError
from musegen.generation.settings import SampleSettings, option, options, within
from musegen.tokenizers.remi import RemiTokenizer

# the whole of a new option: its declaration...
Swung = make_dataclass(
    "Swung",
    [
        (
            "swing",
            "float | None",
            option(None, "--swing", help="Delay of every second 8th.", bound=within(0, 1), per_model=True, fallback=0),
        )
    ],
    bases=(SampleSettings,),
)


def swinging_tokenizer() -> RemiTokenizer:
    tokenizer = RemiTokenizer()
    tokenizer.sampling_defaults = {**tokenizer.sampling_defaults, "swing": 0.25}  # ...and its model default
    return tokenizer


def test_a_new_option_takes_its_default_from_the_model_and_is_checked_and_recorded():
    resolved = Swung(bars=1, seed=0).resolved(swinging_tokenizer())
    assert resolved.swing == 0.25 and resolved.record()["swing"] == 0.25
    assert Swung(bars=1, seed=0).resolved(RemiTokenizer()).swing == 0.0  # a model that names none
    assert Swung(bars=1, seed=0, swing=1).resolved(swinging_tokenizer()).swing == 1.0  # given: kept, as a float
    with pytest.raises(ConfigError, match=r"^--swing must be within 0\.\.1, got 2\.0$"):
        Swung(bars=1, swing=2).resolved()
    tokenizer = swinging_tokenizer()
    tokenizer.sampling_defaults = {**tokenizer.sampling_defaults, "swing": 7}
    with pytest.raises(CheckpointError, match="the model's default --swing must be within 0..1, got 7"):
        Swung(bars=1).resolved(tokenizer)


def test_a_new_option_is_a_flag_of_a_command_with_its_help_and_its_bound():
    seen = {}
    command_app = typer.Typer()

    @command_app.command()
    @sampling_options(exclude=("precision",), cls=Swung)
    def play(name: str = typer.Option("x"), settings: Swung = None):
        seen["settings"], seen["name"] = settings, name

    runner = CliRunner()
    shown = runner.invoke(command_app, ["--help"], env={"COLUMNS": "300"}).output
    assert "--swing" in shown and "Delay of every second 8th. Within 0..1. Default: the model's" in shown
    assert "--precision" not in shown and "--temperature-by" in shown
    done = runner.invoke(command_app, ["--swing", "0.5", "--bars", "2", "--name", "y"])
    assert done.exit_code == 0, done.output
    assert seen["name"] == "y" and seen["settings"].swing == 0.5 and seen["settings"].bars == 2
    assert isinstance(seen["settings"], Swung) and seen["settings"].precision == "auto"


def test_every_declared_option_is_a_flag_of_sample():
    shown = CliRunner().invoke(app, ["sample", "--help"], env={"COLUMNS": "300"}).output
    for name, how in options().items():
        for flag in how.flags:
            for part in flag.split("/"):
                assert part in shown, (name, part)


def test_the_help_names_the_shipped_models_own_defaults(tmp_path, monkeypatch):
    """`--cache` defaults to 0 by representation, but the shipped song model names 0.95: the help
    says so, as each shipped config has it, and a config it cannot read leaves the help whole."""
    song = load_checkpoint("song")[1]
    shown = help_text("cache", options()["cache"])
    assert f"song {SampleSettings(bars=1).resolved(song).cache:g}" in shown and "the shipped" in shown
    tiny_checkpoint("groove-dur", tmp_path / "checkpoints" / "tuned", {"sampling": {"cache": 0.5}})
    (tmp_path / "checkpoints" / "broken").mkdir()
    (tmp_path / "checkpoints" / "broken" / "config.json").write_text("{not json")
    monkeypatch.setenv("MUSEGEN_HOME", str(tmp_path))
    shown = help_text("cache", options()["cache"])
    assert shown.endswith("a checkpoint may name its own: the shipped tuned 0.5).")
    assert "the shipped" not in help_text("top_p", options()["top_p"])


def test_a_checkpoint_names_its_own_defaults_over_its_tokenizers(tmp_path):
    folder = tiny_checkpoint("groove-dur", tmp_path / "ckpt", {"sampling": {"cache": 0.5, "temperature": 0.9}})
    tokenizer = load_checkpoint(folder)[1]
    resolved = SampleSettings(bars=1).resolved(tokenizer)
    assert (resolved.cache, resolved.temperature, resolved.top_p) == (0.5, 0.9, 1.0)
    plain = load_checkpoint(tiny_checkpoint("groove-dur", tmp_path / "plain"))[1]
    assert SampleSettings(bars=1).resolved(plain).cache == 0.0
    bad = tiny_checkpoint("groove-dur", tmp_path / "bad", {"sampling": {"cache": [1]}})
    with pytest.raises(CheckpointError, match="meta.sampling must map option names"):
        load_checkpoint(bad)
