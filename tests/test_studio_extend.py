"""The studio's Extend (a sample continued by more bars), its prompt bars (from, to), and what a
Stop keeps, each checked against what `musegen sample` writes for the same settings; and the rule
both share for a prompt that begins at a later bar (musegen/generation/prompt.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import miditoolkit
import numpy as np
import pytest
from starlette.testclient import TestClient
from test_studio import EXAMPLE, EXAMPLES, POP, A, events, serving, upload

from musegen.cli import main
from musegen.errors import ConfigError, MidiError
from musegen.generation.loop import generate
from musegen.generation.prompt import load_prompt, prompt_from_ids
from musegen.generation.settings import SampleSettings
from musegen.music.notes import NoteTable
from musegen.studio.models import Models
from musegen.studio.server import create_app


@pytest.fixture(scope="module")
def models() -> Models:
    return Models([POP])


@pytest.fixture(scope="module")
def pop_tokenizer(models):
    return models.tokenizer("pop")


@pytest.fixture
def client(models, tmp_path) -> TestClient:
    return TestClient(create_app(tmp_path / "out", models), base_url="http://127.0.0.1")


def musegen_sample(out: Path, prompt: Path | None, *flags) -> Path:
    """`musegen sample -c pop` with `flags` into `out`: the folder of its output set."""
    args = ["sample", "-c", POP, "--out", out, *(["--prompt", prompt] if prompt else []), *flags]
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    assert (exit_.value.code or 0) == 0
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


def same_files(studio: Path, cli: Path) -> None:
    """The same file names, and each MIDI file byte for byte (the summaries differ in paths and timings)."""
    assert sorted(p.name for p in studio.iterdir()) == sorted(p.name for p in cli.iterdir())
    midis = sorted(p.name for p in cli.glob("*.mid"))
    assert midis and all((studio / name).read_bytes() == (cli / name).read_bytes() for name in midis)


def notes(path: Path) -> list[tuple[int, int, int, int]]:
    table = NoteTable.read(path, by_role=False)
    return sorted(zip(table.start.tolist(), table.end.tolist(), table.pitch.tolist(), table.velocity.tolist()))


# ---- Extend ----


def test_extend_continues_a_sample_as_sample_does_with_the_sample_as_its_prompt(client, models, tmp_path):
    prompt = upload(client, A, EXAMPLE, (EXAMPLES / EXAMPLE).read_bytes()).json()["prompt"]
    first = events(client, A, model="pop", prompt=prompt, bars=1, samples=2, seed=3)[-1]
    # the model is the one that made the run, whatever the request names
    got = events(client, A, model="nope", extend_run=first["run"], extend_sample=1, bars=1, seed=4)
    done = got[-1]
    assert done["event"] == "done" and len(done["samples"]) == 1, got[-3:]
    sample = tmp_path / "out" / A / first["run"] / "pop_progression_001.mid"
    extended = tmp_path / "out" / A / done["run"]
    assert sorted(p.name for p in extended.iterdir()) == ["pop_progression_001.json", "pop_progression_001_000.mid"]
    same_files(extended, musegen_sample(tmp_path / "cli", sample, "--bars", 1, "--seed", 4))

    # the sample as it was up to the seam (the example's 4 bars and the sample's one), then a bar more
    view = done["samples"][0]
    before = notes(sample)
    kept = [n for n in notes(extended / "pop_progression_001_000.mid") if n[0] < view["prompt_end"]]
    assert kept == before and len(view["notes"]) > len(before)
    assert json.loads((extended / "pop_progression_001.json").read_text())["prompt_bars"] == 5
    # the sample's MIDI read back as a prompt is the sample's own tokens: the first run sampled
    # again here gives the ids the studio drew
    model, tokenizer, weights = models.shared("pop")
    drawn, _ = generate(
        model,
        tokenizer,
        load_prompt(tokenizer, EXAMPLES / EXAMPLE),
        SampleSettings(bars=1, num_samples=2, seed=3).resolved(tokenizer),
        device="cpu",
        progress=False,
        weights=weights,
    )
    own = prompt_from_ids(tokenizer, drawn[1].ids)
    np.testing.assert_array_equal(load_prompt(tokenizer, sample).ids, own.ids)

    listed = client.get(f"/api/results?session={A}").json()["results"]
    assert listed[0]["run"] == done["run"] and listed[0]["prompt_id"] is None
    assert listed[0]["extends"] == {"run": first["run"], "sample": 1, "name": "pop_progression_001.mid"}
    assert listed[1]["prompt_id"] == prompt and listed[1]["extends"] is None


@pytest.mark.parametrize(
    "request_,message",
    [
        ({"extend_run": "20260101-000000-abcdef"}, "no run 20260101-000000-abcdef"),
        ({"extend_run": "../x"}, "not a valid run id"),
        ({"extend_run": "20260101-000000-abcdef", "extend_sample": 8}, "extend_sample must be within 0..7"),
        ({"extend_run": "20260101-000000-abcdef", "prompt": "0123456789ab"}, "either a prompt or an earlier sample"),
        ({"extend_run": "20260101-000000-abcdef", "prompt_from": 2}, "prompt_from and prompt_to are not used"),
        ({"prompt_from": 3, "prompt_to": 2}, "prompt_to must be prompt_from (3) or later, got 2"),
        ({"prompt_from": 0}, "prompt_from must be within 1..5000"),
        ({"prompt_to": "4"}, "prompt_to must be a whole number"),
    ],
)
def test_a_bad_extension_or_prompt_bars_get_one_line(client, request_, message):
    answer = client.post(f"/api/generate?session={A}", json={"model": "pop", "bars": 2, **request_})
    assert answer.status_code == 400 and message in answer.json()["error"], answer.text


def test_a_sample_that_is_not_there_cannot_be_extended(client):
    first = events(client, A, model="pop", bars=1, seed=1)[-1]
    answer = client.post(f"/api/generate?session={A}", json={"extend_run": first["run"], "extend_sample": 1})
    assert answer.status_code == 400 and answer.json()["error"] == f"run {first['run']} has no sample 2"


# ---- prompt bars ----


def test_prompt_bars_from_to_write_what_sample_writes_with_prompt_from_and_prompt_bars(client, tmp_path):
    prompt = upload(client, A, EXAMPLE, (EXAMPLES / EXAMPLE).read_bytes()).json()["prompt"]
    done = events(client, A, model="pop", prompt=prompt, prompt_from=2, prompt_to=3, bars=1, seed=6)[-1]
    studio = tmp_path / "out" / A / done["run"]
    flags = ("--prompt-from", 2, "--prompt-bars", 2, "--bars", 1, "--seed", 6)
    same_files(studio, musegen_sample(tmp_path / "cli", EXAMPLES / EXAMPLE, *flags))
    summary = json.loads((studio / "pop_progression.json").read_text())
    assert summary["prompt_bars"] == 2 and summary["settings"]["prompt_bars"] == 2
    assert summary["settings"]["prompt_from"] == 2
    # the continuation begins after the 2 kept bars
    assert done["samples"][0]["prompt_end"] == 2 * 4 * done["samples"][0]["ticks_per_beat"]


def crossing_midi() -> bytes:
    """Three bars of quarter notes, and a note held from beat 3 of bar 1 to beat 2 of bar 2."""
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    piano = miditoolkit.Instrument(0)
    piano.notes = [miditoolkit.Note(80, 72 + (i % 5), i * 480, i * 480 + 400) for i in range(12)]
    piano.notes.append(miditoolkit.Note(80, 50, 2 * 480, 6 * 480))
    midi.instruments = [piano]
    buffer = io.BytesIO()
    midi.dump(file=buffer)
    return buffer.getvalue()


def test_a_prompt_from_a_later_bar_is_that_bar_on_with_a_held_note_starting_there(pop_tokenizer):
    whole = load_prompt(pop_tokenizer, crossing_midi())
    later = load_prompt(pop_tokenizer, crossing_midi(), bars=1, first=2)
    bar = 4 * whole.piece.tpq
    assert whole.bars == 3 and later.bars == 1
    own = whole.piece.select((whole.piece.start >= bar) & (whole.piece.start < 2 * bar))
    expected = sorted(zip((own.start - bar).tolist(), (own.end - bar).tolist(), own.pitch.tolist()))
    got = sorted(zip(later.piece.start.tolist(), later.piece.end.tolist(), later.piece.pitch.tolist()))
    held = (0, 2 * 480, 50)  # the note from bar 1, from the bar line on
    assert got == sorted([*expected, held])


def test_a_prompt_from_past_its_end_or_a_mirex_task_from_a_later_bar_gets_one_line(pop_tokenizer, tmp_path):
    with pytest.raises(MidiError, match=r"^the prompt: the prompt has 3 bars, so it cannot begin at bar 4$"):
        load_prompt(pop_tokenizer, crossing_midi(), first=4)
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"prompt": [{"start": i, "pitch": 60, "duration": 2} for i in range(0, 64, 2)]}))
    with pytest.raises(ConfigError, match="continued from its first bar; --prompt-from is for MIDI"):
        load_prompt(pop_tokenizer, task, first=2)
    out = tmp_path / "cli"
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in ["sample", "-c", POP, "--out", out, "--prompt", EXAMPLES / EXAMPLE, "--prompt-from", 9]])
    assert exit_.value.code != 0 and not out.exists()


# ---- Stop ----


def stopped_after(http, request: dict, bars: int) -> dict:
    """A run of `request` stopped once every sample has drawn `bars` whole bars: its last event."""
    with http.stream("POST", f"/api/generate?session={A}", json=request) as response:
        lines = (json.loads(line) for line in response.iter_lines())
        run, asked = next(lines)["run"], False
        for event in lines:
            if event["event"] == "notes" and event["progress"] * request["bars"] > bars and not asked:
                assert http.post(f"/api/runs/{run}/stop?session={A}").status_code == 200
                asked = True
            last = event
    return last


def test_what_stop_keeps_is_what_sample_writes_up_to_the_bars_drawn(models, tmp_path):
    request = {"model": "pop", "bars": 64, "samples": 2, "seed": 8}  # minutes of sampling: Stop ends it
    with serving(create_app(tmp_path / "out", models)) as base, httpx.Client(base_url=base, timeout=120) as http:
        last = stopped_after(http, request, 1)
    assert last["event"] == "stopped" and last["bars"] >= 2
    kept = tmp_path / "out" / A / last["run"]
    # `musegen sample` with the same seed draws the same tokens: its first bar is the kept one's
    # (the bar the run was stopped in has no `sample` equivalent: sample ends at a bar line)
    cli = musegen_sample(tmp_path / "cli", None, "--bars", 1, "--num-samples", 2, "--seed", 8)
    assert sorted(p.name for p in kept.iterdir()) == sorted(p.name for p in cli.iterdir())
    bar = 4 * NoteTable.read(cli / "sample_000.mid").tpq
    for name in ("sample_000.mid", "sample_001.mid"):
        first_bar = [n for n in notes(kept / name) if n[0] < bar]
        assert first_bar and first_bar == notes(cli / name)
    summary = json.loads((kept / "sample.json").read_text())
    assert summary["stopped"] is True and all(not s["valid"] for s in summary["samples"])
