"""The groove representation with durations (groove-dur): on real MMA renderings and on MIDI built
here every note keeps its onset, pitch, role and quantised duration; the grammar accepts every
encoded piece and refuses malformed ones; a tiny model samples valid MIDI through the real
sampler; `data prepare` writes groove-dur shards."""

from __future__ import annotations

import io
import math
import os
import shutil
from pathlib import Path

import miditoolkit
import numpy as np
import pytest
from conftest import GOLDEN, REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import tiny_model
from tokenizer_properties import check_decode_total, closed_walk

from musegen.errors import DataError, TokenError
from musegen.generation.loop import generate
from musegen.generation.outputs import write_samples
from musegen.generation.prompt import load_prompt
from musegen.generation.settings import SampleSettings
from musegen.music.notes import NoteTable
from musegen.shards import Shards
from musegen.tokenizers import load_tokenizer, tokenizer_from_dict
from musegen.tokenizers.groove import GrooveTokenizer
from musegen.tokenizers.groove_dur import (
    DRUM_UNITS,
    DURATION,
    DURATIONS,
    END,
    SHIFT,
    GrooveDurTokenizer,
    decode_notes,
    serialize,
)

TOK = GrooveDurTokenizer()
GROOVE = GrooveTokenizer()
MMA_FILES = sorted((GOLDEN / "groove_spe").glob("mma_*.mid"))  # real MMA renderings, Groove2Groove layout
# the prepared MMA corpus (`musegen data prepare mma-groove`), for the slow test
PREPARED_MMA = Path(os.environ.get("MUSEGEN_MMA_GROOVE", REPO / "data" / "mma-groove")) / "g2g"
UNIT = 40  # ticks of a grid unit at 480 per beat
FAST = settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])


def dump(midi: miditoolkit.MidiFile) -> bytes:
    buffer = io.BytesIO()
    midi.dump(file=buffer)
    return buffer.getvalue()


def nearest_duration(units: int) -> int:
    """The grid duration nearest in log scale (ties to the longer), computed the slow way."""
    units = max(units, 1)
    return min(DURATIONS.tolist(), key=lambda d: (abs(math.log(d) - math.log(units)), -d))


def expected_notes(notes: np.ndarray) -> set[tuple[int, int, int, int]]:
    """What groove-dur should hold of notes (track, pitch, onset, offset) that do not share a slot
    and onset and do not overlap in a slot: drums DRUM_UNITS long, the rest on the grid."""
    return {(t, p, on, on + (DRUM_UNITS if t == 2 else nearest_duration(off - on))) for t, p, on, off in notes.tolist()}


def check_keeps_notes(path) -> None:
    """Every note the groove tokenizer reads survives: the same (role, pitch, onset) set, drums a
    hit, each bass/other note's duration the nearest grid value, or (where the next note of its
    slot begins sooner) the longest that ends by then; and the ids come back through MIDI."""
    encoding = TOK.encode(path)
    assert TOK.grammar().first_violation(encoding.ids) is None
    ours = TOK.notes(encoding.ids).tolist()
    theirs = GROOVE.notes(GROOVE.encode(path).ids).tolist()
    assert {tuple(n[:3]) for n in ours} == {tuple(n[:3]) for n in theirs}
    assert len(ours) == len(theirs) - encoding.report["merged_notes"]
    longest, onsets = {}, {}
    for t, p, on, off in theirs:
        longest[t, p, on] = max(longest.get((t, p, on), on), off)
        onsets.setdefault((t, p), set()).add(on)
    for t, p, on, off in ours:
        if t == 2:
            assert off - on == DRUM_UNITS
            continue
        want = nearest_duration(longest[t, p, on] - on)
        room = min((o - on for o in onsets[t, p] if o > on), default=None)
        if room is not None and want > room:
            want = max(d for d in DURATIONS.tolist() if d <= room)
        assert off - on == want
    assert TOK.encode(TOK.decode(encoding.ids, encoding.meta).midi_bytes()).ids.tolist() == encoding.ids.tolist()


# ---- real MMA renderings --------------------------------------------------------------------------


@pytest.mark.parametrize("path", MMA_FILES, ids=[p.stem for p in MMA_FILES])
def test_real_mma_renderings_keep_every_note(path):
    check_keeps_notes(path)


