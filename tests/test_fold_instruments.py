"""--fold-instruments: what the model gives an instrument the prompt lacks goes to the prompt's
tracks of that instrument's General MIDI family, before the mask drops it."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO

from musegen.checkpoint import load_checkpoint
from musegen.generation.constraints import FoldInstruments, Run
from musegen.generation.loop import constraint_chain, generate
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.tokenizers import tokenizer_from_dict
from musegen.tokenizers.song_vocab import SLOTS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

THEDA2 = REPO / "tests" / "data" / "multitrack" / "freedoom2_D_THEDA2.mid"


def test_a_forbidden_instruments_mass_moves_to_its_family_in_the_models_proportions():
    tok = tokenizer_from_dict({"kind": "song"})
    run = Run(tokenizer=tok, grammar=tok.grammar(), budget=100, device=torch.device("cpu"))
    track = {(p, s): int(tok.program_token_ids(p)[s]) for p in range(128) for s in range(SLOTS)}
    logits = torch.randn(1, tok.vocab_size, generator=torch.Generator().manual_seed(0)) * 2
    allowed = torch.zeros_like(logits, dtype=torch.bool)
    # the prompt's band: a slap bass (37), two distortion guitars (30, slot 0 and 1), drums; the
    # bar line and the positions stay allowed
    band = [track[37, 0], track[30, 0], track[30, 1], int(tok.program_token_ids(-1)[0])]
    allowed[0, band + [tok.bar_id, *tok.position_ids.tolist()]] = True
    before = logits.softmax(-1)[0].double()
    after = FoldInstruments().reweight(run, [None], logits, allowed).double().exp()[0]

    def family(first: int) -> list[int]:
        return [track[p, s] for p in range(first, first + 8) for s in range(SLOTS)]

    basses, guitars = family(32), family(24)
    forbidden_bass = sum(before[i] for i in basses if i != track[37, 0])
    assert after[track[37, 0]] == pytest.approx(before[track[37, 0]] + forbidden_bass)
    guitar_mass = before[[track[30, 0], track[30, 1]]]
    moved = sum(before[i] for i in guitars if i not in (track[30, 0], track[30, 1]))
    expected = guitar_mass + moved * guitar_mass / guitar_mass.sum()  # in the model's proportions
    assert after[[track[30, 0], track[30, 1]]].tolist() == pytest.approx(expected.tolist())
    assert all(after[i] == 0 for i in basses + guitars if i not in band)
    untouched = [i for i in range(tok.vocab_size) if i not in basses + guitars]  # organs, drums, bar line, ...
    assert after[untouched].tolist() == pytest.approx(before[untouched].tolist())
    assert float(after.sum()) == pytest.approx(1.0)
    # nothing forbidden in a family the band plays: nothing moves
    everything = torch.ones_like(allowed)
    assert torch.equal(FoldInstruments().reweight(run, [None], logits, everything), logits)


def test_the_chain_folds_by_default_and_not_when_asked_or_without_instruments():
    assert any(isinstance(c, FoldInstruments) for c in constraint_chain(SampleSettings()))
    assert not any(isinstance(c, FoldInstruments) for c in constraint_chain(SampleSettings(fold_instruments=False)))
    assert not any(isinstance(c, FoldInstruments) for c in constraint_chain(SampleSettings(), under_grammar=True))
    assert tokenizer_from_dict({"kind": "remi"}).instrument_families is None


def test_the_song_model_keeps_a_real_tunes_brass_playing():
    """A Freedoom tune, a pickup bar and 4 bars in, 8 out, without --keep-tracks: its brass
    section plays in the prompt's last bars; the shipped model asks for other brass as well, which
    the band mask drops, and one of two samples leaves the brass silent for all 8 bars; folded,
    both play it in most bars. (The stage-5 model did the same to a timpani: the card.) Without
    the suffix cache, whose copying of the prompt's brass would hide what the fold does."""
    model, tok, _, _ = load_checkpoint(REPO / "checkpoints" / "song")
    prompt = load_prompt(tok, THEDA2, bars=5)
    brass = int(tok.program_token_ids(61)[0])
    assert brass in prompt.ids[tok.bar_starts(prompt.ids)[-3] :]

    def brass_bars(fold: bool) -> list[int]:
        settings = SampleSettings(
            bars=8, num_samples=2, seed=0, keep_tracks=0, fold_instruments=fold, cache=0.0, precision="fp32"
        )  # the model's own distribution: its default cache would copy the brass back in
        samples, stats = generate(model, tok, prompt, settings, progress=False)
        assert stats["invalid"] == 0
        out = []
        for sample in samples:
            bars, played = 0, set()
            for token in sample.ids[len(prompt.ids) :].tolist():
                bars += token == tok.bar_id
                if token == brass:
                    played.add(bars)
            out.append(len(played))
        return out

    assert min(brass_bars(False)) == 0
    assert min(brass_bars(True)) >= 4
