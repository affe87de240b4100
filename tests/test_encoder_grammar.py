"""Issue 44's two promises, for every tokenizer, over real files and hostile generated ones:

(a) the grammar accepts everything the encoder writes: encoding refuses in one line
    (a MusegenError) or gives ids the grammar accepts token by token;
(b) an accepted prompt can always be continued: a few tokens sampled from a tiny model after it,
    without an error, every one accepted by the grammar.

The hostile files mix what the red team tried: copies of a note on many tracks, many tracks,
extreme and many tempos, notes at huge offsets, zero-length notes, odd and lone short meters.
The `slow` variants run many more examples (`pytest -m slow`).
"""

from __future__ import annotations

import io
from pathlib import Path

import miditoolkit
import pytest
from conftest import POP909, REPO, pop909_files
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tiny_models import tiny_model

from musegen.errors import MusegenError
from musegen.generation.loop import generate
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.tokenizers import Tokenizer, tokenizer_from_dict
from musegen.tokenizers.remi import RemiTokenizer

TOKENIZERS = {
    "remi": RemiTokenizer(),
    "remi-fine": RemiTokenizer(beat_resolution=8, max_duration=32, chords=False),  # a smaller cell bound (29)
    "groove": tokenizer_from_dict({"kind": "groove"}),
    "groove-dur": tokenizer_from_dict({"kind": "groove-dur"}),
}
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]  # no explain: minutes


def examples(n: int):
    return settings(deadline=None, max_examples=n, phases=PHASES, suppress_health_check=list(HealthCheck))


def encoded_or_refused(tok: Tokenizer, source) -> list[int] | None:
    """The ids of `source`, checked token by token against the grammar; None where encoding
    refused it in one line."""
    try:
        ids = tok.encode(source).ids.tolist()
    except MusegenError as err:
        assert str(err) and "\n" not in str(err), str(err)
        return None
    grammar = tok.grammar()
    state = grammar.start()
    for i, token in enumerate(ids):
        assert grammar.accepts(state, token), f"token {i} ({tok.vocab[token]}) rejected after {ids[max(i - 5, 0) : i]}"
        state = grammar.step(state, token)
    assert not grammar.allowed(state).any(), "the encoding does not end the piece"
    return ids


# ---- (a) real files ---------------------------------------------------------------------------------


def chorales(folder: Path, n: int) -> list[Path]:
    """The first `n` Bach chorales of music21's corpus, as data_prep writes them in MIDI."""
    from data_prep import chorales

    paths = []
    for k, source in enumerate(chorales.chorale_paths()[:n]):
        paths.append(folder / f"{source.stem}.mid")
        chorales.to_midi(source, paths[-1])
    return paths


@pytest.fixture(scope="module")
def real_files(tmp_path_factory) -> list[Path]:
    files = pop909_files(folder=POP909) + sorted((REPO / "tests" / "data" / "multitrack").glob("*.mid"))
    files += sorted((REPO / "tests" / "data" / "golden" / "groove_spe").glob("*.mid"))[:8]
    files += sorted((REPO / "checkpoints" / "prompts").glob("*.mid"))
    return files + chorales(tmp_path_factory.mktemp("chorales"), 4)


@pytest.mark.parametrize("kind", TOKENIZERS)
def test_every_real_file_encodes_to_ids_its_grammar_accepts(kind, real_files):
    tok = TOKENIZERS[kind]
    encoded = [encoded_or_refused(tok, path) is not None for path in real_files]
    assert any(encoded)  # each tokenizer reads some of them


@pytest.mark.slow
@pytest.mark.parametrize("kind", TOKENIZERS)
def test_music21_chorales_encode_to_ids_their_grammar_accepts(kind, tmp_path):
    for path in chorales(tmp_path, 100):
        encoded_or_refused(TOKENIZERS[kind], path)


# ---- (a) hostile files ------------------------------------------------------------------------------

