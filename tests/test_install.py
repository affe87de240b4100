"""musegen works outside its clone: the shipped models and example prompts are found wherever it is
installed (musegen/home.py), a bare name (`--checkpoint pop`, `--prompt pop_progression`) names one
of them, and `pip install .` into a fresh virtual environment carries them (about 40 s, so CI proves it
on every run)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from test_cli_hostile import run_cli

from musegen import home
from musegen.checkpoint import export_checkpoint, read_checkpoint_config

REPO = Path(__file__).resolve().parents[1]
MODEL_FILES = ("config.json", "tokenizer.json", "model.safetensors", "README.md")


@pytest.fixture
def no_home(monkeypatch):
    monkeypatch.delenv(home.ENV, raising=False)


def fake_home(root: Path) -> Path:
    """A MUSEGEN_HOME with one model folder (its config is all the lookup reads) and one example."""
    (root / "checkpoints" / "mine").mkdir(parents=True)
    (root / "checkpoints" / "mine" / "config.json").write_text("{}")
    (root / "checkpoints" / "prompts").mkdir()
    (root / "checkpoints" / "prompts" / "tune.mid").write_bytes(b"")
    return root / "checkpoints"


def test_musegen_home_when_set_is_the_only_place_looked_at(tmp_path, monkeypatch):
    shipped = fake_home(tmp_path)
    monkeypatch.setenv(home.ENV, str(tmp_path))
    assert home.places() == [shipped]
    assert home.models() == {"mine": shipped / "mine"}
    assert home.examples() == {"tune.mid": shipped / "prompts" / "tune.mid"}
    assert home.checkpoint("mine") == shipped / "mine"
    assert home.prompt("tune") == home.prompt("tune.mid") == shipped / "prompts" / "tune.mid"


def test_in_a_clone_its_own_models_come_before_the_installed_ones(no_home):
    places = home.places()
    assert places[0] == REPO / "checkpoints"
    assert Path(sysconfig.get_path("data")) / "share" / "musegen" / "checkpoints" in places[1:]
    assert {"pop", "groove"} <= set(home.models()) and "pop_progression.mid" in home.examples()
    assert home.checkpoint("pop") == REPO / "checkpoints" / "pop"


def test_a_path_that_exists_or_is_not_a_bare_name_is_taken_as_given(tmp_path, monkeypatch, no_home):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pop").mkdir()
    assert home.checkpoint("pop") == Path("pop")  # a folder here wins over the shipped model
    assert home.checkpoint("runs/pop") == Path("runs/pop")  # and a missing path keeps its own error
    assert home.prompt("songs/pop_progression") == Path("songs/pop_progression")


def test_a_shipped_model_s_name_is_taken_wherever_a_checkpoint_is(tmp_path, monkeypatch, no_home):
    monkeypatch.chdir(tmp_path)
    config, _ = read_checkpoint_config("pop")
    assert config == read_checkpoint_config(REPO / "checkpoints" / "pop")[0]
    export_checkpoint("pop", tmp_path / "exported")  # loads it by name too
    assert read_checkpoint_config(tmp_path / "exported")[0] == config


def test_nothing_found_is_one_line_saying_where_it_looked_and_how_to_set_musegen_home(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(home.ENV, str(tmp_path / "nowhere"))
    code, err = run_cli(["sample", "-c", "pop", "--bars", "1", "--out", tmp_path / "out"], capsys)
    assert code == 1 and len(err) == 1, err
    assert str(tmp_path / "nowhere" / "checkpoints") in err[0] and "set MUSEGEN_HOME" in err[0]
    code, err = run_cli(["studio", "--port", "0"], capsys)
    assert len(err) == 1 and "set MUSEGEN_HOME" in err[0] and "--checkpoint" in err[0], err
    assert not (tmp_path / "out").exists()


def test_an_unknown_name_lists_the_shipped_models_and_examples(tmp_path, capsys, no_home):
    code, err = run_cli(["sample", "-c", "popp", "--bars", "1", "--out", tmp_path], capsys)
    assert code == 1 and len(err) == 1 and "shipped: " in err[0] and "pop" in err[0], err
    code, err = run_cli(["sample", "-c", "pop", "--prompt", "nope", "--bars", "1", "--out", tmp_path], capsys)
    assert code == 1 and len(err) == 1 and "pop_progression.mid" in err[0], err


def test_pyproject_installs_every_shipped_model_and_example(no_home):
    tomllib = pytest.importorskip("tomllib")
    data_files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    installed = {
        f"{dest}/{Path(found).name}"
        for dest, patterns in data_files.items()
        for pattern in patterns
        for found in glob.glob(str(REPO / pattern))
    }
    wanted = {f"share/musegen/checkpoints/{name}/{f}" for name in home.models() for f in MODEL_FILES}
    wanted |= {f"share/musegen/checkpoints/prompts/{name}" for name in home.examples()}
    assert wanted <= installed, sorted(wanted - installed)


def test_pip_install_into_a_fresh_venv_samples_and_serves_from_another_folder(tmp_path):
    """`pip install .` (no -e) of a copy of this working tree, then the installed `musegen`, run from
    a folder outside the clone, continues a shipped example with `--checkpoint pop`."""
    source, venv, elsewhere = tmp_path / "source", tmp_path / "venv", tmp_path / "elsewhere"
    # a copy, so that the build's build/ and *.egg-info stay out of the clone
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((REPO / name).read_bytes())
    # The system's torch, other dependencies, pip and setuptools (the venv's own would be ensurepip's
    # setuptools 65, older than pyproject.toml asks for; without build isolation nothing is downloaded):
    # only musegen itself is installed into the venv.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], check=True)
    python, musegen = venv / "bin" / "python", venv / "bin" / "musegen"
    started = time.monotonic()
    pip = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", source]
    done = subprocess.run(pip, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    print(f"pip install: {time.monotonic() - started:.1f} s")
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", home.ENV)}
    env["MUSEGEN_PRECISION"] = "fp32"

    def run(*args):
        done = subprocess.run([*map(str, args)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    where = run(python, "-c", "import musegen, musegen.home as h; print(musegen.__file__); print(h.shipped_folder())")
    package, shipped = map(Path, where.split())
    assert venv in package.parents and REPO not in package.parents
    assert shipped == venv / "share" / "musegen" / "checkpoints"
    run(musegen, "sample", "--checkpoint", "pop", "--prompt", "pop_progression", "--bars", "4", "--out", "out")
    assert sorted(p.name for p in (elsewhere / "out").rglob("*.mid")) == ["pop_progression_000.mid"]
    assert "Try a prompt" in run(musegen, "studio", "--help")
