"""musegen sample: grammar-masked recurrent sampling from untrained tiny models, outputs, bad input."""

from __future__ import annotations

import csv
import io
import json
import shutil
import wave
from collections import Counter

import miditoolkit
import numpy as np
import pytest
import symusic
import torch

from musegen.checkpoint import save_checkpoint
from musegen.cli import main
from musegen.model import MusicPerformer, preset
from musegen.render import PROMPT_END_MARKER
from musegen.sample import Prompt, SampleSettings, filter_logits, generate, load_prompt, open_end, with_ending
from musegen.tokenizers import tokenizer_from_dict

KINDS = ("remi", "groove")
EMPTY = Prompt(np.zeros(0, dtype=np.int64))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models():
    out = {}
    for kind in KINDS:
        tok = tokenizer_from_dict({"kind": kind})
        torch.manual_seed(0)
        out[kind] = (MusicPerformer(preset("tiny", vocab_size=tok.vocab_size)).eval(), tok)
    return out


@pytest.fixture(scope="module")
def checkpoints(models, tmp_path_factory):
    folders = {}
    for kind, (model, tok) in models.items():
        folders[kind] = save_checkpoint(tmp_path_factory.mktemp(f"ckpt-{kind}"), model, model.config, tok)
    return folders


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return (exit_.value.code or 0), out.out, out.err


def midi_bytes(midi: miditoolkit.MidiFile) -> bytes:
    buffer = io.BytesIO()
    midi.dump(file=buffer)
    return buffer.getvalue()


def note_set(midi, with_duration=True):
    return Counter((n.start, n.pitch, n.velocity) + ((n.end,) if with_duration else ())
                   for inst in midi.instruments for n in inst.notes)


# ---------------------------------------------------------------- validity (the "done when")

@pytest.mark.parametrize("kind", KINDS)
def test_200_masked_samples_are_all_valid(models, kind):
    model, tok = models[kind]
    samples, stats = generate(model, tok, EMPTY, SampleSettings(length=512, num_samples=200, seed=7), progress=False)
    grammar = tok.grammar()
    assert stats["invalid"] == stats["grammar_violations"] == stats["unfinished"] == 0
    for sample in samples:
        assert sample.valid and grammar.first_violation(sample.ids) is None
        assert sample.new_tokens >= 512  # the end token is masked until the length is reached
        midi = tok.decode(sample.ids)  # decodes without error
        # the grammars are canonical: a decoded sample re-encodes to exactly its own tokens
        assert list(tok.encode(midi_bytes(midi)).ids) == list(sample.ids)


@pytest.mark.parametrize("kind", KINDS)
def test_without_the_mask_invalid_samples_are_counted(models, kind):
    model, tok = models[kind]
    samples, stats = generate(model, tok, EMPTY, SampleSettings(length=128, num_samples=40, seed=7, grammar=False),
                              progress=False)
    violations = [tok.grammar().first_violation(s.ids) for s in samples]
    assert stats["grammar_violations"] == sum(v is not None for v in violations) > 0
    assert [s.violation for s in samples] == violations
    assert stats["invalid"] == sum(not s.valid for s in samples) >= stats["grammar_violations"]


def test_same_seed_same_output_other_seed_differs(models):
    model, tok = models["remi"]
    run = lambda seed: [s.ids.tolist() for s in generate(model, tok, EMPTY, SampleSettings(
        length=48, num_samples=3, seed=seed), progress=False)[0]]
    first = run(11)
    assert run(11) == first
    assert run(12) != first
    assert len({tuple(x) for x in first}) == 3  # the samples of one batch differ from each other


def test_a_stop_mid_note_is_finished_then_closed(models):
    model, tok = models["remi"]
    samples, _ = generate(model, tok, EMPTY, SampleSettings(length=37, num_samples=30, seed=3), progress=False)
    names = lambda s: [tok.vocab[i] for i in s.ids]
    assert all(names(s)[-2:] == ["Bar_None", "EOS_None"] and s.closed for s in samples)
    # some were stopped where the piece cannot end (inside a note, on a bare Beat or Bar) and had
    # to finish a note first: at most Bar, Beat, Chord, Tempo, Pitch, Velocity, Duration more
    assert any(s.new_tokens > 37 for s in samples)
    assert all(s.new_tokens <= 37 + 7 for s in samples)