@pytest.mark.slow
def test_the_prepared_mma_corpus_keeps_every_note():
    files = sorted(PREPARED_MMA.rglob("*.mid"))[::7] if PREPARED_MMA.is_dir() else []
    if len(files) < 50:
        pytest.skip(f"the prepared MMA corpus is not at {PREPARED_MMA} (set MUSEGEN_MMA_GROOVE)")
    for path in files:
        check_keeps_notes(path)


def test_half_as_many_tokens_as_groove_on_real_mma():
    ours = sum(len(TOK.encode(p).ids) for p in MMA_FILES)
    theirs = sum(len(GROOVE.encode(p).ids) for p in MMA_FILES)
    assert len(MMA_FILES) == 23 and 0.45 < ours / theirs < 0.7  # measured: 0.58


# ---- MIDI built here --------------------------------------------------------------------------------


def built_trio() -> tuple[bytes, set[tuple[int, int, int, int]]]:
    """Bass, drums and piano with a note that is zero-length on the grid, triplets, off-grid
    timing, a note longer than 4 bars, a key struck again while it sounds and a doubled drum hit;
    and the notes groove-dur must hold (role, pitch, onset, offset in grid units)."""
    midi = miditoolkit.MidiFile(ticks_per_beat=480)
    bass = miditoolkit.Instrument(33, name="Bass")
    drums = miditoolkit.Instrument(0, is_drum=True, name="Drums")
    piano = miditoolkit.Instrument(0, name="Other")
    bass.notes = [
        miditoolkit.Note(90, 36, 0, 470),  # 11.75 units -> 12
        miditoolkit.Note(90, 43, 480, 485),  # 0 units on the grid -> 1
        miditoolkit.Note(90, 38, 960, 960 + 14 * UNIT),
    ]  # 14 -> 15 (the log midpoint is 13.4)
    drums.notes = [
        miditoolkit.Note(100, 36, 0, 60),
        miditoolkit.Note(100, 36, 0, 30),  # doubled hit
        miditoolkit.Note(100, 42, 160, 200),
        miditoolkit.Note(100, 42, 325, 400),
    ]  # triplets; 325 -> 8
    piano.notes = [
        miditoolkit.Note(70, 60, 0, 9 * 1920),  # 9 bars -> held 4 bars
        # MIDI ends the older note first: 67 sounds 0..18 and 12..25, then is cut at 12
        miditoolkit.Note(70, 67, 0, 1000),
        miditoolkit.Note(70, 67, 480, 700),
        miditoolkit.Note(70, 64, 1920, 1920 + 100 * UNIT),
    ]  # 100 -> 96
    midi.instruments = [bass, drums, piano]
    want = {
        (1, 36, 0, 12),
        (1, 43, 12, 13),
        (1, 38, 24, 39),
        (2, 36, 0, 3),
        (2, 42, 4, 7),
        (2, 42, 8, 11),
        (3, 60, 0, 192),
        (3, 67, 0, 12),
        (3, 67, 12, 24),
        (3, 64, 48, 144),
    }
    return dump(midi), want


def test_midi_built_here_keeps_onsets_pitches_roles_and_durations():
    data, want = built_trio()
    encoding = TOK.encode(data)
    assert {tuple(n) for n in TOK.notes(encoding.ids).tolist()} == want
    assert [encoding.report[k] for k in ("merged_notes", "cut_notes", "long_notes")] == [1, 1, 1]
    assert TOK.vocab[encoding.ids[1]] == "Note_1_36" and TOK.vocab[encoding.ids[2]] == "Duration_12"
    piece = TOK.decode(encoding.ids, encoding.meta)
    assert [t.name for t in piece.tracks] == ["Bass", "Drums", "Other"] and piece.tracks[1].is_drum
    assert TOK.encode(piece.midi_bytes()).ids.tolist() == encoding.ids.tolist()


def test_durations_are_a_log_grid_up_to_four_bars():
    assert DURATIONS[0] == 1 and DURATIONS[-1] == 4 * 48 and np.all(np.diff(DURATIONS) > 0)
    assert np.max(DURATIONS[1:] / DURATIONS[:-1]) <= 2 and np.max(DURATIONS[12:] / DURATIONS[11:-1]) <= 1.25
    assert {3, 4, 6, 8, 9, 12, 18, 24, 36, 48} <= set(DURATIONS.tolist())  # 16ths, triplets, dotted values
    for units in range(0, 300):
        assert TOK.notes(serialize(np.array([[1, 40, 0, units]]))[0]).tolist() == [
            [1, 40, 0, nearest_duration(min(units, 192))]
        ]


