"""musegen sample: grammar-masked recurrent sampling from untrained tiny models, outputs, bad input."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import tempfile
import threading
import wave
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import miditoolkit
import numpy as np
import pytest
import symusic
import torch
from fuzz import trio_midi
from test_fuzz import time_limit
from tiny_models import tiny_checkpoint, tiny_model

from musegen.cli import main
from musegen.cli.sample import reading_share
from musegen.errors import ConfigError, MidiError
from musegen.generation import loop
from musegen.generation.constraints import Constraint, keep_type_mass
from musegen.generation.loop import filter_logits, generate, temper_within_families
from musegen.generation.outputs import with_prompt_end, write_samples
from musegen.generation.prompt import Prompt, load_prompt, prompt_from_ids, with_ending
from musegen.generation.settings import SampleSettings
from musegen.model.torch_step import PreparedWeights
from musegen.model.transformer import Session
from musegen.music.notes import NoteTable
from musegen.render import PROMPT_END_MARKER
from musegen.tokenizers import Tokenizer, tokenizer_from_dict

KINDS = sorted(Tokenizer.registry)
PROMPTS = {
    kind: Path(__file__).resolve().parents[1] / "checkpoints" / "prompts" / name
    for kind, name in (
        ("remi", "pop_progression.mid"),
        ("groove", "groove_rock.mid"),
        ("groove-dur", "groove_rock.mid"),
        ("song", "groove_rock.mid"),
    )
}
EMPTY = Prompt(np.zeros(0, dtype=np.int64))
BAR_TICKS = 4 * 480  # both representations decode 4/4 at 480 ticks per beat


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models():
    return {kind: tiny_model(kind) for kind in KINDS}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {kind: tiny_checkpoint(kind, tmp_path_factory.mktemp(f"ckpt-{kind}")) for kind in KINDS}


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return (exit_.value.code or 0), out.out, out.err


def note_set(piece: NoteTable) -> Counter:
    return Counter(zip(*(c.tolist() for c in (piece.start, piece.pitch, piece.velocity, piece.end))))


def note_rows(piece: NoteTable) -> list[tuple[int, int, int, int]]:
    """(track, pitch, start, end) of every note, sorted."""
    return sorted(zip(*(c.tolist() for c in (piece.track, piece.pitch, piece.start, piece.end))))


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
        piece = tok.decode(sample.ids)  # decodes without error
        # the grammars are canonical: a decoded sample re-encodes to exactly its own tokens
        assert list(tok.encode(piece.midi_bytes()).ids) == list(sample.ids)


@pytest.mark.parametrize("kind", KINDS)
def test_without_the_mask_invalid_samples_are_counted(models, kind):
    model, tok = models[kind]
    samples, stats = generate(
        model, tok, EMPTY, SampleSettings(length=128, num_samples=40, seed=7, grammar=False), progress=False
    )
    violations = [tok.grammar().first_violation(s.ids) for s in samples]
    assert stats["grammar_violations"] == sum(v is not None for v in violations) > 0
    assert [s.violation for s in samples] == violations
    assert stats["invalid"] == sum(not s.valid for s in samples) >= stats["grammar_violations"]


def test_same_seed_same_output_other_seed_differs(models):
    model, tok = models["remi"]
    run = lambda seed: [
        s.ids.tolist()
        for s in generate(model, tok, EMPTY, SampleSettings(length=48, num_samples=3, seed=seed), progress=False)[0]
    ]
    first = run(11)
    assert run(11) == first
    assert run(12) != first
    assert len({tuple(x) for x in first}) == 3  # the samples of one batch differ from each other


def test_precision_sets_the_steps_and_a_nonsense_one_is_refused(models, checkpoints, tmp_path, capsys):
    """Sampling steps in the precision asked for (fp32 steps repeat exactly, bf16 steps give valid
    samples too); an unknown precision is one line and exit 2 (a ConfigError) from the CLI."""
    model, tok = models["remi"]

    def run(precision):
        samples, stats = generate(
            model, tok, EMPTY, SampleSettings(length=96, num_samples=2, seed=3, precision=precision), progress=False
        )
        assert stats["invalid"] == 0
        assert stats["precision"]["reason"] == "asked for"  # the JSON says which path made the logits
        assert stats["precision"]["path"] in {"fp32": ["fp32"], "bf16": ["bf16", "bf16-step.c"]}[precision]
        return [s.ids.tolist() for s in samples]

    assert run("fp32") == run("fp32")
    run("bf16")
    code, _, err = run_cli(
        ["sample", "-c", checkpoints["remi"], "--length", 8, "--precision", "fp16", "--out", tmp_path / "s"], capsys
    )
    assert code == 2 and "precision must be one of" in err and len(err.strip().splitlines()) == 1


def test_threads_sampling_from_one_model_draw_what_each_draws_alone(models):
    """A run only reads the model: two threads sampling from one model at once, each in its own
    session and sharing the prepared weights, draw what each draws alone (fp32: the same bits).
    A barrier holds them in step for the first steps, so their steps interleave."""
    model, tok = models["remi"]
    weights = PreparedWeights(model)

    def run(seed: int, barrier: threading.Barrier | None = None) -> list[list[int]]:
        steps = []

        def on_step(rows):
            steps.append(len(rows))
            if barrier is not None and len(steps) <= 20:
                barrier.wait(timeout=60)

        settings = SampleSettings(length=48, num_samples=2, seed=seed, precision="fp32")
        samples, _ = generate(model, tok, EMPTY, settings, progress=False, on_step=on_step, weights=weights)
        return [s.ids.tolist() for s in samples]

    alone = [run(5), run(6)]
    barrier = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda seed: run(seed, barrier), (5, 6))) == alone and alone[0] != alone[1]


def test_a_stop_mid_note_is_finished_then_closed(models):
    model, tok = models["remi"]
    samples, _ = generate(model, tok, EMPTY, SampleSettings(length=37, num_samples=30, seed=3), progress=False)
    names = lambda s: [tok.vocab[i] for i in s.ids]
    assert all(names(s)[-2:] == ["Bar_None", "EOS_None"] and s.closed for s in samples)
    # some were stopped where the piece cannot end (inside a note, on a bare Beat or Bar) and had
    # to finish a note first: at most Bar, Beat, Chord, Tempo, Pitch, Velocity, Duration more
    assert any(s.new_tokens > 37 for s in samples)
    assert all(s.new_tokens <= 37 + 7 for s in samples)


@pytest.fixture(scope="module")
def prompt_files(pop909_songs, tmp_path_factory):
    """A real piece each representation reads: a POP909 song, the bass/drums/piano test trio."""
    trio = trio_midi(tmp_path_factory.mktemp("trio") / "trio.mid")
    return {"remi": pop909_songs[0], "groove": trio, "groove-dur": trio, "song": trio}


@pytest.mark.parametrize("kind", KINDS)
def test_bars_mode_writes_exactly_the_new_bars(models, prompt_files, kind):
    """2 prompt bars + 1 new bar: every new note lies in bar 2, and the sample ends there."""
    model, tok = models[kind]
    prompt = load_prompt(tok, prompt_files[kind], bars=2)
    samples, stats = generate(model, tok, prompt, SampleSettings(bars=1, num_samples=6, seed=5), progress=False)
    assert stats["invalid"] == 0
    new_bars = set()
    for s in samples:
        assert s.closed and list(s.ids[: len(prompt.ids)]) == list(prompt.ids)
        fresh = with_prompt_end(prompt, tok.decode(s.ids, prompt.meta)).after_prompt()
        new_bars |= set((fresh.start // BAR_TICKS).tolist())
    assert new_bars == {2}  # the model wrote into the new bar, and nowhere else


@pytest.mark.parametrize("kind", KINDS)
def test_the_model_never_writes_into_the_prompts_last_bar(models, prompt_files, kind):
    model, tok = models[kind]
    prompt = load_prompt(tok, prompt_files[kind], bars=2)
    samples, _ = generate(model, tok, prompt, SampleSettings(length=40, num_samples=20, seed=9), progress=False)
    onsets = [
        start
        for s in samples
        for start in with_prompt_end(prompt, tok.decode(s.ids, prompt.meta)).after_prompt().start.tolist()
    ]
    assert len(onsets) > 20 and min(onsets) >= 2 * BAR_TICKS


def test_prompt_is_cut_after_whole_bars_and_opened(pop909_songs, prompt_files):
    tok = tokenizer_from_dict({"kind": "remi"})
    full = tok.encode(pop909_songs[1]).ids
    prompt = load_prompt(tok, pop909_songs[1], bars=2)
    starts = tok.bar_starts(full)
    assert list(prompt.ids) == list(full[: starts[2]]) + [tok.bar_id] and prompt.bars == 2  # bar 2 is open
    whole = load_prompt(tok, pop909_songs[1])
    assert list(whole.ids) == list(full[:-1])  # only the final EOS goes: the continuation starts a bar
    assert whole.bars == len(starts) - 1  # the closing Bar opens no bar of music
    groove = tokenizer_from_dict({"kind": "groove"})
    ids = np.array([793, 0, 779, 384, 792])  # Start, NoteOn, shift to the next beat, NoteOff, End
    assert list(prompt_from_ids(groove, ids).ids) == [793, 0, 779, 384]
    # groove: the first 2 bars, notes sounding across the bar line end there
    encoding = groove.encode(prompt_files["groove"])
    cut = load_prompt(groove, prompt_files["groove"], bars=2)
    full = groove.decode(encoding.ids, encoding.meta)
    early = full.select(full.start < 2 * BAR_TICKS)
    early.end = np.minimum(early.end, 2 * BAR_TICKS)
    assert note_rows(cut.piece) == note_rows(early)


@pytest.mark.parametrize("kind", KINDS)
def test_a_prompt_is_walked_once_and_decoded_once(models, prompt_files, kind, monkeypatch):
    """Loading walks the piece once (plus its few closing tokens) and decodes it once; sampling
    and writing never walk or decode the prompt again."""
    model, tok = models[kind]
    length = len(tok.encode(prompt_files[kind]).ids)
    grammar_class, tokenizer_class = type(tok.grammar()), type(tok)
    counts = Counter()

    def counted(cls, name):
        real = getattr(cls, name)

        def wrapper(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(cls, name, wrapper)

    counted(grammar_class, "step")
    counted(tokenizer_class, "decode")
    walks = []
    real_states = grammar_class.states
    monkeypatch.setattr(
        grammar_class, "states", lambda self, ids, *a: walks.append(len(ids)) or real_states(self, ids, *a)
    )
    prompt = load_prompt(tok, prompt_files[kind])
    assert counts["decode"] == 1 and length <= counts["step"] <= length + 8
    counts.clear()
    walks.clear()
    samples, _ = generate(model, tok, prompt, SampleSettings(length=8, num_samples=4, seed=0), progress=False)
    write_samples(samples, tok, prompt, Path(tempfile.mkdtemp()), "x")
    assert counts["decode"] == 4  # one per sample
    # the new tokens (and their closing) are walked, never the prompt; finishing a piece past the
    # length tries each allowed token once (step), which depends on the vocabulary, not the prompt
    assert max(walks, default=0) < len(prompt.ids) / 2


def test_a_prompt_without_notes_before_the_cut_says_where_its_first_note_is(models, tmp_path):
    late = miditoolkit.MidiFile(ticks_per_beat=480)
    bass, drums, piano = miditoolkit.Instrument(33), miditoolkit.Instrument(0, is_drum=True), miditoolkit.Instrument(0)
    for beat in range(12, 20):  # bars 4 and 5 (1-based)
        bass.notes.append(miditoolkit.Note(90, 40, beat * 480, beat * 480 + 400))
        drums.notes.append(miditoolkit.Note(100, 36, beat * 480, beat * 480 + 60))
        piano.notes.append(miditoolkit.Note(70, 60, beat * 480, beat * 480 + 240))
    late.instruments += [bass, drums, piano]
    late.dump(str(tmp_path / "late.mid"))
    tested = 0
    for kind in KINDS:
        tok = models[kind][1]
        decoded = tok.decode(tok.encode(tmp_path / "late.mid").ids)
        if decoded.start.min() < 3 * BAR_TICKS:
            continue  # this representation drops leading silence: a cut cannot leave a prompt empty
        with pytest.raises(
            MidiError,
            match=r"first 2 bars hold no notes; its first note comes in bar 4 "
            r"\(--prompt-bars 4 or more\)",
        ):
            load_prompt(tok, tmp_path / "late.mid", bars=2)
        tested += 1
    assert tested


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


def test_a_family_temperature_keeps_each_familys_mass_and_sharpens_inside_it():
    # family A: one id of 0.4; family B: four ids sharing 0.6 (a bass line's pitches, say)
    probs = torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.05]])
    families = [torch.tensor([0]), torch.tensor([1, 2, 3, 4])]
    for temperature in (0.25, 0.6, 1.0, 3.0):
        shaped = temper_within_families(probs.log(), families, temperature).exp()[0]
        assert shaped[0].item() == pytest.approx(0.4) and shaped[1:].sum().item() == pytest.approx(0.6)
        inside = probs[0, 1:] ** (1 / temperature)
        assert torch.allclose(shaped[1:], 0.6 * inside / inside.sum(), atol=1e-6)
    # a token-wise temperature of 0.6 moves mass from the spread family to the concentrated one
    assert filter_logits(probs.log(), 0.6).softmax(-1)[0, 0] > 0.5
    # a family with every id masked stays masked (no NaN), and the rest keeps its shape
    masked = probs.log().clone()
    masked[0, 1:] = -math.inf
    shaped = temper_within_families(masked, families, 0.6)
    assert shaped[0, 0].item() == pytest.approx(0.0) and torch.isneginf(shaped[0, 1:]).all()


def test_token_families_group_one_tracks_notes_and_one_scales_shifts():
    tok = tokenizer_from_dict({"kind": "groove-dur"})
    family = tok.token_family_ids()
    by_name = dict(zip(tok.vocab, family))
    assert by_name["Note_1_40"] == by_name["Note_1_43"] != by_name["Note_3_40"]
    assert by_name["TimeShift_1_6"] == by_name["TimeShift_1_7"] != by_name["TimeShift_0_6"]
    assert len(set(family)) == 10  # 3 tracks' notes, durations, 3 shift scales, Start, End, PAD


def test_family_temperature_samples_valid_pieces_and_is_checked():
    model, tok = tiny_model("groove-dur")
    for scope in ("token", "family"):
        settings = SampleSettings(length=48, num_samples=2, seed=3, temperature=0.6, temperature_by=scope)
        samples, stats = generate(model, tok, EMPTY, settings, progress=False)
        assert stats["invalid"] == 0 and all(x.new_tokens >= 48 for x in samples)
    with pytest.raises(ConfigError, match="--temperature-by must be one of"):
        SampleSettings(length=8, temperature_by="bar").resolved(tok)


def test_sampling_frequencies_follow_the_nucleus():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().expand(20000, -1)
    gen = torch.Generator().manual_seed(0)
    draws = torch.multinomial(filter_logits(logits, 1.0, top_p=0.8).softmax(-1), 1, generator=gen).flatten()
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    assert freq[2:].sum() == 0
    assert freq[0].item() == pytest.approx(0.5 / 0.8, abs=0.015)


@dataclass(frozen=True)
class ForbidToken(Constraint):
    """A constraint from outside the package: one id is never drawn."""

    token: int

    def allow(self, run, row, allowed):
        allowed = allowed.copy()
        allowed[self.token] = False
        return allowed


NOTE_PREFIX = {"remi": "Note_Pitch_", "groove": "NoteOn_", "groove-dur": "Note_", "song": "Pitch_"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_constraint_carried_by_the_settings_holds_and_the_grammar_still_does(models, kind):
    """The pitch an unconstrained run draws most is never drawn once a constraint forbids it,
    with the grammar's constraints still in force (valid samples of the full length) and without
    the grammar too; the summary records the constraint."""
    model, tok = models[kind]
    settings = SampleSettings(length=256, num_samples=8, seed=5)
    free, _ = generate(model, tok, EMPTY, settings, progress=False)
    drawn = Counter(t for s in free for t in s.ids.tolist() if tok.vocab[t].startswith(NOTE_PREFIX[kind]))
    token, count = drawn.most_common(1)[0]
    assert count >= 8
    chained = replace(settings, constraints=(ForbidToken(token),))
    samples, stats = generate(model, tok, EMPTY, chained, progress=False)
    assert stats["invalid"] == 0
    for sample in samples:
        assert token not in sample.ids.tolist()
        assert sample.valid and sample.new_tokens >= 256
    assert sum(tok.vocab[t].startswith(NOTE_PREFIX[kind]) for s in samples for t in s.ids.tolist()) > 8 * 4
    loose, stats = generate(model, tok, EMPTY, replace(chained, grammar=False), progress=False)
    assert stats["grammar_violations"] > 0  # the grammar's mask is off, the added constraint is not
    assert all(token not in sample.ids.tolist() for sample in loose)
    assert chained.record()["constraints"] == [f"ForbidToken(token={token})"]
    assert "constraints" not in settings.record()


def test_keep_type_mass_gives_the_type_the_models_share():
    """After the mask, the kept type holds p(type) (over all its ids, allowed or not), split as
    the model splits it among its allowed ids; the other allowed ids share 1 - p(type) in their
    own proportions. Rows without an allowed id of the type, or with nothing else, are as before."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 40, generator=gen) * 3
    kept = torch.zeros(40, dtype=torch.bool)
    kept[10:25] = True
    allowed = torch.rand(200, 40, generator=gen) < 0.3
    allowed[0, 10:25] = False  # no allowed id of the type
    allowed[1] = kept  # nothing else allowed
    out = keep_type_mass(logits, allowed, kept)
    p = logits.softmax(-1)
    q = out.masked_fill(~allowed, -math.inf).softmax(-1)
    ours, others = allowed & kept, allowed & ~kept
    plain = logits.masked_fill(~allowed, -math.inf).softmax(-1)
    for row in range(200):
        if not ours[row].any() or not others[row].any():
            assert torch.allclose(q[row], plain[row], atol=1e-6)
            continue
        assert q[row, kept].sum() == pytest.approx(p[row, kept].sum().item(), abs=1e-5)
        for where in (ours[row], others[row]):
            assert torch.allclose(q[row, where] / q[row, where].sum(), p[row, where] / p[row, where].sum(), atol=1e-5)
    assert (q[~allowed] == 0).all()


