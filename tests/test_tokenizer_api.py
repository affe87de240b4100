"""The base Tokenizer API that the sampler and the trainer rely on, for every registered
representation; representation versions; and a third representation added as one module."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import miditoolkit
import numpy as np
import pytest
import torch
from fuzz import trio_midi
from tiny_models import tiny_checkpoint

import musegen.generation
from musegen.checkpoint import load_checkpoint
from musegen.errors import CheckpointError, ConfigError, MusegenError, TokenError
from musegen.generation.loop import generate
from musegen.generation.outputs import write_samples
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.model.config import preset
from musegen.model.transformer import MusicPerformer
from musegen.music.notes import NoteTable, Track
from musegen.tokenizers import RepresentationError, Tokenizer, load_tokenizer, tokenizer_from_dict
from musegen.tokenizers.base import Encoding, Grammar

KINDS = sorted(Tokenizer.registry)
REPO = Path(__file__).resolve().parents[1]


def test_importing_the_base_module_alone_registers_every_representation():
    code = "from musegen.tokenizers.base import Tokenizer; print(sorted(Tokenizer.registry))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    ).stdout
    assert out.strip() == str(KINDS) and {"remi", "groove"} <= set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_each_representation_declares_what_callers_need(kind):
    tok = tokenizer_from_dict({"kind": kind})
    assert isinstance(tok.version, int) and tok.version >= 1
    defaults = SampleSettings(length=1).resolved(tok)  # the defaults pass the sampler's own bounds
    assert (defaults.temperature, defaults.top_p) == (
        tok.sampling_defaults["temperature"],
        tok.sampling_defaults["top_p"],
    )
    grammar = tok.grammar()
    # the end ids are what the grammar closes a piece with, and they end it: nothing may follow
    for end in tok.end_ids:
        state = grammar.start()
        while not grammar.can_close(state):
            state = grammar.step(state, int(np.flatnonzero(grammar.allowed(state))[0]))
        closing = grammar.close(state)
        assert closing[-1] == end
        assert not grammar.allowed(grammar.states(closing, state)[-1]).any()
    with pytest.raises(TokenError, match="outside the vocabulary"):
        tok.check_ids([0, tok.vocab_size])
    with pytest.raises(TokenError, match="1-D"):
        tok.check_ids([[0, 1]])
    assert tok.check_ids(np.array([0, 1], dtype=np.int32)).dtype == np.int64


def test_the_paper_sampling_defaults_sit_on_the_tokenizers():
    remi, groove = (Tokenizer.registry[k] for k in ("remi", "groove"))
    assert dict(remi.sampling_defaults) == {"temperature": 1.2, "top_p": 0.9}
    assert dict(groove.sampling_defaults) == {"temperature": 0.6, "top_p": 1.0}
    assert remi.version == groove.version == 2


def test_the_sampler_names_no_representation():
    source = "".join(p.read_text() for p in Path(musegen.generation.__file__).parent.glob("*.py"))
    assert "kind ==" not in source
    assert not [k for k in KINDS if f'"{k}"' in source or f"'{k}'" in source]


@pytest.mark.parametrize("kind", KINDS)
def test_repair_drops_exactly_the_tokens_the_grammar_rejects(kind, pop909_songs, tmp_path):
    tok = tokenizer_from_dict({"kind": kind})
    grammar = tok.grammar()
    ids = [int(t) for t in _a_piece(tok, pop909_songs, tmp_path)]
    rng = np.random.default_rng(0)
    noisy, inserted, states = [], 0, grammar.states(ids)
    for i, token in enumerate(ids):  # before some tokens, insert one the grammar rejects there
        if rng.random() < 0.1:
            bad = np.flatnonzero(~grammar.allowed(states[i]))
            noisy.append(int(rng.choice(bad)))
            inserted += 1
        noisy.append(token)
    repaired, dropped = grammar.repair(noisy)
    assert inserted > 5 and dropped == inserted and repaired == ids
    truncated = ids[: len(ids) // 2]  # an unfinished piece is closed, cut back to where it can close
    repaired, dropped = grammar.repair(truncated)
    assert grammar.first_violation(repaired) is None and not grammar.allowed(grammar.states(repaired)[-1]).any()
    assert repaired[: len(truncated) - dropped] == truncated[: len(truncated) - dropped]


def _a_piece(tok: Tokenizer, pop909_songs, folder: Path) -> np.ndarray:
    """A real piece in this representation: a POP909 song, or (needing drums) the test trio."""
    try:
        return tok.encode(pop909_songs[0]).ids
    except MusegenError:
        return tok.encode(trio_midi(folder / "trio.mid")).ids


# ---- representation versions --------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_tokenizer_json_stores_the_version_and_refuses_others(kind, tmp_path):
    tok = tokenizer_from_dict({"kind": kind})
    tok.save(tmp_path / "tokenizer.json")
    stored = json.loads((tmp_path / "tokenizer.json").read_text())
    assert stored["version"] == tok.version
    assert load_tokenizer(tmp_path / "tokenizer.json").vocab == tok.vocab
    # a file without a version is version 1; a representation that starts there has no older one
    older = (None, tok.version - 1) if tok.version > 1 else ()
    for version in (*older, tok.version + 1):
        data = {k: v for k, v in stored.items() if k != "version"}
        if version is not None:
            data["version"] = version
        (tmp_path / "old.json").write_text(json.dumps(data))
        with pytest.raises(RepresentationError) as err:
            load_tokenizer(tmp_path / "old.json")
        shown = 1 if version is None else version  # files from before versions are version 1
        assert str(err.value) == (
            f"{tmp_path / 'old.json'} was made with {kind.upper()} representation "
            f"v{shown}; this musegen reads v{tok.version}: re-prepare the data / retrain "
            "or use an older musegen"
        )


def test_a_checkpoint_of_another_representation_version_is_refused_in_one_line(tmp_path, capsys):
    from musegen.cli import main

    folder = tiny_checkpoint("remi", tmp_path / "ckpt")
    data = json.loads((folder / "tokenizer.json").read_text())
    del data["version"]
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="REMI representation v1; this musegen reads v2: retrain the model"):
        load_checkpoint(folder)
    with pytest.raises(SystemExit) as exit_:
        main(["sample", "-c", str(folder), "-o", str(tmp_path / "out"), "--length", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and len(err) == 1 and "retrain the model or use an older musegen" in err[0]


# ---- a third representation: one module, nothing else to change ----------------------------------

PITCHES = range(60, 72)
STEPS_PER_BAR = 16


class _MonoGrammar(Grammar):
    """Bar, then 16 steps (a Note or a Rest) per bar; End after a whole bar."""

    def __init__(self, tok: "_MonoTokenizer"):  # noqa: F821 (defined below)
        self.vocab_size, self.t = tok.vocab_size, tok

    def start(self):
        return (-1, STEPS_PER_BAR)  # (bar, steps written in it): "before the first Bar"

    def allowed(self, state):
        bar, steps = state
        mask = np.zeros(self.vocab_size, dtype=bool)
        if bar == -2:
            return mask
        if steps == STEPS_PER_BAR:
            mask[self.t.bar_id] = True
            mask[self.t.end_id] = bar >= 0
        else:
            mask[self.t.step_ids] = True
        return mask

    def step(self, state, token):
        if not self.accepts(state, token):
            raise TokenError(f"{token} may not follow {state}")
        bar, steps = state
        return (-2, 0) if token == self.t.end_id else (bar + 1, 0) if token == self.t.bar_id else (bar, steps + 1)

    def can_close(self, state):
        return state[0] >= 0 and state[1] == STEPS_PER_BAR

    def close(self, state):
        if not self.can_close(state):
            raise TokenError("the bar is not full")
        return [self.t.end_id]


def _mono_class():
    class MonoTokenizer(Tokenizer):
        """A monophonic line on the 16th grid, one token per 16th."""

        kind = "mono-test"
        version = 1
        sampling_defaults = {"temperature": 0.9, "top_p": 0.95}

        def __init__(self):
            self.vocab = ["Bar", "Rest"] + [f"Note_{p}" for p in PITCHES] + ["End", "PAD"]
            self.bar_id, self.rest_id, self.end_id = 0, 1, len(self.vocab) - 2
            self.step_ids = np.arange(1, 2 + len(PITCHES))

        pad_id = property(lambda self: len(self.vocab) - 1)

        def encode(self, source):
            midi = miditoolkit.MidiFile(str(source)) if not isinstance(source, bytes) else None
            onsets = {
                round(n.start * 4 / midi.ticks_per_beat): 60 + n.pitch % 12
                for inst in midi.instruments
                for n in inst.notes
            }
            bars = max(onsets) // STEPS_PER_BAR + 1
            ids = []
            for step in range(bars * STEPS_PER_BAR):
                ids += [self.bar_id] * (step % STEPS_PER_BAR == 0)
                ids.append(2 + onsets[step] - 60 if step in onsets else self.rest_id)
            return Encoding(np.array(ids + [self.end_id]), {"notes": len(onsets)})

        def decode(self, ids, meta=None):
            notes, step = [], 0
            for token in self.check_ids(ids).tolist():
                if token in self.step_ids:
                    if token != self.rest_id:
                        notes.append((step * 120, step * 120 + 120, 60 + token - 2, 80))
                    step += 1
            return NoteTable.of_tracks(480, [(Track(None, 0, False, "other"), notes)])

        def grammar(self):
            return _MonoGrammar(self)

        def transpose(self, ids, shift):
            return None

        def bar_starts(self, ids):
            return np.flatnonzero(np.asarray(ids) == self.bar_id).tolist()

        def settings(self):
            return {}

    return MonoTokenizer


@pytest.fixture
def mono():
    cls = _mono_class()
    yield cls()
    del Tokenizer.registry[cls.kind]


def test_a_new_representation_samples_without_touching_the_sampler(mono, tmp_path):
    assert tokenizer_from_dict(mono.to_dict()).kind == "mono-test" and mono.end_ids == (mono.end_id,)
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    line = miditoolkit.Instrument(0)
    line.notes = [miditoolkit.Note(80, 60 + i % 12, i * 240, i * 240 + 200) for i in range(32)]  # 4 bars
    midi.instruments.append(line)
    midi.dump(str(tmp_path / "line.mid"))
    prompt = load_prompt(mono, tmp_path / "line.mid", bars=3)
    # three whole bars: nothing may be written into the third, only a new Bar (or the end)
    assert prompt.bars == 3 and len(prompt.ids) == 3 * 17
    assert set(np.flatnonzero(mono.grammar().allowed(prompt.state))) == {mono.bar_id, mono.end_id}
    torch.manual_seed(0)
    model = MusicPerformer(preset("tiny", vocab_size=mono.vocab_size)).eval()
    samples, stats = generate(model, mono, prompt, SampleSettings(bars=2, num_samples=4, seed=0), progress=False)
    assert stats["invalid"] == 0 and stats["seconds"] > 0
    for sample in samples:
        assert mono.grammar().first_violation(sample.ids) is None
        assert len(mono.bar_starts(sample.ids)) == 5  # 3 prompt bars + 2 new
    records = write_samples(samples, mono, prompt, tmp_path / "out", "line")
    for record in records:
        fresh = NoteTable.read(tmp_path / "out" / record["midi"]).after_prompt()
        assert all(3 * 1920 <= start < 5 * 1920 for start in fresh.start.tolist())
    defaults = SampleSettings(length=4).resolved(mono)
    assert (defaults.temperature, defaults.top_p) == (0.9, 0.95)


def test_a_representation_without_onsets_refuses_a_model_of_beats_in_one_line(mono):
    model = MusicPerformer(preset("tiny", vocab_size=mono.vocab_size, positions="beats")).eval()
    with pytest.raises(ConfigError, match="^the mono-test tokenizer gives no onsets: positions 'beats' needs one"):
        mono.onsets(np.zeros(3, dtype=np.int64))
    with pytest.raises(ConfigError, match="^the mono-test tokenizer gives no onsets"):
        generate(model, mono, load_prompt(mono, None), SampleSettings(length=8), progress=False)


def test_a_new_representation_prepares_a_folder_without_touching_data_prep(mono, tmp_path):
    from data_prep.folder import prepare
    from musegen.shards import Shards

    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    midi.instruments.append(miditoolkit.Instrument(0))
    midi.instruments[0].notes = [miditoolkit.Note(80, 60 + i % 12, i * 120, i * 120 + 100) for i in range(32)]  # 2 bars
    (tmp_path / "midi").mkdir()
    for k in range(3):
        midi.dump(str(tmp_path / "midi" / f"line{k}.mid"))
    prepare(tmp_path / "out", source=tmp_path / "midi", workers=1, tokenizer="mono-test")
    shards = Shards(tmp_path / "out")
    assert shards.tokenizer.kind == "mono-test"
    pieces = [ids for split in shards.splits for ids in shards.pieces(split)]
    assert len(pieces) == 3 and all(len(ids) == 2 * 17 + 1 for ids in pieces)


def test_a_representation_provides_what_its_augmentation_calls(mono):
    from musegen.data import Augmenter
    from musegen.tokenizers.base import AUGMENTATION_NEEDS

    keywords = list(inspect.signature(Augmenter.__init__).parameters)[2:]  # after self, tokenizer
    assert sorted(AUGMENTATION_NEEDS) == sorted(keywords)
    for kind in KINDS:
        cls = Tokenizer.registry[kind]
        for key in cls.augmentation:
            assert all(getattr(cls, m) is not getattr(Tokenizer, m) for m in AUGMENTATION_NEEDS[key]), (kind, key)
    with pytest.raises(TypeError, match="augmentation 'track_dropout' needs notes, drop_tracks"):
        type("Dropper", (type(mono),), {"kind": "dropper-test", "version": 1, "augmentation": {"track_dropout": 0.5}})
    assert "dropper-test" not in Tokenizer.registry
