"""Live play's engine (musegen.generation.live) with the shipped pop and song models: what the
streaming session has consumed after each bar is exactly the prompt `musegen sample` reads from
the same notes up to that bar line (tokens and logits), an answer is what the sampler draws from
that prompt, its notes are passed on in order before it ends, and an accompaniment leaves the
player's instrument alone."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import POP909, REPO

from musegen import home
from musegen.checkpoint import load_checkpoint
from musegen.errors import ConfigError, MusegenError
from musegen.generation.live import TPQ, Live, LiveNote
from musegen.generation.loop import generate
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.music.notes import NoteTable

SETTINGS = SampleSettings(seed=7, precision="fp32")
BAR = 4 * TPQ


@pytest.fixture(scope="module")
def models(one_torch_thread):
    return {name: load_checkpoint(REPO / "checkpoints" / name)[:2] for name in ("pop", "song")}


def melody_bars(bars: int) -> list[list[LiveNote]]:
    """POP909 song 001's melody as a player would play it, bar by bar: its own timing (a quarter
    note of the file is a quarter note here), from the bar of its first note."""
    table = NoteTable.read(POP909 / "001" / "001.mid", by_role=False)
    melody = table.select(table.track == [t.name for t in table.tracks].index("MELODY"))
    start = (melody.start * TPQ // table.tpq).astype(int)
    end = (melody.end * TPQ // table.tpq).astype(int)
    origin = int(start.min()) // BAR * BAR
    rows = zip(start - origin, end - origin, melody.pitch, melody.velocity)
    notes = [LiveNote(int(s), int(e), int(p), int(v)) for s, e, p, v in rows]
    return [[n for n in notes if b * BAR <= n.start < (b + 1) * BAR] for b in range(bars)]


def reference(tokenizer, live: Live, bars: int):
    """What `musegen sample --prompt-bars <bars>` reads from the engine's notes written as a MIDI
    file that goes on after them (a note in the next bar: the player goes on playing)."""
    table = live.piece()
    later = NoteTable.of_tracks(TPQ, [(table.tracks[0], [(bars * BAR, bars * BAR + 120, 72, 80)])])
    merged = replace(
        table,
        **{k: np.concatenate([getattr(table, k), getattr(later, k)]) for k in ("start", "end", "pitch", "velocity")},
        track=np.concatenate([table.track, [0]]),
    )
    return load_prompt(tokenizer, merged.midi_bytes(), bars=bars)


def fresh_logits(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        session = model.session(1, seed=SETTINGS.seed)
        return session.step(torch.tensor([ids], dtype=torch.long))[0, -1]


@pytest.mark.parametrize("name", ["pop", "song"])
def test_after_each_bar_the_session_has_read_exactly_the_prompt_up_to_that_bar_line(models, name):
    model, tokenizer = models[name]
    live = Live(model, tokenizer, SETTINGS, bpm=90)
    played = melody_bars(6)
    for bar, notes in enumerate(played, 1):
        live.close_bar(notes)
        expected = reference(tokenizer, live, bar)
        assert live.fed == [int(t) for t in expected.ids], f"bar {bar}"
    # every onset on the tokenizer's grid, none moved by more than half a cell
    cell = TPQ // tokenizer.onset_grid
    heard = sorted(n.start for bar in played for n in bar)
    kept = sorted(n.start for n in live.notes)
    assert len(heard) == len(kept) and all(k % cell == 0 and abs(k - h) <= cell // 2 for h, k in zip(heard, kept))
    # the state the snapshots and chunks built is the one a fresh session reads from those tokens
    logits = live.snapshots[-1].logits[0]
    assert torch.allclose(logits, fresh_logits(model, live.fed), atol=1e-4)


@pytest.mark.parametrize("name", ["pop", "song"])
def test_an_answer_is_what_the_sampler_draws_from_the_same_prompt_and_arrives_in_order(models, name):
    model, tokenizer = models[name]
    live = Live(model, tokenizer, SETTINGS, bpm=90)
    for notes in melody_bars(2):
        live.close_bar(notes)
    prompt = reference(tokenizer, live, 2)
    streamed: list[LiveNote] = []
    answer = live.answer(2, streamed.extend)

    samples, _ = generate(model, tokenizer, prompt, replace(SETTINGS, bars=2), progress=False)
    piece = tokenizer.decode(samples[0].ids, prompt.meta)
    end = prompt.piece.tpq * 4 * 2  # the prompt's two bars
    new = piece.select(piece.start >= end)
    expected = sorted((int(s) * TPQ // piece.tpq, int(p)) for s, p in zip(new.start, new.pitch))
    assert expected and sorted((n.start, n.pitch) for n in answer) == expected
    assert sorted(streamed, key=LiveNote.row) == sorted(answer, key=LiveNote.row)  # each passed on once
    assert min(n.start for n in answer) >= 2 * BAR and max(n.start for n in answer) < 4 * BAR
    assert live.bars == 4
    # the answer is part of the piece the session read, as a prompt of four bars would be
    assert live.fed == [int(t) for t in reference(tokenizer, live, 4).ids]
    assert torch.allclose(live.snapshots[-1].logits[0], fresh_logits(model, live.fed), atol=1e-4)


def test_taking_back_an_answers_last_bar_leaves_the_session_as_if_it_had_answered_one_bar(models):
    model, tokenizer = models["pop"]
    live = Live(model, tokenizer, SETTINGS, bpm=90)
    for notes in melody_bars(2):
        live.close_bar(notes)
    answer = live.answer(2)
    live.take_back(3)  # the player came back in bar 3: the answer's second bar never sounded
    assert live.bars == 3 and all(n.start < 3 * BAR for n in live.notes)
    assert [n for n in live.notes if n.start >= 2 * BAR] == [n for n in answer if n.start < 3 * BAR]
    assert live.fed == [int(t) for t in reference(tokenizer, live, 3).ids]
    assert torch.allclose(live.snapshots[-1].logits[0], fresh_logits(model, live.fed), atol=1e-4)
    with pytest.raises(ConfigError, match="cannot be taken back"):
        live.take_back(5)


def test_a_note_played_just_before_a_bar_line_waits_for_that_bar_and_a_late_one_is_not_fed(models):
    model, tokenizer = models["pop"]
    live = Live(model, tokenizer, SETTINGS)
    early = LiveNote(BAR - 20, BAR + 200, 64, 80)  # rounds to the next bar's first 16th
    live.close_bar([LiveNote(0, 200, 60, 80), early])
    assert [n.pitch for n in live.notes] == [60] and live.waiting
    live.close_bar([LiveNote(BAR - 100, BAR, 67, 80)])  # a note of bar 1, sent after it was over
    assert sorted((n.start, n.pitch) for n in live.notes) == [(0, 60), (BAR, 64)]


def test_an_accompaniment_plays_the_backing_band_but_never_the_players_instrument(models):
    model, tokenizer = models["song"]
    example = NoteTable.read(home.examples()["groove_rock.mid"], by_role=False)
    scale = TPQ / example.tpq
    backing = [
        LiveNote(int(s * scale), int(e * scale), int(p), int(v), example.tracks[k].program, example.tracks[k].is_drum)
        for s, e, p, v, k in zip(example.start, example.end, example.pitch, example.velocity, example.track)
        if s * scale < 2 * BAR
    ]
    program = 0  # the player's piano; the example's piano is left to the player too
    live = Live(model, tokenizer, SETTINGS, bpm=110, program=program, backing=backing, backing_bars=2)
    heard = set()
    for bar in range(2, 4):
        accompaniment = live.accompany()
        assert accompaniment and all(bar * BAR <= n.start < (bar + 1) * BAR for n in accompaniment)
        assert not any(n.program == program and not n.drum for n in accompaniment)
        heard |= {(n.program, n.drum) for n in accompaniment}
        live.close_bar([LiveNote(bar * BAR + k * TPQ, bar * BAR + k * TPQ + 300, 72 + k, 90) for k in range(4)])
        assert live.fed == [int(t) for t in reference(tokenizer, live, bar + 1).ids]
    assert heard <= {(t.program, t.is_drum) for t in example.tracks}


def test_an_accompaniment_does_not_fold_the_players_instrument_into_the_band(models, monkeypatch):
    """Folded, the mass of the player's (forbidden) piano would go to the band's instruments of
    its family and double the player's part: an accompaniment samples without the fold, an
    answer with it."""
    import musegen.generation.live as live_module

    model, tokenizer = models["song"]
    asked = []
    real_generate = live_module.generate

    def spy(model, tokenizer, prompt, settings, **kwargs):
        asked.append(settings.fold_instruments)
        return real_generate(model, tokenizer, prompt, settings, **kwargs)

    monkeypatch.setattr(live_module, "generate", spy)
    backing = [LiveNote(k * TPQ, k * TPQ + 200, 48 + k % 5, 80, 33) for k in range(8)]  # a bass, two bars
    live = Live(model, tokenizer, SETTINGS, bpm=110, program=0, backing=backing, backing_bars=2)
    live.accompany()
    live.answer(1)
    assert SETTINGS.fold_instruments and asked == [False, True]


def test_live_play_refuses_in_one_line_what_it_cannot_do(models):
    model, tokenizer = models["song"]
    with pytest.raises(ConfigError, match="other instruments"):
        live = Live(model, tokenizer, SETTINGS)
        live.close_bar([LiveNote(0, 200, 60, 80)])
        live.accompany()
    with pytest.raises(ConfigError, match="nothing has been played"):
        Live(model, tokenizer, SETTINGS).answer(1)
    pop_model, pop = models["pop"]
    with pytest.raises(MusegenError) as refused:
        Live(pop_model, pop, SETTINGS, meter=(3, 4))
    assert "\n" not in str(refused.value)
    groove_model, groove = load_checkpoint(REPO / "checkpoints" / "groove")[:2]
    with pytest.raises(ConfigError, match="grid within bars"):
        Live(groove_model, groove, SETTINGS)
    basses = tokenizer.program_ids[[p == 33 for p, _ in tokenizer.programs]]
    assert np.array_equal(tokenizer.program_token_ids(33), basses) and len(basses) == 4