def _constant_logit_samples(
    models, prompt_files, logits: list[tuple[slice | np.ndarray, float]], settings: SampleSettings, kind="groove"
):
    """Samples of a tiny model (groove by default) with constant logits: its head's weights
    zeroed, every bias -30 but the given (ids, logit) ranges, so every step alike the biases alone
    decide. Returns the tokenizer, the prompt and the samples, each a piece the grammar accepts."""
    model, tok = models[kind]
    prompt = load_prompt(tok, prompt_files[kind], bars=2)
    saved = {k: v.clone() for k, v in model.head.state_dict().items()}
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.fill_(-30.0)
        for ids, logit in logits:
            model.head.bias[ids] = logit
    try:
        samples, stats = generate(model, tok, prompt, settings, progress=False)
    finally:
        model.head.load_state_dict(saved)
    assert stats["invalid"] == 0
    return tok, prompt, samples


@pytest.mark.parametrize("keep", [True, False])
def test_a_groove_sampler_ends_notes_as_often_as_the_model_says(models, prompt_files, keep):
    """A model that gives note-offs half its mass, spread over all 384 (track, pitch) slots, does
    not know which notes sound. Wherever a sounding note may end, the sampler with the share kept
    ends one about half the time, and about 13 notes sound at once; with the plain mask the mass
    of the silent slots goes to note-ons and shifts, and notes pile up."""
    from musegen.tokenizers.groove_events import NOTE_OFF, TIME_SHIFT
    from musegen.tokenizers.groove_grammar import ONS

    # p(note-off) = 384 x 1 / (384 x 1 + 384 x 1/2 + 24 x 8) = 1/2
    tok, prompt, samples = _constant_logit_samples(
        models,
        prompt_files,
        [
            (slice(NOTE_OFF, TIME_SHIFT), 0.0),
            (slice(0, NOTE_OFF), -math.log(2)),
            (slice(TIME_SHIFT, TIME_SHIFT + 24), math.log(8)),
        ],
        SampleSettings(length=800, num_samples=2, seed=1, temperature=1.0, keep_share=keep),
    )
    # at each drawn token where an earlier note may end: whether one did, and how many notes sound
    grammar, ends, sounding = tok.grammar(), [], []
    for sample in samples:
        states = grammar.states(sample.ids)
        for i in range(len(prompt.ids), len(sample.ids)):
            state, token = states[i], int(sample.ids[i])
            if state.mode != ONS and grammar.sampling_mask(state)[NOTE_OFF:TIME_SHIFT].any():
                ends.append(NOTE_OFF <= token < TIME_SHIFT)
                sounding.append(sum(len(q) for q in state.sounding.values()))
    assert len(ends) > 300
    share, held = float(np.mean(ends)), float(np.median(sounding))
    if keep:
        assert 0.42 < share < 0.58 and held < 25, (share, held)
    else:  # notes pile up until the few allowed slots win back the share: measured 112 at once
        assert held > 60, held


