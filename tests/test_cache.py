"""The sampler's suffix cache (musegen/generation/cache.py): what it proposes, the mixture it
makes with the model, and what the shipped groove model keeps of a groove it was given, alone and with it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import DATA
from tiny_models import tiny_checkpoint

from musegen.checkpoint import load_checkpoint
from musegen.cli import main
from musegen.errors import ConfigError
from musegen.evaluation.run_continuation import ContinuationSettings, evaluate_continuation
from musegen.evaluation.run_copy import prepare
from musegen.generation.cache import SuffixCache, cache_probs, continuations, loop_ends
from musegen.generation.constraints import Row
from musegen.generation.loop import constraint_chain, generate
from musegen.generation.prompt import load_prompt, prompt_from_ids
from musegen.generation.settings import SampleSettings
from musegen.metrics.copy_score import CopyScore
from musegen.metrics.metric import Span
from musegen.music.grooves import built_patterns
from musegen.tokenizers import tokenizer_from_dict

GROOVE_DUR = Path(__file__).resolve().parents[1] / "checkpoints" / "groove-dur"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_longest_earlier_match_decides_what_follows():
    #              0  1  2  3  4  5  6  7  8  9 10 11
    ids = np.array([1, 2, 3, 9, 4, 2, 3, 7, 5, 1, 2, 3])
    assert continuations(ids, 1).tolist() == [9]  # "1 2 3" occurred once, then 9 ("2 3" also before 7)
    assert continuations(ids[:8], 1).tolist() == []  # 7 never occurred before
    assert continuations(ids[:7], 1).tolist() == [9]  # "2 3" occurred at 1-2, then 9
    assert continuations(ids[:7], 3).tolist() == []  # "4 2 3" did not occur before
    assert continuations(np.array([4, 4, 4, 4]), 1).tolist() == [4]  # overlapping runs count
    assert continuations(np.array([8]), 1).tolist() == []
    loop = np.tile([10, 11, 12, 11], 5)  # a loop: every position's continuation is the loop's next
    for n in range(6, len(loop)):  # (at 5, only a 1-token match)
        assert set(continuations(loop[:n], 2).tolist()) == {loop[n % 4]}


def naive_continuations(ids: list[int], shortest: int, longest: int) -> list[int]:
    """The definition, spelt out: for each length from the longest down, the tokens after every
    earlier occurrence of the suffix of that length; the first length that has any."""
    n = len(ids)
    for k in range(min(longest, n - 1), shortest - 1, -1):
        suffix = ids[n - k :]
        found = [ids[e + 1] for e in range(k - 1, n - 1) if ids[e - k + 1 : e + 1] == suffix]
        if found:
            return found
    return []


@pytest.mark.parametrize("alphabet", [2, 3, 6])
def test_the_vectorised_search_agrees_with_the_definition(alphabet):
    rng = np.random.default_rng(alphabet)
    for _ in range(300):
        ids = rng.integers(0, alphabet, size=int(rng.integers(1, 60))).tolist()
        for shortest, longest in ((1, 64), (3, 64), (1, 5)):
            got = continuations(np.array(ids), shortest, longest).tolist()
            assert got == naive_continuations(ids, shortest, longest), (ids, shortest, longest)


def test_with_keys_tokens_of_one_key_match_and_the_tokens_themselves_are_proposed():
    rng = np.random.default_rng(0)
    keys = np.array([0, 1, 2, 2, 2, 3])  # 2, 3 and 4 are one key
    for _ in range(300):
        ids = rng.integers(0, 6, size=int(rng.integers(1, 60)))
        keyed = naive_continuations(keys[ids].tolist(), 2, 64)  # the keys that followed ...
        got = continuations(ids, 2, keys=keys)  # ... are the keys of the ids proposed
        assert keys[got].tolist() == keyed
        assert set(got.tolist()) <= set(ids.tolist())
    assert continuations(np.array([1, 2, 5, 1, 4]), 2, keys=keys).tolist() == [5]  # "1 2" matches "1 4"


def test_song_tokens_are_matched_through_played_velocities_and_lengths():
    """A real multi-track tune with every velocity drawn at random, as a humanised file has them:
    matched on every token, the cache gives the real next token 0.59 of its mass over the second
    half (a match breaks at every velocity); matched as the song tokens say, 0.95."""
    tok = tokenizer_from_dict({"kind": "song"})
    ids = np.asarray(tok.encode(DATA / "multitrack" / "freedoom1_D_E1M6.mid").ids)
    velocity = tok.velocity_of[ids] >= 0
    ids[velocity] = np.random.default_rng(0).choice(tok.velocity_ids, velocity.sum())
    steps = [i for i in range(len(ids) // 2, len(ids) - 1) if not velocity[i + 1]]  # velocities are noise

    def mass_on_the_next(keys, shortest) -> float:
        found = [continuations(ids[: i + 1], shortest, keys=keys) for i in steps]
        return float(np.mean([np.mean(f == ids[i + 1]) if len(f) else 0.0 for f, i in zip(found, steps)]))

    keys, shortest = tok.cache_match
    assert shortest == 6 and set(keys[tok.velocity_ids]) == {keys[tok.velocity_ids[0]]}
    assert mass_on_the_next(keys, shortest) > 0.9
    assert mass_on_the_next(None, 1) < 0.65
    assert mass_on_the_next(None, shortest) < 0.2  # exact matches of 6 tokens are rare here (0.12)


def test_a_bar_is_not_copied_straight_after_itself_more_often_than_the_prompt_does():
    """Bars open with token 0. After bars A B A B, a bar that begins as B did would be B again
    right after B, which the prompt never plays: the places that would copy it are barred, and the
    cache proposes nothing. A prompt that plays one bar twice in a row allows a second B."""
    ids = np.array([0, 5, 6, 0, 7, 8, 0, 5, 6, 0, 7, 8, 0, 7])
    assert cache_probs(ids, 1, 10).tolist() == [0] * 8 + [1, 0]  # unguarded: B's 8 after its 7
    assert loop_ends(ids, 0, given=len(ids)).tolist() == [4, 10]  # the 7 of each B
    assert cache_probs(ids, 1, 10, barred=loop_ends(ids, 0, given=len(ids))) is None
    twice = np.array([0, 7, 8, 0, 7, 8, 0, 5, 6, 0, 7, 8, 0, 7])
    assert loop_ends(twice, 0, given=9) is None  # B B in the prompt: one B may follow B
    assert loop_ends(np.append(twice, [8, 0, 7]), 0, given=9).tolist() == [1, 4, 10, 13]  # not a third


def test_two_bars_are_not_played_in_turn_longer_than_the_prompt_does():
    """Bars open with token 0. After a prompt of bars A B C D, a bar that begins as C did would
    make C D C, two bars in turn, which the prompt never plays: C's places are barred, A's are
    not. A prompt that plays C D C D allows the continuation C D C D, not C D C D C."""
    a, b, c, d = [1, 2, 9], [3, 4, 9], [5, 6, 9], [7, 8, 9]
    prompt = [0, *a, 0, *b, 0, *c, 0, *d, 0]  # ends with the next bar's token, as a prompt does
    again = np.array([*prompt, 5])
    assert cache_probs(again, 1, 10).tolist() == [0] * 6 + [1, 0, 0, 0]  # unguarded: C's 6 after its 5
    assert loop_ends(again, 0, given=len(prompt)).tolist() == [9]  # the 5 of C
    assert cache_probs(again, 1, 10, barred=loop_ends(again, 0, given=len(prompt))) is None
    assert loop_ends(np.array([*prompt, 1]), 0, given=len(prompt)) is None  # A again
    turns = [0, *a, 0, *c, 0, *d, 0, *c, 0, *d, 0, *b, 0]
    assert loop_ends(np.array([*turns, *c, 0, *d, 0, *c, 0, 7]), 0, given=len(turns)) is None
    fifth = np.array([*turns, *c, 0, *d, 0, *c, 0, *d, 0, 5])
    assert loop_ends(fifth, 0, given=len(turns)).tolist() == [5, 13, 25, 33]


def test_a_phrase_of_four_bars_goes_round_once_more_than_the_prompt_plays_it():
    """Songs repeat their phrases: after a prompt of bars A B C D, the cache may play A B C D
    again, but not a third time round."""
    a, b, c, d = [1, 2, 9], [3, 4, 9], [5, 6, 9], [7, 8, 9]
    prompt = [0, *a, 0, *b, 0, *c, 0, *d, 0]
    assert loop_ends(np.array([*prompt, 1]), 0, given=len(prompt)) is None
    third = np.array([*prompt, *a, 0, *b, 0, *c, 0, *d, 0, 1])
    assert loop_ends(third, 0, given=len(prompt)).tolist() == [1, 17]  # the 1 of each A


def test_cache_probabilities_count_every_continuation_of_the_longest_match():
    ids = np.array([5, 6, 1, 5, 6, 2, 5, 6, 1, 0, 5, 6])  # "5 6" was followed by 1, 2, 1; "0 5 6" is new
    probs = cache_probs(ids, 1, width=8)
    assert probs.tolist() == pytest.approx([0, 2 / 3, 1 / 3, 0, 0, 0, 0, 0])
    assert cache_probs(ids, 3, width=8) is None


def test_the_mixture_is_the_weighted_sum_over_the_allowed_ids_and_the_model_alone_elsewhere():
    torch.manual_seed(0)
    logits = torch.randn(3, 8)
    allowed = torch.ones(3, 8, dtype=torch.bool)
    allowed[0, 2] = False  # "5 6" was followed by 1 and 2; 2 is not allowed, so the cache says 1
    rows = [
        Row([5, 6, 1, 5, 6, 2, 5, 6], 8, None, None),
        Row([3, 4], 2, None, None),  # no earlier match: the model alone
        Row([5, 6, 1, 5, 6], 5, None, None, done=True),  # done: untouched
    ]
    run = SimpleNamespace(tokenizer=SimpleNamespace(cache_match=(None, 1), track_marks=None))  # every token counts
    out = SuffixCache(0.3).reweight(run, rows, logits, allowed)
    p = logits.softmax(-1)
    expected = 0.7 * p[0] + 0.3 * torch.tensor([0, 1.0, 0, 0, 0, 0, 0, 0])
    assert out[0].exp() == pytest.approx(expected, abs=1e-6)
    assert float(out[0].exp().sum()) == pytest.approx(1.0, abs=1e-6)
    for b in (1, 2):
        assert out[b].exp() == pytest.approx(p[b], abs=1e-6)
    only_forbidden = torch.ones(3, 8, dtype=torch.bool)
    only_forbidden[0, 1:3] = False  # nothing the cache proposes is allowed: the model alone
    assert SuffixCache(1.0).reweight(run, rows, logits, only_forbidden)[0].exp() == pytest.approx(p[0], abs=1e-6)


def test_the_weight_is_checked_and_recorded_and_zero_leaves_the_chain_as_it_was():
    chain = [type(c).__name__ for c in constraint_chain(SampleSettings(length=8, cache=0.5).resolved())]
    assert chain == [
        "GrammarMask",
        "HoldTempo",
        "KeepSubdivision",
        "HoldEnds",
        "Finish",
        "FoldInstruments",
        "SuffixCache",
        "KeptShare",
        "KeepTracks",
    ]
    assert SuffixCache(0.5) in constraint_chain(SampleSettings(length=8, cache=0.5).resolved())
    assert not any(isinstance(c, SuffixCache) for c in constraint_chain(SampleSettings(length=8).resolved()))
    assert SampleSettings(length=8).resolved().cache == 0.0
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="--cache must be within"):
            SampleSettings(length=8, cache=bad).resolved()


@pytest.fixture(scope="module")
def groove_dur():
    model, tokenizer, _, _ = load_checkpoint(GROOVE_DUR)
    return model, tokenizer


def copy_scores(model, tokenizer, cache: float | None) -> list[float]:
    """The mean copy score (over roles) of 2 continuations of 4 bars of each built groove."""
    scores = []
    for i, pattern in enumerate(built_patterns()):
        item = prepare(tokenizer, pattern)
        settings = SampleSettings(bars=4, num_samples=2, seed=i, cache=cache)
        samples, stats = generate(model, tokenizer, item.prompt, settings, progress=False)
        assert stats["invalid"] == 0
        for sample in samples:
            notes = tokenizer.decode(sample.ids)
            by_role = CopyScore().compute(Span(notes, item.prompt.bars, 4, {"loop": item.loop}))
            scores.append(np.nanmean([by_role[role] for role in tokenizer.roles]))
    return scores


def test_the_shipped_groove_model_keeps_a_built_groove_alone_and_with_the_cache(groove_dur):
    """The grooves built in musegen (drums, bass figure, chord rhythm; none from the corpus): the
    model alone (positions in beats and an exact window; docs/experiments/groove-musical-time)
    repeats three quarters of each bar (0.77 when written; the previous, token-position model
    0.34), every groove more than 0.6; with its checkpoint's default cache weight (0.95) every
    continuation repeats its groove exactly (1.0 when written)."""
    assert groove_dur[1].sampling_defaults["cache"] == 0.95
    alone = copy_scores(*groove_dur, cache=0.0)
    cached = copy_scores(*groove_dur, cache=None)
    assert np.mean(alone) > 0.6
    assert (np.reshape(alone, (-1, 2)).mean(1) > 0.6).all()
    assert np.mean(cached) > 0.9 and min(cached) > np.mean(alone)


def test_with_its_default_cache_the_shipped_song_model_plays_the_prompts_bars_again():
    """Two real Freedoom tunes, a pickup bar and 4 bars in, 8 out: alone the model never plays a
    bar of the prompt again (onsets, tracks and pitches; velocities and lengths aside); with its
    checkpoint's default cache (0.95) most of its bars are the prompt's (the real continuations
    repeat 2 and 4 of their 8)."""
    model, tok, _, _ = load_checkpoint(GROOVE_DUR.parent / "song")
    assert tok.sampling_defaults["cache"] == 0.95
    keys, _ = tok.cache_match

    def bars(ids) -> list[tuple]:
        starts = [*tok.bar_starts(ids), len(ids)]
        return [tuple(keys[ids[a:b]].tolist()) for a, b in zip(starts[:-1], starts[1:])]

    repeats = {}
    for name in ("freedoom1_D_E1M6", "freedoom1_D_E2M3"):
        prompt = load_prompt(tok, DATA / "multitrack" / f"{name}.mid", bars=5)
        heard = bars(np.asarray(prompt.ids))
        for cache in (0.0, None):
            settings = SampleSettings(bars=8, num_samples=2, seed=0, cache=cache, precision="fp32")
            samples, _ = generate(model, tok, prompt, settings, progress=False)
            repeats[name, cache] = [sum(b in heard for b in bars(np.asarray(s.ids))[len(heard) :]) for s in samples]
    assert all(count == 0 for (_, cache), counts in repeats.items() if cache == 0.0 for count in counts)
    cached = [count for (_, cache), counts in repeats.items() if cache is None for count in counts]
    assert min(cached) >= 1 and sum(cached) >= 4 * 8 // 2  # half the bars of the four samples at least (19 of 32)


def oneills_tune(number: int, out: Path) -> Path:
    """Tune `number` of O'Neill's Music of Ireland (music21's corpus) as `data prepare
    music21-song` writes it: a fiddle, 120 BPM, its pickup a bar of its own."""
    corpus = pytest.importorskip("music21.corpus")
    from data_prep.scores import convert

    book = Path(corpus.__file__).parent / "oneills1850" / "0001-0050.abc"
    _, failed = convert((book, number, out, {"bpm": 120.0, "program": 40, "pickup": "bar"}))
    assert failed is None
    return out


def song_takes(prompt_of) -> list[list[tuple]]:
    """The shipped song model's two takes (8 bars, seed 0, fp32, its other defaults) of the
    prompt `prompt_of(tokenizer)` makes, each as its bars' cache keys (onsets, tracks, pitches)."""
    model, tok, _, _ = load_checkpoint(GROOVE_DUR.parent / "song")
    keys, _ = tok.cache_match
    settings = SampleSettings(bars=8, num_samples=2, seed=0, precision="fp32")
    takes = []
    for sample in generate(model, tok, prompt_of(tok), settings, progress=False)[0]:
        starts = [*tok.bar_starts(sample.ids), len(sample.ids)]
        takes.append([tuple(keys[sample.ids[a:b]].tolist()) for a, b in zip(starts[:-1], starts[1:])])
    return takes


def test_the_shipped_song_model_does_not_get_stuck_on_one_bar_of_a_fiddle_tune(tmp_path):
    """O'Neill's tune no. 11 (3/4, music21's corpus), a pickup bar and 4 bars in, 8 out, with the
    checkpoint's defaults: its last prompt bar ends as the bar before it did, so the cache copied
    that bar, then its copy, to the end (8 of 8 continued bars the same). Now no continued bar is
    the bar before it again (the prompt repeats none), and the continuation still plays the
    prompt's bars."""
    tune = oneills_tune(11, tmp_path / "tune.mid")
    for bars in song_takes(lambda tok: load_prompt(tok, tune, bars=5)):
        heard, continued = bars[:5], bars[5:]
        assert len(continued) == 8 and len(set(heard)) == 5
        assert not any(a == b for a, b in zip(bars[4:], continued))
        assert sum(bar in heard for bar in continued) >= 4


def test_the_shipped_song_model_does_not_alternate_two_bars_of_a_pop_song(pop909_dir):
    """POP909's song 006 as `data prepare pop909-song` encodes it, a pickup bar and 4 bars in, 8
    out, with the checkpoint's defaults: with a guard on one-bar loops alone, 7 of the 8 continued
    bars of both takes were the bar two before them again (the cache alternated the prompt's last
    two bars). Now none is (the prompt alternates none), nor the bar before, and the continuation
    still plays bars of the prompt."""
    from data_prep.common import Item
    from data_prep.pop909_song import Pop909Song

    def prompt_of(tok):
        song = pop909_dir / "006" / "006.mid"
        encoding = Pop909Song().encode(tok, Item(name="006", path=song, group="006"))
        return prompt_from_ids(tok, encoding.ids, 5, encoding.report)

    for bars in song_takes(prompt_of):
        heard, continued = bars[:5], bars[5:]
        assert len(continued) == 8 and len(set(heard)) == 5
        assert not any(bar in (bars[k - 1], bars[k - 2]) for k, bar in enumerate(continued, start=5))
        assert any(bar in heard for bar in continued)


def test_cli_takes_the_weight_and_refuses_nonsense_in_one_line(tmp_path, capsys):
    prompt = GROOVE_DUR.parent / "prompts" / "groove_rock.mid"
    args = ["sample", "-c", GROOVE_DUR, "--prompt", prompt, "--bars", "1", "--seed", "0", "--out", tmp_path]
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args + ["--cache", "2"]])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --cache must be within [0, 1], got 2.0"
    assert not any(tmp_path.iterdir())  # refused before anything was written
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args + ["--cache", "0.5"]])
    assert (exit_.value.code or 0) == 0
    assert "cache=0.5" in capsys.readouterr().out


def test_a_done_row_and_an_unmatched_one_pass_through_sampling(groove_dur):
    """Cache weight 1 with a prompt whose last tokens never occurred before still samples valid
    pieces: where the cache has nothing, the model draws."""
    model, tokenizer = groove_dur
    settings = SampleSettings(length=48, num_samples=2, seed=3, cache=1.0)
    item = prepare(tokenizer, built_patterns()[0])
    samples, stats = generate(model, tokenizer, item.prompt, settings, progress=False)
    assert stats["invalid"] == 0
    again, _ = generate(model, tokenizer, item.prompt, replace(settings, cache=0.0), progress=False)
    assert [s.ids.tolist() for s in samples] != [s.ids.tolist() for s in again]


def test_a_continuation_run_records_the_cache_it_sampled_with_and_resumes_only_with_it(tmp_path):
    """The checkpoint's default weight (its meta.sampling) is written into run.json, so a run made
    with another weight is refused instead of mixed in; a model that names none samples and
    records 0."""
    tune = sorted((DATA / "multitrack").glob("*.mid"))[0]
    folder = tmp_path / "tunes"
    folder.mkdir()
    (folder / tune.name).write_bytes(tune.read_bytes())

    def run(kind: str, out: str, cache: float | None):
        settings = ContinuationSettings(
            prompt_bars=2, sample=SampleSettings(bars=1, num_samples=1, seed=0, cache=cache)
        )
        meta = {"sampling": {"cache": 0.8}} if kind == "groove-dur" else None
        ckpt = tiny_checkpoint(kind, tmp_path / f"ckpt-{kind}", meta)
        evaluate_continuation(ckpt, folder, tmp_path / out, settings, device="cpu", progress=False)
        return json.loads((tmp_path / out / "run.json").read_text())

    assert run("groove-dur", "dur", None)["cache"] == 0.8
    assert run("groove-dur", "dur", 0.8)["cache"] == 0.8  # the same settings: it resumes
    with pytest.raises(ConfigError, match=r"holds results of other settings \(cache\)"):
        run("groove-dur", "dur", 0.0)
    assert run("groove", "groove", None)["cache"] == 0.0


def test_sample_says_when_takes_of_one_prompt_came_out_the_same(tmp_path, capsys):
    """O'Neill's tune no. 10 (3/4, music21's corpus), 4 bars in, 2 out, two takes: with the song
    model's defaults (cache 0.95, top-p 0.95) the repeating tune leaves each draw the cache
    matches to one token, both takes are the same, and `sample` says so and what gives different
    ones; with `--top-p 1` the model's share is drawn too and the takes differ. (Over 8 bars the
    cache's loop guard has the model draw where the tune's phrase would go round again, and the
    takes differ.)"""
    tune = oneills_tune(10, tmp_path / "tune.mid")
    args = ["sample", "-c", GROOVE_DUR.parent / "song", "--prompt", tune, "--prompt-bars", "4"]
    args += ["--bars", "2", "-n", "2", "--seed", "0", "--precision", "fp32"]
    for extra, repeated in (([], 1), (["--top-p", "1"], 0)):
        out = tmp_path / f"out{len(extra)}"
        with pytest.raises(SystemExit) as exit_:
            main([str(a) for a in args + extra + ["--out", out]])
        printed = capsys.readouterr().out
        assert (exit_.value.code or 0) == 0
        summary = json.loads((out / "tune" / "tune.json").read_text())
        assert summary["stats"]["repeats"] == repeated
        takes = [(out / "tune" / record["midi"]).read_bytes() for record in summary["samples"]]
        assert (takes[0] == takes[1]) == bool(repeated)
        hint = "1 of 2 samples repeat an earlier one of the same prompt note for note: the suffix cache"
        assert (hint in printed) == bool(repeated)
        assert "--top-p 1 draws the model's share too and gives different takes" in printed or not repeated
