"""--keep-tracks: a track (a groove role) the prompt's last bars play is drawn back in once it has
been silent for a whole bar, by a boost on its tokens that grows with every further silent bar."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import REPO
from test_song_tokenizer import TPQ, built

from musegen.checkpoint import load_checkpoint
from musegen.generation.constraints import KeepTracks, Row, Run
from musegen.generation.loop import constraint_chain, generate
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.music.notes import Track
from musegen.tokenizers import tokenizer_from_dict

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DDTBL3 = REPO / "tests" / "data" / "keep-tracks" / "freedoom2_D_DDTBL3.mid"
DOOM2 = REPO / "tests" / "data" / "keep-tracks" / "freedoom2_D_DOOM2.mid"


def bar_notes(bars, pitch):
    return [(4 * bar * TPQ, 4 * bar * TPQ + TPQ, pitch, 80) for bar in bars]


@pytest.fixture()
def walked(tmp_path):
    """A 4-bar prompt (piano in every bar, bass in the last two, strings in the first only) and a
    function that appends tokens to its row and gives the boost on each track token."""
    tok = tokenizer_from_dict({"kind": "song"})
    path = tmp_path / "prompt.mid"
    tracks = [
        (Track("piano", 0, False), bar_notes(range(4), 72)),
        (Track("bass", 33, False), bar_notes([2, 3], 40)),
        (Track("strings", 48, False), bar_notes([0], 60)),
    ]
    path.write_bytes(built(tracks, [(0, 4, 4)]))
    prompt = load_prompt(tok, path)
    grammar = tok.grammar()
    row = Row(ids=list(prompt.ids), base=len(prompt.ids), base_state=None, target_bar=None)
    run = Run(tokenizer=tok, grammar=grammar, budget=100, device=torch.device("cpu"))
    keep = KeepTracks(boost=2.0)
    program = {p: int(tok.program_token_ids(p)[0]) for p in (0, 33, 48)}

    def boosts(*tokens: str) -> dict[int, float]:
        row.ids += [tok.vocab.index(t) for t in tokens]
        logits = torch.zeros(1, tok.vocab_size)
        moved = keep.reweight(run, [row], logits, torch.ones_like(logits, dtype=torch.bool))
        return {p: float(moved[0, i]) for p, i in program.items()}

    return boosts


PIANO_BAR = ("TimeSig_4/4", "Position_0", "Program_0", "Pitch_72", "Velocity_12", "Duration_12", "Bar_None")


def test_a_kept_track_is_boosted_for_every_bar_past_the_first_it_misses(walked):
    assert walked() == {0: 0.0, 33: 0.0, 48: 0.0}  # the prompt ends in bar 4
    assert walked("Bar_None") == {0: 0.0, 33: 0.0, 48: 0.0}  # bar 5 begins
    assert walked(*PIANO_BAR) == {0: 0.0, 33: 2.0, 48: 0.0}  # bass silent through bar 5
    assert walked(*PIANO_BAR) == {0: 0.0, 33: 4.0, 48: 0.0}  # and 6
    # the bass plays in bar 7: no boost while the bar lasts nor in the next ...
    assert walked("TimeSig_4/4", "Position_0", "Program_33", "Pitch_40") == {0: 0.0, 33: 0.0, 48: 0.0}
    # ... while the piano, silent through bar 7, is boosted in its turn
    assert walked("Velocity_12", "Duration_12", "Bar_None") == {0: 2.0, 33: 0.0, 48: 0.0}
    # strings, silent since the prompt's first bar, are not among the tracks kept
    assert walked(*PIANO_BAR) == {0: 0.0, 33: 2.0, 48: 0.0}


def test_a_groove_role_is_kept_by_its_notes():
    """groove-dur has no bar lines nor track tokens: its bars are 4 beats of the shift clock and
    each note names its role, so a role's boost goes to all of its notes at once."""
    tok = tokenizer_from_dict({"kind": "groove-dur"})
    bar = ("TimeShift_1_0",) * 4  # 4 beats on
    note = {"bass": ("Note_1_40", "Duration_12"), "drums": ("Note_2_36",), "other": ("Note_3_60", "Duration_12")}
    # 3 bars: drums in the first only, other in the last two, bass in the last
    prompt = ("Start", *note["drums"], *bar, *note["other"], *bar, *note["bass"], *note["other"], *bar)
    row = Row(ids=[tok.vocab.index(t) for t in prompt], base=len(prompt), base_state=None, target_bar=None)
    run = Run(tokenizer=tok, grammar=tok.grammar(), budget=100, device=torch.device("cpu"))
    keep = KeepTracks(boost=2.0)

    def boosts(*tokens: str) -> dict[str, set[float]]:
        row.ids += [tok.vocab.index(t) for t in tokens]
        logits = torch.zeros(1, tok.vocab_size)
        moved = keep.reweight(run, [row], logits, torch.ones_like(logits, dtype=torch.bool))[0]
        roles = {"bass": moved[:128], "drums": moved[128:256], "other": moved[256:384], "rest": moved[384:]}
        return {role: set(values.tolist()) for role, values in roles.items()}

    none = {"bass": {0.0}, "drums": {0.0}, "other": {0.0}, "rest": {0.0}}
    assert boosts() == none  # bar 4 begins
    assert boosts(*note["other"], *bar) == {**none, "bass": {2.0}}  # bass silent through bar 4
    assert boosts(*bar) == {**none, "bass": {4.0}, "other": {2.0}}  # both through bar 5; drums not kept
    assert boosts(*note["bass"]) == {**none, "other": {2.0}}  # the bass plays in bar 6