@pytest.mark.parametrize("keep, past", [(True, False), (False, False), (True, True)])
def test_a_song_sampler_ends_bars_as_often_as_the_model_says(models, prompt_files, keep, past):
    """A model that gives Bar a tenth of its mass and spreads the rest over every position of a
    4/4 bar and every pitch does not know where in the bar it is. After each note, with the share
    kept the sampler draws Bar about a tenth of the time; with the plain mask the mass of the
    earlier positions and lower pitches, which the canonical order forbids, goes to Bar as well,
    and bars end early. Where the model also spreads mass over the positions past the end of the
    bar (`past`), Bar keeps theirs too: (184/9 + 48) / (184/9 + 184) = 0.335."""
    from musegen.tokenizers.song_grammar import DURATION

    tok = models["song"][1]
    positions = tok.position_ids if past else tok.position_ids[:48]  # the trio prompt is in 4/4
    spread = np.concatenate([positions, tok.pitch_ids])
    # p(Bar) = n x (1/9) / (n x (1/9) + n x 1) = 1/10 for n ids spread
    tok, prompt, samples = _constant_logit_samples(
        models,
        prompt_files,
        [(spread, 0.0), (slice(tok.bar_id, tok.bar_id + 1), math.log(len(spread) / 9))],
        # every position allowed (the prompt's 16ths would leave Bar alone late in a bar), and no
        # boost for a silent track (it would take from Bar)
        SampleSettings(
            length=1500,
            num_samples=2,
            seed=2,
            temperature=1.0,
            top_p=1.0,
            keep_share=keep,
            subdivision="any",
            keep_tracks=0,
        ),
        kind="song",
    )
    # after each note where Bar and something else may come (End is held)
    grammar, bars = tok.grammar(), []
    for sample in samples:
        states = grammar.states(sample.ids)
        for i in range(len(prompt.ids), len(sample.ids)):
            allowed = grammar.sampling_mask(states[i])
            allowed[tok.end_id] = False
            if states[i].after == DURATION and allowed[tok.bar_id] and allowed.sum() > 1:
                bars.append(int(sample.ids[i]) == tok.bar_id)
    assert len(bars) > 400
    share = float(np.mean(bars))
    if past:
        assert 0.29 < share < 0.38, share
    elif keep:
        assert 0.07 < share < 0.13, share
    else:
        assert share > 0.2, share


