"""Sampling from a model whose positions are beats: every token the sampler feeds carries the
onset `Tokenizer.onsets` gives it, the tokens drawn are those of the parallel pass over the whole
sequence, and the groove tokenizers' onsets are the decoded notes' times."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import GOLDEN, pop909_files
from tiny_models import tiny_checkpoint, tiny_model

from musegen.cli import main
from musegen.generation import loop
from musegen.generation.loop import generate
from musegen.generation.precision import step_choice
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.model.transformer import Session
from musegen.music.constants import TICKS_PER_BEAT
from musegen.tokenizers import Tokenizer, tokenizer_from_dict

KINDS = sorted(Tokenizer.registry)
PROMPT_DIR = Path(__file__).resolve().parents[1] / "checkpoints" / "prompts"
MMA_FILES = sorted((GOLDEN / "groove_spe").glob("mma_*.mid"))
GROOVE_CASES = sorted(p for p in (GOLDEN / "groove_spe").glob("mma_*.json"))


def prompt_of(kind: str, tok: Tokenizer, bars: int):
    """A real prompt: a POP909 song for the pop representations, an MMA groove for the trios."""
    source = pop909_files(1)[0] if kind in ("remi", "song") else PROMPT_DIR / "groove_rock.mid"
    return load_prompt(tok, source, bars=bars)


def fed_streams(monkeypatch, batch: int) -> list:
    """Record what the sampler's session (of `batch` rows) is fed: a list of (tokens [B, T],
    beats [B, T]) per call; the memory check's own session (one row) is left out."""
    calls = []
    step = Session.step

    def recording(self, tokens, beats=None):
        if self.batch_size == batch:
            as_block = (lambda x: x[:, None]) if tokens.dim() == 1 else (lambda x: x)
            calls.append((as_block(tokens).clone(), as_block(beats).clone()))
        return step(self, tokens, beats)

    monkeypatch.setattr(Session, "step", recording)
    return calls


@pytest.mark.parametrize("kind", KINDS)
def test_each_clock_gives_the_tokenizers_onsets_on_real_pieces(kind):
    tok = tokenizer_from_dict({"kind": kind})
    sources = pop909_files(3) if kind in ("remi", "song") else MMA_FILES[:6]
    for source in sources:
        ids = tok.encode(source).ids
        clock = tok.onset_clock()
        walked = np.array([clock.advance(int(t)) for t in ids])
        onsets = tok.onsets(ids)
        assert np.array_equal(walked, onsets) and onsets[-1] >= 8  # several bars, token for token
        assert (np.diff(onsets) >= 0).all()


def note_times(tok: Tokenizer, ids, note_ids: np.ndarray, track_of, pitch_of) -> Counter:
    """(track, pitch, onset in beats) of every token of `note_ids` in `ids`."""
    onsets = tok.onsets(ids)
    where = np.flatnonzero(np.isin(ids, note_ids))
    return Counter((track_of(ids[i]), pitch_of(ids[i]), onsets[i]) for i in where)


def decoded_starts(tok: Tokenizer, ids) -> Counter:
    piece = tok.decode(ids)
    return Counter(zip(piece.track.tolist(), piece.pitch.tolist(), (piece.start / TICKS_PER_BEAT).tolist()))