def test_the_chain_holds_it_by_default_and_not_at_zero():
    assert any(isinstance(c, KeepTracks) and c.boost == 3.0 for c in constraint_chain(SampleSettings()))
    assert not any(isinstance(c, KeepTracks) for c in constraint_chain(SampleSettings(keep_tracks=0)))


def silent_tracks(tok, prompt, samples) -> int:
    """(sample, track) pairs where a track of the prompt's last 2 bars plays no note after it."""
    bars = tok.bar_starts(prompt.ids)
    tail = {t for t in prompt.ids[bars[-3] :] if tok.track_marks.track_of[t] >= 0}
    return sum(t not in s.ids[len(prompt.ids) :].tolist() for s in samples for t in tail)


def test_the_song_model_keeps_a_real_tunes_tracks_playing():
    """A held-out Freedoom tune, a pickup bar and 4 bars in, 8 out: the shipped model alone lets
    tracks of the prompt's last bars (timpani among them) fall silent for all 8 bars; kept, every
    one plays on (instruments not folded, which keeps the timpani by itself:
    test_fold_instruments)."""
    model, tok, _, _ = load_checkpoint(REPO / "checkpoints" / "song")
    prompt = load_prompt(tok, DDTBL3, bars=5)

    def silent(keep: float) -> int:
        settings = SampleSettings(
            bars=8, num_samples=2, seed=0, keep_tracks=keep, fold_instruments=False, cache=0.0, precision="fp32"
        )  # the model alone: its default cache, copying the prompt's bars, keeps them playing too
        samples, stats = generate(model, tok, prompt, settings, progress=False)
        assert stats["invalid"] == 0
        return silent_tracks(tok, prompt, samples)

    assert silent(0.0) >= 2
    assert silent(3.0) == 0


def test_the_groove_model_keeps_a_real_songs_bass_playing():
    """A Freedoom song outside MMA whose bass plays a note or two in each of its first bars, those
    3 bars in, 8 out, the groove model's default sampling (its suffix cache at 0.95): without
    keeping, the cache's copy of the prompt lets the bass fall silent in every continued bar of
    both samples; kept, it comes back in most."""
    model, tok, _, _ = load_checkpoint(REPO / "checkpoints" / "groove-dur")
    prompt = load_prompt(tok, DOOM2, bars=3)
    assert {int(t) // 128 + 1 for t in prompt.ids if t < 384} == {1, 2, 3}  # bass, drums, other

    def silent_bass_bars(keep: float) -> int:
        settings = SampleSettings(bars=8, num_samples=2, seed=0, keep_tracks=keep, precision="fp32")
        samples, stats = generate(model, tok, prompt, settings, progress=False)
        assert stats["invalid"] == 0
        silent = 0
        for sample in samples:
            new = np.arange(len(prompt.ids), len(sample.ids))
            bass_bars = set((tok.onsets(sample.ids)[new][sample.ids[new] < 128] // 4).astype(int).tolist())
            silent += sum(bar not in bass_bars for bar in range(3, 11))
        return silent

    assert silent_bass_bars(0.0) >= 14  # 16 when written: every continued bar of both samples
    assert silent_bass_bars(3.0) <= 8  # 6 when written (the real bars: 2 of 8 without bass)