@pytest.mark.parametrize("mono", [True, False])
def test_a_groove_sampler_keeps_the_bass_monophonic_one_event_late(models, prompt_files, mono):
    """A model that never ends a note and begins bass and drum notes at random. With --mono-bass
    a bass note that a later one began over ends at the next time anything happens, so the
    sounding bass notes never span more than two onsets; without it they pile up. The tokens
    stay a piece the grammar accepts either way."""
    from musegen.music.roles import OTHER
    from musegen.tokenizers.groove_events import N_PITCH, NOTE_OFF, TIME_SHIFT

    # bass and drum note_ons and shifts; no note-offs, no other-track notes, no End
    tok, prompt, samples = _constant_logit_samples(
        models,
        prompt_files,
        [(slice(0, (OTHER - 1) * N_PITCH), 0.0), (slice(TIME_SHIFT, TIME_SHIFT + 24), math.log(16))],
        SampleSettings(length=600, num_samples=2, seed=3, temperature=1.0, mono_bass=mono),
    )
    grammar, spans = tok.grammar(), []
    for sample in samples:
        written = sample.ids[: sample.prompt_len + sample.new_tokens]  # before the closing note_offs
        for state in grammar.states(written)[sample.prompt_len :]:
            onsets = {onset for slot, queue in state.sounding.items() if slot < N_PITCH for onset, _ in queue}
            spans.append(len(onsets))
        ended = [t for t in written[sample.prompt_len :] if NOTE_OFF <= t < NOTE_OFF + N_PITCH]
        assert (len(ended) > 10) == mono, len(ended)  # only the rule ends bass notes here
    assert (max(spans) <= 2) if mono else (max(spans) > 10), max(spans)


