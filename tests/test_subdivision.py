"""--subdivision: song continuations start their notes on the subdivisions of the beat that the
prompt's notes use (16ths, triplets or both), or anywhere the tokens can (`any`). An untrained
model spreads its mass over all twelve positions of a beat, so it shows what the mask holds back."""

from __future__ import annotations

import pytest
from conftest import REPO
from test_cli_hostile import run_cli
from test_song_tokenizer import TPQ, built
from tiny_models import tiny_model

from musegen.generation.loop import generate
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.music.notes import Track

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FREEDOOM = REPO / "tests" / "data" / "multitrack" / "freedoom2_D_IN_CIT.mid"


@pytest.fixture(scope="module")
def song():
    return tiny_model("song", seed=2)


def phases_played(tok, ids) -> set[int]:
    """Where in its beat (12ths of a quarter) each Position token of `ids` falls."""
    position_ids, phases = tok.position_phases()
    phase_of = dict(zip(position_ids.tolist(), phases.tolist()))
    return {phase_of[t] for t in ids if t in phase_of}


def continued(song, prompt, subdivision: str) -> set[int]:
    model, tok = song
    settings = SampleSettings(bars=4, num_samples=2, seed=5, subdivision=subdivision)
    samples, stats = generate(model, tok, prompt, settings, progress=False)
    assert stats["invalid"] == 0
    return set().union(*(phases_played(tok, s.ids[len(prompt.ids) :].tolist()) for s in samples))


def prompt_of(song, onsets_in_beats, tmp_path):
    """A one-track prompt of 2 bars of 4/4 with a note at each onset (in beats) of every bar."""
    notes = [
        (round((4 * bar + at) * TPQ), round((4 * bar + at) * TPQ) + TPQ // 4, 60 + k % 5, 80)
        for bar in range(2)
        for k, at in enumerate(onsets_in_beats)
    ]
    path = tmp_path / "prompt.mid"
    path.write_bytes(built([(Track("piano", 0, False), notes)], [(0, 4, 4)]))
    return load_prompt(song[1], path)


def test_a_straight_real_tune_is_continued_on_its_16ths(song):
    prompt = load_prompt(song[1], FREEDOOM, bars=4)
    assert phases_played(song[1], prompt.ids) <= {0, 3, 6, 9}  # the tune itself is straight
    assert continued(song, prompt, "prompt") <= {0, 3, 6, 9}
    assert continued(song, prompt, "any") - {0, 3, 6, 9}  # unheld, the untrained model plays off them


@pytest.mark.parametrize(
    "onsets, kept",
    [
        ([0, 1 / 3, 2 / 3, 1, 2, 3], {0, 4, 8}),  # triplet 8ths
        ([0, 0.25, 1 / 3, 2, 2.5], {0, 3, 4, 6, 8, 9}),  # both
    ],
)
def test_a_prompt_in_triplets_or_both_keeps_its_own(song, tmp_path, onsets, kept):
    prompt = prompt_of(song, onsets, tmp_path)
    assert phases_played(song[1], prompt.ids) <= kept
    played = continued(song, prompt, "prompt")
    assert played <= kept and len(played) > 1


def test_a_prompt_on_finer_subdivisions_or_none_leaves_every_position(song, tmp_path):
    sextuplets = prompt_of(song, [0, 1 / 6, 0.5, 5 / 6], tmp_path)
    assert phases_played(song[1], sextuplets.ids) == {0, 2, 6, 10}
    assert continued(song, sextuplets, "prompt") - {0, 3, 4, 6, 8, 9}
    empty = load_prompt(song[1], None)
    assert continued(song, empty, "prompt") - {0, 3, 4, 6, 8, 9}


def test_a_subdivision_that_is_neither_prompt_nor_any_is_refused_in_one_line(tmp_path, capsys):
    args = ["sample", "-c", "song", "--prompt", FREEDOOM, "--bars", 2, "--subdivision", "8ths", "--out", tmp_path]
    code, err = run_cli(args, capsys)
    assert code == 2 and len(err) == 1 and "--subdivision" in err[0] and "one of prompt, any" in err[0]
    assert not list(tmp_path.iterdir())