def test_transposition_bar_skips_and_track_dropout_stay_grammatical():
    ids = TOK.encode(MMA_FILES[0]).ids
    notes = TOK.notes(ids)
    up = TOK.transpose(ids, 5)
    moved = TOK.notes(up)
    pitched = notes[:, 0] != 2
    assert np.array_equal(moved[:, 1], notes[:, 1] + np.where(pitched, 5, 0)) and TOK.transpose(ids, 100) is None
    skipped = TOK.skip_bars(ids, 2)
    assert TOK.notes(skipped)[:, 2].min() == 0 and len(TOK.bar_starts(skipped)) == len(TOK.bar_starts(ids)) - 2
    no_drums = TOK.drop_tracks(ids, [2])
    assert set(TOK.notes(no_drums)[:, 0].tolist()) == {1, 3}
    for out in (up, skipped, no_drums):
        assert TOK.grammar().first_violation(out) is None
    assert np.array_equal(TOK.transpose(ids[100:400], 5), up[100:400])  # a window moves as the piece does


# ---- the grammar --------------------------------------------------------------------------------


def ids_of(*names: str) -> list[int]:
    return [TOK.vocab.index(n) for n in names]


MALFORMED = {  # name -> (tokens, index of the first one refused)
    "bass note without its duration": (("Start", "Note_1_36", "TimeShift_1_0"), 2),
    "duration after a drum": (("Start", "Note_2_36", "Duration_3"), 2),
    "duration with no note": (("Start", "Duration_3"), 1),
    "falling ids at one time": (("Start", "Note_3_64", "Duration_6", "Note_3_60", "Duration_6"), 3),
    "a key struck while it sounds": (("Start", "Note_3_60", "Duration_24", "TimeShift_1_0", "Note_3_60"), 4),
    "a shift that restates the time": (("Start", "Note_2_36", "TimeShift_0_6", "Note_2_36", "TimeShift_0_6"), 4),
    "a shift that goes back": (("Start", "Note_2_36", "TimeShift_0_6", "Note_2_36", "TimeShift_0_3"), 4),
    "end after a shift": (("Start", "Note_2_36", "TimeShift_1_0", "End"), 3),
    "end before any note": (("Start", "End"), 1),
    "two final shifts": (("Start", "Note_2_36", "TimeShift_1_0", "TimeShift_0_3"), 3),
    "start inside the piece": (("Start", "Note_2_36", "Start"), 2),
    "a note after end": (("Start", "Note_2_36", "End", "Note_2_36"), 3),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_the_grammar_refuses_malformed_sequences(name):
    names, refused = MALFORMED[name]
    assert TOK.grammar().first_violation(ids_of(*names)) == refused
    assert TOK.grammar().first_violation(ids_of(*names[:refused])) is None


def test_decoding_refuses_what_has_no_reading_in_one_line():
    for names in (("Start", "Note_1_36", "Note_2_36"), ("Start", "Duration_3"), ("Start", "Note_2_36", "Start")):
        with pytest.raises(TokenError) as err:
            TOK.decode(ids_of(*names))
        assert "\n" not in str(err.value)
    # a note cut off before its duration is left out; what follows End is ignored
    assert TOK.notes(ids_of("Start", "Note_2_36", "Note_3_60")).tolist() == [[2, 36, 0, 3]]
    assert TOK.notes(ids_of("Start", "Note_2_36", "End", "Duration_3")).tolist() == [[2, 36, 0, 3]]
    assert TOK.notes(ids_of("Start", "Note_1_36", "PAD", "Duration_3")).tolist() == [[1, 36, 0, 3]]
    assert TOK.notes(ids_of("Start", "Note_2_36", "Note_1_40", "End")).tolist() == [[2, 36, 0, 3]]


def test_a_piece_ends_with_end_after_a_complete_note():
    grammar = TOK.grammar()
    assert TOK.end_ids == (END,)
    state = grammar.states(ids_of("Start", "Note_1_36"))[-1]
    assert not grammar.can_close(state) and grammar.allowed(state)[DURATION:SHIFT].all()
    state = grammar.step(state, DURATION)
    assert grammar.can_close(state) and grammar.close(state) == [END]


# ---- property-based -------------------------------------------------------------------------------

FAMILIES = {"note": (0, DURATION), "duration": (DURATION, SHIFT), "shift": (SHIFT, END), "end": (END, END + 1)}


def random_walk(data, max_steps: int) -> list[int]:
    """Start, tokens drawn among `allowed()` (End may come early), notes drawn until it can close, closed."""
    return closed_walk(data, TOK.grammar(), FAMILIES, max_steps, finishers=(0, SHIFT))


@FAST
@given(st.data())
def test_every_accepted_sequence_is_the_encoding_of_its_notes(data):
    ids = random_walk(data, 80)
    assert TOK.grammar().first_violation(ids) is None
    assert serialize(decode_notes(np.array(ids)))[0].tolist() == ids
    assert TOK.encode(TOK.decode(ids).midi_bytes()).ids.tolist() == ids


NOTES = st.lists(
    st.tuples(st.integers(1, 3), st.integers(30, 90), st.integers(0, 200), st.integers(0, 300)), min_size=1, max_size=40
)


@FAST
@given(NOTES)
def test_any_notes_encode_to_one_note_per_slot_and_onset(rows):
    notes = np.array([(t, p, on, on + length) for t, p, on, length in rows])
    ids, counts = serialize(notes)
    assert TOK.grammar().first_violation(ids) is None
    kept = TOK.notes(ids)
    assert {tuple(n[:3]) for n in kept.tolist()} == {tuple(n[:3]) for n in notes.tolist()}
    assert len(kept) == len(notes) - counts["merged_notes"]
    ends = {}
    for t, p, on, off in sorted(kept.tolist(), key=lambda n: n[2]):
        if t == 2:  # a drum hit is an instant, decoded DRUM_UNITS long: the hits of a fast roll may overlap
            assert off - on == DRUM_UNITS
            continue
        assert ends.get((t, p), 0) <= on  # a pitched slot holds one note at a time
        ends[t, p] = off
        assert off - on in DURATIONS
    lone = [n for n in notes.tolist() if sum(m[0:2] == n[0:2] for m in notes.tolist()) == 1]
    assert expected_notes(np.array(lone).reshape(-1, 4)) <= {tuple(n) for n in kept.tolist()}


@FAST
@given(st.lists(st.integers(-2, TOK.vocab_size + 1), max_size=200))
def test_any_sequence_decodes_or_raises_token_error(ids):
    check_decode_total(TOK, ids)


# ---- sampling and data preparation ------------------------------------------------------------------


def test_a_tiny_model_samples_valid_midi_through_the_real_sampler(tmp_path, one_torch_thread):
    model, tok = tiny_model("groove-dur")
    prompt = load_prompt(tok, MMA_FILES[0], bars=2)
    samples, stats = generate(model, tok, prompt, SampleSettings(bars=2, num_samples=3, seed=3), progress=False)
    assert stats["invalid"] == 0
    records = write_samples(samples, tok, prompt, tmp_path, "groove")
    for sample, record in zip(samples, records):
        assert tok.grammar().first_violation(sample.ids) is None and sample.closed
        midi = miditoolkit.MidiFile(str(tmp_path / record["midi"]))
        fresh = NoteTable.read(tmp_path / record["midi"]).after_prompt()
        assert len(fresh) and all(2 * 1920 <= start < 4 * 1920 for start in fresh.start.tolist())
        lengths = {(n.end - n.start) // UNIT for inst in midi.instruments if not inst.is_drum for n in inst.notes}
        assert lengths <= set(DURATIONS.tolist())
        assert len(tok.encode(tmp_path / record["midi"]).ids) > len(prompt.ids)


def test_data_prepare_midi_writes_groove_dur_shards(tmp_path, capsys):
    from musegen.cli import main

    folder = tmp_path / "midi"
    folder.mkdir()
    for path in MMA_FILES[:6]:
        shutil.copy(path, folder / path.name)
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "data",
                "prepare",
                "midi",
                "--source",
                str(folder),
                "--out",
                str(tmp_path / "shards"),
                "--tokenizer",
                "groove-dur",
                "--workers",
                "1",
            ]
        )
    assert exit_.value.code == 0, capsys.readouterr().err
    shards = Shards(tmp_path / "shards")
    assert load_tokenizer(tmp_path / "shards" / "tokenizer.json").kind == "groove-dur"
    pieces = [ids for split in shards.splits for ids in shards.pieces(split)]
    assert len(pieces) == 6 and all(TOK.grammar().first_violation(ids) is None for ids in pieces)


def test_the_mma_corpus_takes_groove_or_groove_dur_only(tmp_path):
    from data_prep import mma_groove

    with pytest.raises(DataError, match="groove or groove-dur or song, not 'remi'"):
        mma_groove.prepare(tmp_path, tokenizer="remi")
    assert tokenizer_from_dict(TOK.to_dict()).vocab == TOK.vocab