# ---------------------------------------------------------------- the command line


@pytest.mark.skipif(shutil.which("fluidsynth") is None, reason="fluidsynth not installed")
def test_cli_sample_with_prompt_writes_midi_wav_json_and_pianoroll(checkpoints, pop909_songs, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = run_cli(
        [
            "sample",
            "--checkpoint",
            checkpoints["remi"],
            "--prompt",
            pop909_songs[0],
            "--prompt-bars",
            2,
            "--length",
            64,
            "-n",
            2,
            "--seed",
            5,
            "--out",
            out,
            "--pianoroll",
            "--audio",
        ],
        capsys,
    )
    assert code == 0, err
    assert "tokens/s" in stdout and "invalid samples: 0" in stdout
    out = out / pop909_songs[0].stem  # the prompt's set: a folder of its own
    assert stdout.splitlines()[-1] == f"written to {out}/"
    summary = json.loads((out / f"{pop909_songs[0].stem}.json").read_text())
    assert summary["settings"]["seed"] == 5 and summary["settings"]["temperature"] == 1.2
    assert summary["settings"]["top_p"] == 0.9 and summary["tokenizer"] == "remi"
    assert 0 <= summary["stats"]["prompt_seconds"] <= summary["stats"]["seconds"]  # reading the prompt is part of it
    tok = tokenizer_from_dict({"kind": "remi"})
    prompt = load_prompt(tok, pop909_songs[0], bars=2, grid=summary["settings"]["grid"])  # as the run read it
    prompt_notes = note_set(tok.decode(with_ending(tok.grammar(), prompt.ids)))
    for record in summary["samples"]:
        piece = NoteTable.read(out / record["midi"])
        markers = [tick for tick, text in piece.markers if text == PROMPT_END_MARKER]
        assert len(markers) == 1 and markers[0] > 0
        notes = note_set(piece)
        assert notes & prompt_notes == prompt_notes  # the prompt is kept, note for note
        head = Counter({k: v for k, v in notes.items() if k[0] < markers[0]})
        assert head & prompt_notes == head  # and everything before the marker is prompt
        assert (out / record["pianoroll"]).read_bytes()[:4] == b"\x89PNG"
        music_end = symusic.Score(str(out / record["midi"])).to("second").end()
        with wave.open(str(out / record["wav"])) as w:
            seconds = w.getnframes() / w.getframerate()
            loud = np.abs(np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)).max()
        assert music_end <= seconds <= music_end + 1.5 and loud > 1000


