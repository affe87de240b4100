"""--tempo: a continuation holds the prompt's last tempo by default, changes it freely only when
asked, or holds a tempo given in BPM; on real POP909 prompts with untrained models, which draw
tempo tokens at random and so change the tempo often when left free."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import DATA
from test_cli_hostile import run_cli
from tiny_models import tiny_checkpoint, tiny_model

from musegen.errors import ConfigError
from musegen.generation.constraints import HoldTempo, Row, Run
from musegen.generation.loop import generate
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.music.notes import NoteTable

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SONG = DATA / "pop909" / "001" / "001.mid"


@pytest.fixture(scope="module")
def remi():
    """An untrained model that loves tempo changes: its tempo tokens' logits raised by 6, so that
    left free it writes a new tempo on most beats that may have one."""
    model, tok = tiny_model("remi", seed=3)
    with torch.no_grad():
        model.head.bias[torch.from_numpy(tok.tempo_token_ids())] += 6.0
    return model, tok


def tempos_after(piece: NoteTable, tick: int) -> list[float]:
    return [bpm for at, bpm in piece.tempos if at >= tick]


def continue_song(remi, tempo: str, bars: int = 8):
    model, tok = remi
    prompt = load_prompt(tok, SONG, bars=4)
    settings = SampleSettings(bars=bars, num_samples=2, seed=11, tempo=tempo)
    samples, _ = generate(model, tok, prompt, settings, progress=False)
    return tok, prompt, samples


def generated_tempo_ids(tok, prompt, sample) -> list[int]:
    tempos = set(tok.tempo_token_ids().tolist())
    return [t for t in sample.ids[len(prompt.ids) :].tolist() if t in tempos]


def test_by_default_the_continuation_holds_the_prompts_last_tempo(remi):
    tok, prompt, samples = continue_song(remi, "keep")
    last = [t for t in prompt.ids.tolist() if t in set(tok.tempo_token_ids().tolist())][-1]
    assert tok.vocab[last].startswith("Tempo_")
    for sample in samples:
        drawn = generated_tempo_ids(tok, prompt, sample)
        assert len(drawn) > 8 and set(drawn) == {last}  # written again and again: always the same
        bpm = float(tok.vocab[last].split("_")[1])
        end = int(prompt.piece.end.max())
        written = tempos_after(tok.decode(sample.ids), end)  # a repeated tempo is written 1 us apart
        assert written and max(abs(b - bpm) for b in written) < 1e-3 * bpm


def test_free_lets_the_model_change_the_tempo_and_a_bpm_holds_that_one(remi):
    tok, prompt, samples = continue_song(remi, "free")
    assert all(len(set(generated_tempo_ids(tok, prompt, s))) > 8 for s in samples)
    tok, prompt, samples = continue_song(remi, "131")
    nearest = tok.tempo_token(131)
    assert tok.vocab[nearest] == "Tempo_131"
    assert all(set(generated_tempo_ids(tok, prompt, s)) == {nearest} for s in samples)
    assert tok.vocab[tok.tempo_token(400)] == f"Tempo_{max(tok.tempos)}"  # beyond the tokens: the nearest


def test_without_a_prompt_the_first_tempo_drawn_is_held(remi):
    model, tok = remi
    samples, _ = generate(model, tok, load_prompt(tok, None), SampleSettings(bars=6, seed=2), progress=False)
    drawn = [t for t in samples[0].ids.tolist() if t in set(tok.tempo_token_ids().tolist())]
    assert len(drawn) > 1 and len(set(drawn)) == 1


def test_the_hold_narrows_only_the_tempo_tokens_and_gives_way_when_nothing_else_is_left(remi):
    _, tok = remi
    tempos = tok.tempo_token_ids()
    run = Run(tok, tok.grammar(), 10, None)
    row = Row(ids=[int(tempos[5]), 3], base=2, base_state=None, target_bar=None)
    everything = np.ones(tok.vocab_size, dtype=bool)
    held = HoldTempo().allow(run, row, everything)
    assert held[tempos].tolist() == [i == 5 for i in range(len(tempos))]
    assert np.array_equal(np.delete(held, tempos), np.delete(everything, tempos))
    row.ids.append(int(tempos[9]))  # the row changed tempo (read on from where the hold stopped)
    hold = HoldTempo()
    hold.allow(run, replace(row, ids=row.ids[:2]), everything)
    assert np.flatnonzero(hold.allow(run, row, everything)[tempos]).tolist() == [9]
    only_tempos = np.zeros(tok.vocab_size, dtype=bool)
    only_tempos[tempos[[1, 2]]] = True
    assert np.array_equal(HoldTempo().allow(run, row, only_tempos), only_tempos)  # held one not allowed
    nothing_held = Row(ids=[3], base=1, base_state=None, target_bar=None)
    assert HoldTempo().allow(run, nothing_held, everything) is everything


@pytest.mark.parametrize("value", ["fast", "0", "1001", "nan", "", "-96"])
def test_a_tempo_that_is_neither_keep_free_nor_a_bpm_is_refused_in_one_line(value):
    with pytest.raises(ConfigError, match="--tempo must be keep, free or a tempo in BPM within 1..1000"):
        SampleSettings(bars=1, tempo=value).resolved()


def test_a_bpm_for_tokens_that_hold_no_tempo_is_refused_and_keep_is_a_groove_s_own(tmp_path, capsys):
    _, groove = tiny_model("groove")
    assert not len(groove.tempo_token_ids())
    with pytest.raises(ConfigError, match="--tempo 120: the groove tokens hold no tempo"):
        SampleSettings(bars=1, tempo="120").resolved(groove)
    assert SampleSettings(bars=1).resolved(groove).tempo == "keep"
    checkpoint = tiny_checkpoint("remi", tmp_path / "remi")
    code, err = run_cli(["sample", "-c", checkpoint, "--bars", "1", "--tempo", "brisk", "--out", tmp_path], capsys)
    assert code == 2 and len(err) == 1 and "--tempo must be keep, free or a tempo in BPM" in err[0], err


def test_a_groove_continuation_plays_on_in_the_prompts_tempo():
    model, tok = tiny_model("groove")
    prompt = load_prompt(tok, DATA / "multitrack" / sorted(p.name for p in (DATA / "multitrack").glob("*.mid"))[0], 2)
    samples, _ = generate(model, tok, prompt, SampleSettings(bars=4, seed=1), progress=False)
    piece = tok.decode(samples[0].ids, prompt.meta)
    prompt_tempo = prompt.piece.tempos[-1][1]
    assert piece.tempos and {bpm for _, bpm in piece.tempos[-1:]} == {prompt_tempo}