def test_bars_mode_generates_that_many_new_bars(models, pop909_songs):
    model, tok = models["remi"]
    prompt = load_prompt(tok, pop909_songs[0], bars=2)
    samples, _ = generate(model, tok, prompt, SampleSettings(bars=1, num_samples=3, seed=5), progress=False)
    bar_ticks = 4 * 480
    last_bars = []
    for s in samples:
        assert s.closed and list(s.ids[:len(prompt.ids)]) == list(prompt.ids)
        assert [tok.vocab[i] for i in s.ids[-2:]] == ["Bar_None", "EOS_None"]
        # 2 prompt bars + 1 new bar (bar index 2); it may end with an empty bar, never a fourth with notes
        last_bars.append(max(n.start for n in tok.decode(s.ids).instruments[0].notes) // bar_ticks)
    assert set(last_bars) == {2}


def test_prompt_is_cut_to_its_bars_and_opened(pop909_songs):
    tok = tokenizer_from_dict({"kind": "remi"})
    full = tok.encode(pop909_songs[1]).ids
    prompt = load_prompt(tok, pop909_songs[1], bars=2)
    starts = tok.bar_starts(full)
    assert list(prompt.ids) == list(full[:starts[2]])
    whole = load_prompt(tok, pop909_songs[1])
    assert list(whole.ids) == list(full[:-1])  # only the final EOS goes: the continuation starts a bar
    groove = tokenizer_from_dict({"kind": "groove"})
    ids = np.array([792, 0, 784, 384, 793])  # Start, NoteOn, shift, NoteOff, End
    assert list(open_end(groove.grammar(), ids)) == [792, 0, 784, 384]


# ---------------------------------------------------------------- nucleus, top-k, temperature

def test_filter_logits_keeps_the_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = lambda x: torch.isfinite(x[0]).nonzero().flatten().tolist()
    assert kept(filter_logits(logits, 1.0, top_p=0.8)) == [0, 1]  # 0.5 < 0.8 <= 0.5 + 0.3
    assert kept(filter_logits(logits, 1.0, top_p=0.81)) == [0, 1, 2]
    assert kept(filter_logits(logits, 1.0, top_p=0.01)) == [0]
    assert kept(filter_logits(logits, 1.0, top_p=1.0)) == [0, 1, 2, 3]
    assert kept(filter_logits(logits, 1.0, top_k=3)) == [0, 1, 2]
    # temperature T divides the logits: p_i^(1/T) renormalised
    hot = filter_logits(logits, 2.0).softmax(-1)
    assert torch.allclose(hot, probs.sqrt() / probs.sqrt().sum(), atol=1e-6)


def test_sampling_frequencies_follow_the_nucleus():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().expand(20000, -1)
    gen = torch.Generator().manual_seed(0)
    draws = torch.multinomial(filter_logits(logits, 1.0, top_p=0.8).softmax(-1), 1, generator=gen).flatten()
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    assert freq[2:].sum() == 0
    assert freq[0].item() == pytest.approx(0.5 / 0.8, abs=0.015)


# ---------------------------------------------------------------- the command line

@pytest.mark.skipif(shutil.which("fluidsynth") is None, reason="fluidsynth not installed")
def test_cli_sample_with_prompt_writes_midi_wav_json_and_pianoroll(checkpoints, pop909_songs, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = run_cli(["sample", "--checkpoint", checkpoints["remi"], "--prompt", pop909_songs[0],
                                 "--prompt-bars", 2, "--length", 64, "-n", 2, "--seed", 5, "--out", out,
                                 "--pianoroll", "--audio"], capsys)
    assert code == 0, err
    assert "tokens/s" in stdout and "invalid samples: 0" in stdout
    summary = json.loads((out / f"{pop909_songs[0].stem}.json").read_text())
    assert summary["settings"]["seed"] == 5 and summary["settings"]["temperature"] == 1.2
    assert summary["settings"]["top_p"] == 0.9 and summary["tokenizer"] == "remi"
    tok = tokenizer_from_dict({"kind": "remi"})
    prompt = load_prompt(tok, pop909_songs[0], bars=2)
    prompt_notes = note_set(tok.decode(with_ending(tok.grammar(), prompt.ids)))
    for record in summary["samples"]:
        midi = miditoolkit.MidiFile(str(out / record["midi"]))
        markers = [m for m in midi.markers if m.text == PROMPT_END_MARKER]
        assert len(markers) == 1 and markers[0].time > 0
        notes = note_set(midi)
        assert notes & prompt_notes == prompt_notes  # the prompt is kept, note for note
        head = Counter({k: v for k, v in notes.items() if k[0] < markers[0].time})
        assert head & prompt_notes == head  # and everything before the marker is prompt
        assert (out / record["pianoroll"]).read_bytes()[:4] == b"\x89PNG"
        music_end = symusic.Score(str(out / record["midi"])).to("second").end()
        with wave.open(str(out / record["wav"])) as w:
            seconds = w.getnframes() / w.getframerate()
            loud = np.abs(np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)).max()
        assert music_end <= seconds <= music_end + 1.5 and loud > 1000


def test_cli_no_grammar_reports_invalid_count(checkpoints, tmp_path, capsys):
    code, stdout, err = run_cli(["sample", "-c", checkpoints["groove"], "--length", 64, "-n", 8, "--seed", 1,
                                 "--no-grammar", "--out", tmp_path], capsys)
    assert code == 0, err
    line = next(x for x in stdout.splitlines() if x.startswith("invalid samples"))
    summary = json.loads((tmp_path / "sample.json").read_text())
    assert line.startswith(f"invalid samples: {summary['stats']['invalid']} of 8")
    assert summary["stats"]["invalid"] > 0 and summary["settings"]["temperature"] == 0.6


def test_cli_prompt_with_unrepresentable_notes_reports_and_goes_on(checkpoints, tmp_path, capsys):
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    piano = miditoolkit.Instrument(0)
    piano.notes = [miditoolkit.Note(80, p, 480 * i, 480 * i + 400) for i, p in enumerate([12, 60, 64, 120, 67])]
    midi.instruments.append(piano)
    midi.dump(str(tmp_path / "odd.mid"))
    code, stdout, err = run_cli(["sample", "-c", checkpoints["remi"], "--prompt", tmp_path / "odd.mid",
                                 "--length", 16, "--seed", 1, "--out", tmp_path / "o"], capsys)
    assert code == 0, err
    assert "pitches_folded 2" in stdout  # 12 and 120 lie outside REMI's 22..107
    assert (tmp_path / "o" / "odd_000.mid").is_file()


def _bad_inputs(tmp_path, checkpoints):
    (tmp_path / "text.mid").write_text("not midi at all")
    (tmp_path / "empty.mid").write_bytes(b"")
    silent = miditoolkit.MidiFile(ticks_per_beat=480)
    silent.instruments.append(miditoolkit.Instrument(0))
    silent.dump(str(tmp_path / "silent.mid"))
    missing = tmp_path / "ckpt-missing"
    missing.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (missing / name).write_bytes((checkpoints["remi"] / name).read_bytes())
    tampered = tmp_path / "ckpt-tampered"
    tampered.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        data = (checkpoints["remi"] / name).read_bytes()
        (tampered / name).write_bytes(data[: len(data) // 2] if name == "model.safetensors" else data)
    ok = ["-c", checkpoints["remi"], "--out", tmp_path / "out", "--seed", 1]
    return {
        "not midi": ["sample", *ok, "--length", 8, "--prompt", tmp_path / "text.mid"],
        "empty file": ["sample", *ok, "--length", 8, "--prompt", tmp_path / "empty.mid"],
        "no notes": ["sample", *ok, "--length", 8, "--prompt", tmp_path / "silent.mid"],
        "missing prompt": ["sample", *ok, "--length", 8, "--prompt", tmp_path / "nope.mid"],
        "missing weights": ["sample", "-c", missing, "--out", tmp_path / "out", "--length", 8],
        "tampered weights": ["sample", "-c", tampered, "--out", tmp_path / "out", "--length", 8],
        "no checkpoint": ["sample", "-c", tmp_path / "nowhere", "--out", tmp_path / "out", "--length", 8],
        "length 0": ["sample", *ok, "--length", 0],
        "no length": ["sample", *ok],
        "top-p 0": ["sample", *ok, "--length", 8, "--top-p", 0],
        "top-p 1.5": ["sample", *ok, "--length", 8, "--top-p", 1.5],
        "temperature 0": ["sample", *ok, "--length", 8, "--temperature", 0],
    }


def test_cli_bad_input_is_one_line_and_nonzero(checkpoints, tmp_path, capsys):
    expected = {"not midi": "not a MIDI file", "empty file": "empty file", "no notes": "no notes",
                "missing prompt": "no such file", "missing weights": "missing model.safetensors",
                "tampered weights": "unreadable weights", "no checkpoint": "not found",
                "length 0": "--length must be at least 1", "no length": "exactly one of",
                "top-p 0": "(0, 1]", "top-p 1.5": "(0, 1]", "temperature 0": "--temperature"}
    for label, args in _bad_inputs(tmp_path, checkpoints).items():
        code, stdout, err = run_cli(args, capsys)
        lines = err.strip().splitlines()
        assert code == 1, (label, err)
        assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, (label, err)
        assert expected[label] in lines[0], (label, lines[0])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_cli_prompt_folder_continues_each_file_and_skips_bad_ones(checkpoints, pop909_songs, tmp_path, capsys):
    prompts = tmp_path / "prompts"
    for sub, song in (("a", pop909_songs[0]), ("b", pop909_songs[1])):
        (prompts / sub).mkdir(parents=True)
        shutil.copy(song, prompts / sub / "0.mid")  # the same stem in two folders must not collide
    (prompts / "a" / "broken.mid").write_bytes(b"MThd not really")
    code, out, err = run_cli(["sample", "-c", checkpoints["remi"], "--prompt", prompts, "--prompt-bars", 2,
                              "--length", 24, "--seed", 3, "-o", tmp_path / "out"], capsys)
    assert code == 0, err
    assert "2 prompts continued, 1 skipped" in out and "a/broken.mid" in out
    assert {p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.mid")} == \
        {"a/0_000.mid", "b/0_000.mid"}
    batch = json.loads((tmp_path / "out" / "batch.json").read_text())
    assert batch["continued"] == 2 and list(batch["skipped"]) == ["a/broken.mid"]
    seeds = [json.loads((tmp_path / "out" / sub / "0.json").read_text())["settings"]["seed"] for sub in "ab"]
    assert seeds == [3, 5]  # prompt i of the sorted list gets seed + i (a/broken.mid is i = 1)
    # The style evaluation pairs each continuation with the prompt file it came from.
    from musegen.metrics.style import evaluate_style

    result = evaluate_style(tmp_path / "out", prompts, tmp_path / "style.csv")
    assert result["pieces"] == 2 and not result["unmatched"]
    rows = list(csv.DictReader(open(tmp_path / "style.csv")))
    assert {(r["generated"], r["reference"]) for r in rows} == {("a/0_000.mid", "0.mid"), ("b/0_000.mid", "0.mid")}

    (prompts / "b" / "0.mid").write_bytes(b"")
    (prompts / "a" / "0.mid").unlink()
    code, _, err = run_cli(["sample", "-c", checkpoints["remi"], "--prompt", prompts, "--length", 8,
                            "-o", tmp_path / "out2"], capsys)
    assert code != 0 and "none of its 2 prompts" in err.strip().splitlines()[-1] and "Traceback" not in err