@pytest.mark.parametrize("window, length", [(64, 300), (1100, 1500)])
def test_a_window_restarts_the_model_on_the_samples_own_last_tokens(models, monkeypatch, window, length):
    """With --window W the model never reads more than W tokens: a prompt longer than W is read
    from its last W/2, and each time the session is full a fresh one reads the sample's last W/2
    tokens (the one just drawn included; 550 of them take two ingest chunks), so each session's
    stream is a slice of the sample itself."""
    model, tok = models["remi"]
    prompt = load_prompt(tok, PROMPTS["remi"])
    sessions, reads = [], {}
    make_session, step = model.session, Session.step

    def recorded_session(*args, **kwargs):
        sessions.append(make_session(*args, **kwargs))
        return sessions[-1]

    def recorded_step(self, tokens, beats=None):
        reads.setdefault(id(self), []).append(tokens if tokens.dim() == 2 else tokens[:, None])
        return step(self, tokens, beats)

    monkeypatch.setattr(loop, "check_memory", lambda *args: None)  # its probe session is not the sampler's
    monkeypatch.setattr(model, "session", recorded_session)
    monkeypatch.setattr(Session, "step", recorded_step)
    settings = SampleSettings(length=length, window=window, num_samples=2, seed=3, precision="fp32")
    samples, stats = generate(model, tok, prompt, settings, progress=False)
    keep = window // 2
    streams = [torch.cat(reads[id(session)], 1).numpy() for session in sessions]
    assert stats["invalid"] == 0 and len(streams) >= 2 and max(stream.shape[1] for stream in streams) == window
    start = len(prompt.ids) - keep if len(prompt.ids) > window else 0
    for stream in streams:
        for row, sample in enumerate(samples):
            end = min(start + stream.shape[1], len(sample.ids) - 8)  # a row's last tokens close it
            assert np.array_equal(stream[row, : end - start], sample.ids[start:end])
        start += stream.shape[1] - (keep - 1)  # the next reads the last `keep`: those before the drawn one, and it


def test_a_window_longer_than_the_piece_changes_nothing_and_a_model_of_beats_refuses_it(models):
    model, tok = models["remi"]
    prompt = load_prompt(tok, PROMPTS["remi"])
    settings = SampleSettings(length=96, seed=5, precision="fp32")
    drawn = lambda window: generate(model, tok, prompt, replace(settings, window=window), progress=False)[0][0].ids
    assert drawn(10_000).tolist() == drawn(0).tolist()
    beats, tok = tiny_model("remi", positions="beats")
    with pytest.raises(ConfigError, match="--window is for models whose positions are tokens"):
        generate(beats, tok, prompt, SampleSettings(length=8, window=64, seed=1), progress=False)


def test_the_summary_line_says_how_long_reading_the_prompt_took_where_it_is_long():
    assert reading_share({"prompt_seconds": 4.46, "seconds": 5.6}) == ", 4.5 s of it reading the prompt"
    assert reading_share({"prompt_seconds": 0.3, "seconds": 5.6}) == ""


@pytest.mark.parametrize("kind", KINDS)
def test_cli_no_grammar_samples_are_decoded_leniently(checkpoints, kind, tmp_path, capsys):
    # a prompt gives every sample its opening (a REMI piece opens Bar, Beat_0, Chord, Tempo, which
    # an untrained model's unmasked tokens would hit by chance about once in 400 tokens)
    prompt = PROMPTS[kind]
    code, stdout, err = run_cli(
        [
            "sample",
            "-c",
            checkpoints[kind],
            "--prompt",
            prompt,
            "--prompt-bars",
            1,
            "--length",
            64,
            "-n",
            8,
            "--seed",
            1,
            "--no-grammar",
            "--cache",  # the suffix cache would keep the untrained model on copies of the prompt
            0,
            "--out",
            tmp_path,
        ],
        capsys,
    )
    assert code == 0, err
    line = next(x for x in stdout.splitlines() if x.startswith("invalid samples"))
    folder = tmp_path / Path(prompt).stem
    summary = json.loads((folder / f"{Path(prompt).stem}.json").read_text())
    records = summary["samples"]
    dropped = [r["dropped_tokens"] for r in records if not r["valid"]]
    assert line.startswith(f"invalid samples: {summary['stats']['invalid']} of 8")
    assert line.endswith(f"skipping {sum(dropped)} unplayable tokens")
    assert summary["stats"]["invalid"] == len(dropped) > 0 and sum(dropped) > 0
    tok = tokenizer_from_dict({"kind": kind})
    grammar = tok.grammar()
    playable = [r for r in records if r.get("error") != "no notes"]
    assert len(playable) >= 4
    for record in playable:  # every sample is written, as a piece the grammar accepts
        ids = tok.encode(folder / record["midi"]).ids
        assert grammar.first_violation(ids) is None
        assert not record["valid"] or record["tokens"] == len(ids)