METERS = [(4, 4), (2, 4), (1, 4), (2, 2), (3, 4), (6, 8), (1, 8), (4, 8), (5, 4)]


@st.composite
def hostile_midi(draw) -> bytes:
    """A MIDI file of bass, drums and piano parts at one edge or several."""
    tpq = draw(st.sampled_from([1, 96, 480, 32767]))
    beat = lambda b: int(b * tpq)  # noqa: E731
    midi = miditoolkit.MidiFile(ticks_per_beat=tpq)
    far = draw(st.sampled_from([0, 0, 0, 4 * 4_999, 4 * 9_999, 4 * 10_000]))  # beats: up to past the bar bound
    notes = []
    for _ in range(draw(st.integers(1, 24))):
        on = draw(st.one_of(st.integers(0, 64 * tpq), st.just(beat(far))))
        length = draw(st.sampled_from([0, 1, tpq // 4 or 1, tpq, 64 * tpq]))
        notes.append((draw(st.integers(0, 127)), on, on + length, draw(st.integers(1, 127))))
    copies = draw(st.sampled_from([1, 1, 2, 61, 200]))  # the same notes on that many tracks
    for k in range(max(copies, 3)):
        program, drum = [(33, False), (0, True), (0, False)][k % 3] if k < 3 else (0, draw(st.booleans()))
        track = miditoolkit.Instrument(program, is_drum=drum, name=["Bass", "Drums", "Piano"][k % 3] + f" {k}")
        track.notes = [miditoolkit.Note(v, p, s, e) for p, s, e, v in notes] if k < copies or k < 3 else []
        midi.instruments.append(track)
    for _ in range(draw(st.sampled_from([0, 1, 3, 2_000]))):
        mspq = draw(st.sampled_from([1, 250_000, 500_000, 16_000_000]))  # 3.75 bpm: mido rounds 2**24 - 1 over
        midi.tempo_changes.append(miditoolkit.TempoChange(60e6 / mspq, draw(st.integers(0, 64 * tpq))))
    signatures = draw(
        st.one_of(st.just([]), st.lists(st.tuples(st.sampled_from(METERS), st.integers(0, 64)), max_size=4))
    )
    midi.time_signature_changes = [miditoolkit.TimeSignature(n, d, beat(b)) for (n, d), b in signatures]
    out = io.BytesIO()
    midi.dump(file=out)
    return out.getvalue()


def check_hostile_file(data: bytes) -> None:
    for tok in TOKENIZERS.values():
        encoded_or_refused(tok, data)


@examples(40)
@given(hostile_midi())
def test_hostile_files_encode_to_ids_their_grammar_accepts_or_are_refused(data):
    check_hostile_file(data)


@pytest.mark.slow
@examples(1000)
@given(hostile_midi())
def test_hostile_files_encode_to_ids_their_grammar_accepts_or_are_refused_slow(data):
    check_hostile_file(data)


# ---- (b) an accepted prompt is continued -------------------------------------------------------------

MODELS: dict[str, tuple] = {}


def check_continued(data: bytes) -> None:
    for kind in ("remi", "groove", "groove-dur"):
        model, tok = MODELS.get(kind) or MODELS.setdefault(kind, tiny_model(kind))
        try:
            prompt = load_prompt(tok, data)
        except MusegenError as err:
            assert "\n" not in str(err), str(err)
            continue
        samples, stats = generate(model, tok, prompt, SampleSettings(length=4, seed=0), progress=False)
        assert stats["grammar_violations"] == 0 and samples[0].new_tokens >= 1


@pytest.mark.usefixtures("one_torch_thread")
@examples(12)
@given(hostile_midi())
def test_an_accepted_hostile_prompt_is_continued(data):
    check_continued(data)


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
@examples(200)
@given(hostile_midi())
def test_an_accepted_hostile_prompt_is_continued_slow(data):
    check_continued(data)