def test_groove_note_ons_sit_at_their_decoded_notes_starts_and_note_offs_at_their_ends():
    """On the reference pipeline's own encodings of MMA grooves."""
    tok = tokenizer_from_dict({"kind": "groove"})
    for case in GROOVE_CASES:
        ids = np.array(json.loads(case.read_text())["ids"])
        starts = note_times(tok, ids, np.arange(384), lambda t: t // 128, lambda t: t % 128)
        assert starts == decoded_starts(tok, ids) and len(starts) > 20, case.name
        notes = tok.notes(ids)  # (track, pitch, onset, offset) in 1/12 beats
        ends = note_times(tok, ids, np.arange(384, 768), lambda t: (t - 384) // 128 + 1, lambda t: t % 128)
        assert ends == Counter(zip(notes[:, 0].tolist(), notes[:, 1].tolist(), (notes[:, 3] / 12).tolist()))


def test_groove_dur_notes_and_durations_sit_at_their_decoded_notes_starts():
    tok = tokenizer_from_dict({"kind": "groove-dur"})
    for source in MMA_FILES[:8]:
        ids = tok.encode(source).ids
        starts = note_times(tok, ids, np.arange(384), lambda t: t // 128, lambda t: t % 128)
        assert starts == decoded_starts(tok, ids) and len(starts) > 20, source.name
        onsets = tok.onsets(ids)
        durations = np.flatnonzero((ids >= 384) & (ids < 412))
        assert (onsets[durations] == onsets[durations - 1]).all()  # a Duration at its Note's onset


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_of_beats_samples_bars_feeding_each_token_its_onset(kind, monkeypatch):
    """Three rows that end at different lengths, from a real prompt (the pop ones longer than one
    ingest chunk): each row's fed tokens carry `onsets` of the sample they make."""
    model, tok = tiny_model(kind, positions="beats")
    prompt = prompt_of(kind, tok, bars=12 if kind in ("remi", "song") else 2)
    calls = fed_streams(monkeypatch, batch=3)
    settings = SampleSettings(bars=2, num_samples=3, seed=4, precision="fp32")
    samples, stats = generate(model, tok, prompt, settings, progress=False)
    assert stats["invalid"] == 0
    assert len(prompt.ids) < 512 or sum(t.shape[1] for t, _ in calls[:2]) > 512  # ingested in chunks
    tokens, beats = (torch.cat(parts, 1).numpy() for parts in zip(*calls))
    prompt_end = tok.onsets(prompt.ids)[-1]
    for row, sample in enumerate(samples):
        assert len(tok.bar_starts(sample.ids)) > len(tok.bar_starts(prompt.ids))
        tok.decode(sample.ids)
        agree = np.flatnonzero(tokens[row, : len(sample.ids)] != sample.ids[: len(tokens[row])])
        fed = agree[0] if len(agree) else min(len(sample.ids), tokens.shape[1])  # then closed, or cut at a bar
        assert fed > len(prompt.ids) + 8
        assert np.array_equal(beats[row, :fed], tok.onsets(sample.ids)[:fed])
        assert beats[row, fed - 1] > prompt_end  # time moved on past the prompt
    assert len({len(s.ids) for s in samples}) > 1  # the rows went on for different lengths


def parallel_reference(monkeypatch, tok: Tokenizer) -> None:
    """Make every step of a session run the parallel pass (`model(ids, beats)` with the session's
    noise) over all it was fed, at `tok.onsets` of those tokens, ignoring the beats passed."""

    def step(self, tokens, beats=None):
        block = tokens[:, None] if tokens.dim() == 1 else tokens
        self.fed = torch.cat([getattr(self, "fed", block[:, :0]), block], 1)
        onsets = torch.from_numpy(np.stack([tok.onsets(row) for row in self.fed.numpy()]))
        model = self.model
        hidden, _ = model._run(self.fed, 0, self.noise, [None] * len(model.layers), onsets)
        logits = model.head(hidden)[:, -block.shape[1] :]
        return logits[:, 0] if tokens.dim() == 1 else logits

    monkeypatch.setattr(Session, "step", step)
    monkeypatch.setattr(loop, "check_memory", lambda *args: None)  # its probe session is not the sampler's


@pytest.mark.parametrize("kind", ["remi", "song", "groove"])
def test_a_model_of_beats_draws_what_the_parallel_pass_over_the_whole_sequence_draws(kind, monkeypatch):
    model, tok = tiny_model(kind, positions="beats", window=4)
    with torch.no_grad():  # untrained, its attention is nearly uniform: sharpened, the onsets change its draws
        for layer in model.layers:
            layer.attention.qkv.weight.mul_(30)
    prompt = prompt_of(kind, tok, bars=2)
    run = lambda **s: generate(model, tok, prompt, SampleSettings(length=64, precision="fp32", **s), progress=False)
    streamed = run(seed=9)[0][0].ids
    with monkeypatch.context() as patch:
        parallel_reference(patch, tok)
        assert run(seed=9)[0][0].ids.tolist() == streamed.tolist()
        patch.setattr(tok, "onsets", lambda ids: np.arange(len(ids), dtype=np.float64))  # token positions: other draws
        assert run(seed=9)[0][0].ids.tolist() != streamed.tolist()
    assert len(streamed) > len(prompt.ids) + 60


def test_timing_the_steps_of_a_model_of_beats_feeds_them_onsets(monkeypatch, tmp_path):
    """Where "auto" times the paths (a CPU with bf16 arithmetic), the timed steps take onsets."""
    monkeypatch.setenv("MUSEGEN_PRECISION", "measure")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr("musegen.precision.native_bf16", lambda device: True)
    model, _ = tiny_model("remi", positions="beats")
    choice = step_choice("auto", model, 2, quiet=True)
    assert choice.path in model.step_paths() and choice.seconds


@pytest.mark.parametrize("kind", ["song", "groove-dur"])
def test_cli_samples_a_checkpoint_of_beats(kind, tmp_path, capsys):
    checkpoint = tiny_checkpoint(kind, tmp_path / "model", positions="beats")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["sample", "-c", str(checkpoint), "--bars", "2", "-n", "2", "--seed", "3", "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert (exit_.value.code or 0) == 0, err
    assert "invalid samples: 0" in stdout
    tok = tokenizer_from_dict({"kind": kind})
    written = sorted(out.rglob("*.mid"))
    assert len(written) == 2
    for midi in written:
        assert len(tok.bar_starts(tok.encode(midi).ids)) >= 2