def test_cli_sampler_options_reach_the_sampler_and_are_recorded(checkpoints, tmp_path, capsys):
    """--plain-mask (the paper's sampler) and --poly-bass against the defaults on one seed: the
    settings JSON says which ran, and --plain-mask changes the sample (the tiny model's note-off
    share is not its allowed mass; what --poly-bass changes is tested above with a model that
    begins bass notes over sounding ones)."""
    written = {}
    for flag, kept, mono in (
        ("--keep-share", True, True),
        ("--plain-mask", False, True),
        ("--poly-bass", True, False),
    ):
        out = tmp_path / flag.strip("-")
        code, _, err = run_cli(
            [
                "sample",
                "-c",
                checkpoints["groove"],
                "--prompt",
                PROMPTS["groove"],
                "--prompt-bars",
                2,
                "--length",
                200,
                "--seed",
                4,
                flag,
                "--out",
                out,
            ],
            capsys,
        )
        assert code == 0, err
        out = out / PROMPTS["groove"].stem
        summary = json.loads((out / f"{PROMPTS['groove'].stem}.json").read_text())
        assert summary["settings"]["keep_share"] is kept and summary["settings"]["mono_bass"] is mono
        written[flag] = list(tokenizer_from_dict({"kind": "groove"}).encode(out / summary["samples"][0]["midi"]).ids)
    assert written["--keep-share"] != written["--plain-mask"]


def test_cli_prompt_with_unrepresentable_notes_reports_and_goes_on(checkpoints, tmp_path, capsys):
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    piano = miditoolkit.Instrument(0)
    piano.notes = [miditoolkit.Note(80, p, 480 * i, 480 * i + 400) for i, p in enumerate([12, 60, 64, 120, 67])]
    midi.instruments.append(piano)
    midi.dump(str(tmp_path / "odd.mid"))
    code, stdout, err = run_cli(
        [
            "sample",
            "-c",
            checkpoints["remi"],
            "--prompt",
            tmp_path / "odd.mid",
            "--length",
            16,
            "--seed",
            1,
            "--out",
            tmp_path / "o",
        ],
        capsys,
    )
    assert code == 0, err
    assert "pitches_folded 2" in stdout  # 12 and 120 lie outside REMI's 22..107
    assert (tmp_path / "o" / "odd" / "odd_000.mid").is_file()


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
    fifo = tmp_path / "fifo.mid"
    os.mkfifo(fifo)
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
        "temperature 1e-40": ["sample", *ok, "--length", 8, "--temperature", 1e-40],
        "temperature nan": ["sample", *ok, "--length", 8, "--temperature", "nan"],
        "top-p 1e-300": ["sample", *ok, "--length", 8, "--top-p", 1e-300],
        "seed 10**20": [
            "sample",
            "-c",
            checkpoints["remi"],
            "--out",
            tmp_path / "out",
            "--length",
            8,
            "--seed",
            10**20,
        ],
        "device mps": ["sample", *ok, "--length", 8, "--device", "mps"],
        "num-samples 10**9": ["sample", *ok, "--length", 8, "--num-samples", 10**9],
        "length 10**12": ["sample", *ok, "--length", 10**12],
        "bars 10**9": ["sample", *ok, "--bars", 10**9],
        "prompt-bars 10**9": ["sample", *ok, "--bars", 1, "--prompt-bars", 10**9],
        "threads 10**6": ["sample", *ok, "--length", 8, "--threads", 10**6],
        "fifo prompt": ["sample", *ok, "--length", 8, "--prompt", fifo],
        "device file prompt": ["sample", *ok, "--length", 8, "--prompt", "/dev/zero"],
    }


BAD_FILES = {"not midi", "empty file", "no notes", "missing prompt", "missing weights", "tampered weights"}
BAD_FILES |= {"no checkpoint", "fifo prompt", "device file prompt"}


def test_cli_bad_input_is_one_line_and_nonzero(checkpoints, tmp_path, capsys):
    expected = {
        "not midi": "not a MIDI file",
        "empty file": "empty file",
        "no notes": "no notes",
        "missing prompt": "no such file",
        "missing weights": "missing model.safetensors",
        "tampered weights": "unreadable weights",
        "no checkpoint": "not found",
        "length 0": "--length must be within 1..10,240,000, got 0",
        "no length": "exactly one of",
        "top-p 0": "--top-p must be within [1e-06, 1], got 0.0",
        "top-p 1.5": "within [1e-06, 1], got 1.5",
        "temperature 0": "--temperature must be within [0.001, 100], got 0.0",
        "temperature 1e-40": "--temperature must be within [0.001, 100], got 1e-40",
        "temperature nan": "--temperature must be within [0.001, 100], got nan",
        "top-p 1e-300": "--top-p must be within [1e-06, 1], got 1e-300",
        "seed 10**20": f"--seed must be within 0..2**63-1, got {10**20}",
        "device mps": "device 'mps' is not supported for sampling; use auto, cpu, cuda or cuda:N",
        "num-samples 10**9": "--num-samples 1000000000 needs about",
        "length 10**12": f"--length must be within 1..10,240,000, got {10**12}",
        "bars 10**9": f"--bars must be within 1..10,000, got {10**9}",
        "prompt-bars 10**9": f"--prompt-bars must be within 1..10,000, got {10**9}",
        "threads 10**6": "--threads must be within 1..256, got 1000000",
        "fifo prompt": "fifo.mid: is a FIFO (named pipe), not a prompt",
        "device file prompt": "/dev/zero: is a character device, not a prompt",
    }
    for label, args in _bad_inputs(tmp_path, checkpoints).items():
        with time_limit(20):  # a prompt that blocks (a FIFO) fails the test instead of hanging it
            code, stdout, err = run_cli(args, capsys)
        lines = err.strip().splitlines()
        assert code == (1 if label in BAD_FILES else 2), (label, err)  # 2: an option out of bounds or too big
        assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, (label, err)
        assert expected[label] in lines[0], (label, lines[0])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_cli_help_states_every_bound():
    from typer.testing import CliRunner

    from musegen.cli import app
    from musegen.generation.resources import MAX_THREADS
    from musegen.generation.settings import MAX_LENGTH, SEED_MAX, TEMPERATURE_RANGE, TOP_P_RANGE
    from musegen.music.constants import MAX_BARS

    # the help text's own words, its panel's borders left out (a bound may wrap onto the next line)
    text = " ".join(CliRunner().invoke(app, ["sample", "--help"]).output.replace("│", " ").split())
    for bound in (
        f"1..{MAX_LENGTH:,}",
        f"1..{MAX_BARS:,}",
        f"[{TEMPERATURE_RANGE[0]:g}, {TEMPERATURE_RANGE[1]:g}]",
        f"[{TOP_P_RANGE[0]:g}, 1]",
        f"1..{MAX_THREADS}",
        "0..2**63-1",
    ):
        assert bound in text, bound
    assert SEED_MAX == 2**63 - 1


def test_cli_prompt_folder_continues_each_file_and_skips_bad_ones(checkpoints, pop909_songs, tmp_path, capsys):
    prompts = tmp_path / "prompts"
    for sub, song in (("a", pop909_songs[0]), ("b", pop909_songs[1])):
        (prompts / sub).mkdir(parents=True)
        shutil.copy(song, prompts / sub / "0.mid")  # the same stem in two folders must not collide
    (prompts / "a" / "broken.mid").write_bytes(b"MThd not really")
    code, out, err = run_cli(
        [
            "sample",
            "-c",
            checkpoints["remi"],
            "--prompt",
            prompts,
            "--prompt-bars",
            2,
            "--length",
            24,
            "--seed",
            3,
            "-o",
            tmp_path / "out",
        ],
        capsys,
    )
    assert code == 0, err
    assert "2 prompts continued, 1 skipped" in out and "a/broken.mid" in out
    assert {p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.mid")} == {
        "a/0/0_000.mid",
        "b/0/0_000.mid",
    }
    batch = json.loads((tmp_path / "out" / "batch.json").read_text())
    assert batch["continued"] == 2 and list(batch["skipped"]) == ["a/broken.mid"]
    seeds = [json.loads((tmp_path / "out" / sub / "0" / "0.json").read_text())["settings"]["seed"] for sub in "ab"]
    assert seeds == [3, 5]  # prompt i of the sorted list gets seed + i (a/broken.mid is i = 1)
    sets = [json.loads((tmp_path / "out" / sub / "0" / "0.json").read_text())["stats"] for sub in "ab"]
    assert batch["stats"]["prompt_seconds"] == pytest.approx(sum(s["prompt_seconds"] for s in sets), abs=2e-3)
    # The style evaluation pairs each continuation with the prompt file it came from.
    from musegen.evaluation.run_style import evaluate_style

    result = evaluate_style(tmp_path / "out", prompts, tmp_path / "style.csv")
    assert result["pieces"] == 2 and not result["unmatched"]
    rows = list(csv.DictReader(open(tmp_path / "style.csv")))
    assert {(r["generated"], r["reference"]) for r in rows} == {("a/0/0_000.mid", "0.mid"), ("b/0/0_000.mid", "0.mid")}

    (prompts / "b" / "0.mid").write_bytes(b"")
    (prompts / "a" / "0.mid").unlink()
    code, _, err = run_cli(
        ["sample", "-c", checkpoints["remi"], "--prompt", prompts, "--length", 8, "-o", tmp_path / "out2"], capsys
    )
    assert code != 0 and "none of its 2 prompts" in err.strip().splitlines()[-1] and "Traceback" not in err


def test_a_groove_sampler_never_begins_one_drum_twice_at_one_time(models, prompt_files):
    """A model that wants one drum above all (head bias) would, with the grammar alone, write it
    again and again at one time (the data may hold doubles, so the grammar accepts them) and
    never reach the next bar; the sampling mask allows one per time, and the bars are reached."""
    from musegen.tokenizers.groove_events import NOTE_OFF, TIME_SHIFT, WIDE_SHIFT, shift_target

    model, tok = models["groove"]
    kick = tok.vocab.index("NoteOn_2_36")  # track 2: drums
    grammar = tok.grammar()
    state = grammar.states([tok.vocab.index("Start"), kick])[-1]
    assert grammar.allowed(state)[kick] and not grammar.sampling_mask(state)[kick]
    prompt = load_prompt(tok, prompt_files["groove"], bars=2)
    bias = model.head.bias.detach().clone()
    with torch.no_grad():
        model.head.bias[kick] += 30.0
    try:
        samples, stats = generate(model, tok, prompt, SampleSettings(bars=4, num_samples=4, seed=0), progress=False)
    finally:
        with torch.no_grad():
            model.head.bias.copy_(bias)
    assert stats["invalid"] == 0
    for sample in samples:
        time, begun = 0, []
        for t in sample.ids[len(prompt.ids) :].tolist():
            if TIME_SHIFT <= t <= WIDE_SHIFT:
                moved = shift_target(time, t)
                begun, time = ([] if moved > time else begun), moved
            elif t < NOTE_OFF:
                assert t not in begun, "a slot began twice at one time"
                begun.append(t)
        assert len(tok.bar_starts(sample.ids)) >= len(tok.bar_starts(prompt.ids)) + 4
        assert Counter(sample.ids.tolist())[kick] > 4  # the bias was followed, once a time
